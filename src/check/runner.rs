//! A check round: page through the due proxies, keep at most `concurrency`
//! checks in flight, and hand results to one writer task that commits them
//! in batches (every 500 results or every second, whichever comes first).
//! Proxies that timed out last time are started from the first moment,
//! longest first, in up to three quarters of the slots, while the alive
//! ones and then the rest take the others: the longest checks never form
//! the round's tail, and re-checks of served proxies never wait behind them.
//! Beside them a monitor asks every judge directly once a second; the
//! writer never waits for it. Passes are committed at once; a failure is
//! committed once some judge has answered after it (a later pass or a
//! direct answer), so a judge outage never looks like proxies dying.
//! Cancelling stops new checks; in-flight ones finish within their timeout
//! and every completed result is committed before the round returns.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::health::{self, Beat};
use super::{Checker, Prior, Verdict};
use crate::health::Feedback;
use crate::model::{Reason, RecheckPolicy};
use crate::proxy::Anonymity;
use crate::store::{CheckRecord, DueCursor, DueLane, DueProxy, Store, StoreError, now_ms};

/// Results per committed batch.
const BATCH: usize = 500;
/// Longest a result waits for its batch.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// Due proxies read per query.
const PAGE: usize = 1000;
/// Failures held until a judge answers after them; past this many the
/// writer stops taking results until one does.
const MAX_PENDING: usize = 20_000;
/// A proxy whose failure no healthy judge could confirm is checked again
/// after this long (or its re-check interval, if shorter).
const UNCONFIRMED_RETRY: Duration = Duration::from_secs(30);

/// Called after each batch is committed (and the health index updated
/// through the feedback path), with the batch: the daemon counts it.
pub type CommitHook = Arc<dyn Fn(&[CheckRecord]) + Send + Sync>;

/// Called with every direct answer of a judge (or its absence): its URL
/// and how long the answer took, or why there was none. The daemon keeps
/// per-judge metrics with it.
pub type JudgeHook = Arc<dyn Fn(&str, Result<Duration, &str>) + Send + Sync>;

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
    /// How long a proxy's HTTPS result stands before it is tested again.
    pub https_recheck: Duration,
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
    /// Told of every direct answer of a judge.
    pub on_judge: Option<JudgeHook>,
    /// Take due proxies by leasing them, as a node among several sharing
    /// the database does: two nodes never check one proxy at once, and
    /// what a dead node leased is taken by another once its lease ends.
    /// Without it due proxies are read as they are (the `check` command).
    pub lease: Option<CheckLease>,
}

/// How a node leases the proxies it checks (see [`CheckOptions::lease`]).
#[derive(Clone, Debug)]
pub struct CheckLease {
    /// The node's id, stored with each lease.
    pub node: String,
    /// How long a lease holds: longer than a check takes from the moment
    /// it is leased to its verdict's commit.
    pub hold: Duration,
}

impl std::fmt::Debug for CheckOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckOptions")
            .field("all", &self.all)
            .field("concurrency", &self.concurrency)
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .field("https", &self.https)
            .field("https_recheck", &self.https_recheck)
            .field("on_commit", &self.on_commit.is_some())
            .field("dispatch_for", &self.dispatch_for)
            .field("lease", &self.lease)
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
            https_recheck: c.https_recheck,
            on_commit: None,
            abort_in_flight: None,
            dispatch_for: None,
            on_judge: None,
            lease: None,
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
    /// Alive but not put to the HTTPS test this round (not due, no TLS
    /// judge, or the test proved nothing): their stored result stands.
    pub https_untested: u64,
    /// Alive, by anonymity.
    pub by_anonymity: BTreeMap<Anonymity, u64>,
    /// Checks that ended without a verdict: a proxy that passed its last
    /// check failed in a way that may be the judge's, and no second healthy
    /// judge could confirm it. They keep their status, are not counted in
    /// `checked`, and are due again within a minute.
    pub unconfirmed: u64,
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
                match o.https {
                    Some(true) => self.https += 1,
                    Some(false) => {}
                    None => self.https_untested += 1,
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
/// checks, waits for the ones in flight and commits them. Dropping the
/// returned future stops the round where it stands, as before.
pub async fn check_round(
    checker: Arc<Checker>,
    store: &Store,
    feedback: &Feedback,
    opts: &CheckOptions,
    policy: RecheckPolicy,
    cancel: &CancellationToken,
    progress: Arc<RoundProgress>,
) -> Result<RoundSummary, CheckError> {
    // The round runs as a task of its own, on the runtime's workers, where
    // the checks that end wake it. Awaited on a thread outside them (the
    // CLI's main future, in `block_on`), every check that ended woke that
    // thread across a futex, and each check it started woke a worker back.
    let (store, feedback, opts, cancel) = (
        store.clone(),
        feedback.clone(),
        opts.clone(),
        cancel.clone(),
    );
    let round = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        run_round(checker, &store, &feedback, &opts, policy, &cancel, progress).await
    }));
    match round.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Cancelled only as the runtime shuts down: nothing was finished.
        Err(_) => Ok(RoundSummary {
            interrupted: true,
            ..RoundSummary::default()
        }),
    }
}

