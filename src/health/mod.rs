//! In-memory serving state: the index of servable proxies, the query that
//! filters them, how one is chosen, and the one feedback path through which
//! every verdict on a proxy reaches the index and the store.

mod feedback;
pub mod filters;
mod index;
mod query;
mod sites;

pub use feedback::{
    BAN_FOR, Feedback, RATE_LIMIT_REST, REFUSAL_REST, Reported, SERVED_RECHECK_AFTER,
};
pub use index::{BestOfTwo, Entry, HealthIndex, Matches, Strategy, score};
pub use query::ProxyQuery;

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
    Ok(HealthIndex::from_records(alive))
}
