//! What a use teaches: each verdict of the rotation loop passed to the
//! feedback path and to the pool's own rests, bans and counters.

use super::*;

impl Pool {
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

    pub(super) async fn failed(&self, lease: &Lease, reason: Option<Reason>) {
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
        tracing::debug!(id, reason = ?reason, "proxy failed in use");
        // Awaited: the proxy must leave the index before the next pick.
        if let Err(e) = self
            .inner
            .shared
            .feedback
            .report(id, UseVerdict::ProxyFailed(reason), None)
            .await
        {
            tracing::warn!(id, error = %e, "cannot record a proxy failure");
        }
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

    /// `site` refused proxy `id` in a request sent at `sent`: counted, and
    /// passed to the feedback path, which bans or rests the pair (see
    /// [`Feedback::blocked`]).
    pub(super) fn blocked(
        &self,
        id: i64,
        site: &str,
        block: Block,
        wait: Option<Duration>,
        sent: Instant,
    ) {
        let c = &self.inner.counters;
        if block == Block::RateLimited {
            c.rate_limits.fetch_add(1, Ordering::Relaxed);
        } else {
            c.blocks.fetch_add(1, Ordering::Relaxed);
            let mut st = lock(&self.inner.shared.state);
            if st.bans.len() < MAX_BAN_SITES || st.bans.contains_key(site) {
                st.bans.entry(site.to_owned()).or_default().insert(id);
            }
        }
        self.inner
            .shared
            .feedback
            .blocked(id, site, block, wait, sent.into_std());
    }

    /// Reports a verdict. A use that worked is only counted (the feedback
    /// path writes such counts together, off the request path); failures,
    /// blocks and target errors take effect before this returns.
    pub(super) async fn report(&self, id: i64, verdict: UseVerdict, site: Option<&str>) {
        let feedback = &self.inner.shared.feedback;
        if verdict == UseVerdict::Worked {
            feedback.worked(id);
            return;
        }
        if let Err(e) = feedback.report(id, verdict, site).await {
            tracing::warn!(id, error = %e, "cannot record a proxy's use");
        }
    }
}
