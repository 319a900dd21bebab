//! The check component: checks proxies as they fall due, in following
//! rounds, and keeps the proxies it serves fresh: they are re-checked on a
//! short cycle that grows with how many are served, and not served once
//! their last check is older than two cycles.

use std::sync::Arc;
use std::time::Duration;

use rand::RngExt;
use tokio_util::sync::CancellationToken;

use crate::api::conditions::Conditions;
use crate::api::metrics::Metrics;
use crate::api::{CheckInfo, LastRounds};
use crate::check::{
    self, CheckError, CheckLease, CheckOptions, Checker, CommitHook, JudgeHook, RoundProgress,
};
use crate::config::{Config, Live};
use crate::health::{Entry, Feedback};
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
    /// The configuration in force (the judges and limits follow a
    /// reload).
    pub live: Live,
    /// The feedback path results are committed through.
    pub feedback: Feedback,
    /// Where each round's checker goes, for `verify=true`.
    pub checker: check::Current,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The record of the last rounds.
    pub rounds: LastRounds,
    /// What is degraded (no judge, no checks).
    pub conditions: Arc<Conditions>,
    /// Cancelled when checks in flight must stop at once (their results
    /// are not recorded).
    pub abort: CancellationToken,
}

impl CheckLoop {
    /// Runs rounds until `stop`; a round in progress stops starting checks
    /// and commits what finished.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut opts = self.options();
        let geoip = match check::open_geoip(&self.config) {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "GeoIP disabled");
                None
            }
        };
        // A node restarted under the same node.id (killed, say) takes back
        // at once what its last run leased: no check of those runs any
        // more, since a node.id is one process's, so they need not wait
        // for the leases to end.
        match self.store.release_leases(self.config.node.id()).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                proxies = n,
                "took back the check leases of this node's last run"
            ),
            Err(e) => {
                tracing::debug!(error = %e, "cannot take back the check leases of the last run")
            }
        }
        let mut retry = JUDGE_RETRY_FIRST;
        let mut outage = JudgeOutage::default();
        let mut prepared: Option<(Arc<Checker>, std::time::Instant)> = None;
        let mut last_round: Option<std::time::Instant> = None;
        // Since when every judge has been lost in the middle of a round,
        // until one answers again.
        let mut lost_mid_round: Option<std::time::Instant> = None;
        let mut rounds = RoundLog::default();
        while !stop.is_cancelled() {
            // A reload that changed `[check]` (its judges, its limits)
            // takes effect from the next round, with the judges asked
            // again.
            let live = self.live.get();
            if !Arc::ptr_eq(&live, &self.config) {
                let changed = live.check != self.config.check;
                self.config = live;
                if changed {
                    opts = self.options();
                    prepared = None;
                }
            }
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
            // Set when the loop found something due before asking the
            // judges: the round starts at once after they answer.
            let mut due_now = false;
            let checker = match fresh {
                Some(c) => Ok(c),
                None => {
                    // The judges are asked only when there is something to
                    // check (or, at start, proxies that verify=true may
                    // need them): an idle daemon neither asks them nor
                    // warns about them.
                    let at_start = prepared.is_none() && !self.feedback.index().is_empty();
                    if !at_start {
                        if !self.until_due(&stop, last_round).await {
                            continue;
                        }
                        due_now = true;
                    }
                    Checker::prepare(&self.config, &opts, geoip.clone())
                        .await
                        .map(Arc::new)
                }
            };
            match checker {
                Ok(checker) => {
                    retry = JUDGE_RETRY_FIRST;
                    if let Some(told) = outage.end(&self.conditions, &self.feedback) {
                        tracing::info!(
                            after = %told.lasted(),
                            "judges answer again; re-checking every served proxy now"
                        );
                        lost_mid_round = None;
                    }
                    let new_checker = prepared
                        .as_ref()
                        .is_none_or(|(c, _)| !Arc::ptr_eq(c, &checker));
                    if new_checker && let Some(since) = lost_mid_round.take() {
                        // A judge answered a direct request again.
                        judges_back(since);
                    }
                    if new_checker {
                        // verify=true works from the first second: the first
                        // checker is prepared at start, not when something
                        // falls due.
                        self.checker.set(checker.clone());
                        prepared = Some((checker.clone(), std::time::Instant::now()));
                    }
                    if due_now || self.until_due(&stop, last_round).await {
                        last_round = Some(std::time::Instant::now());
                        let ended = self.round(checker, &opts, &stop, &mut rounds).await;
                        match ended {
                            Ended::Lost => {
                                lost_mid_round.get_or_insert_with(std::time::Instant::now);
                            }
                            Ended::Done { passed: true } => {
                                // A pass proves a judge answered.
                                if let Some(since) = lost_mid_round.take() {
                                    judges_back(since);
                                }
                            }
                            _ => {}
                        }
                        if ended.judges_doubtful()
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
                    outage.note(&self.conditions, &self.feedback, &e);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(JUDGE_RETRY_MAX);
                }
            }
        }
    }

    /// How rounds run, as `[check]` says.
    fn options(&self) -> CheckOptions {
        let metrics = self.metrics.clone();
        let hook: CommitHook = Arc::new(move |batch| metrics.observe_checks(batch));
        let metrics = self.metrics.clone();
        let judge_hook: JudgeHook = Arc::new(move |url, answer| metrics.observe_judge(url, answer));
        let mut opts = CheckOptions::from_config(&self.config.check);
        opts.on_judge = Some(judge_hook);
        opts.concurrency = check::clamp_concurrency(opts.concurrency);
        opts.on_commit = Some(hook);
        opts.abort_in_flight = Some(self.abort.clone());
        opts.dispatch_for = Some(ROUND_DISPATCH);
        // Due proxies are leased, so that nodes sharing the database split
        // them (a lone node leases too: the same path either way).
        opts.lease = Some(CheckLease {
            node: self.config.node.id(),
            hold: self.config.node.lease,
        });
        opts
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
        let queued = self
            .feedback
            .queue_due(now_ms(), |served, adopted| {
                self.adopted_due(served, adopted)
            })
            .await;
        if let Err(e) = &queued.adopted {
            log_store_error(e, "cannot schedule re-checks of the proxies loaded");
        }
        let urgent = match queued.rechecks {
            Ok(n) => n > 0,
            Err(e) => {
                log_store_error(&e, "cannot queue proxies for an early re-check");
                true
            }
        };
        let gap = match last_round {
            Some(at) if !urgent => {
                let cycle = self.config.check.serve_cycle(queued.served);
                ROUND_GAP.min(cycle / 20).saturating_sub(at.elapsed())
            }
            _ => Duration::ZERO,
        };
        let wait = match self.store.next_due_at(now_ms()).await {
            Ok(Some(t)) => {
                Duration::from_millis((t - now_ms()).clamp(0, POLL.as_millis() as i64) as u64)
            }
            Ok(None) => POLL,
            Err(e) => {
                log_store_error(&e, "cannot read when the next check is due");
                POLL
            }
        };
        if wait.is_zero() && gap.is_zero() {
            return true;
        }
        let wait = if wait.is_zero() { gap } else { wait };
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = self.feedback.recheck_wanted() => {}
            _ = tokio::time::sleep(wait) => {}
        }
        false
    }

    /// When to check the proxies that entered the index on a schedule this
    /// daemon did not make (those another process checked, read back by
    /// the index sync), with `served` proxies served: on the served
    /// proxies' re-check cycle. Without this a proxy `proxywarden check`
    /// found alive keeps its next check up to `check.recheck_alive` away:
    /// it is served unverified until the freshness window passes, then not
    /// served at all.
    fn adopted_due(&self, served: usize, adopted: &[Arc<Entry>]) -> Vec<(i64, i64)> {
        let check = &self.config.check;
        let now = now_ms();
        // Many at once (a `proxywarden check` round beside the daemon):
        // spread over the cycle from now, or they would all come back
        // together, and nothing would be re-checked until then.
        let bulk = check.is_bulk(served, adopted.len());
        let mut rng = rand::rng();
        let due: Vec<(i64, i64)> = adopted
            .iter()
            .filter_map(|e| {
                let spread: f64 = rng.random();
                if bulk {
                    check.bulk_check_at(served, e.next_check_at, now, spread)
                } else {
                    check.served_check_at(served, e.last_checked, e.next_check_at, now, spread)
                }
                .map(|at| (e.id, at))
            })
            .collect();
        if !due.is_empty() {
            tracing::debug!(
                proxies = due.len(),
                "re-checks of adopted proxies scheduled"
            );
        }
        due
    }

    /// The re-check policy for the next round: served proxies come round
    /// every [`CheckConfig::serve_cycle`](crate::config::CheckConfig::serve_cycle),
    /// and are not served once two cycles (and a check's timeout) have
    /// passed without a check. While the disk refuses writes, and until
    /// it has taken them again for a while, there is no window (see
    /// [`super::writes`]).
    /// A round of `due` proxies that is a bulk check (see
    /// [`CheckConfig::is_bulk`](crate::config::CheckConfig::is_bulk))
    /// spreads the next checks of what passes evenly over one cycle.
    fn freshness(&self, due: usize) -> crate::model::RecheckPolicy {
        let check = &self.config.check;
        let served = self.feedback.index().len();
        if self.conditions.get(super::writes::COMPONENT).is_none() {
            self.feedback.set_fresh_within(check.fresh_window(served));
        }
        if check.is_bulk(served, due) {
            check.bulk_policy(served)
        } else {
            check.serve_policy(served)
        }
    }

    async fn round(
        &self,
        checker: Arc<Checker>,
        opts: &CheckOptions,
        stop: &CancellationToken,
        log: &mut RoundLog,
    ) -> Ended {
        // Counted apart from the round's own count, which it takes once
        // the policy is set; an error only costs the spread.
        let due = self.store.count_due(now_ms(), false).await.unwrap_or(0);
        let policy = self.freshness(due as usize);
        let progress = Arc::new(RoundProgress::default());
        match check::check_round(
            checker,
            &self.store,
            &self.feedback,
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
                self.rounds.record(|r| r.last_check = Some(info));
                log.add(&summary, self.feedback.index().len());
                // Nothing passed and some failures were laid at the judges'
                // door: ask them directly now whether they are there.
                if summary.unconfirmed > 0 && summary.alive == 0 {
                    Ended::Doubtful
                } else {
                    Ended::Done {
                        passed: summary.alive > 0,
                    }
                }
            }
            Err(e @ CheckError::JudgeLost { .. }) => {
                tracing::warn!(error = %e, "check round stopped");
                Ended::Lost
            }
            // The write component says so, once for everything that writes;
            // the loop waits until the disk takes writes again.
            Err(CheckError::Store(e)) if e.write_failure().is_some() => {
                tracing::debug!(error = %e, "check round stopped: its results cannot be written");
                Ended::Done { passed: false }
            }
            Err(e) => {
                tracing::error!(error = %e, "check round failed");
                Ended::Done { passed: false }
            }
        }
    }
}

