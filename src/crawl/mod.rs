//! The polite crawler on the pool: breadth-first from seed URLs within a
//! scope, de-duplicated on normalised URLs, robots.txt obeyed (fetched
//! through the pool), per-host delay and concurrency whichever proxy
//! carries a request, a frontier in the store that resumes after a crash, and
//! one JSON line per page. The crawl's loop (frontier and output writes)
//! runs on a blocking thread of its own and pages are parsed on the
//! blocking pool, so a crawl never holds up the async workers.

pub mod extract;
pub mod frontier;
pub mod jobs;
pub mod nodes;
pub mod output;
pub mod polite;
pub mod robots;
pub mod spec;
pub mod summary;
pub mod url;

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use regex::Regex;
use sha2::Digest;
use texting_robots::Robot;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

pub use self::url::{Scope, normalize};
use crate::health::ProxyQuery;
use crate::lock;
pub use crate::model::ScopeKind;
use crate::pool::{FetchError, Page, Pool, RedirectRule, Request, site_of};
pub use extract::Select;
use frontier::{Frontier, FrontierError, NewUrl, Queued, UrlState};
use output::Sink;
pub use polite::Politeness;
use robots::{RobotsCache, Rules};
pub use summary::Summary;

/// What to crawl and how.
#[derive(Clone, Debug)]
pub struct CrawlOptions {
    /// Where to start (may be empty when resuming from `state`).
    pub seeds: Vec<::url::Url>,
    /// Links followed from a seed; `None` for no limit.
    pub max_depth: Option<u32>,
    /// Pages fetched (this run and the runs it resumes); `None` for no limit.
    pub max_pages: Option<u64>,
    /// Which hosts.
    pub scope: ScopeKind,
    /// URLs must match one of these, when any are given.
    pub include: Vec<Regex>,
    /// URLs must match none of these.
    pub exclude: Vec<Regex>,
    /// Query parameters dropped besides `utm_*` and [`url::DEFAULT_STRIP`].
    pub strip_params: Vec<String>,
    /// Pages in flight.
    pub concurrency: usize,
    /// Pages in flight per host.
    pub per_host_concurrency: usize,
    /// Least time between request starts to one host.
    pub delay: Duration,
    /// Skip robots.txt (explicit only).
    pub ignore_robots: bool,
    /// How long a host that gave no answer waits before the next try
    /// (doubled each time; three tries): its robots.txt could not be
    /// fetched, or a page timed out on two proxies in a row.
    pub robots_retry: Duration,
    /// Pages to this file, failed ones also to `failed.jsonl` beside it;
    /// stdout when `None`.
    pub output: Option<PathBuf>,
    /// Bodies stored here by SHA-256.
    pub bodies: Option<PathBuf>,
    /// Fields to extract.
    pub selects: Vec<Select>,
    /// Every match of each select, not only the first.
    pub select_all: bool,
    /// The crawl state file; a temporary one when `None`.
    pub state: Option<PathBuf>,
    /// A daemon job: its frontier lives in this store under the job's id,
    /// and `state` is not used.
    pub job: Option<(crate::store::Store, i64)>,
    /// A job on a database several nodes share: the node crawling it and
    /// how long its page leases last (its heartbeat renews them). Pages
    /// are leased to the node and hosts paced through the store too.
    pub lease: Option<(String, Duration)>,
    /// Put the pages that failed for good back in the queue.
    pub retry_failed: bool,
    /// After Ctrl-C, how long the pages in flight may take to finish.
    pub grace: Duration,
    /// Hosts with work held in memory at once; the others wait in the
    /// frontier and are taken in as these run out of work.
    pub max_hosts: usize,
    /// URLs the frontier holds at most (fetched ones included); links
    /// found beyond it are counted as `frontier_full`, not stored. `None`:
    /// [`FRONTIER_PER_PAGE`] times `max_pages`, or no bound without it.
    pub max_frontier: Option<u64>,
    /// New links kept per page at most; the rest are counted as
    /// `links_cut`. `None`: every link (up to the 10,000 read per page).
    pub max_new_links: Option<usize>,
}

impl Default for CrawlOptions {
    fn default() -> CrawlOptions {
        CrawlOptions {
            seeds: Vec::new(),
            max_depth: None,
            max_pages: None,
            scope: ScopeKind::SameHost,
            include: Vec::new(),
            exclude: Vec::new(),
            strip_params: Vec::new(),
            concurrency: 16,
            per_host_concurrency: 2,
            delay: Duration::ZERO,
            ignore_robots: false,
            robots_retry: Duration::from_secs(30),
            output: None,
            bodies: None,
            selects: Vec::new(),
            select_all: false,
            state: None,
            job: None,
            lease: None,
            retry_failed: false,
            grace: Duration::from_secs(30),
            max_hosts: MAX_HOSTS,
            max_frontier: None,
            max_new_links: None,
        }
    }
}

