//! The rotating fetch pool: picks a proxy from the health index for each
//! request (by a strategy, with sticky sessions, per-proxy in-flight caps,
//! cooldowns and per-site bans), fetches through it, classifies the answer,
//! reports it on the one feedback path and retries on other proxies.
//!
//! ```no_run
//! use proxywarden::pool::{Pool, PoolOptions};
//! use proxywarden::store::Store;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::open("proxywarden.db".as_ref())?;
//! // Or `Pool::new(feedback, opts)` on the daemon's live health index.
//! let pool = Pool::from_store(&store, PoolOptions::default())?;
//! let page = pool.get("http://example.com/a").await?; // retried on other proxies
//! println!("{} via {}", page.status(), page.proxy());
//! # Ok(())
//! # }
//! ```

mod classify;
mod fetch;
mod strategy;

pub(crate) use classify::Class;
pub use classify::{Classifier, DEFAULT_BLOCK_PATTERNS, DEFAULT_PORTAL_PATTERNS};
pub use strategy::StrategyKind;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use rand::RngExt;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use url::Url;

use crate::health::{Entry, Feedback, HealthIndex, ProxyQuery, Verdict};
use crate::model::Reason;
use crate::proxy::{Proxy, Scheme, Status};
use crate::store::{ProxyFilter, Store, StoreError};

use crate::lock;
use fetch::{Answer, Client, Failure, Limits};
use strategy::{Bound, Usage};

/// What to do when no proxy can take a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoProxy {
    /// Wait up to this long for one (a cooldown ending, a slot freeing, a
    /// proxy coming alive), then fail.
    Wait(Duration),
    /// Fail at once.
    Fail,
    /// Send the request directly, without a proxy. Only on explicit request:
    /// the pool never goes direct on its own.
    Direct,
    /// Wait up to this long, first come first served, while a matching
    /// proxy is busy at its cap or resting briefly; fail at once when none
    /// can come free (none matches, or all are banned or tried). For
    /// clients that want an answer now (the gateway).
    Queue(Duration),
}

/// How a pool behaves. `Default` gives short timeouts and the budgets the
/// crawler uses.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Which proxies (the same filters as the API's).
    pub query: ProxyQuery,
    /// How one is chosen among those usable.
    pub strategy: StrategyKind,
    /// Requests through one proxy at once, for every client of the pool
    /// together (taken from the options the pool was built with, not from
    /// those of a [`Pool::client`]).
    pub max_in_flight: u32,
    /// How long a proxy that failed rests; doubled for each failure in a
    /// row, up to `max_cooldown` (as `max_in_flight`, the pool's).
    pub cooldown: Duration,
    /// The longest rest (the pool's).
    pub max_cooldown: Duration,
    /// TCP connect to the proxy.
    pub connect_timeout: Duration,
    /// From the connection to the answer's head (proxy handshake and TLS
    /// included): a proxy that accepts and never answers costs this.
    pub first_byte_timeout: Duration,
    /// One attempt, body included.
    pub total_timeout: Duration,
    /// Largest body, before and after decoding.
    pub max_body: usize,
    /// Redirects followed in one attempt (through the same proxy).
    pub max_redirects: u32,
    /// New proxies a request may move on to after a proxy failed or was
    /// blocked.
    pub rotations: u32,
    /// Repeats after the site failed (5xx) or rate-limited (429, 503).
    pub target_retries: u32,
    /// First wait before a target retry; doubled each time, with jitter.
    pub retry_backoff: Duration,
    /// A `Retry-After` longer than this ends the request instead.
    pub max_retry_after: Duration,
    /// When no proxy can take a request.
    pub no_proxy: NoProxy,
    /// A sticky session moves to another proxy after this many uses.
    pub session_uses: u32,
    /// …or once it is this old.
    pub session_age: Duration,
    /// The `User-Agent` sent.
    pub user_agent: String,
    /// Which answers are blocks or proxy lies.
    pub classifier: Classifier,
    /// PEM roots trusted besides the built-in ones (private sites, tests;
    /// the pool's).
    pub extra_ca: Option<PathBuf>,
    /// How often a pool made by [`Pool::from_store`] reloads the alive
    /// proxies from the store (the pool's).
    pub refresh_every: Duration,
}

/// The user agent unless one is given.
pub const DEFAULT_USER_AGENT: &str = concat!(
    "proxywarden/",
    env!("CARGO_PKG_VERSION"),
    " (+https://github.com/proxywarden)"
);

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        PoolOptions {
            query: ProxyQuery::default(),
            strategy: StrategyKind::default(),
            max_in_flight: 4,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(30 * 60),
            connect_timeout: Duration::from_secs(4),
            first_byte_timeout: Duration::from_secs(8),
            total_timeout: Duration::from_secs(20),
            max_body: 10 * 1024 * 1024,
            max_redirects: 5,
            rotations: 10,
            target_retries: 3,
            retry_backoff: Duration::from_millis(500),
            max_retry_after: Duration::from_secs(120),
            no_proxy: NoProxy::Wait(Duration::from_secs(60)),
            session_uses: 100,
            session_age: Duration::from_secs(600),
            user_agent: DEFAULT_USER_AGENT.to_owned(),
            classifier: Classifier::default(),
            extra_ca: None,
            refresh_every: Duration::from_secs(30),
        }
    }
}

/// Why a pool could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The TLS configuration (extra roots) could not be built.
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsSetupError),
    /// The user agent is not a valid header value.
    #[error("invalid user agent {0:?}")]
    UserAgent(String),
    /// A pool refreshed from the store needs a tokio runtime to run in.
    #[error("the pool must be created inside a tokio runtime")]
    NoRuntime,
}

/// Why a request got no page.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// Not an http(s) URL with a host.
    #[error("invalid URL {url:?}: {why}")]
    InvalidUrl {
        /// As given.
        url: String,
        /// What is wrong.
        why: String,
    },
    /// No proxy could take the request in time.
    #[error("no usable proxy right now (waited {waited:.1?}){}", hint.as_deref().map(|h| format!(": {h}")).unwrap_or_default())]
    NoProxy {
        /// How long it waited.
        waited: Duration,
        /// Attempts made before.
        attempts: u32,
        /// Why, when known (the store could not be read, say).
        hint: Option<String>,
    },
    /// Every proxy tried failed or was blocked, and the rotation (or
    /// target retry) budget is spent.
    #[error("gave up after {attempts} attempts: {last}")]
    Exhausted {
        /// Attempts made.
        attempts: u32,
        /// The last failure.
        last: String,
        /// The last status the site answered, if any.
        status: Option<u16>,
    },
    /// Proxies that work say the target cannot be reached (no such host,
    /// nothing listening).
    #[error("target unreachable after {attempts} attempts")]
    Unreachable {
        /// Attempts made.
        attempts: u32,
    },
    /// The body is larger than the cap.
    #[error("body larger than {limit} bytes")]
    TooLarge {
        /// Attempts made.
        attempts: u32,
        /// The cap.
        limit: usize,
    },
    /// The site asked to wait longer than the pool may.
    #[error("the site asked to retry after {0:?}")]
    RetryAfterTooLong(Duration),
    /// Proxies in a row got through to the site and no answer came in
    /// time: the site is slow or silent, not they.
    #[error("no answer in time through {attempts} proxies in a row: the site is slow or silent")]
    SiteTimeout {
        /// Attempts made.
        attempts: u32,
    },
}

