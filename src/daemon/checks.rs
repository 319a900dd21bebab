//! The check component: checks proxies as they fall due, in following
//! rounds, and keeps the proxies it serves fresh: they are re-checked on a
//! short cycle that grows with how many are served, and not served once
//! their last check is older than two cycles.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::api::{AppState, CheckInfo};
use crate::check::{self, CheckOptions, Checker, CommitHook, RoundProgress};
use crate::config::Config;
use crate::store::{Store, now_ms, rfc3339};

/// How long a round dispatches checks before the next one starts. Rounds
/// follow: within a round, proxies are checked as they fall due, so this
/// only sets how often the judges are asked directly again (to learn our
/// own address and find judges that stopped answering) and how often a
/// line is logged.
const ROUND_DISPATCH: Duration = Duration::from_secs(20);
/// Waits before asking the judges again when none answered: short at
/// first (a judge that is this daemon's own API may not be up yet),
/// doubling up to the longest.
const JUDGE_RETRY_FIRST: Duration = Duration::from_secs(1);
/// See [`JUDGE_RETRY_FIRST`].
const JUDGE_RETRY_MAX: Duration = Duration::from_secs(30);

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
        let mut opts = CheckOptions::from_config(&self.config.check);
        opts.concurrency = check::clamp_concurrency(opts.concurrency);
        opts.on_commit = Some(hook);
        opts.abort_in_flight = Some(self.abort.clone());
        opts.dispatch_for = Some(ROUND_DISPATCH);
        opts.follow = true;
        let geoip = match check::open_geoip(&self.config) {
            Ok(g) => g,
            Err(e) => {
                tracing::error!(error = %e, "GeoIP disabled");
                None
            }
        };
        let mut retry = JUDGE_RETRY_FIRST;
        while !stop.is_cancelled() {
            match Checker::prepare(&self.config, &opts, geoip.clone()).await {
                Ok(checker) => {
                    retry = JUDGE_RETRY_FIRST;
                    let checker = Arc::new(checker);
                    // verify=true works from the first round on, which
                    // starts at once: no waiting for something to fall due.
                    self.state.set_checker(checker.clone());
                    self.round(checker, &opts, &stop).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot check now");
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(JUDGE_RETRY_MAX);
                }
            }
        }
    }

    /// The re-check policy for the next round: served proxies come round
    /// every [`CheckConfig::serve_cycle`](crate::config::CheckConfig::serve_cycle),
    /// and are not served once two cycles (and a check's timeout) have
    /// passed without a check.
    fn freshness(&self) -> crate::model::RecheckPolicy {
        let check = &self.config.check;
        let cycle = check.serve_cycle(self.state.index().len());
        self.state
            .feedback
            .set_fresh_within(2 * cycle + check.timeout);
        crate::model::RecheckPolicy {
            alive: cycle,
            ..check.recheck_policy()
        }
    }

    async fn round(&self, checker: Arc<Checker>, opts: &CheckOptions, stop: &CancellationToken) {
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
                    duration_ms: summary.elapsed.as_millis() as u64,
                };
                self.state.record_round(|r| r.last_check = Some(info));
            }
            Err(e) => tracing::error!(error = %e, "check round failed"),
        }
    }
}