/// [`check_round`] on its own task.
async fn run_round(
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

    let (tx, rx) = mpsc::channel::<Done>(concurrency.min(4096) * 2);
    // The round stops taking new proxies when the caller cancels or when
    // the writer finds every judge gone.
    let stop = cancel.child_token();
    let (beat_tx, beat_rx) = watch::channel(Beat {
        answered_at: None,
        lost_since: None,
    });
    let monitor_stop = CancellationToken::new();
    let _monitor_guard = monitor_stop.clone().drop_guard();
    tokio::spawn(health::monitor(
        checker.clone(),
        beat_tx.clone(),
        monitor_stop,
    ));
    let writer = tokio::spawn(write_results(
        Writer {
            feedback: feedback.clone(),
            policy,
            on_commit: opts.on_commit.clone(),
            checker: checker.clone(),
            beat: beat_tx,
            lost: stop.clone(),
        },
        rx,
        beat_rx,
    ));
    let permits = Arc::new(Semaphore::new(concurrency));
    let dispatcher = Dispatcher {
        store,
        feedback: feedback.clone(),
        now,
        all,
        https_recheck: opts.https.then_some(opts.https_recheck),
        checker: checker.clone(),
        tx,
        progress,
        abort: opts.abort_in_flight.clone().unwrap_or_default(),
        permits: permits.clone(),
        stop: stop.clone(),
        deadline: opts.dispatch_for.map(|d| started + d),
        lease: opts.lease.clone().filter(|_| !all),
        page: if opts.lease.is_some() {
            // Leased a page at a time: a page no bigger than the checks in
            // flight waits at most one generation of checks for its
            // permits, well inside its lease.
            PAGE.min(concurrency)
        } else {
            PAGE
        },
    };
    // Two streams share the permits. Proxies that timed out last time start
    // first, longest first: the rest wait until they hold their share.
    // They hold at most three quarters of the permits, so the rest always
    // move; once the rest are all started the limit goes.
    let timed_out_cap = (concurrency * 3 / 4).max(1);
    let timed_out_permits = Arc::new(Semaphore::new(timed_out_cap));
    let head_start = CancellationToken::new();
    let (timed_out, rest) = tokio::join!(
        dispatcher.run(
            &DueLane::TIMED_OUT,
            Stream::First {
                cap: &timed_out_permits,
                started: &head_start,
            },
        ),
        async {
            let ended = dispatcher
                .run(&DueLane::REST, Stream::After(&head_start))
                .await;
            timed_out_permits.add_permits(concurrency.saturating_sub(timed_out_cap));
            ended
        },
    );
    let (timed_out, rest) = (timed_out?, rest?);
    let interrupted = timed_out == Ended::Interrupted || rest == Ended::Interrupted;
    let paused = timed_out == Ended::Paused || rest == Ended::Paused;
    drop(dispatcher);
    // Wait for every check in flight: they hold their permits until sent.
    let _all = permits
        .acquire_many(concurrency as u32)
        .await
        .expect("the semaphore is never closed");
    let written = match writer.await {
        Ok(r) => r,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    if let Some(lease) = opts.lease.as_ref().filter(|_| !all) {
        // Every verdict is committed: what this node still holds was not
        // checked (results dropped with the judges, or the store refused
        // them) and is due for any node again at once.
        if let Err(e) = store.release_leases(lease.node.clone()).await {
            tracing::debug!(error = %e, "cannot give back the check leases left");
        }
    }
    let mut summary = written?;
    if summary.judge_lost {
        return Err(CheckError::JudgeLost {
            committed: summary.checked,
        });
    }
    summary.elapsed = started.elapsed();
    summary.interrupted = interrupted;
    // The daemon runs a round whenever something falls due, several a
    // second at times: one line each would drown the log at info.
    tracing::debug!(
        checked = summary.checked,
        alive = summary.alive,
        dead = summary.dead,
        unconfirmed = summary.unconfirmed,
        https = summary.https,
        elapsed_ms = summary.elapsed.as_millis() as u64,
        interrupted,
        paused,
        "check round finished"
    );
    Ok(summary)
}

/// Why a dispatch stream stopped starting checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ended {
    /// Every due proxy of its lanes was started.
    Drained,
    /// The round was cancelled.
    Interrupted,
    /// The round's dispatch time was up.
    Paused,
}

