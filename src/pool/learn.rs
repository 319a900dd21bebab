//! What a use teaches: a lease settled as worked, failed, blocked or rate
//! limited, passed to the feedback path and to the pool's own rests and
//! bans.

use super::*;

/// How a use of a proxy from [`Pool::take`] ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Used {
    /// It carried the request (or opened the tunnel) in this long.
    Worked(Duration),
    /// The proxy failed.
    ProxyFailed(Reason),
    /// The site refused this proxy with `status`: a rate limit (429, 503
    /// without a ban page) rests the pair for `wait`, other refusals ban
    /// it (`page`: a captcha or ban page) or rest it (a bare status).
    Blocked {
        /// The site, as [`site_of`] names it.
        site: String,
        /// The status it answered.
        status: u16,
        /// A captcha or ban page, not a bare status.
        page: bool,
        /// Its `Retry-After`.
        wait: Option<Duration>,
    },
    /// The site failed on its own, or could not be reached.
    TargetError,
}
/// How one attempt (with its redirects) ended.
pub(super) enum Outcome {
    Page(Answer, Url),
    ProxyFailure(Reason),
    Blocked {
        site: String,
        wait: Option<Duration>,
        /// A captcha or ban page, not a bare status.
        page: bool,
        answer: Answer,
        url: Url,
    },
    SiteError(Answer, Url),
    Unreached,
    TooLarge,
}
impl Pool {
    /// Learns from a use of a proxy from [`Pool::take`], exactly as from
    /// the pool's own fetches: a proxy failure cools it down and reports it
    /// on the feedback path, a block bans or rests the (proxy, site) pair, a
    /// target error costs the proxy nothing.
    pub async fn settle(&self, lease: &Lease, used: Used) {
        let c = &self.inner.counters;
        let id = lease.entry.id;
        match used {
            Used::Worked(latency) => {
                c.pages.fetch_add(1, Ordering::Relaxed);
                self.worked(lease, latency).await;
            }
            Used::ProxyFailed(reason) => {
                c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                self.failed(lease, reason).await;
            }
            Used::Blocked {
                site,
                status,
                page,
                wait,
            } => {
                if !page && matches!(status, 429 | 503) {
                    self.rate_limited(id, &site, wait, lease.taken);
                } else {
                    c.blocks.fetch_add(1, Ordering::Relaxed);
                    self.blocked(id, &site, page).await;
                }
            }
            Used::TargetError => self.report(id, Verdict::TargetError, None).await,
        }
    }

    pub(super) async fn worked(&self, lease: &Lease, latency: Duration) {
        {
            let mut st = lock(&self.inner.shared.state);
            let u = st.usage.entry(lease.entry.id).or_default();
            u.ok += 1;
            u.streak = 0;
            let ms = latency.as_secs_f64() * 1000.0;
            u.latency_ms = Some(match u.latency_ms {
                Some(prev) => prev * 0.7 + ms * 0.3,
                None => ms,
            });
        }
        // Counted off the request path; what the site took is learnt too.
        self.inner
            .shared
            .feedback
            .worked_at(lease.entry.id, &lease.site, latency);
    }

    /// The proxies of `timed_out` were slow themselves (another reached
    /// the site, or the request ended otherwise): each is charged the
    /// timeout.
    pub(super) async fn timed_out(&self, timed_out: &mut Vec<Lease>, req: &Request) {
        for l in timed_out.drain(..) {
            self.inner
                .counters
                .proxy_failures
                .fetch_add(1, Ordering::Relaxed);
            self.failed(&l, Reason::Timeout).await;
            self.tunnel_failed(&l, req).await;
        }
    }

    pub(super) async fn failed(&self, lease: &Lease, reason: Reason) {
        let id = lease.entry.id;
        {
            let shared = &self.inner.shared;
            let mut st = lock(&shared.state);
            st.failed.insert(id);
            let u = st.usage.entry(id).or_default();
            u.failed += 1;
            u.streak += 1;
            let factor = 2u32.saturating_pow(u.streak.saturating_sub(1).min(16));
            let rest = shared
                .cooldown
                .saturating_mul(factor)
                .min(shared.max_cooldown);
            u.cooldown_until = Some(Instant::now() + rest);
        }
        self.inner.shared.client.forget(id);
        tracing::debug!(id, %reason, "proxy failed in use");
        // Awaited: the proxy must leave the index before the next pick.
        if let Err(e) = self
            .inner
            .shared
            .feedback
            .report(id, Verdict::Failed(Some(reason)), None)
            .await
        {
            tracing::warn!(id, error = %e, "cannot record a proxy failure");
        }
    }

    /// `site` rate-limited proxy `id` (a request sent at `sent`): the pair
    /// rests for the Retry-After `wait` (or [`RATE_LIMIT_REST`]), and the
    /// site's gap between requests through one proxy widens.
    pub(super) fn rate_limited(&self, id: i64, site: &str, wait: Option<Duration>, sent: Instant) {
        self.inner
            .counters
            .rate_limits
            .fetch_add(1, Ordering::Relaxed);
        let feedback = &self.inner.shared.feedback;
        feedback.rest(
            id,
            site,
            wait.unwrap_or(RATE_LIMIT_REST).max(Duration::from_secs(1)),
        );
        feedback.rate_limited(site, sent.into_std());
    }

    /// An https fetch through an HTTP proxy failed: the CONNECT tunnel may
    /// be what broke, so its HTTPS support is re-tested.
    pub(super) async fn tunnel_failed(&self, lease: &Lease, req: &Request) {
        if req.url.scheme() != "https" || lease.entry.proxy.scheme != Scheme::Http {
            return;
        }
        if let Err(e) = self
            .inner
            .shared
            .feedback
            .tunnel_failed(lease.entry.id)
            .await
        {
            tracing::warn!(id = lease.entry.id, error = %e, "cannot ask for an https re-test");
        }
    }

    /// A site refused proxy `id`: a ban page bans the pair (reported on
    /// the feedback path), a bare refusal rests it for a while.
    pub(super) async fn blocked(&self, id: i64, site: &str, page: bool) {
        {
            let mut st = lock(&self.inner.shared.state);
            if st.bans.len() < MAX_BAN_SITES || st.bans.contains_key(site) {
                st.bans.entry(site.to_owned()).or_default().insert(id);
            }
        }
        if page {
            self.report(id, Verdict::Blocked, Some(site)).await;
        } else {
            self.inner.shared.feedback.refused(id, site, REFUSAL_REST);
        }
    }

    /// Reports a verdict. A use that worked is only counted (the feedback
    /// path writes such counts together, off the request path); failures,
    /// blocks and target errors take effect before this returns.
    pub(super) async fn report(&self, id: i64, verdict: Verdict, site: Option<&str>) {
        let feedback = &self.inner.shared.feedback;
        if verdict == Verdict::Worked {
            feedback.worked(id);
            return;
        }
        if let Err(e) = feedback.report(id, verdict, site).await {
            tracing::warn!(id, error = %e, "cannot record a proxy's use");
        }
    }
}
