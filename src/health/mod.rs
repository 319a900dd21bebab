//! In-memory serving state: the index of servable proxies, the query that
//! filters them, how one is chosen, and the one feedback path through which
//! every verdict on a proxy reaches the index and the store.

mod feedback;
pub mod filters;
mod index;
mod query;
mod sites;
mod spread;

pub use feedback::{Feedback, Reported};
pub use index::{BestOfTwo, Entry, HealthIndex, Matches, Strategy, score};
pub use query::ProxyQuery;
pub use spread::{SPREAD_SITES, SPREAD_USES, SPREAD_WINDOW, SiteSpread};

/// A map by proxy id, looked up for every candidate of every pick: a fast
/// hasher (ids are the store's, not chosen by the network), randomly
/// seeded all the same.
pub(crate) type IdMap<V> = std::collections::HashMap<i64, V, foldhash::fast::RandomState>;

use crate::proxy::Status;
use crate::store::{ProxyFilter, Store, StoreError};

/// An index of every alive proxy in `store`.
pub async fn load_index(store: &Store) -> Result<HealthIndex, StoreError> {
    let alive = store
        .list_proxies(ProxyFilter {
            status: Some(Status::Alive),
            ..ProxyFilter::default()
        })
        .await?;
    // One that failed in use (on any node) since its last check waits for
    // a check that passes.
    let alive = alive
        .into_iter()
        .filter(|r| !r.failed_since_checked())
        .collect();
    Ok(HealthIndex::from_records(alive))
}
