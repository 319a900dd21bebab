//! Freshness: verdicts from checks, the re-check queue, proxies adopted
//! from other writers, and what is applied from the store's change stream.

use super::*;

/// The most adopted proxies queued for rescheduling at once; more keep the
/// schedule they came with (and are re-checked by the next adoption, a
/// failure in use or their own schedule).
pub(super) const MAX_ADOPTED: usize = 1_000_000;

/// The most proxies kept hidden awaiting the record of their verdict.
pub(super) const MAX_HIDDEN: usize = 100_000;

/// Hidden proxies older than this are forgotten when the map is full.
pub(super) const HIDDEN_FOR_MS: i64 = 600_000;

/// Re-checks of served proxies remembered to spot a burst of failures.
pub(super) const BURST_WINDOW: usize = 32;

/// Failures among them that make a burst: this many, and at least
/// [`BURST_SHARE`] of the window's checks. One proxy dying now and then is
/// routine; an eighth of the recent re-checks failing together means others
/// may have died unseen (a provider or an upstream went down). A false
/// alarm costs one early re-check of every served proxy.
pub(super) const BURST_MIN: usize = 4;

/// See [`BURST_MIN`].
pub(super) const BURST_SHARE: f64 = 0.125;

/// The shortest time between two sweeps (see [`Feedback::reverify_all`]),
/// in ms.
pub(super) const SWEEP_GAP_MIN_MS: i64 = 5_000;

/// Change numbers kept in `applied` at most (without a reader that takes
/// them, the oldest go: their rows are then just read back once more).
pub(super) const APPLIED_MAX: usize = 4096;

impl Feedback {
    /// Learns from a check of proxy `id` as soon as it finished, before the
    /// result is committed: a served proxy that failed stops being served
    /// at once, and a burst of failures among served proxies puts every
    /// other served proxy up for an early re-check and under suspicion
    /// until it passes one.
    pub(crate) fn checked(&self, id: i64, outcome: &Outcome, now: i64) {
        let served = if outcome.alive() {
            self.inner.index.get(id).is_some()
        } else {
            self.hide(id, now)
        };
        if !served {
            return;
        }
        let burst = {
            let mut recent = lock(&self.inner.recent);
            if recent.len() == BURST_WINDOW {
                recent.pop_front();
            }
            recent.push_back(!outcome.alive());
            let failed = recent.iter().filter(|f| **f).count();
            let burst = failed >= BURST_MIN && failed as f64 >= BURST_SHARE * recent.len() as f64;
            if burst {
                // One burst, one sweep: the next needs fresh evidence.
                recent.clear();
            }
            burst
        };
        // One sweep at a time: the next once the last one's re-checks have
        // run (every served proxy passed a check since it began) or have
        // had time to (a quarter of the freshness window, 5 s at least),
        // not only once its suspicion ends. The suspicion after a start
        // lasts a window, and a mass death inside it must be swept: at
        // once when the start-up re-check has passed everything. Sweeps
        // bursts start keep the gap between them whatever, so a pool
        // that keeps failing an eighth of its re-checks is not swept
        // every few seconds.
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let gap = (fresh / 4).max(SWEEP_GAP_MIN_MS);
        let last = self.inner.suspect_before.load(Ordering::Relaxed);
        if burst
            && now - self.inner.burst_swept.load(Ordering::Relaxed) >= gap
            && (now - last >= gap || self.reverified_since(last))
        {
            self.inner.burst_swept.store(now, Ordering::Relaxed);
            tracing::warn!(
                served = self.inner.index.len(),
                "a burst of failures among served proxies; re-checking all of them now"
            );
            self.reverify_all(now);
        }
    }

    /// True when every served proxy passed a check (or carried a request)
    /// at or after `at` (unix ms).
    pub(super) fn reverified_since(&self, at: i64) -> bool {
        let index = &self.inner.index;
        index.ids().into_iter().all(|id| {
            index
                .get(id)
                .is_none_or(|e| e.proven_at().is_some_and(|t| t >= at))
        })
    }

