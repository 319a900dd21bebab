//! The index sync component: other processes write to the same database (a
//! `proxywarden check` beside the daemon); every few seconds the rows
//! changed since the last look are read back into the health index, so the
//! daemon never serves what the record says is dead.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::health::Feedback;
use crate::store::Store;

/// How often changed rows are read back.
const EVERY: Duration = Duration::from_secs(2);

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
    /// Reads changed rows into the index every few seconds until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => self.catch_up().await,
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
                    // (re)indexed with what the record says now. Other own
                    // writes are indexed already too.
                    let index = self.feedback.index();
                    let records: Vec<_> = records
                        .into_iter()
                        .filter(|r| index.get(r.id).is_none_or(|e| *e.record != *r))
                        .collect();
                    self.feedback.adopt(records);
                    let moved = mark != self.mark;
                    self.mark = mark;
                    if !moved || !full {
                        return;
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot read changed proxies into the index");
                    return;
                }
            }
        }
    }
}
