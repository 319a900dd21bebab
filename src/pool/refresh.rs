//! A pool over the store, for commands that run without the daemon's live
//! index: loaded at start and refreshed from the store through the
//! feedback path.

use super::*;

impl Pool {
    /// A pool on the alive proxies of `store`, reloaded every
    /// [`SharedOptions::refresh_every`], so that a daemon checking the same
    /// store keeps it fresh. Must be called inside a tokio runtime; the
    /// first load runs in the background and the first request waits for it.
    pub fn from_store(
        store: &Store,
        shared: SharedOptions,
        opts: PoolOptions,
    ) -> Result<Pool, PoolError> {
        let handle = tokio::runtime::Handle::try_current().map_err(|_| PoolError::NoRuntime)?;
        let feedback = Feedback::new(HealthIndex::new(), store.clone());
        let every = shared.refresh_every.max(Duration::from_millis(10));
        let pool = Pool::build(feedback, shared, opts, false)?;
        let weak = Arc::downgrade(&pool.inner.shared);
        let store = store.clone();
        let task = handle.spawn(async move {
            // What sites taught earlier runs first: a crawl does not go back
            // to proxies its site banned.
            if let Some(shared) = weak.upgrade()
                && let Err(e) = shared.feedback.load_sites().await
            {
                tracing::warn!(error = %e, "cannot load what sites taught about proxies");
            }
            loop {
                let loaded = store
                    .list_proxies(ProxyFilter {
                        status: Some(Status::Alive),
                        ..ProxyFilter::default()
                    })
                    .await;
                if !refresh(&weak, loaded) {
                    return;
                }
                tokio::time::sleep(every).await;
            }
        });
        *lock(&pool.inner.shared.refresher) = Some(task);
        Ok(pool)
    }
}

/// Replaces the index of the pool behind `weak` with `loaded`; false when
/// the pool is gone.
pub(super) fn refresh(
    weak: &Weak<Shared>,
    loaded: Result<Vec<crate::store::ProxyRecord>, StoreError>,
) -> bool {
    let Some(shared) = weak.upgrade() else {
        return false;
    };
    match loaded {
        Ok(records) => {
            // Through the feedback path: a proxy that failed in use since
            // its last check is not put back on the strength of it.
            shared.feedback.reload(records);
            *lock(&shared.load_error) = None;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot load proxies for the pool");
            *lock(&shared.load_error) = Some(format!("cannot load proxies: {e}"));
        }
    }
    shared.loaded.send_replace(true);
    shared.changed.notify_waiters();
    true
}