/// How a dispatch stream shares the round's permits with the other one.
#[derive(Clone, Copy)]
enum Stream<'a> {
    /// Starts first and holds at most `cap`'s permits; `started` is
    /// cancelled once it holds all of them or has nothing more to start.
    First {
        cap: &'a Arc<Semaphore>,
        started: &'a CancellationToken,
    },
    /// Starts its first check only once this token is cancelled.
    After(&'a CancellationToken),
}

/// Starts the checks of a round: what every stream of it shares.
struct Dispatcher<'a> {
    store: &'a Store,
    /// Told of every result at once, so a served proxy that failed stops
    /// being served before the batch commits.
    feedback: Feedback,
    now: i64,
    all: bool,
    /// How long an HTTPS result stands; `None` when HTTPS is not tested.
    https_recheck: Option<Duration>,
    checker: Arc<Checker>,
    tx: mpsc::Sender<Done>,
    progress: Arc<RoundProgress>,
    abort: CancellationToken,
    /// One per check in flight.
    permits: Arc<Semaphore>,
    stop: CancellationToken,
    deadline: Option<Instant>,
    /// Set when due proxies are leased rather than read.
    lease: Option<CheckLease>,
    /// Due proxies per page.
    page: usize,
}

impl Dispatcher<'_> {
    /// The next page of `lane`: leased (a lease taken leaves the lane, so
    /// no cursor is needed) or read after `after`.
    async fn next_page(
        &self,
        lane: DueLane,
        after: DueCursor,
    ) -> Result<Vec<DueProxy>, StoreError> {
        match &self.lease {
            Some(l) => {
                self.store
                    .lease_due(l.node.clone(), now_ms(), lane, self.page, l.hold)
                    .await
            }
            None => {
                self.store
                    .due_page(self.now, self.all, lane, after, self.page)
                    .await
            }
        }
    }

    /// Starts a check for every due proxy of `lanes`, in order, each
    /// holding a permit (and one of the stream's cap, when it has one)
    /// until its result is handed to the writer.
    async fn run(&self, lanes: &[DueLane], stream: Stream<'_>) -> Result<Ended, StoreError> {
        // One timer per stream, polled only when the round has a limit.
        let deadline = tokio::time::sleep_until(self.deadline.unwrap_or_else(Instant::now).into());
        tokio::pin!(deadline);
        let (cap, started) = match stream {
            Stream::First { cap, started } => (Some(cap), Some(started)),
            Stream::After(first) => {
                tokio::select! {
                    biased;
                    _ = self.stop.cancelled() => return Ok(Ended::Interrupted),
                    _ = &mut deadline, if self.deadline.is_some() => return Ok(Ended::Paused),
                    _ = first.cancelled() => {}
                }
                (None, None)
            }
        };
        // However the stream ends, the other one may go.
        let _started = started.map(|s| s.clone().drop_guard());
        for &lane in lanes {
            let mut after = DueCursor::START;
            loop {
                let page = self.next_page(lane, after).await?;
                let Some(last) = page.last() else { break };
                after = last.cursor();
                // A short page is the lane's last: no query to find so.
                // (A page shortened by a row that does not parse ends the
                // lane early; what it left is still due next round.)
                let more = page.len() == self.page;
                for due in page {
                    let capped = match cap {
                        None => None,
                        Some(cap) => {
                            if let Some(started) = started.filter(|_| cap.available_permits() == 0)
                            {
                                started.cancel();
                            }
                            tokio::select! {
                            biased;
                            _ = self.stop.cancelled() => return Ok(Ended::Interrupted),
                            _ = &mut deadline, if self.deadline.is_some() => return Ok(Ended::Paused),
                            p = cap.clone().acquire_owned() => Some(p.expect("never closed")),
                            }
                        }
                    };
                    let permit = tokio::select! {
                        biased;
                        _ = self.stop.cancelled() => return Ok(Ended::Interrupted),
                        _ = &mut deadline, if self.deadline.is_some() => return Ok(Ended::Paused),
                        p = self.permits.clone().acquire_owned() => p.expect("never closed"),
                    };
                    self.spawn(due, (permit, capped));
                }
                if !more {
                    break;
                }
            }
        }
        Ok(Ended::Drained)
    }

    /// Checks `due` on its own task, which holds `permits` until its result
    /// is with the writer.
    fn spawn(&self, due: DueProxy, permits: (OwnedSemaphorePermit, Option<OwnedSemaphorePermit>)) {
        let prior = Prior {
            alive: due.alive,
            https_due: self.https_recheck.is_some_and(|every| {
                due.https_checked_at
                    .is_none_or(|at| self.now - at >= every.as_millis() as i64)
            }),
        };
        let checker = self.checker.clone();
        let tx = self.tx.clone();
        let progress = self.progress.clone();
        let abort = self.abort.clone();
        let feedback = self.feedback.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let verdict = tokio::select! {
                v = checker.check_with(&due.proxy, due.detect, prior) => v,
                _ = abort.cancelled() => return,
            };
            progress.done.fetch_add(1, Ordering::Relaxed);
            let done = match verdict {
                Verdict::Checked(outcome) => {
                    if outcome.alive() {
                        progress.alive.fetch_add(1, Ordering::Relaxed);
                    }
                    let checked_at = now_ms();
                    feedback.checked(due.id, &outcome, checked_at);
                    let rec = CheckRecord {
                        id: due.id,
                        checked_at,
                        outcome,
                    };
                    Done::Checked(rec, started, Instant::now())
                }
                Verdict::Unconfirmed(_) => Done::Unconfirmed(due.id),
            };
            // The writer outlives every sender; a send can only fail if it
            // died, and then the round reports its error.
            let _ = tx.send(done).await;
            drop(permits);
        });
    }
}

