//! What a client asks of the gateway: filters and a sticky session, given
//! in the proxy username (`country-de+scheme-socks5+session-abc`) or, for
//! plain HTTP, in `X-Proxywarden-*` headers; and the token check.

use base64::Engine;
use http::HeaderMap;
use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::health::{ProxyQuery, filters};
use crate::proxy::{Anonymity, Country, Scheme};

/// The request headers that carry controls, stripped before forwarding.
pub const HEADER_PREFIX: &str = "x-proxywarden-";

/// The control keys, in the username and as `X-Proxywarden-<key>`.
pub const KEYS: [&str; 5] = ["country", "scheme", "anonymity", "latency", "session"];

/// The longest session name: it is a map key held for the session's life.
const MAX_SESSION: usize = 128;

/// What one client connection or request asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Controls {
    /// Any of these countries (empty: any).
    pub countries: Vec<Country>,
    /// Any of these schemes (empty: any).
    pub schemes: Vec<Scheme>,
    /// At least this anonymous.
    pub min_anonymity: Option<Anonymity>,
    /// At most this slow (ms, as checked).
    pub max_latency_ms: Option<i64>,
    /// Keep one proxy for every request naming this session.
    pub session: Option<String>,
}

/// A control the gateway does not understand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    /// Not one of the known keys.
    #[error(
        "unknown control {0:?} (known: country-CC, scheme-http|socks4|socks5, anonymity-transparent|anonymous|elite, latency-MS, session-NAME, joined with +)"
    )]
    Unknown(String),
    /// A known key given twice: which one is meant cannot be told.
    #[error("control {0:?} given twice; give each control once")]
    Twice(String),
    /// A known key with no value.
    #[error("control {0:?} needs a value, as in {0}-VALUE")]
    Bare(String),
    /// A known key with a value it cannot take.
    #[error("bad {key} {value:?}: expected {expected}")]
    Value {
        /// The key.
        key: &'static str,
        /// As given.
        value: String,
        /// What would do.
        expected: String,
    },
}

impl Controls {
    /// Reads a proxy username: words joined by `+`. A `key-value` word is
    /// a control and must be a known one, given once (a typo such as
    /// `contry-de` is an error, not silently no filter). A word without a
    /// `-` (`user`, `x`, a name) is ignored, so that clients which must
    /// send some username can send any; an empty username asks for
    /// nothing.
    pub fn from_username(user: &str) -> Result<Controls, ControlError> {
        let mut c = Controls::default();
        let mut seen: Vec<String> = Vec::new();
        for part in user.split('+').filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('-') else {
                let word = part.to_ascii_lowercase();
                if KEYS.contains(&word.as_str()) {
                    return Err(ControlError::Bare(word));
                }
                continue;
            };
            let key = key.to_ascii_lowercase();
            if seen.contains(&key) {
                return Err(ControlError::Twice(key));
            }
            c.set(&key, value)?;
            seen.push(key);
        }
        Ok(c)
    }

    /// Sets one control by key (`country`, `scheme`, `anonymity`,
    /// `latency`, `session`), from a username part or a header
    /// `X-Proxywarden-<key>`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ControlError> {
        let value = value.trim();
        let bad = |key, expected: &str| ControlError::Value {
            key,
            value: value.to_owned(),
            expected: expected.to_owned(),
        };
        match key {
            "country" => self.countries = list_of("country", value, filters::country)?,
            "scheme" => self.schemes = list_of("scheme", value, filters::scheme)?,
            "anonymity" => {
                self.min_anonymity =
                    Some(filters::anonymity(value).map_err(|expected| bad("anonymity", expected))?);
            }
            "latency" => {
                self.max_latency_ms = Some(
                    filters::max_latency_ms(value).map_err(|expected| bad("latency", expected))?,
                );
            }
            "session" => {
                let ok = !value.is_empty()
                    && value.len() <= MAX_SESSION
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
                if !ok {
                    return Err(bad("session", "1 to 128 letters, digits, '-', '_' or '.'"));
                }
                self.session = Some(value.to_owned());
            }
            other => return Err(ControlError::Unknown(other.to_owned())),
        }
        Ok(())
    }

    /// `base` narrowed by these controls.
    pub fn query(&self, base: &ProxyQuery) -> ProxyQuery {
        let mut q = base.clone();
        if !self.countries.is_empty() {
            q.countries = self.countries.clone();
        }
        if !self.schemes.is_empty() {
            q.schemes = self.schemes.clone();
        }
        if self.min_anonymity.is_some() {
            q.min_anonymity = self.min_anonymity;
        }
        if self.max_latency_ms.is_some() {
            q.max_latency_ms = self.max_latency_ms;
        }
        q
    }
}

