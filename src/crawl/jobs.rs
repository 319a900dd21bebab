//! Crawl jobs in the daemon (`/crawls`): a job's row in the store, its
//! crawl run on the daemon's live pool with its frontier and pages in files
//! beside the database, so that a restarted daemon continues it, and its
//! view. At most `crawls.max_running` crawl at once; the others wait,
//! queued. Its options are read and validated in [`super::spec`].
//!
//! A node crawls a job while it holds the job's lease in the store, which
//! its heartbeat renews every [`HEARTBEAT`]; when a node stops (killed, its
//! database away) the lease ends after [`LEASE`] and another node sharing
//! the database takes the job over from its frontier. A cancel asked on
//! any node reaches the node crawling the job through the store.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, Semaphore, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::spec::JOB_GRACE;
pub use super::spec::{CrawlSpec, SpecContext, SpecError, Validated};
use super::{CrawlOptions, Progress, Summary, crawl};
use crate::config::{Config, CrawlsConfig};
use crate::lock;
use crate::pool::Pool;
use crate::store::{CancelAsk, CrawlJobRecord, Store, StoreError, now_ms, rfc3339};

/// Jobs one page of `GET /crawls` lists at most, newest first.
pub const MAX_LISTED: usize = 1000;
/// Jobs a page of `GET /crawls` lists when the client does not say.
pub const DEFAULT_LISTED: usize = 100;
/// New links a job keeps per page: a page of 10,000 new links (a link
/// farm) adds 1,000 to the frontier.
pub const LINKS_PER_PAGE: usize = 1_000;
/// Bytes of pages read per chunk of a `/pages` stream.
const CHUNK: usize = 64 * 1024;
/// How often a node renews the leases of the jobs it crawls, reads the
/// cancels asked elsewhere and looks for jobs to take.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// How often ended jobs past their keeping are deleted.
const PURGE_EVERY: Duration = Duration::from_secs(60);
/// How long a job's lease (and its pages') lasts without a renewal: a node
/// that stops for this long loses its jobs to the other nodes.
pub const LEASE: Duration = Duration::from_secs(8);

/// Why a job request failed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// An option is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The daemon is stopping.
    #[error("the daemon is stopping")]
    Stopping,
    /// `crawls.max_queued` jobs are waiting already.
    #[error(
        "the crawl job queue is full: crawls.max_queued ({0}) jobs are waiting for a turn \
         already; try again once one has started, or cancel one"
    )]
    QueueFull(usize),
    /// A job's files could not be read.
    #[error("cannot read a crawl job's pages: {0}")]
    Io(#[from] std::io::Error),
}

/// A job crawling (or waiting to) in this process.
struct Live {
    cancel: CancellationToken,
    /// Cancelled by `DELETE`, not by a shutdown.
    by_user: Arc<AtomicBool>,
    progress: Arc<Progress>,
    ended: watch::Receiver<bool>,
    /// Another node holds the job now: it stops here without an end.
    lost: Arc<AtomicBool>,
    /// When its lease was last renewed.
    renewed: Instant,
}

struct Inner {
    store: Store,
    /// The daemon's one pool: each job is a client of it.
    pool: Pool,
    limits: CrawlsConfig,
    default_age: Duration,
    /// Each job's files live in `dir/<id>/`.
    dir: PathBuf,
    permits: Arc<Semaphore>,
    live: Mutex<HashMap<i64, Live>>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// This node, as job and page leases name it.
    node: String,
    /// Wakes the heartbeat to take jobs at once: one ended.
    wake: Notify,
    /// One look for jobs to take at a time, so that looks started by a
    /// post and by the heartbeat together never take more than the room.
    taking: tokio::sync::Mutex<()>,
}

/// The daemon's crawl jobs: a cheap, cloneable handle.
#[derive(Clone)]
pub struct CrawlJobs {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for CrawlJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrawlJobs")
            .field("dir", &self.inner.dir)
            .finish()
    }
}

