//! What nodes sharing one database coordinate through it, besides check
//! leases (see `checks`): claims on scheduled harvests (held while the
//! harvest runs, taken over when their node dies), giving back a node's
//! leases, and notice of new change numbers.

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
    /// time, unix ms) for `node`, held until `until` (unix ms; renewed by
    /// [`Store::renew_harvest_claims`] while the harvest runs, ended by
    /// [`Store::finish_harvest_claims`]): true for the first claim of that
    /// pair, and for a claim whose holder's lease ended before its harvest
    /// did (a node that died); false when a node holds it (this one too:
    /// see [`Store::take_lapsed_harvests`]) or harvested it. Claims older than a
    /// week are forgotten.
    pub async fn claim_harvest(
        &self,
        source: String,
        slot: i64,
        node: String,
        now: i64,
        until: i64,
    ) -> Result<bool, StoreError> {
        dispatch!(self.claim_harvest(source, slot, node, now, until))
    }

    /// Holds every open harvest claim of `node` until `until`: its
    /// heartbeat while it harvests. How many it still holds.
    pub async fn renew_harvest_claims(&self, node: String, until: i64) -> Result<u64, StoreError> {
        dispatch!(self.renew_harvest_claims(node, until))
    }

    /// Ends the open harvest claims of `node` on `source` (on every
    /// source without one): that harvest is over, and no node harvests
    /// those sources again in those slots.
    pub async fn finish_harvest_claims(
        &self,
        node: String,
        source: Option<String>,
    ) -> Result<u64, StoreError> {
        dispatch!(self.finish_harvest_claims(node, source))
    }

    /// Takes for `node`, until `until`, every open harvest claim whose
    /// lease ended before `now` (its node died mid-harvest) or that `node`
    /// held in its last run: the (source, slot) pairs it must harvest now.
    /// Of nodes asking at once, each claim goes to one.
    pub async fn take_lapsed_harvests(
        &self,
        node: String,
        now: i64,
        until: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        dispatch!(self.take_lapsed_harvests(node, now, until))
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
