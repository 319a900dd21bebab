//! The HTTP API (axum): serving proxies from the health index, listings and
//! exports, client reports, stats, sources, metrics, health and the judge,
//! the operator's dashboard at `/` and the OpenAPI document. Every error is
//! JSON (the dashboard's pages excepted); a bearer token (or the dashboard's
//! session) guards everything but `/healthz`, `/judge` and `/openapi.json`
//! when configured.

mod answers;
pub mod browse;
mod browser;
pub mod conditions;
pub mod counted;
mod crawls;
pub mod dashboard;
mod error;
mod handlers;
pub mod judge;
pub mod metrics;
pub mod openapi;
mod query;
mod rounds;
pub mod schema;
pub mod server;

pub use error::ApiError;
pub use rounds::LastRounds;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use crate::crawl::jobs::CrawlJobs;
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Serialize;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::AuthFailures;
use crate::config::{Config, Live};
use crate::gateway::GatewayMetrics;
use crate::health::{Feedback, HealthIndex};
use crate::pool::Verifier;
use crate::store::Store;
use metrics::Metrics;

/// What the daemon's rounds last did, for `/stats`.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct Rounds {
    /// The last harvest.
    pub last_harvest: Option<HarvestInfo>,
    /// The last check round.
    pub last_check: Option<CheckInfo>,
}

/// A harvest round in `/stats`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct HarvestInfo {
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// Sources fetched.
    pub sources: usize,
    /// Of those, failed.
    pub failed: usize,
    /// Distinct proxies listed.
    pub distinct: i64,
    /// New proxies.
    pub new: usize,
    /// Duration in milliseconds.
    pub duration_ms: u64,
}

/// A check round in `/stats`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct CheckInfo {
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// Proxies checked.
    pub checked: u64,
    /// Alive.
    pub alive: u64,
    /// Dead.
    pub dead: u64,
    /// Checks of alive proxies whose failure no second healthy judge
    /// could confirm: they kept their status and are due again soon.
    pub unconfirmed: u64,
    /// Duration in milliseconds.
    pub duration_ms: u64,
}

/// What the API serves from: the service's parts the daemon built (see
/// `daemon::Service`), shared with the components that keep them.
#[derive(Clone)]
pub struct Served {
    /// The durable store (listings of non-alive proxies, reports, stats).
    pub store: Store,
    /// Verdicts on proxies, and the index of alive ones for serving
    /// without the database.
    pub feedback: Feedback,
    /// The configuration the daemon started with.
    pub config: Arc<Config>,
    /// The configuration in force (the token and allowed hosts follow a
    /// reload).
    pub live: Live,
    /// `verify=true`'s checks, a client of the shared pool.
    pub verifier: Verifier,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// What the last rounds did.
    pub rounds: LastRounds,
    /// Crawl jobs (`/crawls`), run by the daemon.
    pub crawls: CrawlJobs,
    /// The gateway's counters, when it runs, for `/stats` and `/metrics`.
    pub gateway: Option<Arc<GatewayMetrics>>,
    /// What is degraded now, for `/healthz`.
    pub conditions: Arc<conditions::Conditions>,
    /// Wrong tokens per client address: the bearer token's, the
    /// dashboard login's and (in `serve`) the gateway's.
    pub auth: Arc<AuthFailures>,
}

/// Everything a request may need: what it serves from and the API's own
/// limiters and caches. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The durable store (listings of non-alive proxies, reports, stats).
    pub store: Store,
    /// Verdicts on proxies, and the index of alive ones for serving
    /// without SQLite.
    pub feedback: Feedback,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// `verify=true`'s checks.
    verifier: Verifier,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The last rounds.
    pub rounds: LastRounds,
    /// Crawl jobs (`/crawls`).
    pub crawls: CrawlJobs,
    /// Rendered `/proxy` answers.
    answers: Arc<answers::Answers>,
    /// `/judge` calls per client network (see [`client_network`]).
    judge_limiter: Arc<DefaultKeyedRateLimiter<IpAddr>>,
    judge_calls: Arc<AtomicU64>,
    /// The gateway's counters, when it runs, for `/stats` and `/metrics`.
    pub gateway: Option<Arc<GatewayMetrics>>,
    /// What is degraded now, for `/healthz`.
    pub conditions: Arc<conditions::Conditions>,
    /// The configuration in force; `config` stays the one the daemon
    /// started with, for what needs a restart to change.
    live: Live,
    /// What signs the dashboard's sessions and forms, with the token in
    /// force.
    dashboard_keys: Arc<Mutex<Arc<dashboard::Keys>>>,
    /// Wrong tokens per client address.
    pub auth: Arc<AuthFailures>,
    /// The store's counts for `/stats`, `/sources` and the dashboard.
    pub counted: Arc<counted::Counted>,
    /// The latest store presence the empty pool's 404 read, with the
    /// rounds ended then.
    presence: Arc<Mutex<Option<(u64, crate::store::Presence)>>>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("feedback", &self.feedback)
            .finish()
    }
}

