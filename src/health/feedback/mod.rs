//! The one path from the use of a proxy back to the record. The checker's
//! committed results, `verify=true`, client reports, the pool, the crawler
//! and the gateway all report here: the index changes at once, early
//! re-checks are queued, what each site taught about each proxy is kept
//! (see `sites`), and counters reach the store. Nothing else changes the
//! index or a proxy's schedule.
//!
//! Its public face is small: it is built on an index and a store
//! ([`Feedback::new`]), read ([`Feedback::index`], [`Feedback::select`],
//! [`Feedback::is_banned`], [`Feedback::rotation`]) and told what a use or
//! a check taught ([`Feedback::report`], [`Feedback::worked_at`],
//! [`Feedback::apply`]).
//! What the pool, the checker and the daemon's loops need besides is
//! crate-private, grouped by job: `pick` (choosing and serving), `fresh`
//! (check results, freshness, re-checks), `sites` (what each site taught),
//! `worked` (uses that worked, written in batches) and `steps` (the
//! daemon's re-check steps, each one call).

mod fresh;
mod pick;
mod sites;
mod steps;
mod worked;

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::index::{Entry, HealthIndex, Strategy};
use super::query::ProxyQuery;
use super::sites::{KEEP_FOR_MS, MAX_PAIRS, SiteBook, Taught};
use super::spread::{SiteSpread, Spread};
use crate::lock;
use crate::model::{Block, Outcome, RecheckPolicy, UseVerdict};
use crate::store::{CheckRecord, ProxyRecord, Store, StoreError};
use sites::SiteGap;

/// The most proxies queued for an early re-check at once; the check loop
/// drains the queue every few seconds.
const MAX_RECHECK_QUEUE: usize = 10_000;

/// A proxy handed out whose last check is older than this is re-checked
/// early, so that what clients use stays verified.
pub(crate) const SERVED_RECHECK_AFTER: Duration = Duration::from_secs(30);

/// Uses that worked are written to the store together, this long after the
/// first of them: a fetch or a tunnel that went through costs a map update,
/// not a write. Failures never wait: they change the index at once.
pub(crate) const WORKED_FLUSH_AFTER: Duration = Duration::from_secs(1);

/// How long a (proxy, site) pair stays banned after the site blocked it.
pub(crate) const BAN_FOR: Duration = Duration::from_secs(600);

/// How long a (proxy, site) pair rests after a bare refusal (403): shorter
/// than a ban, since the refusal may be the page's, not the proxy's.
pub(crate) const REFUSAL_REST: Duration = Duration::from_secs(120);

/// How long a (proxy, site) pair rests after a rate limit that gave no
/// `Retry-After`.
pub(crate) const RATE_LIMIT_REST: Duration = Duration::from_secs(30);

/// What a report changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reported {
    /// False when the store has no proxy with that id.
    pub found: bool,
    /// True when the proxy was being served and no longer is.
    pub hidden: bool,
    /// True when an early re-check was queued.
    pub recheck: bool,
}

struct Inner {
    index: HealthIndex,
    store: Store,
    /// Recent re-check results of served proxies (true: failed).
    recent: Mutex<VecDeque<bool>>,
    /// During a burst, proxies last checked before this time (unix ms) are
    /// suspect: served only when nothing re-checked since matches.
    suspect_before: AtomicI64,
    /// When the current burst's suspicion ends (unix ms).
    suspect_until: AtomicI64,
    /// When the last sweep a burst started began (unix ms).
    burst_swept: AtomicI64,
    /// The freshness window in ms (0: none): a proxy whose last check is
    /// older is never served.
    fresh_within: AtomicI64,
    /// Proxies hidden by a verdict the store has not recorded yet, and when
    /// it came (unix ms).
    hidden: Mutex<HashMap<i64, i64>>,
    /// Proxies to check again before their schedule says.
    recheck: Mutex<HashSet<i64>>,
    /// Proxies that entered the index with a schedule this process did not
    /// make (loaded at start-up, checked by another process): the check
    /// loop brings their next checks onto the served proxies' cycle.
    adopted: Mutex<Vec<i64>>,
    /// Wakes the check loop when a re-check is queued.
    wake: Notify,
    /// What each site taught about each proxy (by site first, so a lookup
    /// needs no key of its own).
    sites: Mutex<SiteBook>,
    /// Pairs in `sites`: while there are none, picks skip the lock.
    site_pairs: std::sync::atomic::AtomicUsize,
    /// Which proxies carried each site's requests lately.
    spread: Mutex<Spread>,
    /// Worked uses not written yet, by proxy id (at most one entry per
    /// proxy the index served): how many, and when the last (unix ms).
    worked: Mutex<HashMap<i64, (u64, i64)>>,
    /// True while a flush of `worked` is scheduled.
    flush_scheduled: AtomicBool,
    /// Change numbers of check batches whose committed rows are in the
    /// index already, so reading changed rows back can skip them.
    applied: Mutex<BTreeSet<i64>>,
    /// Per site that rate-limited proxies: the gap kept between two
    /// requests through one proxy (see [`Feedback::site_gap`]).
    gaps: Mutex<HashMap<String, SiteGap>>,
    /// True once any site has a gap: until then every pick skips the lock.
    any_gap: AtomicBool,
    /// Verdicts and uses that took effect in memory but could not be
    /// written because the disk refused the write.
    unrecorded: AtomicU64,
}

