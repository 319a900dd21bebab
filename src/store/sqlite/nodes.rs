//! SQLite: harvest claims and their leases, and giving back leases.
//! Several processes on one file are serialised by its write lock, so an
//! insert that finds the (source, slot) row is the second claim.

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
        until: i64,
    ) -> Result<bool, StoreError> {
        self.write(move |tx| {
            tx.prepare_cached("DELETE FROM harvest_claims WHERE claimed_at < ?1")?
                .execute([now.saturating_sub(CLAIMS_KEPT_MS)])?;
            let n = tx
                .prepare_cached(
                    "INSERT INTO harvest_claims (source, slot, node, claimed_at, lease_until)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (source, slot) DO UPDATE
                     SET node = excluded.node, claimed_at = excluded.claimed_at,
                         lease_until = excluded.lease_until
                     WHERE harvest_claims.lease_until < excluded.claimed_at",
                )?
                .execute(params![source, slot, node, now, until])?;
            Ok(n == 1)
        })
        .await
    }

    pub(crate) async fn renew_harvest_claims(
        &self,
        node: String,
        until: i64,
    ) -> Result<u64, StoreError> {
        self.write(move |tx| {
            let n = tx
                .prepare_cached(
                    "UPDATE harvest_claims SET lease_until = ?2
                     WHERE node = ?1 AND lease_until IS NOT NULL",
                )?
                .execute(params![node, until])?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) async fn finish_harvest_claims(
        &self,
        node: String,
        source: Option<String>,
    ) -> Result<u64, StoreError> {
        self.write(move |tx| {
            let n = tx
                .prepare_cached(
                    "UPDATE harvest_claims SET lease_until = NULL
                     WHERE node = ?1 AND lease_until IS NOT NULL
                       AND (?2 IS NULL OR source = ?2)",
                )?
                .execute(params![node, source])?;
            Ok(n as u64)
        })
        .await
    }

    pub(crate) async fn take_lapsed_harvests(
        &self,
        node: String,
        now: i64,
        until: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        self.write(move |tx| {
            let mut stmt = tx.prepare_cached(
                "UPDATE harvest_claims SET node = ?1, claimed_at = ?2, lease_until = ?3
                 WHERE lease_until IS NOT NULL AND (lease_until < ?2 OR node = ?1)
                 RETURNING source, slot",
            )?;
            let taken = stmt
                .query_map(params![node, now, until], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<Vec<(String, i64)>, _>>()?;
            Ok(taken)
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
