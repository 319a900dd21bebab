//! The round-robin walk in id order against its plain definition (the
//! match with the lowest id above the last, else the lowest of all) on
//! random indexes: random schemes, countries and latencies, records moved
//! between groups and dropped as dead, random filters, refusals and last
//! ids.

use std::cell::RefCell;
use std::collections::HashSet;

use proptest::prelude::*;

use super::*;

const COUNTRIES: [&str; 3] = ["US", "DE", "FR"];

/// A record of `id` in group (`scheme`, `country`: an index into
/// [`COUNTRIES`], or none past its end).
fn rec(id: i64, scheme: usize, country: usize, latency: i64) -> ProxyRecord {
    let mut r = ProxyRecord::alive_for_test(id, latency);
    r.proxy.scheme = Scheme::ALL[scheme % Scheme::ALL.len()];
    r.country = COUNTRIES.get(country).and_then(|c| Country::parse(c));
    r
}

/// The ids the walk, the scan and [`Matches::next_after`] chose.
type Chosen = (Option<i64>, Option<i64>, Option<i64>);

/// Runs both ways of [`Matches::next_after`] on the matches it is given.
struct Both {
    last: i64,
    seen: RefCell<Option<Chosen>>,
}

impl super::Strategy for Both {
    fn choose(&self, matches: &mut Matches<'_>) -> Option<Arc<Entry>> {
        let id = |e: Option<&Arc<Entry>>| e.map(|e| e.id);
        *self.seen.borrow_mut() = Some((
            id(matches.walk_after(self.last)),
            id(matches.scan_after(self.last)),
            id(matches.next_after(self.last)),
        ));
        None
    }
}

fn picks(index: &HealthIndex, q: &ProxyQuery, refused: &HashSet<i64>, last: i64) -> Chosen {
    let both = Both {
        last,
        seen: RefCell::new(None),
    };
    index.pick(q, 1_000, &both, &|e| refused.contains(&e.id));
    both.seen.into_inner().expect("the strategy ran")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_walk_in_id_order_is_the_plain_round_robin(
        proxies in prop::collection::vec((1i64..120, 0usize..3, 0usize..4, 1i64..1_000), 0..80),
        moved in prop::collection::vec((1i64..120, 0usize..3, 0usize..4), 0..10),
        dead in prop::collection::hash_set(1i64..120, 0..20),
        countries in prop::collection::vec(0usize..3, 0..3),
        schemes in prop::collection::vec(0usize..3, 0..3),
        max_latency in prop::option::of(1i64..1_000),
        excluded in prop::collection::hash_set(1i64..120, 0..10),
        refused in prop::collection::hash_set(1i64..120, 0..40),
        last in 0i64..125,
    ) {
        let index = HealthIndex::from_records(
            proxies.iter().map(|&(id, s, c, l)| rec(id, s, c, l)).collect(),
        );
        // Some move to another group, some die: the order follows.
        index.apply(moved.iter().map(|&(id, s, c)| rec(id, s, c, 100)).collect());
        index.apply(
            dead.iter()
                .map(|&id| ProxyRecord { status: Status::Dead, ..rec(id, 0, 0, 100) })
                .collect(),
        );
        let q = ProxyQuery {
            countries: countries.iter().filter_map(|&c| Country::parse(COUNTRIES[c])).collect(),
            schemes: schemes.iter().map(|&s| Scheme::ALL[s]).collect(),
            max_latency_ms: max_latency,
            exclude_ids: excluded,
            ..ProxyQuery::default()
        };
        // The plain definition, over every proxy the index still holds.
        let usable: Vec<i64> = index
            .select(&q, 1_000)
            .iter()
            .map(|e| e.id)
            .filter(|id| !refused.contains(id))
            .collect();
        let want = usable
            .iter()
            .copied()
            .filter(|&id| id > last)
            .min()
            .or_else(|| usable.iter().copied().min());
        let (walked, scanned, picked) = picks(&index, &q, &refused, last);
        prop_assert_eq!(walked, want);
        prop_assert_eq!(scanned, want);
        prop_assert_eq!(picked, want);
        // Never a proxy the index dropped as dead.
        prop_assert!(picked.is_none_or(|id| !dead.contains(&id)));
    }
}
