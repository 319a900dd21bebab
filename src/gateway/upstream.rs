//! Kept-alive connections to upstream proxies for plain requests, in the
//! idle cache of `net`: what a kept connection leads to and when an answer
//! leaves it open.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::combinators::BoxBody;
use hyper::client::conn::http1::SendRequest;

use crate::net::{IdleConns, IdleLimits, Reusable, Target};
use crate::proxy::{Proxy, Scheme};

/// The body of a request forwarded upstream (and of the answers the
/// gateway makes itself).
pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// Idle connections kept: about the requests one proxy carries at once
/// under load per key, 1024 in all, each for at most 10 s (proxies drop
/// quiet connections after some seconds).
const IDLE: IdleLimits = IdleLimits {
    per_key: 32,
    total: 1024,
    keep_for: Duration::from_secs(10),
};

/// Where a kept connection leads: to an HTTP proxy itself, which takes
/// absolute-form requests for any target, or through a SOCKS proxy to one
/// target.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct Key {
    id: i64,
    target: Option<Target>,
}

impl Key {
    /// The key of a connection to `target` through proxy `id`.
    pub fn new(id: i64, proxy: &Proxy, target: &Target) -> Key {
        let target = (proxy.scheme != Scheme::Http).then(|| target.clone());
        Key { id, target }
    }
}

/// A connection that carried a request, to be kept once its answer has
/// been read to the end.
pub(super) struct Kept {
    pub key: Key,
    pub sender: SendRequest<Body>,
    /// The connection leads to an HTTP proxy (absolute-form requests).
    pub forward: bool,
}

impl Reusable for Kept {
    // Not `is_ready`: a connection is put back as its answer's body ends,
    // before hyper has marked it ready for the next request.
    fn usable(&self) -> bool {
        !self.sender.is_closed()
    }
}

/// Idle upstream connections, bounded per key and in all.
pub(super) struct Upstreams {
    idle: IdleConns<Key, Kept>,
}

impl Default for Upstreams {
    fn default() -> Upstreams {
        Upstreams {
            idle: IdleConns::new(IDLE),
        }
    }
}

impl Upstreams {
    /// The newest idle connection for `key` still open and young enough.
    pub fn take(&self, key: &Key) -> Option<Kept> {
        self.idle.take(key)
    }

    /// Keeps `kept` for the next request through the same proxy.
    pub fn put(&self, kept: Kept) {
        self.idle.put(kept.key.clone(), kept);
    }

    /// Closes the idle connections through proxy `id` (it failed).
    pub fn forget(&self, id: i64) {
        self.idle.forget(|k| k.id == id);
    }

    /// Idle connections kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.idle.len()
    }
}

/// True when an answer leaves its connection open for another request.
pub(super) fn keeps_alive(parts: &http::response::Parts) -> bool {
    parts.version == http::Version::HTTP_11
        && !parts.headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("close"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_proxies_share_a_key_across_targets_socks_ones_do_not() {
        let http = Proxy::parse_url("http://127.0.0.1:8080").unwrap();
        let socks = Proxy::parse_url("socks5://127.0.0.1:1080").unwrap();
        let a = Target::new("a.example", 80).unwrap();
        let b = Target::new("b.example", 80).unwrap();
        assert_eq!(Key::new(1, &http, &a), Key::new(1, &http, &b));
        assert_ne!(Key::new(1, &http, &a), Key::new(2, &http, &a));
        assert_ne!(Key::new(1, &socks, &a), Key::new(1, &socks, &b));
        assert_eq!(Upstreams::default().len(), 0);
    }

    #[test]
    fn answers_that_close_or_speak_http_1_0_are_not_kept() {
        let head = |version, connection: Option<&str>| {
            let mut b = http::Response::builder().version(version);
            if let Some(c) = connection {
                b = b.header(header::CONNECTION, c);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(keeps_alive(&head(http::Version::HTTP_11, None)));
        assert!(keeps_alive(&head(
            http::Version::HTTP_11,
            Some("keep-alive")
        )));
        assert!(!keeps_alive(&head(http::Version::HTTP_11, Some("Close"))));
        assert!(!keeps_alive(&head(http::Version::HTTP_10, None)));
    }
}
