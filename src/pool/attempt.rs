//! The attempt loop: a request tried through one proxy after another, each
//! answer classified and learnt from, redirects followed, backoff between
//! tries.

use super::*;

impl Pool {
    /// GETs `url`, retried on other proxies as the options allow.
    pub async fn get(&self, url: &str) -> Result<Page, FetchError> {
        let parsed = Url::parse(url).map_err(|e| FetchError::InvalidUrl {
            url: url.to_owned(),
            why: e.to_string(),
        })?;
        self.fetch(Request::new(parsed)?).await
    }

    /// Sends `req`: picks a proxy, fetches, classifies, reports, and moves
    /// on to another proxy or waits and repeats until a page comes or a
    /// budget is spent.
    pub async fn fetch(&self, req: Request) -> Result<Page, FetchError> {
        let c = &self.inner.counters;
        c.requests.fetch_add(1, Ordering::Relaxed);
        let result = self.fetch_inner(&req).await;
        match &result {
            Ok(_) => c.pages.fetch_add(1, Ordering::Relaxed),
            Err(_) => c.failed.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    pub(super) async fn fetch_inner(&self, req: &Request) -> Result<Page, FetchError> {
        let opts = &self.inner.opts;
        let c = &self.inner.counters;
        let started = Instant::now();
        let mut tried: HashSet<i64> = HashSet::new();
        let (mut attempts, mut rotations, mut retries, mut unreached) = (0u32, 0u32, 0u32, 0u32);
        let mut refusals = 0u32;
        // Proxies that timed out on this URL: slow themselves, or the site
        // is; the next proxy tells which.
        let mut timed_out: Vec<Lease> = Vec::new();
        let exhausted = |attempts, last: String, status| FetchError::Exhausted {
            attempts,
            last,
            status,
        };
        loop {
            let lease = match self.acquire(req, &tried, attempts).await {
                Ok(l) => l,
                Err(e) => {
                    self.timed_out(&mut timed_out, req).await;
                    return Err(e);
                }
            };
            attempts += 1;
            c.attempts.fetch_add(1, Ordering::Relaxed);
            if lease.is_none() {
                c.direct.fetch_add(1, Ordering::Relaxed);
            }
            let t0 = Instant::now();
            let outcome = self.attempt(lease.as_ref(), req).await;
            let id = lease.as_ref().map(|l| l.entry.id);
            if matches!(
                outcome,
                Outcome::Page(..) | Outcome::SiteError(..) | Outcome::Blocked { .. }
            ) {
                // The site answered this proxy: those that timed out were slow.
                self.timed_out(&mut timed_out, req).await;
            }
            match outcome {
                Outcome::Page(answer, final_url) => {
                    if let Some(l) = &lease {
                        self.worked(l, t0.elapsed()).await;
                    }
                    return Ok(self.page(req, answer, final_url, &lease, attempts, started));
                }
                Outcome::SiteError(answer, final_url) => {
                    if let Some(id) = id {
                        self.report(id, UseVerdict::TargetError, None).await;
                    }
                    if retries >= opts.target_retries {
                        return Ok(self.page(req, answer, final_url, &lease, attempts, started));
                    }
                    retries += 1;
                    c.target_retries.fetch_add(1, Ordering::Relaxed);
                    drop(lease);
                    tokio::time::sleep(backoff(opts.retry_backoff, retries)).await;
                }
                Outcome::ProxyFailure(reason) => {
                    let Some(l) = lease else {
                        c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                        return Err(exhausted(attempts, reason.to_string(), None));
                    };
                    tried.insert(l.entry.id);
                    if reason == Reason::Timeout {
                        timed_out.push(l);
                        if timed_out.len() >= TIMEOUT_QUORUM {
                            for l in timed_out.drain(..) {
                                self.report(l.entry.id, UseVerdict::TargetError, None).await;
                            }
                            return Err(FetchError::SiteTimeout { attempts });
                        }
                    } else {
                        c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                        self.failed(&l, Some(reason)).await;
                        self.tunnel_failed(&l, req).await;
                    }
                    if rotations >= opts.rotations {
                        self.timed_out(&mut timed_out, req).await;
                        return Err(exhausted(attempts, reason.to_string(), None));
                    }
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::Blocked {
                    site,
                    wait,
                    block,
                    answer,
                    url,
                } => {
                    let status = answer.status;
                    // Rate limits (429, 503) rest the pair for their
                    // Retry-After and spend target retries; captcha and ban
                    // pages ban the pair, bare refusals (403) rest it, and
                    // both spend rotations.
                    let limited = block == Block::RateLimited;
                    if let Some(id) = id {
                        self.blocked(id, &site, block, wait, t0).await;
                        if block == Block::Refused {
                            refusals += 1;
                        }
                        tried.insert(id);
                    }
                    // Several proxies refused alike: the site means it for
                    // this URL (a private page), not for these proxies.
                    if refusals >= REFUSAL_QUORUM {
                        return Ok(self.page(req, answer, url, &lease, attempts, started));
                    }
                    let last = format!("blocked by {site} ({})", status.as_u16());
                    if limited {
                        if retries >= opts.target_retries {
                            return Err(exhausted(attempts, last, Some(status.as_u16())));
                        }
                        retries += 1;
                        c.target_retries.fetch_add(1, Ordering::Relaxed);
                    } else {
                        if rotations >= opts.rotations || lease.is_none() {
                            return Err(exhausted(attempts, last, Some(status.as_u16())));
                        }
                        rotations += 1;
                        c.rotations.fetch_add(1, Ordering::Relaxed);
                    }
                    drop(lease);
                    let pause = match wait {
                        Some(w) if w > opts.max_retry_after => {
                            return Err(FetchError::RetryAfterTooLong(w));
                        }
                        Some(w) => w,
                        None if limited => backoff(opts.retry_backoff, retries),
                        None => Duration::ZERO,
                    };
                    tokio::time::sleep(pause).await;
                }
                Outcome::Unreached => {
                    unreached += 1;
                    let Some(l) = lease else {
                        return Err(FetchError::Unreachable { attempts });
                    };
                    self.report(l.entry.id, UseVerdict::TargetError, None).await;
                    self.tunnel_failed(&l, req).await;
                    tried.insert(l.entry.id);
                    if unreached >= UNREACHED_QUORUM || rotations >= opts.rotations {
                        return Err(FetchError::Unreachable { attempts });
                    }
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                }
                Outcome::TooLarge => {
                    return Err(FetchError::TooLarge {
                        attempts,
                        limit: opts.max_body,
                    });
                }
            }
        }
    }

    pub(super) fn page(
        &self,
        req: &Request,
        answer: Answer,
        final_url: Url,
        lease: &Option<Lease>,
        attempts: u32,
        started: Instant,
    ) -> Page {
        Page {
            url: req.url.clone(),
            final_url,
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            carrier: match lease {
                Some(l) => Carrier::Proxy {
                    id: l.entry.id,
                    proxy: l.entry.proxy.clone(),
                },
                None => Carrier::Direct,
            },
            attempts,
            elapsed: started.elapsed(),
        }
    }

    /// One attempt through `lease` (or direct), following the redirects
    /// the request allows through the same proxy.
    pub(super) async fn attempt(&self, lease: Option<&Lease>, req: &Request) -> Outcome {
        let opts = &self.inner.opts;
        let limits = Limits {
            connect: opts.connect_timeout,
            first_byte: opts.first_byte_timeout,
            total: opts.total_timeout,
            max_body: opts.max_body,
            user_agent: &self.inner.user_agent,
        };
        let proxy = lease.map(|l| (l.entry.id, &l.entry.proxy));
        let mut url = req.url.clone();
        let mut redirects = 0;
        loop {
            if let Some(p) = &req.pacer {
                // A long wait for the site's turn is spent before dialing,
                // not on an open connection the proxy may close.
                let early = p.ready_in(&url).saturating_sub(PRE_DIAL);
                if !early.is_zero() {
                    tokio::time::sleep(early).await;
                }
            }
            let pacer = req.pacer.as_deref();
            let answer = match self
                .inner
                .shared
                .client
                .get(proxy, &url, limits, pacer)
                .await
            {
                Ok(a) => a,
                Err(f) => {
                    if let Some(p) = &req.pacer {
                        p.answered(&url, None, None);
                    }
                    return match f {
                        Failure::Proxy(r) => Outcome::ProxyFailure(r),
                        Failure::BadEncoding => Outcome::ProxyFailure(Reason::ProtocolError),
                        Failure::Unreached => Outcome::Unreached,
                        Failure::TooLarge => Outcome::TooLarge,
                    };
                }
            };
            let (verdict, wait) = opts.classifier.classify(
                answer.status,
                &answer.headers,
                &answer.body,
                answer.forward,
                answer.tls,
            );
            if let Some(p) = &req.pacer {
                let wait = crate::net::retry_after(&answer.headers, std::time::SystemTime::now());
                p.answered(&url, Some(answer.status), wait);
            }
            match verdict {
                UseVerdict::Worked => {
                    if answer.status.is_redirection()
                        && redirects < opts.max_redirects
                        && let Some(next) = location(&url, &answer.headers)
                        && next != url
                        && match &req.follow {
                            Some(rule) => rule(&url, &next),
                            None => same_host(&url, &next),
                        }
                    {
                        redirects += 1;
                        url = next;
                        continue;
                    }
                    return Outcome::Page(answer, url);
                }
                UseVerdict::ProxyFailed(r) => {
                    return Outcome::ProxyFailure(r.unwrap_or(Reason::ProtocolError));
                }
                UseVerdict::Blocked(block) => {
                    return Outcome::Blocked {
                        site: site_of(&url),
                        wait,
                        block,
                        answer,
                        url,
                    };
                }
                UseVerdict::TargetError | UseVerdict::Unreached => {
                    return Outcome::SiteError(answer, url);
                }
            }
        }
    }
}

/// Same host name and port; an upgrade from http's default port to
/// https's counts as the same.
pub(super) fn same_host(from: &Url, to: &Url) -> bool {
    matches!(to.scheme(), "http" | "https")
        && from.host_str() == to.host_str()
        && (from.port() == to.port() || (from.port().is_none() && to.port().is_none()))
}
/// The redirect target of an answer, resolved against `base`.
pub(super) fn location(base: &Url, headers: &HeaderMap) -> Option<Url> {
    let loc = headers.get(http::header::LOCATION)?.to_str().ok()?;
    let mut next = base.join(loc.trim()).ok()?;
    next.set_fragment(None);
    matches!(next.scheme(), "http" | "https").then_some(next)
}
/// `base × 2^(n-1)`, between half and all of it at random.
pub(super) fn backoff(base: Duration, n: u32) -> Duration {
    let full = base.saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(16)));
    let full = full.min(Duration::from_secs(60));
    full.mul_f64(rand::rng().random_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::site_of;

    #[test]
    fn backoff_doubles_with_jitter_and_a_ceiling() {
        let base = Duration::from_millis(100);
        for n in 1..=4 {
            let full = base * 2u32.pow(n - 1);
            let b = backoff(base, n);
            assert!(b >= full / 2 && b <= full, "{n}: {b:?}");
        }
        assert!(backoff(base, 40) <= Duration::from_secs(60));
    }

    #[test]
    fn redirects_resolve_against_the_page() {
        let base = Url::parse("http://a.test/x/y?q=1").unwrap();
        let mut h = HeaderMap::new();
        h.insert(http::header::LOCATION, "../z#frag".parse().unwrap());
        assert_eq!(location(&base, &h).unwrap().as_str(), "http://a.test/z");
        h.insert(http::header::LOCATION, "mailto:x@y".parse().unwrap());
        assert_eq!(location(&base, &h), None);
        assert!(same_host(&base, &Url::parse("https://a.test/").unwrap()));
        assert!(!same_host(&base, &Url::parse("http://b.test/").unwrap()));
        assert!(!same_host(
            &base,
            &Url::parse("http://a.test:8080/").unwrap()
        ));
        assert_eq!(
            site_of(&Url::parse("http://127.0.0.1:8080/a").unwrap()),
            "127.0.0.1:8080"
        );
        assert_eq!(
            site_of(&Url::parse("https://Shop.Test/a").unwrap()),
            "shop.test"
        );
    }
}