/// Where the jobs of the database at `db` keep their files.
pub fn jobs_dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".crawls");
    db.with_file_name(name)
}

impl CrawlJobs {
    /// Jobs of `store`, each crawling as a client of `pool` (the daemon's
    /// one pool), within `config.crawls`.
    pub fn new(store: Store, pool: Pool, config: &Config) -> CrawlJobs {
        CrawlJobs {
            inner: Arc::new(Inner {
                store,
                pool,
                limits: config.crawls.clone(),
                default_age: config.api.max_age,
                dir: jobs_dir(&config.database.path),
                permits: Arc::new(Semaphore::new(config.crawls.max_running.max(1))),
                live: Mutex::default(),
                tracker: TaskTracker::new(),
                shutdown: CancellationToken::new(),
                node: config.node.id(),
                wake: Notify::new(),
                taking: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// This node's name in the leases it holds.
    pub fn node(&self) -> &str {
        &self.inner.node
    }

    /// The daemon's component: every [`HEARTBEAT`] (and at once when a job
    /// is posted or ends) renews the leases of the jobs this node crawls,
    /// stops those lost or cancelled elsewhere, and takes jobs that no node
    /// holds (queued, or left by a node that stopped) while it has room;
    /// until `stop`, then stops its jobs (pages in flight finish within
    /// `JOB_GRACE`) with their state kept and their leases let go.
    pub async fn run(self, stop: CancellationToken) {
        // A SQLite database is this node's alone: what its last run held is
        // its own again (or once its leases end, when the disk refuses the
        // write; the write watch says so). On a shared one, what this
        // node.id held: no process crawls it any more.
        let taken_back = if self.inner.store.is_shared() {
            let node = self.inner.node.clone();
            self.inner.store.release_crawl_leases(node).await
        } else {
            self.inner.store.clear_crawl_leases().await
        };
        if let Err(e) = taken_back {
            if e.write_failure().is_some() {
                tracing::debug!(error = %e, "cannot take back the crawl jobs of the last run");
            } else {
                tracing::error!(error = %e, "cannot take back the crawl jobs of the last run");
            }
        }
        let mut beat = tokio::time::interval(HEARTBEAT);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut purged: Option<Instant> = None;
        loop {
            tokio::select! {
                _ = beat.tick() => {}
                _ = self.inner.wake.notified() => {}
                _ = stop.cancelled() => break,
            }
            self.heartbeat().await;
            self.take_jobs().await;
            if purged.is_none_or(|at| at.elapsed() >= PURGE_EVERY) {
                self.purge().await;
                purged = Some(Instant::now());
            }
        }
        self.inner.shutdown.cancel();
        self.inner.tracker.close();
        self.inner.tracker.wait().await;
    }

    /// Renews the leases of the jobs crawling here; stops those another
    /// node holds now, those whose lease could not be renewed in time, and
    /// those cancelled on another node.
    async fn heartbeat(&self) {
        let ids: Vec<i64> = lock(&self.inner.live).keys().copied().collect();
        let shared = self.inner.store.is_shared();
        for id in ids {
            let renewed = self
                .inner
                .store
                .renew_crawl_job(id, &self.inner.node, now_ms(), LEASE)
                .await;
            let mut live = lock(&self.inner.live);
            let Some(l) = live.get_mut(&id) else { continue };
            match renewed {
                Ok(Some(cancel)) => {
                    l.renewed = Instant::now();
                    if cancel {
                        tracing::info!(job = id, "crawl job cancelled on another node");
                        l.by_user.store(true, Ordering::SeqCst);
                        l.cancel.cancel();
                    }
                }
                Ok(None) => {
                    tracing::warn!(
                        job = id,
                        "another node took this crawl job over; stopping it here"
                    );
                    l.lost.store(true, Ordering::SeqCst);
                    l.cancel.cancel();
                }
                // No other node can take a job on a database that is this
                // node's alone: it goes on while writes fail.
                Err(e) if l.renewed.elapsed() >= LEASE && shared => {
                    tracing::warn!(job = id, error = %e, "crawl job lease lapsed; stopping it here");
                    l.lost.store(true, Ordering::SeqCst);
                    l.cancel.cancel();
                }
                Err(e) if e.write_failure().is_some() => {
                    tracing::debug!(job = id, error = %e, "cannot renew a crawl job's lease")
                }
                Err(e) => tracing::warn!(job = id, error = %e, "cannot renew a crawl job's lease"),
            }
        }
    }

    /// Deletes the ended jobs past `crawls.keep_ended` or older than
    /// `crawls.keep_ended_for`, with their pages' files.
    async fn purge(&self) {
        let l = &self.inner.limits;
        let keep_for = i64::try_from(l.keep_ended_for.as_millis()).unwrap_or(i64::MAX);
        let ended_before = now_ms().saturating_sub(keep_for);
        match self
            .inner
            .store
            .purge_crawl_jobs(l.keep_ended, ended_before)
            .await
        {
            Ok(ids) => {
                for id in &ids {
                    let dir = self.inner.dir.join(id.to_string());
                    if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                        && e.kind() != std::io::ErrorKind::NotFound
                    {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot delete an ended crawl job's pages");
                    }
                }
                if !ids.is_empty() {
                    tracing::info!(
                        jobs = ids.len(),
                        "deleted ended crawl jobs past their keeping"
                    );
                }
            }
            Err(e) if e.write_failure().is_some() => {
                tracing::debug!(error = %e, "cannot delete ended crawl jobs");
            }
            Err(e) => tracing::warn!(error = %e, "cannot delete ended crawl jobs"),
        }
    }

    /// Leases and starts jobs no node holds while fewer than
    /// `crawls.max_running` crawl here.
    async fn take_jobs(&self) {
        let _one = self.inner.taking.lock().await;
        if self.inner.shutdown.is_cancelled() {
            return;
        }
        // While writes fail, a job taken would stop at its first commit
        // after fetching pages again: jobs wait until writes work.
        if self.inner.store.write_trouble().is_some() {
            return;
        }
        let running = lock(&self.inner.live).len();
        let room = self.inner.limits.max_running.max(1).saturating_sub(running);
        if room == 0 {
            return;
        }
        let leased = self
            .inner
            .store
            .lease_crawl_jobs(&self.inner.node, now_ms(), LEASE, room)
            .await;
        let jobs = match leased {
            Ok(jobs) => jobs,
            // The write watch reports a disk that refuses writes, once.
            Err(e) if e.write_failure().is_some() => {
                tracing::debug!(error = %e, "cannot look for crawl jobs to run");
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot look for crawl jobs to run");
                return;
            }
        };
        for rec in jobs {
            let spec = CrawlSpec::from_json(rec.spec.as_bytes())
                .and_then(|s| s.validate(&self.spec_context()));
            match spec {
                Ok(v) => {
                    if rec.state == "running" {
                        tracing::info!(job = rec.id, "continuing a crawl job");
                    }
                    self.spawn(rec.id, v);
                }
                Err(e) => {
                    let _ = self
                        .inner
                        .store
                        .crawl_job_ended(rec.id, "failed", None, Some(e.to_string()))
                        .await;
                }
            }
        }
    }

    /// What a job's options are validated against.
    fn spec_context(&self) -> SpecContext {
        SpecContext::job(&self.inner.limits, self.inner.default_age)
    }

    /// Starts a job from a JSON body; returns its view.
    pub async fn start(&self, body: &[u8]) -> Result<JobView, JobError> {
        if self.inner.shutdown.is_cancelled() {
            return Err(JobError::Stopping);
        }
        let spec = CrawlSpec::from_json(body)?;
        let v = spec.validate(&self.spec_context())?;
        let json = serde_json::to_string(&spec).expect("options serialize");
        let max_queued = self.inner.limits.max_queued;
        let rec = self
            .inner
            .store
            .insert_crawl_job_bounded(json, max_queued)
            .await?
            .ok_or(JobError::QueueFull(max_queued))?;
        // Taken here at once when this node has room (else by the first
        // node, this one included, that has).
        drop(v);
        self.take_jobs().await;
        Ok(self.view(&rec))
    }

    fn spawn(&self, id: i64, v: Validated) {
        let cancel = self.inner.shutdown.child_token();
        let by_user = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(Progress::default());
        let (ended_tx, ended) = watch::channel(false);
        let lost = Arc::new(AtomicBool::new(false));
        lock(&self.inner.live).insert(
            id,
            Live {
                cancel: cancel.clone(),
                by_user: by_user.clone(),
                progress: progress.clone(),
                ended,
                lost: lost.clone(),
                renewed: Instant::now(),
            },
        );
        let jobs = self.clone();
        self.inner.tracker.spawn(async move {
            let end = jobs.run_job(id, v, cancel, by_user, progress, &lost).await;
            if let Some((state, summary, error)) = end
                && !lost.load(Ordering::SeqCst)
                && let Err(e) = jobs
                    .inner
                    .store
                    .crawl_job_ended(id, state, summary, error)
                    .await
            {
                tracing::error!(job = id, error = %e, "cannot record a crawl job's end");
            }
            lock(&jobs.inner.live).remove(&id);
            let _ = ended_tx.send(true);
            // Room for another job.
            jobs.inner.wake.notify_one();
        });
    }

    /// Runs job `id`; how it ended, or `None` when a shutdown stopped it
    /// (it continues at the next start).
    async fn run_job(
        &self,
        id: i64,
        v: Validated,
        cancel: CancellationToken,
        by_user: Arc<AtomicBool>,
        progress: Arc<Progress>,
        lost: &AtomicBool,
    ) -> Option<(&'static str, Option<String>, Option<String>)> {
        let stopped = |by_user: &AtomicBool| {
            by_user
                .load(Ordering::SeqCst)
                .then_some(("cancelled", None, None))
        };
        let permit = tokio::select! {
            p = self.inner.permits.clone().acquire_owned() => p.ok()?,
            _ = cancel.cancelled() => return stopped(&by_user),
        };
        if let Err(e) = self.inner.store.crawl_job_running(id).await {
            tracing::error!(job = id, error = %e, "cannot record a crawl job's start");
        }
        let dir = self.inner.dir.join(id.to_string());
        if let Err(e) = tokio::fs::create_dir_all(&dir).await {
            let error = format!("cannot create {}: {e}", dir.display());
            return Some(("failed", None, Some(error)));
        }
        let pool = match self.inner.pool.client(v.pool) {
            Ok(p) => p,
            Err(e) => return Some(("failed", None, Some(e.to_string()))),
        };
        let opts = CrawlOptions {
            job: Some((self.inner.store.clone(), id)),
            lease: self
                .inner
                .store
                .is_shared()
                .then(|| (self.inner.node.clone(), LEASE)),
            output: Some(dir.join("pages.jsonl")),
            max_frontier: Some(
                v.crawl
                    .max_pages
                    .unwrap_or(u64::MAX)
                    .saturating_mul(super::FRONTIER_PER_PAGE)
                    .min(self.inner.limits.max_frontier),
            ),
            max_new_links: Some(LINKS_PER_PAGE),
            ..v.crawl
        };
        let result = crawl(&pool, opts, cancel, progress).await;
        drop(permit);
        // What earlier runs (before a restart, or on a node that died) did
        // counts too: as their frontier kept it, committed with their
        // pages; else (a frontier of an older version) as they recorded it
        // when they ended.
        let recorded: Option<JobSummary> = match self.inner.store.crawl_job(id).await {
            Ok(Some(rec)) => rec.summary.and_then(|s| serde_json::from_str(&s).ok()),
            _ => None,
        };
        let total = |s: &Summary| {
            let earlier = match &s.earlier {
                Some(counts) => Some(JobSummary::of_counts(counts)),
                None => recorded.clone(),
            };
            let all = JobSummary::of(s).after(earlier.as_ref());
            serde_json::to_string(&all).unwrap_or_default()
        };
        match result {
            // Another node crawls it now and records its end.
            _ if lost.load(Ordering::SeqCst) => None,
            Ok(summary) if summary.interrupted => match stopped(&by_user) {
                Some((state, _, _)) => Some((state, Some(total(&summary)), None)),
                None => {
                    if let Err(e) = self.inner.store.crawl_job_paused(id, total(&summary)).await {
                        tracing::warn!(job = id, error = %e, "cannot keep a crawl job's summary");
                    }
                    // Another node may continue it at once.
                    if let Err(e) = self
                        .inner
                        .store
                        .release_crawl_job(id, &self.inner.node)
                        .await
                    {
                        tracing::warn!(job = id, error = %e, "cannot let go of a crawl job");
                    }
                    None
                }
            },
            Ok(summary) => Some(("finished", Some(total(&summary)), None)),
            // The database went away or refused a write under the crawl:
            // the job is let go, not failed, and taken again (here or on
            // another node) once writes work, from its last commit.
            Err(e) if e.write_failure().is_some() => {
                tracing::warn!(job = id, error = %e, "crawl job stopped: the database cannot be written; it goes on once it can");
                if let Err(e) = self
                    .inner
                    .store
                    .release_crawl_job(id, &self.inner.node)
                    .await
                {
                    // Its lease lapses by itself.
                    tracing::debug!(job = id, error = %e, "cannot let go of a crawl job");
                }
                None
            }
            Err(e) => {
                tracing::warn!(job = id, error = %e, "crawl job failed");
                Some(("failed", None, Some(e.to_string())))
            }
        }
    }

    /// A page of the jobs, newest first: at most `limit` of those older
    /// than job `before`. Their options leave out the lists a client may
    /// make long (`seeds_total` says how many seeds); `GET /crawls/{id}`
    /// shows them whole.
    pub async fn list(
        &self,
        limit: usize,
        before: Option<i64>,
    ) -> Result<Vec<JobView>, StoreError> {
        let recs = self.inner.store.crawl_job_listing(limit, before).await?;
        Ok(recs
            .iter()
            .map(|(r, seeds)| {
                let mut view = self.view(r);
                view.seeds_total = Some(*seeds);
                view
            })
            .collect())
    }

    /// Job `id`'s view, if there is such a job.
    pub async fn get(&self, id: i64) -> Result<Option<JobView>, StoreError> {
        let rec = self.inner.store.crawl_job(id).await?;
        Ok(rec.map(|r| self.view(&r)))
    }

    /// Cancels job `id`, on whichever node crawls it: its pages in flight
    /// finish, then it ends `cancelled`. Returns its view once it ended (or
    /// the grace ran out), `None` when there is no such job.
    pub async fn cancel(&self, id: i64) -> Result<Option<JobView>, StoreError> {
        let ended = {
            let live = lock(&self.inner.live);
            live.get(&id).map(|l| {
                l.by_user.store(true, Ordering::SeqCst);
                l.cancel.cancel();
                l.ended.clone()
            })
        };
        let grace = JOB_GRACE + Duration::from_secs(2);
        if let Some(mut ended) = ended {
            let _ = tokio::time::timeout(grace, ended.wait_for(|e| *e)).await;
            return self.get(id).await;
        }
        if self.inner.store.cancel_crawl_job(id, now_ms()).await? == CancelAsk::Asked {
            // The node crawling it reads the request at its next heartbeat.
            let deadline = Instant::now() + grace + HEARTBEAT;
            while Instant::now() < deadline {
                match self.inner.store.crawl_job(id).await? {
                    Some(r) if matches!(r.state.as_str(), "queued" | "running") => {}
                    _ => break,
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.get(id).await
    }

    /// Job `id`'s page lines after the first `after`: the number of lines
    /// written so far, and a stream of the rest. `None` when there is no
    /// such job.
    pub async fn pages(&self, id: i64, after: u64) -> Result<Option<(u64, PageStream)>, JobError> {
        if self.inner.store.crawl_job(id).await?.is_none() {
            return Ok(None);
        }
        let path = self.inner.dir.join(id.to_string()).join("pages.jsonl");
        let span = tokio::task::spawn_blocking(move || line_span(&path, after).map(|s| (path, s)))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let (path, (start, end, lines)) = match span {
            Ok(s) => s,
            // Nothing written yet.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Some((0, PageStream::empty())));
            }
            Err(e) => return Err(JobError::Io(e)),
        };
        Ok(Some((lines, PageStream::new(path, start, end))))
    }

    fn view(&self, rec: &CrawlJobRecord) -> JobView {
        let options: serde_json::Value =
            serde_json::from_str(&rec.spec).unwrap_or(serde_json::Value::Null);
        let summary: Option<JobSummary> = rec
            .summary
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok());
        let progress = {
            let live = lock(&self.inner.live);
            // While it runs, `summary` is that of the runs before a restart.
            let before = summary.clone().unwrap_or_default();
            // An ended job's summary is all of it, though its task may
            // not have left `live` yet.
            let ended = !matches!(rec.state.as_str(), "queued" | "running");
            match live.get(&rec.id).filter(|_| !ended) {
                Some(l) => {
                    let p = &l.progress;
                    JobProgress {
                        pages: before.pages_ok
                            + before.pages_failed
                            + p.done.load(Ordering::Relaxed),
                        failed: before.pages_failed + p.failed.load(Ordering::Relaxed),
                        queued: p.queued.load(Ordering::Relaxed),
                        in_flight: p.in_flight.load(Ordering::Relaxed),
                    }
                }
                None => JobProgress {
                    pages: before.pages_ok + before.pages_failed,
                    failed: before.pages_failed,
                    queued: before.queued,
                    in_flight: 0,
                },
            }
        };
        JobView {
            id: rec.id,
            state: rec.state.clone(),
            created_at: rfc3339(rec.created_at),
            started_at: rec.started_at.map(rfc3339),
            finished_at: rec.finished_at.map(rfc3339),
            options,
            progress,
            summary,
            error: rec.error.clone(),
            seeds_total: None,
        }
    }
}

/// A job's summary as stored and shown: what its runs did, added up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct JobSummary {
    /// Time crawling, over every run.
    pub elapsed_ms: u64,
    /// True when the last run was stopped before the crawl was done.
    pub interrupted: bool,
    /// Pages fetched.
    pub pages_ok: u64,
    /// Pages that failed.
    pub pages_failed: u64,
    /// Pages fetched by HTTP status.
    pub ok_by_status: BTreeMap<String, u64>,
    /// Pages that failed by reason.
    pub failed_by_reason: BTreeMap<String, u64>,
    /// URLs robots.txt disallowed (the last run's count).
    pub disallowed: u64,
    /// URLs still queued.
    pub queued: u64,
    /// URLs found.
    pub discovered: u64,
    /// Bytes of the pages fetched.
    pub bytes: u64,
    /// New links not stored because the job's frontier was full.
    pub frontier_full: u64,
    /// New links past the number a job keeps per page.
    pub links_cut: u64,
    /// The last run's latency percentiles.
    pub latency_ms: LatencyMs,
    /// What the pool saw in the last run.
    #[schema(value_type = Object)]
    pub pool: serde_json::Value,
}

/// Latency percentiles in ms, when there were pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct LatencyMs {
    /// The median.
    pub p50: Option<u64>,
    /// The 90th percentile.
    pub p90: Option<u64>,
    /// The 99th percentile.
    pub p99: Option<u64>,
}

impl JobSummary {
    /// One run's summary.
    pub fn of(s: &Summary) -> JobSummary {
        let ms = |p: f64| s.latency.percentile(p).map(|d| d.as_millis() as u64);
        JobSummary {
            elapsed_ms: s.elapsed.as_millis() as u64,
            interrupted: s.interrupted,
            pages_ok: s.ok(),
            pages_failed: s.failed(),
            ok_by_status: s
                .ok_by_status
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            failed_by_reason: s.failed_by_reason.clone(),
            disallowed: s.disallowed,
            queued: s.queued,
            discovered: s.discovered,
            bytes: s.bytes,
            frontier_full: s.frontier_full,
            links_cut: s.links_cut,
            latency_ms: LatencyMs {
                p50: ms(50.0),
                p90: ms(90.0),
                p99: ms(99.0),
            },
            pool: serde_json::to_value(&s.pool).unwrap_or_default(),
        }
    }

    /// What runs counted, as their frontier kept it.
    fn of_counts(c: &super::summary::RunCounts) -> JobSummary {
        JobSummary {
            elapsed_ms: c.elapsed_ms,
            pages_ok: c.ok_by_status.values().sum(),
            pages_failed: c.failed_by_reason.values().sum(),
            ok_by_status: c
                .ok_by_status
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            failed_by_reason: c.failed_by_reason.clone(),
            bytes: c.bytes,
            frontier_full: c.frontier_full,
            links_cut: c.links_cut,
            ..JobSummary::default()
        }
    }

    /// This run's summary after `earlier` (the runs before a restart):
    /// counts add up; what describes the frontier (queued, discovered,
    /// disallowed), latencies and the pool are this run's.
    fn after(mut self, earlier: Option<&JobSummary>) -> JobSummary {
        let Some(e) = earlier else {
            return self;
        };
        self.elapsed_ms += e.elapsed_ms;
        self.pages_ok += e.pages_ok;
        self.pages_failed += e.pages_failed;
        self.bytes += e.bytes;
        self.frontier_full += e.frontier_full;
        self.links_cut += e.links_cut;
        for (map, before) in [
            (&mut self.ok_by_status, &e.ok_by_status),
            (&mut self.failed_by_reason, &e.failed_by_reason),
        ] {
            for (k, v) in before {
                *map.entry(k.clone()).or_default() += v;
            }
        }
        self
    }
}

/// A job's pages so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct JobProgress {
    /// Pages done, fetched or failed.
    pub pages: u64,
    /// Of those, failed.
    pub failed: u64,
    /// URLs queued.
    pub queued: u64,
    /// Pages being fetched.
    pub in_flight: u64,
}

/// A crawl job as the API shows it.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
#[schema(as = CrawlJob)]
pub struct JobView {
    /// Its id.
    pub id: i64,
    /// `queued`, `running`, `finished`, `cancelled` or `failed`.
    pub state: String,
    /// When it was asked for (RFC 3339).
    pub created_at: String,
    /// When it (last) started.
    pub started_at: Option<String>,
    /// When it ended.
    pub finished_at: Option<String>,
    /// Its options, as posted (a listing leaves out the long lists).
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    /// Pages done and failed, queued and in flight.
    pub progress: JobProgress,
    /// Its summary once it ended (while it runs, that of the runs before a
    /// restart).
    pub summary: Option<JobSummary>,
    /// Why it failed.
    pub error: Option<String>,
    /// In a listing: how many seeds it has.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seeds_total: Option<i64>,
}

/// The byte offset of line `after` (0-based) of `path`, the end of its
/// last whole line, and how many whole lines it has.
fn line_span(path: &Path, after: u64) -> std::io::Result<(u64, u64, u64)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut buf = vec![0u8; CHUNK];
    let (mut pos, mut lines, mut start, mut end) = (0u64, 0u64, None, 0u64);
    if after == 0 {
        start = Some(0);
    }
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        for i in memchr::memchr_iter(b'\n', &buf[..n]) {
            lines += 1;
            end = pos + i as u64 + 1;
            if lines == after {
                start = Some(end);
            }
        }
        pos += n as u64;
    }
    let start = start.unwrap_or(end).min(end);
    Ok((start, end, lines))
}

