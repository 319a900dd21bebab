//! The one path from the use of a proxy back to the record. The checker's
//! committed results, `verify=true`, client reports, the pool, the crawler
//! and the gateway all report here: the index changes at once, early
//! re-checks are queued, what each site taught about each proxy is kept
//! (see `sites`), and counters reach the store. Nothing else changes the
//! index or a proxy's schedule.

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

/// A proxy handed out whose last check is older than this is re-checked
/// early, so that what clients use stays verified.
pub const SERVED_RECHECK_AFTER: Duration = Duration::from_secs(30);

/// The most proxies queued for an early re-check at once; the check loop
/// drains the queue every few seconds.
const MAX_RECHECK_QUEUE: usize = 10_000;

/// The most adopted proxies queued for rescheduling at once; more keep the
/// schedule they came with (and are re-checked by the next adoption, a
/// failure in use or their own schedule).
const MAX_ADOPTED: usize = 1_000_000;

/// Uses that worked are written to the store together, this long after the
/// first of them: a fetch or a tunnel that went through costs a map update,
/// not a write. Failures never wait: they change the index at once.
pub const WORKED_FLUSH_AFTER: Duration = Duration::from_secs(1);

/// Rows per store write when worked uses are flushed.
const WORKED_FLUSH_CHUNK: usize = 4096;

/// How long a (proxy, site) pair stays banned after the site blocked it.
pub const BAN_FOR: Duration = Duration::from_secs(600);

/// How long a (proxy, site) pair rests after a bare refusal (403): shorter
/// than a ban, since the refusal may be the page's, not the proxy's.
pub const REFUSAL_REST: Duration = Duration::from_secs(120);

/// How long a (proxy, site) pair rests after a rate limit that gave no
/// `Retry-After`.
pub const RATE_LIMIT_REST: Duration = Duration::from_secs(30);

/// The most proxies kept hidden awaiting the record of their verdict.
const MAX_HIDDEN: usize = 100_000;
/// Hidden proxies older than this are forgotten when the map is full.
const HIDDEN_FOR_MS: i64 = 600_000;

/// Re-checks of served proxies remembered to spot a burst of failures.
const BURST_WINDOW: usize = 32;
/// Failures among them that make a burst: this many, and at least
/// [`BURST_SHARE`] of the window's checks. One proxy dying now and then is
/// routine; an eighth of the recent re-checks failing together means others
/// may have died unseen (a provider or an upstream went down). A false
/// alarm costs one early re-check of every served proxy.
const BURST_MIN: usize = 4;
/// See [`BURST_MIN`].
const BURST_SHARE: f64 = 0.125;

/// The shortest time between two sweeps (see [`Feedback::reverify_all`]),
/// in ms.
const SWEEP_GAP_MIN_MS: i64 = 5_000;

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

/// What a site's rate limits taught: the gap between two requests through
/// one proxy that keeps under its limit per address.
#[derive(Clone, Copy, Debug)]
struct SiteGap {
    /// The gap when last raised, in ms.
    ms: f64,
    /// When it was last raised.
    raised: Instant,
}

/// The first gap a site's rate limit sets.
const GAP_FIRST_MS: f64 = 100.0;
/// Each rate limit widens the gap by this factor (at most once per
/// [`GAP_RAISE_EVERY`], so one burst of 429s counts once)...
const GAP_RAISE: f64 = 1.5;
/// ...up to this.
const GAP_MAX_MS: f64 = 10_000.0;
/// See [`GAP_RAISE`].
const GAP_RAISE_EVERY: Duration = Duration::from_secs(1);
/// Without rate limits the gap halves every this long, so that a limit
/// that was lifted stops slowing requests.
const GAP_HALF_LIFE: Duration = Duration::from_secs(60);
/// Sites whose gaps are kept.
const MAX_GAP_SITES: usize = 4096;

impl SiteGap {
    /// The gap now, decayed since its last raise.
    fn now(&self) -> f64 {
        let halves = self.raised.elapsed().as_secs_f64() / GAP_HALF_LIFE.as_secs_f64();
        self.ms * 0.5f64.powf(halves)
    }
}

