//! `serve`: wires the store, the health index, the harvest schedule, the
//! continuous check loop, the daily purge and the API together, and shuts
//! them down in order on one cancellation token.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, Notify};
use tokio_cron_scheduler::{Job, JobScheduler};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::api::{self, AppState, CheckInfo, HarvestInfo};
use crate::check::{self, CheckOptions, Checker, CommitHook, RoundProgress};
use crate::config::Config;
use crate::harvest;
use crate::health::{self, Feedback};
use crate::store::{Store, now_ms, rfc3339};

/// How long in-flight checks may run after shutdown begins.
const CHECK_GRACE: Duration = Duration::from_secs(5);
/// How long open HTTP requests may take to finish after shutdown begins.
const HTTP_GRACE: Duration = Duration::from_secs(5);
/// The longest the check loop sleeps when nothing is due; also how often
/// proxies handed out are queued for their early re-check.
const IDLE_MAX: Duration = Duration::from_secs(5);
/// Pause between rounds, so a trickle of due proxies does not turn into a
/// stream of tiny rounds (each asks every judge directly first).
const ROUND_GAP: Duration = Duration::from_secs(2);
/// How long a round starts checks before it yields to the next one. Each
/// round takes alive proxies first, so after a harvest floods the database
/// with new proxies, the re-checks of those being served still come round
/// within about this long plus one check timeout.
const ROUND_DISPATCH: Duration = Duration::from_secs(20);
/// Wait before retrying when no judge answers.
const JUDGE_RETRY: Duration = Duration::from_secs(30);
/// When the daily purge runs (03:17:00 UTC).
const PURGE_SCHEDULE: &str = "0 17 3 * * *";

/// The daemon's shared parts.
#[derive(Clone)]
struct Daemon {
    config: Arc<Config>,
    store: Store,
    state: AppState,
    /// Serialises harvests: a scheduled one never overlaps a running one.
    harvesting: Arc<Mutex<()>>,
    /// Wakes the check loop early when a harvest brings new proxies.
    wake: Arc<Notify>,
}

/// Runs the daemon on an already bound listener until `shutdown` is
/// cancelled; then stops the scheduler, lets checks in flight finish (or
/// stops them after a grace period), drains HTTP and returns.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let config = Arc::new(config);
    let store = Store::open(&config.database.path)?;
    let index = health::load_index(&store)
        .await
        .context("loading the health index")?;
    let feedback = Feedback::new(index.clone(), store.clone());
    let state = AppState::new(store.clone(), feedback, config.clone());
    let daemon = Daemon {
        config: config.clone(),
        store: store.clone(),
        state: state.clone(),
        harvesting: Arc::default(),
        wake: Arc::default(),
    };
    let addr = listener.local_addr()?;
    tracing::info!(%addr, servable = index.len(), "proxywarden serving");

    let tasks = TaskTracker::new();
    let http_stop = CancellationToken::new();
    let http = tasks.spawn(api::serve(listener, state.clone(), http_stop.clone()));

    let mut scheduler = JobScheduler::new()
        .await
        .context("starting the scheduler")?;
    {
        let d = daemon.clone();
        let job = Job::new_async(config.harvest.schedule.as_str(), move |_, _| {
            let d = d.clone();
            Box::pin(async move { d.harvest().await })
        })
        .context("scheduling the harvest")?;
        scheduler.add(job).await.context("scheduling the harvest")?;
        let d = daemon.clone();
        let job = Job::new_async(PURGE_SCHEDULE, move |_, _| {
            let d = d.clone();
            Box::pin(async move { d.purge().await })
        })
        .context("scheduling the purge")?;
        scheduler.add(job).await.context("scheduling the purge")?;
    }
    scheduler.start().await.context("starting the scheduler")?;

    // An empty database gets a harvest at once rather than at the next slot.
    let empty = store.stats().await?.total == 0;
    if empty {
        let d = daemon.clone();
        tasks.spawn(async move { d.harvest().await });
    }

    let abort_checks = CancellationToken::new();
    let checks = {
        let d = daemon.clone();
        let (stop, abort) = (shutdown.clone(), abort_checks.clone());
        tasks.spawn(async move { d.check_loop(stop, abort).await })
    };

    notify_systemd(&[sd_notify::NotifyState::Ready]);
    let watchdog = sd_notify::watchdog_enabled().map(|every| {
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(every / 2);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tick.tick() => notify_systemd(&[sd_notify::NotifyState::Watchdog]),
                }
            }
        })
    });

    shutdown.cancelled().await;
    tracing::info!("shutting down");
    notify_systemd(&[sd_notify::NotifyState::Stopping]);
    if let Err(e) = scheduler.shutdown().await {
        tracing::warn!(error = %e, "scheduler did not stop cleanly");
    }
    http_stop.cancel();
    // Checks in flight and open HTTP requests get their grace periods at the
    // same time; results already completed are committed by the round's
    // writer either way.
    let checks_done = async move {
        let mut checks = checks;
        if tokio::time::timeout(CHECK_GRACE, &mut checks)
            .await
            .is_err()
        {
            abort_checks.cancel();
            let _ = checks.await;
        }
    };
    let http_done = async {
        if tokio::time::timeout(HTTP_GRACE, http).await.is_err() {
            tracing::warn!("open HTTP requests did not finish in time");
        }
    };
    tokio::join!(checks_done, http_done);
    if let Some(w) = watchdog {
        w.abort();
    }
    tasks.close();
    // A harvest still running is cut short; what it stored is committed.
    let _ = tokio::time::timeout(Duration::from_secs(1), tasks.wait()).await;
    tracing::info!("stopped");
    Ok(())
}

