//! The operator's dashboard at `/`: one server-rendered page (HTML with
//! SVG charts, no script) of the pool now and over time, sources, judges,
//! checks, the gateway and crawl jobs, reloading itself; the login form
//! when `api.token` is set; and the forms that change something (cancel a
//! crawl job, log out), each guarded against cross-site posts.

mod charts;
mod format;
mod page;
pub mod session;
mod table;

use std::collections::VecDeque;
use std::net::SocketAddr;

use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Extension, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::Markup;

use super::{ApiError, AppState, CheckInfo};
use crate::store::now_ms;
pub use session::{Access, Keys};

/// Check rounds kept for the round-duration chart.
pub const ROUNDS_KEPT: usize = 60;

/// Crawl jobs shown, newest first.
const CRAWLS_SHOWN: usize = 20;

/// The largest form body read: a token or a CSRF field.
const MAX_FORM: usize = 4 * 1024;

/// The history buckets: 5 minutes over a day, 30 over a week (about 300
/// points each).
const DAY_BUCKET: i64 = 5 * 60_000;
const WEEK_BUCKET: i64 = 30 * 60_000;

/// The dashboard's routes. Its form posts are form-encoded, so they are
/// merged outside the API's JSON-only rule and carry their own guard
/// ([`session::same_origin`] and a CSRF token).
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(dashboard))
        .route("/dashboard/login", get(login_page).post(login))
        .route("/dashboard/logout", post(logout))
        .route("/dashboard/crawls/{id}/cancel", post(cancel))
}

/// Recent check rounds, newest last, at most [`ROUNDS_KEPT`].
#[derive(Debug, Default)]
pub struct RoundHistory(VecDeque<CheckInfo>);

impl RoundHistory {
    /// Adds a round that finished.
    pub fn push(&mut self, round: CheckInfo) {
        if self.0.len() == ROUNDS_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(round);
    }

    /// The rounds, oldest first.
    pub fn to_vec(&self) -> Vec<CheckInfo> {
        self.0.iter().cloned().collect()
    }
}

/// An HTML page with the dashboard's headers: never cached, never framed
/// (a cancel button in someone else's frame could be clicked unawares),
/// no script, nothing loaded from elsewhere. Marked so the API's error
/// envelope leaves it as it is.
fn html(status: StatusCode, markup: Markup) -> Response {
    let mut resp = (status, markup.into_string()).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    super::error::keep_as_is(resp)
}

/// A form refused: 403 with a page saying why.
fn refused(message: String) -> Response {
    html(StatusCode::FORBIDDEN, page::refused(&message))
}

/// `GET /`: the dashboard, or the login form when a token is set and the
/// browser has not logged in.
#[utoipa::path(get, path = "/", tag = "dashboard",
    params(super::schema::BrowseParams),
    responses(super::schema::Errors,
        (status = 200, description = "The dashboard, or its login form", content_type = "text/html", body = String)))]
pub(super) async fn dashboard(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    if access == Access::Anonymous {
        return Ok(html(StatusCode::OK, page::login(None)));
    }
    let view = gather(&state, &access, raw.as_deref()).await?;
    Ok(html(StatusCode::OK, page::dashboard(&view)))
}

