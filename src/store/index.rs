//! The health index: alive proxies in memory, so that serving one never
//! touches SQLite. Rebuilt from the store at start-up and refreshed from it
//! after every committed batch of check results.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock, RwLock};

use bytes::Bytes;
use std::time::Duration;

use rand::RngExt;

use super::{ProxyFilter, ProxyRecord, Store, StoreError};
use crate::proxy::{Anonymity, Country, Scheme, Status};

/// What a client asks of the proxies it is served; shared by the API,
/// exports and everything that picks proxies.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyQuery {
    /// Any of these countries (empty: any).
    pub countries: Vec<Country>,
    /// Any of these schemes (empty: any).
    pub schemes: Vec<Scheme>,
    /// At least this anonymous.
    pub min_anonymity: Option<Anonymity>,
    /// Only proxies that tunnel HTTPS.
    pub https: bool,
    /// Only proxies at most this slow.
    pub max_latency_ms: Option<i64>,
    /// Only proxies whose last passed check is at most this old.
    pub max_age: Option<Duration>,
    /// Proxy ids to leave out.
    pub exclude_ids: HashSet<i64>,
    /// Proxy addresses to leave out.
    pub exclude_addrs: HashSet<SocketAddr>,
}

impl ProxyQuery {
    /// True when `r` is alive, fresh enough at `now` (unix ms) and
    /// satisfies every other filter.
    pub fn matches(&self, r: &ProxyRecord, now: i64) -> bool {
        if r.status != Status::Alive {
            return false;
        }
        if let Some(age) = self.max_age {
            let fresh_since = now - i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            if r.last_alive.is_none_or(|t| t < fresh_since) {
                return false;
            }
        }
        self.matches_fields(r)
    }

    /// The filters that do not depend on status or time.
    pub fn matches_fields(&self, r: &ProxyRecord) -> bool {
        if !self.schemes.is_empty() && !self.schemes.contains(&r.proxy.scheme) {
            return false;
        }
        if !self.countries.is_empty()
            && !r
                .country
                .as_deref()
                .and_then(Country::parse)
                .is_some_and(|c| self.countries.contains(&c))
        {
            return false;
        }
        if let Some(min) = self.min_anonymity
            && r.anonymity.is_none_or(|a| a < min)
        {
            return false;
        }
        if self.https && r.https != Some(true) {
            return false;
        }
        if let Some(max) = self.max_latency_ms
            && r.latency_ms.is_none_or(|l| l > max)
        {
            return false;
        }
        if self.exclude_ids.contains(&r.id)
            || self
                .exclude_addrs
                .contains(&SocketAddr::new(r.proxy.host, r.proxy.port))
        {
            return false;
        }
        true
    }
}

/// An indexed proxy and, once it has been served, its rendered answer:
/// the same record is handed out many times between two checks, and
/// rendering it once is most of what serving costs.
#[derive(Debug)]
pub struct Served {
    /// The stored record.
    pub record: Arc<ProxyRecord>,
    rendered: [OnceLock<Bytes>; 2],
}

/// The forms an answer is rendered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rendering {
    /// JSON.
    Json,
    /// Plain text.
    Text,
}

impl Served {
    /// The answer for this record in `form`, made by `render` the first time.
    pub fn rendered(&self, form: Rendering, render: impl FnOnce(&ProxyRecord) -> Bytes) -> Bytes {
        self.rendered[form as usize]
            .get_or_init(|| render(&self.record))
            .clone()
    }
}

impl std::ops::Deref for Served {
    type Target = ProxyRecord;
    fn deref(&self) -> &ProxyRecord {
        &self.record
    }
}

/// Proxies are grouped by (scheme, country), the two filters that select
/// the smallest shares; a pick samples only the groups a query can match.
type Key = (Scheme, Option<Country>);

fn key_of(r: &ProxyRecord) -> Key {
    (
        r.proxy.scheme,
        r.country.as_deref().and_then(Country::parse),
    )
}

#[derive(Default)]
struct Inner {
    groups: HashMap<Key, Vec<Arc<Served>>>,
    pos: HashMap<i64, (Key, usize)>,
}

impl Inner {
    fn put(&mut self, r: ProxyRecord) {
        self.remove(r.id);
        if r.status != Status::Alive {
            return;
        }
        let key = key_of(&r);
        let group = self.groups.entry(key).or_default();
        self.pos.insert(r.id, (key, group.len()));
        group.push(Arc::new(Served {
            record: Arc::new(r),
            rendered: Default::default(),
        }));
    }

    fn remove(&mut self, id: i64) -> bool {
        let Some((key, i)) = self.pos.remove(&id) else {
            return false;
        };
        let Some(group) = self.groups.get_mut(&key) else {
            return false;
        };
        group.swap_remove(i);
        if let Some(moved) = group.get(i) {
            self.pos.insert(moved.id, (key, i));
        }
        if group.is_empty() {
            self.groups.remove(&key);
        }
        true
    }