impl AppState {
    /// The API's state over what it serves from, with its own limiter
    /// (`/judge`) and caches.
    pub fn new(served: Served) -> AppState {
        let Served {
            store,
            feedback,
            config,
            live,
            verifier,
            metrics,
            rounds,
            crawls,
            gateway,
            conditions,
            auth,
        } = served;
        let per_minute = NonZeroU32::new(config.api.judge_per_minute).unwrap_or(NonZeroU32::MIN);
        let token = live.get().api.token.as_ref().map(|t| t.0.clone());
        let counted = Arc::new(counted::Counted::new(
            store.clone(),
            rounds.clone(),
            counted::LIVE_BELOW,
        ));
        AppState {
            counted,
            presence: Arc::default(),
            crawls,
            store,
            feedback,
            verifier,
            metrics,
            rounds,
            answers: Arc::default(),
            judge_limiter: Arc::new(RateLimiter::keyed(Quota::per_minute(per_minute))),
            judge_calls: Arc::default(),
            gateway,
            conditions,
            auth,
            live,
            dashboard_keys: Arc::new(Mutex::new(Arc::new(dashboard::Keys::new(token.as_deref())))),
            config,
        }
    }

    /// The configuration in force: the one the daemon started with, or
    /// the last one a reload applied.
    pub fn live_config(&self) -> Arc<Config> {
        self.live.get()
    }

    /// What signs the dashboard's sessions and forms now: new keys once
    /// a reload changed the token, so a changed token ends every
    /// dashboard session.
    fn dashboard_keys(&self) -> Arc<dashboard::Keys> {
        let config = self.live_config();
        let token = config.api.token.as_ref().map(|t| t.0.as_str());
        let mut keys = crate::lock(&self.dashboard_keys);
        if !keys.signs_for(token) {
            *keys = Arc::new(dashboard::Keys::new(token));
        }
        keys.clone()
    }

    /// The same state with counting done afresh for every answer only
    /// while it takes under `live_below` (see [`counted`]).
    pub fn counting_live_below(mut self, live_below: std::time::Duration) -> AppState {
        self.counted = Arc::new(counted::Counted::new(
            self.store.clone(),
            self.rounds.clone(),
            live_below,
        ));
        self
    }

    /// How many proxies can be served now (see [`servable`]).
    pub fn servable(&self) -> usize {
        servable(&self.feedback, &self.config)
    }

    /// The index of alive proxies.
    pub fn index(&self) -> &HealthIndex {
        self.feedback.index()
    }
}

/// How many proxies can be served now: alive, proven (by a check or a use
/// that worked) within `api.max_age` and within the freshness window while
/// one is in force. `/proxy`, `/export`, `/stats`, `/metrics` and the
/// dashboard's snapshots all count by this rule.
pub fn servable(feedback: &Feedback, config: &Config) -> usize {
    let q = crate::health::ProxyQuery {
        max_age: Some(config.api.max_age),
        ..crate::health::ProxyQuery::default()
    };
    feedback.count(&q, crate::store::now_ms())
}

/// The router with every route and layer.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/proxy", get(handlers::proxy))
        .route("/proxies", get(handlers::proxies))
        .route("/proxies/browse", get(browse::browse))
        .route("/proxies/{id}/report", post(handlers::report))
        .route("/export", get(handlers::export))
        .route("/stats", get(handlers::stats))
        .route("/sources", get(handlers::sources))
        .route("/crawls", get(crawls::list).post(crawls::start))
        .route("/crawls/{id}", get(crawls::show).delete(crawls::cancel))
        .route("/crawls/{id}/pages", get(crawls::pages))
        .route("/metrics", get(handlers::metrics))
        .route("/healthz", get(handlers::healthz))
        .route("/judge", get(judge_route))
        .route("/openapi.json", get(openapi::openapi_json))
        .route_layer(middleware::from_fn(browser::refuse_cross_site))
        .route_layer(middleware::from_fn(require_json))
        // The dashboard's forms are form-encoded, guarded by their own
        // check of origin and CSRF token instead.
        .merge(dashboard::routes())
        .fallback(handlers::not_found)
        .method_not_allowed_fallback(handlers::method_not_allowed)
        // Route-level so the matched route is known; unmatched requests are
        // counted by the fallback.
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            count_requests,
        ))
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .layer(middleware::from_fn_with_state(state.clone(), limit_time))
        .layer(middleware::from_fn(envelope))
        .with_state(state)
}

