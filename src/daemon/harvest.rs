//! The harvest component: runs a harvest whenever the cron schedule (or
//! start-up) asks, one at a time, on the daemon's task tracker so that a
//! shutdown cancels it like everything else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::{AppState, HarvestInfo};
use crate::config::Config;
use crate::harvest::{self, HarvestReport};
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

/// The sources that failed, and when they are tried again.
#[derive(Debug)]
struct Retry {
    sources: Vec<String>,
    at: Instant,
    /// The wait before `at`; the next one is twice as long.
    wait: Duration,
}

impl Harvester {
    /// Harvests the overdue sources at once, then whenever triggered, and
    /// the sources that failed again after a backoff (see
    /// [`Harvester::retry_after`]), until `stop`. A harvest in progress is dropped at `stop`; what it already
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
        let mut retry = None;
        if !overdue.is_empty() {
            tracing::info!(
                sources = overdue.len(),
                "harvesting the sources overdue at start-up"
            );
            let config = self.only(&overdue);
            tokio::select! {
                _ = stop.cancelled() => return,
                report = self.harvest(&config) => retry = self.retry_after(report, None),
            }
        }
        loop {
            let retry_at = retry.as_ref().map(|r: &Retry| r.at);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = until(retry_at) => {
                    let Some(failed) = retry.take() else { continue };
                    tracing::info!(sources = %failed.sources.join(", "), "harvesting the sources that failed again");
                    let config = self.only(&failed.sources);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        report = self.harvest(&config) => retry = self.retry_after(report, Some(failed)),
                    }
                }
                t = self.triggers.recv() => match t {
                    Some(Trigger::Schedule) => {
                        let config = self.config.clone();
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            report = self.harvest(&config) => retry = self.retry_after(report, None),
                        }
                    }
                    None => return,
                },
            }
        }
    }

    /// The configuration with only the enabled sources named.
    fn only(&self, names: &[String]) -> Config {
        let mut config = (*self.config).clone();
        config
            .sources
            .retain(|s| s.enabled && names.contains(&s.name));
        config
    }

    /// What to try again after a harvest: its failed sources (and those
    /// the store could not take in full), after
    /// `harvest.failed_retry`, doubled when they failed the last retry too,
    /// never later than the next scheduled harvest. Says plainly in the log
    /// which sources failed and why; when none worked, that nothing can be
    /// served until one does. A disk refusing writes is not the sources'
    /// fault and is said by the write component, not here.
    fn retry_after(&self, report: Option<HarvestReport>, last: Option<Retry>) -> Option<Retry> {
        let report = report?;
        let failed: Vec<&harvest::SourceReport> = report
            .sources
            .iter()
            .filter(|s| !s.worked() || !s.stored_all())
            .collect();
        if failed.is_empty() {
            return None;
        }
        let base = self.config.harvest.failed_retry;
        let wait = match last {
            Some(last)
                if last
                    .sources
                    .iter()
                    .any(|n| failed.iter().any(|f| &f.name == n)) =>
            {
                last.wait.saturating_mul(2)
            }
            _ => base,
        };
        let now = chrono::Utc::now();
        let wait = match self
            .config
            .harvest
            .schedule
            .next_after(now)
            .and_then(|next| (next - now).to_std().ok())
        {
            // A retry at or after the next slot would only repeat it.
            Some(to_slot) if to_slot <= wait => return None,
            _ => wait,
        };
        let why: Vec<String> = failed
            .iter()
            .filter(|s| !s.worked() || s.unwritable.is_none())
            .map(|s| {
                format!(
                    "{}: {}",
                    s.name,
                    s.error
                        .as_deref()
                        .or(s.store_error.as_deref())
                        .unwrap_or("listed no proxy")
                )
            })
            .collect();
        let retry_in = humantime::format_duration(wait).to_string();
        let fetched = report.sources.iter().filter(|s| s.worked()).count();
        if why.is_empty() {
            tracing::debug!(sources = failed.len(), %retry_in, "sources not stored; harvesting them again");
        } else if fetched == 0 {
            tracing::error!(
                sources = %why.join("; "),
                %retry_in,
                "no source worked, so there is nothing new to check or serve; check the network and the sources' URLs"
            );
        } else {
            tracing::warn!(
                failed = why.len(),
                of = report.sources.len(),
                sources = %why.join("; "),
                %retry_in,
                "some sources failed"
            );
        }
        Some(Retry {
            sources: failed.iter().map(|s| s.name.clone()).collect(),
            at: Instant::now() + wait,
            wait,
        })
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

    /// One harvest of `config`'s sources; its report, unless the harvest
    /// as a whole failed (logged). While the disk refuses writes it first
    /// waits until it takes them again: nothing fetched could be stored.
    async fn harvest(&self, config: &Config) -> Option<HarvestReport> {
        if self.store.write_trouble().is_some() {
            tracing::debug!("harvest waits until the database takes writes again");
            self.store.writable().await;
        }
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
                Some(report)
            }
            Err(e) => {
                tracing::error!(error = %e, "harvest failed");
                None
            }
        }
    }
}

/// Waits until `at`, or for ever without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