/// Why a crawl could not run.
#[derive(Debug, thiserror::Error)]
pub enum CrawlError {
    /// The crawl state failed.
    #[error(transparent)]
    State(#[from] FrontierError),
    /// The crawl state failed while the crawl ran.
    #[error("crawl state: {0}")]
    Store(#[from] crate::store::StoreError),
    /// An output could not be written.
    #[error("cannot write {what}: {source}")]
    Output {
        /// Which output.
        what: String,
        /// What went wrong.
        source: std::io::Error,
    },
    /// No seed and nothing waiting in the state.
    #[error("nothing to crawl: give a URL (or a --state file with URLs waiting)")]
    NothingToCrawl,
    /// A request found no proxy, and none matches the pool's filters: no
    /// page could ever be fetched. What was not fetched stays queued.
    #[error("no proxy matches the crawl's filters: {0}")]
    NoProxy(String),
    /// The runtime shut down under the crawl; what was committed stays.
    #[error("the crawl was stopped by a shutdown")]
    RuntimeGone,
}

impl CrawlError {
    /// Set when the store holding the crawl's state refused a write or
    /// could not be reached (a full disk, a database server away): no
    /// fault of the crawl's, which can go on from its last commit once
    /// writes work again.
    pub fn write_failure(&self) -> Option<crate::store::WriteFailure> {
        match self {
            CrawlError::State(FrontierError::Store { source, .. }) | CrawlError::Store(source) => {
                source.write_failure()
            }
            _ => None,
        }
    }
}

/// Live counters for a progress display.
#[derive(Debug, Default)]
pub struct Progress {
    /// Pages written (ok or failed).
    pub done: AtomicU64,
    /// Of those, failed.
    pub failed: AtomicU64,
    /// URLs known and not yet fetched.
    pub queued: AtomicU64,
    /// Pages in flight.
    pub in_flight: AtomicU64,
}

/// URLs buffered in memory across all host queues; the rest wait in the
/// frontier file.
const MAX_BUFFERED: usize = 50_000;
/// Hosts with work held in memory at once, by default.
pub const MAX_HOSTS: usize = 10_000;
/// A crawl with a page limit keeps at most this many URLs per page it may
/// fetch in its frontier, unless told otherwise: enough to choose from,
/// and a site of endless links (a calendar, a faceted search) cannot fill
/// the disk.
pub const FRONTIER_PER_PAGE: u64 = 10;
/// Loaded from the frontier per host at a time.
const HOST_BATCH: usize = 256;
/// Hashes of recently seen links kept to spare the frontier most
/// duplicate inserts; cleared when full.
const SEEN_CACHE: usize = 200_000;
/// Tries at a host's robots.txt before its pages fail.
const ROBOTS_TRIES: u32 = 3;
/// The longest a page may take to parse (the parser also stops at its
/// nesting cap): links and fields read until then are kept. A flat 10 MiB
/// page parses in about a second.
const PARSE_TIME: Duration = Duration::from_secs(10);
/// Pages up to this size are hashed and parsed on the crawl's own thread
/// as they land (tens of microseconds for most pages): no hop to the
/// blocking pool and back. Larger ones are parsed on the blocking pool, so
/// that one slow page never holds up the crawl's loop.
const PARSE_HERE: usize = 64 * 1024;
/// URLs that need no request settled in one look for work, so that a
/// frontier of disallowed links is worked through in committed batches
/// between looks at the pages that finished.
const SETTLE_PER_TURN: usize = 256;

/// What the crawler knows of a host's robots.txt.
enum RobotsState {
    Unknown,
    /// Being fetched, after this many failed tries.
    Pending(u32),
    /// `None`: everything allowed.
    Ready(Option<Arc<Robot>>),
    Retry {
        at: Instant,
        tries: u32,
    },
    Unavailable,
}

struct HostQueue {
    buf: VecDeque<Queued>,
    /// More waiting rows in the frontier than in `buf`.
    more: bool,
    last_id: i64,
    in_flight: usize,
    robots: RobotsState,
    /// Pages in a row that timed out on two proxies each: the site is slow
    /// or silent, and backs off instead of costing more proxies.
    silent: u32,
}

impl HostQueue {
    fn new(more: bool, robots: RobotsState) -> HostQueue {
        HostQueue {
            buf: VecDeque::new(),
            more,
            last_id: 0,
            in_flight: 0,
            silent: 0,
            robots,
        }
    }
}

/// A fetched page, digested in its task.
struct Fetched {
    page: Page,
    sha256: String,
    title: Option<String>,
    links: Vec<::url::Url>,
    fields: std::collections::BTreeMap<String, serde_json::Value>,
    /// Why parsing stopped before the end of the page, if it did.
    parse_stopped: Option<crate::html::HtmlError>,
}

enum Job {
    Page(Queued),
    Robots(String, ::url::Url),
}

/// A page as its task hands it over: digested there, or small enough to be
/// digested on the crawl's thread ([`PARSE_HERE`]).
enum Landed {
    Digested(Fetched),
    Raw(Page),
}

enum Done {
    Page(Queued, Box<Result<Landed, FetchError>>, Duration),
    Robots(String, RobotsOutcome),
}

enum RobotsOutcome {
    Parsed(Robot),
    AllowAll,
    /// Why not.
    Unavailable(String),
    /// No proxy could carry the request: says nothing of the site.
    NoProxy(FetchError),
}

/// Runs a crawl on `pool` until the frontier is empty, a limit is reached
/// or `cancel` fires (then the pages in flight finish within the grace
/// time). Returns the summary.
///
/// The crawl's own loop writes its state (SQLite) and outputs (files,
/// stdout) synchronously, so it runs on a blocking thread of its own; the
/// fetches it starts run on the runtime, and pages are parsed on the
/// blocking pool. Dropping the returned future stops the crawl at once,
/// as a second Ctrl-C does: what was committed stays.
pub async fn crawl(
    pool: &Pool,
    opts: CrawlOptions,
    cancel: CancellationToken,
    progress: Arc<Progress>,
) -> Result<Summary, CrawlError> {
    let handle = tokio::runtime::Handle::current();
    let pool = pool.clone();
    let dropped = CancellationToken::new();
    let _stop_when_dropped = dropped.clone().drop_guard();
    let task = tokio::task::spawn_blocking(move || {
        handle.block_on(crawl_here(&pool, opts, cancel, dropped, progress))
    });
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(CrawlError::RuntimeGone),
    }
}

/// [`crawl`] on the thread it is called on (one that may block); `dropped`
/// ends it at once.
async fn crawl_here(
    pool: &Pool,
    opts: CrawlOptions,
    cancel: CancellationToken,
    dropped: CancellationToken,
    progress: Arc<Progress>,
) -> Result<Summary, CrawlError> {
    let started = Instant::now();
    let mut frontier = match &opts.job {
        Some((store, id)) => Frontier::of_job(store, *id)?,
        None => Frontier::open(opts.state.as_deref())?,
    };
    let polite = Arc::new(Politeness::new(opts.delay));
    let mut pacer: Arc<dyn crate::pool::Pacer> = polite.clone();
    if let (Some((store, id)), Some((node, ttl))) = (&opts.job, &opts.lease) {
        frontier.lease_pages(node, *ttl);
        pacer = Arc::new(nodes::SharedPacer::new(polite.clone(), store.clone(), *id));
    }
    if opts.retry_failed {
        let n = frontier.requeue_failed()?;
        tracing::info!(requeued = n, "re-queued failed pages");
    }
    let resumed = frontier.meta("started")?.is_some();
    let earlier = summary::start_run(&mut frontier, resumed)?;
    let (out_len, failed_len) = if resumed {
        let len = |k: &str| -> Result<Option<u64>, CrawlError> {
            Ok(frontier.meta(k)?.and_then(|v| v.parse().ok()))
        };
        (len(output::OUT_LEN)?, len(output::FAILED_LEN)?)
    } else {
        (None, None)
    };
    let mut sink = Sink::open(opts.output.as_deref(), out_len, failed_len).map_err(|source| {
        CrawlError::Output {
            what: opts
                .output
                .as_ref()
                .map_or("stdout".into(), |p| p.display().to_string()),
            source,
        }
    })?;
    if !resumed {
        frontier.set_meta("started", &crate::store::now_ms().to_string())?;
    }
    let seeds: Vec<NewUrl> = opts
        .seeds
        .iter()
        .filter_map(|u| normalize(u, &opts.strip_params))
        .map(|u| NewUrl {
            host: site_of(&u),
            url: u.to_string(),
            depth: 0,
            parent: None,
        })
        .collect();
    frontier.add(&seeds)?;
    let mut seed_urls: Vec<::url::Url> = opts.seeds.clone();
    if let Some(stored) = frontier.meta("seeds")? {
        seed_urls.extend(stored.lines().filter_map(|l| ::url::Url::parse(l).ok()));
    }
    let joined: Vec<String> = seed_urls.iter().map(|u| u.to_string()).collect();
    frontier.set_meta("seeds", &joined.join("\n"))?;
    if frontier.hosts_with_work_after("", 1)?.is_empty() && seed_urls.is_empty() {
        return Err(CrawlError::NothingToCrawl);
    }
    let scope = Scope::new(
        opts.scope,
        &seed_urls,
        opts.include.clone(),
        opts.exclude.clone(),
    );
    let taken = frontier.count(UrlState::Done)? + frontier.count(UrlState::Failed)?;
    let known = frontier.total()?;
    let max_frontier = opts
        .max_frontier
        .or_else(|| opts.max_pages.map(|m| m.saturating_mul(FRONTIER_PER_PAGE)));
    let mut c = Crawler {
        pool: pool.clone(),
        polite,
        pacer,
        robots: RobotsCache::default(),
        scope: Arc::new(scope),
        agent: robots_agent(&pool.options().user_agent),
        hosts: HashMap::new(),
        hosts_left: true,
        host_cursor: String::new(),
        order: VecDeque::new(),
        buffered: 0,
        seen: Arc::new(Mutex::new(seeds.iter().map(|s| hash(&s.url)).collect())),
        redirected: HashSet::new(),
        taken,
        known,
        max_frontier,
        no_proxy: None,
        summary: Summary {
            earlier,
            ..Summary::default()
        },
        started,
        progress,
        frontier,
        selects: opts.selects.clone().into(),
        opts,
    };
    c.take_in_hosts()?;
    c.summary.disallowed = c.frontier.count(UrlState::Disallowed)?;
    c.progress
        .queued
        .store(c.frontier.count(UrlState::Queued)?, Ordering::Relaxed);
    c.run(&mut sink, cancel, dropped).await?;
    c.summary.elapsed = started.elapsed();
    c.summary.queued = c.frontier.count(UrlState::Queued)?;
    c.summary.discovered = c.frontier.total()?;
    c.summary.pool = pool.stats();
    Ok(c.summary)
}

struct Crawler {
    pool: Pool,
    polite: Arc<Politeness>,
    /// What paces the requests: `polite`, and the store's turns for a job
    /// several nodes may crawl.
    pacer: Arc<dyn crate::pool::Pacer>,
    /// The robots.txt rules read, bounded in hosts and age.
    robots: RobotsCache,
    scope: Arc<Scope>,
    agent: String,
    hosts: HashMap<String, HostQueue>,
    /// The frontier may hold work of hosts not in `hosts` (it was full).
    hosts_left: bool,
    /// The last host taken in from the frontier, by name: the next are
    /// looked for after it.
    host_cursor: String,
    /// Hosts with work, in turn.
    order: VecDeque<String>,
    buffered: usize,
    /// Recently seen URLs (hashes): links skip the frontier insert, and a
    /// redirect to a URL the crawl knows is not followed (it is, or will
    /// be, fetched on its own).
    seen: Arc<Mutex<HashSet<u64>>>,
    /// URLs reached through a redirect: done without a fetch of their own.
    redirected: HashSet<String>,
    /// Pages handed out, this run and before.
    taken: u64,
    /// URLs in the frontier (as far as this crawl added them).
    known: u64,
    /// URLs the frontier may hold.
    max_frontier: Option<u64>,
    /// Set when a request found no proxy and none matches the filters:
    /// the crawl ends with this.
    no_proxy: Option<String>,
    summary: Summary,
    /// When this run started.
    started: Instant,
    progress: Arc<Progress>,
    frontier: Frontier,
    /// `opts.selects`, shared with the tasks that parse large pages.
    selects: Arc<[Select]>,
    opts: CrawlOptions,
}

impl Crawler {
    async fn run(
        &mut self,
        sink: &mut Sink,
        cancel: CancellationToken,
        dropped: CancellationToken,
    ) -> Result<(), CrawlError> {
        let mut running: JoinSet<Done> = JoinSet::new();
        let mut stop_at: Option<Instant> = None;
        loop {
            let mut wake: Option<Instant> = None;
            if stop_at.is_none() {
                while running.len() < self.opts.concurrency {
                    let (job, next) = self.next_job(sink)?;
                    wake = next;
                    let Some(job) = job else { break };
                    self.spawn(&mut running, job);
                }
            }
            self.progress
                .in_flight
                .store(running.len() as u64, Ordering::Relaxed);
            // One commit for what this turn of the loop finished.
            self.commit(sink)?;
            if running.is_empty() && (stop_at.is_some() || wake.is_none()) {
                match self.held_elsewhere(stop_at.is_some())? {
                    // Pages another node leased before this one took the
                    // job over (it may still be finishing its last turn):
                    // not done until they end or their leases do.
                    Some(at) => wake = Some(at),
                    None => return Ok(()),
                }
            }
            tokio::select! {
                done = running.join_next(), if !running.is_empty() => {
                    let mut done = done;
                    // Everything else already finished joins the batch.
                    while let Some(d) = done {
                        match d {
                            Ok(d) => self.handle(d, sink)?,
                            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                            Err(_) => {}
                        }
                        done = running.try_join_next();
                    }
                    if let Some(why) = self.no_proxy.take() {
                        // The pages still in flight wait for proxies that
                        // do not exist; they stay queued for a later run.
                        running.abort_all();
                        self.commit(sink)?;
                        return Err(CrawlError::NoProxy(why));
                    }
                }
                _ = sleep_until(wake), if wake.is_some() && stop_at.is_none() => {}
                _ = cancel.cancelled(), if stop_at.is_none() => {
                    stop_at = Some(Instant::now() + self.opts.grace);
                    self.summary.interrupted = true;
                }
                _ = dropped.cancelled() => {
                    // No one waits for the end any more: stop now, as a
                    // second Ctrl-C does.
                    running.abort_all();
                    self.summary.interrupted = true;
                    return self.commit(sink);
                }
                _ = sleep_until(stop_at), if stop_at.is_some() => {
                    // Out of grace: what is still in flight stays queued in
                    // the frontier and is fetched by the next run.
                    running.abort_all();
                    return self.commit(sink);
                }
            }
        }
    }

