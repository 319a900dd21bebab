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
    /// `/judge` requests allowed per client network (/24, /64) per minute.
    pub judge_per_minute: u32,
    /// Judge checks `verify=true` may make per minute, all clients together.
    pub verify_per_minute: u32,
    /// Longest a request may take before it is answered 503.
    pub request_timeout: Duration,
    /// Time a client has to send a request's head, from when the connection
    /// opens or its previous response has gone out.
    pub header_timeout: Duration,
    /// A connection on which nothing moves this long, outside a request
    /// being handled, is closed.
    pub idle_timeout: Duration,
    /// Open connections at most; at the cap the quietest one is closed to
    /// make room for a new one.
    pub max_connections: usize,
    /// Host names (lower case, no port) accepted in the `Host` header
    /// besides loopback names and addresses and the listen address, when
    /// there is no token.
    pub allowed_hosts: Vec<String>,
}

/// A string that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The shortest token accepted on an address other than loopback: anyone
/// who can reach the port can try tokens, so a short one is guessable.
pub const MIN_PUBLIC_TOKEN: usize = 16;

/// Validates `[api]`.
pub(super) fn read(a: &mut Section) -> Option<ApiConfig> {
    let listen = a.parsed::<SocketAddr>("listen", "an address like \"127.0.0.1:8080\"");
    let token = token(a);
    let max_age = a.duration("max_age");
    let judge = a.boolean("judge");
    let judge_per_minute = a.int("judge_per_minute", 1, 1_000_000);
    let verify_per_minute = a.int("verify_per_minute", 1, 1_000_000);
    let request_timeout = a.duration("request_timeout");
    let header_timeout = a.duration("header_timeout");
    let idle_timeout = a.duration("idle_timeout");
    let max_connections = a.int("max_connections", 1, 1_000_000);
    let allowed_hosts = allowed_hosts(a);
    guard_public(a, "api", listen, &token);
    Some(ApiConfig {
        listen: listen?,
        token,
        max_age: max_age?,
        judge: judge?,
        // The range was checked, so the cast cannot truncate.
        judge_per_minute: judge_per_minute? as u32,
        verify_per_minute: verify_per_minute? as u32,
        request_timeout: request_timeout?,
        header_timeout: header_timeout?,
        idle_timeout: idle_timeout?,
        // The range was checked, so the cast cannot truncate.
        max_connections: max_connections? as usize,
        allowed_hosts: allowed_hosts?,
    })
}

/// Reads `allowed_hosts`: a list of host names or IP addresses, written
/// as they appear in a `Host` header but without the port.
fn allowed_hosts(a: &mut Section) -> Option<Vec<String>> {
    let value = a.required("allowed_hosts")?;
    let toml::Value::Array(items) = value else {
        a.problem(
            "allowed_hosts",
            &format!(
                "expected a list of host names, found {}",
                super::section::type_name(&value)
            ),
        );
        return None;
    };
    let mut hosts = Vec::new();
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let key = format!("allowed_hosts[{i}]");
        let Some(text) = item.as_str() else {
            a.problem(&key, "expected a host name as a string");
            ok = false;
            continue;
        };
        match host_name(text) {
            Ok(h) => hosts.push(h),
            Err(e) => {
                a.problem(&key, &format!("{e}, found {text:?}"));
                ok = false;
            }
        }
    }
    ok.then_some(hosts)
}

/// A host as `allowed_hosts` holds it: lower case, an IPv6 address in
/// brackets as `Host` writes it.
fn host_name(text: &str) -> Result<String, &'static str> {
    let t = text.trim();
    if t.is_empty() {
        return Err("must not be blank");
    }
    if t.contains("://") || t.contains('/') {
        return Err("expected a host name without a scheme or path (e.g. \"proxies.lan\")");
    }
    if let Ok(v6) = t
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<std::net::Ipv6Addr>()
    {
        return Ok(format!("[{v6}]"));
    }
    if t.contains(':') {
        return Err("expected a host name without a port (any port is accepted)");
    }
    match url::Host::parse(t) {
        Ok(host) => Ok(host.to_string()),
        Err(_) => Err("expected a host name or an IP address"),
    }
}

/// Reads `token`: compared exactly as written, so it must not be blank,
/// start or end with blanks, or hold control characters.
pub(super) fn token(a: &mut Section) -> Option<Secret> {
    let token = a.optional("token", Section::string);
    // A blank one would guard nothing, and HTTP strips blanks around header
    // values, so a token that starts or ends with one could never be
    // presented.
    match token {
        Some(t) if t.trim().is_empty() => {
            a.problem(
                "token",
                "must not be blank (leave the key out to run without a token)",
            );
            None
        }
        Some(t) if t.trim() != t => {
            a.problem(
                "token",
                "must not start or end with blanks: HTTP strips them from headers, so it could never match",
            );
            None
        }
        Some(t) if t.chars().any(|c| c.is_control()) => {
            a.problem("token", "must not contain control characters");
            None
        }
        t => t.map(Secret),
    }
}

/// A `listen` address other than loopback needs a token of at least
/// [`MIN_PUBLIC_TOKEN`] characters in the same `section`.
pub(super) fn guard_public(
    a: &mut Section,
    section: &str,
    listen: Option<SocketAddr>,
    token: &Option<Secret>,
) {
    let Some(listen) = listen else { return };
    if listen.ip().is_loopback() {
        return;
    }
    match token {
        None if !a.has_problem("token") => a.problem(
            "listen",
            &format!(
                "{listen} is not a loopback address: set {section}.token so that strangers cannot use it"
            ),
        ),
        Some(t) if t.0.chars().count() < MIN_PUBLIC_TOKEN => a.problem(
            "token",
            &format!(
                "must be at least {MIN_PUBLIC_TOKEN} characters when {section}.listen ({listen}) is not a loopback address, found {}",
                t.0.chars().count()
            ),
        ),
        _ => {}
    }
}
