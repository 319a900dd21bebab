//! A check round: page through the due proxies, keep at most `concurrency`
//! checks in flight, and hand results to one writer task that commits them
//! in batches (every 500 results or every second, whichever comes first).
//! Cancelling stops new checks; in-flight ones finish within their timeout
//! and every completed result is committed before the round returns.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::Checker;
use crate::health::Feedback;
use crate::model::{Reason, RecheckPolicy};
use crate::proxy::Anonymity;
use crate::store::{CheckRecord, DueLane, Store, StoreError, now_ms};

/// Results per committed batch.
const BATCH: usize = 500;
/// Longest a result waits for its batch.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Due proxies read per query.
const PAGE: usize = 1000;
/// How often a following round looks for proxies that fell due.
pub const FOLLOW_POLL: Duration = Duration::from_millis(250);

/// Called after each batch is committed (and the health index updated
/// through the feedback path), with the batch: the daemon counts it.
pub type CommitHook = Arc<dyn Fn(&[CheckRecord]) + Send + Sync>;

/// How a round runs.
#[derive(Clone)]
pub struct CheckOptions {
    /// Check every proxy, not only the due ones.
    pub all: bool,
    /// Checks in flight.
    pub concurrency: usize,
    /// Connect timeout per request.
    pub connect_timeout: Duration,
    /// Total timeout per request.
    pub timeout: Duration,
    /// Also test CONNECT + TLS.
    pub https: bool,
    /// Runs after every committed batch.
    pub on_commit: Option<CommitHook>,
    /// When cancelled, checks in flight stop at once and are not recorded
    /// (a daemon shutting down within its deadline); without it they
    /// finish within their timeout.
    pub abort_in_flight: Option<CancellationToken>,
    /// Stop starting checks this long into the round and leave the rest
    /// due for the next one. The daemon keeps its rounds short this way,
    /// so that alive proxies falling due (taken first in every round) and
    /// proxies queued for a re-check wait at most one short round.
    pub dispatch_for: Option<Duration>,
    /// With `dispatch_for`: when nothing more is due, look again every
    /// [`FOLLOW_POLL`] (or when a re-check is asked for) until the round's
    /// time is up, instead of ending the round. The daemon's rounds follow,
    /// so a served proxy falls due and is checked within moments.
    pub follow: bool,
}

impl std::fmt::Debug for CheckOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckOptions")
            .field("all", &self.all)
            .field("concurrency", &self.concurrency)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("https", &self.https)
            .field("on_commit", &self.on_commit.is_some())
            .field("dispatch_for", &self.dispatch_for)
            .field("follow", &self.follow)
            .finish()
    }
}

impl CheckOptions {
    /// The options `[check]` configures.
    pub fn from_config(c: &crate::config::CheckConfig) -> CheckOptions {
        CheckOptions {
            all: false,
            concurrency: c.concurrency,
            connect_timeout: c.connect_timeout,
            timeout: c.timeout,
            https: c.https,
            on_commit: None,
            abort_in_flight: None,
            dispatch_for: None,
            follow: false,
        }
    }
}

/// Live counters of a round, for progress displays.
#[derive(Debug, Default)]
pub struct RoundProgress {
    /// Proxies due when the round started.
    pub total: AtomicU64,
    /// Checks finished.
    pub done: AtomicU64,
    /// Of those, alive.
    pub alive: AtomicU64,
}

/// What a round did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RoundSummary {
    /// Proxies checked (results committed).
    pub checked: u64,
    /// Alive.
    pub alive: u64,
    /// Dead.
    pub dead: u64,
    /// Dead, by reason.
    pub dead_by_reason: BTreeMap<Reason, u64>,
    /// Alive and tunnelling HTTPS.
    pub https: u64,
    /// Alive, by anonymity.
    pub by_anonymity: BTreeMap<Anonymity, u64>,
    /// Wall time.
    pub elapsed: Duration,
    /// True when the round was cancelled before checking everything due.
    pub interrupted: bool,
    /// True when every judge stopped answering mid-round.
    #[serde(skip)]
    judge_lost: bool,
}