/// Says that the judges, lost in the middle of a round `since`, answer
/// again.
fn judges_back(since: std::time::Instant) {
    let after = Duration::from_secs(since.elapsed().as_secs().max(1));
    tracing::info!(after = %humantime::format_duration(after), "judges answer again");
}

/// How a round ended, for what the loop does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// It finished (or failed for reasons of its own); `passed` when some
    /// proxy passed, which proves a judge answered.
    Done { passed: bool },
    /// Nothing passed, and failures were laid at the judges' door: they
    /// may have stopped answering.
    Doubtful,
    /// Every judge stopped answering during it.
    Lost,
}

impl Ended {
    /// True when the judges are to be asked directly again.
    fn judges_doubtful(self) -> bool {
        matches!(self, Ended::Doubtful | Ended::Lost)
    }
}

/// The INFO line of check rounds: one per round (checked, alive, dead,
/// took). The daemon runs a round whenever proxies fall due, at times
/// every second: rounds that end within [`ROUND_LOG_EVERY`] of the last
/// line are added up into the next one, which says how many rounds it
/// covers, so a steady state logs a line a minute.
#[derive(Debug, Default)]
struct RoundLog {
    /// Added up since the last line.
    rounds: u64,
    checked: u64,
    alive: u64,
    dead: u64,
    unconfirmed: u64,
    took: Duration,
    /// When the last line was logged.
    logged: Option<std::time::Instant>,
}

