//! What each site taught about each proxy that reached it: one record per
//! (proxy, site) pair, fed by the gateway, crawl jobs, the pool and client
//! reports: uses that worked there and their latency, blocks, and a ban or
//! rest still running. Bans and what worked are written to the store (see
//! [`SiteRecord`]) so that a restart keeps them; rests for a rate limit are
//! short and stay in memory.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::model::{Block, UseVerdict};
use crate::store::SiteRecord;

/// The most (proxy, site) pairs kept; expired rests and stale records are
/// dropped first.
pub(super) const MAX_PAIRS: usize = 100_000;

/// A record nothing renewed for this long is dropped when the book is full
/// and not loaded at start (ms).
pub(super) const KEEP_FOR_MS: i64 = 7 * 24 * 3600 * 1000;

/// One proxy at one site.
#[derive(Clone, Copy, Debug, Default)]
struct Pair {
    /// Banned or resting until then.
    until: Option<Instant>,
    /// The ban's end as a wall-clock time (unix ms), for the store: rests
    /// for a rate limit leave it unset.
    banned_until: Option<i64>,
    worked: i64,
    blocked: i64,
    /// Smoothed latency of the uses that worked there, in ms.
    latency_ms: Option<f64>,
    last_worked: Option<i64>,
    last_blocked: Option<i64>,
    /// When the record last changed (unix ms).
    updated: i64,
    /// In the book's dirty set: a use that worked marks the pair once, not
    /// once per request (a `String` each).
    dirty: bool,
}

impl Pair {
    fn resting(&self, now: Instant) -> bool {
        self.until.is_some_and(|u| u > now)
    }

    fn record(&self, site: &str, id: i64) -> SiteRecord {
        SiteRecord {
            site: site.to_owned(),
            proxy_id: id,
            worked: self.worked,
            blocked: self.blocked,
            latency_ms: self.latency_ms.map(|l| l.round() as i64),
            last_worked_at: self.last_worked,
            last_blocked_at: self.last_blocked,
            banned_until: self.banned_until,
            updated_at: self.updated,
        }
    }
}

/// The pairs of one site.
#[derive(Debug, Default)]
pub(super) struct Site {
    pairs: super::IdMap<Pair>,
}

impl Site {
    /// Until when the site bans or rests proxy `id`, if it does at `now`.
    pub(super) fn until(&self, id: i64, now: Instant) -> Option<Instant> {
        self.pairs
            .get(&id)
            .and_then(|p| p.until)
            .filter(|u| *u > now)
    }

    /// Lower is better: proxies that worked there first, by their latency
    /// there; then the others.
    pub(super) fn rank(&self, id: i64) -> (u8, u64) {
        match self.pairs.get(&id) {
            Some(p) if p.worked > 0 => (0, p.latency_ms.unwrap_or(f64::MAX) as u64),
            _ => (1, 0),
        }
    }
}

/// Every site's pairs, bounded, with the pairs changed since the store was
/// last written.
#[derive(Debug, Default)]
pub(super) struct SiteBook {
    sites: HashMap<String, Site>,
    pairs: usize,
    dirty: HashSet<(String, i64)>,
}

/// What one use of a proxy at a site taught: its verdict, and what the
/// book keeps beside it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Taught {
    pub verdict: UseVerdict,
    /// How long a use that worked took, when known.
    pub latency: Option<Duration>,
    /// How long a block bans (a ban page, a report) or rests (a bare
    /// refusal, a rate limit) the pair.
    pub rest: Duration,
}

impl Taught {
    /// A use that worked, in `latency` when known.
    pub fn worked(latency: Option<Duration>) -> Taught {
        Taught {
            verdict: UseVerdict::Worked,
            latency,
            rest: Duration::ZERO,
        }
    }

    /// A block that bans or rests the pair for `rest`.
    pub fn blocked(block: Block, rest: Duration) -> Taught {
        Taught {
            verdict: UseVerdict::Blocked(block),
            latency: None,
            rest,
        }
    }
}

impl SiteBook {
    /// How many pairs are kept.
    pub(super) fn len(&self) -> usize {
        self.pairs
    }

    /// One site's pairs.
    pub(super) fn site(&self, site: &str) -> Option<&Site> {
        self.sites.get(site)
    }

    /// Records what a use taught of (`id`, `site`) at `now` (`now_ms` as
    /// unix ms): a use that worked and a refusal (a ban page, a bare
    /// refusal) are counted and kept; a rate limit only rests the pair,
    /// neither counted nor written; failures of the proxy or the target
    /// teach the site nothing. A rest never cuts a longer ban short. False
    /// when the book is full of live pairs and this is a new one.
    pub(super) fn note(
        &mut self,
        id: i64,
        site: &str,
        taught: Taught,
        now: Instant,
        now_ms: i64,
    ) -> bool {
        if !matches!(taught.verdict, UseVerdict::Worked | UseVerdict::Blocked(_)) {
            return true;
        }
        let known = self
            .sites
            .get(site)
            .is_some_and(|s| s.pairs.contains_key(&id));
        if !known && self.pairs >= MAX_PAIRS {
            self.prune(now, now_ms);
            if self.pairs >= MAX_PAIRS {
                return false;
            }
        }
        let s = match self.sites.get_mut(site) {
            Some(s) => s,
            None => self.sites.entry(site.to_owned()).or_default(),
        };
        let p = s.pairs.entry(id).or_default();
        if !known {
            self.pairs += 1;
        }
        let rest = |p: &mut Pair, d: Duration| {
            let until = now + d;
            p.until = Some(p.until.map_or(until, |u| u.max(until)));
        };
        match taught.verdict {
            UseVerdict::Blocked(Block::RateLimited) => {
                rest(p, taught.rest);
                return true;
            }
            UseVerdict::Blocked(_) => {
                let d = taught.rest;
                rest(p, d);
                p.blocked += 1;
                p.last_blocked = Some(now_ms);
                let until = now_ms + i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
                p.banned_until = Some(p.banned_until.map_or(until, |u| u.max(until)));
            }
            _ => {
                p.worked += 1;
                if let Some(latency) = taught.latency {
                    let ms = latency.as_secs_f64() * 1000.0;
                    p.latency_ms = Some(p.latency_ms.map_or(ms, |l| l * 0.7 + ms * 0.3));
                }
                p.last_worked = Some(now_ms);
            }
        }
        p.updated = now_ms;
        if !p.dirty {
            p.dirty = true;
            self.dirty.insert((site.to_owned(), id));
        }
        true
    }