/// The longest request target read (path and query), in bytes.
pub const MAX_URI: usize = 8 * 1024;

/// The most header bytes (names and values) read per request.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// The most header fields read per request (hyper's own limit is 100).
pub const MAX_HEADERS: usize = 100;

/// The outermost layer: refuses oversized URIs and headers, puts every
/// error that did not come from an [`ApiError`] (axum's rejections) into the
/// JSON envelope, and answers `/proxy?format=text` errors as plain text.
async fn envelope(req: Request, next: Next) -> Response {
    let text = wants_text(req.uri());
    let uri_len = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    let header_bytes: usize = req
        .headers()
        .iter()
        .map(|(n, v)| n.as_str().len() + v.len())
        .sum();
    let resp = if uri_len > MAX_URI {
        ApiError::UriTooLong(MAX_URI).into_response()
    } else if header_bytes > MAX_HEADER_BYTES || req.headers().len() > MAX_HEADERS {
        ApiError::HeadersTooLarge(MAX_HEADER_BYTES, MAX_HEADERS).into_response()
    } else {
        next.run(req).await
    };
    let status = resp.status();
    if !status.is_client_error() && !status.is_server_error() {
        return resp;
    }
    let resp = match resp.extensions().get::<error::Enveloped>() {
        Some(_) => resp,
        None => foreign_error(resp).await,
    };
    if text { as_text(resp) } else { resp }
}

/// True for `/proxy` asked with `format=text`: its errors are text too, as
/// a client reading one line of text expects.
fn wants_text(uri: &axum::http::Uri) -> bool {
    uri.path() == "/proxy"
        && url::form_urlencoded::parse(uri.query().unwrap_or("").as_bytes())
            .any(|(k, v)| k == "format" && v.trim().eq_ignore_ascii_case("text"))
}

/// An error response made below the handlers, in the envelope: its status,
/// and its body as the message when that is short text.
async fn foreign_error(resp: Response) -> Response {
    let (parts, body) = resp.into_parts();
    let bytes = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, 1024))
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let message = std::str::from_utf8(&bytes)
        .map(str::trim)
        .ok()
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .unwrap_or_else(|| {
            parts
                .status
                .canonical_reason()
                .unwrap_or("error")
                .to_lowercase()
        });
    let mut enveloped = ApiError::Other {
        status: parts.status,
        message,
    }
    .into_response();
    // Keep what the original said besides its body (e.g. Allow).
    for (name, value) in &parts.headers {
        if name != axum::http::header::CONTENT_TYPE && name != axum::http::header::CONTENT_LENGTH {
            enveloped.headers_mut().insert(name.clone(), value.clone());
        }
    }
    enveloped
}

/// An enveloped error as `text/plain`: its message on one line, with the
/// same status and headers.
fn as_text(resp: Response) -> Response {
    let Some(error::Enveloped(message)) = resp.extensions().get::<error::Enveloped>().cloned()
    else {
        return resp;
    };
    let (mut parts, _) = resp.into_parts();
    parts.headers.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    parts.headers.remove(axum::http::header::CONTENT_LENGTH);
    Response::from_parts(parts, axum::body::Body::from(format!("{message}\n")))
}

/// Serves `router(state)` on an already bound listener until `shutdown`
/// is cancelled, then drains open requests. Connections are bounded by
/// `api.header_timeout`, `api.idle_timeout` and `api.max_connections` (see
/// [`server`]).
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let limits = server::Limits::from(&state.config.api);
    state.counted.follow(shutdown.clone());
    server::run(listener, router(state), limits, shutdown).await
}

/// `/judge`, unless switched off; rate-limited per client address.
#[utoipa::path(get, path = "/judge", tag = "meta", security(()),
    responses((status = 200, description = "The request as this daemon saw it", body = judge::JudgeAnswer),
        schema::Errors))]
