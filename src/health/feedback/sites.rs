//! The site book: bans, rests, rate-limit gaps and what worked where.

use super::*;

/// What a site's rate limits taught: the gap between two requests through
/// one proxy that keeps under its limit per address.
#[derive(Clone, Copy, Debug)]
pub(super) struct SiteGap {
    /// The gap when last raised, in ms.
    pub(super) ms: f64,
    /// When it was last raised.
    pub(super) raised: Instant,
}

/// The first gap a site's rate limit sets.
pub(super) const GAP_FIRST_MS: f64 = 100.0;

/// Each rate limit widens the gap by this factor (at most once per
/// [`GAP_RAISE_EVERY`], so one burst of 429s counts once)...
pub(super) const GAP_RAISE: f64 = 1.5;

/// ...up to this.
pub(super) const GAP_MAX_MS: f64 = 10_000.0;

/// See [`GAP_RAISE`].
pub(super) const GAP_RAISE_EVERY: Duration = Duration::from_secs(1);

/// Without rate limits the gap halves every this long, so that a limit
/// that was lifted stops slowing requests.
pub(super) const GAP_HALF_LIFE: Duration = Duration::from_secs(60);

/// Sites whose gaps are kept.
pub(super) const MAX_GAP_SITES: usize = 4096;

impl SiteGap {
    /// The gap now, decayed since its last raise.
    pub(super) fn now(&self) -> f64 {
        let halves = self.raised.elapsed().as_secs_f64() / GAP_HALF_LIFE.as_secs_f64();
        self.ms * 0.5f64.powf(halves)
    }
}

impl Feedback {
    /// True when `site` bans or rests proxy `id` now.
    pub fn is_banned(&self, id: i64, site: &str) -> bool {
        self.banned_until(id, site).is_some()
    }

    /// A site rate-limited a proxy (429, or 503 without a ban page): most
    /// sites limit each address, so the gap kept between two requests
    /// through one proxy to it widens (see [`Feedback::site_gap`]).
    /// `sent` is when the limited request was sent: one sent before the
    /// gap last widened says nothing of the wider gap.
    pub(super) fn rate_limited(&self, site: &str, sent: Instant) {
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
    pub(crate) fn site_gap(&self, site: &str) -> Duration {
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
    pub(crate) fn banned_until(&self, id: i64, site: &str) -> Option<Instant> {
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
    pub(crate) fn rest(&self, id: i64, site: &str, rest: Duration) {
        let rest = rest.min(BAN_FOR);
        self.note(id, site, Taught::blocked(Block::RateLimited, rest));
    }

    /// A use of proxy `id` at `site` worked in `latency`: counted as
    /// `Feedback::worked` does, and the pair is kept as one the site takes
    /// (see `Feedback::pick`).
    pub fn worked_at(&self, id: i64, site: &str, latency: Duration) {
        self.note(id, site, Taught::worked(Some(latency)));
        lock(&self.inner.spread).note(site, id, Instant::now());
        self.worked(id);
    }

    /// How each site's requests spread over proxies in the last
    /// [`SPREAD_WINDOW`](crate::health::spread::SPREAD_WINDOW): the uses that worked there,
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
    pub(crate) fn blocked(
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

    pub(super) fn note(&self, id: i64, site: &str, taught: Taught) {
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
    pub(crate) async fn load_sites(&self) -> Result<usize, StoreError> {
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
