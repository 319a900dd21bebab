//! Choosing a proxy for a request: the strategy over what matches and is
//! free, sticky sessions, per-site rests, the line for a free slot, and why
//! none could be had.

use super::*;

impl Pool {
    /// A proxy for `want`, waiting as `policy` allows; `None` only under
    /// [`NoProxy::Direct`].
    pub(super) async fn acquire_for(
        &self,
        want: &Want<'_>,
        tried: &HashSet<i64>,
        attempts: u32,
        policy: NoProxy,
    ) -> Result<Option<Lease>, FetchError> {
        let inner = &self.inner;
        if !*inner.shared.loaded.borrow() {
            let mut loaded = inner.shared.loaded.subscribe();
            let _ = tokio::time::timeout(FIRST_LOAD_WAIT, loaded.wait_for(|l| *l)).await;
        }
        let started = Instant::now();
        let give_up = |waited| FetchError::NoProxy {
            waited,
            attempts,
            hint: Some(match lock(&inner.shared.load_error).clone() {
                Some(e) => e,
                None => self.shortage(want, tried).to_string(),
            }),
        };
        // Our place in the line for slots, once we wait for one: kept
        // across looks so that a request keeps its turn.
        let mut turn: Option<Pin<Box<tokio::sync::futures::Notified<'_>>>> = None;
        let mut queued: Option<SlotWaiter<'_>> = None;
        // Requests already waiting for a slot go first: a new one joins the
        // line, without a look, unless more slots are free for it than
        // requests wait.
        let waits = matches!(policy, NoProxy::Wait(_) | NoProxy::Queue(_));
        let waiters = inner.shared.slot_waiters.load(Ordering::Relaxed);
        let mut skip =
            waits && waiters > 0 && self.shortage(want, tried).free_slots <= waiters as usize;
        if skip {
            queued = Some(SlotWaiter::new(&inner.shared.slot_waiters));
        }
        // Slots freed as of our last look, and whether a turn came since
        // for a slot freed after that look.
        let (mut looked_at, mut handed) = (0u64, false);
        if !skip {
            // A first look before registering for events: most requests
            // find a proxy at once and never touch the shared `Notify`
            // (a lock per registration, on every request).
            let (lease, _) = self.try_pick(want.query, want.session, want.site, want.https, tried);
            if let Some(lease) = lease {
                return Ok(Some(lease));
            }
        }
        loop {
            // Registered before looking, so an event meanwhile wakes us.
            let changed = inner.shared.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if turn.is_none() && queued.is_some() {
                let mut t = Box::pin(inner.shared.slot_freed.notified());
                t.as_mut().enable();
                turn = Some(t);
            }
            let mut next_free = None;
            if !std::mem::take(&mut skip) {
                looked_at = inner.shared.releases.load(Ordering::Relaxed);
                let (lease, next) =
                    self.try_pick(want.query, want.session, want.site, want.https, tried);
                if let Some(lease) = lease {
                    // A turn given to us meanwhile goes on to the next in
                    // line as the registration drops.
                    return Ok(Some(lease));
                }
                next_free = next;
                if std::mem::take(&mut handed) {
                    // The slot we were woken for is not for us (other
                    // filters, or taken): the next in line may use it.
                    inner.shared.slot_freed.notify_one();
                }
            }
            let waited = started.elapsed();
            let bound = match policy {
                NoProxy::Direct => return Ok(None),
                NoProxy::Fail => return Err(give_up(waited)),
                NoProxy::Wait(bound) | NoProxy::Queue(bound) => bound,
            };
            if waited >= bound {
                return Err(give_up(waited));
            }
            let mut rest_ends = None;
            if queued.is_none() {
                let shortage = self.shortage(want, tried);
                // A matching proxy at its cap frees a slot soon: wait in
                // line for it.
                if shortage.busy > 0 {
                    queued = Some(SlotWaiter::new(&inner.shared.slot_waiters));
                    continue;
                }
                // A proxy resting after a failure, or resting for this site
                // (a rate limit's Retry-After), may come back in time.
                let deadline = started + bound;
                rest_ends = shortage.rest_ends.filter(|t| *t <= deadline);
                if let NoProxy::Queue(_) = policy
                    && next_free.is_none_or(|at| at > deadline)
                    && rest_ends.is_none()
                {
                    // Nothing will come free in time: say so now.
                    return Err(give_up(waited));
                }
            }
            let mut nap = (bound - waited).min(WAIT_TICK);
            for at in [next_free, rest_ends].into_iter().flatten() {
                nap = nap.min(at.saturating_duration_since(Instant::now()));
            }
            let sleep = tokio::time::sleep(nap);
            tokio::pin!(sleep);
            tokio::select! {
                _ = &mut sleep => {}
                _ = changed => {}
                _ = async {
                    match turn.as_mut() {
                        Some(t) => t.as_mut().await,
                        None => std::future::pending().await,
                    }
                } => {
                    turn = None;
                    // A slot freed before our last look was no use then
                    // either: the turn ends here rather than going round.
                    handed = inner.shared.releases.load(Ordering::Relaxed) > looked_at;
                }
            }
        }
    }

