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
pub(super) fn read(a: &mut Section) -> Option<ApiConfig> {
    let listen = a.parsed::<SocketAddr>("listen", "an address like \"127.0.0.1:8080\"");
    // "" also means no token: example files before it was commented out
    // wrote `token = ""`.
    let token = a
        .optional("token", Section::string)
        .filter(|t| !t.is_empty())
        .map(Secret);
    let max_age = a.duration("max_age");
    let judge = a.boolean("judge");
    let judge_per_minute = a.int("judge_per_minute", 1, 1_000_000);
    let request_timeout = a.duration("request_timeout");
    if let Some(listen) = listen
        && !listen.ip().is_loopback()
        && token.is_none()
    {
        a.problem(
            "listen",
            &format!(
                "{listen} is not a loopback address: set api.token so that strangers cannot use the API"
            ),
        );
    }
    Some(ApiConfig {
        listen: listen?,
        token,
        max_age: max_age?,
        judge: judge?,
        // The range was checked, so the cast cannot truncate.
        judge_per_minute: judge_per_minute? as u32,
        request_timeout: request_timeout?,
    })
}