/// A cheap, cloneable handle: every verdict on a proxy goes through it.
#[derive(Clone)]
pub struct Feedback {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Feedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feedback")
            .field("index", &self.inner.index)
            .finish()
    }
}

impl Feedback {
    /// Feedback that keeps `index` current and writes to `store`.
    pub fn new(index: HealthIndex, store: Store) -> Feedback {
        Feedback {
            inner: Arc::new(Inner {
                index,
                store,
                recent: Mutex::default(),
                suspect_before: AtomicI64::new(0),
                suspect_until: AtomicI64::new(0),
                burst_swept: AtomicI64::new(i64::MIN / 2),
                fresh_within: AtomicI64::new(0),
                hidden: Mutex::default(),
                recheck: Mutex::default(),
                adopted: Mutex::default(),
                wake: Notify::new(),
                sites: Mutex::default(),
                site_pairs: std::sync::atomic::AtomicUsize::new(0),
                spread: Mutex::default(),
                worked: Mutex::default(),
                flush_scheduled: AtomicBool::new(false),
                applied: Mutex::default(),
                gaps: Mutex::default(),
                any_gap: AtomicBool::new(false),
                unrecorded: AtomicU64::new(0),
            }),
        }
    }

    /// The index this feedback keeps current.
    pub fn index(&self) -> &HealthIndex {
        &self.inner.index
    }

    /// Verdicts and uses that took effect in memory (a proxy that failed
    /// stopped being served) but were not written because the disk refused
    /// the write: dropped, not queued, so memory stays bounded.
    pub(crate) fn unrecorded(&self) -> u64 {
        self.inner.unrecorded.load(Ordering::Relaxed)
    }

    /// Counts `n` verdicts dropped because the disk refused them.
    pub(crate) fn count_unrecorded(&self, n: usize) {
        self.inner.unrecorded.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// A verdict on proxy `id` from its use, at `site` (a host name) when
    /// the use was a fetch from a site. While the disk refuses writes the
    /// verdict still takes effect in memory (a failed proxy stops being
    /// served and is queued for a re-check) and is counted as unrecorded.
    pub async fn report(
        &self,
        id: i64,
        verdict: UseVerdict,
        site: Option<&str>,
    ) -> Result<Reported, StoreError> {
        let now = crate::store::now_ms();
        let (found, hidden, recheck) = match verdict {
            UseVerdict::Worked => {
                let found = self.record_report(id, true, now).await?;
                if found && let Some(site) = site {
                    self.note(id, site, Taught::worked(None));
                }
                (found, false, false)
            }
            UseVerdict::ProxyFailed(reason) => {
                // Out of the index first: the next pick must not get it.
                let hidden = self.hide(id, now);
                let found = self.record_report(id, false, now).await?;
                if found {
                    tracing::debug!(id, reason = ?reason, "proxy failed in use");
                    // The store made it due now (or, while it cannot write,
                    // the check loop will once it can); the loop only needs
                    // waking.
                    self.inner.wake.notify_one();
                }
                (found, hidden, found)
            }
            UseVerdict::Blocked(block) => {
                if let Some(site) = site {
                    self.blocked(id, site, block, None, Instant::now());
                }
                (true, false, false)
            }
            UseVerdict::TargetError | UseVerdict::Unreached => (true, false, false),
        };
        Ok(Reported {
            found,
            hidden,
            recheck,
        })
    }

    /// Writes a report; while the disk refuses writes, counts it as
    /// unrecorded instead (a failure is queued for a re-check in memory) and
    /// says whether the proxy exists from a read.
    async fn record_report(&self, id: i64, ok: bool, now: i64) -> Result<bool, StoreError> {
        match self.inner.store.record_report(id, ok, now).await {
            Err(e) if e.write_failure().is_some() => {
                self.count_unrecorded(1);
                let found = !self.inner.store.proxies_by_ids(vec![id]).await?.is_empty();
                if found && !ok {
                    let mut queue = lock(&self.inner.recheck);
                    if queue.len() < MAX_RECHECK_QUEUE {
                        queue.insert(id);
                    }
                }
                Ok(found)
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests;
