//! The write component: watches whether the disk takes the store's writes.
//! While it does not (full, read-only, failing), the daemon says so once
//! (`/healthz` degraded, the log at the first failure and then once a
//! minute), serves from memory what passed a check or carried a request
//! within `api.max_age`, and tries a write at the end of every pause, so
//! that writes working again are noticed within one pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::outage::Outage;
use crate::api::conditions::Conditions;
use crate::health::Feedback;
use crate::store::{Store, WriteTrouble, now_ms};

/// The component's name in `/healthz` and `/stats`.
pub const COMPONENT: &str = "store";

/// A little past the end of a pause, so that the try is let through.
const AFTER_PAUSE: Duration = Duration::from_millis(20);

/// How long writes must work, with no failure, before the daemon says they
/// work again: a nearly full disk takes the trial write and small ones and
/// refuses the next batch of check results (committed within a second of a
/// round's start), and that is one outage going on, not one per try.
pub const SETTLE: Duration = Duration::from_secs(2);

/// Watches the store's writes.
pub struct WriteWatch {
    /// Whose writes.
    pub store: Store,
    /// Where the condition is said.
    pub conditions: Arc<Conditions>,
    /// The feedback path, whose freshness window is lifted meanwhile.
    pub feedback: Feedback,
}

impl WriteWatch {
    /// Watches until `stop`.
    pub async fn run(self, stop: CancellationToken) {
        let mut changes = self.store.watch_writes();
        let mut outage = Outage::default();
        // When writes that work again will have worked for SETTLE.
        let mut settled_at = None;
        loop {
            let trouble = changes.borrow_and_update().clone();
            match &trouble {
                Some(t) => {
                    settled_at = None;
                    self.failing(&mut outage, t);
                }
                None if self.conditions.get(COMPONENT).is_some() => {
                    settled_at.get_or_insert(Instant::now() + SETTLE);
                }
                None => {}
            }
            let pause = trouble
                .as_ref()
                .map(|t| Instant::now() + t.retry_in() + AFTER_PAUSE);
            tokio::select! {
                _ = stop.cancelled() => return,
                changed = changes.changed() => if changed.is_err() { return },
                _ = until(settled_at) => {
                    settled_at = None;
                    self.recovered(&mut outage);
                }
                _ = until(pause) => {
                    // Nothing wrote since the pause ended: try the disk.
                    if let Err(e) = self.store.probe_writes().await
                        && e.write_failure().is_none()
                    {
                        tracing::warn!(error = %e, "a trial write failed");
                    }
                }
            }
        }
    }

    /// Writes are failing: the condition, no freshness window (nothing can
    /// be recorded as re-checked), and a log line when one is due.
    fn failing(&self, outage: &mut Outage, t: &WriteTrouble) {
        let message = format!(
            "cannot write the database ({}): {}; proxies are served from memory while they \
             passed a check or carried a request within api.max_age, and verdicts are not \
             recorded; writes are tried again every {}",
            t.kind,
            t.reason,
            humantime::format_duration(t.retry_every)
        );
        self.conditions.set(COMPONENT, message, t.since_ms);
        self.feedback.set_fresh_within(Duration::ZERO);
        if let Some(told) = outage.note() {
            tracing::error!(
                path = %self.store.path().display(),
                kind = t.kind.as_str(),
                error = %t.reason,
                lasted = %told.lasted(),
                failures = t.failures,
                retry_every = %humantime::format_duration(t.retry_every),
                "cannot write the database: backing off, serving from memory, verdicts not recorded"
            );
        }
    }

    /// Writes work (again): the condition ends, and every served proxy is
    /// re-checked, as none of their checks since could be recorded.
    fn recovered(&self, outage: &mut Outage) {
        let Some(told) = outage.end() else { return };
        self.conditions.clear(COMPONENT);
        self.feedback.reverify_all(now_ms());
        tracing::info!(
            after = %told.lasted(),
            unrecorded = self.feedback.unrecorded(),
            "the database takes writes again; re-checking every served proxy now"
        );
    }
}

/// Waits until `at`, or for ever without one.
async fn until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
