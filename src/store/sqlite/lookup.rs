//! SQLite: stored proxies found by identity.

use rusqlite::{OptionalExtension, params};

use super::Sqlite;
use crate::proxy::Proxy;
use crate::store::StoreError;

impl Sqlite {
    pub(crate) async fn proxy_ids(
        &self,
        proxies: Vec<Proxy>,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        self.read(move |conn| {
            let mut find = conn.prepare_cached(
                "SELECT id FROM proxies
                 WHERE scheme = ?1 AND host = ?2 AND port = ?3 AND username = ?4",
            )?;
            let mut ids = Vec::with_capacity(proxies.len());
            for p in &proxies {
                let id = find
                    .query_row(
                        params![p.scheme.as_str(), p.host.to_string(), p.port, p.username()],
                        |r| r.get(0),
                    )
                    .optional()?;
                ids.push(id);
            }
            Ok(ids)
        })
        .await
    }
}
