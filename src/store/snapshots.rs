//! The pool's history: a row a minute (servable, stored by status, checks,
//! gateway traffic) for the dashboard's charts, kept for a bounded time and
//! read back averaged into buckets so a week's chart stays a few hundred
//! points.

use super::{Store, StoreError, dispatch};

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
        dispatch!(self.record_snapshot(snapshot, keep_since))
    }

    /// The snapshots taken at or after `since` (unix ms), averaged over
    /// buckets of `bucket_ms` (each row's `at` is its bucket's start),
    /// oldest first. Buckets with no snapshot (the daemon was down) are
    /// left out, so a chart shows the gap.
    pub async fn snapshots(&self, since: i64, bucket_ms: i64) -> Result<Vec<Snapshot>, StoreError> {
        dispatch!(self.snapshots(since, bucket_ms))
    }
}
