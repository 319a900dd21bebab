//! The gateway's counters: requests and tunnels by result, retries,
//! upstream failures by reason, bytes each way, and the latency the gateway
//! adds, the sticky sessions table, for `/metrics` (Prometheus) and `/stats`
//! (a snapshot).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::lock;
use crate::model::Reason;
use crate::pool::Pool;

type Labels = Vec<(&'static str, String)>;

/// What kind of client traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A plain (absolute-form) HTTP request.
    Plain,
    /// An HTTP CONNECT tunnel.
    Connect,
    /// A SOCKS5 tunnel.
    Socks,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Connect => "connect",
            Kind::Socks => "socks5",
        }
    }
}

/// Every gateway metric. Cheap to update from many connections at once.
#[derive(Debug)]
pub struct GatewayMetrics {
    requests: Family<Labels, Counter>,
    retries: Counter,
    failures: Family<Labels, Counter>,
    bytes: Family<Labels, Counter>,
    /// The two series of `bytes`, held so that counting a body's frame
    /// costs no label lookup or allocation.
    bytes_sent: Counter,
    bytes_received: Counter,
    added: Histogram,
    connections: Gauge,
    tunnels_open: Gauge,
    refused: Counter,
    evicted: Counter,
    /// For `/stats`: the histogram keeps no readable sum.
    added_sum_us: AtomicU64,
    added_count: AtomicU64,
    /// For `/stats`, by (kind, result): the counters of `requests`.
    totals: Mutex<BTreeMap<(&'static str, &'static str), Counter>>,
    /// The pool whose sticky sessions the gateway's clients hold, read
    /// when shown.
    pool: Option<Pool>,
}

impl Default for GatewayMetrics {
    fn default() -> GatewayMetrics {
        let bytes = Family::<Labels, Counter>::default();
        let series = |d: &str| {
            bytes
                .get_or_create(&vec![("direction", d.to_owned())])
                .clone()
        };
        let (bytes_sent, bytes_received) = (series("sent"), series("received"));
        GatewayMetrics {
            requests: Family::default(),
            retries: Counter::default(),
            failures: Family::default(),
            bytes,
            bytes_sent,
            bytes_received,
            // 50 µs to about 1.6 s.
            added: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            connections: Gauge::default(),
            tunnels_open: Gauge::default(),
            refused: Counter::default(),
            evicted: Counter::default(),
            added_sum_us: AtomicU64::new(0),
            added_count: AtomicU64::new(0),
            totals: Mutex::default(),
            pool: None,
        }
    }
}

/// A snapshot for `/stats`.
#[derive(Clone, Debug, Default, Serialize, utoipa::ToSchema)]
pub struct GatewayStats {
    /// Plain requests answered, by result.
    pub requests: BTreeMap<String, u64>,
    /// CONNECT tunnels, by result.
    pub connect_tunnels: BTreeMap<String, u64>,
    /// SOCKS5 tunnels, by result.
    pub socks_tunnels: BTreeMap<String, u64>,
    /// Attempts on another proxy after one failed or was blocked.
    pub retries: u64,
    /// Upstream proxy failures, by reason.
    pub upstream_failures: BTreeMap<String, u64>,
    /// Bytes from clients to upstreams.
    pub bytes_sent: u64,
    /// Bytes from upstreams to clients.
    pub bytes_received: u64,
    /// Client connections open now.
    pub connections: i64,
    /// Tunnels open now.
    pub tunnels_open: i64,
    /// Connections refused at the cap.
    pub refused: u64,
    /// Connections waiting for a request head closed to make room for a
    /// new one.
    pub evicted: u64,
    /// Mean latency the gateway added (picking, retries, its own work), in ms.
    pub added_latency_mean_ms: f64,
    /// Sticky sessions held now (`pool.max_sessions` at most).
    pub sessions: u64,
    /// Live sessions dropped, oldest first, to make room for new ones at
    /// `pool.max_sessions`: each such client moved to another proxy.
    pub sessions_evicted: u64,
}

impl GatewayMetrics {
    /// The metrics of a gateway picking from `pool`, whose sessions table
    /// they show.
    pub fn new(pool: Pool) -> GatewayMetrics {
        GatewayMetrics {
            pool: Some(pool),
            ..GatewayMetrics::default()
        }
    }

