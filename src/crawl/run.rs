//! A crawl's run: opening its frontier and outputs, then the loop that
//! starts fetches as the schedule allows, hands what lands to page
//! handling, commits each turn's batch, and stops on an empty frontier, a
//! limit, a cancel or a drop.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::frontier::{Frontier, NewUrl, Queued, UrlState};
use super::output::{self, Sink};
use super::page::{Fetched, digest, hash};
use super::robots::{RobotsCache, RobotsOutcome, robots_agent, robots_outcome};
use super::schedule::HostQueue;
use super::{
    CrawlError, CrawlOptions, FRONTIER_PER_PAGE, Politeness, Progress, Scope, Select, Summary,
    nodes, normalize, summary,
};
use crate::health::ProxyQuery;
use crate::pool::{FetchError, Pool, Request, site_of};

/// On a crawl's own thread, pages started while fewer than this many are
/// in flight are fetched and (when small) parsed on that thread.
const PAGES_HERE_IN_FLIGHT: usize = 4;

pub(super) enum Job {
    Page(Queued),
    Robots(String, ::url::Url),
}

pub(super) enum Done {
    /// A page, digested in its task.
    Page(Queued, Box<Result<Fetched, FetchError>>, Duration),
    Robots(String, RobotsOutcome),
}

/// Runs a crawl on `pool` until the frontier is empty, a limit is reached
/// or `cancel` fires (then the pages in flight finish within the grace
/// time). Returns the summary.
///
/// A crawl with a state of its own (not a daemon's job) runs on a thread
/// of its own, with a single-threaded runtime: its loop, the frontier's
/// connection and the output's writes run there, and so do its fetches
/// (with their connections) and the parse of small pages while few are in
/// flight. A page of a polite crawl, a page or two at a time, wakes that
/// thread and is handed to no other. With many in flight, the fetches are
/// tasks of the caller's runtime and pages are parsed on its blocking
/// pool, beside the crawl's thread. A daemon's job runs as a task
/// of the daemon's runtime (its frontier shares the daemon's database and
/// connections): its loop is a task, the fetches are tasks too, and pages
/// are parsed on the blocking pool.
///
/// Dropping the returned future stops the crawl at once, as a second
/// Ctrl-C does: the batch in hand is committed and what was committed
/// stays.
pub async fn crawl(
    pool: &Pool,
    opts: CrawlOptions,
    cancel: CancellationToken,
    progress: Arc<Progress>,
) -> Result<Summary, CrawlError> {
    let pool = pool.clone();
    let dropped = CancellationToken::new();
    let _stop_when_dropped = dropped.clone().drop_guard();
    if opts.job.is_none() {
        return crawl_on_own_thread(pool, opts, cancel, dropped, progress).await;
    }
    let task =
        tokio::spawn(async move { crawl_here(&pool, opts, cancel, dropped, progress, None).await });
    match task.await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(CrawlError::RuntimeGone),
    }
}

/// [`crawl`] on a thread of its own with a single-threaded runtime; a
/// panic there is resumed here.
async fn crawl_on_own_thread(
    pool: Pool,
    opts: CrawlOptions,
    cancel: CancellationToken,
    dropped: CancellationToken,
    progress: Arc<Progress>,
) -> Result<Summary, CrawlError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let outer = tokio::runtime::Handle::current();
    let spawned = std::thread::Builder::new()
        .name("proxywarden-crawl".into())
        .spawn(move || {
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(CrawlError::Thread)?;
                let summary = rt.block_on(crawl_here(
                    &pool,
                    opts,
                    cancel,
                    dropped,
                    progress,
                    Some(outer),
                ));
                // The fetches' connections end with the runtime: none
                // outlives the crawl on a thread that is gone.
                rt.shutdown_background();
                summary
            }));
            let _ = tx.send(ran);
        });
    if let Err(e) = spawned {
        return Err(CrawlError::Thread(e));
    }
    match rx.await {
        Ok(Ok(r)) => r,
        Ok(Err(panic)) => std::panic::resume_unwind(panic),
        Err(_) => Err(CrawlError::RuntimeGone),
    }
}

