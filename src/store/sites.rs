//! What each site taught about each proxy that reached it, kept so that a
//! restart remembers which proxies a site bans and which it takes.

use super::{Store, StoreError, dispatch};

/// One (proxy, site) pair as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteRecord {
    /// The site, as the pool names it (host, with a port other than the
    /// scheme's default).
    pub site: String,
    /// The proxy's row id.
    pub proxy_id: i64,
    /// Uses through the proxy that the site answered.
    pub worked: i64,
    /// Times the site refused the proxy (ban pages, refusals, reports).
    pub blocked: i64,
    /// Smoothed latency of the uses that worked there, in ms.
    pub latency_ms: Option<i64>,
    /// When a use there last worked (unix ms).
    pub last_worked_at: Option<i64>,
    /// When the site last refused it (unix ms).
    pub last_blocked_at: Option<i64>,
    /// Until when the site bans or rests it (unix ms), if it does.
    pub banned_until: Option<i64>,
    /// When this record last changed (unix ms).
    pub updated_at: i64,
}

impl Store {
    /// Writes these pairs as they are now (each replaces its row). Pairs
    /// of proxies the store no longer has are skipped.
    pub async fn save_site_records(&self, records: Vec<SiteRecord>) -> Result<(), StoreError> {
        dispatch!(self.save_site_records(records))
    }

    /// The `limit` most recently changed pairs changed at or after `since`
    /// (unix ms), newest first.
    pub async fn load_site_records(
        &self,
        since: i64,
        limit: usize,
    ) -> Result<Vec<SiteRecord>, StoreError> {
        dispatch!(self.load_site_records(since, limit))
    }
}
