//! Prometheus metrics: proxies by status and scheme (read at scrape
//! time from the counts every write keeps, never a scan of the table), checks by outcome, a check-latency histogram, harvest
//! results per source, API requests by route and status, store writes the
//! disk refused and the verdicts that cost, and the gateway's own
//! (registered by [`Metrics::register_gateway`]).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::harvest::HarvestReport;
use crate::store::{CheckRecord, WriteFailure};

type Labels = Vec<(String, String)>;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// Every metric the daemon exposes.
pub struct Metrics {
    registry: Mutex<Registry>,
    proxies: Family<Labels, Gauge>,
    index_size: Gauge,
    checks: Family<Labels, Counter>,
    check_latency: Histogram,
    harvest_found: Family<Labels, Gauge>,
    harvest_runs: Family<Labels, Counter>,
    requests: Family<Labels, Counter>,
    judge_up: Family<Labels, Gauge>,
    judge_latency: Family<Labels, Gauge<f64, AtomicU64>>,
    judge_failures: Family<Labels, Counter>,
    store_write_failures: Family<Labels, Counter>,
    unrecorded: Counter,
    site_uses: Family<Labels, Gauge>,
    site_proxies: Family<Labels, Gauge>,
    site_top_share: Family<Labels, Gauge<f64, AtomicU64>>,
    /// Checks counted so far, and of those alive, for the dashboard's
    /// checks per minute (the family keeps no readable total).
    checks_total: AtomicU64,
    checks_alive: AtomicU64,
    /// Each judge's last direct answer, for the dashboard.
    judges: Mutex<BTreeMap<String, JudgeView>>,
}