    /// When queued pages are leased to another node and this crawl would
    /// otherwise end (not stopping, no page limit reached): when to look
    /// again, with the frontier's hosts to be read afresh then.
    fn held_elsewhere(&mut self, stopping: bool) -> Result<Option<Instant>, CrawlError> {
        if stopping || self.opts.max_pages.is_some_and(|m| self.taken >= m) {
            return Ok(None);
        }
        let Some(until) = self.frontier.held_elsewhere()? else {
            return Ok(None);
        };
        self.hosts_left = true;
        self.host_cursor.clear();
        let left = u64::try_from(until.saturating_sub(crate::store::now_ms())).unwrap_or(0);
        // Looked at again at least once a second: the other node may end
        // its pages before their leases do.
        let wait = Duration::from_millis(left.clamp(10, 1_000));
        Ok(Some(Instant::now() + wait))
    }

    fn spawn(&mut self, running: &mut JoinSet<Done>, job: Job) {
        let pool = self.pool.clone();
        let polite = self.pacer.clone();
        match job {
            Job::Robots(host, url) => {
                let agent = self.agent.clone();
                running.spawn(async move {
                    let req = Request::new(url).map(|r| r.pacer(polite));
                    let outcome = match req {
                        Ok(req) => robots_outcome(pool.fetch(req).await, &agent),
                        Err(_) => RobotsOutcome::AllowAll,
                    };
                    Done::Robots(host, outcome)
                });
            }
            Job::Page(q) => {
                self.taken += 1;
                self.unqueue();
                let follow = self.follow_rule(&q.host);
                let selects = self.selects.clone();
                let all = self.opts.select_all;
                let bodies = self.opts.bodies.clone();
                running.spawn(async move {
                    let t0 = Instant::now();
                    let result = match ::url::Url::parse(&q.url)
                        .map_err(|e| FetchError::InvalidUrl {
                            url: q.url.clone(),
                            why: e.to_string(),
                        })
                        .and_then(Request::new)
                    {
                        Ok(req) => pool.fetch(req.pacer(polite).follow(follow)).await,
                        Err(e) => Err(e),
                    };
                    let result = match result {
                        // Stored bodies are written from here, off the
                        // crawl's thread.
                        Ok(page) if page.body().len() <= PARSE_HERE && bodies.is_none() => {
                            Ok(Landed::Raw(page))
                        }
                        Ok(page) => Ok(Landed::Digested(
                            digest(page, selects, all, bodies.as_deref()).await,
                        )),
                        Err(e) => Err(e),
                    };
                    Done::Page(q, Box::new(result), t0.elapsed())
                });
            }
        }
    }

