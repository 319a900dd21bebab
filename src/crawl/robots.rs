//! The robots.txt rules a crawl has read, per host, bounded in size and
//! age: a host's rules are read again once they are a day old (as search
//! engines re-read robots.txt), and a crawl of more hosts than the cache
//! holds forgets the oldest (their robots.txt is read again if they get
//! work later).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use texting_robots::Robot;
use tokio::time::Instant;

use crate::pool::{FetchError, Page};

/// Hosts whose rules are kept.
pub const MAX_HOSTS: usize = 10_000;
/// How long a host's rules hold before they are read again.
pub const MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// A host's rules: `None` allows everything (no robots.txt, a 4xx).
pub type Rules = Option<Arc<Robot>>;

/// Rules per host, with when they were read.
#[derive(Default)]
pub struct RobotsCache {
    hosts: HashMap<String, (Rules, Instant)>,
}

impl RobotsCache {
    /// Host `host`'s rules, unless unknown or older than [`MAX_AGE`].
    pub fn get(&self, host: &str) -> Option<Rules> {
        self.hosts
            .get(host)
            .filter(|(_, at)| at.elapsed() < MAX_AGE)
            .map(|(r, _)| r.clone())
    }

    /// Keeps host `host`'s rules, read now. When full, the rules past
    /// their age go, then the oldest tenth.
    pub fn insert(&mut self, host: &str, rules: Rules) {
        if self.hosts.len() >= MAX_HOSTS && !self.hosts.contains_key(host) {
            self.hosts.retain(|_, (_, at)| at.elapsed() < MAX_AGE);
            if self.hosts.len() >= MAX_HOSTS {
                let mut ages: Vec<Instant> = self.hosts.values().map(|(_, at)| *at).collect();
                let cut = MAX_HOSTS / 10;
                ages.select_nth_unstable(cut);
                let oldest = ages[cut];
                self.hosts.retain(|_, (_, at)| *at > oldest);
            }
        }
        self.hosts.insert(host.to_owned(), (rules, Instant::now()));
    }

    /// Hosts kept.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// True when no host's rules are kept.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }
}

pub(super) enum RobotsOutcome {
    Parsed(Robot),
    AllowAll,
    /// Why not.
    Unavailable(String),
    /// No proxy could carry the request: says nothing of the site.
    NoProxy(FetchError),
}

/// What a robots.txt fetch means: 2xx parsed, 4xx allow all, anything else
/// (5xx, no answer) disallow for now.
pub(super) fn robots_outcome(result: Result<Page, FetchError>, agent: &str) -> RobotsOutcome {
    match result {
        Ok(p) if p.status().is_success() => match Robot::new(agent, p.body()) {
            Ok(r) => RobotsOutcome::Parsed(r),
            Err(_) => RobotsOutcome::AllowAll,
        },
        Ok(p) if p.status().is_client_error() => RobotsOutcome::AllowAll,
        Err(FetchError::Exhausted {
            status: Some(s), ..
        }) if (400..500).contains(&s) && s != 429 => RobotsOutcome::AllowAll,
        Ok(p) => RobotsOutcome::Unavailable(format!("http {}", p.status().as_u16())),
        Err(e @ FetchError::NoProxy { .. }) => RobotsOutcome::NoProxy(e),
        Err(e) => RobotsOutcome::Unavailable(e.to_string()),
    }
}

/// The product token of a user agent (`proxywarden` of
/// `proxywarden/0.1 (+url)`): what robots.txt groups name.
pub(super) fn robots_agent(ua: &str) -> String {
    ua.split(['/', ' ']).next().unwrap_or(ua).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(body: &str) -> Rules {
        Some(Arc::new(
            Robot::new("proxywarden", body.as_bytes()).unwrap(),
        ))
    }

    #[test]
    fn the_cache_keeps_at_most_its_size_dropping_the_oldest() {
        let mut c = RobotsCache::default();
        for i in 0..MAX_HOSTS {
            c.insert(&format!("h{i}"), None);
        }
        assert_eq!(c.len(), MAX_HOSTS);
        c.insert("new", rules("User-agent: *\nDisallow: /private"));
        assert!(c.len() <= MAX_HOSTS - MAX_HOSTS / 10 + 1, "{}", c.len());
        assert!(c.get("h0").is_none(), "the oldest went");
        let kept = c.get("new").expect("the newest stays").expect("rules");
        assert!(!kept.allowed("http://x/private/a"));
        assert!(c.get(&format!("h{}", MAX_HOSTS - 1)).is_some());
        // A host already kept is replaced, not counted twice.
        let before = c.len();
        c.insert("new", None);
        assert_eq!(c.len(), before);
    }

    #[test]
    fn the_robots_agent_is_the_product_token() {
        assert_eq!(
            robots_agent("proxywarden/0.1.0 (+https://x)"),
            "proxywarden"
        );
        assert_eq!(robots_agent("MyBot"), "MyBot");
    }
}