fn notify_systemd(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!(error = %e, "systemd notification failed");
    }
}

impl Daemon {
    /// The record of the last rounds, for `/stats`.
    fn rounds(&self) -> std::sync::MutexGuard<'_, api::Rounds> {
        self.state.rounds.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One harvest; failures are logged and the next run tries again.
    async fn harvest(&self) {
        let Ok(_guard) = self.harvesting.try_lock() else {
            tracing::info!("harvest already running; skipping this slot");
            return;
        };
        match harvest::harvest_all(&self.config, &self.store).await {
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
                self.rounds().last_harvest = Some(info);
                if report.new > 0 {
                    self.wake.notify_one();
                }
            }
            Err(e) => tracing::error!(error = %e, "harvest failed"),
        }
    }

    /// The daily purge.
    async fn purge(&self) {
        let after = self.config.check.purge_after;
        match self.store.purge(now_ms(), after).await {
            Ok(n) => tracing::info!(purged = n, "purge finished"),
            Err(e) => tracing::error!(error = %e, "purge failed"),
        }
    }

    /// Checks whatever is due, one round at a time, until `stop`.
    async fn check_loop(&self, stop: CancellationToken, abort: CancellationToken) {
        let metrics = self.state.metrics.clone();
        let hook: CommitHook = Arc::new(move |batch| metrics.observe_checks(batch));
        let mut opts = CheckOptions::from_config(&self.config.check);
        opts.concurrency = check::clamp_concurrency(opts.concurrency);
        opts.on_commit = Some(hook);
        opts.abort_in_flight = Some(abort);
        opts.dispatch_for = Some(ROUND_DISPATCH);
        let policy = self.config.check.recheck_policy();
        let geoip = match check::open_geoip(&self.config) {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "GeoIP disabled");
                None
            }
        };
        while !stop.is_cancelled() {
            let served = self.state.feedback.take_rechecks();
            if !served.is_empty()
                && let Err(e) = self.store.mark_due_many(served, now_ms()).await
            {
                tracing::error!(error = %e, "cannot queue served proxies for re-checking");
            }
            let due = self.store.count_due(now_ms(), false).await.unwrap_or(0);
            if due > 0 {
                match Checker::prepare(&self.config, &opts, geoip.clone()).await {
                    Ok(checker) => {
                        let checker = Arc::new(checker);
                        self.state.set_checker(checker.clone());
                        let progress = Arc::new(RoundProgress::default());
                        match check::check_round(
                            checker,
                            &self.store,
                            &self.state.feedback,
                            &opts,
                            policy,
                            &stop,
                            progress,
                        )
                        .await
                        {
                            Ok(summary) => {
                                let info = CheckInfo {
                                    finished_at: rfc3339(now_ms()),
                                    checked: summary.checked,
                                    alive: summary.alive,
                                    dead: summary.dead,
                                    duration_ms: summary.elapsed.as_millis() as u64,
                                };
                                self.rounds().last_check = Some(info);
                            }
                            Err(e) => tracing::error!(error = %e, "check round failed"),
                        }
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = tokio::time::sleep(ROUND_GAP) => {}
                        }
                        continue;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot check now");
                        self.pause(&stop, JUDGE_RETRY).await;
                        continue;
                    }
                }
            }
            let wait = self.until_next_due().await;
            self.pause(&stop, wait).await;
        }
    }

    /// Time until the earliest scheduled check, bounded.
    async fn until_next_due(&self) -> Duration {
        let next = self.store.next_due_at().await.ok().flatten();
        match next {
            Some(t) => {
                Duration::from_millis((t - now_ms()).clamp(100, IDLE_MAX.as_millis() as i64) as u64)
            }
            None => IDLE_MAX,
        }
    }

    async fn pause(&self, stop: &CancellationToken, d: Duration) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.wake.notified() => {}
            _ = self.state.feedback.recheck_wanted() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }
}
