//! Choosing a proxy: the pick for a client, with what sites taught.

use super::*;

impl Feedback {
    /// One proxy to serve: matching `q` at `now`, checked within the
    /// freshness window, not refused by `exclude`, chosen by `strategy`
    /// among all of those. For a request to `site`, proxies it bans or
    /// rests are left out, and what it taught of the others is the
    /// strategy's to weigh ([`Matches::site_rank`](super::Matches::site_rank)):
    /// the proxies that worked there never narrow the set. During a burst,
    /// proxies re-checked since it began are preferred. `exclude` must not
    /// call back into this `Feedback`.
    pub(crate) fn pick(
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
            // Among the proxies proven since the suspicion began alone (the
            // index keeps them apart): none of the suspect ones is looked at.
            let verified =
                index.pick_proven_ranked(q, now, strategy, &|e| !(usable(e) && verified(e)), &rank);
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

    /// How many proxies [`Feedback::select`] gives for `q` at `now` with
    /// no site, counted without copying them.
    pub fn count(&self, q: &ProxyQuery, now: i64) -> usize {
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        self.inner.index.count(q, now, |e| {
            fresh == 0 || e.proven_at().is_some_and(|t| t >= now - fresh)
        })
    }

    /// Calls `f` with each proxy [`Feedback::select`] gives for `q` at
    /// `now` with no site, in no particular order, under the index's read
    /// lock (so `f` should be quick): what they hold, without copying or
    /// sorting them. How many there were.
    pub fn each(&self, q: &ProxyQuery, now: i64, mut f: impl FnMut(&Entry)) -> usize {
        let fresh = self.inner.fresh_within.load(Ordering::Relaxed);
        self.inner.index.count(q, now, |e| {
            let keep = fresh == 0 || e.proven_at().is_some_and(|t| t >= now - fresh);
            if keep {
                f(e);
            }
            keep
        })
    }

    /// Leaves out of `items` (proxies, by `id`) those `site` bans or rests
    /// now, and moves those that worked there to the front, fastest there
    /// first; the others keep their order.
    pub(crate) fn for_site<T>(&self, site: &str, items: &mut Vec<T>, id: impl Fn(&T) -> i64) {
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
    pub(crate) fn served(&self, entry: &Entry, now: i64) {
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
}
