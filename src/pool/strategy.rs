//! The pool's ways of choosing among the proxies it may use, as
//! [`health::Strategy`](crate::health::Strategy) implementations over what
//! the pool has learnt of each proxy (uses, successes, latency).

use std::sync::Arc;

use crate::health::{Entry, IdMap, Matches, Strategy, score};
pub use crate::model::StrategyKind;

/// What the pool has seen of one proxy.
#[derive(Clone, Debug, Default)]
pub(crate) struct Usage {
    /// Requests through it now.
    pub in_flight: u32,
    /// Requests handed to it so far.
    pub uses: u64,
    /// Of those, how many worked.
    pub ok: u64,
    /// And how many failed at the proxy.
    pub failed: u64,
    /// Smoothed latency of its successes, in ms.
    pub latency_ms: Option<f64>,
    /// Failures in a row; each doubles the next cooldown.
    pub streak: u32,
    /// Not handed out before this.
    pub cooldown_until: Option<tokio::time::Instant>,
}

impl Usage {
    /// Lower is better: latency over a smoothed success ratio, from what
    /// the pool saw when it has seen enough, else from the checks.
    pub fn score(&self, record: &Entry) -> f64 {
        let checks = score(record);
        let tries = self.ok + self.failed;
        if tries == 0 {
            return checks;
        }
        let latency = self
            .latency_ms
            .unwrap_or_else(|| record.latency_ms.unwrap_or(10_000) as f64)
            .max(1.0);
        let reliability = (self.ok as f64 + 1.0) / (tries as f64 + 2.0);
        latency / reliability
    }
}

/// A strategy bound to the pool's usage table for one pick.
pub(crate) struct Bound<'a> {
    pub kind: StrategyKind,
    pub usage: &'a IdMap<Usage>,
    /// The id the last round-robin pick returned.
    pub last: i64,
}

impl Bound<'_> {
    fn usage(&self, id: i64) -> Option<&Usage> {
        self.usage.get(&id)
    }
}

impl Strategy for Bound<'_> {
    fn choose(&self, matches: &mut Matches<'_>) -> Option<Arc<Entry>> {
        match self.kind {
            StrategyKind::Random => matches.sample(1).pop(),
            // The next id after the last one, wrapping to the lowest.
            StrategyKind::RoundRobin => matches.next_after(self.last).cloned(),
            StrategyKind::LeastUsed => matches
                .iter()
                .min_by_key(|e| {
                    self.usage(e.id)
                        .map_or((0, 0, e.id), |u| (u.in_flight, u.uses, e.id))
                })
                .cloned(),
            StrategyKind::FastestOfTwo => {
                // Two drawn independently, so every usable proxy can win;
                // one that worked at the site beats one that did not.
                let none = Usage::default();
                let (a, b) = matches.two()?;
                let key = |e: &Entry| {
                    let score = self.usage(e.id).unwrap_or(&none).score(e);
                    (matches.site_rank(e.id), score)
                };
                Some(if key(&b) < key(&a) { b } else { a })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::*;
    use crate::health::{HealthIndex, ProxyQuery};
    use crate::store::ProxyRecord;

    fn rec(id: i64, latency: i64) -> ProxyRecord {
        ProxyRecord::alive_for_test(id, latency)
    }

    fn pick(index: &HealthIndex, s: &Bound<'_>) -> i64 {
        index
            .pick(&ProxyQuery::default(), 1_000, s, &|_| false)
            .unwrap()
            .id
    }

    #[test]
    fn round_robin_visits_every_proxy_in_turn() {
        let index = HealthIndex::from_records((1..=5).map(|i| rec(i, 100)).collect());
        let usage = IdMap::default();
        let mut last = 0;
        let mut order = Vec::new();
        for _ in 0..7 {
            last = pick(
                &index,
                &Bound {
                    kind: StrategyKind::RoundRobin,
                    usage: &usage,
                    last,
                },
            );
            order.push(last);
        }
        assert_eq!(order, [1, 2, 3, 4, 5, 1, 2]);
    }

    #[test]
    fn least_used_takes_the_idlest() {
        let index = HealthIndex::from_records((1..=3).map(|i| rec(i, 100)).collect());
        let mut usage = IdMap::default();
        usage.insert(
            1,
            Usage {
                in_flight: 1,
                uses: 1,
                ..Usage::default()
            },
        );
        usage.insert(
            2,
            Usage {
                in_flight: 0,
                uses: 9,
                ..Usage::default()
            },
        );
        usage.insert(
            3,
            Usage {
                in_flight: 0,
                uses: 4,
                ..Usage::default()
            },
        );
        let s = Bound {
            kind: StrategyKind::LeastUsed,
            usage: &usage,
            last: 0,
        };
        assert_eq!(pick(&index, &s), 3);
    }

    #[test]
    fn fastest_of_two_favours_good_proxies_but_spreads_load() {
        let index = HealthIndex::from_records((1..=10).map(|i| rec(i, 100)).collect());
        let mut usage = IdMap::default();
        // Proxy 1 is fast and reliable in use; 2 fails most of the time.
        usage.insert(
            1,
            Usage {
                ok: 50,
                latency_ms: Some(10.0),
                uses: 50,
                ..Usage::default()
            },
        );
        usage.insert(
            2,
            Usage {
                ok: 1,
                failed: 20,
                uses: 21,
                ..Usage::default()
            },
        );
        let s = Bound {
            kind: StrategyKind::FastestOfTwo,
            usage: &usage,
            last: 0,
        };
        let mut counts = HashMap::new();
        for _ in 0..2_000 {
            *counts.entry(pick(&index, &s)).or_insert(0) += 1;
        }
        let seen: HashSet<i64> = counts.keys().copied().collect();
        assert!(seen.len() >= 8, "load spreads: {counts:?}");
        assert!(
            counts[&1] > counts.get(&2).copied().unwrap_or(0) * 3,
            "{counts:?}"
        );
        // 1 wins every pair it is in: about 2/10 of picks, against 1/10 fair.
        assert!(counts[&1] > 300, "{counts:?}");
    }

    #[test]
    fn random_spreads_uniformly() {
        let index = HealthIndex::from_records((1..=4).map(|i| rec(i, 100)).collect());
        let usage = IdMap::default();
        let s = Bound {
            kind: StrategyKind::Random,
            usage: &usage,
            last: 0,
        };
        let mut counts = HashMap::new();
        for _ in 0..2_000 {
            *counts.entry(pick(&index, &s)).or_insert(0) += 1;
        }
        assert_eq!(counts.len(), 4);
        assert!(counts.values().all(|&n| n > 350), "{counts:?}");
    }
}
