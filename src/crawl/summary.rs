//! What a crawl did, counted as it goes in fixed memory, and its
//! end-of-crawl report.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use crate::pool::PoolStats;

/// Latencies up to this many ms are counted to the ms; longer ones in the
/// last bucket.
const BUCKETS: usize = 120_000;

/// Page latencies in 1 ms buckets: percentiles of millions of pages in
/// fixed memory.
#[derive(Clone)]
pub struct Latencies {
    counts: Vec<u32>,
    n: u64,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            counts: vec![0; BUCKETS],
            n: 0,
        }
    }
}

impl fmt::Debug for Latencies {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Latencies").field("n", &self.n).finish()
    }
}

impl Latencies {
    /// Counts one.
    pub fn add(&mut self, d: Duration) {
        let ms = (d.as_millis() as usize).min(BUCKETS - 1);
        self.counts[ms] += 1;
        self.n += 1;
    }

    /// The `p`-th percentile (0–100), `None` when empty.
    pub fn percentile(&self, p: f64) -> Option<Duration> {
        if self.n == 0 {
            return None;
        }
        let rank = ((p / 100.0) * self.n as f64).ceil().max(1.0) as u64;
        let mut seen = 0u64;
        for (ms, c) in self.counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some(Duration::from_millis(ms as u64));
            }
        }
        None
    }
}

/// The end-of-crawl report.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    /// Wall time.
    pub elapsed: Duration,
    /// Stopped by Ctrl-C before the frontier was empty.
    pub interrupted: bool,
    /// Pages fetched with a status below 400, by status.
    pub ok_by_status: BTreeMap<u16, u64>,
    /// Pages that failed for good, by reason (`http_404`, `exhausted`…).
    pub failed_by_reason: BTreeMap<String, u64>,
    /// URLs robots.txt kept the crawler from.
    pub disallowed: u64,
    /// URLs still waiting (a page limit, an interruption).
    pub queued: u64,
    /// URLs known to the crawl.
    pub discovered: u64,
    /// Body bytes received (decoded).
    pub bytes: u64,
    /// New links not stored because the frontier was full.
    pub frontier_full: u64,
    /// New links past the number kept per page.
    pub links_cut: u64,
    /// Latency of the pages (retries included).
    pub latency: Latencies,
    /// What the pool did.
    pub pool: PoolStats,
    /// What the runs before this one on the same frontier counted (see
    /// [`RunCounts`]); `None` where the frontier kept no counts.
    pub earlier: Option<RunCounts>,
}

impl Summary {
    /// Pages with a status below 400.
    pub fn ok(&self) -> u64 {
        self.ok_by_status.values().sum()
    }

    /// Pages that failed for good.
    pub fn failed(&self) -> u64 {
        self.failed_by_reason.values().sum()
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| format!("{}ms", d.as_millis()))
}

fn counts<K: fmt::Display>(m: &BTreeMap<K, u64>) -> String {
    let mut v: Vec<(&K, &u64)> = m.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "crawl {} in {:.1}s: {} pages ok, {} failed, {} disallowed by robots.txt, {} still queued, {} URLs seen",
            if self.interrupted {
                "interrupted"
            } else {
                "finished"
            },
            self.elapsed.as_secs_f64(),
            self.ok(),
            self.failed(),
            self.disallowed,
            self.queued,
            self.discovered,
        )?;
        if !self.ok_by_status.is_empty() {
            writeln!(f, "  ok by status: {}", counts(&self.ok_by_status))?;
        }
        if !self.failed_by_reason.is_empty() {
            writeln!(f, "  failed by reason: {}", counts(&self.failed_by_reason))?;
        }
        if self.frontier_full > 0 || self.links_cut > 0 {
            writeln!(
                f,
                "  links not kept: {} with the frontier full, {} past the links kept per page",
                self.frontier_full, self.links_cut
            )?;
        }
        writeln!(
            f,
            "  latency p50 {} p90 {} p99 {}; {} received",
            ms(self.latency.percentile(50.0)),
            ms(self.latency.percentile(90.0)),
            ms(self.latency.percentile(99.0)),
            bytesize::ByteSize(self.bytes),
        )?;
        let p = &self.pool;
        writeln!(
            f,
            "  proxies: {} used, {} retired after failing, {} proxy failures, {} blocks, {} rate limits; direct requests: {}",
            p.proxies_used, p.proxies_failed, p.proxy_failures, p.blocks, p.rate_limits, p.direct
        )?;
        if !p.banned_by_site.is_empty() {
            writeln!(f, "  banned per site: {}", counts(&p.banned_by_site))?;
        }
        writeln!(
            f,
            "  retries: {} proxy rotations, {} target retries, {} attempts for {} requests",
            p.rotations, p.target_retries, p.attempts, p.requests
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_come_from_the_buckets() {
        let mut l = Latencies::default();
        assert_eq!(l.percentile(50.0), None);
        for ms in 1..=100 {
            l.add(Duration::from_millis(ms));
        }
        l.add(Duration::from_secs(1_000));
        assert_eq!(l.percentile(50.0), Some(Duration::from_millis(51)));
        assert_eq!(l.percentile(90.0), Some(Duration::from_millis(91)));
        assert_eq!(l.percentile(100.0), Some(Duration::from_millis(119_999)));
    }
}