impl FetchError {
    /// A short code for outputs and summaries.
    pub fn code(&self) -> &'static str {
        match self {
            FetchError::InvalidUrl { .. } => "invalid_url",
            FetchError::NoProxy { .. } => "no_proxy",
            FetchError::Exhausted { .. } => "exhausted",
            FetchError::Unreachable { .. } => "unreachable",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::RetryAfterTooLong(_) => "retry_after_too_long",
            FetchError::SiteTimeout { .. } => "site_timeout",
        }
    }

    /// Attempts made before giving up.
    pub fn attempts(&self) -> u32 {
        match self {
            FetchError::NoProxy { attempts, .. }
            | FetchError::Exhausted { attempts, .. }
            | FetchError::Unreachable { attempts }
            | FetchError::SiteTimeout { attempts }
            | FetchError::TooLarge { attempts, .. } => *attempts,
            _ => 0,
        }
    }

    /// The last status the site answered, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            FetchError::Exhausted { status, .. } => *status,
            _ => None,
        }
    }
}

/// What carried a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Carrier {
    /// A proxy from the index.
    Proxy {
        /// Its id in the store.
        id: i64,
        /// The proxy.
        proxy: Proxy,
    },
    /// No proxy: asked for with [`NoProxy::Direct`].
    Direct,
}

/// `scheme://host:port` (never the credentials), or `direct`.
impl fmt::Display for Carrier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Carrier::Proxy { proxy, .. } => write!(f, "{}://{}", proxy.scheme, proxy.host_port()),
            Carrier::Direct => f.write_str("direct"),
        }
    }
}

/// A fetched page.
#[derive(Clone, Debug)]
pub struct Page {
    url: Url,
    final_url: Url,
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
    carrier: Carrier,
    attempts: u32,
    elapsed: Duration,
}

impl Page {
    /// The URL asked for.
    pub fn url(&self) -> &Url {
        &self.url
    }
    /// Where the redirects followed ended.
    pub fn final_url(&self) -> &Url {
        &self.final_url
    }
    /// The status of the final answer.
    pub fn status(&self) -> StatusCode {
        self.status
    }
    /// Its headers.
    pub fn headers(&self) -> &HeaderMap {
        &self.headers
    }
    /// The body, decoded.
    pub fn body(&self) -> &Bytes {
        &self.body
    }
    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    /// What carried the final attempt.
    pub fn proxy(&self) -> &Carrier {
        &self.carrier
    }
    /// Attempts it took (1 when the first proxy worked).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }
    /// From the request to the body's end, retries included.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }
    /// `Content-Type`, if any.
    pub fn content_type(&self) -> Option<&str> {
        self.headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
    }
}

/// Paces requests per site for a caller (the crawler): waited on before
/// every request the pool sends for it, told of every answer.
pub trait Pacer: Send + Sync {
    /// Resolves when a request to `url` may start.
    fn wait<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>>;
    /// What the request to `url` got: its status (`None` when no answer
    /// came) and `Retry-After`.
    fn answered(&self, url: &Url, status: Option<StatusCode>, retry_after: Option<Duration>);
    /// How long until a request to `url` may start, as far as known now.
    fn ready_in(&self, _url: &Url) -> Duration {
        Duration::ZERO
    }
}

/// The pool connects to a proxy this long before the site's turn comes
/// (so that a dead proxy costs the site no turn) and sleeps through the
/// rest of a longer wait first.
const PRE_DIAL: Duration = Duration::from_secs(1);

/// Decides whether a redirect from one URL to another is followed.
pub type RedirectRule = Arc<dyn Fn(&Url, &Url) -> bool + Send + Sync>;

/// One request for [`Pool::fetch`].
#[derive(Clone)]
pub struct Request {
    url: Url,
    session: Option<String>,
    pacer: Option<Arc<dyn Pacer>>,
    follow: Option<RedirectRule>,
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("url", &self.url.as_str())
            .field("session", &self.session)
            .finish()
    }
}

impl Request {
    /// A GET of `url` (http or https).
    pub fn new(url: Url) -> Result<Request, FetchError> {
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(FetchError::InvalidUrl {
                url: url.to_string(),
                why: "not an http(s) URL with a host".into(),
            });
        }
        Ok(Request {
            url,
            session: None,
            pacer: None,
            follow: None,
        })
    }

    /// Keeps one proxy for every request of session `key` until it fails,
    /// is used [`PoolOptions::session_uses`] times or gets too old.
    pub fn session(mut self, key: impl Into<String>) -> Request {
        self.session = Some(key.into());
        self
    }

    /// Paces this request's sends with `pacer`.
    pub fn pacer(mut self, pacer: Arc<dyn Pacer>) -> Request {
        self.pacer = Some(pacer);
        self
    }

    /// Follows the redirects `rule` allows (default: to the same host).
    pub fn follow(mut self, rule: RedirectRule) -> Request {
        self.follow = Some(rule);
        self
    }
}

/// Counters of a pool's work so far.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct PoolStats {
    /// Requests asked of the pool.
    pub requests: u64,
    /// Requests that got a page.
    pub pages: u64,
    /// Requests that failed for good.
    pub failed: u64,
    /// Attempts sent (redirects not counted).
    pub attempts: u64,
    /// Moves to another proxy after a proxy failed or was blocked.
    pub rotations: u64,
    /// Repeats after the site failed or rate-limited.
    pub target_retries: u64,
    /// Attempts sent without a proxy.
    pub direct: u64,
    /// Attempts that failed at the proxy.
    pub proxy_failures: u64,
    /// Attempts a site blocked (403, captcha pages).
    pub blocks: u64,
    /// Attempts a site rate-limited (429, 503).
    pub rate_limits: u64,
    /// Distinct proxies used.
    pub proxies_used: u64,
    /// Distinct proxies that failed at least once (retired for a while).
    pub proxies_failed: u64,
    /// Proxies resting now.
    pub proxies_cooling: u64,
    /// Proxies carrying a request now.
    pub proxies_busy: u64,
    /// Distinct proxies each site blocked.
    pub banned_by_site: BTreeMap<String, u64>,
}

/// How long a (proxy, site) pair rests after a 429 or 503 that gave no
/// Retry-After.
const RATE_LIMIT_REST: Duration = Duration::from_secs(30);
/// How long a (proxy, site) pair rests after a bare 403: shorter than a
/// ban, since the refusal may be the page's, not the proxy's.
const REFUSAL_REST: Duration = Duration::from_secs(120);
/// Proxies refused alike (bare 403) before the answer is the page.
const REFUSAL_QUORUM: u32 = 3;
/// Sticky sessions kept.
const MAX_SESSIONS: usize = 100_000;
/// Sites whose bans are counted for the stats.
const MAX_BAN_SITES: usize = 1024;
/// A proxy that carried one of a site's last this many requests is taken
/// for that site again only when no other can: one site's requests spread
/// over proxies, so that no proxy address runs into a per-address rate
/// limit while the site as a whole is paced politely.
const RECENT_PER_SITE: usize = 4;
/// Sites whose recent proxies are remembered.
const MAX_RECENT_SITES: usize = 4096;
/// Proxies saying a target cannot be reached before the pool believes it.
const UNREACHED_QUORUM: u32 = 3;
/// Proxies in a row timing out on one URL before the site is taken to be
/// slow or silent: the request ends, and none of them is blamed.
const TIMEOUT_QUORUM: usize = 2;
/// How long a first pick waits for a store-backed pool's first load.
const FIRST_LOAD_WAIT: Duration = Duration::from_secs(30);
/// Longest sleep between looks for a usable proxy while waiting.
const WAIT_TICK: Duration = Duration::from_millis(250);
/// A site's learned gap between requests through one proxy shorter than
/// this is not kept (it has all but decayed away).
const MIN_SITE_GAP: Duration = Duration::from_millis(5);