async fn judge_route(
    State(state): State<AppState>,
    info: axum::extract::ConnectInfo<SocketAddr>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
) -> Response {
    if !state.config.api.judge {
        return ApiError::Disabled("the judge is switched off (api.judge = false)".into())
            .into_response();
    }
    if let Err(not_until) = state.judge_limiter.check_key(&client_network(info.0.ip())) {
        let wait =
            not_until.wait_time_from(governor::clock::Clock::now(state.judge_limiter.clock()));
        return ApiError::TooManyRequests {
            // Whole seconds, rounded up: a client that waits this long gets through.
            retry_after: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        }
        .into_response();
    }
    // Forget idle clients now and then so the limiter's memory stays small.
    if state.judge_calls.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
        state.judge_limiter.retain_recent();
    }
    judge::judge(info, method, uri, headers)
        .await
        .into_response()
}

/// The network a client address counts for in rate limits: its /24 for
/// IPv4, its /64 for IPv6 (one customer's usual allocation), so that rotating
/// through the addresses one holds does not multiply the allowance.
/// IPv4-mapped IPv6 addresses count as the IPv4 address.
pub fn client_network(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(Ipv4Addr::from(u32::from(v4) & 0xffff_ff00)),
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
    }
}

/// Answers 503 (in the JSON envelope) when a request outlasts
/// `api.request_timeout`.
async fn limit_time(State(state): State<AppState>, req: Request, next: Next) -> Response {
    match tokio::time::timeout(state.config.api.request_timeout, next.run(req)).await {
        Ok(resp) => resp,
        Err(_) => ApiError::Timeout.into_response(),
    }
}

/// Requires `Authorization: Bearer <token>` when a token is configured,
/// and without one a `Host` naming this machine (see [`check_host`]);
/// `/healthz` and `/judge`, which reveal nothing (and must answer monitors
/// and proxies by any name), and `/openapi.json` (what the guide says
/// too, for tools that read it before they are given the token) are open
/// either way. With a token, a browser
/// logged in to the dashboard may instead show its session cookie: for
/// reading (GET and HEAD) and for the dashboard's own forms, which check a
/// CSRF token; the dashboard's page and login form answer without either
/// (the page then shows only the login form). How a request was let in
/// goes to the handlers as a [`dashboard::Access`].
async fn authorize(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    use dashboard::Access;
    let path = req.uri().path();
    if path == "/healthz" || path == "/judge" || path == "/openapi.json" {
        return next.run(req).await;
    }
    let config = state.live_config();
    let Some(token) = &config.api.token else {
        if let Err(e) = check_host(&req, &config.api) {
            return e.into_response();
        }
        req.extensions_mut().insert(Access::Open);
        return next.run(req).await;
    };
    let dashboard = path == "/" || path.starts_with("/dashboard/");
    let mut values = req
        .headers()
        .get_all(axum::http::header::AUTHORIZATION)
        .iter();
    let (first, second) = (values.next(), values.next());
    if second.is_some() {
        return ApiError::BadRequest("more than one Authorization header".into()).into_response();
    }
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0.ip());
    let access = match first {
        Some(value) => {
            if let Some(wait) = peer.and_then(|ip| state.auth.locked(ip)) {
                return ApiError::TooManyRequests {
                    retry_after: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
                }
                .into_response();
            }
            let presented = bearer_token(value.as_bytes()).unwrap_or(b"");
            if !bool::from(presented.ct_eq(token.0.as_bytes())) {
                if let Some(ip) = peer {
                    state.auth.failed(ip, "api");
                }
                return ApiError::Unauthorized.into_response();
            }
            Access::Bearer
        }
        None => match dashboard::session::session_cookie(req.headers()).filter(|c| {
            state
                .dashboard_keys()
                .valid_session(c, crate::store::now_ms())
        }) {
            Some(cookie) => Access::Session(cookie),
            None => Access::Anonymous,
        },
    };
    let reading = matches!(
        *req.method(),
        axum::http::Method::GET | axum::http::Method::HEAD
    );
    let allowed = match access {
        Access::Session(_) => reading || dashboard,
        Access::Anonymous => dashboard,
        Access::Open | Access::Bearer => true,
    };
    if !allowed {
        return ApiError::Unauthorized.into_response();
    }
    req.extensions_mut().insert(access);
    next.run(req).await
}

