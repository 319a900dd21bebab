//! Who a dashboard request comes from, and the guards on its forms. With
//! `api.token` set, a browser logs in once: the session cookie is HttpOnly,
//! SameSite=Strict and signed with the token (changing the token ends every
//! session). Every form that changes something carries a CSRF token bound
//! to that cookie (without a token, to a secret of this process), and is
//! refused when the browser says it comes from another site.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use hmac::{KeyInit, Mac};
use sha2::Sha256;

type Hmac = hmac::Hmac<Sha256>;

/// The session cookie's name.
pub const COOKIE: &str = "proxywarden_session";

/// How long a login lasts.
pub const SESSION_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// The most bytes of a session cookie read; a genuine one is about 110.
const MAX_COOKIE: usize = 256;

/// Sessions logged out and not yet expired that are remembered as ended;
/// past it the one closest to expiring is forgotten first. Logins are
/// rate-limited, so this many log-outs take a long time to reach.
const MAX_REVOKED: usize = 10_000;

/// How a request is let in, set by the API's access check for the
/// handlers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Access {
    /// No token is configured: the API is open (to names of this machine).
    Open,
    /// A valid bearer token.
    Bearer,
    /// A valid session cookie (its value).
    Session(String),
    /// A token is configured and the request has none: only the login
    /// form is shown.
    Anonymous,
}

/// The secrets the signatures need.
#[derive(Clone)]
pub struct Keys {
    /// `api.token`, when set: signs sessions and their CSRF tokens.
    token: Option<String>,
    /// Signs the CSRF token of an open (token-less) dashboard: random per
    /// process, so a page cannot know it without reading the dashboard.
    process: [u8; 32],
    /// Sessions logged out (their nonces), with when they would expire.
    revoked: Arc<Mutex<HashMap<String, i64>>>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys(<redacted>)")
    }
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Hmac {
    // HMAC takes keys of any length.
    let mut m = <Hmac as KeyInit>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_be_bytes());
        m.update(p);
    }
    m
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

impl Keys {
    /// Keys for `token` (none: an open API), with a fresh process secret.
    pub fn new(token: Option<&str>) -> Keys {
        Keys {
            token: token.map(str::to_owned),
            process: rand::random(),
            revoked: Arc::default(),
        }
    }

    /// Whether these keys sign with `token` (`api.token`): keys made for
    /// another token are replaced, which ends every session they signed.
    pub fn signs_for(&self, token: Option<&str>) -> bool {
        self.token.as_deref() == token
    }

    /// A new session cookie value, valid until `now_ms` + [`SESSION_TTL`]:
    /// `expiry.nonce.signature`. `None` without a token.
    pub fn new_session(&self, now_ms: i64) -> Option<String> {
        let token = self.token.as_ref()?;
        let expires = now_ms + SESSION_TTL.as_millis() as i64;
        let nonce: [u8; 16] = rand::random();
        let (expires, nonce) = (expires.to_string(), hex(&nonce));
        let sig = mac(
            token.as_bytes(),
            &[b"session", expires.as_bytes(), nonce.as_bytes()],
        )
        .finalize()
        .into_bytes();
        Some(format!("{expires}.{nonce}.{}", hex(&sig)))
    }

    /// Whether `value` is a session this token signed that has not
    /// expired at `now_ms`. The signature is compared in constant time.
    pub fn valid_session(&self, value: &str, now_ms: i64) -> bool {
        let Some(token) = &self.token else {
            return false;
        };
        let mut parts = value.splitn(3, '.');
        let (Some(expires), Some(nonce), Some(sig)) = (parts.next(), parts.next(), parts.next())
        else {
            return false;
        };
        let (Ok(until), Some(sig)) = (expires.parse::<i64>(), unhex(sig)) else {
            return false;
        };
        until > now_ms
            && !crate::lock(&self.revoked).contains_key(nonce)
            && mac(
                token.as_bytes(),
                &[b"session", expires.as_bytes(), nonce.as_bytes()],
            )
            .verify_slice(&sig)
            .is_ok()
    }

    /// Ends the session `value` (logged out): it is no longer valid, even
    /// where a copy of the cookie was kept.
    pub fn revoke(&self, value: &str, now_ms: i64) {
        let mut parts = value.splitn(3, '.');
        let (Some(Ok(until)), Some(nonce)) = (parts.next().map(str::parse::<i64>), parts.next())
        else {
            return;
        };
        let mut revoked = crate::lock(&self.revoked);
        if revoked.len() >= MAX_REVOKED {
            revoked.retain(|_, until| *until > now_ms);
        }
        if revoked.len() >= MAX_REVOKED
            && let Some(first) = revoked
                .iter()
                .min_by_key(|(_, until)| **until)
                .map(|(n, _)| n.clone())
        {
            revoked.remove(&first);
        }
        revoked.insert(nonce.to_owned(), until);
    }

    /// The CSRF token of the forms shown to `access`: bound to its session
    /// cookie, or with no token configured to this process.
    pub fn csrf(&self, access: &Access) -> String {
        let m = match (access, &self.token) {
            (Access::Session(cookie), Some(token)) => {
                mac(token.as_bytes(), &[b"csrf", cookie.as_bytes()])
            }
            // A bearer client has no cookie to bind to; its token is the
            // proof, but the form still needs a value the page alone knows.
            (_, Some(token)) => mac(token.as_bytes(), &[b"csrf", b"bearer"]),
            (_, None) => mac(&self.process, &[b"csrf", b"open"]),
        };
        hex(&m.finalize().into_bytes())
    }

