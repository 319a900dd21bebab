//! The rotating fetch pool: picks a proxy from the health index for each
//! request (by a strategy, with sticky sessions, per-proxy in-flight caps,
//! cooldowns and per-site bans), fetches through it, classifies the answer,
//! reports it on the one feedback path and retries on other proxies.
//!
//! ```no_run
//! use proxywarden::pool::{Pool, PoolOptions, SharedOptions};
//! use proxywarden::store::Store;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let store = Store::open("proxywarden.db".as_ref())?;
//! // Or `Pool::new(feedback, shared, opts)` on the daemon's live health index.
//! let pool = Pool::from_store(&store, SharedOptions::default(), PoolOptions::default())?;
//! let page = pool.get("http://example.com/a").await?; // retried on other proxies
//! println!("{} via {}", page.status(), page.proxy());
//! # Ok(())
//! # }
//! ```

mod attempt;
mod classify;
mod dial;
mod fetch;
mod http1;
mod learn;
mod refresh;
mod rotate;
#[cfg(test)]
mod rotate_tests;
#[cfg(test)]
mod rotation_props;
mod select;
mod strategy;
mod verify;

pub use classify::{Classifier, DEFAULT_BLOCK_PATTERNS, DEFAULT_PORTAL_PATTERNS};
pub use select::Shortage;
pub use strategy::StrategyKind;
pub use verify::{Verifier, VerifyError};

pub(crate) use dial::dial_failed;
pub(crate) use http1::{Body, Conn, ConnKey, keeps_alive};
pub(crate) use rotate::{Answered, Attempt, End, RateLimits, Rotated, Rotation, Tried};

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

use crate::health::{Entry, Feedback, HealthIndex, ProxyQuery};
use crate::model::{Block, Reason, UseVerdict};
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

/// How one client of a pool behaves (each [`Pool::client`] sets its own;
/// what the clients share is in [`SharedOptions`]). `Default` gives short
/// timeouts and the budgets the crawler uses.
#[derive(Clone, Debug)]
pub struct PoolOptions {
    /// Which proxies (the same filters as the API's).
    pub query: ProxyQuery,
    /// How one is chosen among those usable.
    pub strategy: StrategyKind,
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
}

/// What one pool holds for every client together, given once when it is
/// built ([`Pool::new`], [`Pool::shared`], [`Pool::from_store`]); a
/// [`Pool::client`] shares them and sets only its own [`PoolOptions`].
#[derive(Clone, Debug)]
pub struct SharedOptions {
    /// Requests and tunnels through one proxy at once, for every client of
    /// the pool together.
    pub max_in_flight: u32,
    /// How long a proxy that failed rests; doubled for each failure in a
    /// row, up to `max_cooldown`.
    pub cooldown: Duration,
    /// The longest rest.
    pub max_cooldown: Duration,
    /// Sticky sessions kept at once: a new session beyond it evicts the
    /// oldest, counted in [`SessionCounts::evicted`].
    pub max_sessions: usize,
    /// PEM roots trusted besides the built-in ones (private sites, tests).
    pub extra_ca: Option<PathBuf>,
    /// How often a pool made by [`Pool::from_store`] reloads the alive
    /// proxies from the store.
    pub refresh_every: Duration,
}

impl Default for SharedOptions {
    fn default() -> SharedOptions {
        SharedOptions {
            max_in_flight: 4,
            cooldown: Duration::from_secs(30),
            max_cooldown: Duration::from_secs(30 * 60),
            max_sessions: DEFAULT_MAX_SESSIONS,
            extra_ca: None,
            refresh_every: Duration::from_secs(30),
        }
    }
}

/// The caps `[pool]` sets for every client of the daemon's pool.
impl From<&crate::config::PoolConfig> for SharedOptions {
    fn from(config: &crate::config::PoolConfig) -> SharedOptions {
        SharedOptions {
            max_in_flight: config.max_per_proxy,
            max_sessions: config.max_sessions,
            ..SharedOptions::default()
        }
    }
}