    /// Redirects are followed within the host (so its politeness and
    /// robots.txt hold), in scope and allowed; others end the page, and
    /// the target is queued as a link. One rule per page: a hop it agreed
    /// to is agreed to again when the page is tried on another proxy, so a
    /// proxied page follows the chain a direct one does.
    fn follow_rule(&self, host: &str) -> RedirectRule {
        let scope = self.scope.clone();
        // Redirects stay on the page's host: its rules are the ones.
        let robots: Option<Rules> = self.hosts.get(host).and_then(|h| match &h.robots {
            RobotsState::Ready(r) => Some(r.clone()),
            _ => None,
        });
        let strip = self.opts.strip_params.clone();
        let ignore = self.opts.ignore_robots;
        let seen = self.seen.clone();
        // At most the redirects of each attempt.
        let agreed: Mutex<HashSet<String>> = Mutex::default();
        Arc::new(move |from, to| {
            let Some(to) = normalize(to, &strip) else {
                return false;
            };
            if site_of(from) != site_of(&to) || !scope.allows(&to) {
                return false;
            }
            let allowed = ignore
                || robots
                    .as_ref()
                    .is_some_and(|r| r.as_ref().is_none_or(|r| r.allowed(to.as_str())));
            if lock(&agreed).contains(to.as_str()) {
                return true;
            }
            let follow = allowed && first_sight(&seen, to.as_str());
            if follow {
                lock(&agreed).insert(to.to_string());
            }
            follow
        })
    }

