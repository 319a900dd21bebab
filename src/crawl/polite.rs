//! Politeness per target host, whichever proxy carries the request: request
//! starts spaced by the host's delay (the larger of `--delay` and
//! robots.txt's Crawl-delay), slowed down by 429/503 and `Retry-After`,
//! and sped back up as answers come normally. At most [`MAX_HOSTS`] hosts
//! are kept: beyond that, hosts idle for [`IDLE_FOR`] are forgotten first
//! (a host comes back with the crawl's delay and its robots.txt's), then
//! those whose turn came longest ago.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use tokio::time::Instant;
use url::Url;

use crate::pool::{Pacer, site_of};

/// The most a host is slowed down: its delay times this.
const MAX_SLOWDOWN: f64 = 64.0;
/// The delay a slowed-down host gets when it has none of its own.
const SLOW_FLOOR: Duration = Duration::from_millis(250);
/// Longest wait a `Retry-After` imposes on a host.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(600);
/// Hosts paced at once.
pub const MAX_HOSTS: usize = 10_000;
/// A host no request has started to for this long, and whose turn has
/// come, holds nothing worth keeping once the map is full.
pub const IDLE_FOR: Duration = Duration::from_secs(600);

#[derive(Debug)]
struct Host {
    /// No request starts before this.
    next_at: Instant,
    /// When the last request started.
    last_start: Option<Instant>,
    /// The host's own delay between request starts.
    delay: Duration,
    /// ≥ 1: how much slower than `delay` it goes after 429/503.
    slowdown: f64,
}

/// Per-host pacing shared by every fetch of a crawl.
#[derive(Debug)]
pub struct Politeness {
    base: Duration,
    hosts: Mutex<HashMap<String, Host>>,
}