/// [`crawl`] in the task it is called in; `dropped` ends it at once.
/// `outer`: the crawl has its thread to itself (its frontier's connection
/// and the output's writes run on it), and this is the caller's runtime,
/// which runs its pages when many are in flight.
async fn crawl_here(
    pool: &Pool,
    opts: CrawlOptions,
    cancel: CancellationToken,
    dropped: CancellationToken,
    progress: Arc<Progress>,
    outer: Option<tokio::runtime::Handle>,
) -> Result<Summary, CrawlError> {
    let started = Instant::now();
    let here = outer.is_some();
    let mut frontier = match &opts.job {
        Some((store, id)) => Frontier::of_job(store, *id).await?,
        None if here => Frontier::open_here(opts.state.as_deref()).await?,
        None => Frontier::open(opts.state.as_deref()).await?,
    };
    let polite = Arc::new(Politeness::new(opts.delay));
    let mut pacer: Arc<dyn crate::pool::Pacer> = polite.clone();
    if let (Some((store, id)), Some((node, ttl))) = (&opts.job, &opts.lease) {
        frontier.lease_pages(node, *ttl).await;
        pacer = Arc::new(nodes::SharedPacer::new(polite.clone(), store.clone(), *id));
    }
    if opts.retry_failed {
        let n = frontier.requeue_failed().await?;
        tracing::info!(requeued = n, "re-queued failed pages");
    }
    let resumed = frontier.meta("started").await?.is_some();
    let earlier = summary::start_run(&mut frontier, resumed).await?;
    let (out_len, failed_len) = if resumed {
        let len = |v: Option<String>| v.and_then(|v| v.parse::<u64>().ok());
        (
            len(frontier.meta(output::OUT_LEN).await?),
            len(frontier.meta(output::FAILED_LEN).await?),
        )
    } else {
        (None, None)
    };
    let mut sink = Sink::open(opts.output.clone(), out_len, failed_len)
        .await
        .map_err(|source| CrawlError::Output {
            what: opts
                .output
                .as_ref()
                .map_or("stdout".into(), |p| p.display().to_string()),
            source,
        })?;
    if !resumed {
        frontier
            .set_meta("started", &crate::store::now_ms().to_string())
            .await?;
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
    frontier.add(&seeds).await?;
    let mut seed_urls: Vec<::url::Url> = opts.seeds.clone();
    if let Some(stored) = frontier.meta("seeds").await? {
        seed_urls.extend(stored.lines().filter_map(|l| ::url::Url::parse(l).ok()));
    }
    let joined: Vec<String> = seed_urls.iter().map(|u| u.to_string()).collect();
    frontier.set_meta("seeds", &joined.join("\n")).await?;
    if frontier.hosts_with_work_after("", 1).await?.is_empty() && seed_urls.is_empty() {
        return Err(CrawlError::NothingToCrawl);
    }
    let scope = Scope::new(
        opts.scope,
        &seed_urls,
        opts.include.clone(),
        opts.exclude.clone(),
    );
    let taken = frontier.count(UrlState::Done).await? + frontier.count(UrlState::Failed).await?;
    let known = frontier.total().await?;
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
        outer,
        opts,
    };
    c.take_in_hosts().await?;
    c.summary.disallowed = c.frontier.count(UrlState::Disallowed).await?;
    c.progress
        .queued
        .store(c.frontier.count(UrlState::Queued).await?, Ordering::Relaxed);
    c.run(&mut sink, cancel, dropped).await?;
    c.summary.elapsed = started.elapsed();
    c.summary.queued = c.frontier.count(UrlState::Queued).await?;
    c.summary.discovered = c.frontier.total().await?;
    c.summary.pool = pool.stats();
    c.frontier.close().await;
    Ok(c.summary)
}

pub(super) struct Crawler {
    pub(super) pool: Pool,
    pub(super) polite: Arc<Politeness>,
    /// What paces the requests: `polite`, and the store's turns for a job
    /// several nodes may crawl.
    pub(super) pacer: Arc<dyn crate::pool::Pacer>,
    /// The robots.txt rules read, bounded in hosts and age.
    pub(super) robots: RobotsCache,
    pub(super) scope: Arc<Scope>,
    pub(super) agent: String,
    pub(super) hosts: HashMap<String, HostQueue>,
    /// The frontier may hold work of hosts not in `hosts` (it was full).
    pub(super) hosts_left: bool,
    /// The last host taken in from the frontier, by name: the next are
    /// looked for after it.
    pub(super) host_cursor: String,
    /// Hosts with work, in turn.
    pub(super) order: VecDeque<String>,
    pub(super) buffered: usize,
    /// Recently seen URLs (hashes): links skip the frontier insert, and a
    /// redirect to a URL the crawl knows is not followed (it is, or will
    /// be, fetched on its own).
    pub(super) seen: Arc<Mutex<HashSet<u64>>>,
    /// URLs reached through a redirect: done without a fetch of their own.
    pub(super) redirected: HashSet<String>,
    /// Pages handed out, this run and before.
    pub(super) taken: u64,
    /// URLs in the frontier (as far as this crawl added them).
    pub(super) known: u64,
    /// URLs the frontier may hold.
    pub(super) max_frontier: Option<u64>,
    /// Set when a request found no proxy and none matches the filters:
    /// the crawl ends with this.
    pub(super) no_proxy: Option<String>,
    pub(super) summary: Summary,
    /// When this run started.
    pub(super) started: Instant,
    pub(super) progress: Arc<Progress>,
    pub(super) frontier: Frontier,
    /// `opts.selects`, shared with the tasks that parse large pages.
    pub(super) selects: Arc<[Select]>,
    /// The crawl has its thread to itself, and this is the caller's
    /// runtime: the output is written on the crawl's thread, and so are
    /// pages fetched and (when small) parsed while few are in flight; with
    /// many, they are tasks of this runtime and parsed on its blocking pool.
    pub(super) outer: Option<tokio::runtime::Handle>,
    pub(super) opts: CrawlOptions,
}