/// Everything the page shows, read now.
async fn gather(
    state: &AppState,
    access: &Access,
    query: Option<&str>,
) -> Result<page::View, ApiError> {
    let now = now_ms();
    // The proxy table's page: a bad parameter is said in the table, the
    // rest of the page is shown all the same.
    let proxies = match super::query::Params::parse(query, super::browse::PARAMS) {
        Ok(p) => {
            let page = match super::browse::request(&p) {
                Ok(browse) => super::browse::read(state, browse).await,
                Err(e) => Err(e),
            };
            let page = match page {
                Err(e @ (ApiError::BadRequest(_) | ApiError::Timeout)) => Err(e.to_string()),
                other => Ok(other?),
            };
            table::Table {
                asked: table::Table::asked(&p),
                page,
            }
        }
        Err(e) => table::Table {
            asked: Vec::new(),
            page: Err(e.to_string()),
        },
    };
    let q = crate::health::ProxyQuery {
        max_age: Some(state.config.api.max_age),
        ..crate::health::ProxyQuery::default()
    };
    // The same rule as `/stats`' `servable` (see `AppState::servable`).
    // The few fields shown are read in place and counted after: a copy of
    // every servable entry sorted by id (`select`) took much of the page's
    // time at 100,000 servable.
    let mut servable = Vec::new();
    state.feedback.each(&q, now, |e| {
        let r = &e.record;
        servable.push((
            r.proxy.scheme,
            r.country,
            r.anonymity,
            r.https,
            r.latency_ms,
        ));
    });
    let mut by = page::Breakdowns::default();
    let mut latencies = Vec::with_capacity(servable.len());
    for &(scheme, country, anonymity, https, latency) in &servable {
        *by.scheme.entry(scheme.as_str().to_owned()).or_default() += 1;
        let country = country.map_or_else(|| "unknown".to_owned(), |c| c.to_string());
        *by.country.entry(country).or_default() += 1;
        let anonymity = anonymity.map_or_else(|| "unknown".to_owned(), |a| a.as_str().to_owned());
        *by.anonymity.entry(anonymity).or_default() += 1;
        match https {
            Some(true) => by.https += 1,
            Some(false) => by.no_https += 1,
            None => {}
        }
        if let Some(l) = latency {
            latencies.push(l);
        }
    }
    // The counts and the sources of one snapshot.
    let counts = state.counted.get().await?;
    let mut stats = counts.stats.clone();
    let day = state
        .store
        .snapshots(now - 24 * 3_600_000, DAY_BUCKET)
        .await?;
    let week = state
        .store
        .snapshots(now - 7 * 24 * 3_600_000, WEEK_BUCKET)
        .await?;
    let sources = std::mem::take(&mut stats.sources);
    let crawls = state.crawls.list(CRAWLS_SHOWN, None).await?;
    let rounds = state.rounds.last();
    let history = state.rounds.checks();
    Ok(page::View {
        now,
        stats,
        counted_at: counts.at_ms,
        servable: servable.len(),
        servable_by: by,
        latencies,
        degraded: state.conditions.all(),
        last_harvest: rounds.last_harvest,
        last_check: rounds.last_check,
        rounds: history,
        day,
        week,
        sources,
        judges: state.metrics.judges(),
        gateway: state.gateway.as_ref().map(|g| g.snapshot()),
        rotation: state.feedback.rotation(),
        crawls,
        proxies,
        csrf: state.dashboard_keys().csrf(access),
        session: matches!(access, Access::Session(_)),
    })
}

/// `GET /dashboard/login`: the form, or the dashboard when there is
/// nothing to log in to (or the browser already is).
#[utoipa::path(get, path = "/dashboard/login", tag = "dashboard",
    responses(super::schema::Errors,
        (status = 200, description = "The login form", content_type = "text/html", body = String),
        (status = 303, description = "Nothing to log in to, or logged in already: to the dashboard")))]
pub(super) async fn login_page(Extension(access): Extension<Access>) -> Response {
    match access {
        Access::Anonymous => html(StatusCode::OK, page::login(None)),
        _ => Redirect::to("/").into_response(),
    }
}

/// Reads a form-encoded body of at most [`MAX_FORM`] bytes: its fields.
async fn form(body: axum::body::Body) -> Result<Vec<(String, String)>, ApiError> {
    let bytes = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_FORM))
        .await
        .map_err(|_| ApiError::PayloadTooLarge(MAX_FORM))?
        .to_bytes();
    Ok(url::form_urlencoded::parse(&bytes).into_owned().collect())
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// `POST /dashboard/login` (`token=...`): a session cookie and back to the
/// dashboard, or the form again with 401 for a wrong token.
#[utoipa::path(post, path = "/dashboard/login", tag = "dashboard",
    request_body(content = super::schema::LoginForm, content_type = "application/x-www-form-urlencoded"),
    responses(super::schema::Errors,
        (status = 303, description = "Logged in (a session cookie), or no token to log in with: to the dashboard"),
        (status = 401, description = "A wrong token: the form again (a wrong bearer token: the JSON error)",
            content((String = "text/html"), (super::schema::ErrorBody = "application/json"))),
        (status = 403, description = "Posted from another site", content_type = "text/html", body = String)))]