    /// Why no proxy can take a request for `want` now: how many match,
    /// and how many of those are busy, resting, banned for the site or
    /// tried already by this request.
    pub(super) fn shortage(&self, want: &Want<'_>, tried: &HashSet<i64>) -> Shortage {
        let inner = &self.inner;
        let now = Instant::now();
        let mut s = Shortage {
            site: want.site.to_owned(),
            ..Shortage::default()
        };
        let matching = inner
            .shared
            .feedback
            .select(want.query, None, crate::store::now_ms());
        let st = lock(&inner.shared.state);
        for e in matching {
            if !fetch::can_carry(&e.proxy, e.https, want.https) {
                s.no_tunnel += 1;
                continue;
            }
            s.matching += 1;
            let usage = st.usage.get(&e.id);
            if tried.contains(&e.id) {
                s.tried += 1;
            } else if usage.is_some_and(|u| u.cooldown_until.is_some_and(|t| t > now)) {
                s.resting += 1;
            } else if let Some(until) = inner.shared.feedback.banned_until(e.id, want.site) {
                s.banned += 1;
                let until = Instant::from_std(until);
                s.rest_ends = Some(s.rest_ends.map_or(until, |t| t.min(until)));
            } else {
                let in_flight = usage.map_or(0, |u| u.in_flight);
                match inner.shared.max_in_flight.checked_sub(in_flight) {
                    Some(0) | None => s.busy += 1,
                    Some(free) => s.free_slots += free as usize,
                }
            }
        }
        s.max_in_flight = inner.shared.max_in_flight;
        s
    }

    /// Picks and reserves a proxy; otherwise says when the first cooldown
    /// ends.
    pub(super) fn try_pick(
        &self,
        query: &ProxyQuery,
        session: Option<&str>,
        site: &str,
        https: bool,
        tried: &HashSet<i64>,
    ) -> (Option<Lease>, Option<Instant>) {
        let inner = &self.inner;
        let opts = &inner.opts;
        let index = inner.shared.feedback.index();
        let now = Instant::now();
        let now_ms = crate::store::now_ms();
        let mut st = lock(&inner.shared.state);
        // What the site bans or rests is left out by the feedback path's
        // pick (for a sticky session, below): a pick's filter must not
        // call back into it.
        let usable = |st: &State, e: &Entry| {
            !tried.contains(&e.id)
                && fetch::can_carry(&e.proxy, e.https, https)
                && st.usage.get(&e.id).is_none_or(|u| {
                    u.in_flight < inner.shared.max_in_flight
                        && u.cooldown_until.is_none_or(|t| t <= now)
                })
        };
        let mut chosen = None;
        if let Some(key) = session
            && let Some(s) = st.sessions.get(key)
        {
            let fresh = s.uses < opts.session_uses && now - s.since < opts.session_age;
            let entry = index.get(s.id).filter(|e| {
                fresh
                    && query.matches_entry(e, now_ms)
                    && usable(&st, e)
                    && !inner.shared.feedback.is_banned(e.id, site)
            });
            match entry {
                Some(e) => chosen = Some(e),
                None => st.end_session(key),
            }
        }
        if chosen.is_none() {
            let strategy = Bound {
                kind: opts.strategy,
                usage: &st.usage,
                last: st.last_rr,
            };
            // Through the feedback path, so the pool never takes a proxy
            // past the freshness window or one a burst made suspect.
            let recent = st.recent.get(site);
            chosen = inner
                .shared
                .feedback
                .pick(query, Some(site), now_ms, &strategy, &|e| {
                    !usable(&st, e) || recent.is_some_and(|r| r.contains(&e.id))
                });
            if chosen.is_none() && recent.is_some() {
                chosen = inner
                    .shared
                    .feedback
                    .pick(query, Some(site), now_ms, &strategy, &|e| !usable(&st, e));
            }
            if let Some(e) = &chosen {
                st.last_rr = e.id;
            }
        }
        let Some(entry) = chosen else {
            let next = st
                .usage
                .values()
                .filter_map(|u| u.cooldown_until)
                .filter(|t| *t > now)
                .min();
            return (None, next);
        };
        let u = st.usage.entry(entry.id).or_default();
        u.in_flight += 1;
        u.uses += 1;
        if st.recent.len() >= MAX_RECENT_SITES && !st.recent.contains_key(site) {
            st.recent.clear();
        }
        let recent = st.recent.entry(site.to_owned()).or_default();
        if recent.len() >= RECENT_PER_SITE {
            recent.pop_front();
        }
        recent.push_back(entry.id);
        if let Some(key) = session {
            if !st.sessions.contains_key(key) {
                let evicted = st.make_room(inner.shared.max_sessions, now, opts.session_age);
                if evicted > 0 {
                    inner
                        .shared
                        .sessions_evicted
                        .fetch_add(evicted, Ordering::Relaxed);
                }
                let seq = st.next_session;
                st.next_session += 1;
                st.session_order.insert(seq, key.to_owned());
                st.sessions.insert(
                    key.to_owned(),
                    Session {
                        id: entry.id,
                        uses: 0,
                        since: now,
                        seq,
                    },
                );
            }
            if let Some(s) = st.sessions.get_mut(key) {
                s.uses += 1;
            }
        }
        drop(st);
        inner.shared.feedback.served(&entry, now_ms);
        // A site that rate-limits each address gets no more through this
        // proxy than it takes.
        let gap = inner.shared.feedback.site_gap(site);
        if gap >= MIN_SITE_GAP {
            inner.shared.feedback.rest(entry.id, site, gap);
        }
        (
            Some(Lease {
                shared: inner.shared.clone(),
                entry,
                site: site.to_owned(),
            }),
            None,
        )
    }
}

