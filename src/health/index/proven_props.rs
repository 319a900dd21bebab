//! The proven groups against their plain definition (every indexed proxy
//! whose last passed check or worked use is at or after the time
//! [`HealthIndex::suspect_all`] was given) on random histories: records
//! applied alive and dead, moved between groups, uses that worked, sweeps
//! at random times; and a proven pick only ever among them.

use std::cell::RefCell;
use std::collections::BTreeSet;

use proptest::prelude::*;

use super::{Arc, Country, Entry, HealthIndex, Matches, ProxyQuery, ProxyRecord, Scheme, Status};

const COUNTRIES: [&str; 2] = ["US", "DE"];

/// What happens to the index.
#[derive(Clone, Debug)]
enum Step {
    /// A record of `id` in group (`scheme`, `country`), alive or not, last
    /// alive at `last_alive`.
    Apply {
        id: i64,
        scheme: usize,
        country: usize,
        alive: bool,
        last_alive: i64,
    },
    /// A use of `id` worked at `at`.
    Worked { id: i64, at: i64 },
    /// Every proxy is suspect from `since` on.
    Suspect { since: i64 },
    /// `id` leaves.
    Remove { id: i64 },
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    prop_oneof![
        4 => (1i64..40, 0usize..3, 0usize..3, any::<bool>(), 0i64..100).prop_map(
            |(id, scheme, country, alive, last_alive)| Step::Apply {
                id,
                scheme,
                country,
                alive,
                last_alive,
            }
        ),
        3 => (1i64..40, 0i64..100).prop_map(|(id, at)| Step::Worked { id, at }),
        1 => (0i64..100).prop_map(|since| Step::Suspect { since }),
        1 => (1i64..40).prop_map(|id| Step::Remove { id }),
    ]
}

/// Every match it is given, and the first of them as its choice.
struct All(RefCell<BTreeSet<i64>>);

impl super::Strategy for All {
    fn choose(&self, matches: &mut Matches<'_>) -> Option<Arc<Entry>> {
        *self.0.borrow_mut() = matches.iter().map(|e| e.id).collect();
        matches.iter().next().cloned()
    }
}

fn proven_matches(index: &HealthIndex, q: &ProxyQuery) -> BTreeSet<i64> {
    let all = All(RefCell::default());
    index.pick_proven_ranked(q, 1_000, &all, &|_| false, &|_| (1, 0));
    all.0.into_inner()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_proven_groups_hold_what_proved_itself_since_the_sweep(
        steps in prop::collection::vec(step(), 0..60),
        country in prop::option::of(0usize..2),
    ) {
        let index = HealthIndex::new();
        let mut since = None;
        for s in steps {
            match s {
                Step::Apply { id, scheme, country, alive, last_alive } => {
                    let mut r = ProxyRecord::alive_for_test(id, 100);
                    r.proxy.scheme = Scheme::ALL[scheme % Scheme::ALL.len()];
                    r.country = COUNTRIES.get(country).and_then(|c| Country::parse(c));
                    r.last_alive = Some(last_alive);
                    if !alive {
                        r.status = Status::Dead;
                    }
                    index.apply(vec![r]);
                }
                Step::Worked { id, at } => {
                    if let Some(e) = index.get(id) {
                        e.worked(at);
                        index.prove(id);
                    }
                }
                Step::Suspect { since: at } => {
                    index.suspect_all(at);
                    since = Some(at);
                }
                Step::Remove { id } => {
                    index.remove(id);
                }
            }
            let q = ProxyQuery {
                countries: country.iter().filter_map(|&c| Country::parse(COUNTRIES[c])).collect(),
                ..ProxyQuery::default()
            };
            // The plain definition: nothing is proven before the first sweep.
            let want: BTreeSet<i64> = index
                .select(&q, 1_000)
                .iter()
                .filter(|e| since.is_some_and(|at| e.proven_at().is_some_and(|t| t >= at)))
                .map(|e| e.id)
                .collect();
            prop_assert_eq!(proven_matches(&index, &q), want);
        }
    }
}