struct Session {
    id: i64,
    uses: u32,
    since: Instant,
}

#[derive(Default)]
struct State {
    usage: HashMap<i64, Usage>,
    sessions: HashMap<String, Session>,
    last_rr: i64,
    failed: HashSet<i64>,
    bans: HashMap<String, HashSet<i64>>,
    /// The proxies that last carried a request to each site, newest last.
    recent: HashMap<String, VecDeque<i64>>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    pages: AtomicU64,
    failed: AtomicU64,
    attempts: AtomicU64,
    rotations: AtomicU64,
    target_retries: AtomicU64,
    direct: AtomicU64,
    proxy_failures: AtomicU64,
    blocks: AtomicU64,
    rate_limits: AtomicU64,
}

/// What every handle of one pool shares: the proxies' use (in-flight
/// counts, cooldowns, sessions, who carried a site's last requests), the
/// line of requests waiting for a slot, the connections kept to proxies and
/// the limits that hold for all clients together.
struct Shared {
    feedback: Feedback,
    client: Client,
    state: Mutex<State>,
    /// Wakes every waiter: a proxy indexed.
    changed: Notify,
    /// Wakes the longest waiting request when a slot frees (`Notify`
    /// wakes its oldest waiter first): requests waiting for a busy proxy
    /// are served in the order they came.
    slot_freed: Notify,
    /// Requests waiting for a slot now; while there are any, a new request
    /// queues behind them rather than taking the next free slot itself.
    slot_waiters: AtomicU64,
    /// Counts slots freed, so that a waiter woken for a slot it cannot
    /// use passes the turn on once, not back and forth.
    releases: AtomicU64,
    /// True once a store-backed pool loaded the store (always for live
    /// pools).
    loaded: watch::Sender<bool>,
    load_error: Mutex<Option<String>>,
    refresher: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Requests and tunnels through one proxy at once, for every client of
    /// the pool together.
    max_in_flight: u32,
    /// A failed proxy's first rest, and its longest.
    cooldown: Duration,
    max_cooldown: Duration,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.refresher).take() {
            task.abort();
        }
    }
}

/// One client's handle on the shared pool: its own options and counters.
struct Inner {
    shared: Arc<Shared>,
    opts: PoolOptions,
    user_agent: http::HeaderValue,
    counters: Counters,
}

/// A cheap, cloneable handle to a rotating fetch pool. See the [module
/// documentation](self) for an example.
#[derive(Clone)]
pub struct Pool {
    inner: Arc<Inner>,
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("index", self.inner.shared.feedback.index())
            .field("strategy", &self.inner.opts.strategy)
            .finish()
    }
}

/// A proxy handed to one request (or one tunnel); its in-flight slot
/// frees on drop.
pub struct Lease {
    shared: Arc<Shared>,
    entry: Arc<Entry>,
    /// When it was handed out.
    taken: Instant,
}

impl Lease {
    /// The proxy's id in the store.
    pub fn id(&self) -> i64 {
        self.entry.id
    }

    /// The proxy.
    pub fn proxy(&self) -> &Proxy {
        &self.entry.proxy
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease").field("id", &self.entry.id).finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        if let Some(u) = st.usage.get_mut(&self.entry.id) {
            u.in_flight = u.in_flight.saturating_sub(1);
        }
        drop(st);
        self.shared.releases.fetch_add(1, Ordering::Relaxed);
        self.shared.slot_freed.notify_one();
    }
}

/// What a caller of [`Pool::take`] wants of one proxy.
#[derive(Clone, Copy, Debug)]
pub struct Want<'a> {
    /// The filters (instead of [`PoolOptions::query`]).
    pub query: &'a ProxyQuery,
    /// A sticky session: the same proxy until it fails or expires.
    pub session: Option<&'a str>,
    /// The site the proxy will reach (see [`site_of`]): proxies it banned
    /// are left out.
    pub site: &'a str,
    /// True when the proxy must tunnel (HTTP proxies need CONNECT).
    pub https: bool,
}

/// How a use of a proxy from [`Pool::take`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Used {
    /// It carried the request (or opened the tunnel) in this long.
    Worked(Duration),
    /// The proxy failed.
    ProxyFailed(Reason),
    /// The site refused this proxy with `status`: a rate limit (429, 503
    /// without a ban page) rests the pair for `wait`, other refusals ban
    /// it (`page`: a captcha or ban page) or rest it (a bare status).
    Blocked {
        /// The site, as [`site_of`] names it.
        site: String,
        /// The status it answered.
        status: u16,
        /// A captcha or ban page, not a bare status.
        page: bool,
        /// Its `Retry-After`.
        wait: Option<Duration>,
    },
    /// The site failed on its own, or could not be reached.
    TargetError,
}

/// How one attempt (with its redirects) ended.
enum Outcome {
    Page(Answer, Url),
    ProxyFailure(Reason),
    Blocked {
        site: String,
        wait: Option<Duration>,
        /// A captcha or ban page, not a bare status.
        page: bool,
        answer: Answer,
        url: Url,
    },
    SiteError(Answer, Url),
    Unreached,
    TooLarge,
}

impl Pool {
    /// A pool on a live index: `feedback` is the daemon's feedback path,
    /// whose index the checker keeps current.
    pub fn new(feedback: Feedback, opts: PoolOptions) -> Result<Pool, PoolError> {
        Pool::build(feedback, opts, true)
    }

    /// The daemon's one pool on the live index behind `feedback`, with the
    /// caps `[pool]` sets for every client together; clients (the gateway,
    /// crawl jobs) take a [`Pool::client`] of it with their own options.
    pub fn shared(
        feedback: Feedback,
        config: &crate::config::PoolConfig,
    ) -> Result<Pool, PoolError> {
        Pool::new(
            feedback,
            PoolOptions {
                max_in_flight: config.max_per_proxy,
                ..PoolOptions::default()
            },
        )
    }

