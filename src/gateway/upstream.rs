//! Kept-alive connections to upstream proxies for plain requests. The pool
//! still picks a proxy per request; only the connection to that proxy is
//! reused when its last answer allowed it, so a request costs no new TCP
//! connection (and, through SOCKS, no new handshake) on a busy proxy.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::combinators::BoxBody;
use hyper::client::conn::http1::SendRequest;
use tokio::time::Instant;

use crate::lock;
use crate::net::Target;
use crate::proxy::{Proxy, Scheme};

/// The body of a request forwarded upstream (and of the answers the
/// gateway makes itself).
pub(super) type Body = BoxBody<Bytes, hyper::Error>;

/// Idle connections kept per key: about the requests one proxy carries
/// at once under load; more are closed.
const IDLE_PER_KEY: usize = 32;
/// Idle connections kept in all.
const IDLE_TOTAL: usize = 1024;
/// An idle connection older than this is closed rather than reused:
/// proxies drop quiet connections after some seconds, and a request on one
/// they are closing fails.
const IDLE_FOR: Duration = Duration::from_secs(10);

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

struct Idle {
    kept: Kept,
    since: Instant,
}

#[derive(Default)]
struct IdleConns {
    conns: HashMap<Key, Vec<Idle>>,
    count: usize,
}

/// Idle upstream connections, bounded per key and in all.
#[derive(Default)]
pub(super) struct Upstreams {
    idle: Mutex<IdleConns>,
}

impl Upstreams {
    /// The newest idle connection for `key` still open and young enough.
    pub fn take(&self, key: &Key) -> Option<Kept> {
        let mut idle = lock(&self.idle);
        let pool = &mut *idle;
        let list = pool.conns.get_mut(key)?;
        let mut found = None;
        while let Some(c) = list.pop() {
            pool.count -= 1;
            if c.since.elapsed() < IDLE_FOR && !c.kept.sender.is_closed() {
                found = Some(c.kept);
                break;
            }
        }
        if list.is_empty() {
            pool.conns.remove(key);
        }
        found
    }

    /// Keeps `kept` for the next request through the same proxy.
    pub fn put(&self, kept: Kept) {
        if kept.sender.is_closed() {
            return;
        }
        let mut idle = lock(&self.idle);
        let pool = &mut *idle;
        if pool.count >= IDLE_TOTAL {
            pool.conns.retain(|_, list| {
                list.retain(|c| c.since.elapsed() < IDLE_FOR && !c.kept.sender.is_closed());
                !list.is_empty()
            });
            pool.count = pool.conns.values().map(Vec::len).sum();
            if pool.count >= IDLE_TOTAL {
                return;
            }
        }
        let list = pool.conns.entry(kept.key.clone()).or_default();
        if list.len() < IDLE_PER_KEY {
            list.push(Idle {
                kept,
                since: Instant::now(),
            });
            pool.count += 1;
        }
    }

    /// Closes the idle connections through proxy `id` (it failed).
    pub fn forget(&self, id: i64) {
        let mut idle = lock(&self.idle);
        idle.conns.retain(|k, _| k.id != id);
        idle.count = idle.conns.values().map(Vec::len).sum();
    }

    /// Idle connections kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.idle).count
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