    /// The next job of a ready host; otherwise when a host waiting for its
    /// turn may be ready, or `None` when only pages in flight can bring
    /// more work (their end wakes the crawl) or nothing is left.
    ///
    /// URLs that need no request (disallowed, reached through a redirect,
    /// failed with their robots.txt) are settled on the spot and the same
    /// host looked at again, up to [`SETTLE_PER_TURN`] of them: beyond
    /// that it asks to be called again at once, after a commit.
    fn next_job(&mut self, sink: &mut Sink) -> Result<(Option<Job>, Option<Instant>), CrawlError> {
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        let limit_reached = self.opts.max_pages.is_some_and(|m| self.taken >= m);
        if self.hosts_left && self.hosts.len() <= self.opts.max_hosts * 9 / 10 {
            self.take_in_hosts()?;
        }
        // Hosts to look at in this pass; a host put back at the front to
        // be looked at again counts once more.
        let mut left = self.order.len();
        let mut settled = 0;
        while left > 0 {
            left -= 1;
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some(h) = self.hosts.get_mut(&key) else {
                continue;
            };
            if h.buf.is_empty() && h.more {
                let batch = self.frontier.waiting(&key, h.last_id, HOST_BATCH)?;
                h.more = batch.len() == HOST_BATCH;
                if let Some(last) = batch.last() {
                    h.last_id = last.id;
                }
                self.buffered += batch.len();
                h.buf.extend(batch);
            }
            if h.buf.is_empty() {
                // Nothing left here; a host whose robots.txt is in flight
                // stays until it lands.
                if matches!(h.robots, RobotsState::Pending(_)) || h.in_flight > 0 {
                    self.order.push_back(key);
                } else {
                    self.hosts.remove(&key);
                }
                continue;
            }
            if limit_reached {
                self.order.push_back(key);
                continue;
            }
            if !self.opts.ignore_robots
                && matches!(h.robots, RobotsState::Ready(_))
                && self.robots.get(&key).is_none()
            {
                // Its rules are a day old (or were crowded out): read again.
                h.robots = RobotsState::Unknown;
            }
            match h.robots {
                RobotsState::Unknown => {
                    h.robots = RobotsState::Pending(0);
                    h.in_flight += 1;
                    let first = ::url::Url::parse(&h.buf[0].url).ok();
                    let robots = first.and_then(|u| u.join("/robots.txt").ok());
                    match robots {
                        Some(url) => {
                            self.order.push_back(key.clone());
                            return Ok((Some(Job::Robots(key, url)), None));
                        }
                        None => {
                            h.in_flight -= 1;
                            h.robots = RobotsState::Ready(None);
                            self.robots.insert(&key, None);
                            self.order.push_front(key);
                            left += 1;
                            continue;
                        }
                    }
                }
                RobotsState::Pending(_) => {
                    self.order.push_back(key);
                    continue;
                }
                RobotsState::Retry { at, tries } if at <= now => {
                    h.robots = RobotsState::Pending(tries);
                    h.in_flight += 1;
                    let url = ::url::Url::parse(&h.buf[0].url)
                        .ok()
                        .and_then(|u| u.join("/robots.txt").ok());
                    if let Some(url) = url {
                        self.order.push_back(key.clone());
                        return Ok((Some(Job::Robots(key, url)), None));
                    }
                    h.in_flight -= 1;
                    h.robots = RobotsState::Ready(None);
                    self.robots.insert(&key, None);
                    self.order.push_front(key);
                    left += 1;
                    continue;
                }
                RobotsState::Retry { at, .. } => {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                    self.order.push_back(key);
                    continue;
                }
                RobotsState::Ready(_) | RobotsState::Unavailable => {}
            }
            if h.in_flight >= self.opts.per_host_concurrency {
                self.order.push_back(key);
                continue;
            }
            // A host no request has started to yet (robots.txt ignored)
            // is ready: it has no turn to wait for.
            if let Some(ready) = self.polite.ready_at(&key)
                && ready > now
            {
                wake = Some(wake.map_or(ready, |w| w.min(ready)));
                self.order.push_back(key);
                continue;
            }
            let q = h.buf.pop_front().expect("not empty");
            self.buffered -= 1;
            enum Verdict {
                Fetch,
                Redirected,
                Unavailable,
                Disallowed,
            }
            let verdict = match &h.robots {
                _ if self.redirected.remove(&q.url) => Verdict::Redirected,
                RobotsState::Unavailable => Verdict::Unavailable,
                RobotsState::Ready(Some(robot)) if !robot.allowed(&q.url) => Verdict::Disallowed,
                _ => Verdict::Fetch,
            };
            if let Verdict::Fetch = verdict {
                h.in_flight += 1;
                self.order.push_back(key);
                return Ok((Some(Job::Page(q)), None));
            }
            match verdict {
                Verdict::Fetch | Verdict::Redirected => {}
                Verdict::Unavailable => {
                    self.unqueue();
                    let line = failed_line(
                        &q,
                        "robots_unavailable",
                        "robots.txt could not be fetched",
                        0,
                        None,
                    );
                    self.write(sink, &q, line, UrlState::Failed, 0, &[])?;
                    *self
                        .summary
                        .failed_by_reason
                        .entry("robots_unavailable".into())
                        .or_default() += 1;
                }
                Verdict::Disallowed => {
                    self.unqueue();
                    self.frontier.finish(q.id, UrlState::Disallowed, 0, &[])?;
                    self.summary.disallowed += 1;
                }
            }
            settled += 1;
            if settled >= SETTLE_PER_TURN {
                self.order.push_front(key);
                return Ok((None, Some(now)));
            }
            // The host's next URL may be ready too: look at it again now,
            // not a pass later.
            self.order.push_front(key);
            left += 1;
        }
        // Hosts still in `order` wait for a time (`wake`) or for their
        // pages or robots.txt in flight, whose end runs the next pass.
        if limit_reached {
            return Ok((None, None));
        }
        Ok((None, wake))
    }