impl Crawler {
    pub(super) async fn run(
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
                    let (job, next) = self.next_job(sink).await?;
                    wake = next;
                    let Some(job) = job else { break };
                    self.spawn(&mut running, job);
                }
            }
            self.progress
                .in_flight
                .store(running.len() as u64, Ordering::Relaxed);
            // One commit for what this turn of the loop finished.
            self.commit(sink).await?;
            if running.is_empty() && (stop_at.is_some() || wake.is_none()) {
                match self.held_elsewhere(stop_at.is_some()).await? {
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
                            Ok(d) => self.handle(d, sink).await?,
                            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                            Err(_) => {}
                        }
                        done = running.try_join_next();
                    }
                    if let Some(why) = self.no_proxy.take() {
                        // The pages still in flight wait for proxies that
                        // do not exist; they stay queued for a later run.
                        running.abort_all();
                        self.commit(sink).await?;
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
                    return self.commit(sink).await;
                }
                _ = sleep_until(stop_at), if stop_at.is_some() => {
                    // Out of grace: what is still in flight stays queued in
                    // the frontier and is fetched by the next run.
                    running.abort_all();
                    return self.commit(sink).await;
                }
            }
        }
    }
    /// When queued pages are leased to another node and this crawl would
    /// otherwise end (not stopping, no page limit reached): when to look
    /// again, with the frontier's hosts to be read afresh then.
    pub(super) async fn held_elsewhere(
        &mut self,
        stopping: bool,
    ) -> Result<Option<Instant>, CrawlError> {
        if stopping || self.opts.max_pages.is_some_and(|m| self.taken >= m) {
            return Ok(None);
        }
        let Some(until) = self.frontier.held_elsewhere().await? else {
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
    pub(super) fn spawn(&mut self, running: &mut JoinSet<Done>, job: Job) {
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
                // With few pages in flight the crawl's thread is mostly
                // idle: a page is fetched and (when small) parsed there.
                // With many, the caller's runtime fetches them and its
                // blocking pool parses them, beside the crawl's thread.
                let outer = self
                    .outer
                    .clone()
                    .filter(|_| running.len() >= PAGES_HERE_IN_FLIGHT);
                let here = self.outer.is_some() && outer.is_none();
                let page = async move {
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
                    // Parsed (on the blocking pool unless `here`), and
                    // stored bodies written, from here: off the crawl's loop.
                    let result = match result {
                        Ok(page) => Ok(digest(page, selects, all, bodies.as_deref(), here).await),
                        Err(e) => Err(e),
                    };
                    Done::Page(q, Box::new(result), t0.elapsed())
                };
                match outer {
                    Some(rt) => running.spawn_on(page, &rt),
                    None => running.spawn(page),
                };
            }
        }
    }
    /// Writes the lines of the pages finished since the last commit, then
    /// commits their end with the output lengths.
    pub(super) async fn commit(&mut self, sink: &mut Sink) -> Result<(), CrawlError> {
        if !self.frontier.dirty() {
            return Ok(());
        }
        let flushed = match self.outer.is_some() {
            true => sink.flush_here(),
            false => sink.flush().await,
        };
        flushed.map_err(|source| CrawlError::Output {
            what: "the output".into(),
            source,
        })?;
        let mut meta = sink.offsets();
        meta.push((
            summary::COUNTS_META,
            self.summary.kept(self.started.elapsed()),
        ));
        self.frontier.commit(&meta).await?;
        Ok(())
    }
    /// When request `e` found no proxy: why none can be found at all
    /// (nothing servable matches the pool's filters), or `None` when some
    /// do and were only busy, resting or banned by the site.
    pub(super) fn no_proxy_matches(&self, e: &FetchError) -> Option<String> {
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
}

pub(super) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