/// What the dashboard shows of a judge: how its direct requests went.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct JudgeView {
    /// Whether its last direct answer was genuine.
    pub up: bool,
    /// How long its last genuine direct answer took.
    pub latency: Option<std::time::Duration>,
    /// Direct requests that got no genuine answer, since start.
    pub failures: u64,
    /// Why the last one failed, when it did.
    pub last_error: Option<String>,
    /// When it was last asked (unix ms).
    pub last_asked_ms: i64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("proxywarden");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            proxies: Family::default(),
            index_size: Gauge::default(),
            checks: Family::default(),
            check_latency: Histogram::new(exponential_buckets(0.01, 2.0, 12)),
            harvest_found: Family::default(),
            harvest_runs: Family::default(),
            requests: Family::default(),
            judge_up: Family::default(),
            judge_latency: Family::default(),
            judge_failures: Family::default(),
            store_write_failures: Family::default(),
            unrecorded: Counter::default(),
            site_uses: Family::default(),
            site_proxies: Family::default(),
            site_top_share: Family::default(),
            checks_total: AtomicU64::new(0),
            checks_alive: AtomicU64::new(0),
            judges: Mutex::default(),
        };
        registry.register(
            "proxies",
            "Stored proxies by status and scheme",
            m.proxies.clone(),
        );
        registry.register(
            "servable_proxies",
            "Proxies that can be served now: alive and proven (by a check or a use that worked) within api.max_age and the freshness window",
            m.index_size.clone(),
        );
        registry.register(
            "checks",
            "Checks by outcome (alive or the failure reason)",
            m.checks.clone(),
        );
        registry.register(
            "check_latency_seconds",
            "Latency of passing checks",
            m.check_latency.clone(),
        );
        registry.register(
            "harvest_found",
            "Proxies found by the last fetch of each source",
            m.harvest_found.clone(),
        );
        registry.register(
            "harvest_fetches",
            "Source fetches by source and result (ok or error)",
            m.harvest_runs.clone(),
        );
        registry.register(
            "api_requests",
            "API requests by route and status",
            m.requests.clone(),
        );
        registry.register(
            "judge_up",
            "1 when the judge's last direct answer was genuine, 0 otherwise",
            m.judge_up.clone(),
        );
        registry.register(
            "judge_latency_seconds",
            "How long the judge's last genuine direct answer took",
            m.judge_latency.clone(),
        );
        registry.register(
            "judge_failures",
            "Direct requests to the judge that got no genuine answer",
            m.judge_failures.clone(),
        );
        registry.register(
            "store_write_failures",
            "Store transactions the disk refused, by kind (disk_full, read_only, io_error)",
            m.store_write_failures.clone(),
        );
        registry.register(
            "unrecorded_verdicts",
            "Check results and uses that took effect in memory but were dropped because the disk refused the write",
            m.unrecorded.clone(),
        );
        registry.register(
            "site_uses",
            "Uses that worked at each site in the last 10 minutes (the gateway, crawl jobs, the pool; the 256 sites used last)",
            m.site_uses.clone(),
        );
        registry.register(
            "site_proxies",
            "Distinct proxies that carried each site's requests in the last 10 minutes",
            m.site_proxies.clone(),
        );
        registry.register(
            "site_top_share",
            "The largest share of each site's requests in the last 10 minutes that one proxy carried (0 to 1)",
            m.site_top_share.clone(),
        );
        // Every kind at 0 from the start, so a dashboard's rate() has a
        // series to read before the first failure.
        for kind in WriteFailure::ALL {
            let _ = m
                .store_write_failures
                .get_or_create(&labels(&[("kind", kind.as_str())]));
        }
        *m.registry.lock().unwrap_or_else(|e| e.into_inner()) = registry;
        m
    }

    /// Adds the gateway's metrics, under `proxywarden_gateway_`.
    pub fn register_gateway(&self, gateway: &crate::gateway::GatewayMetrics) {
        let mut registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        gateway.register(registry.sub_registry_with_prefix("gateway"));
    }

    /// Counts a batch of committed check results.
    pub fn observe_checks(&self, batch: &[CheckRecord]) {
        for rec in batch {
            let outcome = match rec.outcome.failure {
                None => "alive",
                Some(r) => r.as_str(),
            };
            self.checks
                .get_or_create(&labels(&[("outcome", outcome)]))
                .inc();
            if let Some(l) = rec.outcome.latency {
                self.check_latency.observe(l.as_secs_f64());
            }
        }
        let alive = batch.iter().filter(|r| r.outcome.failure.is_none()).count();
        self.checks_total
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        self.checks_alive.fetch_add(alive as u64, Ordering::Relaxed);
    }

    /// Checks counted since start, and of those alive.
    pub fn check_totals(&self) -> (u64, u64) {
        (
            self.checks_total.load(Ordering::Relaxed),
            self.checks_alive.load(Ordering::Relaxed),
        )
    }

    /// Every judge asked directly so far, by URL.
    pub fn judges(&self) -> BTreeMap<String, JudgeView> {
        crate::lock(&self.judges).clone()
    }

    /// Records a harvest round.
    pub fn observe_harvest(&self, report: &HarvestReport) {
        for s in &report.sources {
            self.harvest_found
                .get_or_create(&labels(&[("source", &s.name)]))
                .set(s.found as i64);
            let result = match (s.worked(), s.stored_all()) {
                (false, _) => "error",
                (true, false) => "not_stored",
                (true, true) => "ok",
            };
            self.harvest_runs
                .get_or_create(&labels(&[("source", &s.name), ("result", result)]))
                .inc();
        }
    }

    /// Records a direct answer of the judge at `url` (how long it took) or
    /// its absence.
    pub fn observe_judge(&self, url: &str, answer: Result<std::time::Duration, &str>) {
        let l = labels(&[("judge", url)]);
        {
            let mut judges = crate::lock(&self.judges);
            // Bounded by the configured judges (and any a test adds).
            let view = judges.entry(url.to_owned()).or_default();
            view.up = answer.is_ok();
            view.last_asked_ms = crate::store::now_ms();
            match answer {
                Ok(took) => {
                    view.latency = Some(took);
                    view.last_error = None;
                }
                Err(e) => {
                    view.failures += 1;
                    view.last_error = Some(e.to_owned());
                }
            }
        }
        match answer {
            Ok(took) => {
                // A judge's failures read 0 until it fails, not absent.
                let _ = self.judge_failures.get_or_create(&l);
                self.judge_up.get_or_create(&l).set(1);
                self.judge_latency.get_or_create(&l).set(took.as_secs_f64());
            }
            Err(_) => {
                self.judge_up.get_or_create(&l).set(0);
                self.judge_failures.get_or_create(&l).inc();
            }
        }
    }

    /// Brings the store's counters up to the totals the store and the
    /// feedback path keep: transactions the disk refused, by kind, and
    /// verdicts dropped for it.
    pub fn observe_store(&self, failures: &[(WriteFailure, u64)], unrecorded: u64) {
        let up_to = |c: &Counter, total: u64| {
            let now = c.get();
            if total > now {
                c.inc_by(total - now);
            }
        };
        for (kind, n) in failures {
            up_to(
                &self
                    .store_write_failures
                    .get_or_create(&labels(&[("kind", kind.as_str())])),
                *n,
            );
        }
        up_to(&self.unrecorded, unrecorded);
    }

    /// Sets the per-site rotation gauges to `sites`; sites no longer
    /// tracked leave.
    pub fn observe_rotation(&self, sites: &[crate::health::SiteSpread]) {
        self.site_uses.clear();
        self.site_proxies.clear();
        self.site_top_share.clear();
        for s in sites {
            let l = labels(&[("site", &s.site)]);
            self.site_uses.get_or_create(&l).set(s.uses as i64);
            self.site_proxies.get_or_create(&l).set(s.proxies as i64);
            self.site_top_share.get_or_create(&l).set(s.top_share);
        }
    }

    /// Counts an API request.
    pub fn observe_request(&self, route: &str, status: u16) {
        self.requests
            .get_or_create(&labels(&[
                ("route", route),
                ("status", &status.to_string()),
            ]))
            .inc();
    }

    /// The text exposition, with the gauges set from `counts` (proxies
    /// per status and scheme) and `index_len` first.
    pub fn render(&self, counts: &[(String, String, i64)], index_len: usize) -> String {
        for (status, scheme, n) in counts {
            self.proxies
                .get_or_create(&labels(&[("status", status), ("scheme", scheme)]))
                .set(*n);
        }
        self.index_size.set(index_len as i64);
        let mut out = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &registry);
        out
    }
}
