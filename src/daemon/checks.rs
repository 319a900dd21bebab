//! The check component: checks proxies as they fall due, in following
//! rounds, and keeps the proxies it serves fresh: they are re-checked on a
//! short cycle that grows with how many are served, and not served once
//! their last check is older than two cycles.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use tokio_util::sync::CancellationToken;

use crate::api::{AppState, CheckInfo};
use crate::check::{self, CheckError, CheckOptions, Checker, CommitHook, JudgeHook, RoundProgress};
use crate::config::Config;
use crate::store::{Store, StoreError, now_ms, rfc3339};

use super::outage::Outage;

/// How long a round may start checks before the next one begins, and how
/// often the judges are asked directly again (to learn our own address and
/// find judges that stopped answering). Rounds run whenever something is
/// due, so served proxies are checked as they fall due.
const ROUND_DISPATCH: Duration = Duration::from_secs(20);
/// The longest the loop waits between looks at what is due: how soon a
/// proxy another process made due is checked.
const POLL: Duration = Duration::from_millis(100);
/// Rounds start at most once a second (or a twentieth of the served
/// proxies' re-check cycle, if shorter), unless a re-check is asked for:
/// served proxies fall due one by one, spread by jitter, and a round per
/// proxy would cost more than the checks.
const ROUND_GAP: Duration = Duration::from_secs(1);
/// Waits before asking the judges again when none answered: short at
/// first (a judge that is this daemon's own API may not be up yet),
/// doubling up to the longest.
const JUDGE_RETRY_FIRST: Duration = Duration::from_secs(1);
/// See [`JUDGE_RETRY_FIRST`].
const JUDGE_RETRY_MAX: Duration = Duration::from_secs(30);
/// The judges are asked directly again after a round that suggests they
/// are gone, but not sooner than this after the last time: a round of one
/// flaky proxy must not make every round ask them.
const JUDGE_ASK_MIN: Duration = Duration::from_secs(2);

/// Checks due proxies continuously.
pub struct CheckLoop {
    /// `[check]` and the judges.
    pub config: Arc<Config>,
    /// Where due proxies come from.
    pub store: Store,
    /// The feedback path results are committed through, metrics, the
    /// record of the last rounds and the checker `verify=true` uses.
    pub state: AppState,
    /// Cancelled when checks in flight must stop at once (their results
    /// are not recorded).
    pub abort: CancellationToken,
}

