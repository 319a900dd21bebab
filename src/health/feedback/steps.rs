//! The daemon's re-check steps, each one call: serving what was loaded at
//! start-up, queueing what the check loop is to check next, and adopting
//! rows other processes changed.

use super::*;

/// What [`Feedback::queue_due`] queued for the check loop.
pub(crate) struct Queued {
    /// Adopted proxies put on the served cycle (an error keeps the
    /// schedule they came with).
    pub adopted: Result<usize, StoreError>,
    /// Proxies queued for an early re-check made due now (an error loses
    /// them: each is queued again by its next failure).
    pub rechecks: Result<usize, StoreError>,
    /// Proxies served when the queue was taken.
    pub served: usize,
}

impl Feedback {
    /// Serves what was loaded from the store: only while its last check is
    /// within `fresh_within`, from the first request on, and re-checked at
    /// once, as it may have died since another process checked it (what
    /// passes a check meanwhile is served first). Then loads what sites
    /// taught about proxies in earlier runs: how many (proxy, site) pairs.
    pub(crate) async fn serve_loaded(
        &self,
        fresh_within: Duration,
        now: i64,
    ) -> Result<usize, StoreError> {
        self.set_fresh_within(fresh_within);
        self.reverify_all(now);
        self.load_sites().await
    }

    /// Queues what the check loop is to check next: the proxies adopted
    /// from other writers, each brought forward to the time `due_at` gives
    /// it (from the count served and the adopted entries; `None` keeps its
    /// schedule), and the proxies asked to be re-checked early, made due at
    /// `now`.
    pub(crate) async fn queue_due(
        &self,
        now: i64,
        due_at: impl FnOnce(usize, &[Arc<Entry>]) -> Vec<(i64, i64)>,
    ) -> Queued {
        let adopted = self.take_adopted();
        let adopted = if adopted.is_empty() {
            Ok(0)
        } else {
            let due = due_at(self.inner.index.len(), &adopted);
            let n = due.len();
            if n == 0 {
                Ok(0)
            } else {
                self.schedule_checks(due).await.map(|()| n)
            }
        };
        Queued {
            adopted,
            rechecks: self.queue_rechecks(now).await,
            served: self.inner.index.len(),
        }
    }
}
