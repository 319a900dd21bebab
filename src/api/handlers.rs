//! The route handlers. Serving routes read the health index; only listings
//! of non-alive proxies, reports and stats touch the store.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::answers::Form;
use super::query::{FILTERS, Params, proxy_query, site};
use super::{ApiError, AppState};
use crate::export::{self, ExportRow, Format};
use crate::health::BestOfTwo;
use crate::model::{Block, UseVerdict};
use crate::pool::VerifyError;
use crate::proxy::Status;
use crate::store::{ProxyRecord, ProxySort, SourceRecord, now_ms, rfc3339};

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    FILTERS.iter().chain(extra).copied().collect()
}

/// `GET /proxy`: one alive, fresh proxy matching the filters.
#[utoipa::path(get, path = "/proxy", tag = "serving",
    params(super::schema::Filters, super::schema::ProxyParams),
    responses(
        (status = 200, description = "One alive proxy checked within max_age",
            content((ExportRow = "application/json"), (String = "text/plain"))),
        super::schema::ProxyErrors))]
pub async fn proxy(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(raw.as_deref(), &with(&["format", "verify"]))?;
    let q = proxy_query(&p, state.config.api.max_age)?;
    let site = site(&p)?;
    let text = p.choice("format", &["json", "text"])? == Some("text");
    let verify = p.boolean("verify")?.unwrap_or(false);
    let none = || ApiError::NotFound("no alive proxy matches the filters".into());

    let chosen = if verify {
        // Nothing to verify is a 404 as without `verify`, not a wait for a
        // judge that could only confirm there is nothing.
        if state
            .feedback
            .pick(&q, site.as_deref(), now_ms(), &BestOfTwo, &|_| false)
            .is_none()
        {
            return Err(empty_pool(&state).await.unwrap_or_else(none));
        }
        state
            .verifier
            .verify(&q, site.as_deref())
            .await
            .map_err(|e| match e {
                VerifyError::NotReady => ApiError::NotReady(e.to_string()),
                VerifyError::RateLimited { retry_after } => ApiError::TooManyRequests {
                    retry_after: retry_after.as_secs() + 1,
                },
                VerifyError::NoProxy(e) => {
                    ApiError::NotReady(format!("no proxy could be verified in time: {e}"))
                }
                VerifyError::Failed { tried: 0, .. } => none(),
                VerifyError::Failed { tried, unsure: 0 } => ApiError::NotFound(format!(
                    "no alive proxy matches the filters: the {tried} tried failed a fresh check \
                     and will not be served until they pass one"
                )),
                VerifyError::Failed { tried, unsure } => ApiError::NotFound(format!(
                    "no alive proxy matches the filters: none of the {tried} tried passed a fresh \
                     check ({unsure} of them only against a judge that may be at fault, so they \
                     are kept for their next check)"
                )),
            })?
    } else {
        match state
            .feedback
            .pick(&q, site.as_deref(), now_ms(), &BestOfTwo, &|_| false)
        {
            Some(e) => e,
            None => return Err(empty_pool(&state).await.unwrap_or_else(none)),
        }
    };
    state.feedback.served(&chosen, now_ms());
    let len = state.index().len();
    Ok(if text {
        let body = state.answers.get(&chosen, Form::Text, len);
        ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response()
    } else {
        let body = state.answers.get(&chosen, Form::Json, len);
        ([(header::CONTENT_TYPE, "application/json")], body).into_response()
    })
}

/// Why nothing at all can be served, when the pool is empty (rather than
/// the filters excluding what there is): no source worked, nothing was
/// checked yet, or nothing is alive. `None` while anything is servable.
async fn empty_pool(state: &AppState) -> Option<ApiError> {
    if !state.index().is_empty() {
        return None;
    }
    let presence = presence(state).await?;
    let message = if !presence.stored {
        let harvest = state.rounds.last().last_harvest;
        match harvest {
            None => "no proxy to serve yet: the first harvest has not finished".to_string(),
            Some(h) if h.failed == h.sources => format!(
                "no proxy to serve: no sources worked ({} failed in the last harvest; see /sources for why)",
                h.failed
            ),
            Some(_) => "no proxy to serve: the sources listed no proxy".to_string(),
        }
    } else if !presence.checked {
        "no proxy to serve yet: nothing checked yet (the harvested proxies wait for their first check)"
            .to_string()
    } else {
        "no proxy to serve: nothing alive (no checked proxy passed a check within api.max_age)"
            .to_string()
    };
    Some(ApiError::NotFound(message))
}

