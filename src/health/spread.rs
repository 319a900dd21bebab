//! Who carried each site's requests lately: per site, the proxies whose
//! uses there worked in the last [`SPREAD_WINDOW`], so that an operator sees
//! whether requests rotate (how many distinct proxies, and the largest
//! share one of them took). Bounded in sites and in uses per site.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;

/// How far back the spread of a site's requests looks.
pub const SPREAD_WINDOW: Duration = Duration::from_secs(600);

/// Sites tracked; a new one pushes out the one used least recently.
pub const SPREAD_SITES: usize = 256;

/// Uses kept per site (the newest): a site busier than this within the
/// window is shown over its last this many uses.
pub const SPREAD_USES: usize = 4096;

/// How one site's requests spread over proxies in the window.
#[derive(Clone, Debug, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SiteSpread {
    /// The site (host, or `host:port`).
    pub site: String,
    /// Uses that worked there in the window (at most [`SPREAD_USES`]).
    pub uses: u64,
    /// Distinct proxies among them.
    pub proxies: u64,
    /// The largest share of them one proxy took, from 0 to 1.
    pub top_share: f64,
}

/// The recent uses of every tracked site, oldest first.
#[derive(Debug, Default)]
pub(super) struct Spread {
    sites: HashMap<String, VecDeque<(Instant, i64)>>,
}

impl Spread {
    /// A use of proxy `id` at `site` worked at `now`.
    pub(super) fn note(&mut self, site: &str, id: i64, now: Instant) {
        if !self.sites.contains_key(site) && self.sites.len() >= SPREAD_SITES {
            let oldest = self
                .sites
                .iter()
                .min_by_key(|(_, uses)| uses.back().map(|(at, _)| *at))
                .map(|(s, _)| s.clone());
            if let Some(oldest) = oldest {
                self.sites.remove(&oldest);
            }
        }
        let uses = match self.sites.get_mut(site) {
            Some(u) => u,
            None => self.sites.entry(site.to_owned()).or_default(),
        };
        if uses.len() >= SPREAD_USES {
            uses.pop_front();
        }
        uses.push_back((now, id));
        forget_before(uses, now);
    }

    /// Every site used in the window, the busiest first.
    pub(super) fn view(&mut self, now: Instant) -> Vec<SiteSpread> {
        self.sites.retain(|_, uses| {
            forget_before(uses, now);
            !uses.is_empty()
        });
        let mut out: Vec<SiteSpread> = self
            .sites
            .iter()
            .map(|(site, uses)| {
                let mut per: HashMap<i64, u64> = HashMap::new();
                for (_, id) in uses {
                    *per.entry(*id).or_default() += 1;
                }
                let top = per.values().copied().max().unwrap_or(0);
                SiteSpread {
                    site: site.clone(),
                    uses: uses.len() as u64,
                    proxies: per.len() as u64,
                    top_share: top as f64 / uses.len().max(1) as f64,
                }
            })
            .collect();
        out.sort_by(|a, b| b.uses.cmp(&a.uses).then_with(|| a.site.cmp(&b.site)));
        out
    }
}

/// Drops the uses older than the window.
fn forget_before(uses: &mut VecDeque<(Instant, i64)>, now: Instant) {
    while uses
        .front()
        .is_some_and(|(at, _)| now.saturating_duration_since(*at) > SPREAD_WINDOW)
    {
        uses.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_proxies_and_the_top_share_in_the_window() {
        let mut s = Spread::default();
        let t0 = Instant::now();
        for (i, id) in [1, 2, 3, 1].into_iter().enumerate() {
            s.note("a.test", id, t0 + Duration::from_secs(i as u64));
        }
        s.note("b.test", 9, t0);
        let v = s.view(t0 + Duration::from_secs(5));
        assert_eq!(
            v[0],
            SiteSpread {
                site: "a.test".into(),
                uses: 4,
                proxies: 3,
                top_share: 0.5
            }
        );
        assert_eq!(v[1].proxies, 1);
        // Eleven minutes on, only the uses of the last ten count.
        s.note("a.test", 4, t0 + Duration::from_secs(601));
        let v = s.view(t0 + Duration::from_secs(602));
        assert_eq!(v.len(), 1, "b.test aged out: {v:?}");
        assert_eq!((v[0].uses, v[0].proxies), (3, 3), "{v:?}");
    }

    #[test]
    fn sites_and_uses_are_bounded_and_the_oldest_site_goes_first() {
        let mut s = Spread::default();
        let t0 = Instant::now();
        for i in 0..SPREAD_SITES + 10 {
            s.note(
                &format!("s{i}.test"),
                1,
                t0 + Duration::from_millis(i as u64),
            );
        }
        for i in 0..SPREAD_USES + 50 {
            s.note("busy.test", i as i64, t0 + Duration::from_secs(1));
        }
        let v = s.view(t0 + Duration::from_secs(2));
        assert_eq!(v.len(), SPREAD_SITES);
        assert_eq!(v[0].site, "busy.test");
        assert_eq!(v[0].uses, SPREAD_USES as u64);
        assert!(!v.iter().any(|x| x.site == "s0.test"), "the oldest went");
        assert!(
            v.iter()
                .any(|x| x.site == format!("s{}.test", SPREAD_SITES + 9))
        );
    }
}
