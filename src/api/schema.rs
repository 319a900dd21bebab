//! The shapes `/openapi.json` describes beside the handlers' own types: the
//! error envelope and the errors each route may answer, the query
//! parameters (parsed by hand, to name a bad one), and the forms. The
//! handlers name these in their `#[utoipa::path]` attributes; `openapi`
//! assembles the document from the handlers.

use serde::Serialize;
use utoipa::{IntoParams, IntoResponses, ToSchema};

/// Every error: `{"error": {"code": "...", "message": "..."}}`.
#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error's code and message.
#[derive(Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Machine-readable: `bad_request`, `unauthorized`, `not_found`,
    /// `method_not_allowed`, `payload_too_large`, `uri_too_long`,
    /// `unsupported_media_type`, `host_not_allowed`, `cross_site`, `too_many_requests`,
    /// `headers_too_large`, `timeout`, `not_ready`, `busy`, `unavailable`,
    /// `internal`.
    pub code: String,
    /// For people: what was wrong and how to do it right.
    pub message: String,
}

/// Every error status a route may answer, and when.
const ERRORS: &[(u16, &str)] = &[
    (
        400,
        "A parameter, the path or the body is invalid; the message names it",
    ),
    (
        401,
        "A token is configured and the request has none, or a wrong one",
    ),
    (
        404,
        "Nothing matches (no proxy, no job, no route), or switched off",
    ),
    (
        403,
        "A browser says another site's page made the request (Sec-Fetch-Site, Origin)",
    ),
    (405, "The route exists, not for this method"),
    (413, "The body is larger than the route reads"),
    (414, "The path and query are longer than 8 KiB"),
    (415, "A body not sent as application/json"),
    (
        421,
        "Without a token, a Host that does not name this machine",
    ),
    (429, "Too many requests, or a full queue; see Retry-After"),
    (431, "Headers over 64 KiB in all, or more than 100"),
    (500, "An internal failure; details are in the daemon's log"),
    (
        503,
        "Not now: a timeout, no judge yet, every connection busy, the disk refusing writes",
    ),
];

/// The error responses: the JSON envelope, and with `text` its message as
/// one line of text too.
fn error_responses(
    text: bool,
) -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
    use utoipa::openapi::schema::{ObjectBuilder, Type};
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    ERRORS
        .iter()
        .map(|(status, description)| {
            let mut response = ResponseBuilder::new().description(*description).content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            );
            if text {
                response = response.content(
                    "text/plain",
                    ContentBuilder::new()
                        .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                        .build(),
                );
            }
            (status.to_string(), response.build().into())
        })
        .collect()
}

/// The errors any route may answer, in the JSON envelope.
pub struct Errors;

impl IntoResponses for Errors {
    fn responses()
    -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        error_responses(false)
    }
}

/// `/proxy`'s errors: in the JSON envelope, or with `format=text` its
/// message as one line of text.
pub struct ProxyErrors;

impl IntoResponses for ProxyErrors {
    fn responses()
    -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
        error_responses(true)
    }
}

/// The filters of `/proxy`, `/proxies` and `/export`.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct Filters {
    /// Country codes, comma-separated (`US,DE`).
    country: Option<String>,
    /// Schemes, comma-separated: `http`, `socks4`, `socks5`.
    scheme: Option<String>,
    /// The least anonymity: `transparent`, `anonymous` or `elite`.
    anonymity: Option<String>,
    /// Only proxies that tunnel HTTPS (CONNECT), or only those that do not.
    https: Option<bool>,
    /// The slowest last check, in milliseconds (1 to 3,600,000).
    #[param(minimum = 1, maximum = 3_600_000)]
    max_latency_ms: Option<i64>,
    /// The oldest last proof of life, as a duration (`10m`, `1h`).
    max_age: Option<String>,
    /// Proxy ids or `host:port` not to answer, comma-separated.
    exclude: Option<String>,
    /// The site the client will fetch (`shop.example`, `host:port` or a
    /// URL): proxies it bans or rests are left out; those that worked there
    /// win `/proxy`'s draw of two and come first in `/proxies`.
    site: Option<String>,
}

/// `/proxy`'s own parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ProxyParams {
    /// `json` (default) or `text` (`scheme://host:port`; errors as text too).
    format: Option<String>,
    /// Re-check the proxy before answering.
    verify: Option<bool>,
}

/// `/proxies`' own parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ListParams {
    /// `alive` (default), `dead`, `unknown` or `all`.
    status: Option<String>,
    /// `latency` (default), `last_checked` or `uptime`.
    sort: Option<String>,
    /// Rows per page (1 to 1,000; 100 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// Rows skipped.
    #[param(minimum = 0)]
    offset: Option<i64>,
}

/// `/proxies/browse`' parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct BrowseParams {
    /// Part of the address (`scheme://host:port`), or a country code;
    /// 100 characters at most.
    #[param(max_length = 100)]
    q: Option<String>,
    /// `all` (default), `alive`, `dead` or `unknown`.
    status: Option<String>,
    /// Schemes, comma-separated: `http`, `socks4`, `socks5`.
    scheme: Option<String>,
    /// Country codes, comma-separated (`US,DE`).
    country: Option<String>,
    /// `id` (default: first stored first), `latency` (fastest first) or
    /// `last_checked` (latest first).
    sort: Option<String>,
    /// Rows per page (1 to 500; 50 by default).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<i64>,
    /// The `next` of the previous page (of the same sort).
    after: Option<String>,
    /// The `prev` of the next page (of the same sort).
    before: Option<String>,
}

/// `/export`'s own parameter.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct ExportParams {
    /// `txt` (default), `json` or `csv`.
    format: Option<String>,
}

/// `GET /crawls`' parameters.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct CrawlListParams {
    /// Jobs per page (1 to 1,000; 100 by default).
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<i64>,
    /// The `next` of the previous page: jobs older than this one.
    #[param(minimum = 1)]
    after: Option<i64>,
}

/// `GET /crawls/{id}/pages`' parameter.
#[derive(IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
pub struct PagesParams {
    /// Page lines skipped (the `X-Crawl-Lines` of an earlier call).
    #[param(minimum = 0)]
    after: Option<i64>,
}

/// A crawl job as the API shows it: the crawl jobs' own typed view.
pub use crate::crawl::jobs::JobView as CrawlJob;

/// A page of crawl jobs.
#[derive(Serialize, ToSchema)]
#[allow(dead_code)]
pub struct CrawlList {
    /// Newest first.
    crawls: Vec<CrawlJob>,
    /// The `after` of the next page, while there may be one.
    next: Option<i64>,
}

/// A crawl job's options: the crawl's own spec, so the document lists
/// every field `POST /crawls` reads.
pub use crate::crawl::spec::CrawlSpec;

/// The login form.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct LoginForm {
    /// `api.token`.
    token: String,
}

/// A form that changes something: its CSRF token.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct CsrfForm {
    /// The token in the dashboard page's forms.
    csrf: String,
}
