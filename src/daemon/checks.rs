//! The check component: checks whatever is due, one round at a time, with
//! the proxies handed out and those that failed in use re-checked first.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::api::{AppState, CheckInfo};
use crate::check::{self, CheckOptions, Checker, CommitHook, RoundProgress};
use crate::config::Config;
use crate::store::{Store, now_ms, rfc3339};

/// The longest the loop sleeps when nothing is due; also how often
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

/// Checks due proxies continuously.
pub struct CheckLoop {
    /// `[check]` and the judges.
    pub config: Arc<Config>,
    /// Where due proxies come from.
    pub store: Store,
    /// The feedback path results are committed through, metrics, the
    /// record of the last rounds and the checker `verify=true` uses.
    pub state: AppState,
    /// Woken when a harvest brought new proxies.
    pub wake: Arc<Notify>,
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
        let mut opts = CheckOptions::from_config(&self.config.check);
        opts.concurrency = check::clamp_concurrency(opts.concurrency);
        opts.on_commit = Some(hook);
        opts.abort_in_flight = Some(self.abort.clone());
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
            let due = match self.store.count_due(now_ms(), false).await {
                Ok(n) => n,
                Err(e) => {
                    tracing::error!(error = %e, "cannot count the proxies due for a check");
                    0
                }
            };
            if due > 0 {
                match Checker::prepare(&self.config, &opts, geoip.clone()).await {
                    Ok(checker) => {
                        let checker = Arc::new(checker);
                        self.state.set_checker(checker.clone());
                        self.round(checker, &opts, policy, &stop).await;
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

    async fn round(
        &self,
        checker: Arc<Checker>,
        opts: &CheckOptions,
        policy: crate::model::RecheckPolicy,
        stop: &CancellationToken,
    ) {
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
                    duration_ms: summary.elapsed.as_millis() as u64,
                };
                self.state.record_round(|r| r.last_check = Some(info));
            }
            Err(e) => tracing::error!(error = %e, "check round failed"),
        }
    }

    /// Time until the earliest scheduled check, bounded.
    async fn until_next_due(&self) -> Duration {
        let next = match self.store.next_due_at().await {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(error = %e, "cannot read when the next check is due");
                None
            }
        };
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
