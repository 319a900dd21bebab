//! What the checker reads and writes: the proxies due for a check (paged,
//! so memory follows the page size, not the table), batches of results with
//! re-check scheduling, and the purge of long-dead proxies.

use std::time::Duration;

use super::{ProxyRecord, Store, StoreError, dispatch};
use crate::model::{Outcome, RecheckPolicy};
use crate::proxy::{Credentials, Proxy, Scheme};

/// A proxy to check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DueProxy {
    /// Row id.
    pub id: i64,
    /// Identity and credentials.
    pub proxy: Proxy,
    /// True when the scheme is to be detected.
    pub detect: bool,
    /// True when its last check found it alive.
    pub alive: bool,
    /// When its HTTPS support was last tested (unix ms), if ever.
    pub https_checked_at: Option<i64>,
    /// When it fell due (unix ms).
    pub next_check_at: i64,
}

/// A due row's columns as both backends read them, in this order: id,
/// scheme, host, port, username, password, scheme_detect, alive,
/// https_checked_at, next_check_at.
pub(crate) type DueColumns = (
    i64,
    String,
    String,
    i64,
    String,
    Option<String>,
    bool,
    bool,
    Option<i64>,
    i64,
);

impl DueProxy {
    /// The proxy of a due row; `None`, with a warning, for a row that does
    /// not parse: it was not written by us, and a round skips it rather
    /// than fail.
    pub(crate) fn from_columns(c: DueColumns) -> Option<DueProxy> {
        let (id, scheme, host, port, username, password, detect, alive, https_checked_at, due) = c;
        let (Ok(scheme), Ok(host), Ok(port)) =
            (scheme.parse::<Scheme>(), host.parse(), u16::try_from(port))
        else {
            tracing::warn!(id, "skipping a proxy row that does not parse");
            return None;
        };
        Some(DueProxy {
            id,
            proxy: Proxy {
                scheme,
                host,
                port,
                auth: (!username.is_empty()).then(|| Credentials {
                    username,
                    password: password.unwrap_or_default(),
                }),
            },
            detect,
            alive,
            https_checked_at,
            next_check_at: due,
        })
    }

    /// The cursor for the page after this proxy.
    pub fn cursor(&self) -> DueCursor {
        DueCursor {
            at: self.next_check_at,
            id: self.id,
        }
    }
}

/// Where paging through a lane of due proxies stands. Due proxies are read
/// in the order they fell due, through the `next_check_at` index, so a page
/// costs the due rows it returns, not a scan of the table; with `all`
/// (every proxy, due or not) they are read by id, since a checked proxy's
/// new due time must not bring it round again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DueCursor {
    pub(crate) at: i64,
    pub(crate) id: i64,
}

impl DueCursor {
    /// Before the first proxy.
    pub const START: DueCursor = DueCursor {
        at: i64::MIN,
        id: i64::MIN,
    };
}

/// One page of changed rows read after change number `after`: `rows`
/// (id, change number) in change order, at most `limit`. Returns the ids
/// to read (those whose change number is not in `known`, sorted), the
/// mark to ask from next, and whether the page was full. A full page may
/// end inside one change number: the mark is then just below it, so none
/// of its rows is skipped (unless the page holds nothing else, which would
/// never move on).
pub(crate) fn change_page(
    rows: Vec<(i64, i64)>,
    after: i64,
    limit: usize,
    known: &[i64],
) -> (Vec<i64>, i64, bool) {
    let first = rows.first().map_or(after, |(_, seq)| *seq);
    let last = rows.last().map_or(after, |(_, seq)| *seq);
    let full = rows.len() == limit;
    let mark = if full && first < last { last - 1 } else { last };
    let ids = rows
        .into_iter()
        .filter(|(_, seq)| known.binary_search(seq).is_err())
        .map(|(id, _)| id)
        .collect();
    (ids, mark.max(after), full)
}

/// What [`Store::record_checks`] committed.
#[derive(Debug)]
pub struct Recorded {
    /// The stored records of the checked proxies as committed (a proxy
    /// whose detected scheme merged it into another row is that row).
    pub records: Vec<ProxyRecord>,
    /// The change number the write stamped its rows with.
    pub seq: i64,
}

/// One check's result, ready to record.
#[derive(Clone, Debug)]
pub struct CheckRecord {
    /// Row id of the proxy checked.
    pub id: i64,
    /// When the check finished (unix ms).
    pub checked_at: i64,
    /// What it found.
    pub outcome: Outcome,
}

/// Which due proxies a page holds. A round takes the alive ones, the ones
/// being served, before new and dead ones, so that their re-checks never
/// wait behind thousands of those; and it starts the proxies that timed out
/// last time alongside, from the first moment, longest first, so that the
/// checks that take longest never form the round's tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DueLane {
    /// Proxies whose last check found them alive.
    Alive,
    /// Not alive, and the last check ran into the total timeout: an HTTP
    /// proxy that took a request and never answered.
    LongTimeout,
    /// Not alive, and the last check ran into a shorter bound: the connect
    /// timeout, or a SOCKS handshake (bound by the connect timeout).
    ShortTimeout,
    /// Every other proxy: new, or dead for another reason.
    Others,
}

impl DueLane {
    /// The lanes of proxies that timed out last time, longest first.
    pub const TIMED_OUT: [DueLane; 2] = [DueLane::LongTimeout, DueLane::ShortTimeout];
    /// The other lanes, in the order a round takes them.
    pub const REST: [DueLane; 2] = [DueLane::Alive, DueLane::Others];