pub(super) async fn login(
    State(state): State<AppState>,
    peer: Option<Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    // A login from another site would log the browser into this dashboard
    // under someone else's eyes (login CSRF).
    if let Err(why) = session::same_origin(&headers) {
        return Ok(refused(why));
    }
    let config = state.live_config();
    let Some(token) = &config.api.token else {
        return Ok(Redirect::to("/").into_response());
    };
    // Wrong tokens are limited per client address, with the API's and the
    // gateway's (see `crate::auth`).
    let peer = peer.map(|Extension(ConnectInfo(p))| p.ip());
    if let Some(wait) = peer.and_then(|ip| state.auth.locked(ip)) {
        return Err(ApiError::TooManyRequests {
            retry_after: wait.as_secs() + u64::from(wait.subsec_nanos() > 0),
        });
    }
    let fields = form(body).await?;
    let presented = field(&fields, "token").unwrap_or("");
    let right = {
        use subtle::ConstantTimeEq;
        bool::from(presented.as_bytes().ct_eq(token.0.as_bytes()))
    };
    if !right {
        tracing::debug!("dashboard login with a wrong token");
        if let Some(ip) = peer {
            state.auth.failed(ip, "dashboard");
        }
        let message = if presented.is_empty() {
            "Enter the API token (api.token) to log in."
        } else {
            "Wrong token: it is not this daemon's api.token."
        };
        return Ok(html(StatusCode::UNAUTHORIZED, page::login(Some(message))));
    }
    let cookie = state
        .dashboard_keys()
        .new_session(now_ms())
        .ok_or_else(|| ApiError::Internal("no token to sign a session with".into()))?;
    let mut resp = Redirect::to("/").into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, session::set_cookie(&cookie));
    Ok(resp)
}

/// The guard of every form that changes something: posted from this
/// dashboard's own page (see [`session::same_origin`]) with the CSRF
/// token of the viewer's session. `Err` is the refusal to answer.
async fn guarded(
    state: &AppState,
    access: &Access,
    headers: &HeaderMap,
    body: axum::body::Body,
) -> Result<Vec<(String, String)>, Response> {
    if *access == Access::Anonymous {
        return Err(ApiError::Unauthorized.into_response());
    }
    session::same_origin(headers).map_err(refused)?;
    let fields = form(body).await.map_err(IntoResponse::into_response)?;
    let presented = field(&fields, "csrf").unwrap_or("");
    if !state.dashboard_keys().valid_csrf(access, presented) {
        return Err(refused(
            "the form's CSRF token is missing or belongs to another session (the page may \
             be older than your last login); reload the dashboard and try again"
                .into(),
        ));
    }
    Ok(fields)
}

/// `POST /dashboard/logout`: forgets the session cookie.
#[utoipa::path(post, path = "/dashboard/logout", tag = "dashboard",
    request_body(content = super::schema::CsrfForm, content_type = "application/x-www-form-urlencoded"),
    responses(super::schema::Errors,
        (status = 303, description = "Logged out: to the dashboard"),
        (status = 403, description = "Posted from another site, or without the page's CSRF token",
            content_type = "text/html", body = String)))]
pub(super) async fn logout(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Response {
    if let Err(refusal) = guarded(&state, &access, &headers, body).await {
        return refusal;
    }
    if let Access::Session(cookie) = &access {
        state.dashboard_keys().revoke(cookie, now_ms());
    }
    let mut resp = Redirect::to("/").into_response();
    resp.headers_mut()
        .insert(header::SET_COOKIE, session::clear_cookie());
    resp
}

/// `POST /dashboard/crawls/{id}/cancel`: cancels a crawl job, then back to
/// the dashboard's job list.
#[utoipa::path(post, path = "/dashboard/crawls/{id}/cancel", tag = "dashboard",
    params(("id" = i64, Path, description = "The job's id")),
    request_body(content = super::schema::CsrfForm, content_type = "application/x-www-form-urlencoded"),
    responses(super::schema::Errors,
        (status = 303, description = "Cancelled: to the dashboard's job list"),
        (status = 403, description = "Posted from another site, or without the page's CSRF token",
            content_type = "text/html", body = String)))]
pub(super) async fn cancel(
    State(state): State<AppState>,
    Extension(access): Extension<Access>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    if let Err(refusal) = guarded(&state, &access, &headers, body).await {
        return Ok(refusal);
    }
    let Path(id) =
        id.map_err(|e| ApiError::BadRequest(format!("invalid crawl id in the path: {e}")))?;
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("crawl id {id:?} is not a number")))?;
    match state.crawls.cancel(id).await? {
        Some(_) => Ok(Redirect::to("/#crawls").into_response()),
        None => Err(ApiError::NotFound(format!("no crawl job {id}"))),
    }
}
