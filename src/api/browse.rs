//! `GET /proxies/browse`: the stored proxies of every status a page at a
//! time, searched by address or country, filtered, in one of a few
//! orders, with what sites taught about each; pages follow each other by
//! a cursor, so a deep page costs what the first does. The dashboard's
//! proxy table reads the same pages.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use serde::Serialize;

use super::query::Params;
use super::{ApiError, AppState};
use crate::health::filters;
use crate::proxy::Status;
use crate::store::{
    Browse, BrowsePage, BrowseSort, Cursor, MAX_BROWSE_LIMIT, MAX_SEARCH, ProxyFilter, ProxyRecord,
    Search, SiteRecord, SitesTaught, rfc3339,
};

/// Rows on a page when `limit` is not given.
pub const DEFAULT_LIMIT: usize = 50;

/// The longest a page may take to read; a slower one answers 503
/// (`timeout`) instead of holding a reader.
const DEADLINE: Duration = Duration::from_secs(10);

/// The parameters `/proxies/browse` (and the dashboard's table) read.
pub const PARAMS: &[&str] = &[
    "q", "status", "scheme", "country", "sort", "limit", "after", "before",
];

/// One proxy in the table.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct BrowseRow {
    /// The proxy's id (for `POST /proxies/{id}/report`).
    pub id: i64,
    /// `scheme://host:port`, without credentials.
    pub address: String,
    /// `http`, `socks4` or `socks5`.
    pub scheme: String,
    /// Country code, when known.
    pub country: Option<String>,
    /// `alive`, `dead` or `unknown` (not checked yet).
    pub status: String,
    /// Latency of the last passed check, in ms.
    pub latency_ms: Option<i64>,
    /// `transparent`, `anonymous` or `elite`, when checked.
    pub anonymity: Option<String>,
    /// Whether it tunnels HTTPS (CONNECT), when tested.
    pub https: Option<bool>,
    /// The last check (RFC 3339), if any.
    pub last_checked: Option<String>,
    /// Why the last check failed, for a dead proxy.
    pub reason: Option<String>,
    /// What sites taught about it.
    pub sites: SitesView,
}

/// What sites taught about one proxy (from the record the gateway, crawl
/// jobs, the pool and client reports keep).
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct SitesView {
    /// Sites with a record of it.
    pub known: i64,
    /// Sites where a use through it worked.
    pub worked: i64,
    /// Sites that refused it at least once.
    pub blocked: i64,
    /// Sites that ban or rest it now.
    pub banned_now: i64,
    /// The latest records, most recently changed first (5 at most).
    pub latest: Vec<SiteView>,
}

/// One site's record of one proxy.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct SiteView {
    /// The site (host, with a port other than the scheme's default).
    pub site: String,
    /// Uses through the proxy that the site answered.
    pub worked: i64,
    /// Times the site refused it.
    pub blocked: i64,
    /// Smoothed latency of the uses that worked there, in ms.
    pub latency_ms: Option<i64>,
    /// Until when the site bans or rests it (RFC 3339), while it does.
    pub banned_until: Option<String>,
    /// When the record last changed (RFC 3339).
    pub updated_at: String,
}

/// A page of `/proxies/browse`.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct BrowseView {
    /// The proxies of this page.
    pub proxies: Vec<BrowseRow>,
    /// How many proxies match, counted up to 10,000.
    pub total: i64,
    /// True when more than 10,000 match (`total` is then 10,000).
    pub total_capped: bool,
    /// The order.
    pub sort: String,
    /// Rows per page.
    pub limit: usize,
    /// The `after` of the next page, when there is one.
    pub next: Option<String>,
    /// The `before` of the previous page, when there is one.
    pub prev: Option<String>,
}

fn bad(message: String) -> ApiError {
    ApiError::BadRequest(message)
}

/// A cursor parameter: written by an earlier page of the same order.
fn cursor(p: &Params, name: &str, sort: BrowseSort) -> Result<Option<Cursor>, ApiError> {
    let Some(text) = p.get(name) else {
        return Ok(None);
    };
    let shown: String = text.chars().take(60).collect();
    let c = Cursor::parse(text).ok_or_else(|| {
        bad(format!(
            "parameter {name}={shown:?} is invalid: expected the next or prev of an earlier page"
        ))
    })?;
    if c.sort != sort {
        return Err(bad(format!(
            "parameter {name}={shown:?} belongs to sort={}, not sort={}: start again from the first page",
            c.sort.as_str(),
            sort.as_str()
        )));
    }
    Ok(Some(c))
}

