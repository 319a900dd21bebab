//! The index sync component: other processes write to the same database (a
//! `proxywarden check` beside the daemon, other nodes sharing a PostgreSQL
//! database); the rows changed since the last look are read back into the
//! health index, so the daemon never serves what the record says is dead or
//! failed in use on another node. On PostgreSQL a notice at each commit
//! wakes it at once (a poll every few seconds stays as the fallback); on
//! SQLite it polls twice a second, a read of an index that finds nothing
//! when nothing changed.
//!
//! Following the sequence is only sound if no reader can see change
//! number N+1 committed while N is still to come. Both backends number
//! changes under a lock held until commit: every writer bumps the one
//! `meta` row first (SQLite's write lock; on PostgreSQL the row lock that
//! the UPDATE takes and keeps until commit), so a second writer gets its
//! number only after the first committed, and numbers are in commit order.
//! A plain sequence would not do: its numbers are handed out at once and
//! may commit out of order, and a reader whose mark passed a number not yet
//! committed would never read that row.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::health::Feedback;
use crate::store::Store;

/// How often changed rows are read back where notices wake the sync: a
/// fallback for a notice lost with its connection.
const EVERY_NOTIFIED: Duration = Duration::from_secs(2);

/// How often changed rows are read back without notices (SQLite): well
/// within the second in which a failure in use on one process must stop
/// every process serving the proxy.
const EVERY_POLLED: Duration = Duration::from_millis(500);

/// Rows read per query; more are read in further queries.
const PAGE: usize = 10_000;

/// Keeps the index in line with rows others change.
pub struct IndexSync {
    /// Where rows are read.
    pub store: Store,
    /// What they update: the index, through the feedback path, so rows
    /// older than a verdict it already has do not undo it.
    pub feedback: Feedback,
    /// The change number the index is current with.
    pub mark: i64,
}

impl IndexSync {
    /// Reads changed rows into the index whenever a notice says so, and
    /// on a tick, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let notices = self.store.change_notices().await;
        let every = if notices.available() {
            EVERY_NOTIFIED
        } else {
            EVERY_POLLED
        };
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.catch_up().await,
                _ = notices.next() => self.catch_up().await,
            }
        }
    }

    async fn catch_up(&mut self) {
        loop {
            // Most changed rows are this daemon's own check results,
            // indexed when they were committed: they are not read again.
            let known = self.feedback.applied_after(self.mark);
            match self.store.changed_since(self.mark, PAGE, known).await {
                Ok((records, mark, full)) => {
                    // Rows no longer alive leave the index; alive ones are
                    // (re)indexed with what the record says now.
                    self.feedback.adopt(records);
                    let moved = mark != self.mark;
                    self.mark = mark;
                    if !moved || !full {
                        return;
                    }
                }
                // An unreachable server is said once by the write
                // component; the index serves from memory meanwhile.
                Err(e) if e.write_failure().is_some() => {
                    tracing::debug!(error = %e, "cannot read changed proxies into the index");
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read changed proxies into the index");
                    return;
                }
            }
        }
    }
}
