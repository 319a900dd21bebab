//! What nodes sharing one database coordinate through it, besides check
//! leases (see `checks`): claims on scheduled harvests, giving back a
//! node's leases, and notice of new change numbers.

use std::sync::Arc;

use tokio::sync::Notify;

use super::{Store, StoreError, dispatch};

/// Wakes whoever follows the change sequence when another connection
/// commits a new change number. On PostgreSQL a dedicated connection
/// LISTENs for the notice the `meta` trigger sends at each commit (and
/// reconnects when it drops); on SQLite there is no such notice and
/// [`ChangeNotices::available`] is false: the follower polls.
#[derive(Clone, Default)]
pub struct ChangeNotices {
    pub(crate) notify: Arc<Notify>,
    pub(crate) available: bool,
}

impl ChangeNotices {
    /// True when notices come at all; without them, poll.
    pub fn available(&self) -> bool {
        self.available
    }

    /// Resolves at the next notice (or at once if one came since the last
    /// call). Never resolves where notices are not available.
    pub async fn next(&self) {
        if self.available {
            self.notify.notified().await
        } else {
            std::future::pending().await
        }
    }
}

impl Store {
    /// Claims the harvest of `source` in schedule slot `slot` (the slot's
    /// time, unix ms) for `node`: true for the first claim of that pair,
    /// false when another node (or process) has it. Claims older than a
    /// week are forgotten.
    pub async fn claim_harvest(
        &self,
        source: String,
        slot: i64,
        node: String,
        now: i64,
    ) -> Result<bool, StoreError> {
        dispatch!(self.claim_harvest(source, slot, node, now))
    }

    /// Gives back every check lease `node` holds: the proxies are due for
    /// any node again at once. A node calls it when a round ends (what it
    /// still holds then was not checked: dropped results, a round cut
    /// short) and when it stops.
    pub async fn release_leases(&self, node: String) -> Result<u64, StoreError> {
        dispatch!(self.release_leases(node))
    }

    /// Notices of new change numbers others commit (see [`ChangeNotices`]).
    pub async fn change_notices(&self) -> ChangeNotices {
        match &self.backend {
            super::Backend::Sqlite(_) => ChangeNotices::default(),
            super::Backend::Postgres(db) => db.change_notices(),
        }
    }
}

/// Claims are kept this long (ms): far longer than any schedule's slot
/// is late.
pub(crate) const CLAIMS_KEPT_MS: i64 = 7 * 24 * 3600 * 1000;