/// What one run of a crawl counted, kept in its frontier's meta
/// (`COUNTS_META`) with every commit, so in the same transaction as the
/// pages it counts: a run that dies (a node killed) leaves its counts up
/// to its last commit, and the next run on that frontier adds them to
/// those of the runs before.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RunCounts {
    /// Wall time.
    pub elapsed_ms: u64,
    /// Pages fetched with a status below 400, by status.
    pub ok_by_status: BTreeMap<u16, u64>,
    /// Pages that failed for good, by reason.
    pub failed_by_reason: BTreeMap<String, u64>,
    /// Body bytes received.
    pub bytes: u64,
    /// New links not stored because the frontier was full.
    pub frontier_full: u64,
    /// New links past the number kept per page.
    pub links_cut: u64,
}

/// The frontier's meta key holding [`KeptCounts`].
pub(crate) const COUNTS_META: &str = "counts";

/// The runs before the current one, added up, and the current one's.
#[derive(Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
struct KeptCounts {
    before: RunCounts,
    run: RunCounts,
}

impl RunCounts {
    /// The counts of `s`, a run `elapsed` long so far.
    fn of(s: &Summary, elapsed: Duration) -> RunCounts {
        RunCounts {
            elapsed_ms: elapsed.as_millis() as u64,
            ok_by_status: s.ok_by_status.clone(),
            failed_by_reason: s.failed_by_reason.clone(),
            bytes: s.bytes,
            frontier_full: s.frontier_full,
            links_cut: s.links_cut,
        }
    }

    fn add(&mut self, o: &RunCounts) {
        self.elapsed_ms += o.elapsed_ms;
        self.bytes += o.bytes;
        self.frontier_full += o.frontier_full;
        self.links_cut += o.links_cut;
        for (k, v) in &o.ok_by_status {
            *self.ok_by_status.entry(*k).or_default() += v;
        }
        for (k, v) in &o.failed_by_reason {
            *self.failed_by_reason.entry(k.clone()).or_default() += v;
        }
    }
}

impl Summary {
    /// The meta value to commit with the pages: the runs before and this
    /// one so far.
    pub(crate) fn kept(&self, elapsed: Duration) -> String {
        let kept = KeptCounts {
            before: self.earlier.clone().unwrap_or_default(),
            run: RunCounts::of(self, elapsed),
        };
        serde_json::to_string(&kept).unwrap_or_default()
    }
}

/// Starts a run on `frontier`: what the runs before it counted (the last
/// one's up to its last commit, whether it ended or died), now kept as
/// "before" with this run's counts at zero. `None` for a frontier resumed
/// from a version that kept no counts.
pub(crate) async fn start_run(
    frontier: &mut crate::store::Frontier,
    resumed: bool,
) -> Result<Option<RunCounts>, crate::store::StoreError> {
    let kept: Option<KeptCounts> = frontier
        .meta(COUNTS_META)
        .await?
        .and_then(|v| serde_json::from_str(&v).ok());
    if kept.is_none() && resumed {
        return Ok(None);
    }
    let mut before = kept.unwrap_or_default();
    let run = std::mem::take(&mut before.run);
    before.before.add(&run);
    frontier
        .set_meta(
            COUNTS_META,
            &serde_json::to_string(&before).unwrap_or_default(),
        )
        .await?;
    Ok(Some(before.before))
}