impl CheckLoop {
    /// Runs rounds until `stop`; a round in progress stops starting checks
    /// and commits what finished.
    pub async fn run(self, stop: CancellationToken) {
        let metrics = self.state.metrics.clone();
        let hook: CommitHook = Arc::new(move |batch| metrics.observe_checks(batch));
        let metrics = self.state.metrics.clone();
        let judge_hook: JudgeHook = Arc::new(move |url, answer| metrics.observe_judge(url, answer));
        let mut opts = CheckOptions::from_config(&self.config.check);
        opts.on_judge = Some(judge_hook);
        opts.concurrency = check::clamp_concurrency(opts.concurrency);
        opts.on_commit = Some(hook);
        opts.abort_in_flight = Some(self.abort.clone());
        opts.dispatch_for = Some(ROUND_DISPATCH);
        let geoip = match check::open_geoip(&self.config) {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "GeoIP disabled");
                None
            }
        };
        let mut retry = JUDGE_RETRY_FIRST;
        let mut outage = JudgeOutage::default();
        let mut prepared: Option<(Arc<Checker>, std::time::Instant)> = None;
        let mut last_round: Option<std::time::Instant> = None;
        while !stop.is_cancelled() {
            // While the disk refuses writes no verdict can be recorded:
            // checking would only spend the network and a core. The write
            // component tries the disk after each pause and says when it
            // takes writes again.
            if self.store.write_trouble().is_some() {
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = self.store.writable() => {}
                }
                continue;
            }
            // The judges are asked directly (our own address, who still
            // answers) at start-up and then every ROUND_DISPATCH, not per
            // round: rounds come whenever something falls due.
            let fresh = prepared
                .as_ref()
                .filter(|(_, at)| at.elapsed() < ROUND_DISPATCH)
                .map(|(c, _)| c.clone());
            let checker = match fresh {
                Some(c) => Ok(c),
                None => Checker::prepare(&self.config, &opts, geoip.clone())
                    .await
                    .map(Arc::new),
            };
            match checker {
                Ok(checker) => {
                    retry = JUDGE_RETRY_FIRST;
                    if let Some(told) = outage.end(&self.state) {
                        tracing::info!(
                            after = %told.lasted(),
                            "judges answer again; re-checking every served proxy now"
                        );
                    }
                    if prepared
                        .as_ref()
                        .is_none_or(|(c, _)| !Arc::ptr_eq(c, &checker))
                    {
                        // verify=true works from the first second: the first
                        // checker is prepared at start, not when something
                        // falls due.
                        self.state.set_checker(checker.clone());
                        prepared = Some((checker.clone(), std::time::Instant::now()));
                    }
                    if self.until_due(&stop, last_round).await {
                        last_round = Some(std::time::Instant::now());
                        if self.round(checker, &opts, &stop).await == Ended::JudgesLost
                            && prepared
                                .as_ref()
                                .is_some_and(|(_, at)| at.elapsed() >= JUDGE_ASK_MIN)
                        {
                            // Ask them directly now, not at the next
                            // preparation: an outage is said at once.
                            prepared = None;
                        }
                    }
                }
                Err(e) => {
                    outage.note(&self.state, &e);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(JUDGE_RETRY_MAX);
                }
            }
        }
    }

    /// Queues the re-checks asked for meanwhile, then, unless a proxy is
    /// due and [`ROUND_GAP`] has passed since the last round started (or a
    /// re-check was asked for), waits until that may be, a re-check is
    /// asked for, or [`POLL`] passes.
    /// True when a round is to start now; otherwise waits and returns
    /// false, so an idle daemon runs no rounds.
    async fn until_due(
        &self,
        stop: &CancellationToken,
        last_round: Option<std::time::Instant>,
    ) -> bool {
        self.schedule_adopted().await;
        let urgent = match self.state.feedback.queue_rechecks(now_ms()).await {
            Ok(n) => n > 0,
            Err(e) => {
                log_store_error(&e, "cannot queue proxies for an early re-check");
                true
            }
        };
        let gap = match last_round {
            Some(at) if !urgent => {
                let cycle = self.config.check.serve_cycle(self.state.index().len());
                ROUND_GAP.min(cycle / 20).saturating_sub(at.elapsed())
            }
            _ => Duration::ZERO,
        };
        let wait = match self.store.next_due_at().await {
            Ok(Some(t)) => {
                Duration::from_millis((t - now_ms()).clamp(0, POLL.as_millis() as i64) as u64)
            }
            Ok(None) => POLL,
            Err(e) => {
                tracing::error!(error = %e, "cannot read when the next check is due");
                POLL
            }
        };
        if wait.is_zero() && gap.is_zero() {
            return true;
        }
        let wait = if wait.is_zero() { gap } else { wait };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.state.feedback.recheck_wanted() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        false
    }

    /// Puts the proxies that entered the index on a schedule this daemon
    /// did not make (those another process checked, read back by the
    /// index sync) on the served proxies' re-check cycle. Without this a
    /// proxy `proxywarden check` found alive keeps its next check up to
    /// `check.recheck_alive` away: it is served unverified until the
    /// freshness window passes, then not served at all.
    async fn schedule_adopted(&self) {
        let adopted = self.state.feedback.take_adopted();
        if adopted.is_empty() {
            return;
        }
        let check = &self.config.check;
        let served = self.state.index().len();
        let now = now_ms();
        let due: Vec<(i64, i64)> = {
            let mut rng = rand::rng();
            adopted
                .iter()
                .filter_map(|e| {
                    let spread: f64 = rng.random();
                    check
                        .served_check_at(served, e.last_checked, e.next_check_at, now, spread)
                        .map(|at| (e.id, at))
                })
                .collect()
        };
        if due.is_empty() {
            return;
        }
        tracing::debug!(
            proxies = due.len(),
            "re-checks of adopted proxies scheduled"
        );
        if let Err(e) = self.state.feedback.schedule_checks(due).await {
            log_store_error(&e, "cannot schedule re-checks of the proxies loaded");
        }
    }

    /// The re-check policy for the next round: served proxies come round
    /// every [`CheckConfig::serve_cycle`](crate::config::CheckConfig::serve_cycle),
    /// and are not served once two cycles (and a check's timeout) have
    /// passed without a check. While the disk refuses writes, and until
    /// it has taken them again for a while, there is no window (see
    /// [`super::writes`]).
    fn freshness(&self) -> crate::model::RecheckPolicy {
        let check = &self.config.check;
        let served = self.state.index().len();
        if self
            .state
            .conditions
            .get(super::writes::COMPONENT)
            .is_none()
        {
            self.state
                .feedback
                .set_fresh_within(check.fresh_window(served));
        }
        check.serve_policy(served)
    }

    async fn round(
        &self,
        checker: Arc<Checker>,
        opts: &CheckOptions,
        stop: &CancellationToken,
    ) -> Ended {
        let policy = self.freshness();
        let progress = Arc::new(RoundProgress::default());
        match check::check_round(
            checker,
            &self.store,
            &self.state.feedback,
            opts,
            policy,
            stop,
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
                    unconfirmed: summary.unconfirmed,
                    duration_ms: summary.elapsed.as_millis() as u64,
                };
                self.state.record_round(|r| r.last_check = Some(info));
                // Nothing passed and some failures were laid at the judges'
                // door: ask them directly now whether they are there.
                if summary.unconfirmed > 0 && summary.alive == 0 {
                    Ended::JudgesLost
                } else {
                    Ended::Done
                }
            }
            Err(e @ CheckError::JudgeLost { .. }) => {
                tracing::warn!(error = %e, "check round stopped");
                Ended::JudgesLost
            }
            // The write component says so, once for everything that writes;
            // the loop waits until the disk takes writes again.
            Err(CheckError::Store(e)) if e.write_failure().is_some() => {
                tracing::debug!(error = %e, "check round stopped: its results cannot be written");
                Ended::Done
            }
            Err(e) => {
                tracing::error!(error = %e, "check round failed");
                Ended::Done
            }
        }
    }
}

