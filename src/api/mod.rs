//! The HTTP API (axum): serving proxies from the health index, listings and
//! exports, client reports, stats, sources, metrics, health and the judge.
//! Every error is JSON; a bearer token guards everything but `/healthz` and
//! `/judge` when configured.

mod answers;
mod error;
mod handlers;
pub mod judge;
pub mod metrics;
mod query;

pub use error::ApiError;

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use serde::Serialize;
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::check::Checker;
use crate::config::Config;
use crate::health::{Feedback, HealthIndex};
use crate::store::Store;
use metrics::Metrics;

/// What the daemon's rounds last did, for `/stats`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Rounds {
    /// The last harvest.
    pub last_harvest: Option<HarvestInfo>,
    /// The last check round.
    pub last_check: Option<CheckInfo>,
}

/// A harvest round in `/stats`.
#[derive(Clone, Debug, Serialize)]
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
#[derive(Clone, Debug, Serialize)]
pub struct CheckInfo {
    /// When it finished (RFC 3339).
    pub finished_at: String,
    /// Proxies checked.
    pub checked: u64,
    /// Alive.
    pub alive: u64,
    /// Dead.
    pub dead: u64,
    /// Duration in milliseconds.
    pub duration_ms: u64,
}

/// Everything a request may need: cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The durable store (listings of non-alive proxies, reports, stats).
    pub store: Store,
    /// Verdicts on proxies, and the index of alive ones for serving
    /// without SQLite.
    pub feedback: Feedback,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The checker of the latest round, for `verify=true`.
    checker: Arc<tokio::sync::watch::Sender<Option<Arc<Checker>>>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The last rounds.
    pub rounds: Arc<Mutex<Rounds>>,
    /// Rendered `/proxy` answers.
    answers: Arc<answers::Answers>,
    judge_limiter: Arc<DefaultKeyedRateLimiter<IpAddr>>,
    judge_calls: Arc<AtomicU64>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("feedback", &self.feedback)
            .finish()
    }
}

impl AppState {
    /// State over an opened store, reporting verdicts through `feedback`.
    pub fn new(store: Store, feedback: Feedback, config: Arc<Config>) -> AppState {
        let per_minute = NonZeroU32::new(config.api.judge_per_minute).unwrap_or(NonZeroU32::MIN);
        AppState {
            store,
            feedback,
            checker: Arc::new(tokio::sync::watch::Sender::new(None)),
            metrics: Arc::new(Metrics::new()),
            rounds: Arc::default(),
            answers: Arc::default(),
            judge_limiter: Arc::new(RateLimiter::keyed(Quota::per_minute(per_minute))),
            judge_calls: Arc::default(),
            config,
        }
    }

    /// The checker for `verify=true`, once a round has prepared one.
    pub fn set_checker(&self, checker: Arc<Checker>) {
        self.checker.send_replace(Some(checker));
    }

    /// Records what a round did, for `/stats`.
    pub fn record_round(&self, update: impl FnOnce(&mut Rounds)) {
        update(&mut self.rounds.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// The index of alive proxies.
    pub fn index(&self) -> &HealthIndex {
        self.feedback.index()
    }

    /// The current checker; right after start-up, when the first one is
    /// still being prepared, waits for it up to `wait`.
    async fn checker(&self, wait: std::time::Duration) -> Option<Arc<Checker>> {
        let mut rx = self.checker.subscribe();
        let ready = tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(checker)) => checker.clone(),
            _ => None,
        }
    }
}

/// The router with every route and layer.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/proxy", get(handlers::proxy))
        .route("/proxies", get(handlers::proxies))
        .route("/proxies/{id}/report", post(handlers::report))
        .route("/export", get(handlers::export))
        .route("/stats", get(handlers::stats))
        .route("/sources", get(handlers::sources))
        .route("/metrics", get(handlers::metrics))
        .route("/healthz", get(handlers::healthz))
        .route("/judge", get(judge_route))
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
        .with_state(state)
}

/// Serves `router(state)` on an already bound listener until `shutdown`
/// is cancelled, then drains open requests.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(
        listener,
        router(state).into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown.cancelled_owned())
    .await
}

/// `/judge`, unless switched off; rate-limited per client address.
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
    if state.judge_limiter.check_key(&info.0.ip()).is_err() {
        return ApiError::TooManyRequests.into_response();
    }
    // Forget idle clients now and then so the limiter's memory stays small.
    if state.judge_calls.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
        state.judge_limiter.retain_recent();
    }
    judge::judge(info, method, uri, headers)
        .await
        .into_response()
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
/// except on `/healthz` and `/judge`.
async fn authorize(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.config.api.token else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/healthz" || path == "/judge" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    if bool::from(presented.as_bytes().ct_eq(token.0.as_bytes())) {
        next.run(req).await
    } else {
        ApiError::Unauthorized.into_response()
    }
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