/// Whether the store holds any proxy, and any checked one. Once both
/// hold they are kept in memory until the next round ends (a purge is one),
/// rather than read for every 404: what the answer then says (nothing
/// alive) stays true whatever else changes meanwhile.
async fn presence(state: &AppState) -> Option<crate::store::Presence> {
    let ended = state.rounds.ended();
    if let Some((at, p)) = *crate::lock(&state.presence)
        && at == ended
    {
        return Some(p);
    }
    let p = state.store.presence().await.ok()?;
    if p.stored && p.checked {
        *crate::lock(&state.presence) = Some((ended, p));
    }
    Some(p)
}

/// A page of `/proxies`.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Listing {
    total: i64,
    limit: usize,
    offset: usize,
    proxies: Vec<ExportRow>,
}

/// `GET /proxies`: a page of proxies of any status, filtered and sorted.
#[utoipa::path(get, path = "/proxies", tag = "serving",
    params(super::schema::Filters, super::schema::ListParams),
    responses((status = 200, description = "A page of proxies", body = Listing),
        super::schema::Errors))]
pub async fn proxies(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<Listing>, ApiError> {
    let p = Params::parse(
        raw.as_deref(),
        &with(&["status", "sort", "limit", "offset"]),
    )?;
    // A listing shows whatever is alive unless a freshness bound is asked.
    let mut q = proxy_query(&p, Duration::ZERO)?;
    let site = site(&p)?;
    if p.get("max_age").is_none() {
        q.max_age = None;
    }
    let status = p
        .choice("status", &["alive", "dead", "unknown", "all"])?
        .unwrap_or("alive");
    let sort = p
        .choice("sort", &["latency", "last_checked", "uptime"])?
        .unwrap_or("latency");
    let limit = p.number("limit", 1, 1000)?.unwrap_or(100) as usize;
    let offset = p.number("offset", 0, i64::MAX)?.unwrap_or(0) as usize;

    let sort = match sort {
        "last_checked" => ProxySort::LastChecked,
        "uptime" => ProxySort::Uptime,
        _ => ProxySort::Latency,
    };
    let (total, proxies) = if status == "alive" {
        // Alive proxies come from memory, sorted as the store would.
        let mut rows: Vec<Arc<ProxyRecord>> = state
            .index()
            .select(&q, now_ms())
            .into_iter()
            .map(|e| e.record.clone())
            .collect();
        match sort {
            ProxySort::LastChecked => rows.sort_by_key(|r| std::cmp::Reverse(r.last_checked)),
            ProxySort::Uptime => rows.sort_by(|a, b| uptime(b).total_cmp(&uptime(a))),
            _ => rows.sort_by_key(|r| (r.latency_ms.is_none(), r.latency_ms, r.id)),
        }
        if let Some(site) = &site {
            // Those the site bans or rests leave; those that worked there
            // come first, each part in the order asked for.
            state.feedback.for_site(site, &mut rows, |r| r.id);
        }
        let page = rows
            .iter()
            .skip(offset)
            .take(limit)
            .map(|r| ExportRow::from(&**r))
            .collect();
        (rows.len() as i64, page)
    } else {
        // Freshness only bounds alive proxies, as it always has.
        q.max_age = None;
        let status = match status {
            "dead" => Some(Status::Dead),
            "unknown" => Some(Status::Unknown),
            _ => None,
        };
        let page = state
            .store
            .list_page(q.to_filter(status, now_ms()), sort, limit, offset)
            .await?;
        (
            page.total,
            page.proxies.iter().map(ExportRow::from).collect(),
        )
    };
    Ok(Json(Listing {
        total,
        limit,
        offset,
        proxies,
    }))
}

fn uptime(r: &ProxyRecord) -> f64 {
    if r.checks_total == 0 {
        0.0
    } else {
        r.checks_ok as f64 / r.checks_total as f64
    }
}

/// `GET /export?format=txt|json|csv`: the healthy list.
#[utoipa::path(get, path = "/export", tag = "serving",
    params(super::schema::Filters, super::schema::ExportParams),
    responses(
        (status = 200, description = "Every servable proxy matching the filters",
            content((String = "text/plain"), (Vec<ExportRow> = "application/json"), (String = "text/csv"))),
        super::schema::Errors))]