impl RoundSummary {
    fn add(&mut self, rec: &CheckRecord) {
        self.checked += 1;
        let o = &rec.outcome;
        match o.failure {
            None => {
                self.alive += 1;
                if o.https == Some(true) {
                    self.https += 1;
                }
                if let Some(a) = o.anonymity {
                    *self.by_anonymity.entry(a).or_default() += 1;
                }
            }
            Some(r) => {
                self.dead += 1;
                *self.dead_by_reason.entry(r).or_default() += 1;
            }
        }
    }
}

/// Why a round could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// No judge answered a direct request: checking now would mark every
    /// proxy dead, so nothing is checked.
    #[error("no judge answered directly, so no proxy was checked or marked dead: {}", .0.join("; "))]
    NoJudge(Vec<String>),
    /// Every judge stopped answering mid-round: the failures seen since
    /// were discarded, not recorded, and the round stopped.
    #[error(
        "every judge stopped answering mid-round; the round stopped after committing {committed} results and recorded no failure seen while the judges were down"
    )]
    JudgeLost {
        /// Results committed before the judges were lost.
        committed: u64,
    },
    /// The TLS configuration for judges could not be built.
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsSetupError),
    /// The GeoIP database could not be opened.
    #[error(transparent)]
    Geoip(#[from] super::geoip::GeoipError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Runs one round over the due proxies. Results are committed through
/// `feedback` as they come; on cancellation the round stops starting
/// checks, waits for the ones in flight and commits them.
pub async fn check_round(
    checker: Arc<Checker>,
    store: &Store,
    feedback: &Feedback,
    opts: &CheckOptions,
    policy: RecheckPolicy,
    cancel: &CancellationToken,
    progress: Arc<RoundProgress>,
) -> Result<RoundSummary, CheckError> {
    let started = Instant::now();
    let now = now_ms();
    let all = opts.all;
    let total = store.count_due(now, all).await?;
    progress.total.store(total as u64, Ordering::Relaxed);
    let concurrency = opts.concurrency.max(1);

    let (tx, rx) = mpsc::channel::<CheckRecord>(concurrency.min(4096) * 2);
    // The round stops taking new proxies when the caller cancels or when
    // the writer finds every judge gone.
    let stop = cancel.child_token();
    // Proxies dispatched and not yet committed: a following round must not
    // take them again while their stored schedule still says they are due.
    let in_flight: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let follow = opts.follow && opts.dispatch_for.is_some();
    let writer = tokio::spawn(write_results(
        feedback.clone(),
        rx,
        policy,
        opts.on_commit.clone(),
        in_flight.clone(),
        JudgeGuard {
            checker: checker.clone(),
            lost: stop.clone(),
        },
    ));
    let permits = Arc::new(Semaphore::new(concurrency));
    let mut interrupted = false;
    let mut paused = false;
    // One timer for the round, polled only when the round has a limit.
    let deadline =
        tokio::time::sleep_until((started + opts.dispatch_for.unwrap_or_default()).into());
    tokio::pin!(deadline);
    let mut now = now;
    'round: loop {
        for lane in DueLane::IN_ORDER {
            let mut after = i64::MIN;
            loop {
                let page = store.due_page(now, all, lane, after, PAGE).await?;
                let Some(last) = page.last() else { break };
                after = last.id;
                for due in page {
                    if follow && lock(&in_flight).contains(&due.id) {
                        continue;
                    }
                    let permit = tokio::select! {
                        biased;
                        _ = stop.cancelled() => {
                            interrupted = true;
                            break 'round;
                        }
                        _ = &mut deadline, if opts.dispatch_for.is_some() => {
                            paused = true;
                            break 'round;
                        }
                        p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
                    };
                    if follow {
                        lock(&in_flight).insert(due.id);
                    }
                    let checker = checker.clone();
                    let tx = tx.clone();
                    let progress = progress.clone();
                    let feedback = feedback.clone();
                    let abort = opts.abort_in_flight.clone().unwrap_or_default();
                    tokio::spawn(async move {
                        let outcome = tokio::select! {
                            o = checker.check(&due.proxy, due.detect) => o,
                            _ = abort.cancelled() => return,
                        };
                        if outcome.alive() {
                            progress.alive.fetch_add(1, Ordering::Relaxed);
                        }
                        progress.done.fetch_add(1, Ordering::Relaxed);
                        let checked_at = now_ms();
                        // Served proxies that failed stop being served now,
                        // not when the batch commits.
                        feedback.checked(due.id, &outcome, checked_at);
                        let rec = CheckRecord {
                            id: due.id,
                            checked_at,
                            outcome,
                        };
                        // The writer outlives every sender; a send can only fail if
                        // it died, and then the round reports its error.
                        let _ = tx.send(rec).await;
                        drop(permit);
                    });
                }
            }
        }
        if !follow {
            break;
        }
        let rechecks = feedback.take_rechecks();
        if !rechecks.is_empty()
            && let Err(e) = store.mark_due_many(rechecks, now_ms()).await
        {
            tracing::error!(error = %e, "cannot queue proxies for an early re-check");
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => {
                interrupted = true;
                break;
            }
            _ = &mut deadline => {
                paused = true;
                break;
            }
            _ = feedback.recheck_wanted() => {}
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
        }
        now = now_ms();
    }
    drop(tx);
    // Wait for every check in flight: they hold their permits until sent.
    let _all = permits
        .acquire_many(concurrency as u32)
        .await
        .expect("the semaphore is never closed");
    let mut summary = match writer.await {
        Ok(r) => r?,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    if summary.judge_lost {
        return Err(CheckError::JudgeLost {
            committed: summary.checked,
        });
    }
    summary.elapsed = started.elapsed();
    summary.interrupted = interrupted;
    tracing::info!(
        checked = summary.checked,
        alive = summary.alive,
        dead = summary.dead,
        https = summary.https,
        elapsed_ms = summary.elapsed.as_millis() as u64,
        interrupted,
        paused,
        "check round finished"
    );
    Ok(summary)
}

/// Makes sure failures are the proxies' fault: before a batch with failures
/// is committed, a judge must still answer directly.
struct JudgeGuard {
    checker: Arc<Checker>,
    lost: CancellationToken,
}

/// The one writer: batches results and commits them off the runtime, when
/// a batch is full, on each tick, and when the last sender is gone.
async fn write_results(
    feedback: Feedback,
    mut rx: mpsc::Receiver<CheckRecord>,
    policy: RecheckPolicy,
    on_commit: Option<CommitHook>,
    in_flight: Arc<Mutex<HashSet<i64>>>,
    guard: JudgeGuard,
) -> Result<RoundSummary, StoreError> {
    let mut summary = RoundSummary::default();
    let mut batch: Vec<CheckRecord> = Vec::with_capacity(BATCH);
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (flush, closed) = tokio::select! {
            rec = rx.recv() => match rec {
                Some(rec) => {
                    batch.push(rec);
                    (batch.len() >= BATCH, false)
                }
                None => (true, true),
            },
            _ = tick.tick() => (true, false),
        };
        if flush && !batch.is_empty() {
            let mut full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH));
            let has_failures = full.iter().any(|r| !r.outcome.alive());
            if has_failures && (summary.judge_lost || !guard.checker.judge_reachable().await) {
                // A judge outage must never look like proxies dying: keep
                // only the passes and stop the round.
                if !summary.judge_lost {
                    tracing::error!("every judge stopped answering; stopping the round");
                }
                summary.judge_lost = true;
                guard.lost.cancel();
                full.retain(|r| r.outcome.alive());
            }
            let full = feedback.commit_checks(full, policy).await?;
            {
                let mut in_flight = lock(&in_flight);
                for rec in &full {
                    in_flight.remove(&rec.id);
                }
            }
            if let Some(hook) = &on_commit {
                hook(&full);
            }
            for rec in &full {
                summary.add(rec);
            }
        }
        if closed {
            return Ok(summary);
        }
    }
}

/// A poisoned lock only means a panic elsewhere; the set is still sound.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
