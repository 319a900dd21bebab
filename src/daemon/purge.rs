//! The purge component: deletes long-dead proxies when the schedule asks.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::LastRounds;
use crate::config::Config;
use crate::store::{Store, now_ms};

/// Purges on demand.
pub struct Purger {
    /// `check.purge_after`.
    pub config: Arc<Config>,
    /// Where proxies are deleted.
    pub store: Store,
    /// Purge requests from the daily schedule.
    pub triggers: mpsc::Receiver<()>,
    /// Told when a purge ended (the counts follow it).
    pub rounds: LastRounds,
}

impl Purger {
    /// Purges whenever triggered, until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                t = self.triggers.recv() => {
                    if t.is_none() {
                        return;
                    }
                    let after = self.config.check.purge_after;
                    match self.store.purge(now_ms(), after).await {
                        Ok(n) => {
                            tracing::info!(purged = n, "purge finished");
                            self.rounds.purged();
                        }
                        Err(e) => tracing::error!(error = %e, "purge failed"),
                    }
                }
            }
        }
    }
}