    /// The lane's condition on a `proxies` row, in SQL every backend
    /// speaks.
    pub(crate) fn condition(self) -> &'static str {
        match self {
            DueLane::Alive => "status = 'alive'",
            DueLane::LongTimeout => {
                "status <> 'alive' AND last_reason = 'timeout' AND scheme = 'http'"
            }
            DueLane::ShortTimeout => {
                "status <> 'alive' AND (last_reason = 'connect_timeout'
                     OR (last_reason = 'timeout' AND scheme <> 'http'))"
            }
            DueLane::Others => {
                "status <> 'alive' AND coalesce(last_reason, '') NOT IN ('timeout', 'connect_timeout')"
            }
        }
    }
}

impl Store {
    /// How many proxies are due at `now` (all of them with `all`).
    pub async fn count_due(&self, now: i64, all: bool) -> Result<i64, StoreError> {
        dispatch!(self.count_due(now, all))
    }

    /// When the next check no node holds a lease on at `now` is due (unix
    /// ms), if any: proxies another node is checking are not this node's
    /// to wait for, until their lease ends.
    pub async fn next_due_at(&self, now: i64) -> Result<Option<i64>, StoreError> {
        dispatch!(self.next_due_at(now))
    }

    /// Up to `limit` due proxies of `lane` (every proxy of the lane with
    /// `all`) after `after`.
    pub async fn due_page(
        &self,
        now: i64,
        all: bool,
        lane: DueLane,
        after: DueCursor,
        limit: usize,
    ) -> Result<Vec<DueProxy>, StoreError> {
        dispatch!(self.due_page(now, all, lane, after, limit))
    }

    /// Records a batch of results and schedules each proxy's next check:
    /// alive after `policy.alive` less up to `policy.alive_jitter` (so
    /// re-checks spread out over time instead of coming in waves); dead
    /// after `policy.dead` doubled per consecutive failure, capped at
    /// `policy.dead_max`. Returns what it committed.
    pub async fn record_checks(
        &self,
        batch: Vec<CheckRecord>,
        policy: RecheckPolicy,
    ) -> Result<Recorded, StoreError> {
        dispatch!(self.record_checks(batch, policy))
    }

    /// The latest change number: rows changed after this are newer than
    /// anything read before.
    pub async fn change_seq(&self) -> Result<i64, StoreError> {
        dispatch!(self.change_seq())
    }

    /// The proxies changed after change number `after` (at most `limit`,
    /// oldest change first), the change number to ask from next time, and
    /// whether there may be more. Rows last stamped with a change number
    /// in `known` (sorted; the caller has them already) count towards
    /// `limit` but are not read.
    pub async fn changed_since(
        &self,
        after: i64,
        limit: usize,
        known: Vec<i64>,
    ) -> Result<(Vec<ProxyRecord>, i64, bool), StoreError> {
        dispatch!(self.changed_since(after, limit, known))
    }

    /// Leases to `node`, until `now + lease`, up to `limit` proxies of
    /// `lane` due at `now` that no node holds (or whose lease expired), in
    /// the order they fell due. Nodes sharing a database lease disjoint
    /// proxies: on PostgreSQL a row another node is leasing is skipped, not
    /// waited for. The verdict ([`Store::record_checks`]) or a deferral
    /// ([`Store::defer_checks`]) ends the lease; a node that dies loses its
    /// leases when they expire.
    pub async fn lease_due(
        &self,
        node: String,
        now: i64,
        lane: DueLane,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueProxy>, StoreError> {
        dispatch!(self.lease_due(node, now, lane, limit, lease))
    }

    /// Schedules the next check of these proxies at `at` (unix ms) without
    /// recording a check: for proxies whose check reached no verdict.
    pub async fn defer_checks(&self, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        dispatch!(self.defer_checks(ids, at))
    }

    /// Asks for the HTTPS support of these proxies to be tested again at
    /// their next check, and makes them due now: for a tunnel (CONNECT)
    /// that failed in use, whatever `check.https_recheck` says.
    pub async fn request_https_recheck(&self, ids: Vec<i64>, now: i64) -> Result<(), StoreError> {
        dispatch!(self.request_https_recheck(ids, now))
    }

    /// Brings the next check of each `(proxy id, time)` forward to that
    /// time (unix ms); a check already due sooner stays as it is.
    pub async fn pull_checks_in(&self, due: Vec<(i64, i64)>) -> Result<(), StoreError> {
        dispatch!(self.pull_checks_in(due))
    }

    /// Makes these proxies due now.
    pub async fn mark_due_many(&self, ids: Vec<i64>, now: i64) -> Result<(), StoreError> {
        dispatch!(self.mark_due_many(ids, now))
    }

    /// Counts a verdict from the use of a proxy; a failure also makes it
    /// due now. False when there is no such proxy.
    pub async fn record_report(&self, id: i64, ok: bool, now: i64) -> Result<bool, StoreError> {
        dispatch!(self.record_report(id, ok, now))
    }

    /// Adds uses that worked, `(proxy id, count, last use at)`, to the proxies' counters
    /// in one write: the feedback path collects them instead of writing once
    /// per use.
    pub async fn record_worked(&self, uses: Vec<(i64, u64, i64)>) -> Result<(), StoreError> {
        dispatch!(self.record_worked(uses))
    }

    /// Deletes proxies dead for longer than `after` that no source has
    /// listed for that long. Returns how many went.
    pub async fn purge(&self, now: i64, after: Duration) -> Result<usize, StoreError> {
        dispatch!(self.purge(now, after))
    }
}
