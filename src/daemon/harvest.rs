//! The harvest component: runs a harvest whenever the cron schedule (or
//! start-up) asks, one at a time, on the daemon's task tracker so that a
//! shutdown cancels it like everything else.

use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::{AppState, HarvestInfo};
use crate::config::Config;
use crate::harvest;
use crate::store::{Store, now_ms, rfc3339};

/// What asks for a harvest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// A slot of `harvest.schedule`.
    Schedule,
}

/// Harvests on demand.
pub struct Harvester {
    /// The configuration (its enabled sources are harvested).
    pub config: Arc<Config>,
    /// Where results go.
    pub store: Store,
    /// Metrics and the record of the last rounds.
    pub state: AppState,
    /// Harvest requests. The channel holds one, so slots that come while a
    /// harvest runs collapse into the next run instead of piling up.
    pub triggers: mpsc::Receiver<Trigger>,
}

impl Harvester {
    /// Harvests the overdue sources at once, then whenever triggered, until
    /// `stop`. A harvest in progress is dropped at `stop`; what it already
    /// stored is committed, the rest is harvested after the restart.
    pub async fn run(mut self, stop: CancellationToken) {
        let overdue = match self.overdue_sources().await {
            Ok(names) => names,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the sources' last harvests; harvesting all");
                self.config
                    .sources
                    .iter()
                    .filter(|s| s.enabled)
                    .map(|s| s.name.clone())
                    .collect()
            }
        };
        if !overdue.is_empty() {
            tracing::info!(
                sources = overdue.len(),
                "harvesting the sources overdue at start-up"
            );
            let mut config = (*self.config).clone();
            config.sources.retain(|s| overdue.contains(&s.name));
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = self.harvest(&config) => {}
            }
        }
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                t = self.triggers.recv() => match t {
                    Some(Trigger::Schedule) => {
                        let config = self.config.clone();
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            _ = self.harvest(&config) => {}
                        }
                    }
                    None => return,
                },
            }
        }
    }

    /// Enabled sources never harvested, or not since longer than the
    /// schedule's interval: a crash or a stop during a harvest must not
    /// leave them waiting for the next slot (on a new install that is
    /// every source).
    async fn overdue_sources(&self) -> Result<Vec<String>, crate::store::StoreError> {
        let records = self.store.list_sources().await?;
        let now = chrono::Utc::now();
        let interval = self
            .config
            .harvest
            .schedule
            .interval_after(now)
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or(i64::MAX);
        let cutoff = now.timestamp_millis().saturating_sub(interval);
        Ok(self
            .config
            .sources
            .iter()
            .filter(|s| s.enabled)
            .filter(|s| {
                records
                    .iter()
                    .find(|r| r.name == s.name)
                    .and_then(|r| r.last_fetch_at)
                    .is_none_or(|at| at < cutoff)
            })
            .map(|s| s.name.clone())
            .collect())
    }

    /// One harvest of `config`'s sources; failures are logged and the next
    /// slot tries again.
    async fn harvest(&self, config: &Config) {
        match harvest::harvest_all(config, &self.store).await {
            Ok(report) => {
                self.state.metrics.observe_harvest(&report);
                let failed = report.sources.iter().filter(|s| !s.worked()).count();
                let info = HarvestInfo {
                    finished_at: rfc3339(now_ms()),
                    sources: report.sources.len(),
                    failed,
                    distinct: report.distinct,
                    new: report.new,
                    duration_ms: report.elapsed.as_millis() as u64,
                };
                self.state.record_round(|r| r.last_harvest = Some(info));
            }
            Err(e) => tracing::error!(error = %e, "harvest failed"),
        }
    }
}