/// The user and password of a `Proxy-Authorization: Basic` value.
pub fn basic_credentials(value: &[u8]) -> Option<(String, String)> {
    let value = std::str::from_utf8(value).ok()?.trim();
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let raw = String::from_utf8(raw).ok()?;
    let (user, pass) = raw.split_once(':')?;
    Some((user.to_owned(), pass.to_owned()))
}

/// True when `password` opens a gateway guarded by `token` (always, when
/// there is none). Compared in constant time.
pub fn admits(token: Option<&Secret>, password: Option<&str>) -> bool {
    match token {
        None => true,
        Some(t) => password.is_some_and(|p| bool::from(p.as_bytes().ct_eq(t.0.as_bytes()))),
    }
}

/// A control's comma-separated list (see [`filters::list`]).
fn list_of<T>(
    key: &'static str,
    value: &str,
    one: fn(&str) -> Result<T, &'static str>,
) -> Result<Vec<T>, ControlError> {
    filters::list(value, one).map_err(|(value, expected)| ControlError::Value {
        key,
        value,
        expected,
    })
}

impl Controls {
    /// The controls of a request: from the proxy username, then (plain
    /// HTTP only) from `X-Proxywarden-*` headers, which win.
    pub(super) fn of_request(
        user: &str,
        headers: &HeaderMap,
        plain: bool,
    ) -> Result<Controls, ControlError> {
        let mut c = Controls::from_username(user)?;
        if plain {
            let mut seen = Vec::new();
            for (name, value) in headers {
                if let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) {
                    if seen.contains(&key) {
                        return Err(ControlError::Twice(name.as_str().to_owned()));
                    }
                    seen.push(key);
                    let value = value.to_str().map_err(|_| ControlError::Value {
                        key: "header",
                        value: name.as_str().to_owned(),
                        expected: "a value in plain ASCII".to_owned(),
                    })?;
                    c.set(key, value)?;
                }
            }
        }
        Ok(c)
    }
}

/// The filters asked for, as the username would spell them.
pub(super) fn describe(c: &Controls) -> String {
    let mut parts = Vec::new();
    if !c.countries.is_empty() {
        let list: Vec<&str> = c.countries.iter().map(|c| c.as_str()).collect();
        parts.push(format!("country {}", list.join(",")));
    }
    if !c.schemes.is_empty() {
        let list: Vec<&str> = c.schemes.iter().map(|s| s.as_str()).collect();
        parts.push(format!("scheme {}", list.join(",")));
    }
    if let Some(a) = c.min_anonymity {
        parts.push(format!("anonymity {a}"));
    }
    if let Some(ms) = c.max_latency_ms {
        parts.push(format!("latency ≤ {ms} ms"));
    }
    if let Some(s) = &c.session {
        parts.push(format!("session {s}"));
    }
    parts.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_carry_filters_and_a_session() {
        let c =
            Controls::from_username("country-de,us+scheme-socks5+anonymity-elite+session-abc-1")
                .unwrap();
        assert_eq!(
            c.countries,
            vec![Country::parse("DE").unwrap(), Country::parse("US").unwrap()]
        );
        assert_eq!(c.schemes, vec![Scheme::Socks5]);
        assert_eq!(c.min_anonymity, Some(Anonymity::Elite));
        assert_eq!(c.session.as_deref(), Some("abc-1"));
        assert_eq!(Controls::from_username("").unwrap(), Controls::default());
        assert_eq!(
            Controls::from_username("colour-red"),
            Err(ControlError::Unknown("colour".into()))
        );
        // A word that is not a control (the name a client must send) is
        // ignored; a known key without a value is not.
        assert_eq!(Controls::from_username("bob").unwrap(), Controls::default());
        assert_eq!(
            Controls::from_username("user+country-de")
                .unwrap()
                .countries,
            vec![Country::parse("DE").unwrap()]
        );
        assert_eq!(
            Controls::from_username("country"),
            Err(ControlError::Bare("country".into()))
        );
        assert_eq!(
            Controls::from_username("country-de+Country-us"),
            Err(ControlError::Twice("country".into()))
        );
        let e = Controls::from_username("country-germany").unwrap_err();
        assert!(e.to_string().contains("bad country \"germany\""), "{e}");
        assert!(Controls::from_username("session-a b").is_err());
        assert!(Controls::from_username("latency-0").is_err());
    }

    #[test]
    fn basic_credentials_and_the_token() {
        // RFC 7617's example.
        let v = b"Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==";
        assert_eq!(
            basic_credentials(v),
            Some(("Aladdin".into(), "open sesame".into()))
        );
        assert_eq!(basic_credentials(b"Bearer x"), None);
        let t = Secret("tok".into());
        assert!(admits(Some(&t), Some("tok")));
        assert!(!admits(Some(&t), Some("to")));
        assert!(!admits(Some(&t), None));
        assert!(admits(None, None));
        assert!(admits(None, Some("anything")));
    }
}