    /// A pool on the alive proxies of `store`, reloaded every
    /// [`PoolOptions::refresh_every`], so that a daemon checking the same
    /// store keeps it fresh. Must be called inside a tokio runtime; the
    /// first load runs in the background and the first request waits for it.
    pub fn from_store(store: &Store, opts: PoolOptions) -> Result<Pool, PoolError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| PoolError::NoRuntime)?;
        let feedback = Feedback::new(HealthIndex::new(), store.clone());
        let every = opts.refresh_every.max(Duration::from_millis(10));
        let pool = Pool::build(feedback, opts, false)?;
        let weak = Arc::downgrade(&pool.inner.shared);
        let store = store.clone();
        let task = handle.spawn(async move {
            loop {
                let loaded = store
                    .list_proxies(ProxyFilter {
                        status: Some(Status::Alive),
                        ..ProxyFilter::default()
                    })
                    .await;
                if !refresh(&weak, loaded) {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        *lock(&pool.inner.shared.refresher) = Some(task);
        Ok(pool)
    }

    fn build(feedback: Feedback, opts: PoolOptions, loaded: bool) -> Result<Pool, PoolError> {
        let tls =
            crate::net::tls::client_config(opts.extra_ca.as_deref(), crate::net::tls::ALPN_H1)?;
        let shared = Arc::new(Shared {
            feedback,
            client: Client::new(tls),
            state: Mutex::default(),
            changed: Notify::new(),
            slot_freed: Notify::new(),
            slot_waiters: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            loaded: watch::Sender::new(loaded),
            load_error: Mutex::new(None),
            refresher: Mutex::new(None),
            max_in_flight: opts.max_in_flight,
            cooldown: opts.cooldown,
            max_cooldown: opts.max_cooldown,
        });
        Pool::handle(shared, opts)
    }

    fn handle(shared: Arc<Shared>, opts: PoolOptions) -> Result<Pool, PoolError> {
        let user_agent = http::HeaderValue::from_str(&opts.user_agent)
            .map_err(|_| PoolError::UserAgent(opts.user_agent.clone()))?;
        Ok(Pool {
            inner: Arc::new(Inner {
                shared,
                opts,
                user_agent,
                counters: Counters::default(),
            }),
        })
    }

    /// Another client of the same pool, with options of its own (filters,
    /// strategy, timeouts, budgets, sessions, user agent, what to do
    /// without a proxy) and counters of its own. What holds for every
    /// client together comes from this pool and is not taken from `opts`:
    /// the proxies' in-flight cap (`max_in_flight`), cooldowns, sessions,
    /// the line of waiting requests, the extra TLS roots and the store
    /// refresh.
    pub fn client(&self, opts: PoolOptions) -> Result<Pool, PoolError> {
        Pool::handle(self.inner.shared.clone(), opts)
    }

    /// The options it runs with.
    pub fn options(&self) -> &PoolOptions {
        &self.inner.opts
    }

    /// The index it picks from.
    pub fn index(&self) -> &HealthIndex {
        self.inner.shared.feedback.index()
    }

    /// The feedback path it reports to.
    pub fn feedback(&self) -> &Feedback {
        &self.inner.shared.feedback
    }

    /// GETs `url`, retried on other proxies as the options allow.
    pub async fn get(&self, url: &str) -> Result<Page, FetchError> {
        let parsed = Url::parse(url).map_err(|e| FetchError::InvalidUrl {
            url: url.to_owned(),
            why: e.to_string(),
        })?;
        self.fetch(Request::new(parsed)?).await
    }

    /// Sends `req`: picks a proxy, fetches, classifies, reports, and moves
    /// on to another proxy or waits and repeats until a page comes or a
    /// budget is spent.
    pub async fn fetch(&self, req: Request) -> Result<Page, FetchError> {
        let c = &self.inner.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        let result = self.fetch_inner(&req).await;
        match &result {
            Ok(_) => c.pages.fetch_add(1, Ordering::Relaxed),
            Err(_) => c.failed.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    async fn fetch_inner(&self, req: &Request) -> Result<Page, FetchError> {
        let opts = &self.inner.opts;
        let c = &self.inner.counters;
        let started = Instant::now();
        let mut tried: HashSet<i64> = HashSet::new();
        let (mut attempts, mut rotations, mut retries, mut unreached) = (0u32, 0u32, 0u32, 0u32);
        let mut refusals = 0u32;
        // Proxies that timed out on this URL: slow themselves, or the site
        // is; the next proxy tells which.
        let mut timed_out: Vec<Lease> = Vec::new();
        let exhausted = |attempts, last: String, status| FetchError::Exhausted {
            attempts,
            last,
            status,
        };
        loop {
            let lease = match self.acquire(req, &tried, attempts).await {
                Ok(l) => l,
                Err(e) => {
                    self.timed_out(&mut timed_out, req).await;
                    return Err(e);
                }
            };
            attempts += 1;
            c.attempts.fetch_add(1, Ordering::Relaxed);
            if lease.is_none() {
                c.direct.fetch_add(1, Ordering::Relaxed);
            }
            let t0 = Instant::now();
            let outcome = self.attempt(lease.as_ref(), req).await;
            let id = lease.as_ref().map(|l| l.entry.id);
            if matches!(
                outcome,
                Outcome::Page(..) | Outcome::SiteError(..) | Outcome::Blocked { .. }
            ) {
                // The site answered this proxy: those that timed out were slow.
                self.timed_out(&mut timed_out, req).await;
            }
            match outcome {
                Outcome::Page(answer, final_url) => {
                    if let Some(l) = &lease {
                        self.worked(l, t0.elapsed()).await;
                    }
                    return Ok(self.page(req, answer, final_url, &lease, attempts, started));
                }
                Outcome::SiteError(answer, final_url) => {
                    if let Some(id) = id {
                        self.report(id, Verdict::TargetError, None).await;
                    }
                    if retries >= opts.target_retries {
                        return Ok(self.page(req, answer, final_url, &lease, attempts, started));
                    }
                    retries += 1;
                    c.target_retries.fetch_add(1, Ordering::Relaxed);
                    drop(lease);
                    tokio::time::sleep(backoff(opts.retry_backoff, retries)).await;
                }
                Outcome::ProxyFailure(reason) => {
                    let Some(l) = lease else {
                        c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                        return Err(exhausted(attempts, reason.to_string(), None));
                    };
                    tried.insert(l.entry.id);
                    if reason == Reason::Timeout {
                        timed_out.push(l);
                        if timed_out.len() >= TIMEOUT_QUORUM {
                            for l in timed_out.drain(..) {
                                self.report(l.entry.id, Verdict::TargetError, None).await;
                            }
                            return Err(FetchError::SiteTimeout { attempts });
                        }
                    } else {
                        c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                        self.failed(&l, reason).await;
                        self.tunnel_failed(&l, req).await;
                    }
                    if rotations >= opts.rotations {
                        self.timed_out(&mut timed_out, req).await;
                        return Err(exhausted(attempts, reason.to_string(), None));
                    }
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Blocked {
                    site,
                    wait,
                    page,
                    answer,
                    url,
                } => {
                    let status = answer.status;
                    // Rate limits (429, 503) rest the pair for their
                    // Retry-After and spend target retries; captcha and ban
                    // pages ban the pair, bare refusals (403) rest it, and
                    // both spend rotations.
                    let limited = !page && matches!(status.as_u16(), 429 | 503);
                    if let Some(id) = id {
                        if limited {
                            self.rate_limited(id, &site, wait, t0);
                        } else {
                            c.blocks.fetch_add(1, Ordering::Relaxed);
                            self.blocked(id, &site, page).await;
                            if !page {
                                refusals += 1;
                            }
                        }
                        tried.insert(id);
                    }
                    // Several proxies refused alike: the site means it for
                    // this URL (a private page), not for these proxies.
                    if refusals >= REFUSAL_QUORUM {
                        return Ok(self.page(req, answer, url, &lease, attempts, started));
                    }
                    let last = format!("blocked by {site} ({})", status.as_u16());
                    if limited {
                        if retries >= opts.target_retries {
                            return Err(exhausted(attempts, last, Some(status.as_u16())));
                        }
                        retries += 1;
                        c.target_retries.fetch_add(1, Ordering::Relaxed);
                    } else {
                        if rotations >= opts.rotations || lease.is_none() {
                            return Err(exhausted(attempts, last, Some(status.as_u16())));
                        }
                        rotations += 1;
                        c.rotations.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(lease);
                    let pause = match wait {
                        Some(w) if w > opts.max_retry_after => {
                            return Err(FetchError::RetryAfterTooLong(w));
                        }
                        Some(w) => w,
                        None if limited => backoff(opts.retry_backoff, retries),
                        None => Duration::ZERO,
                    };
                    tokio::time::sleep(pause).await;
                }
                Outcome::Unreached => {
                    unreached += 1;
                    let Some(l) = lease else {
                        return Err(FetchError::Unreachable { attempts });
                    };
                    self.report(l.entry.id, Verdict::TargetError, None).await;
                    self.tunnel_failed(&l, req).await;
                    tried.insert(l.entry.id);
                    if unreached >= UNREACHED_QUORUM || rotations >= opts.rotations {
                        return Err(FetchError::Unreachable { attempts });
                    }
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::TooLarge => {
                    return Err(FetchError::TooLarge {
                        attempts,
                        limit: opts.max_body,
                    });
                }
            }
        }
    }

    fn page(
        &self,
        req: &Request,
        answer: Answer,
        final_url: Url,
        lease: &Option<Lease>,
        attempts: u32,
        started: Instant,
    ) -> Page {
        Page {
            url: req.url.clone(),
            final_url,
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            carrier: match lease {
                Some(l) => Carrier::Proxy {
                    id: l.entry.id,
                    proxy: l.entry.proxy.clone(),
                },
                None => Carrier::Direct,
            },
            attempts,
            elapsed: started.elapsed(),
        }
    }

    /// One attempt through `lease` (or direct), following the redirects
    /// the request allows through the same proxy.
    async fn attempt(&self, lease: Option<&Lease>, req: &Request) -> Outcome {
        let opts = &self.inner.opts;
        let limits = Limits {
            connect: opts.connect_timeout,
            first_byte: opts.first_byte_timeout,
            total: opts.total_timeout,
            max_body: opts.max_body,
            user_agent: &self.inner.user_agent,
        };
        let proxy = lease.map(|l| (l.entry.id, &l.entry.proxy));
        let mut url = req.url.clone();
        let mut redirects = 0;
        loop {
            if let Some(p) = &req.pacer {
                // A long wait for the site's turn is spent before dialing,
                // not on an open connection the proxy may close.
                let early = p.ready_in(&url).saturating_sub(PRE_DIAL);
                if !early.is_zero() {
                    tokio::time::sleep(early).await;
                }
            }
            let pacer = req.pacer.as_deref();
            let answer = match self
                .inner
                .shared
                .client
                .get(proxy, &url, limits, pacer)
                .await
            {
                Ok(a) => a,
                Err(f) => {
                    if let Some(p) = &req.pacer {
                        p.answered(&url, None, None);
                    }
                    return match f {
                        Failure::Proxy(r) => Outcome::ProxyFailure(r),
                        Failure::BadEncoding => Outcome::ProxyFailure(Reason::ProtocolError),
                        Failure::Unreached => Outcome::Unreached,
                        Failure::TooLarge => Outcome::TooLarge,
                    };
                }
            };
            let class = opts.classifier.classify(
                answer.status,
                &answer.headers,
                &answer.body,
                answer.forward,
                answer.tls,
            );
            if let Some(p) = &req.pacer {
                let wait = classify::retry_after(&answer.headers, std::time::SystemTime::now());
                p.answered(&url, Some(answer.status), wait);
            }
            match class {
                Class::Page => {
                    if answer.status.is_redirection()
                        && redirects < opts.max_redirects
                        && let Some(next) = location(&url, &answer.headers)
                        && next != url
                        && match &req.follow {
                            Some(rule) => rule(&url, &next),
                            None => same_host(&url, &next),
                        }
                    {
                        redirects += 1;
                        url = next;
                        continue;
                    }
                    return Outcome::Page(answer, url);
                }
                Class::ProxyFailure(r) => return Outcome::ProxyFailure(r),
                Class::Blocked(wait, page) => {
                    return Outcome::Blocked {
                        site: site_of(&url),
                        wait,
                        page,
                        answer,
                        url,
                    };
                }
                Class::SiteError => return Outcome::SiteError(answer, url),
            }
        }
    }

    /// A proxy for an attempt of `req`, or `None` to go direct when the
    /// policy says so.
    async fn acquire(
        &self,
        req: &Request,
        tried: &HashSet<i64>,
        attempts: u32,
    ) -> Result<Option<Lease>, FetchError> {
        let want = Want {
            query: &self.inner.opts.query,
            session: req.session.as_deref(),
            site: &site_of(&req.url),
            https: req.url.scheme() == "https",
        };
        self.acquire_for(&want, tried, attempts, self.inner.opts.no_proxy)
            .await
    }

    /// A proxy for `want`, waiting as `policy` allows; `None` only under
    /// [`NoProxy::Direct`].
    async fn acquire_for(
        &self,
        want: &Want<'_>,
        tried: &HashSet<i64>,
        attempts: u32,
        policy: NoProxy,
    ) -> Result<Option<Lease>, FetchError> {
        let inner = &self.inner;
        let mut loaded = inner.shared.loaded.subscribe();
        if !*loaded.borrow() {
            let _ = tokio::time::timeout(FIRST_LOAD_WAIT, loaded.wait_for(|l| *l)).await;
        }
        let started = Instant::now();
        let give_up = |waited| FetchError::NoProxy {
            waited,
            attempts,
            hint: Some(match lock(&inner.shared.load_error).clone() {
                Some(e) => e,
                None => self.shortage(want, tried).to_string(),
            }),
        };
        // Our place in the line for slots, once we wait for one: kept
        // across looks so that a request keeps its turn.
        let mut turn: Option<Pin<Box<tokio::sync::futures::Notified<'_>>>> = None;
        let mut queued: Option<SlotWaiter<'_>> = None;
        // Requests already waiting for a slot go first: a new one joins the
        // line, without a look, unless more slots are free for it than
        // requests wait.
        let waits = matches!(policy, NoProxy::Wait(_) | NoProxy::Queue(_));
        let waiters = inner.shared.slot_waiters.load(Ordering::Relaxed);
        let mut skip =
            waits && waiters > 0 && self.shortage(want, tried).free_slots <= waiters as usize;
        if skip {
            queued = Some(SlotWaiter::new(&inner.shared.slot_waiters));
        }
        // Slots freed as of our last look, and whether a turn came since
        // for a slot freed after that look.
        let (mut looked_at, mut handed) = (0u64, false);
        loop {
            // Registered before looking, so an event meanwhile wakes us.
            let changed = inner.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if turn.is_none() && queued.is_some() {
                let mut t = Box::pin(inner.shared.slot_freed.notified());
                t.as_mut().enable();
                turn = Some(t);
            }
            let mut next_free = None;
            if !std::mem::take(&mut skip) {
                looked_at = inner.shared.releases.load(Ordering::Relaxed);
                let (lease, next) =
                    self.try_pick(want.query, want.session, want.site, want.https, tried);
                if let Some(lease) = lease {
                    // A turn given to us meanwhile goes on to the next in
                    // line as the registration drops.
                    return Ok(Some(lease));
                }
                next_free = next;
                if std::mem::take(&mut handed) {
                    // The slot we were woken for is not for us (other
                    // filters, or taken): the next in line may use it.
                    inner.shared.slot_freed.notify_one();
                }
            }
            let waited = started.elapsed();
            let bound = match policy {
                NoProxy::Direct => return Ok(None),
                NoProxy::Fail => return Err(give_up(waited)),
                NoProxy::Wait(bound) | NoProxy::Queue(bound) => bound,
            };
            if waited >= bound {
                return Err(give_up(waited));
            }
            let mut rest_ends = None;
            if queued.is_none() {
                let shortage = self.shortage(want, tried);
                // A matching proxy at its cap frees a slot soon: wait in
                // line for it.
                if shortage.busy > 0 {
                    queued = Some(SlotWaiter::new(&inner.shared.slot_waiters));
                    continue;
                }
                // A proxy resting after a failure, or resting for this site
                // (a rate limit's Retry-After), may come back in time.
                let deadline = started + bound;
                rest_ends = shortage.rest_ends.filter(|t| *t <= deadline);
                if let NoProxy::Queue(_) = policy
                    && next_free.is_none_or(|at| at > deadline)
                    && rest_ends.is_none()
                {
                    // Nothing will come free in time: say so now.
                    return Err(give_up(waited));
                }
            }
            let mut nap = (bound - waited).min(WAIT_TICK);
            for at in [next_free, rest_ends].into_iter().flatten() {
                nap = nap.min(at.saturating_duration_since(Instant::now()));
            }
            let sleep = tokio::time::sleep(nap);
            tokio::pin!(sleep);
            tokio::select! {
                _ = &mut sleep => {}
                _ = changed => {}
                _ = async {
                    match turn.as_mut() {
                        Some(t) => t.as_mut().await,
                        None => std::future::pending().await,
                    }
                } => {
                    turn = None;
                    // A slot freed before our last look was no use then
                    // either: the turn ends here rather than going round.
                    handed = inner.shared.releases.load(Ordering::Relaxed) > looked_at;
                }
            }
        }
    }

    /// Why no proxy can take a request for `want` now: how many match,
    /// and how many of those are busy, resting, banned for the site or
    /// tried already by this request.
    fn shortage(&self, want: &Want<'_>, tried: &HashSet<i64>) -> Shortage {
        let inner = &self.inner;
        let now = Instant::now();
        let mut s = Shortage {
            site: want.site.to_owned(),
            ..Shortage::default()
        };
        let matching = inner
            .shared
            .feedback
            .select(want.query, crate::store::now_ms());
        let st = lock(&inner.shared.state);
        for e in matching {
            if !fetch::can_carry(&e.proxy, e.https, want.https) {
                s.no_tunnel += 1;
                continue;
            }
            s.matching += 1;
            let usage = st.usage.get(&e.id);
            if tried.contains(&e.id) {
                s.tried += 1;
            } else if usage.is_some_and(|u| u.cooldown_until.is_some_and(|t| t > now)) {
                s.resting += 1;
            } else if let Some(until) = inner.shared.feedback.banned_until(e.id, want.site) {
                s.banned += 1;
                let until = Instant::from_std(until);
                s.rest_ends = Some(s.rest_ends.map_or(until, |t| t.min(until)));
            } else {
                let in_flight = usage.map_or(0, |u| u.in_flight);
                match inner.shared.max_in_flight.checked_sub(in_flight) {
                    Some(0) | None => s.busy += 1,
                    Some(free) => s.free_slots += free as usize,
                }
            }
        }
        s.max_in_flight = inner.shared.max_in_flight;
        s
    }

    /// A proxy for a caller that does its own I/O through it (the
    /// gateway): picked like [`Pool::fetch`]'s, under `want`'s filters and
    /// session, never one in `tried`; waits as [`PoolOptions::no_proxy`]
    /// says, except that it never goes direct. Report how the use ended
    /// with [`Pool::settle`].
    pub async fn take(&self, want: &Want<'_>, tried: &HashSet<i64>) -> Result<Lease, FetchError> {
        let c = &self.inner.counters;
        c.attempts.fetch_add(1, Ordering::Relaxed);
        let policy = match self.inner.opts.no_proxy {
            NoProxy::Direct => NoProxy::Fail,
            p => p,
        };
        match self.acquire_for(want, tried, 0, policy).await? {
            Some(lease) => Ok(lease),
            None => Err(FetchError::NoProxy {
                waited: Duration::ZERO,
                attempts: 0,
                hint: None,
            }),
        }
    }

    /// Learns from a use of a proxy from [`Pool::take`], exactly as from
    /// the pool's own fetches: a proxy failure cools it down and reports it
    /// on the feedback path, a block bans or rests the (proxy, site) pair, a
    /// target error costs the proxy nothing.
    pub async fn settle(&self, lease: &Lease, used: Used) {
        let c = &self.inner.counters;
        let id = lease.entry.id;
        match used {
            Used::Worked(latency) => {
                c.pages.fetch_add(1, Ordering::Relaxed);
                self.worked(lease, latency).await;
            }
            Used::ProxyFailed(reason) => {
                c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                self.failed(lease, reason).await;
            }
            Used::Blocked {
                site,
                status,
                page,
                wait,
            } => {
                if !page && matches!(status, 429 | 503) {
                    self.rate_limited(id, &site, wait, lease.taken);
                } else {
                    c.blocks.fetch_add(1, Ordering::Relaxed);
                    self.blocked(id, &site, page).await;
                }
            }
            Used::TargetError => self.report(id, Verdict::TargetError, None).await,
        }
    }

    /// Picks and reserves a proxy; otherwise says when the first cooldown
    /// ends.
    fn try_pick(
        &self,
        query: &ProxyQuery,
        session: Option<&str>,
        site: &str,
        https: bool,
        tried: &HashSet<i64>,
    ) -> (Option<Lease>, Option<Instant>) {
        let inner = &self.inner;
        let opts = &inner.opts;
        let index = inner.shared.feedback.index();
        let now = Instant::now();
        let now_ms = crate::store::now_ms();
        let mut st = lock(&inner.shared.state);
        let usable = |st: &State, e: &Entry| {
            !tried.contains(&e.id)
                && fetch::can_carry(&e.proxy, e.https, https)
                && st.usage.get(&e.id).is_none_or(|u| {
                    u.in_flight < inner.shared.max_in_flight
                        && u.cooldown_until.is_none_or(|t| t <= now)
                })
                && !inner.shared.feedback.is_banned(e.id, site)
        };
        let mut chosen = None;
        if let Some(key) = session
            && let Some(s) = st.sessions.get(key)
        {
            let fresh = s.uses < opts.session_uses && now - s.since < opts.session_age;
            let entry = index
                .get(s.id)
                .filter(|e| fresh && query.matches_entry(e, now_ms) && usable(&st, e));
            match entry {
                Some(e) => chosen = Some(e),
                None => {
                    st.sessions.remove(key);
                }
            }
        }
        if chosen.is_none() {
            let strategy = Bound {
                kind: opts.strategy,
                usage: &st.usage,
                last: st.last_rr,
            };
            // Through the feedback path, so the pool never takes a proxy
            // past the freshness window or one a burst made suspect.
            let recent = st.recent.get(site);
            chosen = inner.shared.feedback.pick(query, now_ms, &strategy, &|e| {
                !usable(&st, e) || recent.is_some_and(|r| r.contains(&e.id))
            });
            if chosen.is_none() && recent.is_some() {
                chosen = inner
                    .shared
                    .feedback
                    .pick(query, now_ms, &strategy, &|e| !usable(&st, e));
            }
            if let Some(e) = &chosen {
                st.last_rr = e.id;
            }
        }
        let Some(entry) = chosen else {
            let next = st
                .usage
                .values()
                .filter_map(|u| u.cooldown_until)
                .filter(|t| *t > now)
                .min();
            return (None, next);
        };
        let u = st.usage.entry(entry.id).or_default();
        u.in_flight += 1;
        u.uses += 1;
        if st.recent.len() >= MAX_RECENT_SITES && !st.recent.contains_key(site) {
            st.recent.clear();
        }
        let recent = st.recent.entry(site.to_owned()).or_default();
        if recent.len() >= RECENT_PER_SITE {
            recent.pop_front();
        }
        recent.push_back(entry.id);
        if let Some(key) = session {
            if st.sessions.len() >= MAX_SESSIONS {
                let age = opts.session_age;
                st.sessions.retain(|_, s| now - s.since < age);
            }
            if st.sessions.len() < MAX_SESSIONS || st.sessions.contains_key(key) {
                let s = st.sessions.entry(key.to_owned()).or_insert(Session {
                    id: entry.id,
                    uses: 0,
                    since: now,
                });
                s.uses += 1;
            }
        }
        drop(st);
        inner.shared.feedback.served(&entry, now_ms);
        // A site that rate-limits each address gets no more through this
        // proxy than it takes.
        let gap = inner.shared.feedback.site_gap(site);
        if gap >= MIN_SITE_GAP {
            inner.shared.feedback.rest(entry.id, site, gap);
        }
        (
            Some(Lease {
                shared: inner.shared.clone(),
                entry,
                taken: now,
            }),
            None,
        )
    }

    async fn worked(&self, lease: &Lease, latency: Duration) {
        {
            let mut st = lock(&self.inner.shared.state);
            let u = st.usage.entry(lease.entry.id).or_default();
            u.ok += 1;
            u.streak = 0;
            let ms = latency.as_secs_f64() * 1000.0;
            u.latency_ms = Some(match u.latency_ms {
                Some(prev) => prev * 0.7 + ms * 0.3,
                None => ms,
            });
        }
        self.report(lease.entry.id, Verdict::Worked, None).await;
    }

    /// The proxies of `timed_out` were slow themselves (another reached
    /// the site, or the request ended otherwise): each is charged the
    /// timeout.
    async fn timed_out(&self, timed_out: &mut Vec<Lease>, req: &Request) {
        for l in timed_out.drain(..) {
            self.inner
                .counters
                .proxy_failures
                .fetch_add(1, Ordering::Relaxed);
            self.failed(&l, Reason::Timeout).await;
            self.tunnel_failed(&l, req).await;
        }
    }

    async fn failed(&self, lease: &Lease, reason: Reason) {
        let id = lease.entry.id;
        {
            let shared = &self.inner.shared;
            let mut st = lock(&shared.state);
            st.failed.insert(id);
            let u = st.usage.entry(id).or_default();
            u.failed += 1;
            u.streak += 1;
            let factor = 2u32.saturating_pow(u.streak.saturating_sub(1).min(16));
            let rest = shared
                .cooldown
                .saturating_mul(factor)
                .min(shared.max_cooldown);
            u.cooldown_until = Some(Instant::now() + rest);
        }
        self.inner.shared.client.forget(id);
        tracing::debug!(id, %reason, "proxy failed in use");
        // Awaited: the proxy must leave the index before the next pick.
        if let Err(e) = self
            .inner
            .shared
            .feedback
            .report(id, Verdict::Failed(Some(reason)), None)
            .await
        {
            tracing::warn!(id, error = %e, "cannot record a proxy failure");
        }
    }

    /// `site` rate-limited proxy `id` (a request sent at `sent`): the pair
    /// rests for the Retry-After `wait` (or [`RATE_LIMIT_REST`]), and the
    /// site's gap between requests through one proxy widens.
    fn rate_limited(&self, id: i64, site: &str, wait: Option<Duration>, sent: Instant) {
        self.inner
            .counters
            .rate_limits
            .fetch_add(1, Ordering::Relaxed);
        let feedback = &self.inner.shared.feedback;
        feedback.rest(
            id,
            site,
            wait.unwrap_or(RATE_LIMIT_REST).max(Duration::from_secs(1)),
        );
        feedback.rate_limited(site, sent.into_std());
    }

    /// An https fetch through an HTTP proxy failed: the CONNECT tunnel may
    /// be what broke, so its HTTPS support is re-tested.
    async fn tunnel_failed(&self, lease: &Lease, req: &Request) {
        if req.url.scheme() != "https" || lease.entry.proxy.scheme != Scheme::Http {
            return;
        }
        if let Err(e) = self
            .inner
            .shared
            .feedback
            .tunnel_failed(lease.entry.id)
            .await
        {
            tracing::warn!(id = lease.entry.id, error = %e, "cannot ask for an https re-test");
        }
    }

    /// A site refused proxy `id`: a ban page bans the pair (reported on
    /// the feedback path), a bare refusal rests it for a while.
    async fn blocked(&self, id: i64, site: &str, page: bool) {
        {
            let mut st = lock(&self.inner.shared.state);
            if st.bans.len() < MAX_BAN_SITES || st.bans.contains_key(site) {
                st.bans.entry(site.to_owned()).or_default().insert(id);
            }
        }
        if page {
            self.report(id, Verdict::Blocked, Some(site)).await;
        } else {
            self.inner.shared.feedback.rest(id, site, REFUSAL_REST);
        }
    }

    /// Reports a verdict. A use that worked is only counted (the feedback
    /// path writes such counts together, off the request path); failures,
    /// blocks and target errors take effect before this returns.
    async fn report(&self, id: i64, verdict: Verdict, site: Option<&str>) {
        let feedback = &self.inner.shared.feedback;
        if verdict == Verdict::Worked {
            feedback.worked(id);
            return;
        }
        if let Err(e) = feedback.report(id, verdict, site).await {
            tracing::warn!(id, error = %e, "cannot record a proxy's use");
        }
    }

    /// What the pool has done so far.
    pub fn stats(&self) -> PoolStats {
        let c = &self.inner.counters;
        let now = Instant::now();
        let st = lock(&self.inner.shared.state);
        PoolStats {
            requests: c.requests.load(Ordering::Relaxed),
            pages: c.pages.load(Ordering::Relaxed),
            failed: c.failed.load(Ordering::Relaxed),
            attempts: c.attempts.load(Ordering::Relaxed),
            rotations: c.rotations.load(Ordering::Relaxed),
            target_retries: c.target_retries.load(Ordering::Relaxed),
            direct: c.direct.load(Ordering::Relaxed),
            proxy_failures: c.proxy_failures.load(Ordering::Relaxed),
            blocks: c.blocks.load(Ordering::Relaxed),
            rate_limits: c.rate_limits.load(Ordering::Relaxed),
            proxies_used: st.usage.values().filter(|u| u.uses > 0).count() as u64,
            proxies_failed: st.failed.len() as u64,
            proxies_cooling: st
                .usage
                .values()
                .filter(|u| u.cooldown_until.is_some_and(|t| t > now))
                .count() as u64,
            proxies_busy: st.usage.values().filter(|u| u.in_flight > 0).count() as u64,
            banned_by_site: st
                .bans
                .iter()
                .map(|(s, ids)| (s.clone(), ids.len() as u64))
                .collect(),
        }
    }

    /// True when proxy `id` is resting after a failure.
    pub fn is_cooling(&self, id: i64) -> bool {
        let now = Instant::now();
        lock(&self.inner.shared.state)
            .usage
            .get(&id)
            .and_then(|u| u.cooldown_until)
            .is_some_and(|t| t > now)
    }

    /// Requests through proxy `id` now.
    pub fn in_flight(&self, id: i64) -> u32 {
        lock(&self.inner.shared.state)
            .usage
            .get(&id)
            .map_or(0, |u| u.in_flight)
    }
}

/// Why no proxy could take a request: counts over the proxies that match
/// its filters (and are fresh), shown in the `no_proxy` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shortage {
    /// The site the request was for.
    pub site: String,
    /// Proxies matching the filters that can carry the request.
    pub matching: usize,
    /// Matching HTTP proxies left out because the target is https and
    /// they cannot tunnel.
    pub no_tunnel: usize,
    /// Of those matching: carrying their most requests at once.
    pub busy: usize,
    /// …resting after a failure in use.
    pub resting: usize,
    /// …banned or resting for this site.
    pub banned: usize,
    /// …already tried by this request.
    pub tried: usize,
    /// Requests the others could take now, together.
    pub free_slots: usize,
    /// When the first ban or rest for the site ends.
    pub rest_ends: Option<Instant>,
    /// Requests one proxy carries at once.
    pub max_in_flight: u32,
}

impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matching == 0 {
            f.write_str("no servable proxy matches the filters")?;
            if self.no_tunnel > 0 {
                write!(f, " ({} match but cannot tunnel https)", self.no_tunnel)?;
            }
            return Ok(());
        }
        write!(f, "{} proxies match the filters", self.matching)?;
        let mut parts = Vec::new();
        if self.busy > 0 {
            parts.push(format!(
                "{} at their cap of {} requests at once",
                self.busy, self.max_in_flight
            ));
        }
        if self.resting > 0 {
            parts.push(format!("{} resting after failures", self.resting));
        }
        if self.banned > 0 {
            parts.push(format!(
                "{} banned or resting for {}",
                self.banned, self.site
            ));
        }
        if self.tried > 0 {
            parts.push(format!("{} tried already for this request", self.tried));
        }
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        Ok(())
    }
}

/// A request counted among those waiting for a slot while it lives.
struct SlotWaiter<'a>(&'a AtomicU64);

impl<'a> SlotWaiter<'a> {
    fn new(count: &'a AtomicU64) -> SlotWaiter<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        SlotWaiter(count)
    }
}

impl Drop for SlotWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Replaces the index of the pool behind `weak` with `loaded`; false when
/// the pool is gone.
fn refresh(
    weak: &Weak<Shared>,
    loaded: Result<Vec<crate::store::ProxyRecord>, StoreError>,
) -> bool {
    let Some(shared) = weak.upgrade() else {
        return false;
    };
    match loaded {
        Ok(records) => {
            // Through the feedback path: a proxy that failed in use since
            // its last check is not put back on the strength of it.
            shared.feedback.reload(records);
            *lock(&shared.load_error) = None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot load proxies for the pool");
            *lock(&shared.load_error) = Some(format!("cannot load proxies: {e}"));
        }
    }
    shared.loaded.send_replace(true);
    shared.changed.notify_waiters();
    true
}

/// The site a ban applies to: the URL's host, with its port when it is
/// not the scheme's default.
pub fn site_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    }
}

/// Same host name and port; an upgrade from http's default port to
/// https's counts as the same.
fn same_host(from: &Url, to: &Url) -> bool {
    matches!(to.scheme(), "http" | "https")
        && from.host_str() == to.host_str()
        && (from.port() == to.port() || (from.port().is_none() && to.port().is_none()))
}

/// The redirect target of an answer, resolved against `base`.
fn location(base: &Url, headers: &HeaderMap) -> Option<Url> {
    let loc = headers.get(http::header::LOCATION)?.to_str().ok()?;
    let mut next = base.join(loc.trim()).ok()?;
    next.set_fragment(None);
    matches!(next.scheme(), "http" | "https").then_some(next)
}

/// `base × 2^(n-1)`, between half and all of it at random.
fn backoff(base: Duration, n: u32) -> Duration {
    let full = base.saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(16)));
    let full = full.min(Duration::from_secs(60));
    full.mul_f64(rand::rng().random_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_a_ceiling() {
        let base = Duration::from_millis(100);
        for n in 1..=4 {
            let full = base * 2u32.pow(n - 1);
            let b = backoff(base, n);
            assert!(b >= full / 2 && b <= full, "{n}: {b:?}");
        }
        assert!(backoff(base, 40) <= Duration::from_secs(60));
    }

    #[test]
    fn redirects_resolve_against_the_page() {
        let base = Url::parse("http://a.test/x/y?q=1").unwrap();
        let mut h = HeaderMap::new();
        h.insert(http::header::LOCATION, "../z#frag".parse().unwrap());
        assert_eq!(location(&base, &h).unwrap().as_str(), "http://a.test/z");
        h.insert(http::header::LOCATION, "mailto:x@y".parse().unwrap());
        assert_eq!(location(&base, &h), None);
        assert!(same_host(&base, &Url::parse("https://a.test/").unwrap()));
        assert!(!same_host(&base, &Url::parse("http://b.test/").unwrap()));
        assert!(!same_host(
            &base,
            &Url::parse("http://a.test:8080/").unwrap()
        ));
        assert_eq!(
            site_of(&Url::parse("http://127.0.0.1:8080/a").unwrap()),
            "127.0.0.1:8080"
        );
        assert_eq!(
            site_of(&Url::parse("https://Shop.Test/a").unwrap()),
            "shop.test"
        );
    }
}
