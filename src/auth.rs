//! Failed authentications per client address, one limiter for every token
//! the process checks (the API's bearer token, the dashboard's login, the
//! gateway's password): past [`FAILURES_PER_MINUTE`] wrong tokens in a
//! minute an address is refused until its minute is over, and the failures
//! are logged at most once a minute. Only failures count, and only the
//! address that made them is refused: the right token from elsewhere (its
//! neighbours in the same network included) is never locked out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock;

/// Wrong tokens one client address may present in a minute.
pub const FAILURES_PER_MINUTE: u32 = 10;

/// Client addresses remembered at once; past it the oldest window is
/// forgotten first.
const MAX_CLIENTS: usize = 65_536;

const WINDOW: Duration = Duration::from_secs(60);

/// The one limiter of failed authentications: a cheap handle to share.
#[derive(Debug, Default)]
pub struct AuthFailures {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Per client: when its window began and its failures in it.
    clients: HashMap<IpAddr, (Instant, u32)>,
    /// When failures were last logged, and those since not logged.
    logged: Option<Instant>,
    unlogged: u64,
}

/// The address a client counts as: itself for IPv4 (a network's neighbours
/// are not its accomplices), its /64 for IPv6 (what one holder usually
/// has).
fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        v4 => v4,
    }
}

impl AuthFailures {
    /// `Some(wait)` while `ip` is refused for its failures.
    pub fn locked(&self, ip: IpAddr) -> Option<Duration> {
        let now = Instant::now();
        let inner = lock(&self.inner);
        let (start, failures) = inner.clients.get(&client_key(ip))?;
        let left = WINDOW.saturating_sub(now.duration_since(*start));
        (*failures >= FAILURES_PER_MINUTE && !left.is_zero()).then_some(left)
    }

    /// `ip` presented a wrong token for `what` (`api`, `dashboard`,
    /// `gateway`).
    pub fn failed(&self, ip: IpAddr, what: &'static str) {
        let now = Instant::now();
        let key = client_key(ip);
        let mut inner = lock(&self.inner);
        if inner.clients.len() >= MAX_CLIENTS && !inner.clients.contains_key(&key) {
            inner
                .clients
                .retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            if inner.clients.len() >= MAX_CLIENTS
                && let Some(oldest) = inner
                    .clients
                    .iter()
                    .min_by_key(|(_, (start, _))| *start)
                    .map(|(k, _)| *k)
            {
                inner.clients.remove(&oldest);
            }
        }
        let entry = inner.clients.entry(key).or_insert((now, 0));
        if now.duration_since(entry.0) >= WINDOW {
            *entry = (now, 0);
        }
        entry.1 = entry.1.saturating_add(1);
        let failures = entry.1;
        inner.unlogged += 1;
        if inner
            .logged
            .is_none_or(|at| now.duration_since(at) >= WINDOW)
        {
            tracing::warn!(
                client = %ip,
                token = what,
                failures_from_client = failures,
                failures_since_last_log = inner.unlogged,
                "wrong tokens presented; past {FAILURES_PER_MINUTE} a minute a client address is refused"
            );
            inner.logged = Some(now);
            inner.unlogged = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_address_is_refused_for_its_own_failures_only_and_for_a_minute() {
        let auth = AuthFailures::default();
        let (guesser, neighbour) = ("10.0.0.7".parse().unwrap(), "10.0.0.8".parse().unwrap());
        for _ in 0..FAILURES_PER_MINUTE - 1 {
            auth.failed(guesser, "api");
            assert_eq!(auth.locked(guesser), None);
        }
        auth.failed(guesser, "gateway");
        assert!(auth.locked(guesser).is_some());
        assert_eq!(auth.locked(neighbour), None);
        tokio::time::advance(WINDOW).await;
        assert_eq!(auth.locked(guesser), None);
    }
}