pub async fn export(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let p = Params::parse(raw.as_deref(), &with(&["format"]))?;
    let q = proxy_query(&p, state.config.api.max_age)?;
    let site = site(&p)?;
    let format = match p
        .choice("format", &["txt", "json", "csv"])?
        .unwrap_or("txt")
    {
        "json" => Format::Json,
        "csv" => Format::Csv,
        _ => Format::Txt,
    };
    let rows = state.feedback.select(&q, site.as_deref(), now_ms());
    let body = axum::body::Body::from_stream(export_chunks(rows, format)?);
    Ok(([(header::CONTENT_TYPE, format.content_type())], body).into_response())
}

/// Proxies written per chunk of a streamed export: a few hundred
/// kilobytes of JSON at most, serialized between other requests.
const EXPORT_CHUNK: usize = 256;

/// The export of `rows` as body chunks, each written when the client takes
/// the previous one: the body is never whole in memory, whatever the
/// number of proxies.
fn export_chunks(
    rows: Vec<Arc<crate::health::Entry>>,
    format: Format,
) -> Result<
    impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send + 'static,
    ApiError,
> {
    let out =
        export::Exporter::new(format, Vec::new()).map_err(|e| ApiError::Internal(e.to_string()))?;
    let rows = rows.into_iter();
    Ok(futures::stream::unfold(
        Some((rows, out)),
        |state| async move {
            let (mut rows, mut out) = state?;
            let mut more = false;
            for e in rows.by_ref().take(EXPORT_CHUNK) {
                if let Err(e) = out.row(&e.record) {
                    return Some((Err(e), None));
                }
                more = true;
            }
            if more {
                Some((Ok(bytes::Bytes::from(out.take())), Some((rows, out))))
            } else {
                Some((out.finish().map(bytes::Bytes::from), None))
            }
        },
    ))
}

/// A client's verdict on a proxy.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Report {
    /// Whether the proxy worked.
    ok: bool,
    /// Why it failed, for the log.
    #[serde(default)]
    reason: Option<String>,
    /// The site the proxy was used for: a failure then means the site
    /// refused it (the pair is banned, the proxy stays served elsewhere),
    /// a success that the site takes it.
    #[serde(default)]
    site: Option<String>,
}

/// The largest report body read; a report is a few dozen bytes.
const MAX_REPORT_BODY: usize = 64 * 1024;

/// What a report did.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Reported {
    /// The proxy.
    id: i64,
    /// The verdict reported.
    ok: bool,
    /// Whether it is no longer served.
    hidden: bool,
    /// Whether it is checked again soon.
    recheck: bool,
    /// The site the verdict was about, when one was named.
    #[serde(skip_serializing_if = "Option::is_none")]
    site: Option<String>,
}

/// `POST /proxies/{id}/report` with `{"ok": false, "reason": "..."}`.
#[utoipa::path(post, path = "/proxies/{id}/report", tag = "serving",
    params(("id" = i64, Path, description = "The proxy's id")),
    request_body = Report,
    responses((status = 200, description = "The verdict was taken", body = Reported),
        super::schema::Errors))]