    /// The groups `q` can match.
    fn groups_for<'a>(&'a self, q: &ProxyQuery) -> Vec<&'a [Arc<Served>]> {
        if q.countries.is_empty() {
            self.groups
                .iter()
                .filter(|((scheme, _), _)| q.schemes.is_empty() || q.schemes.contains(scheme))
                .map(|(_, g)| g.as_slice())
                .collect()
        } else {
            let schemes: &[Scheme] = if q.schemes.is_empty() {
                &Scheme::ALL
            } else {
                &q.schemes
            };
            schemes
                .iter()
                .flat_map(|s| q.countries.iter().map(move |c| (*s, Some(*c))))
                .filter_map(|k| self.groups.get(&k).map(Vec::as_slice))
                .collect()
        }
    }
}

/// A cheap, cloneable handle to the in-memory set of alive proxies.
#[derive(Clone, Default)]
pub struct HealthIndex {
    inner: Arc<RwLock<Inner>>,
}

impl std::fmt::Debug for HealthIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthIndex")
            .field("len", &self.len())
            .finish()
    }
}

/// Random probes before a pick falls back to scanning: enough to find
/// matches quickly unless the filters select a tiny share of the index.
const SAMPLE_TRIES: usize = 64;

impl HealthIndex {
    /// An empty index.
    pub fn new() -> HealthIndex {
        HealthIndex::default()
    }