impl Politeness {
    /// Spaces request starts to each host by at least `base`.
    pub fn new(base: Duration) -> Politeness {
        Politeness {
            base,
            hosts: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Host>> {
        self.hosts.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn host<'a>(&self, hosts: &'a mut HashMap<String, Host>, key: &str) -> &'a mut Host {
        if hosts.len() >= MAX_HOSTS && !hosts.contains_key(key) {
            make_room(hosts);
        }
        hosts.entry(key.to_owned()).or_insert_with(|| Host {
            next_at: Instant::now(),
            last_start: None,
            delay: self.base,
            slowdown: 1.0,
        })
    }

    /// Sets host `key`'s delay (robots.txt's Crawl-delay), never below the
    /// crawl's own.
    pub fn set_crawl_delay(&self, key: &str, delay: Duration) {
        let mut hosts = self.lock();
        let h = self.host(&mut hosts, key);
        h.delay = delay.max(self.base);
        // The request that fetched robots.txt counts: the next one waits
        // the new delay after it.
        if let Some(last) = h.last_start {
            h.next_at = h.next_at.max(last + current(h));
        }
    }

    /// When the next request to host `key` may start; `None` when no
    /// request to it has started yet (it may start at once).
    pub fn ready_at(&self, key: &str) -> Option<Instant> {
        self.lock().get(key).map(|h| h.next_at)
    }

    /// The delay now in force for host `key`.
    pub fn delay(&self, key: &str) -> Duration {
        let mut hosts = self.lock();
        current(self.host(&mut hosts, key))
    }

    /// Waits for host `key`'s turn and takes it.
    pub async fn take_turn(&self, key: &str) {
        loop {
            let at = {
                let mut hosts = self.lock();
                let h = self.host(&mut hosts, key);
                let now = Instant::now();
                if h.next_at <= now {
                    // A turn taken late (timer and scheduling lag) lends
                    // the next one up to a tenth of the delay, so lags do
                    // not add up over a crawl; any run of turns still
                    // spans at least its delays less that tenth.
                    let delay = current(h);
                    let late = (now - h.next_at).min(delay / 10);
                    h.next_at = now + delay - late;
                    h.last_start = Some(now);
                    return;
                }
                h.next_at
            };
            tokio::time::sleep_until(at).await;
        }
    }

    /// The request to host `key` whose turn came last is being sent only
    /// now (its connection's task ran late, or a kept connection was found
    /// closed and a new one dialed): the next turn counts from now, less the
    /// tenth a late turn may lend, so that requests arrive spaced by the
    /// delay however late one of them left.
    pub fn sent(&self, key: &str) {
        let mut hosts = self.lock();
        let h = self.host(&mut hosts, key);
        let Some(last) = h.last_start else { return };
        let now = Instant::now();
        let delay = current(h);
        let late = now.saturating_duration_since(last).min(delay / 10);
        h.next_at = h.next_at.max(now + delay - late);
        h.last_start = Some(now);
    }

    /// What host `key` answered.
    pub fn note(&self, key: &str, status: Option<StatusCode>, retry_after: Option<Duration>) {
        let mut hosts = self.lock();
        let h = self.host(&mut hosts, key);
        let limited = status.is_some_and(|s| matches!(s.as_u16(), 429 | 503));
        if limited {
            h.slowdown = (h.slowdown * 2.0).min(MAX_SLOWDOWN);
            let now = Instant::now();
            h.next_at = h.next_at.max(now + current(h));
        } else if status.is_some() {
            h.slowdown = (h.slowdown * 0.75).max(1.0);
        }
        if let Some(wait) = retry_after {
            h.next_at = h.next_at.max(Instant::now() + wait.min(MAX_RETRY_AFTER));
        }
    }
}

/// Forgets the hosts idle for [`IDLE_FOR`] whose turn has come; if that is
/// not a tenth of the map, the tenth whose turns come first.
fn make_room(hosts: &mut HashMap<String, Host>) {
    let now = Instant::now();
    let idle = |h: &Host| {
        h.next_at <= now
            && h.last_start
                .is_none_or(|t| now.duration_since(t) >= IDLE_FOR)
    };
    hosts.retain(|_, h| !idle(h));
    let cut = MAX_HOSTS / 10;
    if hosts.len() > MAX_HOSTS - cut {
        let mut turns: Vec<Instant> = hosts.values().map(|h| h.next_at).collect();
        turns.select_nth_unstable(cut);
        let first = turns[cut];
        hosts.retain(|_, h| h.next_at > first);
    }
}

fn current(h: &Host) -> Duration {
    if h.slowdown <= 1.0 {
        h.delay
    } else {
        h.delay.max(SLOW_FLOOR).mul_f64(h.slowdown)
    }
}

impl Pacer for Politeness {
    fn wait<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move { self.take_turn(&site_of(url)).await })
    }

    fn answered(&self, url: &Url, status: Option<StatusCode>, retry_after: Option<Duration>) {
        self.note(&site_of(url), status, retry_after);
    }

    fn sent(&self, url: &Url) {
        self.sent(&site_of(url));
    }

    fn ready_in(&self, url: &Url) -> Duration {
        self.ready_at(&site_of(url)).map_or(Duration::ZERO, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // On tokio's paused clock: it moves only when every task waits, so the
    // spacing is exact and costs no wall time.
    #[tokio::test(start_paused = true)]
    async fn turns_are_spaced_by_the_delay_and_slowed_by_429s() {
        let ms = Duration::from_millis;
        let p = Politeness::new(ms(20));
        p.set_crawl_delay("a", ms(100));
        let t0 = Instant::now();
        p.take_turn("a").await;
        p.take_turn("a").await;
        p.take_turn("a").await;
        assert_eq!(t0.elapsed(), ms(200));
        // Another host is not held up by the first.
        let t1 = Instant::now();
        p.take_turn("b").await;
        p.take_turn("b").await;
        assert_eq!(t1.elapsed(), ms(20));

        p.note("b", Some(StatusCode::TOO_MANY_REQUESTS), Some(ms(300)));
        let t2 = Instant::now();
        p.take_turn("b").await;
        // The slowed delay or Retry-After, whichever is longer.
        assert_eq!(t2.elapsed(), p.delay("b").max(ms(300)));
        assert_eq!(p.delay("b"), ms(500), "slowed: the floor, doubled");
        for _ in 0..10 {
            p.note("b", Some(StatusCode::OK), None);
        }
        assert_eq!(p.delay("b"), ms(20), "back to normal");
    }

    #[tokio::test]
    async fn the_next_turn_counts_from_a_request_sent_late() {
        let ms = Duration::from_millis;
        let p = Politeness::new(ms(100));
        p.take_turn("a").await;
        // Sent on time: the turn stands.
        p.sent("a");
        let on_time = p.ready_at("a").unwrap();
        // Sent 60 ms after its turn (a redial): the next waits from then.
        tokio::time::sleep(ms(60)).await;
        let sent = Instant::now();
        p.sent("a");
        let next = p.ready_at("a").unwrap();
        assert!(next >= sent + ms(90), "{:?}", next - sent);
        assert!(next > on_time + ms(40), "{:?}", next - on_time);
        let t = Instant::now();
        p.take_turn("a").await;
        assert!(Instant::now() - sent >= ms(90), "{:?}", t.elapsed());
    }

    #[test]
    fn the_hosts_kept_are_bounded() {
        let p = Politeness::new(Duration::from_secs(1));
        for i in 0..MAX_HOSTS + 500 {
            p.note(
                &format!("h{i}"),
                None,
                Some(Duration::from_secs(i as u64 + 1)),
            );
        }
        let kept = p.lock().len();
        assert!(kept <= MAX_HOSTS, "{kept}");
        // The hosts whose turns come last (the longest waits) are kept.
        let last = format!("h{}", MAX_HOSTS + 499);
        assert!(p.ready_at(&last).is_some());
        assert!(p.ready_at("h0").is_none());
    }
}