pub async fn report(
    State(state): State<AppState>,
    id: Result<Path<String>, PathRejection>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    // axum's own rejection (e.g. `%FF`, not UTF-8) would be plain text.
    let Path(id) =
        id.map_err(|e| ApiError::BadRequest(format!("invalid proxy id in the path: {e}")))?;
    let id: i64 = id
        .parse()
        .map_err(|_| ApiError::BadRequest(format!("proxy id {id:?} is not a number")))?;
    let body =
        http_body_util::BodyExt::collect(http_body_util::Limited::new(body, MAX_REPORT_BODY))
            .await
            .map_err(|_| ApiError::PayloadTooLarge(MAX_REPORT_BODY))?
            .to_bytes();
    let report: Report = serde_json::from_slice(&body).map_err(|e| {
        ApiError::BadRequest(format!(
            "body must be JSON like {{\"ok\": false, \"reason\": \"...\"}}: {e}"
        ))
    })?;
    let ok = report.ok;
    let site = match report.site.as_deref() {
        Some(s) => Some(super::query::parse_site(s).map_err(|expected| {
            ApiError::BadRequest(format!("\"site\" must be {expected}, found {s:?}"))
        })?),
        None => None,
    };
    if !ok && let Some(site) = &site {
        if state.store.proxies_by_ids(vec![id]).await?.is_empty() {
            return Err(ApiError::NotFound(format!("no proxy with id {id}")));
        }
        tracing::debug!(id, site, "client reported a proxy blocked by a site");
        state
            .feedback
            .report(id, UseVerdict::Blocked(Block::Banned), Some(site))
            .await?;
        return Ok(Json(Reported {
            id,
            ok: false,
            hidden: false,
            recheck: false,
            site: Some(site.clone()),
        })
        .into_response());
    }
    let verdict = if ok {
        UseVerdict::Worked
    } else {
        tracing::debug!(
            id,
            reason = report.reason.as_deref().unwrap_or(""),
            "client reported a failing proxy"
        );
        UseVerdict::ProxyFailed(None)
    };
    let reported = state.feedback.report(id, verdict, site.as_deref()).await?;
    if !reported.found {
        return Err(ApiError::NotFound(format!("no proxy with id {id}")));
    }
    Ok(Json(Reported {
        id,
        ok,
        hidden: reported.hidden,
        recheck: !ok,
        site,
    })
    .into_response())
}

/// `/stats`: what is stored, what is servable, what is degraded and what
/// the last rounds did.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct StatsView {
    /// Stored proxies.
    total: i64,
    /// When the stored proxies were counted (RFC 3339): `total`, the
    /// `by_*` counts and `/sources`' counts are of that moment, all of one
    /// snapshot. Counted for each answer while that is cheap; in a big
    /// store, after each harvest, check round and purge.
    counted_at: String,
    /// How long ago that was, in milliseconds.
    counted_age_ms: u64,
    /// Proxies that can be served now (see [`AppState::servable`]).
    servable: usize,
    /// What keeps the daemon from doing its whole job now.
    degraded: Vec<super::conditions::Condition>,
    /// The store's writes.
    store: StoreView,
    /// Stored proxies by status (`unknown`, `alive`, `dead`).
    by_status: BTreeMap<String, i64>,
    /// By scheme.
    by_scheme: BTreeMap<String, i64>,
    /// By country code (`unknown` when none).
    by_country: BTreeMap<String, i64>,
    /// Alive proxies by anonymity.
    by_anonymity: BTreeMap<String, i64>,
    /// Dead proxies by the reason of their last failure.
    by_reason: BTreeMap<String, i64>,
    /// The last harvest.
    last_harvest: Option<super::HarvestInfo>,
    /// The last check round.
    last_check: Option<super::CheckInfo>,
    /// The gateway's counters, when it runs.
    gateway: Option<crate::gateway::GatewayStats>,
    /// Per site, in the last 10 minutes: uses that worked (by the gateway,
    /// crawl jobs and the pool), how many distinct proxies carried them
    /// and the largest share one took; the busiest first, 256 sites at most.
    rotation: Vec<crate::health::SiteSpread>,
}

/// The store's writes in `/stats`: whether they work, the trouble in force,
/// failures by kind since start, and verdicts dropped for them.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct StoreView {
    /// False while the disk refuses writes.
    writable: bool,
    /// The trouble in force, if any.
    write_trouble: Option<WriteTroubleView>,
    /// Transactions the disk refused since start, by kind.
    write_failures: BTreeMap<String, u64>,
    /// Verdicts that took effect in memory but could not be written.
    unrecorded_verdicts: u64,
}

