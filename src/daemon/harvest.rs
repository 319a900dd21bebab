//! The harvest component: runs a harvest whenever the cron schedule (or
//! start-up) asks, one at a time, on the daemon's task tracker so that a
//! shutdown cancels it like everything else.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::api::metrics::Metrics;
use crate::api::{HarvestInfo, LastRounds};
use crate::config::{Config, Live};
use crate::harvest::{self, HarvestReport};
use crate::health::Feedback;
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
    /// The configuration in force, followed for its sources and schedule.
    pub live: Live,
    /// The feedback path, for how many proxies are served.
    pub feedback: Feedback,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The record of the last rounds.
    pub rounds: LastRounds,
    /// Harvest requests. The channel holds one, so slots that come while a
    /// harvest runs collapse into the next run instead of piling up.
    pub triggers: mpsc::Receiver<Trigger>,
    /// Some source has worked (since start, or at its last fetch before
    /// it): a harvest where none works then is not the daemon out of work.
    pub worked_before: bool,
}

/// What the store says of the last harvests, at start-up.
#[derive(Debug, Default)]
struct LastRuns {
    /// Sources to harvest at once.
    overdue: Vec<String>,
    /// Sources whose last fetch failed, not overdue.
    failed: Vec<String>,
    /// Some enabled source worked at its last fetch.
    worked: bool,
    /// The last harvest, from the sources' records.
    info: Option<HarvestInfo>,
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
        let last = match self.store.source_runs().await {
            Ok(records) => self.last_runs(&records),
            Err(e) => {
                tracing::error!(error = %e, "cannot read the sources' last harvests; harvesting all");
                LastRuns {
                    overdue: self
                        .config
                        .sources
                        .iter()
                        .filter(|s| s.enabled)
                        .map(|s| s.name.clone())
                        .collect(),
                    ..LastRuns::default()
                }
            }
        };
        // What the last harvest before a restart found stands until the
        // next one: /proxy says "no sources worked" after a restart that
        // followed a harvest where none did, not "the first harvest has not
        // finished".
        if let Some(info) = last.info {
            self.rounds.record(|r| r.last_harvest = Some(info));
        }
        self.worked_before = last.worked;
        let mut retry = None;
        if !last.overdue.is_empty() {
            tracing::info!(
                sources = last.overdue.len(),
                "harvesting the sources overdue at start-up"
            );
            let config = self.claimed(self.only(&last.overdue), false).await;
            tokio::select! {
                _ = stop.cancelled() => return,
                report = self.harvest(&config) => retry = self.retry_after(report, None),
            }
        }
        if !last.failed.is_empty() {
            // Sources that failed before the restart are tried again after
            // harvest.failed_retry, as they would have been without it.
            let wait = self.config.harvest.failed_retry;
            let mut failed = last.failed;
            if let Some(r) = &retry {
                failed.retain(|name| !r.sources.contains(name));
            }
            if !failed.is_empty() && retry.is_none() {
                tracing::info!(
                    sources = %failed.join(", "),
                    retry_in = %humantime::format_duration(wait),
                    next_harvest = %self.next_harvest(),
                    "sources that failed before the restart are harvested again"
                );
                retry = Some(Retry {
                    sources: failed,
                    at: Instant::now() + wait,
                    wait,
                });
            }
        }
        if retry.is_none() && last.overdue.is_empty() {
            tracing::info!(next_harvest = %self.next_harvest(), "no source is overdue");
        }
        let mut reloads = self.live.watch();
        reloads.mark_unchanged();
        // Claims of nodes that died mid-harvest are looked for twice per
        // lease, so a source they held is harvested within a lease and a
        // half of their death.
        let mut lapsed = tokio::time::interval((self.config.node.lease / 2).max(LAPSED_MIN));
        lapsed.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            let retry_at = retry.as_ref().map(|r: &Retry| r.at);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = lapsed.tick() => {
                    let Some(config) = self.lapsed().await else { continue };
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        report = self.harvest(&config) => retry = self.retry_after(report, None),
                    }
                }
                Ok(()) = reloads.changed() => {
                    // A reload: the next runs use its sources and limits,
                    // and the sources it adds or changes are harvested now.
                    let live = reloads.borrow_and_update().clone();
                    let fresh: Vec<String> = live
                        .sources
                        .iter()
                        .filter(|s| s.enabled && !self.config.sources.contains(s))
                        .map(|s| s.name.clone())
                        .collect();
                    self.config = live;
                    if !fresh.is_empty() {
                        tracing::info!(sources = %fresh.join(", "), "harvesting the sources the reload added or changed");
                        let config = self.only(&fresh);
                        tokio::select! {
                            _ = stop.cancelled() => return,
                            report = self.harvest(&config) => {
                                retry = match (self.retry_after(report, None), retry.take()) {
                                    (Some(mut new), Some(old)) => {
                                        new.sources.extend(old.sources.into_iter().filter(|s| !fresh.contains(s)));
                                        new.at = new.at.min(old.at);
                                        Some(new)
                                    }
                                    (new, old) => new.or(old),
                                };
                            }
                        }
                    }
                }
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
                        let config = Arc::new(self.claimed((*self.config).clone(), true).await);
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

    /// `config` with only the sources this node claimed for a run of
    /// `harvest.schedule` (for a `trigger`, the run nearest now, as a
    /// node's clock may run a moment ahead; at start-up, the last run): nodes sharing a database harvest each
    /// source once per slot, whichever claims it first. A claim the store
    /// cannot answer counts as won: a source harvested twice costs a
    /// fetch, one never harvested costs the pool.
    async fn claimed(&self, mut config: Config, trigger: bool) -> Config {
        let now = chrono::Utc::now();
        let schedule = &self.config.harvest.schedule;
        let slot = if trigger {
            schedule.nearest_run(now)
        } else {
            schedule.slot_at(now)
        };
        let Some(slot) = slot else {
            return config;
        };
        let slot_ms = slot.timestamp_millis();
        let node = self.config.node.id();
        let mut skipped = Vec::new();
        let mut kept = Vec::with_capacity(config.sources.len());
        for source in std::mem::take(&mut config.sources) {
            if !source.enabled {
                kept.push(source);
                continue;
            }
            let now = now_ms();
            match self
                .store
                .claim_harvest(
                    source.name.clone(),
                    slot_ms,
                    node.clone(),
                    now,
                    now.saturating_add(lease_ms(self.config.node.lease)),
                )
                .await
            {
                Ok(true) => kept.push(source),
                Ok(false) => skipped.push(source.name),
                // A disk refusing writes is said once by the write
                // component; the harvest then waits until it takes them.
                Err(e) if e.write_failure().is_some() => kept.push(source),
                Err(e) => {
                    tracing::warn!(source = %source.name, error = %e, "cannot claim the harvest of a source; harvesting it anyway");
                    kept.push(source);
                }
            }
        }
        if !skipped.is_empty() {
            tracing::info!(
                sources = %skipped.join(", "),
                slot = %slot.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                "another node harvests these sources in this slot; skipping them"
            );
        }
        config.sources = kept;
        config
    }

    /// `config` with only the sources whose harvest this node takes over
    /// now: claimed by a node whose lease ended before its harvest did (it
    /// died), or by this node's last run; `None` when there are none.
    async fn lapsed(&self) -> Option<Config> {
        let node = self.config.node.id();
        let now = now_ms();
        let until = now.saturating_add(lease_ms(self.config.node.lease));
        let taken = match self
            .store
            .take_lapsed_harvests(node.clone(), now, until)
            .await
        {
            Ok(taken) => taken,
            Err(e) if e.write_failure().is_some() => {
                tracing::debug!(error = %e, "cannot look for harvests to take over");
                return None;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for harvests to take over");
                return None;
            }
        };
        if taken.is_empty() {
            return None;
        }
        let mut names: Vec<String> = taken.into_iter().map(|(source, _)| source).collect();
        names.sort_unstable();
        names.dedup();
        let config = self.only(&names);
        if config.sources.is_empty() {
            // Sources this node does not harvest: nobody will, this slot.
            let _ = self.store.finish_harvest_claims(node, None).await;
            return None;
        }
        tracing::info!(
            sources = %names.join(", "),
            "taking over harvests whose node stopped before they ended"
        );
        Some(config)
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
        // A retry at or after the next slot would only repeat it.
        let retry = self
            .config
            .harvest
            .schedule
            .next_after(now)
            .and_then(|next| (next - now).to_std().ok())
            .is_none_or(|to_slot| to_slot > wait);
        // Each failed source's error on a line of its own (a first run
        // offline fails every source: one line holding them all ran to
        // thousands of characters); the harvest's line names them.
        let why: Vec<&str> = failed
            .iter()
            .filter(|s| !s.worked() || s.unwritable.is_none())
            .map(|s| {
                let error = s
                    .error
                    .as_deref()
                    .or(s.store_error.as_deref())
                    .unwrap_or("listed no proxy");
                tracing::warn!(source = %s.name, error = %clip(error), "cannot harvest this source");
                s.name.as_str()
            })
            .collect();
        let retry_in = if retry {
            humantime::format_duration(wait).to_string()
        } else {
            "at the next harvest".to_owned()
        };
        let fetched = report.sources.iter().filter(|s| s.worked()).count();
        let served = self.feedback.index().len();
        let next_harvest = self.next_harvest();
        let sources = why.join(", ");
        if why.is_empty() {
            tracing::debug!(sources = failed.len(), %retry_in, "sources not stored; harvesting them again");
        } else if fetched == 0 && !self.worked_before && served == 0 {
            tracing::error!(
                failed = why.len(),
                %sources,
                %retry_in,
                %next_harvest,
                "no source worked, so there is nothing new to check or serve; check the network \
                 and the sources' URLs (each source's error is logged above); sources are \
                 [[sources]] tables in the config file, `proxywarden config example` shows them"
            );
        } else if fetched == 0 {
            // Other sources worked before (or proxies are served): this is
            // not the daemon out of work.
            tracing::warn!(
                failed = why.len(),
                %sources,
                %retry_in,
                %next_harvest,
                served,
                "sources failed again"
            );
        } else {
            tracing::warn!(
                failed = why.len(),
                of = report.sources.len(),
                %sources,
                %retry_in,
                %next_harvest,
                "some sources failed"
            );
        }
        retry.then(|| Retry {
            sources: failed.iter().map(|s| s.name.clone()).collect(),
            at: Instant::now() + wait,
            wait,
        })
    }

    /// What the store says of the enabled sources' last harvests: those
    /// never harvested, or not since longer than the schedule's interval
    /// (a crash or a stop during a harvest must not leave them waiting for
    /// the next slot; on a new install that is every source), those whose
    /// last fetch failed, and the last harvest as a whole.
    fn last_runs(&self, records: &[crate::store::SourceRecord]) -> LastRuns {
        let now = chrono::Utc::now();
        let interval = self
            .config
            .harvest
            .schedule
            .interval_after(now)
            .and_then(|d| i64::try_from(d.as_millis()).ok())
            .unwrap_or(i64::MAX);
        let cutoff = now.timestamp_millis().saturating_sub(interval);
        let mut last = LastRuns::default();
        let (mut sources, mut failed, mut found) = (0, 0, 0);
        let mut finished = None;
        for s in self.config.sources.iter().filter(|s| s.enabled) {
            let record = records.iter().find(|r| r.name == s.name);
            let Some((r, fetched)) = record.and_then(|r| Some((r, r.last_fetch_at?))) else {
                last.overdue.push(s.name.clone());
                continue;
            };
            if fetched < cutoff {
                last.overdue.push(s.name.clone());
            }
            sources += 1;
            finished = finished.max(Some(fetched));
            if r.last_ok_at.is_some_and(|ok| ok >= fetched) {
                last.worked = true;
                found += r.last_found.unwrap_or(0);
            } else {
                failed += 1;
                if fetched >= cutoff {
                    last.failed.push(s.name.clone());
                }
            }
        }
        last.info = finished.map(|at| HarvestInfo {
            finished_at: rfc3339(at),
            sources,
            failed,
            distinct: found,
            new: 0,
            duration_ms: 0,
        });
        last
    }

    /// When the next scheduled harvest runs, for the log.
    fn next_harvest(&self) -> String {
        match self.config.harvest.schedule.next_after(chrono::Utc::now()) {
            Some(at) => at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            None => "never (harvest.schedule has no next slot)".to_owned(),
        }
    }

    /// One harvest of `config`'s sources; its report, unless the harvest
    /// as a whole failed (logged). While the disk refuses writes it first
    /// waits until it takes them again: nothing fetched could be stored.
    async fn harvest(&mut self, config: &Config) -> Option<HarvestReport> {
        if !config.sources.iter().any(|s| s.enabled) {
            // Other nodes claimed every source of this slot.
            return None;
        }
        if self.store.write_trouble().is_some() {
            tracing::debug!("harvest waits until the database takes writes again");
            self.store.writable().await;
        }
        // The claims of this harvest are held while it runs, renewed a
        // few times per lease, and ended with it: a node that dies
        // mid-harvest leaves claims that lapse, and another takes them.
        // Each source's claim ends as soon as it is stored, so a node dying
        // later in the harvest leaves only the sources it had not finished.
        let node = self.config.node.id();
        let lease = self.config.node.lease;
        // One name per source of the harvest: bounded by the config.
        let (finished, mut names) = mpsc::unbounded_channel::<String>();
        let done = move |r: &harvest::SourceReport, _: harvest::Progress| {
            let _ = finished.send(r.name.clone());
        };
        let run = harvest::harvest_all_reporting(config, &self.store, &done);
        tokio::pin!(run);
        let mut beat = tokio::time::interval_at(Instant::now() + lease / 3, lease / 3);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let finish = async |source: Option<String>| {
            if let Err(e) = self.store.finish_harvest_claims(node.clone(), source).await {
                tracing::debug!(error = %e, "cannot end this node's harvest claims");
            }
        };
        let result = loop {
            tokio::select! {
                result = &mut run => break result,
                Some(name) = names.recv() => finish(Some(name)).await,
                _ = beat.tick() => {
                    let until = now_ms().saturating_add(lease_ms(lease));
                    if let Err(e) = self.store.renew_harvest_claims(node.clone(), until).await {
                        tracing::debug!(error = %e, "cannot renew this node's harvest claims");
                    }
                }
            }
        };
        finish(None).await;
        match result {
            Ok(report) => {
                self.metrics.observe_harvest(&report);
                self.worked_before |= report.any_worked();
                let failed = report.sources.iter().filter(|s| !s.worked()).count();
                let info = HarvestInfo {
                    finished_at: rfc3339(now_ms()),
                    sources: report.sources.len(),
                    failed,
                    distinct: report.distinct,
                    new: report.new,
                    duration_ms: report.elapsed.as_millis() as u64,
                };
                self.rounds.record(|r| r.last_harvest = Some(info));
                Some(report)
            }
            Err(e) => {
                tracing::error!(error = %e, "harvest failed");
                None
            }
        }
    }
}

/// The shortest wait between looks for harvests to take over.
const LAPSED_MIN: Duration = Duration::from_millis(500);

/// A lease in stored milliseconds.
fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}

/// Waits until `at`, or for ever without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A source's error as logged: at most [`MAX_ERROR_CHARS`] characters, so
/// that a list's or a server's words cannot make a line without end.
fn clip(error: &str) -> std::borrow::Cow<'_, str> {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => format!("{}…", &error[..at]).into(),
        None => error.into(),
    }
}

/// See [`clip`].
const MAX_ERROR_CHARS: usize = 400;