/// Change numbers kept in `applied` at most (without a reader that takes
/// them, the oldest go: their rows are then just read back once more).
const APPLIED_MAX: usize = 4096;

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
    pub fn unrecorded(&self) -> u64 {
        self.inner.unrecorded.load(Ordering::Relaxed)
    }

    /// Counts `n` verdicts dropped because the disk refused them.
    pub fn count_unrecorded(&self, n: usize) {
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

    /// A use of proxy `id` worked (the pool, the crawler, the gateway). It
    /// is counted in memory and written with others within
    /// [`WORKED_FLUSH_AFTER`] (or at [`Feedback::flush`]), so that the
    /// request path never waits for the store.
    pub fn worked(&self, id: i64) {
        let now = crate::store::now_ms();
        // It counts as checked now: served within the freshness bounds on
        // the strength of this use (and, once written, in the store too).
        if let Some(e) = self.inner.index.get(id) {
            e.worked(now);
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
    fn schedule_flush(&self) {
        if self.inner.flush_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let feedback = self.clone();
                rt.spawn(async move {
                    tokio::time::sleep(WORKED_FLUSH_AFTER).await;
                    if let Err(e) = feedback.flush().await {
                        tracing::warn!(error = %e, "cannot record proxies' worked uses");
                    }
                });
            }
            // Outside a runtime the next flush (or use inside one) takes them.
            Err(_) => self.inner.flush_scheduled.store(false, Ordering::Release),
        }
    }

    /// Writes the worked uses counted so far to the store. The daemon and
    /// the crawler call it before they stop. Uses the disk refuses are
    /// dropped and counted as unrecorded: they already count in memory.
    pub async fn flush(&self) -> Result<(), StoreError> {
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
    pub async fn tunnel_failed(&self, id: i64) -> Result<(), StoreError> {
        let now = crate::store::now_ms();
        match self.inner.store.request_https_recheck(vec![id], now).await {
            Err(e) if e.write_failure().is_some() => self.count_unrecorded(1),
            other => other?,
        }
        self.inner.wake.notify_one();
        Ok(())
    }

    /// Learns from a check of proxy `id` as soon as it finished, before the
    /// result is committed: a served proxy that failed stops being served
    /// at once, and a burst of failures among served proxies puts every
    /// other served proxy up for an early re-check and under suspicion
    /// until it passes one.
    pub fn checked(&self, id: i64, outcome: &Outcome, now: i64) {
        let served = if outcome.alive() {
            self.inner.index.get(id).is_some()
        } else {
            self.hide(id, now)
        };
        if !served {
            return;
        }
        let burst = {
            let mut recent = lock(&self.inner.recent);
            if recent.len() == BURST_WINDOW {
                recent.pop_front();
            }
            recent.push_back(!outcome.alive());
            let failed = recent.iter().filter(|f| **f).count();
            let burst = failed >= BURST_MIN && failed as f64 >= BURST_SHARE * recent.len() as f64;
            if burst {
                // One burst, one sweep: the next needs fresh evidence.
                recent.clear();
            }
            burst
        };
        // One sweep at a time: the next once the last one's re-checks have
        // run (every served proxy passed a check since it began) or have
        // had time to (a quarter of the freshness window, 5 s at least),
        // not only once its suspicion ends. The suspicion after a start
        // lasts a window, and a mass death inside it must be swept: at
        // once when the start-up re-check has passed everything. Sweeps
        // bursts start keep the gap between them whatever, so a pool
        // that keeps failing an eighth of its re-checks is not swept
        // every few seconds.
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let gap = (fresh / 4).max(SWEEP_GAP_MIN_MS);
        let last = self.inner.suspect_before.load(Ordering::Relaxed);
        if burst
            && now - self.inner.burst_swept.load(Ordering::Relaxed) >= gap
            && (now - last >= gap || self.reverified_since(last))
        {
            self.inner.burst_swept.store(now, Ordering::Relaxed);
            tracing::warn!(
                served = self.inner.index.len(),
                "a burst of failures among served proxies; re-checking all of them now"
            );
            self.reverify_all(now);
        }
    }

    /// True when every served proxy passed a check (or carried a request)
    /// at or after `at` (unix ms).
    fn reverified_since(&self, at: i64) -> bool {
        let index = &self.inner.index;
        index.ids().into_iter().all(|id| {
            index
                .get(id)
                .is_none_or(|e| e.proven_at().is_some_and(|t| t >= at))
        })
    }

    /// Treats every served proxy as suspect until it passes a check again,
    /// and asks for those checks at once: after a burst of failures, and at
    /// start-up, when every proxy served comes from a record that may be
    /// old news (another process checked it; it may have died since).
    /// Suspect proxies are served only while none matching has passed a
    /// check since.
    pub fn reverify_all(&self, now: i64) {
        let ids = self.inner.index.ids();
        if ids.is_empty() {
            // Nothing served is nothing to suspect, and no sweep whose
            // re-checks the next must wait for: after a start on an empty
            // database, the first burst among what it then checked is swept.
            return;
        }
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let hold = if fresh > 0 { fresh } else { 60_000 };
        self.inner.suspect_before.store(now, Ordering::Relaxed);
        self.inner
            .suspect_until
            .store(now + hold, Ordering::Relaxed);
        let mut queue = lock(&self.inner.recheck);
        queue.extend(ids);
        drop(queue);
        self.inner.wake.notify_one();
    }

    /// Sets the freshness window: proxies whose last check is older are
    /// never served (`Duration::ZERO`: no window).
    pub fn set_fresh_within(&self, window: Duration) {
        let ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
        self.inner.fresh_within.store(ms, Ordering::Relaxed);
    }

    /// One proxy to serve: matching `q` at `now`, checked within the
    /// freshness window, not refused by `exclude`, chosen by `strategy`
    /// among all of those. For a request to `site`, proxies it bans or
    /// rests are left out, and what it taught of the others is the
    /// strategy's to weigh ([`Matches::site_rank`](super::Matches::site_rank)):
    /// the proxies that worked there never narrow the set. During a burst,
    /// proxies re-checked since it began are preferred. `exclude` must not
    /// call back into this `Feedback`.
    pub fn pick(
        &self,
        q: &ProxyQuery,
        site: Option<&str>,
        now: i64,
        strategy: &dyn Strategy,
        exclude: &dyn Fn(&Entry) -> bool,
    ) -> Option<Arc<Entry>> {
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let stale = |e: &Entry| fresh > 0 && e.proven_at().is_none_or(|t| t < now - fresh);
        let book = site
            .filter(|_| self.inner.site_pairs.load(Ordering::Relaxed) > 0)
            .map(|_| lock(&self.inner.sites));
        let at_site = book.as_deref().zip(site).and_then(|(b, s)| b.site(s));
        let instant = Instant::now();
        let usable = |e: &Entry| {
            !exclude(e) && !stale(e) && at_site.is_none_or(|s| s.until(e.id, instant).is_none())
        };
        let suspect_until = self.inner.suspect_until.load(Ordering::Relaxed) > now;
        let before = self.inner.suspect_before.load(Ordering::Relaxed);
        let verified = |e: &Entry| !suspect_until || e.proven_at().is_some_and(|t| t >= before);
        let index = &self.inner.index;
        let rank = |id: i64| at_site.map_or((1, 0), |s| s.rank(id));
        if suspect_until {
            let verified =
                index.pick_ranked(q, now, strategy, &|e| !(usable(e) && verified(e)), &rank);
            if verified.is_some() {
                return verified;
            }
        }
        index.pick_ranked(q, now, strategy, &|e| !usable(e), &rank)
    }

    /// Every proxy to serve matching `q` at `now` (checked within the
    /// freshness window), by id; for `site`, without those it bans or
    /// rests, and those that worked there first (fastest there first).
    pub fn select(&self, q: &ProxyQuery, site: Option<&str>, now: i64) -> Vec<Arc<Entry>> {
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        let mut all = self.inner.index.select(q, now);
        if fresh > 0 {
            all.retain(|e| e.proven_at().is_some_and(|t| t >= now - fresh));
        }
        if let Some(site) = site {
            self.for_site(site, &mut all, |e| e.id);
        }
        all
    }

    /// Leaves out of `items` (proxies, by `id`) those `site` bans or rests
    /// now, and moves those that worked there to the front, fastest there
    /// first; the others keep their order.
    pub fn for_site<T>(&self, site: &str, items: &mut Vec<T>, id: impl Fn(&T) -> i64) {
        if self.inner.site_pairs.load(Ordering::Relaxed) == 0 {
            return;
        }
        let book = lock(&self.inner.sites);
        let Some(at) = book.site(site) else {
            return;
        };
        let now = Instant::now();
        items.retain(|x| at.until(id(x), now).is_none());
        items.sort_by_key(|x| at.rank(id(x)));
    }

    /// Notes that `entry` was handed out at `now` (unix ms): one whose last
    /// check is older than [`SERVED_RECHECK_AFTER`] is queued for an early
    /// re-check.
    pub fn served(&self, entry: &Entry, now: i64) {
        let stale = entry
            .last_checked
            .is_none_or(|t| now - t > SERVED_RECHECK_AFTER.as_millis() as i64);
        if stale {
            let mut queue = lock(&self.inner.recheck);
            if queue.len() < MAX_RECHECK_QUEUE {
                queue.insert(entry.id);
            }
        }
    }

    /// Brings rows another process wrote into the index (see
    /// [`Feedback::apply`]) and queues the alive ones for the check loop to
    /// put on the served proxies' re-check cycle: their next check may be
    /// as far away as `check.recheck_alive`, long past the freshness window.
    pub fn adopt(&self, records: Vec<ProxyRecord>) {
        let ids: Vec<i64> = records
            .iter()
            .filter(|r| r.status == crate::proxy::Status::Alive)
            .map(|r| r.id)
            .collect();
        self.apply(records);
        self.queue_adopted(ids);
    }

    fn queue_adopted(&self, ids: Vec<i64>) {
        if ids.is_empty() {
            return;
        }
        let mut adopted = lock(&self.inner.adopted);
        let room = MAX_ADOPTED.saturating_sub(adopted.len());
        adopted.extend(ids.into_iter().take(room));
        drop(adopted);
        self.inner.wake.notify_one();
    }

    /// Takes the adopted proxies still in the index.
    pub fn take_adopted(&self) -> Vec<Arc<Entry>> {
        let ids = std::mem::take(&mut *lock(&self.inner.adopted));
        ids.into_iter()
            .filter_map(|id| self.inner.index.get(id))
            .collect()
    }

    /// Takes the proxies queued for an early re-check.
    fn take_rechecks(&self) -> Vec<i64> {
        lock(&self.inner.recheck).drain().collect()
    }

    /// Makes the proxies queued for an early re-check due at `now` in the
    /// store; how many there were (an error loses them: each is queued
    /// again by its next failure).
    pub async fn queue_rechecks(&self, now: i64) -> Result<usize, StoreError> {
        let ids = self.take_rechecks();
        let n = ids.len();
        if n > 0 {
            self.inner.store.mark_due_many(ids, now).await?;
        }
        Ok(n)
    }

    /// Brings the next check of each `(proxy id, time)` forward to that
    /// time (unix ms): adopted proxies put on the served cycle.
    pub async fn schedule_checks(&self, due: Vec<(i64, i64)>) -> Result<(), StoreError> {
        self.inner.store.pull_checks_in(due).await
    }

    /// Puts off the next check of proxies whose check reached no verdict
    /// (every judge was unreachable) to `at` (unix ms), recording nothing
    /// about them.
    pub async fn defer_checks(&self, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        self.inner.store.defer_checks(ids, at).await
    }

    /// Resolves when a verdict asked for an early re-check.
    pub async fn recheck_wanted(&self) {
        self.inner.wake.notified().await
    }

    /// Commits a batch of check results and brings the index in line with
    /// what was committed: proxies found alive are (re)indexed with their
    /// stored record, the others leave it.
    pub async fn commit_checks(
        &self,
        batch: Vec<CheckRecord>,
        policy: RecheckPolicy,
    ) -> Result<Vec<CheckRecord>, StoreError> {
        let ids: Vec<i64> = batch.iter().map(|r| r.id).collect();
        let recorded = match self.inner.store.record_checks(batch.clone(), policy).await {
            Ok(r) => r,
            Err(e) => {
                if e.write_failure().is_some() {
                    self.count_unrecorded(ids.len());
                }
                return Err(e);
            }
        };
        // A proxy whose detected scheme merged it into another row is gone
        // under its old id.
        let present: HashSet<i64> = recorded.records.iter().map(|r| r.id).collect();
        for id in ids {
            if !present.contains(&id) {
                self.inner.index.remove(id);
            }
        }
        self.apply(recorded.records);
        let mut applied = lock(&self.inner.applied);
        applied.insert(recorded.seq);
        if applied.len() > APPLIED_MAX {
            applied.pop_first();
        }
        Ok(batch)
    }

    /// The change numbers after `after` whose rows this feedback brought
    /// into the index itself, sorted; those up to `after` are forgotten.
    pub fn applied_after(&self, after: i64) -> Vec<i64> {
        let mut applied = lock(&self.inner.applied);
        *applied = applied.split_off(&(after + 1));
        applied.iter().copied().collect()
    }

    /// Brings stored records into the index, except that a proxy hidden
    /// by a verdict newer than its record (a failed check not committed
    /// yet, a failure in use) stays hidden: a batch committed late must not
    /// bring back a proxy that has died since. A record that says the
    /// proxy failed in use after its last check (here or on another node
    /// sharing the database) takes it out of the index.
    pub fn apply(&self, records: Vec<ProxyRecord>) {
        let mut hidden = lock(&self.inner.hidden);
        let records: Vec<ProxyRecord> = records
            .into_iter()
            .filter(|r| {
                if r.failed_since_checked() {
                    self.inner.index.remove(r.id);
                    return false;
                }
                true
            })
            .filter(|r| match hidden.get(&r.id) {
                Some(&at) if r.last_checked.is_none_or(|t| t < at) => false,
                Some(_) => {
                    hidden.remove(&r.id);
                    true
                }
                None => true,
            })
            .collect();
        drop(hidden);
        self.inner.index.apply(records);
    }

    /// Serves again proxies a failed check hid whose verdict was dropped
    /// (every judge was lost: the failures say nothing about the
    /// proxies), as their stored records say. Without this they stayed
    /// out of `/proxy` and `/export` while `proxywarden export`, reading
    /// the same records, listed them.
    pub async fn restore(&self, ids: Vec<i64>) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        {
            let mut hidden = lock(&self.inner.hidden);
            for id in &ids {
                hidden.remove(id);
            }
        }
        let records = self.inner.store.proxies_by_ids(ids).await?;
        self.apply(
            records
                .into_iter()
                .filter(|r| r.status == crate::proxy::Status::Alive)
                .collect(),
        );
        Ok(())
    }

    /// Makes the index hold what `records` (every alive proxy in the
    /// store) say, for a pool that follows the store rather than a check
    /// loop: proxies not among them leave, the rest are (re)indexed as
    /// [`Feedback::apply`] does, so one hidden by a failure in use since its
    /// last check stays out until a newer check finds it alive.
    pub fn reload(&self, records: Vec<ProxyRecord>) {
        let keep: HashSet<i64> = records.iter().map(|r| r.id).collect();
        for id in self.inner.index.ids() {
            if !keep.contains(&id) {
                self.inner.index.remove(id);
            }
        }
        self.apply(records);
    }

    /// Takes proxy `id` out of the index because of a verdict at `at`
    /// (unix ms) that its stored record does not know yet. True if it was
    /// being served.
    fn hide(&self, id: i64, at: i64) -> bool {
        let mut hidden = lock(&self.inner.hidden);
        if hidden.len() >= MAX_HIDDEN {
            // Verdicts this old have been committed long since.
            let horizon = at - HIDDEN_FOR_MS;
            hidden.retain(|_, t| *t > horizon);
        }
        if hidden.len() < MAX_HIDDEN {
            hidden.insert(id, at);
        }
        drop(hidden);
        self.inner.index.remove(id)
    }

    /// True when `site` bans or rests proxy `id` now.
    pub fn is_banned(&self, id: i64, site: &str) -> bool {
        self.banned_until(id, site).is_some()
    }

    /// A site rate-limited a proxy (429, or 503 without a ban page): most
    /// sites limit each address, so the gap kept between two requests
    /// through one proxy to it widens (see [`Feedback::site_gap`]).
    /// `sent` is when the limited request was sent: one sent before the
    /// gap last widened says nothing of the wider gap.
    pub fn rate_limited(&self, site: &str, sent: Instant) {
        let mut gaps = lock(&self.inner.gaps);
        if let Some(g) = gaps.get_mut(site) {
            if sent > g.raised && g.raised.elapsed() >= GAP_RAISE_EVERY {
                g.ms = (g.now().max(GAP_FIRST_MS / GAP_RAISE) * GAP_RAISE).min(GAP_MAX_MS);
                g.raised = Instant::now();
            }
            return;
        }
        if gaps.len() >= MAX_GAP_SITES {
            gaps.retain(|_, g| g.now() >= 1.0);
            if gaps.len() >= MAX_GAP_SITES {
                return;
            }
        }
        gaps.insert(
            site.to_owned(),
            SiteGap {
                ms: GAP_FIRST_MS,
                raised: Instant::now(),
            },
        );
        self.inner.any_gap.store(true, Ordering::Relaxed);
    }

    /// The gap to keep between two requests through one proxy to `site`:
    /// zero until the site rate-limits, then widened by each limit and
    /// halved by each minute without one. The pool rests a (proxy, site)
    /// pair for the gap after every request, so that a site limiting each
    /// address is sent no more than it takes by any of them, by the
    /// gateway, crawl jobs and the pool together.
    pub fn site_gap(&self, site: &str) -> Duration {
        // Asked at every pick: no lock while no site ever rate-limited.
        if !self.inner.any_gap.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let gaps = lock(&self.inner.gaps);
        match gaps.get(site) {
            Some(g) => Duration::from_secs_f64(g.now() / 1000.0),
            None => Duration::ZERO,
        }
    }

    /// Until when `site` bans or rests proxy `id`, if it does now.
    pub fn banned_until(&self, id: i64, site: &str) -> Option<Instant> {
        // Asked for every candidate of every pick: no lock while no site
        // taught anything, no allocation ever.
        if self.inner.site_pairs.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let book = lock(&self.inner.sites);
        book.site(site)?.until(id, Instant::now())
    }

    /// Rests the pair (`id`, `site`) for `rest`: after the site
    /// rate-limited the proxy (429 or 503, with its Retry-After), or for the
    /// site's gap after a pick. Shorter than a block's ban, since the same
    /// proxy is welcome again once the limit passes; kept in memory only.
    pub fn rest(&self, id: i64, site: &str, rest: Duration) {
        let rest = rest.min(BAN_FOR);
        self.note(id, site, Taught::blocked(Block::RateLimited, rest));
    }

    /// A use of proxy `id` at `site` worked in `latency`: counted as
    /// [`Feedback::worked`] does, and the pair is kept as one the site takes
    /// (see [`Feedback::pick`]).
    pub fn worked_at(&self, id: i64, site: &str, latency: Duration) {
        self.note(id, site, Taught::worked(Some(latency)));
        lock(&self.inner.spread).note(site, id, Instant::now());
        self.worked(id);
    }

    /// How each site's requests spread over proxies in the last
    /// [`SPREAD_WINDOW`](super::SPREAD_WINDOW): the uses that worked there,
    /// how many distinct proxies carried them and the largest share one
    /// took; the busiest sites first.
    pub fn rotation(&self) -> Vec<SiteSpread> {
        lock(&self.inner.spread).view(Instant::now())
    }

    /// `site` refused proxy `id` in a request sent at `sent`: a ban page
    /// bans the pair for [`BAN_FOR`], a bare refusal rests it for
    /// [`REFUSAL_REST`], a rate limit rests it for its `Retry-After`
    /// (`wait`, else [`RATE_LIMIT_REST`]) and widens the site's gap between
    /// requests through one proxy.
    pub fn blocked(
        &self,
        id: i64,
        site: &str,
        block: Block,
        wait: Option<Duration>,
        sent: Instant,
    ) {
        match block {
            Block::Banned => self.note(id, site, Taught::blocked(block, BAN_FOR)),
            Block::Refused => self.note(id, site, Taught::blocked(block, REFUSAL_REST)),
            Block::RateLimited => {
                let rest = wait.unwrap_or(RATE_LIMIT_REST).max(Duration::from_secs(1));
                self.rest(id, site, rest);
                self.rate_limited(site, sent);
            }
        }
    }

    fn note(&self, id: i64, site: &str, taught: Taught) {
        let mut book = lock(&self.inner.sites);
        book.note(id, site, taught, Instant::now(), crate::store::now_ms());
        self.inner.site_pairs.store(book.len(), Ordering::Relaxed);
        drop(book);
        if matches!(
            taught.verdict,
            UseVerdict::Blocked(Block::Banned | Block::Refused)
        ) {
            self.schedule_flush();
        }
    }

    /// Brings back what sites taught in the last week (bans still running,
    /// proxies that worked there), as the store kept it. How many pairs.
    pub async fn load_sites(&self) -> Result<usize, StoreError> {
        let now_ms = crate::store::now_ms();
        let records = self
            .inner
            .store
            .load_site_records(now_ms - KEEP_FOR_MS, MAX_PAIRS)
            .await?;
        let mut book = lock(&self.inner.sites);
        book.restore(records, Instant::now(), now_ms);
        self.inner.site_pairs.store(book.len(), Ordering::Relaxed);
        Ok(book.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Candidate, Hints, Outcome, Reason, SourceScheme};
    use crate::proxy::Scheme;
    use crate::store::{ProxyFilter, SourceRun, now_ms};

    const POLICY: RecheckPolicy = RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::from_secs(150),
        dead: Duration::from_secs(900),
        dead_max: Duration::from_secs(86_400),
    };

    /// A store in `dir` holding proxies on ports 1..=n; their ids.
    async fn store_with(dir: &std::path::Path, n: u16) -> (Store, Vec<i64>) {
        let store = Store::open(&dir.join("f.db")).unwrap();
        let run = SourceRun {
            name: "s".into(),
            url: "u".into(),
            format: "text".into(),
            started_at: 1,
            http_status: None,
            duration_ms: 0,
            error: None,
            private: 0,
        };
        let candidates: Vec<Candidate> = (1..=n)
            .map(|port| {
                Candidate::new(
                    "10.1.1.1".parse().unwrap(),
                    port,
                    None,
                    None,
                    SourceScheme::Fixed(Scheme::Http),
                    Hints::default(),
                )
            })
            .collect();
        store.record_source_run(run, candidates).await.unwrap();
        let ids = store
            .list_proxies(ProxyFilter::default())
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        (store, ids)
    }

    fn checked(id: i64, at: i64, failure: Option<Reason>) -> CheckRecord {
        CheckRecord {
            id,
            checked_at: at,
            outcome: Outcome {
                failure,
                latency: failure.is_none().then_some(Duration::from_millis(5)),
                ..Outcome::dead(Reason::Timeout)
            },
        }
    }

    #[tokio::test]
    async fn committed_checks_update_the_index() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 2).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        let now = now_ms();
        feedback
            .commit_checks(
                vec![checked(ids[0], now, None), checked(ids[1], now, None)],
                POLICY,
            )
            .await
            .unwrap();
        assert_eq!(feedback.index().len(), 2);
        feedback
            .commit_checks(vec![checked(ids[1], now, Some(Reason::Refused))], POLICY)
            .await
            .unwrap();
        assert!(feedback.index().get(ids[0]).is_some());
        assert!(
            feedback.index().get(ids[1]).is_none(),
            "dead leaves the index"
        );
    }

    #[tokio::test]
    async fn a_failure_in_use_hides_the_proxy_and_asks_for_a_recheck() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 1).await;
        let feedback = Feedback::new(HealthIndex::new(), store.clone());
        let now = now_ms();
        feedback
            .commit_checks(vec![checked(ids[0], now, None)], POLICY)
            .await
            .unwrap();
        assert_eq!(store.count_due(now, false).await.unwrap(), 0);

        let wanted = feedback.recheck_wanted();
        let reported = feedback
            .report(ids[0], UseVerdict::failed(Reason::Reset), None)
            .await
            .unwrap();
        assert_eq!(
            reported,
            Reported {
                found: true,
                hidden: true,
                recheck: true
            }
        );
        assert!(feedback.index().is_empty());
        assert_eq!(store.count_due(now_ms(), false).await.unwrap(), 1);
        tokio::time::timeout(Duration::from_secs(5), wanted)
            .await
            .expect("the check loop is woken");

        let missing = feedback
            .report(ids[0] + 1000, UseVerdict::ProxyFailed(None), None)
            .await
            .unwrap();
        assert!(!missing.found);
    }

    /// A start on an empty database sweeps nothing, so it holds back no
    /// sweep: a burst of failures among the proxies checked since, however
    /// soon, puts every other served one up for a re-check.
    #[tokio::test]
    async fn a_burst_soon_after_a_start_on_an_empty_index_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 8).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        let start = now_ms();
        feedback.reverify_all(start);
        let alive = ids.iter().map(|id| checked(*id, start, None)).collect();
        feedback.commit_checks(alive, POLICY).await.unwrap();
        assert!(feedback.take_rechecks().is_empty());

        let refused = Outcome::dead(Reason::Refused);
        for id in &ids[..BURST_MIN] {
            feedback.checked(*id, &refused, start + 1_000);
        }
        let mut queued = feedback.take_rechecks();
        queued.sort_unstable();
        assert_eq!(queued, ids[BURST_MIN..], "the survivors are re-checked");
    }

    /// A start-up re-check that passed everything has done its work: a
    /// burst of failures soon after it (a mass death in the first seconds
    /// of `serve`) sweeps at once, not a quarter of a freshness window
    /// later. A burst while its re-checks still run does not.
    #[tokio::test]
    async fn a_burst_after_the_start_up_re_check_passed_everything_is_swept() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 12).await;
        let before = now_ms() - 60_000;
        let alive = ids.iter().map(|id| checked(*id, before, None)).collect();
        store.record_checks(alive, POLICY).await.unwrap();
        let index = crate::health::load_index(&store).await.unwrap();
        let feedback = Feedback::new(index, store);
        feedback.set_fresh_within(Duration::from_secs(118));
        let start = now_ms();
        feedback.reverify_all(start);
        feedback.take_rechecks();
        let refused = Outcome::dead(Reason::Refused);
        let pass = |ids: &[i64], at: i64| ids.iter().map(|id| checked(*id, at, None)).collect();

        // A third re-checked, a third failed, a third still waiting: the
        // start-up re-check still runs, so no second sweep.
        feedback
            .commit_checks(pass(&ids[..4], start + 10), POLICY)
            .await
            .unwrap();
        for id in &ids[4..8] {
            feedback.checked(*id, &refused, start + 500);
        }
        assert!(feedback.take_rechecks().is_empty(), "the sweep still runs");

        // The rest passed it too; then a burst among what is served.
        feedback
            .commit_checks(pass(&ids[8..], start + 600), POLICY)
            .await
            .unwrap();
        for id in &ids[..4] {
            feedback.checked(*id, &refused, start + 1_000);
        }
        let mut queued = feedback.take_rechecks();
        queued.sort_unstable();
        assert_eq!(queued, ids[8..], "the survivors are re-checked");

        // The next burst waits the gap: a quarter of the window.
        feedback
            .commit_checks(pass(&ids[8..], start + 1_100), POLICY)
            .await
            .unwrap();
        for id in &ids[8..] {
            feedback.checked(*id, &refused, start + 2_000);
        }
        assert!(
            feedback.take_rechecks().is_empty(),
            "swept a second after the last"
        );
    }

    /// A failure whose verdict is dropped (the judges were lost) does not
    /// keep the proxy hidden.
    #[tokio::test]
    async fn a_failure_dropped_with_the_judges_serves_the_proxy_again() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 2).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        let now = now_ms();
        let alive = ids.iter().map(|id| checked(*id, now, None)).collect();
        feedback.commit_checks(alive, POLICY).await.unwrap();
        feedback.checked(ids[0], &Outcome::dead(Reason::Timeout), now + 10);
        assert!(feedback.index().get(ids[0]).is_none(), "hidden at once");
        feedback.restore(vec![ids[0]]).await.unwrap();
        assert!(feedback.index().get(ids[0]).is_some(), "served again");
    }

    /// `reports_ok` of proxy `id`.
    async fn reports_ok(store: &Store, id: i64) -> i64 {
        store
            .sqlite()
            .read(move |c| {
                Ok(
                    c.query_row("SELECT reports_ok FROM proxies WHERE id = ?1", [id], |r| {
                        r.get(0)
                    })?,
                )
            })
            .await
            .unwrap()
    }

    #[test]
    fn worked_uses_are_written_together_not_one_write_each() {
        // On tokio's paused clock: the flush's wait passes as soon as
        // nothing else is to be done.
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = rt.block_on(store_with(dir.path(), 2));
        let feedback = Feedback::new(HealthIndex::new(), store.clone());
        // Outside the runtime no flush is scheduled: what the store holds
        // is only what a flush wrote.
        for _ in 0..5 {
            feedback.worked(ids[0]);
        }
        feedback.worked(ids[1]);
        rt.block_on(async {
            assert_eq!(reports_ok(&store, ids[0]).await, 0, "no write per use");
            feedback.flush().await.unwrap();
            assert_eq!(reports_ok(&store, ids[0]).await, 5);
            assert_eq!(reports_ok(&store, ids[1]).await, 1);
            feedback.flush().await.unwrap();
            assert_eq!(reports_ok(&store, ids[0]).await, 5, "counted once");

            // Inside the runtime a use schedules the flush itself, for
            // WORKED_FLUSH_AFTER later.
            let used = tokio::time::Instant::now();
            feedback.worked(ids[1]);
            let deadline = Instant::now() + Duration::from_secs(20);
            while reports_ok(&store, ids[1]).await != 2 {
                assert!(Instant::now() < deadline, "the batch was never written");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(used.elapsed() >= WORKED_FLUSH_AFTER, "{:?}", used.elapsed());
        });
    }

    #[tokio::test]
    async fn a_block_bans_only_the_pair() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 1).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        feedback
            .commit_checks(vec![checked(ids[0], now_ms(), None)], POLICY)
            .await
            .unwrap();
        feedback
            .report(
                ids[0],
                UseVerdict::Blocked(Block::Banned),
                Some("shop.example"),
            )
            .await
            .unwrap();
        assert!(feedback.is_banned(ids[0], "shop.example"));
        assert!(!feedback.is_banned(ids[0], "news.example"));
        feedback.rest(ids[0], "news.example", Duration::from_millis(50));
        feedback.rest(ids[0], "shop.example", Duration::from_millis(50));
        assert!(feedback.is_banned(ids[0], "news.example"));
        std::thread::sleep(Duration::from_millis(60));
        assert!(!feedback.is_banned(ids[0], "news.example"), "a rest ends");
        assert!(feedback.is_banned(ids[0], "shop.example"), "the ban stays");
        assert_eq!(feedback.index().len(), 1, "still served for other sites");
    }

    #[tokio::test]
    async fn a_sites_rate_limits_widen_the_gap_once_a_second_and_it_decays() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = store_with(dir.path(), 1).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        assert_eq!(feedback.site_gap("shop.example"), Duration::ZERO);
        feedback.rate_limited("shop.example", Instant::now());
        let first = feedback.site_gap("shop.example");
        assert!(first <= Duration::from_millis(100) && first > Duration::from_millis(99));
        // A burst of 429s within a second widens it once.
        feedback.rate_limited("shop.example", Instant::now());
        assert!(feedback.site_gap("shop.example") <= first);
        assert_eq!(feedback.site_gap("news.example"), Duration::ZERO);
        // A second later it widens again, by half, but only for a request
        // sent since it last widened.
        let raised = {
            let mut gaps = lock(&feedback.inner.gaps);
            let g = gaps.get_mut("shop.example").unwrap();
            g.raised -= GAP_RAISE_EVERY;
            g.raised
        };
        feedback.rate_limited("shop.example", raised - Duration::from_millis(1));
        assert!(feedback.site_gap("shop.example") <= first, "sent before");
        feedback.rate_limited("shop.example", Instant::now());
        let second = feedback.site_gap("shop.example").as_secs_f64() * 1000.0;
        assert!((second - 150.0).abs() < 2.0, "{second}");
        // A minute without limits halves it.
        let g = SiteGap {
            ms: 400.0,
            raised: Instant::now() - GAP_HALF_LIFE,
        };
        assert!((g.now() - 200.0).abs() < 1.0, "{}", g.now());
    }

    #[tokio::test]
    async fn served_proxies_with_old_checks_are_queued_for_recheck() {
        let dir = tempfile::tempdir().unwrap();
        let (store, ids) = store_with(dir.path(), 1).await;
        let feedback = Feedback::new(HealthIndex::new(), store);
        let now = now_ms();
        feedback
            .commit_checks(vec![checked(ids[0], now - 120_000, None)], POLICY)
            .await
            .unwrap();
        let old = feedback.index().get(ids[0]).unwrap();
        feedback.served(&old, now);
        assert_eq!(feedback.take_rechecks(), vec![ids[0]]);
        assert!(feedback.take_rechecks().is_empty(), "drained");

        feedback
            .commit_checks(vec![checked(ids[0], now, None)], POLICY)
            .await
            .unwrap();
        let fresh = feedback.index().get(ids[0]).unwrap();
        feedback.served(&fresh, now);
        assert!(feedback.take_rechecks().is_empty());
    }
}
