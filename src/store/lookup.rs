//! Finding stored proxies by identity, for commands that add proxies they
//! checked themselves (`check --list --store`) and then record the checks.

use rusqlite::{OptionalExtension, params};

use super::{Store, StoreError};
use crate::proxy::Proxy;

impl Store {
    /// The row id of each proxy, by identity (scheme, host, port,
    /// username), in order; `None` for one that is not stored.
    pub async fn proxy_ids(&self, proxies: Vec<Proxy>) -> Result<Vec<Option<i64>>, StoreError> {
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