    fn handle(&mut self, done: Done, sink: &mut Sink) -> Result<(), CrawlError> {
        match done {
            Done::Robots(host, outcome) => {
                let Some(h) = self.hosts.get_mut(&host) else {
                    return Ok(());
                };
                h.in_flight = h.in_flight.saturating_sub(1);
                let tries = match h.robots {
                    RobotsState::Pending(tries) => tries,
                    _ => 0,
                };
                let ready: Result<Option<Arc<Robot>>, String> = match outcome {
                    RobotsOutcome::Parsed(robot) => {
                        self.crawl_delay(&host, Some(&robot));
                        Ok(Some(Arc::new(robot)))
                    }
                    RobotsOutcome::AllowAll => Ok(None),
                    RobotsOutcome::NoProxy(e) => {
                        if let Some(why) = self.no_proxy_matches(&e) {
                            self.no_proxy = Some(why);
                            return Ok(());
                        }
                        Err(e.to_string())
                    }
                    RobotsOutcome::Unavailable(why) => Err(why),
                };
                let Some(h) = self.hosts.get_mut(&host) else {
                    return Ok(());
                };
                match ready {
                    Ok(r) => {
                        self.robots.insert(&host, r.clone());
                        h.robots = RobotsState::Ready(r);
                    }
                    Err(error) if tries + 1 >= ROBOTS_TRIES => {
                        tracing::warn!(host, error, "robots.txt unreachable; its pages fail");
                        h.robots = RobotsState::Unavailable;
                    }
                    Err(error) => {
                        let wait = self.opts.robots_retry * 2u32.pow(tries);
                        tracing::info!(
                            host,
                            ?wait,
                            error,
                            "robots.txt unreachable; trying again later"
                        );
                        h.robots = RobotsState::Retry {
                            at: Instant::now() + wait,
                            tries: tries + 1,
                        };
                    }
                }
            }
            Done::Page(q, result, elapsed) => {
                if let Some(h) = self.hosts.get_mut(&q.host) {
                    h.in_flight = h.in_flight.saturating_sub(1);
                    h.silent = match &*result {
                        Err(FetchError::SiteTimeout { .. }) => h.silent + 1,
                        _ => 0,
                    };
                }
                let q = match self.site_silent(q, &result) {
                    Some(q) => q,
                    None => return Ok(()),
                };
                match *result {
                    Ok(Landed::Digested(f)) => self.fetched(sink, q, f, elapsed)?,
                    Ok(Landed::Raw(page)) => {
                        let f = digest_here(page, &self.selects, self.opts.select_all);
                        self.fetched(sink, q, f, elapsed)?
                    }
                    Err(e) => {
                        if matches!(e, FetchError::NoProxy { .. })
                            && let Some(why) = self.no_proxy_matches(&e)
                        {
                            // Not the page's failure: it stays queued.
                            self.no_proxy = Some(why);
                            return Ok(());
                        }
                        let line =
                            failed_line(&q, e.code(), &e.to_string(), e.attempts(), e.status());
                        *self
                            .summary
                            .failed_by_reason
                            .entry(e.code().to_owned())
                            .or_default() += 1;
                        self.write(sink, &q, line, UrlState::Failed, e.attempts(), &[])?;
                    }
                }
            }
        }
        Ok(())
    }

    fn fetched(
        &mut self,
        sink: &mut Sink,
        q: Queued,
        f: Fetched,
        elapsed: Duration,
    ) -> Result<(), CrawlError> {
        let page = &f.page;
        let status = page.status().as_u16();
        let failed = status >= 400;
        self.summary.latency.add(elapsed);
        self.summary.bytes += page.body().len() as u64;
        if failed {
            *self
                .summary
                .failed_by_reason
                .entry(format!("http_{status}"))
                .or_default() += 1;
        } else {
            *self.summary.ok_by_status.entry(status).or_default() += 1;
        }
        let final_url = normalize(page.final_url(), &self.opts.strip_params);
        if let Some(fu) = &final_url
            && fu.as_str() != q.url
        {
            // Reached through redirects: that URL needs no fetch of its own.
            self.frontier
                .mark_seen_done(fu.as_str(), &site_of(fu), q.depth)?;
            if self.redirected.len() < SEEN_CACHE {
                self.redirected.insert(fu.to_string());
            }
        }
        let mut links = Vec::new();
        let follow = self.opts.max_depth.is_none_or(|m| q.depth < m);
        let mut targets: Vec<&::url::Url> = f.links.iter().collect();
        let location = page
            .status()
            .is_redirection()
            .then(|| page.headers().get(http::header::LOCATION))
            .flatten()
            .and_then(|l| l.to_str().ok())
            .and_then(|l| page.final_url().join(l).ok());
        if let Some(l) = &location {
            targets.push(l);
        }
        if follow {
            for link in targets {
                let Some(n) = normalize(link, &self.opts.strip_params) else {
                    continue;
                };
                if !self.scope.allows(&n) || !first_sight(&self.seen, n.as_str()) {
                    continue;
                }
                links.push(NewUrl {
                    host: site_of(&n),
                    url: n.to_string(),
                    depth: q.depth + 1,
                    parent: Some(q.url.clone()),
                });
            }
        }
        self.bound_links(&mut links);
        let line = serde_json::json!({
            "url": q.url,
            "final_url": page.final_url().as_str(),
            "status": status,
            "depth": q.depth,
            "parent": q.parent,
            "proxy": page.proxy().to_string(),
            "attempts": page.attempts(),
            "elapsed_ms": elapsed.as_millis() as u64,
            "content_type": page.content_type(),
            "bytes": page.body().len(),
            "sha256": f.sha256,
            "title": f.title,
            "links": f.links.len(),
            "fields": f.fields,
            "parse_stopped": f.parse_stopped.as_ref().map(stopped_note),
            "error": failed.then(|| format!("http {status}")),
        });
        let state = if failed {
            UrlState::Failed
        } else {
            UrlState::Done
        };
        self.write(sink, &q, line, state, page.attempts(), &links)
    }