    /// Whether `presented` is the CSRF token of `access` (constant time).
    pub fn valid_csrf(&self, access: &Access, presented: &str) -> bool {
        use subtle::ConstantTimeEq;
        let expected = self.csrf(access);
        bool::from(expected.as_bytes().ct_eq(presented.as_bytes()))
    }
}

/// The session cookie's value in `headers`, if one was sent.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.trim_matches('"'))
        .filter(|value| value.len() <= MAX_COOKIE)
        .map(str::to_owned)
}

/// The `Set-Cookie` value logging a browser in with `value`.
pub fn set_cookie(value: &str) -> HeaderValue {
    let header = format!(
        "{COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
        SESSION_TTL.as_secs()
    );
    // The value is digits, dots and hex.
    HeaderValue::from_str(&header).expect("a session cookie is ASCII")
}

/// The `Set-Cookie` value logging a browser out.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("proxywarden_session=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict")
}

/// Refuses a form post the browser says comes from another site: a
/// `Sec-Fetch-Site` other than `same-origin` (or `none`, typed by the
/// user), or an `Origin` whose host and port are not the request's `Host`.
/// Clients that send neither are not browsers; the CSRF token still
/// guards them.
pub fn same_origin(headers: &HeaderMap) -> Result<(), String> {
    if let Some(site) = headers.get("sec-fetch-site") {
        let site = site.to_str().unwrap_or("");
        if !site.eq_ignore_ascii_case("same-origin") && !site.eq_ignore_ascii_case("none") {
            return Err(format!(
                "the form was posted from another site (Sec-Fetch-Site: {site}); \
                 use the dashboard's own page"
            ));
        }
    }
    match foreign_origin(headers) {
        None => Ok(()),
        Some((shown, _)) => Err(format!(
            "the form was posted from another origin ({shown:?}, not this dashboard's); \
             use the dashboard's own page"
        )),
    }
}

/// The request's `Origin` (its first 100 characters) and `Host` when the
/// `Origin` names another authority than the `Host`; `None` without an
/// `Origin` (clients that are not browsers) or when they agree.
pub fn foreign_origin(headers: &HeaderMap) -> Option<(String, String)> {
    let origin = headers.get(header::ORIGIN)?.to_str().unwrap_or("");
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let authority = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match authority {
        Some(a) if !host.is_empty() && a.eq_ignore_ascii_case(host) => None,
        _ => Some((origin.chars().take(100).collect(), host.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_holds_until_it_expires_or_the_token_changes() {
        let keys = Keys::new(Some("sixteen-chars-token"));
        let s = keys.new_session(1_000).unwrap();
        assert!(keys.valid_session(&s, 2_000));
        assert!(!keys.valid_session(&s, 1_000 + SESSION_TTL.as_millis() as i64));
        assert!(!Keys::new(Some("another-token-here")).valid_session(&s, 2_000));
        // A longer expiry does not carry the old signature.
        let (_, rest) = s.split_once('.').unwrap();
        assert!(!keys.valid_session(&format!("99999999999999.{rest}"), 2_000));
        assert!(!keys.valid_session("garbage", 2_000));
        assert!(Keys::new(None).new_session(0).is_none());
    }

    #[test]
    fn a_csrf_token_is_bound_to_its_session() {
        let keys = Keys::new(Some("sixteen-chars-token"));
        let a = Access::Session(keys.new_session(0).unwrap());
        let b = Access::Session(keys.new_session(0).unwrap());
        let t = keys.csrf(&a);
        assert!(keys.valid_csrf(&a, &t));
        assert!(!keys.valid_csrf(&b, &t));
        assert!(!keys.valid_csrf(&a, ""));
        let open = Keys::new(None);
        assert!(open.valid_csrf(&Access::Open, &open.csrf(&Access::Open)));
        assert!(!Keys::new(None).valid_csrf(&Access::Open, &open.csrf(&Access::Open)));
    }

    #[test]
    fn cross_site_posts_are_told_apart() {
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut h = HeaderMap::new();
            for (k, v) in pairs {
                h.insert(*k, HeaderValue::from_static(v));
            }
            h
        };
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])).is_ok());
        assert!(
            same_origin(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://127.0.0.1:8080"),
                ("sec-fetch-site", "same-origin"),
            ]))
            .is_ok()
        );
        assert!(
            same_origin(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("origin", "http://evil.example"),
            ]))
            .is_err()
        );
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080"), ("origin", "null")])).is_err());
        assert!(
            same_origin(&headers(&[
                ("host", "127.0.0.1:8080"),
                ("sec-fetch-site", "cross-site"),
            ]))
            .is_err()
        );
    }

    #[test]
    fn the_cookie_is_read_among_others() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; proxywarden_session=1.2.3; b=2"),
        );
        assert_eq!(session_cookie(&h).as_deref(), Some("1.2.3"));
        assert_eq!(session_cookie(&HeaderMap::new()), None);
    }
}