/// Without a token, the API is open to whatever can reach it, and a web
/// page can reach loopback: after DNS rebinding (its own name re-pointed at
/// 127.0.0.1) the browser lets it read the answers, since they look
/// same-origin. Such requests carry the page's name in `Host`, so only
/// names of this machine are answered: `localhost`, loopback addresses,
/// the listen address and `api.allowed_hosts`. Clients that send no
/// `Host` (HTTP/1.0) are not browsers and pass.
fn check_host(req: &Request, api: &crate::config::ApiConfig) -> Result<(), ApiError> {
    let mut values = req.headers().get_all(axum::http::header::HOST).iter();
    let (first, second) = (values.next(), values.next());
    if second.is_some() {
        return Err(ApiError::BadRequest("more than one Host header".into()));
    }
    // An absolute-form target carries the host in the URI, which then wins.
    let host = match (req.uri().authority(), first) {
        (Some(authority), _) => authority.host().to_owned(),
        (None, Some(value)) => match value.to_str() {
            Ok(v) => host_of(v).to_owned(),
            Err(_) => return Err(ApiError::BadRequest("the Host header is not text".into())),
        },
        (None, None) => return Ok(()),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let ip = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .ok()
        .map(|ip| ip.to_canonical());
    let allowed = host == "localhost"
        || ip.is_some_and(|ip| ip.is_loopback() || ip == api.listen.ip().to_canonical())
        || api.allowed_hosts.iter().any(|h| {
            *h == host
                || h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<IpAddr>()
                    .ok()
                    .zip(ip)
                    .is_some_and(|(a, b)| a.to_canonical() == b)
        });
    if allowed {
        return Ok(());
    }
    let shown: String = host.chars().take(100).collect();
    Err(ApiError::HostNotAllowed(format!(
        "this API answers requests for {shown:?} only with api.token set: without a token it \
         answers requests for localhost, a loopback address or {}, and the names listed in \
         api.allowed_hosts (so that a web page cannot read it through DNS rebinding)",
        api.listen.ip()
    )))
}

/// The host part of a `Host` value: without its port, an IPv6 address
/// with its brackets.
fn host_of(value: &str) -> &str {
    let value = value.trim();
    if value.starts_with('[') {
        return value.find(']').map_or(value, |end| &value[..=end]);
    }
    match value.rsplit_once(':') {
        Some((host, port)) if port.bytes().all(|b| b.is_ascii_digit()) => host,
        _ => value,
    }
}

/// Bodies are JSON, and must say so: a web page can send a `text/plain`,
/// form-encoded or untyped POST to any site without the browser asking the
/// site first (a "simple" cross-site request), but not an
/// `application/json` one. So POST, PUT and PATCH, and any other request
/// that carries a body, must be `application/json` (415 otherwise).
async fn require_json(req: Request, next: Next) -> Response {
    use axum::http::{Method, header};
    let method = req.method();
    if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let has_body = req.headers().contains_key(header::TRANSFER_ENCODING)
        || req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0");
    let takes_body = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if !has_body && !takes_body {
        return next.run(req).await;
    }
    let found = req.headers().get(header::CONTENT_TYPE);
    let essence = found
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim());
    if essence.is_some_and(|e| e.eq_ignore_ascii_case("application/json")) {
        return next.run(req).await;
    }
    let found = match found {
        None => "none was given".to_owned(),
        Some(v) => {
            let shown: String = String::from_utf8_lossy(v.as_bytes())
                .chars()
                .take(100)
                .collect();
            format!("found {shown:?}")
        }
    };
    ApiError::UnsupportedMediaType(format!(
        "the body must be JSON sent with Content-Type: application/json ({found})"
    ))
    .into_response()
}

/// The credentials of a `Bearer` Authorization value, exactly as sent. The
/// scheme is case-insensitive and separated by one or more spaces (RFC 9110
/// §11.4); nothing else is trimmed, so a token is compared as written.
fn bearer_token(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    let head = value.get(..SCHEME.len())?;
    if !head.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = &value[SCHEME.len()..];
    let start = rest.iter().position(|&b| b != b' ')?;
    Some(&rest[start..])
}

/// Counts requests by matched route and status.
async fn count_requests(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let resp = next.run(req).await;
    state
        .metrics
        .observe_request(&route, resp.status().as_u16());
    resp
}