    /// Writes a page's line, then commits its end (with the output length)
    /// and the links it added.
    fn write(
        &mut self,
        sink: &mut Sink,
        q: &Queued,
        line: serde_json::Value,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<(), CrawlError> {
        let failed = state == UrlState::Failed;
        sink.page(&line, failed)
            .map_err(|source| CrawlError::Output {
                what: "the output".into(),
                source,
            })?;
        let added = self.frontier.finish(q.id, state, attempts, links)?;
        self.known += added.len() as u64;
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
        }
        for a in added {
            self.progress.queued.fetch_add(1, Ordering::Relaxed);
            if !self.hosts.contains_key(&a.host) {
                if self.hosts.len() >= self.opts.max_hosts.max(1) {
                    // Waits in the frontier for a place.
                    self.hosts_left = true;
                    continue;
                }
                self.add_host(&a.host, false);
            }
            let Some(h) = self.hosts.get_mut(&a.host) else {
                continue;
            };
            if !h.more && self.buffered < MAX_BUFFERED {
                h.last_id = a.id;
                h.buf.push_back(a);
                self.buffered += 1;
            } else {
                h.more = true;
            }
        }
        self.progress
            .queued
            .store(self.buffered as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Keeps of a page's new links what the caps allow: at most
    /// `max_new_links`, and no more than the frontier has room for; counts
    /// the rest.
    fn bound_links(&mut self, links: &mut Vec<NewUrl>) {
        if let Some(max) = self.opts.max_new_links
            && links.len() > max
        {
            self.summary.links_cut += (links.len() - max) as u64;
            links.truncate(max);
        }
        if let Some(max) = self.max_frontier {
            let room = usize::try_from(max.saturating_sub(self.known)).unwrap_or(usize::MAX);
            if links.len() > room {
                self.summary.frontier_full += (links.len() - room) as u64;
                links.truncate(room);
            }
        }
    }

    /// Takes in hosts with waiting URLs from the frontier until
    /// [`CrawlOptions::max_hosts`] are held, going round the frontier's
    /// hosts by name from where the last call stopped; when a round finds
    /// room for every one, none is left out.
    fn take_in_hosts(&mut self) -> Result<(), CrawlError> {
        let max = self.opts.max_hosts.max(1);
        let mut from_start = self.host_cursor.is_empty();
        while self.hosts_left && self.hosts.len() < max {
            let want = (max - self.hosts.len()).min(1000);
            let batch = self
                .frontier
                .hosts_with_work_after(&self.host_cursor, want)?;
            let end = batch.len() < want;
            for h in batch {
                if !self.hosts.contains_key(&h) {
                    self.add_host(&h, true);
                }
                self.host_cursor = h;
            }
            if end {
                self.host_cursor.clear();
                if from_start {
                    self.hosts_left = false;
                }
                from_start = true;
            }
        }
        Ok(())
    }

    /// Takes host `host` in turn (`more`: it has work in the frontier not
    /// yet loaded), with the robots.txt rules already read for it.
    fn add_host(&mut self, host: &str, more: bool) {
        let robots = if self.opts.ignore_robots {
            RobotsState::Ready(None)
        } else {
            match self.robots.get(host) {
                Some(rules) => {
                    self.crawl_delay(host, rules.as_deref());
                    RobotsState::Ready(rules)
                }
                None => RobotsState::Unknown,
            }
        };
        self.hosts
            .insert(host.to_owned(), HostQueue::new(more, robots));
        self.order.push_back(host.to_owned());
    }

    /// Spaces host `host`'s requests by its robots.txt's Crawl-delay.
    fn crawl_delay(&self, host: &str, robot: Option<&Robot>) {
        if let Some(secs) = robot
            .and_then(|r| r.delay)
            .filter(|d| d.is_finite() && *d > 0.0)
        {
            self.polite
                .set_crawl_delay(host, Duration::from_secs_f32(secs.min(3600.0)));
        }
    }

    /// Writes the lines of the pages finished since the last commit, then
    /// commits their end with the output lengths.
    fn commit(&mut self, sink: &mut Sink) -> Result<(), CrawlError> {
        if !self.frontier.dirty() {
            return Ok(());
        }
        sink.flush().map_err(|source| CrawlError::Output {
            what: "the output".into(),
            source,
        })?;
        let mut meta = sink.offsets();
        meta.push((
            summary::COUNTS_META,
            self.summary.kept(self.started.elapsed()),
        ));
        self.frontier.commit(&meta)?;
        Ok(())
    }

    /// When page `q` timed out on two proxies in a row and its host has not
    /// done so [`ROBOTS_TRIES`] times in a row: the host backs off (as for
    /// robots.txt, doubled each time) and the page waits its turn again,
    /// neither fetched nor failed. Otherwise hands `q` back to be written.
    fn site_silent(&mut self, q: Queued, result: &Result<Landed, FetchError>) -> Option<Queued> {
        if !matches!(result, Err(FetchError::SiteTimeout { .. })) {
            return Some(q);
        }
        let Some(h) = self.hosts.get_mut(&q.host) else {
            return Some(q);
        };
        if h.silent >= ROBOTS_TRIES {
            return Some(q);
        }
        let wait = self.opts.robots_retry * 2u32.pow(h.silent - 1);
        tracing::info!(host = %q.host, ?wait, "the site gave no answer in time; backing off");
        self.polite.note(&q.host, None, Some(wait));
        h.buf.push_front(q);
        self.buffered += 1;
        self.taken = self.taken.saturating_sub(1);
        self.progress.queued.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// When request `e` found no proxy: why none can be found at all
    /// (nothing servable matches the pool's filters), or `None` when some
    /// do and were only busy, resting or banned by the site.
    fn no_proxy_matches(&self, e: &FetchError) -> Option<String> {
        let now = crate::store::now_ms();
        let feedback = self.pool.feedback();
        if !feedback
            .select(&self.pool.options().query, None, now)
            .is_empty()
        {
            return None;
        }
        let servable = feedback.select(&ProxyQuery::default(), None, now).len();
        let mut why = match servable {
            0 => "no proxy is servable".to_owned(),
            n => format!("0 of {n} servable proxies match"),
        };
        if let FetchError::NoProxy { waited, hint, .. } = e {
            if *waited >= Duration::from_millis(100) {
                why.push_str(&format!(" (waited {:.1}s)", waited.as_secs_f64()));
            }
            if let Some(h) = hint {
                why.push_str(&format!("; {h}"));
            }
        }
        Some(why)
    }

    fn unqueue(&self) {
        let _ = self
            .progress
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

fn hash(url: &str) -> u64 {
    let mut h = DefaultHasher::new();
    url.hash(&mut h);
    h.finish()
}

/// False when `url` was seen lately; notes it otherwise.
fn first_sight(seen: &Mutex<HashSet<u64>>, url: &str) -> bool {
    let mut seen = lock(seen);
    if seen.len() >= SEEN_CACHE {
        seen.clear();
    }
    seen.insert(hash(url))
}

/// Hashes and parses a page on the thread it is called on (one that may
/// block), bounded by [`PARSE_TIME`] and the parser's depth cap.
fn digest_here(page: Page, selects: &[Select], all: bool) -> Fetched {
    let parsed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        hash_and_extract(page.body(), page.final_url(), is_html(&page), selects, all)
    }));
    let (sha256, e) = match parsed {
        Ok(done) => done,
        // A parser panic is a bug; it costs the page its extraction, not
        // the crawl.
        Err(_) => {
            tracing::warn!(url = %page.final_url(), "parsing a page failed unexpectedly");
            (sha256_hex(page.body()), extract::Extracted::default())
        }
    };
    Fetched {
        page,
        sha256,
        title: e.title,
        links: e.links,
        fields: e.fields,
        parse_stopped: e.stopped,
    }
}

/// The body's SHA-256 and, when it is `html`, its title, links and fields.
fn hash_and_extract(
    body: &[u8],
    base: &::url::Url,
    html: bool,
    selects: &[Select],
    all: bool,
) -> (String, extract::Extracted) {
    let e = if html {
        let deadline = crate::html::Deadline {
            started: std::time::Instant::now(),
            allowed: PARSE_TIME,
            setting: "the crawl's parse time",
        };
        let text = String::from_utf8_lossy(body);
        extract::extract(&text, base, selects, all, Some(deadline))
    } else {
        extract::Extracted::default()
    };
    (sha256_hex(body), e)
}

/// A successful answer that is (or says nothing against being) HTML.
fn is_html(page: &Page) -> bool {
    page.status().is_success()
        && page
            .content_type()
            .is_none_or(|t| t.to_ascii_lowercase().contains("html"))
}

/// Hashes, parses and stores a large page in its own task; hashing and
/// parsing (CPU work that grows with the page) run on the blocking pool,
/// bounded by [`PARSE_TIME`] and the parser's caps, at most
/// [`crate::html::parsers`] pages at once.
async fn digest(
    page: Page,
    selects: Arc<[Select]>,
    all: bool,
    bodies: Option<&std::path::Path>,
) -> Fetched {
    let body = page.body().clone();
    let base = page.final_url().clone();
    let html = is_html(&page);
    // Pages parsed at once are bounded per process (each holds a tree):
    // the others wait here with their bodies.
    let _parsing = match html {
        true => crate::html::parsers().acquire().await.ok(),
        false => None,
    };
    let joined =
        tokio::task::spawn_blocking(move || hash_and_extract(&body, &base, html, &selects, all))
            .await;
    let (sha256, e) = match joined {
        Ok(done) => done,
        // A parser panic is a bug; it costs the page its extraction, not
        // the crawl.
        Err(error) => {
            tracing::warn!(url = %page.final_url(), %error, "parsing a page failed unexpectedly");
            (sha256_hex(page.body()), extract::Extracted::default())
        }
    };
    if let Some(dir) = bodies
        && let Err(e) = output::store_body(dir, &sha256, page.body()).await
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot store a body");
    }
    Fetched {
        page,
        sha256,
        title: e.title,
        links: e.links,
        fields: e.fields,
        parse_stopped: e.stopped,
    }
}

fn sha256_hex(body: &[u8]) -> String {
    sha2::Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the output says of a page whose parse stopped early.
fn stopped_note(e: &crate::html::HtmlError) -> String {
    use crate::html::{HtmlError, MAX_DEPTH};
    match e {
        HtmlError::TooDeep => {
            format!("nested deeper than {MAX_DEPTH} elements: links and fields read up to there")
        }
        HtmlError::TooManyNodes => format!(
            "more than {} nodes: links and fields read up to there",
            crate::html::MAX_NODES
        ),
        HtmlError::TooManyAttributes => format!(
            "more than {} attributes, or a tag with more than {}: links and fields read up to there",
            crate::html::MAX_ATTRIBUTES,
            crate::html::MAX_TAG_ATTRIBUTES
        ),
        HtmlError::TooSlow(allowed, _) => format!(
            "took longer than {} to parse: links and fields read up to there",
            humantime::format_duration(*allowed)
        ),
    }
}

fn failed_line(
    q: &Queued,
    code: &str,
    message: &str,
    attempts: u32,
    status: Option<u16>,
) -> serde_json::Value {
    serde_json::json!({
        "url": q.url,
        "final_url": null,
        "status": status,
        "depth": q.depth,
        "parent": q.parent,
        "proxy": null,
        "attempts": attempts,
        "error": format!("{code}: {message}"),
    })
}

/// What a robots.txt fetch means: 2xx parsed, 4xx allow all, anything else
/// (5xx, no answer) disallow for now.
fn robots_outcome(result: Result<Page, FetchError>, agent: &str) -> RobotsOutcome {
    match result {
        Ok(p) if p.status().is_success() => match Robot::new(agent, p.body()) {
            Ok(r) => RobotsOutcome::Parsed(r),
            Err(_) => RobotsOutcome::AllowAll,
        },
        Ok(p) if p.status().is_client_error() => RobotsOutcome::AllowAll,
        Err(FetchError::Exhausted {
            status: Some(s), ..
        }) if (400..500).contains(&s) && s != 429 => RobotsOutcome::AllowAll,
        Ok(p) => RobotsOutcome::Unavailable(format!("http {}", p.status().as_u16())),
        Err(e @ FetchError::NoProxy { .. }) => RobotsOutcome::NoProxy(e),
        Err(e) => RobotsOutcome::Unavailable(e.to_string()),
    }
}

/// The product token of a user agent (`proxywarden` of
/// `proxywarden/0.1 (+url)`): what robots.txt groups name.
fn robots_agent(ua: &str) -> String {
    ua.split(['/', ' ']).next().unwrap_or(ua).to_owned()
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_robots_agent_is_the_product_token() {
        assert_eq!(
            robots_agent("proxywarden/0.1.0 (+https://x)"),
            "proxywarden"
        );
        assert_eq!(robots_agent("MyBot"), "MyBot");
    }
}
