//! A pool fetch: one attempt through one proxy (redirects followed, the
//! answer classified), carried from proxy to proxy by the rotation loop.

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
        let started = Instant::now();
        let site = site_of(&req.url);
        let want = Want {
            query: &opts.query,
            session: req.session.as_deref(),
            site: &site,
            https: req.url.scheme() == "https",
        };
        let rot = Rotation {
            no_proxy: opts.no_proxy,
            rotations: opts.rotations,
            target_retries: opts.target_retries,
            retry_backoff: opts.retry_backoff,
            rate_limits: RateLimits::Wait {
                max: opts.max_retry_after,
            },
            unreached_quorum: UNREACHED_QUORUM,
            refusal_quorum: REFUSAL_QUORUM,
            alike_quorum: TIMEOUT_QUORUM,
            alike_ends: true,
            keep_refusal: false,
        };
        let mut fetch = Fetch { pool: self, req };
        let Rotated { end, attempts } = self.rotate(&want, &rot, &mut fetch).await;
        match end {
            End::Answer(a) => Ok(self.page(req, a, attempts, started)),
            End::Refused(a, site) => {
                let status = a.answer.0.status.as_u16();
                Err(FetchError::Exhausted {
                    attempts,
                    last: format!("blocked by {site} ({status})"),
                    status: Some(status),
                })
            }
            End::NoProxy { error, .. } => Err(error),
            End::Failed(reason) => Err(FetchError::Exhausted {
                attempts,
                last: reason.to_string(),
                status: None,
            }),
            End::Unreachable => Err(FetchError::Unreachable { attempts }),
            // Timing out alike: the site is slow or silent.
            End::Alike {
                reason: Reason::Timeout,
                ..
            } => Err(FetchError::SiteTimeout { attempts }),
            // Proxies failing alike on a tunnel to the target (reset,
            // garbled): the target is the likely cause.
            End::Alike { proxies, reason } => Err(FetchError::Exhausted {
                attempts,
                last: format!("{proxies} proxies failed alike ({reason}) on the way to the site"),
                status: None,
            }),
            End::RetryAfterTooLong(w) => Err(FetchError::RetryAfterTooLong(w)),
            End::Stopped(Stop::TooLarge) => Err(FetchError::TooLarge {
                attempts,
                limit: opts.max_body,
            }),
            End::Stopped(Stop::SlowBody) => Err(FetchError::SiteTimeout { attempts }),
        }
    }

    fn page(
        &self,
        req: &Request,
        answered: Answered<(Answer, Url)>,
        attempts: u32,
        started: Instant,
    ) -> Page {
        let (answer, final_url) = answered.answer;
        Page {
            url: req.url.clone(),
            final_url,
            status: answer.status,
            headers: answer.headers,
            body: answer.body,
            carrier: match answered.lease {
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
    async fn attempt(
        &self,
        lease: Option<&Lease>,
        req: &Request,
    ) -> Result<Tried<(Answer, Url)>, Stop> {
        let opts = &self.inner.opts;
        let limits = Limits {
            connect: opts.connect_timeout,
            first_byte: opts.first_byte_timeout,
            total: opts.total_timeout,
            max_body: opts.max_body,
            user_agent: &self.inner.user_agent,
            headed: None,
        };
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
            let pacer = req.pacer.as_ref();
            let answer = match self
                .inner
                .shared
                .client
                .get(lease, &url, limits, pacer)
                .await
            {
                Ok(a) => a,
                Err(f) => {
                    if let Some(p) = &req.pacer {
                        p.answered(&url, None, None);
                    }
                    return match f {
                        Failure::Dial(e) => Ok(super::dial_failed(e, lease.is_some())),
                        Failure::Proxy(r) => Ok(proxy_failed(r)),
                        Failure::BadEncoding => Ok(proxy_failed(Reason::ProtocolError)),
                        Failure::Unreached => Ok(Tried::ended(UseVerdict::Unreached)),
                        Failure::TooLarge => Err(Stop::TooLarge),
                        // The site's slowness: another proxy would wait on
                        // it alike, and this one is not to blame.
                        Failure::SlowBody => Err(Stop::SlowBody),
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
                    return Ok(Tried::answered(verdict, (answer, url), None));
                }
                UseVerdict::ProxyFailed(r) => {
                    return Ok(proxy_failed(r.unwrap_or(Reason::ProtocolError)));
                }
                UseVerdict::Blocked(_) => {
                    let site = site_of(&url);
                    return Ok(Tried {
                        site: Some(site),
                        ..Tried::answered(verdict, (answer, url), wait)
                    });
                }
                UseVerdict::TargetError | UseVerdict::Unreached => {
                    return Ok(Tried::answered(verdict, (answer, url), None));
                }
            }
        }
    }
}

/// Why a fetch ends at once, whatever its budgets.
enum Stop {
    /// The body was too large.
    TooLarge,
    /// The site sent its answer's head but not its body within the total
    /// deadline.
    SlowBody,
}

/// A fetch through the pool, one attempt at a time.
struct Fetch<'a> {
    pool: &'a Pool,
    req: &'a Request,
}

impl Attempt for Fetch<'_> {
    type Answer = (Answer, Url);
    type Stop = Stop;

    async fn attempt(&mut self, lease: Option<&Lease>) -> Result<Tried<(Answer, Url)>, Stop> {
        self.pool.attempt(lease, self.req).await
    }

    async fn learnt(&mut self, lease: &Lease, _verdict: UseVerdict) {
        self.pool.tunnel_failed(lease, self.req).await;
    }
}

/// A proxy failure: a timeout may be the site's (slow or silent) until
/// another proxy gets through, so it is charged only then.
fn proxy_failed(reason: Reason) -> Tried<(Answer, Url)> {
    if reason == Reason::Timeout {
        Tried::failed_after_sending(reason)
    } else {
        Tried::ended(UseVerdict::failed(reason))
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
#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::site_of;

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