    /// Adds every metric to `registry` (the daemon's, under a `gateway_`
    /// prefix).
    pub fn register(&self, registry: &mut Registry) {
        // Every failure reason at 0 from the start, so a dashboard's rate()
        // has a series to read before the first failure.
        for reason in Reason::ALL {
            let _ = self
                .failures
                .get_or_create(&vec![("reason", reason.as_str().to_owned())]);
        }
        registry.register(
            "requests",
            "Plain requests and tunnels by kind (plain, connect, socks5) and result",
            self.requests.clone(),
        );
        registry.register(
            "retries",
            "Attempts moved to another proxy after a failure or a block",
            self.retries.clone(),
        );
        registry.register(
            "upstream_failures",
            "Upstream proxy failures by reason",
            self.failures.clone(),
        );
        registry.register(
            "bytes",
            "Bytes carried, by direction (sent: client to upstream, received: upstream to client)",
            self.bytes.clone(),
        );
        registry.register(
            "added_latency_seconds",
            "Time the gateway adds before a response head or tunnel (picking, retries, its own work)",
            self.added.clone(),
        );
        registry.register(
            "connections",
            "Client connections open",
            self.connections.clone(),
        );
        registry.register("tunnels_open", "Tunnels open", self.tunnels_open.clone());
        registry.register(
            "refused_connections",
            "Client connections refused at gateway.max_connections or max_connections_per_ip",
            self.refused.clone(),
        );
        registry.register(
            "evicted_connections",
            "Client connections waiting for a request head closed to make room for a new one",
            self.evicted.clone(),
        );
        if let Some(pool) = &self.pool {
            registry.register_collector(Box::new(SessionsCollector(pool.clone())));
        }
    }

    /// Counts a finished request or tunnel set-up.
    pub(crate) fn finished(&self, kind: Kind, result: &'static str) {
        // The family's counter is looked up (two `String`s, a lock, a
        // hash) once per kind and result, then kept here.
        lock(&self.totals)
            .entry((kind.as_str(), result))
            .or_insert_with(|| {
                self.requests
                    .get_or_create(&vec![
                        ("kind", kind.as_str().to_owned()),
                        ("result", result.to_owned()),
                    ])
                    .clone()
            })
            .inc();
    }

    pub(crate) fn retried(&self) {
        self.retries.inc();
    }

    pub(crate) fn upstream_failed(&self, reason: Reason) {
        self.failures
            .get_or_create(&vec![("reason", reason.as_str().to_owned())])
            .inc();
    }

    pub(crate) fn sent(&self, n: u64) {
        self.bytes_sent.inc_by(n);
    }

    pub(crate) fn received(&self, n: u64) {
        self.bytes_received.inc_by(n);
    }

    pub(crate) fn added(&self, d: Duration) {
        self.added.observe(d.as_secs_f64());
        self.added_sum_us
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.added_count.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection(&self, delta: i64) {
        self.connections.inc_by(delta);
    }

    pub(crate) fn tunnel(&self, delta: i64) {
        self.tunnels_open.inc_by(delta);
    }

    pub(crate) fn refused(&self) {
        self.refused.inc();
    }

    /// A waiting connection was closed to make room for a new one.
    pub(crate) fn evicted(&self) {
        self.evicted.inc();
    }

    /// What `/stats` shows.
    pub fn snapshot(&self) -> GatewayStats {
        let mut s = GatewayStats::default();
        for ((kind, result), n) in lock(&self.totals).iter() {
            let map = match *kind {
                "plain" => &mut s.requests,
                "connect" => &mut s.connect_tunnels,
                _ => &mut s.socks_tunnels,
            };
            map.insert((*result).to_owned(), n.get());
        }
        s.retries = self.retries.get();
        s.bytes_sent = self.bytes_sent.get();
        s.bytes_received = self.bytes_received.get();
        for reason in Reason::ALL {
            let n = self
                .failures
                .get(&vec![("reason", reason.as_str().to_owned())])
                .map_or(0, |c| c.get());
            if n > 0 {
                s.upstream_failures.insert(reason.as_str().to_owned(), n);
            }
        }
        s.connections = self.connections.get();
        s.tunnels_open = self.tunnels_open.get();
        s.refused = self.refused.get();
        s.evicted = self.evicted.get();
        if let Some(pool) = &self.pool {
            let sessions = pool.sessions();
            s.sessions = sessions.open;
            s.sessions_evicted = sessions.evicted;
        }
        let count = self.added_count.load(Ordering::Relaxed);
        if count > 0 {
            s.added_latency_mean_ms =
                self.added_sum_us.load(Ordering::Relaxed) as f64 / count as f64 / 1000.0;
        }
        s
    }
}

/// The sticky sessions table, read from the pool at scrape time.
#[derive(Debug)]
struct SessionsCollector(Pool);

impl Collector for SessionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = self.0.sessions();
        // A table's size fits an i64.
        let open = ConstGauge::new(s.open as i64);
        open.encode(encoder.encode_descriptor(
            "sessions",
            "Sticky sessions held (pool.max_sessions at most)",
            None,
            MetricType::Gauge,
        )?)?;
        let evicted = ConstCounter::new(s.evicted);
        evicted.encode(encoder.encode_descriptor(
            "sessions_evicted",
            "Live sticky sessions dropped, oldest first, to make room for new ones at pool.max_sessions",
            None,
            MetricType::Counter,
        )?)?;
        Ok(())
    }
}