/// Why the disk refuses writes, in `/stats`.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct WriteTroubleView {
    /// `disk_full`, `read_only` or `io_error`.
    kind: &'static str,
    /// What SQLite said.
    reason: String,
    /// Since when (RFC 3339).
    since: String,
    /// Failed transactions since then.
    failures: u64,
    /// Seconds between attempts now.
    retry_every_s: u64,
    /// Milliseconds until the next attempt.
    retry_in_ms: u64,
}

/// `GET /stats`.
#[utoipa::path(get, path = "/stats", tag = "stats",
    responses((status = 200, description = "Counts, rounds and what is degraded", body = StatsView),
        super::schema::Errors))]
pub async fn stats(State(state): State<AppState>) -> Result<Json<StatsView>, ApiError> {
    // The counts, not the per-source table (`/sources` has that).
    let counts = state.counted.get().await?;
    let stats = counts.stats.clone();
    let rounds = state.rounds.last();
    Ok(Json(StatsView {
        total: stats.total,
        counted_at: rfc3339(counts.at_ms),
        counted_age_ms: u64::try_from(now_ms() - counts.at_ms).unwrap_or(0),
        servable: state.servable(),
        degraded: state.conditions.all(),
        store: store_view(&state),
        by_status: stats.by_status,
        by_scheme: stats.by_scheme,
        by_country: stats.by_country,
        by_anonymity: stats.by_anonymity,
        by_reason: stats.by_reason,
        last_harvest: rounds.last_harvest,
        last_check: rounds.last_check,
        gateway: state.gateway.as_ref().map(|g| g.snapshot()),
        rotation: state.feedback.rotation(),
    }))
}

fn store_view(state: &AppState) -> StoreView {
    let trouble = state.store.write_trouble().map(|t| WriteTroubleView {
        kind: t.kind.as_str(),
        since: rfc3339(t.since_ms),
        failures: t.failures,
        retry_every_s: t.retry_every.as_secs(),
        retry_in_ms: t.retry_in().as_millis() as u64,
        reason: t.reason,
    });
    StoreView {
        writable: trouble.is_none(),
        write_trouble: trouble,
        write_failures: state
            .store
            .write_failures()
            .into_iter()
            .map(|(k, n)| (k.as_str().to_owned(), n))
            .collect(),
        unrecorded_verdicts: state.feedback.unrecorded(),
    }
}

/// A source's last fetch in `/sources`.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct SourceView {
    name: String,
    url: String,
    format: String,
    last_fetch_at: Option<String>,
    last_ok_at: Option<String>,
    last_http_status: Option<i64>,
    last_duration_ms: Option<i64>,
    last_found: Option<i64>,
    last_new: Option<i64>,
    last_private: Option<i64>,
    last_error: Option<String>,
    fetches_total: i64,
    fetches_failed: i64,
    proxies: i64,
    alive: i64,
    /// Of `proxies`, those no other source lists.
    unique: i64,
}

impl From<SourceRecord> for SourceView {
    fn from(s: SourceRecord) -> SourceView {
        SourceView {
            last_fetch_at: s.last_fetch_at.map(rfc3339),
            last_ok_at: s.last_ok_at.map(rfc3339),
            last_error: s.last_error.as_deref().map(shown_text),
            url: shown_url(&s.url),
            name: s.name,
            format: s.format,
            last_http_status: s.last_http_status,
            last_duration_ms: s.last_duration_ms,
            last_found: s.last_found,
            last_new: s.last_new,
            last_private: s.last_private,
            fetches_total: s.fetches_total,
            fetches_failed: s.fetches_failed,
            proxies: s.proxies,
            alive: s.alive,
            unique: s.unique,
        }
    }
}

/// Query parameters whose values are taken for secrets in a shown URL.
const SECRET_PARAMS: [&str; 12] = [
    "token",
    "key",
    "apikey",
    "api_key",
    "api-key",
    "secret",
    "password",
    "pass",
    "auth",
    "sig",
    "signature",
    "access_token",
];

