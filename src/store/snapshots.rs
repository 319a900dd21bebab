//! The pool's history: a row a minute (servable, stored by status, checks,
//! gateway traffic) for the dashboard's charts, kept for a bounded time and
//! read back averaged into buckets so a week's chart stays a few hundred
//! points.

use rusqlite::params;

use super::{Store, StoreError};

/// One minute of the pool's history.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// The minute (unix ms); read back, the start of its bucket.
    pub at: i64,
    /// Proxies servable (alive and fresh).
    pub servable: i64,
    /// Stored proxies alive.
    pub alive: i64,
    /// Stored proxies dead.
    pub dead: i64,
    /// Stored proxies not checked yet.
    pub unknown: i64,
    /// Checks committed during the minute before; read back, the mean per
    /// minute over the bucket.
    pub checks: i64,
    /// Of those, alive.
    pub checks_alive: i64,
    /// Gateway requests and tunnels answered during the minute before (a
    /// mean per minute when read back).
    pub gateway_requests: i64,
    /// Gateway upstream failures during the minute before (a mean per
    /// minute when read back).
    pub gateway_failures: i64,
}

impl Store {
    /// Records `snapshot` (replacing one of the same minute) and deletes
    /// those taken before `keep_since` (unix ms), in one transaction.
    pub async fn record_snapshot(
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

    /// The snapshots taken at or after `since` (unix ms), averaged over
    /// buckets of `bucket_ms` (each row's `at` is its bucket's start),
    /// oldest first. Buckets with no snapshot (the daemon was down) are
    /// left out, so a chart shows the gap.
    pub async fn snapshots(&self, since: i64, bucket_ms: i64) -> Result<Vec<Snapshot>, StoreError> {
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
