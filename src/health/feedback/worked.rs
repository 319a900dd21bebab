//! Worked uses: counted at once, written to the store in batches.

use super::*;

/// Rows per store write when worked uses are flushed.
pub(super) const WORKED_FLUSH_CHUNK: usize = 4096;

impl Feedback {
    /// A use of proxy `id` worked (the pool, the crawler, the gateway). It
    /// is counted in memory and written with others within
    /// [`WORKED_FLUSH_AFTER`] (or at [`Feedback::flush`]), so that the
    /// request path never waits for the store.
    pub(crate) fn worked(&self, id: i64) {
        let now = crate::store::now_ms();
        // It counts as checked now: served within the freshness bounds on
        // the strength of this use (and, once written, in the store too).
        if let Some(e) = self.inner.index.get(id) {
            e.worked(now);
            self.inner.index.prove(id);
        }
        {
            let mut worked = lock(&self.inner.worked);
            let w = worked.entry(id).or_default();
            w.0 += 1;
            w.1 = w.1.max(now);
        }
        self.schedule_flush();
    }

    /// Writes what was counted within [`WORKED_FLUSH_AFTER`], unless a
    /// write is scheduled already.
    pub(super) fn schedule_flush(&self) {
        if self.inner.flush_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let feedback = self.clone();
                // Dropped before its write (its runtime ended first, as a
                // crawl's own thread's does): the next use schedules a
                // write again, and the uses counted wait for it.
                let unscheduled = FlushUnscheduled(Some(self.clone()));
                rt.spawn(async move {
                    tokio::time::sleep(WORKED_FLUSH_AFTER).await;
                    unscheduled.disarm();
                    if let Err(e) = feedback.flush().await {
                        tracing::warn!(error = %e, "cannot record proxies' worked uses");
                    }
                });
            }
            // Outside a runtime the next flush (or use inside one) takes them.
            Err(_) => self.inner.flush_scheduled.store(false, Ordering::Release),
        }
    }

    /// Clears the mark of a scheduled write.
    fn unschedule_flush(&self) {
        self.inner.flush_scheduled.store(false, Ordering::Release);
    }

    /// Writes the worked uses counted so far to the store. The daemon and
    /// the crawler call it before they stop. Uses the disk refuses are
    /// dropped and counted as unrecorded: they already count in memory.
    pub(crate) async fn flush(&self) -> Result<(), StoreError> {
        // Cleared before the take: a use counted after it schedules the
        // next flush itself.
        self.inner.flush_scheduled.store(false, Ordering::Release);
        let batch: Vec<(i64, u64, i64)> = std::mem::take(&mut *lock(&self.inner.worked))
            .into_iter()
            .map(|(id, (n, at))| (id, n, at))
            .collect();
        let mut chunks = batch.chunks(WORKED_FLUSH_CHUNK);
        while let Some(chunk) = chunks.next() {
            match self.inner.store.record_worked(chunk.to_vec()).await {
                Ok(()) => {}
                Err(e) if e.write_failure().is_some() => {
                    let dropped = chunk.len() + chunks.map(<[_]>::len).sum::<usize>();
                    tracing::debug!(dropped, error = %e, "worked uses not recorded");
                    self.count_unrecorded(dropped);
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        let sites = lock(&self.inner.sites).take_dirty();
        for chunk in sites.chunks(WORKED_FLUSH_CHUNK) {
            match self.inner.store.save_site_records(chunk.to_vec()).await {
                Ok(()) => {}
                // They still count in memory; the next change writes them.
                Err(e) if e.write_failure().is_some() => {
                    tracing::debug!(error = %e, "what sites taught not recorded");
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// A tunnel (CONNECT) through HTTP proxy `id` failed in use: its HTTPS
    /// support is tested again at once, whatever `check.https_recheck`
    /// says, so a proxy that stopped tunnelling stops being offered for
    /// https targets.
    pub(crate) async fn tunnel_failed(&self, id: i64) -> Result<(), StoreError> {
        let now = crate::store::now_ms();
        match self.inner.store.request_https_recheck(vec![id], now).await {
            Err(e) if e.write_failure().is_some() => self.count_unrecorded(1),
            other => other?,
        }
        self.inner.wake.notify_one();
        Ok(())
    }
}

/// A scheduled write of worked uses, not yet started: dropped so, it lets
/// the next use schedule another.
struct FlushUnscheduled(Option<Feedback>);

impl FlushUnscheduled {
    /// The write starts: it clears the mark itself.
    fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for FlushUnscheduled {
    fn drop(&mut self) {
        if let Some(f) = &self.0 {
            f.unschedule_flush();
        }
    }
}
