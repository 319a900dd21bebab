//! Idle upstream connections kept for the next request to the same place:
//! the one cache behind the pool's fetches and the gateway's plain
//! requests. A request still picks its proxy; only the connection to it is
//! reused, so a request costs no new TCP connection (nor proxy handshake,
//! nor TLS) on a busy proxy.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock;

/// A connection that can be kept idle.
pub trait Reusable {
    /// False once the peer closed it or it cannot take a request now.
    fn usable(&self) -> bool;
}

/// How many idle connections are kept, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct IdleLimits {
    /// Per key: about the requests one proxy carries at once; more close.
    pub per_key: usize,
    /// In all.
    pub total: usize,
    /// An idle connection older than this is closed rather than reused:
    /// peers drop quiet connections after some seconds, and a request on
    /// one they are closing fails.
    pub keep_for: Duration,
}

struct Idle<C> {
    conn: C,
    since: Instant,
}

struct Conns<K, C> {
    by_key: HashMap<K, Vec<Idle<C>>>,
    count: usize,
    /// When those too old or closed were last let go: at most one
    /// `keep_for` ago while connections are put back, so a connection to
    /// a proxy no request goes through again is closed soon after it is
    /// too old to reuse, not kept until the cache fills.
    swept: Instant,
}

/// Idle connections by key (which proxy, and where through it), bounded
/// per key and in all.
pub struct IdleConns<K, C> {
    limits: IdleLimits,
    conns: Mutex<Conns<K, C>>,
}

impl<K: Hash + Eq + Clone, C: Reusable> IdleConns<K, C> {
    /// An empty cache kept within `limits`.
    pub fn new(limits: IdleLimits) -> IdleConns<K, C> {
        IdleConns {
            limits,
            conns: Mutex::new(Conns {
                by_key: HashMap::new(),
                count: 0,
                swept: Instant::now(),
            }),
        }
    }

    /// The newest idle connection for `key` still usable and young enough.
    pub fn take(&self, key: &K) -> Option<C> {
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        let list = conns.by_key.get_mut(key)?;
        // An emptied list stays for the connection put back after the
        // request (no allocation, no second hash of the key): with requests
        // spread over many proxies most lists hold one connection at a
        // time. A sweep lets empty lists go.
        while let Some(c) = list.pop() {
            conns.count -= 1;
            if c.since.elapsed() < self.limits.keep_for && c.conn.usable() {
                return Some(c.conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to `key`, room allowing.
    pub fn put(&self, key: K, conn: C) {
        if !conn.usable() {
            return;
        }
        let keep_for = self.limits.keep_for;
        let mut guard = lock(&self.conns);
        let conns = &mut *guard;
        // Swept too once the keys (empty lists among them) outnumber the
        // connections kept in all twice over: the map stays bounded.
        if conns.count >= self.limits.total
            || conns.by_key.len() >= 2 * self.limits.total
            || conns.swept.elapsed() >= keep_for
        {
            conns.by_key.retain(|_, list| {
                list.retain(|c| c.since.elapsed() < keep_for && c.conn.usable());
                !list.is_empty()
            });
            conns.count = conns.by_key.values().map(Vec::len).sum();
            conns.swept = Instant::now();
            if conns.count >= self.limits.total {
                return;
            }
        }
        let list = conns.by_key.entry(key).or_default();
        if list.len() < self.limits.per_key {
            list.push(Idle {
                conn,
                since: Instant::now(),
            });
            conns.count += 1;
        }
    }

    /// Closes the idle connections whose key `through` matches (those
    /// through a proxy that failed).
    pub fn forget(&self, through: impl Fn(&K) -> bool) {
        let mut conns = lock(&self.conns);
        conns.by_key.retain(|k, _| !through(k));
        conns.count = conns.by_key.values().map(Vec::len).sum();
    }

    /// Idle connections kept now.
    pub fn len(&self) -> usize {
        lock(&self.conns).count
    }

    /// True when none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake(bool);
    impl Reusable for Fake {
        fn usable(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn kept_within_bounds_and_forgotten_by_proxy() {
        let idle = IdleConns::new(IdleLimits {
            per_key: 2,
            total: 3,
            keep_for: Duration::from_secs(60),
        });
        for _ in 0..3 {
            idle.put((1, "a"), Fake(true));
        }
        assert_eq!(idle.len(), 2, "two per key");
        idle.put((2, "a"), Fake(true));
        idle.put((3, "a"), Fake(true));
        assert_eq!(idle.len(), 3, "three in all");
        idle.put((4, "a"), Fake(false));
        assert!(idle.take(&(4, "a")).is_none(), "a closed one is not kept");
        idle.forget(|k| k.0 == 1);
        assert_eq!(idle.len(), 1);
        assert!(idle.take(&(2, "a")).is_some());
        assert!(idle.is_empty());
    }

    #[test]
    fn lists_emptied_by_takes_stay_bounded() {
        let idle = IdleConns::new(IdleLimits {
            per_key: 2,
            total: 3,
            keep_for: Duration::from_secs(60),
        });
        for proxy in 0..100 {
            idle.put((proxy, "a"), Fake(true));
            assert!(idle.take(&(proxy, "a")).is_some());
            assert!(idle.take(&(proxy, "a")).is_none());
            assert!(
                lock(&idle.conns).by_key.len() <= 6,
                "at most twice the total"
            );
        }
        assert!(idle.is_empty());
        // An emptied list takes the next connection put back.
        idle.put((99, "a"), Fake(true));
        assert!(idle.take(&(99, "a")).is_some());
    }

    #[test]
    fn those_too_old_are_let_go_when_others_are_put_back() {
        let keep_for = Duration::from_millis(30);
        let idle = IdleConns::new(IdleLimits {
            per_key: 2,
            total: 100,
            keep_for,
        });
        for proxy in 0..10 {
            idle.put((proxy, "a"), Fake(true));
        }
        assert_eq!(idle.len(), 10);
        // No request goes through those ten again; once they are too old
        // to reuse, the next connection put back lets them go.
        std::thread::sleep(keep_for + Duration::from_millis(5));
        idle.put((10, "a"), Fake(true));
        assert_eq!(idle.len(), 1, "only the new one is kept");
    }
}
