//! SQLite: the minute snapshots, kept for a bounded time.

use rusqlite::params;

use super::Sqlite;
use crate::store::{Snapshot, StoreError};

impl Sqlite {
    pub(crate) async fn record_snapshot(
        &self,
        snapshot: Snapshot,
        keep_since: i64,
    ) -> Result<(), StoreError> {
        self.write(move |c| {
            let s = snapshot;
            c.prepare_cached(
                "INSERT OR REPLACE INTO snapshots (at, servable, alive, dead, unknown, checks,
                     checks_alive, gateway_requests, gateway_failures)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
            )?
            .execute(params![
                s.at,
                s.servable,
                s.alive,
                s.dead,
                s.unknown,
                s.checks,
                s.checks_alive,
                s.gateway_requests,
                s.gateway_failures
            ])?;
            c.prepare_cached("DELETE FROM snapshots WHERE at < ?1")?
                .execute([keep_since])?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn snapshots(
        &self,
        since: i64,
        bucket_ms: i64,
    ) -> Result<Vec<Snapshot>, StoreError> {
        let bucket = bucket_ms.max(1);
        self.read(move |c| {
            let mut st = c.prepare_cached(
                "SELECT (at / ?2) * ?2 AS b,
                        CAST(round(avg(servable)) AS INTEGER),
                        CAST(round(avg(alive)) AS INTEGER),
                        CAST(round(avg(dead)) AS INTEGER),
                        CAST(round(avg(unknown)) AS INTEGER),
                        CAST(round(avg(checks)) AS INTEGER),
                        CAST(round(avg(checks_alive)) AS INTEGER),
                        CAST(round(avg(gateway_requests)) AS INTEGER),
                        CAST(round(avg(gateway_failures)) AS INTEGER)
                 FROM snapshots WHERE at >= ?1 GROUP BY b ORDER BY b",
            )?;
            let rows = st.query_map(params![since, bucket], |r| {
                Ok(Snapshot {
                    at: r.get(0)?,
                    servable: r.get(1)?,
                    alive: r.get(2)?,
                    dead: r.get(3)?,
                    unknown: r.get(4)?,
                    checks: r.get(5)?,
                    checks_alive: r.get(6)?,
                    gateway_requests: r.get(7)?,
                    gateway_failures: r.get(8)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn at(minute: i64, servable: i64, checks: i64) -> Snapshot {
        Snapshot {
            at: minute * 60_000,
            servable,
            alive: servable + 1,
            checks,
            ..Snapshot::default()
        }
    }

    #[tokio::test]
    async fn snapshots_are_averaged_per_bucket_and_old_ones_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("s.db")).unwrap();
        for (m, servable, checks) in [(0, 10, 100), (1, 20, 300), (5, 40, 50), (6, 60, 70)] {
            store
                .record_snapshot(at(m, servable, checks), 0)
                .await
                .unwrap();
        }
        // The same minute again replaces it.
        store.record_snapshot(at(6, 50, 70), 0).await.unwrap();
        let rows = store.snapshots(0, 5 * 60_000).await.unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!((rows[0].at, rows[0].servable, rows[0].checks), (0, 15, 200));
        assert_eq!(
            (rows[1].at, rows[1].servable, rows[1].alive),
            (300_000, 45, 46)
        );
        // Writing one deletes what is older than the retention.
        store
            .record_snapshot(at(7, 1, 1), 5 * 60_000)
            .await
            .unwrap();
        let rows = store.snapshots(0, 60_000).await.unwrap();
        let minutes: Vec<i64> = rows.iter().map(|s| s.at / 60_000).collect();
        assert_eq!(minutes, [5, 6, 7]);
        assert_eq!(store.snapshots(7 * 60_000, 60_000).await.unwrap().len(), 1);
    }
}