/// Bytes `start..end` of a job's pages file, read in chunks as the client
/// takes them.
pub struct PageStream {
    path: Option<PathBuf>,
    start: u64,
    end: u64,
}

impl PageStream {
    fn new(path: PathBuf, start: u64, end: u64) -> PageStream {
        PageStream {
            path: Some(path),
            start,
            end,
        }
    }

    fn empty() -> PageStream {
        PageStream {
            path: None,
            start: 0,
            end: 0,
        }
    }

    /// The chunks, as a stream for a response body.
    pub fn into_stream(
        self,
    ) -> impl futures::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let state = (self, None::<tokio::fs::File>);
        futures::stream::try_unfold(state, |(s, file)| async move {
            let Some(path) = &s.path else {
                return Ok(None);
            };
            if s.start >= s.end {
                return Ok(None);
            }
            let mut file = match file {
                Some(f) => f,
                None => {
                    let mut f = tokio::fs::File::open(path).await?;
                    f.seek(std::io::SeekFrom::Start(s.start)).await?;
                    f
                }
            };
            let want = (s.end - s.start).min(CHUNK as u64) as usize;
            let mut buf = vec![0u8; want];
            let n = file.read(&mut buf).await?;
            if n == 0 {
                return Ok(None);
            }
            buf.truncate(n);
            let next = PageStream {
                path: s.path.clone(),
                start: s.start + n as u64,
                end: s.end,
            };
            Ok(Some((Bytes::from(buf), (next, Some(file)))))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_of_runs_add_up() {
        // As stored by an earlier version: missing fields read as zero.
        let earlier: JobSummary = serde_json::from_value(serde_json::json!({
            "pages_ok": 5, "pages_failed": 1, "bytes": 100, "elapsed_ms": 10,
            "ok_by_status": {"200": 5}, "failed_by_reason": {"http_404": 1}, "queued": 30,
        }))
        .unwrap();
        let now: JobSummary = serde_json::from_value(serde_json::json!({
            "pages_ok": 7, "pages_failed": 0, "bytes": 50, "elapsed_ms": 20,
            "ok_by_status": {"200": 6, "301": 1}, "failed_by_reason": {}, "queued": 0,
        }))
        .unwrap();
        let all = serde_json::to_value(now.after(Some(&earlier))).unwrap();
        assert_eq!(all["pages_ok"], 12);
        assert_eq!(all["pages_failed"], 1);
        assert_eq!(all["bytes"], 150);
        assert_eq!(all["elapsed_ms"], 30);
        assert_eq!(
            all["ok_by_status"],
            serde_json::json!({"200": 11, "301": 1})
        );
        assert_eq!(all["failed_by_reason"], serde_json::json!({"http_404": 1}));
        assert_eq!(all["queued"], 0, "the frontier as it is now");
    }

    #[test]
    fn line_spans_skip_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        std::fs::write(&path, "a\nbb\nccc\npartial").unwrap();
        assert_eq!(line_span(&path, 0).unwrap(), (0, 9, 3));
        assert_eq!(line_span(&path, 1).unwrap(), (2, 9, 3));
        assert_eq!(line_span(&path, 3).unwrap(), (9, 9, 3));
        assert_eq!(line_span(&path, 7).unwrap(), (9, 9, 3));
    }
}