    /// Treats every served proxy as suspect until it passes a check again,
    /// and asks for those checks at once: after a burst of failures, and at
    /// start-up, when every proxy served comes from a record that may be
    /// old news (another process checked it; it may have died since).
    /// Suspect proxies are served only while none matching has passed a
    /// check since.
    pub(crate) fn reverify_all(&self, now: i64) {
        let ids = self.inner.index.ids();
        if ids.is_empty() {
            // Nothing served is nothing to suspect, and no sweep whose
            // re-checks the next must wait for: after a start on an empty
            // database, the first burst among what it then checked is swept.
            return;
        }
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let hold = if fresh > 0 { fresh } else { 60_000 };
        // The index's proven proxies first: a pick that sees the new
        // suspicion finds among them only what proved itself since.
        self.inner.index.suspect_all(now);
        self.inner.suspect_before.store(now, Ordering::Relaxed);
        self.inner
            .suspect_until
            .store(now + hold, Ordering::Relaxed);
        let mut queue = lock(&self.inner.recheck);
        queue.extend(ids);
        drop(queue);
        self.inner.wake.notify_one();
    }

    /// Sets the freshness window: proxies whose last check is older are
    /// never served (`Duration::ZERO`: no window).
    pub(crate) fn set_fresh_within(&self, window: Duration) {
        let ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        self.inner.fresh_within.store(ms, Ordering::Relaxed);
    }

    /// Brings rows another process wrote into the index (see
    /// [`Feedback::apply`]) and queues the alive ones for the check loop to
    /// put on the served proxies' re-check cycle: their next check may be
    /// as far away as `check.recheck_alive`, long past the freshness window.
    /// Rows the index holds as they are (other own writes) are left alone.
    pub(crate) fn adopt(&self, records: Vec<ProxyRecord>) {
        let index = &self.inner.index;
        let records: Vec<ProxyRecord> = records
            .into_iter()
            .filter(|r| index.get(r.id).is_none_or(|e| *e.record != *r))
            .collect();
        let ids: Vec<i64> = records
            .iter()
            .filter(|r| r.status == crate::proxy::Status::Alive)
            .map(|r| r.id)
            .collect();
        self.apply(records);
        self.queue_adopted(ids);
    }

    pub(super) fn queue_adopted(&self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        let mut adopted = lock(&self.inner.adopted);
        let room = MAX_ADOPTED.saturating_sub(adopted.len());
        adopted.extend(ids.into_iter().take(room));
        drop(adopted);
        self.inner.wake.notify_one();
    }

    /// Takes the adopted proxies still in the index.
    pub(crate) fn take_adopted(&self) -> Vec<Arc<Entry>> {
        let ids = std::mem::take(&mut *lock(&self.inner.adopted));
        ids.into_iter()
            .filter_map(|id| self.inner.index.get(id))
            .collect()
    }

    /// Takes the proxies queued for an early re-check.
    pub(super) fn take_rechecks(&self) -> Vec<i64> {
        lock(&self.inner.recheck).drain().collect()
    }

    /// Makes the proxies queued for an early re-check due at `now` in the
    /// store; how many there were (an error loses them: each is queued
    /// again by its next failure).
    pub(crate) async fn queue_rechecks(&self, now: i64) -> Result<usize, StoreError> {
        let ids = self.take_rechecks();
        let n = ids.len();
        if n > 0 {
            self.inner.store.mark_due_many(ids, now).await?;
        }
        Ok(n)
    }

    /// Brings the next check of each `(proxy id, time)` forward to that
    /// time (unix ms): adopted proxies put on the served cycle.
    pub(crate) async fn schedule_checks(&self, due: Vec<(i64, i64)>) -> Result<(), StoreError> {
        self.inner.store.pull_checks_in(due).await
    }

    /// Puts off the next check of proxies whose check reached no verdict
    /// (every judge was unreachable) to `at` (unix ms), recording nothing
    /// about them.
    pub(crate) async fn defer_checks(&self, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        self.inner.store.defer_checks(ids, at).await
    }

    /// Resolves when a verdict asked for an early re-check.
    pub(crate) async fn recheck_wanted(&self) {
        self.inner.wake.notified().await
    }