    /// Brings stored records back (newest first, as loaded): bans still
    /// running rest their pairs again.
    pub(super) fn restore(&mut self, records: Vec<SiteRecord>, now: Instant, now_ms: i64) {
        for r in records {
            if self.pairs >= MAX_PAIRS {
                break;
            }
            let s = self.sites.entry(r.site).or_default();
            if s.pairs.contains_key(&r.proxy_id) {
                continue;
            }
            let until = r
                .banned_until
                .filter(|u| *u > now_ms)
                .map(|u| now + Duration::from_millis((u - now_ms) as u64));
            s.pairs.insert(
                r.proxy_id,
                Pair {
                    until,
                    banned_until: r.banned_until,
                    worked: r.worked,
                    blocked: r.blocked,
                    latency_ms: r.latency_ms.map(|l| l as f64),
                    last_worked: r.last_worked_at,
                    last_blocked: r.last_blocked_at,
                    updated: r.updated_at,
                    dirty: false,
                },
            );
            self.pairs += 1;
        }
    }

    /// The records changed since the last call.
    pub(super) fn take_dirty(&mut self) -> Vec<SiteRecord> {
        let dirty = std::mem::take(&mut self.dirty);
        dirty
            .into_iter()
            .filter_map(|(site, id)| {
                let p = self.sites.get_mut(&site)?.pairs.get_mut(&id)?;
                p.dirty = false;
                Some(p.record(&site, id))
            })
            .collect()
    }

    /// Drops pairs with nothing running and nothing recent to teach.
    fn prune(&mut self, now: Instant, now_ms: i64) {
        let horizon = now_ms - KEEP_FOR_MS;
        let mut kept = 0;
        self.sites.retain(|_, s| {
            s.pairs
                .retain(|_, p| p.resting(now) || (p.worked > 0 && p.updated >= horizon));
            kept += s.pairs.len();
            !s.pairs.is_empty()
        });
        self.pairs = kept;
        let sites = &self.sites;
        self.dirty
            .retain(|(site, id)| sites.get(site).is_some_and(|s| s.pairs.contains_key(id)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rest_never_cuts_a_ban_short_and_only_kept_events_are_written() {
        let mut book = SiteBook::default();
        let now = Instant::now();
        let ms = 1_000_000;
        let ban = Taught::blocked(Block::Banned, Duration::from_secs(600));
        let limit = Taught::blocked(Block::RateLimited, Duration::from_secs(1));
        book.note(1, "a", ban, now, ms);
        book.note(1, "a", limit, now, ms);
        let site = book.site("a").unwrap();
        assert_eq!(site.until(1, now), Some(now + Duration::from_secs(600)));
        book.note(2, "a", limit, now, ms);
        let worked = Taught::worked(Some(Duration::from_millis(80)));
        book.note(3, "a", worked, now, ms);
        let failed = Taught {
            verdict: UseVerdict::ProxyFailed(None),
            ..worked
        };
        book.note(4, "a", failed, now, ms);
        let written = book.take_dirty();
        let ids: HashSet<i64> = written.iter().map(|r| r.proxy_id).collect();
        assert_eq!(
            ids,
            HashSet::from([1, 3]),
            "a rate-limit rest is not written, a proxy failure not kept"
        );
        assert!(book.take_dirty().is_empty());
        let site = book.site("a").unwrap();
        assert_eq!(site.rank(3), (0, 80), "worked there, in 80 ms");
        assert!(site.rank(3) < site.rank(2) && site.rank(2) == site.rank(1));
    }

    #[test]
    fn restored_bans_rest_again_and_expired_ones_do_not() {
        let now = Instant::now();
        let ms = 5_000_000;
        let rec = |id, banned_until| SiteRecord {
            site: "shop".into(),
            proxy_id: id,
            worked: 0,
            blocked: 1,
            latency_ms: None,
            last_worked_at: None,
            last_blocked_at: Some(ms - 10),
            banned_until: Some(banned_until),
            updated_at: ms - 10,
        };
        let mut book = SiteBook::default();
        book.restore(vec![rec(1, ms + 60_000), rec(2, ms - 1)], now, ms);
        let site = book.site("shop").unwrap();
        assert!(site.until(1, now).is_some());
        assert!(site.until(2, now).is_none());
        assert_eq!(book.len(), 2);
    }
}
