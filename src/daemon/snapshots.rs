//! The snapshot component: once a minute, a row of the pool's size and the
//! traffic since the last one goes to the store for the dashboard's
//! history charts; rows older than [`KEEP`] go as new ones come.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use std::sync::Arc;

use crate::api::metrics::Metrics;
use crate::config::Config;
use crate::gateway::GatewayMetrics;
use crate::health::Feedback;
use crate::store::{Snapshot, Store, now_ms};

/// How often a snapshot is taken.
pub const EVERY: Duration = Duration::from_secs(60);

/// How long snapshots are kept: the dashboard's week, and a day to spare.
pub const KEEP: Duration = Duration::from_secs(8 * 24 * 3600);

/// Takes a snapshot every [`EVERY`], the first at once.
pub struct Snapshots {
    /// Where snapshots are written.
    pub store: Store,
    /// What is servable (by `api.max_age`).
    pub feedback: Feedback,
    pub config: Arc<Config>,
    /// The checks counted.
    pub metrics: Arc<Metrics>,
    /// The gateway's traffic, when it runs.
    pub gateway: Option<Arc<GatewayMetrics>>,
}

/// The running totals a snapshot's per-minute figures are the change of.
#[derive(Clone, Copy, Default)]
struct Totals {
    checks: u64,
    checks_alive: u64,
    gateway_requests: u64,
    gateway_failures: u64,
}

impl Snapshots {
    /// Snapshots until `stop`. A minute missed (a busy machine, a store
    /// refusing writes) is skipped, not made up.
    pub async fn run(self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
        let mut last = self.totals();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let now = self.totals();
            if let Err(e) = self.take(last, now).await {
                tracing::debug!(error = %e, "cannot record the minute's snapshot");
            }
            last = now;
        }
    }

    fn totals(&self) -> Totals {
        let (checks, checks_alive) = self.metrics.check_totals();
        let (gateway_requests, gateway_failures) = match &self.gateway {
            Some(g) => {
                let s = g.snapshot();
                let answered = s
                    .requests
                    .values()
                    .chain(s.connect_tunnels.values())
                    .chain(s.socks_tunnels.values())
                    .sum();
                (answered, s.upstream_failures.values().sum())
            }
            None => (0, 0),
        };
        Totals {
            checks,
            checks_alive,
            gateway_requests,
            gateway_failures,
        }
    }

    async fn take(&self, last: Totals, now: Totals) -> Result<(), crate::store::StoreError> {
        let at = now_ms();
        let mut snapshot = Snapshot {
            at: at - at % 60_000,
            servable: crate::api::servable(&self.feedback, &self.config) as i64,
            checks: now.checks.saturating_sub(last.checks) as i64,
            checks_alive: now.checks_alive.saturating_sub(last.checks_alive) as i64,
            gateway_requests: now.gateway_requests.saturating_sub(last.gateway_requests) as i64,
            gateway_failures: now.gateway_failures.saturating_sub(last.gateway_failures) as i64,
            ..Snapshot::default()
        };
        for (status, _, n) in self.store.count_by_status_scheme().await? {
            match status.as_str() {
                "alive" => snapshot.alive += n,
                "dead" => snapshot.dead += n,
                _ => snapshot.unknown += n,
            }
        }
        let keep_since = at - KEEP.as_millis() as i64;
        self.store.record_snapshot(snapshot, keep_since).await
    }
}
