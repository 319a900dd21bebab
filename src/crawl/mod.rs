//! The polite crawler on the pool: breadth-first from seed URLs within a
//! scope, de-duplicated on normalised URLs, robots.txt obeyed (fetched
//! through the pool), per-host delay and concurrency whichever proxy
//! carries a request, a frontier in the store that resumes after a crash, and
//! one JSON line per page. The crawl's loop is a task like any other: its
//! frontier calls are async on both backends, its output files are written
//! on the blocking pool, and pages are parsed there too, a few at a time
//! ([`crate::html::parsers`]), so a crawl never holds up the async workers.

pub mod extract;
pub mod frontier;
pub mod jobs;
pub mod nodes;
pub mod output;
mod page;
pub mod polite;
pub mod robots;
mod run;
mod schedule;
pub mod spec;
pub mod summary;
pub mod url;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use regex::Regex;

pub use self::url::{Scope, normalize};
pub use crate::model::ScopeKind;
use crate::pool::FetchError;
pub use extract::Select;
use frontier::FrontierError;
pub use polite::Politeness;
pub use run::crawl;
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
    /// The thread a crawl runs on, or its runtime, could not be started.
    #[error("cannot start the crawl's thread: {0}")]
    Thread(std::io::Error),
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

/// Hosts with work held in memory at once, by default.
pub const MAX_HOSTS: usize = 10_000;
/// A crawl with a page limit keeps at most this many URLs per page it may
/// fetch in its frontier, unless told otherwise: enough to choose from,
/// and a site of endless links (a calendar, a faceted search) cannot fill
/// the disk.
pub const FRONTIER_PER_PAGE: u64 = 10;