    /// Commits a batch of check results and brings the index in line with
    /// what was committed: proxies found alive are (re)indexed with their
    /// stored record, the others leave it.
    pub(crate) async fn commit_checks(
        &self,
        batch: Vec<CheckRecord>,
        policy: RecheckPolicy,
    ) -> Result<Vec<CheckRecord>, StoreError> {
        let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
        let recorded = match self.inner.store.record_checks(batch.clone(), policy).await {
            Ok(r) => r,
            Err(e) => {
                if e.write_failure().is_some() {
                    self.count_unrecorded(ids.len());
                }
                return Err(e);
            }
        };
        // A proxy whose detected scheme merged it into another row is gone
        // under its old id.
        let present: HashSet<i64> = recorded.records.iter().map(|r| r.id).collect();
        for id in ids {
            if !present.contains(&id) {
                self.inner.index.remove(id);
            }
        }
        self.apply(recorded.records);
        let mut applied = lock(&self.inner.applied);
        applied.insert(recorded.seq);
        if applied.len() > APPLIED_MAX {
            applied.pop_first();
        }
        Ok(batch)
    }

    /// The change numbers after `after` whose rows this feedback brought
    /// into the index itself, sorted; those up to `after` are forgotten.
    pub(crate) fn applied_after(&self, after: i64) -> Vec<i64> {
        let mut applied = lock(&self.inner.applied);
        *applied = applied.split_off(&(after + 1));
        applied.iter().copied().collect()
    }

    /// Brings stored records into the index, except that a proxy hidden
    /// by a verdict newer than its record (a failed check not committed
    /// yet, a failure in use) stays hidden: a batch committed late must not
    /// bring back a proxy that has died since. A record that says the
    /// proxy failed in use after its last check (here or on another node
    /// sharing the database) takes it out of the index.
    pub fn apply(&self, records: Vec<ProxyRecord>) {
        let mut hidden = lock(&self.inner.hidden);
        let records: Vec<ProxyRecord> = records
            .into_iter()
            .filter(|r| {
                if r.failed_since_checked() {
                    self.inner.index.remove(r.id);
                    return false;
                }
                true
            })
            .filter(|r| match hidden.get(&r.id) {
                Some(&at) if r.last_checked.is_none_or(|t| t < at) => false,
                Some(_) => {
                    hidden.remove(&r.id);
                    true
                }
                None => true,
            })
            .collect();
        drop(hidden);
        self.inner.index.apply(records);
    }

    /// Serves again proxies a failed check hid whose verdict was dropped
    /// (every judge was lost: the failures say nothing about the
    /// proxies), as their stored records say. Without this they stayed
    /// out of `/proxy` and `/export` while `proxywarden export`, reading
    /// the same records, listed them.
    pub(crate) async fn restore(&self, ids: Vec<i64>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        {
            let mut hidden = lock(&self.inner.hidden);
            for id in &ids {
                hidden.remove(id);
            }
        }
        let records = self.inner.store.proxies_by_ids(ids).await?;
        self.apply(
            records
                .into_iter()
                .filter(|r| r.status == crate::proxy::Status::Alive)
                .collect(),
        );
        Ok(())
    }

    /// Makes the index hold what `records` (every alive proxy in the
    /// store) say, for a pool that follows the store rather than a check
    /// loop: proxies not among them leave, the rest are (re)indexed as
    /// [`Feedback::apply`] does, so one hidden by a failure in use since its
    /// last check stays out until a newer check finds it alive.
    pub(crate) fn reload(&self, records: Vec<ProxyRecord>) {
        let keep: HashSet<i64> = records.iter().map(|r| r.id).collect();
        for id in self.inner.index.ids() {
            if !keep.contains(&id) {
                self.inner.index.remove(id);
            }
        }
        self.apply(records);
    }

    /// Takes proxy `id` out of the index because of a verdict at `at`
    /// (unix ms) that its stored record does not know yet. True if it was
    /// being served.
    pub(super) fn hide(&self, id: i64, at: i64) -> bool {
        let mut hidden = lock(&self.inner.hidden);
        if hidden.len() >= MAX_HIDDEN {
            // Verdicts this old have been committed long since.
            let horizon = at - HIDDEN_FOR_MS;
            hidden.retain(|_, t| *t > horizon);
        }
        if hidden.len() < MAX_HIDDEN {
            hidden.insert(id, at);
        }
        drop(hidden);
        self.inner.index.remove(id)
    }
}