/// A finished check on its way to the writer.
enum Done {
    /// A verdict to commit, with the moments the check started and ended.
    Checked(CheckRecord, Instant, Instant),
    /// A check without a verdict (see [`Verdict::Unconfirmed`]).
    Unconfirmed(i64),
}

/// What the writer needs besides its inputs.
struct Writer {
    feedback: Feedback,
    policy: RecheckPolicy,
    on_commit: Option<CommitHook>,
    /// For one last direct question to the judges when failures are left
    /// waiting at the end.
    checker: Arc<Checker>,
    beat: watch::Sender<Beat>,
    /// Cancelled when the round must stop starting checks: every judge is
    /// lost, or the store cannot take the results.
    lost: CancellationToken,
}

/// The results of a round not yet committed.
#[derive(Default)]
struct Unwritten {
    /// Passes and vouched failures, committed at the next flush.
    batch: Vec<CheckRecord>,
    /// Failures waiting for a judge to answer after them, oldest first.
    pending: VecDeque<(CheckRecord, Instant)>,
    /// Proxies to check again soon, without a verdict.
    deferred: Vec<i64>,
    /// The latest moment a judge is known to have answered.
    vouched: Option<Instant>,
    /// When the latest check that passed started.
    passed: Option<Instant>,
}

impl Unwritten {
    /// True when `b` says every judge is out of reach and no check has
    /// passed since (a pass proves a judge answered, whatever the direct
    /// requests say).
    fn lost(&self, b: &Beat) -> bool {
        b.lost_since
            .is_some_and(|since| self.passed.is_none_or(|p| p < since))
    }

    /// A judge answered at `at`: failures before it are the proxies'.
    fn vouch(&mut self, at: Option<Instant>) {
        let Some(at) = at else { return };
        let at = self.vouched.map_or(at, |v| v.max(at));
        self.vouched = Some(at);
        // Results arrive about in the order they ended; one slightly out
        // of order waits for the next answer.
        while self.pending.front().is_some_and(|(_, t)| *t <= at) {
            let (rec, _) = self.pending.pop_front().expect("checked above");
            self.batch.push(rec);
        }
    }
}