/// The page `p` asks for (see [`PARAMS`]).
pub fn request(p: &Params) -> Result<Browse, ApiError> {
    let search = match p.get("q") {
        Some(q) if q.chars().count() > MAX_SEARCH => {
            return Err(bad(format!(
                "parameter q is longer than {MAX_SEARCH} characters: search for part of an \
                 address (1.2.3, :8080, socks5://) or a country code"
            )));
        }
        Some(q) if q.chars().any(char::is_control) => {
            return Err(bad(
                "parameter q holds control characters: search for part of an address or a \
                 country code"
                    .into(),
            ));
        }
        Some(q) => Search::new(q),
        None => None,
    };
    let status = match p.choice("status", &["all", "alive", "dead", "unknown"])? {
        Some("alive") => Some(Status::Alive),
        Some("dead") => Some(Status::Dead),
        Some("unknown") => Some(Status::Unknown),
        _ => None,
    };
    let names: Vec<&str> = BrowseSort::ALL.iter().map(|s| s.as_str()).collect();
    let sort = p
        .choice("sort", &names)?
        .and_then(BrowseSort::parse)
        .unwrap_or_default();
    let limit = p
        .number("limit", 1, MAX_BROWSE_LIMIT as i64)?
        .map_or(DEFAULT_LIMIT, |n| n as usize);
    let after = cursor(p, "after", sort)?;
    let before = cursor(p, "before", sort)?;
    if after.is_some() && before.is_some() {
        return Err(bad(
            "parameters after and before were both given: give one (the next or prev of a page)"
                .into(),
        ));
    }
    Ok(Browse {
        filter: ProxyFilter {
            status,
            countries: p.list("country", filters::country)?,
            schemes: p.list("scheme", filters::scheme)?,
            ..ProxyFilter::default()
        },
        search,
        sort,
        from: after.or(before),
        before: before.is_some(),
        limit,
    })
}

/// Reads the page `browse` names, within `DEADLINE`.
pub async fn read(state: &AppState, browse: Browse) -> Result<BrowseView, ApiError> {
    let sort = browse.sort;
    let limit = browse.limit;
    let page = tokio::time::timeout(DEADLINE, state.store.browse(browse))
        .await
        .map_err(|_| ApiError::Timeout)??;
    Ok(view(page, sort, limit, crate::store::now_ms()))
}

fn site_view(r: &SiteRecord, now: i64) -> SiteView {
    SiteView {
        site: r.site.clone(),
        worked: r.worked,
        blocked: r.blocked,
        latency_ms: r.latency_ms,
        banned_until: r.banned_until.filter(|u| *u > now).map(rfc3339),
        updated_at: rfc3339(r.updated_at),
    }
}

fn sites_view(t: Option<&SitesTaught>, now: i64) -> SitesView {
    t.map_or_else(SitesView::default, |t| SitesView {
        known: t.sites,
        worked: t.worked,
        blocked: t.blocked,
        banned_now: t.banned_now,
        latest: t.latest.iter().map(|r| site_view(r, now)).collect(),
    })
}

fn row(r: &ProxyRecord, page: &BrowsePage, now: i64) -> BrowseRow {
    BrowseRow {
        id: r.id,
        address: format!(
            "{}://{}",
            r.proxy.scheme,
            SocketAddr::new(r.proxy.host, r.proxy.port)
        ),
        scheme: r.proxy.scheme.as_str().to_owned(),
        country: r.country.map(|c| c.to_string()),
        status: r.status.as_str().to_owned(),
        latency_ms: r.latency_ms,
        anonymity: r.anonymity.map(|a| a.as_str().to_owned()),
        https: r.https,
        last_checked: r.last_checked.map(rfc3339),
        reason: (r.status == Status::Dead)
            .then(|| r.reason.clone())
            .flatten(),
        sites: sites_view(page.sites.get(&r.id), now),
    }
}

fn view(page: BrowsePage, sort: BrowseSort, limit: usize, now: i64) -> BrowseView {
    BrowseView {
        proxies: page.proxies.iter().map(|r| row(r, &page, now)).collect(),
        total: page.total,
        total_capped: page.total_capped,
        sort: sort.as_str().to_owned(),
        limit,
        next: page.next.map(|c| c.to_string()),
        prev: page.prev.map(|c| c.to_string()),
    }
}

/// `GET /proxies/browse`: a page of the stored proxies, searched and
/// filtered, with what sites taught about each.
#[utoipa::path(get, path = "/proxies/browse", tag = "stats",
    params(super::schema::BrowseParams),
    responses((status = 200, description = "A page of stored proxies", body = BrowseView),
        super::schema::Errors))]
pub async fn browse(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
) -> Result<Json<BrowseView>, ApiError> {
    let p = Params::parse(raw.as_deref(), PARAMS)?;
    let browse = request(&p)?;
    Ok(Json(read(&state, browse).await?))
}
