//! SQLite: harvest claims and giving back leases. Several processes on one
//! file are serialised by its write lock, so an insert that finds the
//! (source, slot) row is the second claim.

use rusqlite::params;

use super::Sqlite;
use crate::store::StoreError;
use crate::store::nodes::CLAIMS_KEPT_MS;

impl Sqlite {
    pub(crate) async fn claim_harvest(
        &self,
        source: String,
        slot: i64,
        node: String,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.write(move |tx| {
            tx.prepare_cached("DELETE FROM harvest_claims WHERE claimed_at < ?1")?
                .execute([now.saturating_sub(CLAIMS_KEPT_MS)])?;
            let n = tx
                .prepare_cached(
                    "INSERT INTO harvest_claims (source, slot, node, claimed_at)
                     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (source, slot) DO NOTHING",
                )?
                .execute(params![source, slot, node, now])?;
            Ok(n == 1)
        })
        .await
    }

    pub(crate) async fn release_leases(&self, node: String) -> Result<u64, StoreError> {
        self.write(move |tx| {
            let n = tx
                .prepare_cached(
                    "UPDATE proxies SET lease_until = NULL, lease_node = NULL
                     WHERE lease_node = ?1",
                )?
                .execute([node])?;
            Ok(n as u64)
        })
        .await
    }
}
