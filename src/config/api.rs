//! `[api]`: the HTTP API's address, token and limits, and [`Secret`], the
//! string type that keeps the token out of logs.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::section::Section;

/// `[api]`
#[derive(Clone, Debug, PartialEq)]
pub struct ApiConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token, if any.
    pub token: Option<Secret>,
    /// Freshness required of served proxies.
    pub max_age: Duration,
    /// Serve `GET /judge`.
    pub judge: bool,
    /// `/judge` requests allowed per client address per minute.
    pub judge_per_minute: u32,
    /// Longest a request may take before it is answered 503.
    pub request_timeout: Duration,
}

/// A string that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Validates `[api]`.
pub(super) fn read(a: &mut Section) -> ApiConfig {
    let api = ApiConfig {
        listen: a
            .parsed::<SocketAddr>("listen", "an address like \"127.0.0.1:8080\"")
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
        token: a.string("token").filter(|t| !t.is_empty()).map(Secret),
        max_age: a.duration("max_age").unwrap_or(Duration::from_secs(1800)),
        judge: a.boolean("judge").unwrap_or(true),
        judge_per_minute: a.int("judge_per_minute", 1, 1_000_000).unwrap_or(120) as u32,
        request_timeout: a
            .duration("request_timeout")
            .unwrap_or(Duration::from_secs(15)),
    };
    if !api.listen.ip().is_loopback() && api.token.is_none() {
        a.problem(
            "listen",
            &format!(
                "{} is not a loopback address: set api.token so that strangers cannot use the API",
                api.listen
            ),
        );
    }
    api
}