/// See [`RoundLog`].
const ROUND_LOG_EVERY: Duration = Duration::from_secs(60);

impl RoundLog {
    /// Adds a finished round, and logs the line when it is due; `served`
    /// is how many proxies are served now.
    fn add(&mut self, s: &check::RoundSummary, served: usize) {
        if s.checked == 0 && s.unconfirmed == 0 {
            return;
        }
        self.rounds += 1;
        self.checked += s.checked;
        self.alive += s.alive;
        self.dead += s.dead;
        self.unconfirmed += s.unconfirmed;
        self.took += s.elapsed;
        if self.logged.is_some_and(|at| at.elapsed() < ROUND_LOG_EVERY) {
            return;
        }
        let took = format!("{:.1}s", self.took.as_secs_f64());
        if self.rounds == 1 {
            tracing::info!(
                checked = self.checked,
                alive = self.alive,
                dead = self.dead,
                unconfirmed = self.unconfirmed,
                %took,
                served,
                "check round finished"
            );
        } else {
            tracing::info!(
                rounds = self.rounds,
                checked = self.checked,
                alive = self.alive,
                dead = self.dead,
                unconfirmed = self.unconfirmed,
                %took,
                served,
                "check rounds finished"
            );
        }
        *self = RoundLog {
            logged: Some(std::time::Instant::now()),
            ..RoundLog::default()
        };
    }
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
    fn note(&mut self, conditions: &Conditions, feedback: &Feedback, e: &CheckError) {
        let component = match e {
            CheckError::NoJudge(_) => "judges",
            _ => "checks",
        };
        let message = format!(
            "{e}; nothing can be checked, so proxies are served while they passed a check \
             or carried a request within api.max_age"
        );
        conditions.set(component, message, now_ms());
        feedback.set_fresh_within(Duration::ZERO);
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
    fn end(&mut self, conditions: &Conditions, feedback: &Feedback) -> Option<super::outage::Told> {
        let told = self.0.end()?;
        conditions.clear("judges");
        conditions.clear("checks");
        feedback.reverify_all(now_ms());
        Some(told)
    }
}