/// A source URL as `/sources` shows it: credentials in its userinfo and
/// the values of secret-looking query parameters read `<redacted>`.
fn shown_url(url: &str) -> String {
    let Ok(mut u) = url::Url::parse(url) else {
        return url.to_owned();
    };
    if !u.username().is_empty() || u.password().is_some() {
        let _ = u.set_username("redacted");
        let _ = u.set_password(None);
    }
    let secret = |k: &str| SECRET_PARAMS.contains(&k.to_ascii_lowercase().as_str());
    if u.query_pairs().any(|(k, _)| secret(&k)) {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let v = if secret(&k) {
                    "<redacted>".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    u.to_string()
}

/// `text` (an error message) with every URL in it shown as [`shown_url`].
fn shown_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .rfind(|c: char| !c.is_ascii_alphanumeric() && c != '+' && c != '-' && c != '.')
            .map_or(0, |i| i + 1);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | ')' | '>' | ','))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&shown_url(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// `GET /sources`: each source's last fetch.
#[utoipa::path(get, path = "/sources", tag = "stats",
    responses((status = 200, description = "Each source's last fetch", body = Vec<SourceView>),
        super::schema::Errors))]
pub async fn sources(State(state): State<AppState>) -> Result<Response, ApiError> {
    let counts = state.counted.get().await?;
    let view: Vec<SourceView> = counts
        .stats
        .sources
        .iter()
        .cloned()
        .map(SourceView::from)
        .collect();
    // When the counts were taken (see `/stats`' `counted_at`).
    Ok(([(COUNTED_AT, rfc3339(counts.at_ms))], Json(view)).into_response())
}

/// The header of `/sources` that says when its counts were taken.
pub(super) const COUNTED_AT: &str = "x-counted-at";

/// `GET /metrics`: Prometheus text.
#[utoipa::path(get, path = "/metrics", tag = "stats",
    responses((status = 200, description = "Prometheus metrics (OpenMetrics text)",
        content((String = "application/openmetrics-text"))),
        super::schema::Errors))]
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let metrics = state.metrics.clone();
    let len = state.servable();
    // The store's counts as `/stats` has them: for a big store, the latest
    // count rather than nine scans per scrape.
    let counts = state.counted.get().await?.stats.by_status_and_scheme();
    metrics.observe_store(&state.store.write_failures(), state.feedback.unrecorded());
    metrics.observe_rotation(&state.feedback.rotation());
    let text = metrics.render(&counts, len);
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

/// `GET /healthz`: the process answers; `degraded`, with each reason and
/// since when, while part of its work cannot be done (serving goes on).
///
/// `/healthz` needs no token, so with one configured the reasons name only
/// the part and since when: their messages (judge URLs, file errors) are in
/// `/stats`, behind the token.
#[utoipa::path(get, path = "/healthz", tag = "meta", security(()),
    responses((status = 200, description = "The process answers", body = Health),
        super::schema::Errors))]
pub async fn healthz(State(state): State<AppState>) -> Json<Health> {
    let mut conditions = state.conditions.all();
    if conditions.is_empty() {
        return Json(Health {
            status: "ok",
            reasons: None,
        });
    }
    if state.live_config().api.token.is_some() {
        for c in &mut conditions {
            c.message = "see /stats (with the token) for why".into();
        }
    }
    Json(Health {
        status: "degraded",
        reasons: Some(conditions),
    })
}

/// `/healthz`'s answer.
#[derive(Serialize, utoipa::ToSchema)]
pub(super) struct Health {
    /// `ok`, or `degraded` while part of the daemon's work cannot be done.
    status: &'static str,
    /// What is degraded, when anything is.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasons: Option<Vec<super::conditions::Condition>>,
}

/// Unknown routes.
pub async fn not_found(State(state): State<AppState>) -> Response {
    state.metrics.observe_request("unmatched", 404);
    ApiError::NotFound("no such route".into()).into_response()
}

/// Known routes with the wrong method.
pub async fn method_not_allowed() -> Response {
    ApiError::MethodNotAllowed.into_response()
}