impl State {
    /// Forgets session `key`.
    fn end_session(&mut self, key: &str) {
        if let Some(s) = self.sessions.remove(key) {
            self.session_order.remove(&s.seq);
        }
    }

    /// Makes room in the sessions table for one more: drops the sessions
    /// older than `age` at its front (they would not stick any more), then,
    /// while it is still full, the oldest live ones, which it counts.
    /// Oldest first by creation, so each step costs a lookup, not a scan
    /// of the table.
    fn make_room(&mut self, max: usize, now: Instant, age: Duration) -> u64 {
        let mut evicted = 0;
        while let Some(entry) = self.session_order.first_entry() {
            let expired = self
                .sessions
                .get(entry.get())
                .is_none_or(|s| now - s.since >= age);
            if !expired && self.sessions.len() < max {
                break;
            }
            let key = entry.remove();
            self.sessions.remove(&key);
            evicted += u64::from(!expired);
        }
        evicted
    }
}

/// Why no proxy could take a request: counts over the proxies that match
/// its filters (and are fresh), shown in the `no_proxy` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Shortage {
    /// The site the request was for.
    pub site: String,
    /// Proxies matching the filters that can carry the request.
    pub matching: usize,
    /// Matching HTTP proxies left out because the target is https and
    /// they cannot tunnel.
    pub no_tunnel: usize,
    /// Of those matching: carrying their most requests at once.
    pub busy: usize,
    /// …resting after a failure in use.
    pub resting: usize,
    /// …banned or resting for this site.
    pub banned: usize,
    /// …already tried by this request.
    pub tried: usize,
    /// Requests the others could take now, together.
    pub free_slots: usize,
    /// When the first ban or rest for the site ends.
    pub rest_ends: Option<Instant>,
    /// Requests one proxy carries at once.
    pub max_in_flight: u32,
}
impl fmt::Display for Shortage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.matching == 0 {
            f.write_str("no servable proxy matches the filters")?;
            if self.no_tunnel > 0 {
                write!(f, " ({} match but cannot tunnel https)", self.no_tunnel)?;
            }
            return Ok(());
        }
        write!(f, "{} proxies match the filters", self.matching)?;
        let mut parts = Vec::new();
        if self.busy > 0 {
            parts.push(format!(
                "{} at their cap of {} requests at once",
                self.busy, self.max_in_flight
            ));
        }
        if self.resting > 0 {
            parts.push(format!("{} resting after failures", self.resting));
        }
        if self.banned > 0 {
            parts.push(format!(
                "{} banned or resting for {}",
                self.banned, self.site
            ));
        }
        if self.tried > 0 {
            parts.push(format!("{} tried already for this request", self.tried));
        }
        if !parts.is_empty() {
            write!(f, ": {}", parts.join(", "))?;
        }
        Ok(())
    }
}

/// A request counted among those waiting for a slot while it lives.
pub(super) struct SlotWaiter<'a>(&'a AtomicU64);

impl<'a> SlotWaiter<'a> {
    pub(super) fn new(count: &'a AtomicU64) -> SlotWaiter<'a> {
        count.fetch_add(1, Ordering::Relaxed);
        SlotWaiter(count)
    }
}

impl Drop for SlotWaiter<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(st: &mut State, key: &str, since: Instant) {
        let seq = st.next_session;
        st.next_session += 1;
        st.session_order.insert(seq, key.to_owned());
        st.sessions.insert(
            key.to_owned(),
            Session {
                id: 1,
                uses: 1,
                since,
                seq,
            },
        );
    }

    #[test]
    fn a_full_table_drops_expired_sessions_quietly_and_counts_live_ones() {
        let age = Duration::from_secs(600);
        let now = Instant::now() + Duration::from_secs(3_600);
        let mut st = State::default();
        open(&mut st, "old", now - Duration::from_secs(900));
        open(&mut st, "a", now - Duration::from_secs(60));
        open(&mut st, "b", now - Duration::from_secs(30));
        // Room below the cap: only the expired one goes, uncounted.
        assert_eq!(st.make_room(3, now, age), 0);
        assert_eq!(st.sessions.len(), 2);
        assert!(!st.sessions.contains_key("old"));
        // At the cap: the oldest live one goes, counted.
        assert_eq!(st.make_room(2, now, age), 1);
        assert!(st.sessions.contains_key("b") && !st.sessions.contains_key("a"));
        // Ended sessions leave the order too, so it never outgrows the table.
        st.end_session("b");
        assert!(st.sessions.is_empty() && st.session_order.is_empty());
    }
}