    /// Builds the index from every alive proxy in the store.
    pub fn load(store: &Store) -> Result<HealthIndex, StoreError> {
        let index = HealthIndex::new();
        index.refresh(store.list_proxies(&ProxyFilter {
            status: Some(Status::Alive),
            ..ProxyFilter::default()
        })?);
        Ok(index)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies fresh records: alive ones are added or replaced, others
    /// removed.
    pub fn refresh(&self, records: Vec<ProxyRecord>) {
        let mut inner = self.write();
        for r in records {
            inner.put(r);
        }
    }

    /// Re-reads `ids` from the store: what is alive is (re)indexed, what is
    /// not (or no longer exists) is dropped.
    pub fn refresh_ids(&self, store: &Store, ids: &[i64]) -> Result<(), StoreError> {
        let records = store.proxies_by_ids(ids)?;
        let present: HashSet<i64> = records.iter().map(|r| r.id).collect();
        let mut inner = self.write();
        for id in ids {
            if !present.contains(id) {
                inner.remove(*id);
            }
        }
        for r in records {
            inner.put(r);
        }
        Ok(())
    }

    /// Drops a proxy (a client reported it failing). True if it was there.
    pub fn remove(&self, id: i64) -> bool {
        self.write().remove(id)
    }

    /// How many alive proxies are indexed.
    pub fn len(&self) -> usize {
        self.read().pos.len()
    }

    /// True when no proxy is indexed.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The indexed record of `id`.
    pub fn get(&self, id: i64) -> Option<Arc<ProxyRecord>> {
        let inner = self.read();
        let (key, i) = inner.pos.get(&id)?;
        inner.groups.get(key)?.get(*i).map(|s| s.record.clone())
    }

    /// One proxy matching `q`: two random matches, the better of them
    /// (faster and more reliable). Load spreads over every match while
    /// the fast and steady ones are favoured.
    pub fn pick(&self, q: &ProxyQuery, now: i64) -> Option<Arc<Served>> {
        let inner = self.read();
        let groups = inner.groups_for(q);
        // Where each group ends in the concatenation of all of them, so a
        // random position finds its group by binary search.
        let ends: Vec<usize> = groups
            .iter()
            .scan(0, |end, g| {
                *end += g.len();
                Some(*end)
            })
            .collect();
        let n = ends.last().copied().unwrap_or(0);
        if n == 0 {
            return None;
        }
        let nth = |i: usize| {
            let g = ends.partition_point(|&end| end <= i);
            let start = if g == 0 { 0 } else { ends[g - 1] };
            &groups[g][i - start]
        };
        let mut rng = rand::rng();
        let mut found: [Option<&Arc<Served>>; 2] = [None, None];
        let mut k = 0;
        for _ in 0..SAMPLE_TRIES {
            let r = nth(rng.random_range(0..n));
            if q.matches(r, now) && found[0].is_none_or(|f| f.id != r.id) {
                found[k] = Some(r);
                k += 1;
                if k == 2 {
                    break;
                }
            }
        }
        if k == 0 {
            // Selective filters: reservoir-sample two among all matches.
            let mut seen = 0usize;
            for r in groups
                .iter()
                .flat_map(|g| g.iter())
                .filter(|r| q.matches(r, now))
            {
                seen += 1;
                if seen <= 2 {
                    found[seen - 1] = Some(r);
                } else {
                    let j = rng.random_range(0..seen);
                    if j < 2 {
                        found[j] = Some(r);
                    }
                }
            }
        }
        match found {
            [Some(a), Some(b)] => Some(if score(a) <= score(b) { a } else { b }.clone()),
            [Some(a), None] | [None, Some(a)] => Some(a.clone()),
            [None, None] => None,
        }
    }

    /// Every proxy matching `q`, by id.
    pub fn select(&self, q: &ProxyQuery, now: i64) -> Vec<Arc<ProxyRecord>> {
        let inner = self.read();
        let mut out: Vec<Arc<ProxyRecord>> = inner
            .groups_for(q)
            .iter()
            .flat_map(|g| g.iter())
            .filter(|r| q.matches(r, now))
            .map(|s| s.record.clone())
            .collect();
        out.sort_by_key(|r| r.id);
        out
    }
}

/// Lower is better: latency divided by a smoothed success ratio, so fast
/// and steady proxies win a pair more often.
fn score(r: &ProxyRecord) -> f64 {
    let latency = r.latency_ms.unwrap_or(10_000).max(1) as f64;
    let reliability = (r.checks_ok as f64 + 1.0) / (r.checks_total as f64 + 2.0);
    latency / reliability
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Proxy;

    fn rec(id: i64, country: &str, latency: i64, scheme: Scheme) -> ProxyRecord {
        ProxyRecord {
            id,
            proxy: Proxy {
                scheme,
                host: format!("10.0.0.{id}").parse().unwrap(),
                port: 8080,
                auth: None,
            },
            scheme_detect: false,
            status: Status::Alive,
            country: Some(country.into()),
            country_source: Some("source".into()),
            anonymity: Some(Anonymity::Anonymous),
            https: Some(id % 2 == 0),
            latency_ms: Some(latency),
            exit_ip: None,
            last_checked: Some(1_000),
            last_alive: Some(1_000),
            first_seen: 0,
            last_seen: 0,
            reason: None,
            hint_anonymity: None,
            hint_https: None,
            checks_total: 1,
            checks_ok: 1,
            consecutive_failures: 0,
            next_check_at: 0,
            sources: Vec::new(),
        }
    }

    #[test]
    fn picks_only_matches_and_spreads_load() {
        let index = HealthIndex::new();
        index.refresh(
            (1..=50)
                .map(|i| rec(i, if i <= 5 { "DE" } else { "US" }, i * 10, Scheme::Http))
                .collect(),
        );
        let q = ProxyQuery {
            countries: vec![Country::parse("de").unwrap()],
            ..ProxyQuery::default()
        };
        let mut seen = HashSet::new();
        for _ in 0..500 {
            let r = index.pick(&q, 1_000).unwrap();
            assert_eq!(r.country.as_deref(), Some("DE"));
            seen.insert(r.id);
        }
        // Not always the fastest: every DE proxy but the slowest is served.
        assert!(seen.len() >= 4, "{seen:?}");
        let none = ProxyQuery {
            schemes: vec![Scheme::Socks5],
            ..ProxyQuery::default()
        };
        assert!(index.pick(&none, 1_000).is_none());
    }

    #[test]
    fn filters_and_removal() {
        let index = HealthIndex::new();
        index.refresh(vec![
            rec(1, "US", 100, Scheme::Http),
            rec(2, "US", 900, Scheme::Socks5),
        ]);
        let fast = ProxyQuery {
            max_latency_ms: Some(500),
            ..ProxyQuery::default()
        };
        assert_eq!(index.select(&fast, 1_000).len(), 1);
        let https = ProxyQuery {
            https: true,
            ..ProxyQuery::default()
        };
        assert_eq!(index.select(&https, 1_000)[0].id, 2);
        let fresh = ProxyQuery {
            max_age: Some(Duration::from_secs(1)),
            ..ProxyQuery::default()
        };
        assert_eq!(index.select(&fresh, 1_500).len(), 2);
        assert_eq!(index.select(&fresh, 2_001).len(), 0);
        let elite = ProxyQuery {
            min_anonymity: Some(Anonymity::Elite),
            ..ProxyQuery::default()
        };
        assert!(index.select(&elite, 1_000).is_empty());
        let mut excluded = ProxyQuery::default();
        excluded.exclude_ids.insert(1);
        excluded
            .exclude_addrs
            .insert("10.0.0.2:8080".parse().unwrap());
        assert!(index.pick(&excluded, 1_000).is_none());

        let mut dead = rec(1, "US", 100, Scheme::Http);
        dead.status = Status::Dead;
        index.refresh(vec![dead]);
        assert_eq!(index.len(), 1);
        assert!(index.get(1).is_none());
        assert!(index.remove(2));
        assert!(index.is_empty());
    }
}