/// How a round ended, for what the loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// It finished (or failed for reasons of its own).
    Done,
    /// Every judge stopped answering during it, or may have: nothing
    /// passed, and failures were laid at the judges' door.
    JudgesLost,
}

/// Logs a failed store call at error, unless the disk refused a write:
/// that is said once for everything that writes (see [`super::writes`]).
fn log_store_error(e: &StoreError, what: &str) {
    if e.write_failure().is_some() {
        tracing::debug!(error = %e, "{what}");
    } else {
        tracing::error!(error = %e, "{what}");
    }
}

/// Whether checks cannot run (no judge answers) and since when. While they
/// cannot, nothing can be re-checked: the freshness window is lifted, so
/// what passed a check or carried a request within `api.max_age` is still
/// served (rather than nothing within a window), and `/healthz` says
/// `degraded` with the reason.
#[derive(Default)]
struct JudgeOutage(Outage);

impl JudgeOutage {
    /// Checks could not start: `e` says why.
    fn note(&mut self, state: &AppState, e: &CheckError) {
        let component = match e {
            CheckError::NoJudge(_) => "judges",
            _ => "checks",
        };
        let message = format!(
            "{e}; nothing can be checked, so proxies are served while they passed a check \
             or carried a request within api.max_age"
        );
        state.conditions.set(component, message, now_ms());
        state.feedback.set_fresh_within(Duration::ZERO);
        if let Some(told) = self.0.note() {
            tracing::error!(
                error = %e,
                lasted = %told.lasted(),
                attempts = told.signs,
                "cannot check: serving what passed a check or carried a request within api.max_age"
            );
        }
    }

    /// Checks can run again: how long they could not, if they could not.
    /// Every served proxy is re-checked at once, and until each has passed
    /// again those that have are served first.
    fn end(&mut self, state: &AppState) -> Option<super::outage::Told> {
        let told = self.0.end()?;
        state.conditions.clear("judges");
        state.conditions.clear("checks");
        state.feedback.reverify_all(now_ms());
        Some(told)
    }
}
