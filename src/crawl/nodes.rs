//! A crawl job on a database several nodes share: its hosts are paced
//! through the store's row per (job, host) as well as in memory, so that a
//! site's Crawl-delay holds whichever node sends, also when a node takes
//! over a job another was crawling a moment ago.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use url::Url;

use super::polite::Politeness;
use crate::pool::{Pacer, site_of};
use crate::store::{Store, now_ms};

/// Paces a job's requests in memory first (the turns this node spaces by
/// itself), then takes the turn in the store: when another node's request
/// to the host came later than this node knows, the request waits for the
/// turn the store hands out.
pub struct SharedPacer {
    local: Arc<Politeness>,
    store: Store,
    job: i64,
}

impl SharedPacer {
    /// Job `job`'s pacing through `store`, on top of `local`.
    pub fn new(local: Arc<Politeness>, store: Store, job: i64) -> SharedPacer {
        SharedPacer { local, store, job }
    }

    async fn take_turn(&self, host: &str) {
        self.local.take_turn(host).await;
        // Also with no delay of its own (robots.txt not read yet, say): the
        // turn another node's last request set still holds.
        let delay = self.local.delay(host);
        let now = now_ms();
        match self.store.take_crawl_turn(self.job, host, now, delay).await {
            Ok(at) if at > now => {
                let wait = Duration::from_millis((at - now) as u64);
                tokio::time::sleep(wait).await;
                // The local turns count from this one.
                self.local.sent(host);
            }
            Ok(_) => {}
            // The store is away: the turns this node keeps still hold.
            Err(e) => {
                tracing::warn!(job = self.job, host, error = %e, "cannot take a shared crawl turn")
            }
        }
    }
}

impl Pacer for SharedPacer {
    fn wait<'a>(&'a self, url: &'a Url) -> Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        Box::pin(async move { self.take_turn(&site_of(url)).await })
    }

    fn answered(&self, url: &Url, status: Option<StatusCode>, retry_after: Option<Duration>) {
        Pacer::answered(&*self.local, url, status, retry_after);
    }

    fn sent(&self, url: &Url) {
        Pacer::sent(&*self.local, url);
    }

    fn ready_in(&self, url: &Url) -> Duration {
        Pacer::ready_in(&*self.local, url)
    }
}