/// The user agent unless one is given.
pub const DEFAULT_USER_AGENT: &str = concat!("proxywarden/", env!("CARGO_PKG_VERSION"));

impl Default for PoolOptions {
    fn default() -> PoolOptions {
        PoolOptions {
            query: ProxyQuery::default(),
            strategy: StrategyKind::default(),
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
    /// The request to `url` whose turn [`Pacer::wait`] granted last is
    /// being written only now: the time between requests counts from here.
    fn sent(&self, _url: &Url) {}
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

/// Proxies refused alike (bare 403) before the answer is the page.
const REFUSAL_QUORUM: u32 = 3;
/// Sticky sessions kept unless [`SharedOptions::max_sessions`] says
/// otherwise.
pub const DEFAULT_MAX_SESSIONS: usize = 100_000;
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
    /// Its place in [`State::session_order`].
    seq: u64,
}

/// The sticky sessions table: how full it is and what it let go to make
/// room.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionCounts {
    /// Sessions held now (some may have expired and wait to be dropped).
    pub open: u64,
    /// The most held at once ([`SharedOptions::max_sessions`]).
    pub max: u64,
    /// Live sessions dropped, oldest first, to make room for a new one:
    /// each such client moved to another proxy.
    pub evicted: u64,
}

#[derive(Default)]
struct State {
    usage: crate::health::IdMap<Usage>,
    sessions: HashMap<String, Session>,
    /// Session keys by creation, oldest first: who makes room for a new
    /// one when the table is full.
    session_order: BTreeMap<u64, String>,
    next_session: u64,
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
    /// Sticky sessions held at most, and how many were evicted.
    max_sessions: usize,
    sessions_evicted: AtomicU64,
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
    /// The site it was taken for (see [`site_of`]).
    site: String,
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

/// What a use of the pool wants of one proxy.
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

impl Pool {
    /// A pool on a live index: `feedback` is the daemon's feedback path,
    /// whose index the checker keeps current; `shared` holds for every
    /// client of it, `opts` for this handle.
    pub fn new(
        feedback: Feedback,
        shared: SharedOptions,
        opts: PoolOptions,
    ) -> Result<Pool, PoolError> {
        Pool::build(feedback, shared, opts, true)
    }

    /// The daemon's one pool on the live index behind `feedback`, with the
    /// caps `[pool]` sets for every client together; clients (the gateway,
    /// crawl jobs) take a [`Pool::client`] of it with their own options.
    pub fn shared(
        feedback: Feedback,
        config: &crate::config::PoolConfig,
    ) -> Result<Pool, PoolError> {
        Pool::new(feedback, config.into(), PoolOptions::default())
    }

    fn build(
        feedback: Feedback,
        shared: SharedOptions,
        opts: PoolOptions,
        loaded: bool,
    ) -> Result<Pool, PoolError> {
        let tls =
            crate::net::tls::client_config(shared.extra_ca.as_deref(), crate::net::tls::ALPN_H1)?;
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
            max_in_flight: shared.max_in_flight,
            cooldown: shared.cooldown,
            max_cooldown: shared.max_cooldown,
            max_sessions: shared.max_sessions.max(1),
            sessions_evicted: AtomicU64::new(0),
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
    /// client together (the [`SharedOptions`], the proxies' use and the
    /// line of waiting requests) is this pool's.
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

    /// The sticky sessions table (shared by every client of the pool).
    pub fn sessions(&self) -> SessionCounts {
        let shared = &self.inner.shared;
        SessionCounts {
            open: lock(&shared.state).sessions.len() as u64,
            max: shared.max_sessions as u64,
            evicted: shared.sessions_evicted.load(Ordering::Relaxed),
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

/// The site a ban applies to: the URL's host, with its port when it is
/// not the scheme's default.
pub fn site_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_owned(),
    }
}