/// The one writer: batches results and commits them off the runtime, when
/// a batch is full, on each tick, and when the last sender is gone.
async fn write_results(
    w: Writer,
    mut rx: mpsc::Receiver<Done>,
    mut beat: watch::Receiver<Beat>,
) -> Result<RoundSummary, StoreError> {
    let mut summary = RoundSummary::default();
    let mut out = Unwritten {
        batch: Vec::with_capacity(BATCH),
        ..Unwritten::default()
    };
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let retry_after = UNCONFIRMED_RETRY.min(w.policy.alive);
    loop {
        let (flush, closed) = tokio::select! {
            done = rx.recv(), if out.pending.len() < MAX_PENDING => match done {
                Some(Done::Checked(rec, started, ended)) => {
                    if rec.outcome.alive() {
                        // A judge answered a connection made after the
                        // check started (one made before may be served
                        // by a judge that has stopped taking new ones).
                        out.batch.push(rec);
                        out.passed = Some(out.passed.map_or(started, |p| p.max(started)));
                        out.vouch(Some(started));
                    } else if !summary.judge_lost {
                        out.pending.push_back((rec, ended));
                    } else {
                        // A failure once every judge is lost is dropped,
                        // and the proxy it hid served again.
                        restore(&w, vec![rec.id]);
                    }
                    (out.batch.len() >= BATCH, false)
                }
                Some(Done::Unconfirmed(id)) => {
                    summary.unconfirmed += 1;
                    out.deferred.push(id);
                    (false, false)
                }
                None => (true, true),
            },
            Ok(()) = beat.changed() => {
                let b = *beat.borrow_and_update();
                out.vouch(b.answered_at);
                if out.lost(&b) {
                    lose(&w, &mut summary, &mut out);
                }
                (false, false)
            }
            _ = tick.tick() => (true, false),
        };
        while closed && !out.pending.is_empty() && !summary.judge_lost {
            // Every check has ended: one direct answer from any judge now
            // vouches for all the failures still waiting. Judges silent a
            // few times in a row are out of reach.
            let b = health::probe_all(&w.checker, &w.beat).await;
            out.vouch(b.answered_at);
            if out.lost(&b) {
                lose(&w, &mut summary, &mut out);
            } else if !out.pending.is_empty() {
                tokio::time::sleep(health::PROBE_EVERY).await;
            }
        }
        if flush && !out.batch.is_empty() {
            let full = std::mem::replace(&mut out.batch, Vec::with_capacity(BATCH));
            let full = match w.feedback.commit_checks(full, w.policy).await {
                Ok(full) => full,
                Err(e) => return Err(abandon(&w, rx, out, e).await),
            };
            if let Some(hook) = &w.on_commit {
                hook(&full);
            }
            for rec in &full {
                summary.add(rec);
            }
        }
        if flush && !out.deferred.is_empty() {
            let at = now_ms() + retry_after.as_millis() as i64;
            if let Err(e) = w
                .feedback
                .defer_checks(std::mem::take(&mut out.deferred), at)
                .await
            {
                return Err(abandon(&w, rx, out, e).await);
            }
        }
        if closed {
            return Ok(summary);
        }
    }
}

/// The store could not take a batch (`e`): the round stops starting
/// checks, and the results still to come are dropped as they arrive, so
/// that a full disk costs no more checks than those already running. When
/// the disk refused the write they are counted as unrecorded; the proxies
/// stay due in the record and are checked again once it can be written.
async fn abandon(
    w: &Writer,
    mut rx: mpsc::Receiver<Done>,
    out: Unwritten,
    e: StoreError,
) -> StoreError {
    w.lost.cancel();
    let mut dropped = out.batch.len() + out.pending.len();
    while let Some(done) = rx.recv().await {
        if let Done::Checked(..) = done {
            dropped += 1;
        }
    }
    if e.write_failure().is_some() {
        w.feedback.count_unrecorded(dropped);
    }
    tracing::debug!(dropped, error = %e, "check results not recorded");
    e
}

/// Every judge is out of reach: failures say nothing about the proxies.
/// Drops those waiting and stops the round; passes are still committed.
fn lose(w: &Writer, summary: &mut RoundSummary, out: &mut Unwritten) {
    if !summary.judge_lost {
        tracing::error!(
            discarded = out.pending.len(),
            "every judge stopped answering; stopping the round"
        );
    }
    summary.judge_lost = true;
    w.lost.cancel();
    let ids = out.pending.drain(..).map(|(rec, _)| rec.id).collect();
    restore(w, ids);
}

/// Serves again the proxies whose failures were dropped (see
/// [`Feedback::restore`]).
fn restore(w: &Writer, ids: Vec<i64>) {
    if ids.is_empty() {
        return;
    }
    let feedback = w.feedback.clone();
    tokio::spawn(async move {
        if let Err(e) = feedback.restore(ids).await {
            tracing::debug!(error = %e, "cannot serve again the proxies a lost judge failed");
        }
    });
}
