//! The one attempt/rotation loop: a use of the pool (a fetch with its
//! redirects, a gateway request, a gateway tunnel set-up) tried through
//! one proxy after another. What one attempt does is the caller's
//! ([`Attempt`]); what its verdict teaches, when to move on, repeat or
//! give up, and who is charged are the loop's, under the budgets and
//! quorums of one [`Rotation`].

use super::*;

/// The budgets and quorums of one use of the pool.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rotation {
    /// What to do when no proxy can take an attempt.
    pub no_proxy: NoProxy,
    /// Moves to another proxy after a proxy failed, a site refused it or
    /// it could not reach the target.
    pub rotations: u32,
    /// Repeats after the site failed on its own (and, under
    /// [`RateLimits::Wait`], after a rate limit).
    pub target_retries: u32,
    /// The first wait before a repeat; doubled each time, with jitter.
    pub retry_backoff: Duration,
    /// What a rate limit does.
    pub rate_limits: RateLimits,
    /// Proxies saying the target cannot be reached before it is believed.
    pub unreached_quorum: u32,
    /// Proxies refused alike (bare refusals) before the refusal is taken
    /// for the page's own answer (a private page), not the proxies'.
    pub refusal_quorum: u32,
    /// Proxies failing alike once the request went before the request
    /// itself (or the site) is taken for the cause: none of them is
    /// charged.
    pub alike_quorum: usize,
    /// True to end the use as soon as `alike_quorum` proxies failed alike
    /// (a silent site costs no more proxies); else only once the budget is
    /// spent.
    pub alike_ends: bool,
    /// True to keep the last refusal (and its proxy's slot) to answer with
    /// when no other proxy can be had.
    pub keep_refusal: bool,
}

/// What a rate limit (429, 503) does to a use.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RateLimits {
    /// Wait for the `Retry-After` (or a backoff) and repeat, spending a
    /// target retry; a `Retry-After` longer than `max` ends the use. A
    /// refusal's `Retry-After` is waited for too.
    Wait {
        /// The longest `Retry-After` waited for.
        max: Duration,
    },
    /// Move on to another proxy at once, up to this many times besides the
    /// rotations: the pair rests, so under a limit per address a use finds
    /// a rested address within a few.
    MoveOn(u32),
}

/// What one attempt showed.
pub(crate) struct Tried<A> {
    /// How it ended for the proxy.
    pub verdict: UseVerdict,
    /// The site's answer (a page, its own error, a refusal): always there
    /// when the verdict is `Worked`, `TargetError` or `Blocked`.
    pub answer: Option<A>,
    /// A block's `Retry-After`.
    pub retry_after: Option<Duration>,
    /// Where the verdict was earned, when not at the site the proxy was
    /// taken for (a redirect to another host).
    pub site: Option<String>,
    /// A proxy failure once the request went: the proxy's, or the
    /// request's own when other proxies fail alike on it. Charged once
    /// another proxy gets the request through, or the failures differ.
    pub after_sending: bool,
    /// The request cannot be sent again (its body went with it).
    pub last: bool,
}

impl<A> Tried<A> {
    /// An attempt that ended with `verdict` and no answer.
    pub fn ended(verdict: UseVerdict) -> Tried<A> {
        Tried {
            verdict,
            answer: None,
            retry_after: None,
            site: None,
            after_sending: false,
            last: false,
        }
    }

    /// An attempt the site answered with `answer`.
    pub fn answered(verdict: UseVerdict, answer: A, retry_after: Option<Duration>) -> Tried<A> {
        Tried {
            answer: Some(answer),
            retry_after,
            ..Tried::ended(verdict)
        }
    }

    /// The proxy failed for `reason` once the request went.
    pub fn failed_after_sending(reason: Reason) -> Tried<A> {
        Tried {
            after_sending: true,
            ..Tried::ended(UseVerdict::failed(reason))
        }
    }
}

/// What one attempt does: send a plain request, open a tunnel, fetch a
/// page with its redirects.
pub(crate) trait Attempt {
    /// The site's answer (or the tunnel).
    type Answer;
    /// Why a use ends at once, whatever its budgets.
    type Stop;

    /// One attempt through `lease`, or directly.
    async fn attempt(&mut self, lease: Option<&Lease>) -> Result<Tried<Self::Answer>, Self::Stop>;

    /// The pool charged `lease`'s proxy (`ProxyFailed`) or heard that it
    /// could not reach the target (`Unreached`).
    async fn learnt(&mut self, _lease: &Lease, _verdict: UseVerdict) {}

    /// The use moves on to another attempt.
    fn moved_on(&mut self) {}
}

/// An answer a use ended with, and what carried it.
pub(crate) struct Answered<A> {
    pub answer: A,
    /// `None` when it went direct.
    pub lease: Option<Lease>,
    pub verdict: UseVerdict,
    /// How long the attempt took.
    pub latency: Duration,
}

/// How a use ended.
pub(crate) enum End<A, S> {
    /// The site answered: a page, its own error once the repeats are
    /// spent, or a refusal proxies met alike (the page's own answer).
    Answer(Answered<A>),
    /// The site (named) refused the last proxy and no other may try.
    Refused(Answered<A>, String),
    /// No proxy could take an attempt; how the one before ended, if any.
    NoProxy {
        error: FetchError,
        last: Option<Box<End<A, S>>>,
    },
    /// The last proxy failed and no other may try.
    Failed(Reason),
    /// Proxies that work say the target cannot be reached.
    Unreachable,
    /// Proxies failed alike once the request went: none was charged.
    Alike { proxies: usize, reason: Reason },
    /// The site asked to wait longer than the use may.
    RetryAfterTooLong(Duration),
    /// The attempt said to stop.
    Stopped(S),
}

/// How a use went: its end and its attempts.
pub(crate) struct Rotated<A, S> {
    pub end: End<A, S>,
    /// Attempts made.
    pub attempts: u32,
}

impl Pool {
    /// Tries `attempt` through proxies for `want` until one gets an answer
    /// or `rot`'s budgets are spent, learning from every verdict.
    pub(crate) async fn rotate<T: Attempt>(
        &self,
        want: &Want<'_>,
        rot: &Rotation,
        attempt: &mut T,
    ) -> Rotated<T::Answer, T::Stop> {
        let c = &self.inner.counters;
        let mut tried: HashSet<i64> = HashSet::new();
        let mut attempts = 0u32;
        let (mut rotations, mut retries, mut limits) = (0u32, 0u32, 0u32);
        let (mut unreached, mut refusals) = (0u32, 0u32);
        let mut last: Option<End<T::Answer, T::Stop>> = None;
        // Proxies that failed once the request went, with their leases
        // (in-flight slots) held until it is known whose fault it was.
        let mut sent: Vec<(Lease, Reason)> = Vec::new();
        let end = loop {
            let lease = match self.acquire_for(want, &tried, attempts, rot.no_proxy).await {
                Ok(l) => l,
                Err(error) => {
                    break End::NoProxy {
                        error,
                        last: last.take().map(Box::new),
                    };
                }
            };
            attempts += 1;
            c.attempts.fetch_add(1, Ordering::Relaxed);
            if lease.is_none() {
                c.direct.fetch_add(1, Ordering::Relaxed);
            }
            let t0 = Instant::now();
            let tried_now = match attempt.attempt(lease.as_ref()).await {
                Ok(t) => t,
                Err(stop) => break End::Stopped(stop),
            };
            let latency = t0.elapsed();
            let verdict = tried_now.verdict;
            if matches!(
                verdict,
                UseVerdict::Worked | UseVerdict::TargetError | UseVerdict::Blocked(_)
            ) {
                // The site answered this proxy: those that failed on the
                // request failed on their own.
                for (l, reason) in sent.drain(..) {
                    self.charge(&l, reason, attempt).await;
                }
            }
            let id = lease.as_ref().map(|l| l.entry.id);
            let no_more = tried_now.last;
            let answered = |answer: Option<T::Answer>, lease| Answered {
                answer: answer.expect("the site answered"),
                lease,
                verdict,
                latency,
            };
            match verdict {
                UseVerdict::Worked => {
                    if let Some(l) = &lease {
                        self.worked(l, latency).await;
                    }
                    break End::Answer(answered(tried_now.answer, lease));
                }
                UseVerdict::TargetError => {
                    if let Some(id) = id {
                        self.report(id, verdict, None).await;
                    }
                    if retries >= rot.target_retries || no_more {
                        break End::Answer(answered(tried_now.answer, lease));
                    }
                    retries += 1;
                    c.target_retries.fetch_add(1, Ordering::Relaxed);
                    attempt.moved_on();
                    drop(lease);
                    tokio::time::sleep(backoff(rot.retry_backoff, retries)).await;
                }
                UseVerdict::ProxyFailed(reason) => {
                    let reason = reason.unwrap_or(Reason::ProtocolError);
                    let Some(l) = lease else {
                        c.proxy_failures.fetch_add(1, Ordering::Relaxed);
                        break End::Failed(reason);
                    };
                    tried.insert(l.entry.id);
                    if tried_now.after_sending {
                        sent.push((l, reason));
                        if rot.alike_ends && alike(&sent, rot.alike_quorum).is_some() {
                            break End::Failed(reason);
                        }
                    } else {
                        self.charge(&l, reason, attempt).await;
                    }
                    if no_more || rotations >= rot.rotations {
                        break End::Failed(reason);
                    }
                    last = Some(End::Failed(reason));
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                    attempt.moved_on();
                }
                UseVerdict::Blocked(block) => {
                    let site = match (tried_now.site, &lease) {
                        (Some(s), _) => s,
                        (None, Some(l)) => l.site.clone(),
                        (None, None) => want.site.to_owned(),
                    };
                    let limited = block == Block::RateLimited;
                    let wait = tried_now.retry_after;
                    if let Some(id) = id {
                        self.blocked(id, &site, block, wait, t0);
                        if block == Block::Refused {
                            refusals += 1;
                        }
                        tried.insert(id);
                    }
                    let answer = answered(tried_now.answer, lease);
                    if refusals >= rot.refusal_quorum {
                        break End::Answer(answer);
                    }
                    let spent = match rot.rate_limits {
                        _ if no_more => true,
                        RateLimits::Wait { .. } if limited => retries >= rot.target_retries,
                        RateLimits::MoveOn(max) if limited => limits >= max,
                        _ => rotations >= rot.rotations || answer.lease.is_none(),
                    };
                    if spent {
                        break End::Refused(answer, site);
                    }
                    match rot.rate_limits {
                        RateLimits::Wait { .. } if limited => {
                            retries += 1;
                            c.target_retries.fetch_add(1, Ordering::Relaxed);
                        }
                        RateLimits::MoveOn(_) if limited => limits += 1,
                        _ => {
                            rotations += 1;
                            c.rotations.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    attempt.moved_on();
                    if rot.keep_refusal {
                        last = Some(End::Refused(answer, site));
                    } else {
                        drop(answer);
                    }
                    if let RateLimits::Wait { max } = rot.rate_limits {
                        let pause = match wait {
                            Some(w) if w > max => break End::RetryAfterTooLong(w),
                            Some(w) => w,
                            None if limited => backoff(rot.retry_backoff, retries),
                            None => Duration::ZERO,
                        };
                        tokio::time::sleep(pause).await;
                    }
                }
                UseVerdict::Unreached => {
                    unreached += 1;
                    let Some(l) = lease else {
                        break End::Unreachable;
                    };
                    self.report(l.entry.id, verdict, None).await;
                    attempt.learnt(&l, verdict).await;
                    tried.insert(l.entry.id);
                    if unreached >= rot.unreached_quorum || no_more || rotations >= rot.rotations {
                        break End::Unreachable;
                    }
                    last = Some(End::Unreachable);
                    rotations += 1;
                    c.rotations.fetch_add(1, Ordering::Relaxed);
                    attempt.moved_on();
                }
            }
        };
        // Failing alike, the request (or the site) is the likely cause:
        // none of them is charged. Otherwise each failed on its own.
        let end = match alike(&sent, rot.alike_quorum) {
            Some(reason) if !matches!(end, End::Answer(_)) => {
                let proxies = sent.len();
                for (l, _) in sent.drain(..) {
                    self.report(l.entry.id, UseVerdict::TargetError, None).await;
                }
                End::Alike { proxies, reason }
            }
            _ => {
                for (l, reason) in sent.drain(..) {
                    self.charge(&l, reason, attempt).await;
                }
                end
            }
        };
        Rotated { end, attempts }
    }

    /// Charges a failure to `lease`'s proxy: it rests, stops being served
    /// and loses its kept connections.
    async fn charge<T: Attempt>(&self, lease: &Lease, reason: Reason, attempt: &mut T) {
        self.inner
            .counters
            .proxy_failures
            .fetch_add(1, Ordering::Relaxed);
        self.failed(lease, Some(reason)).await;
        attempt.learnt(lease, UseVerdict::failed(reason)).await;
    }
}

/// The reason every one of `sent` failed for, when there are at least
/// `quorum` of them.
fn alike(sent: &[(Lease, Reason)], quorum: usize) -> Option<Reason> {
    let (_, first) = sent.first()?;
    (sent.len() >= quorum && sent.iter().all(|(_, r)| r == first)).then_some(*first)
}

/// `base × 2^(n-1)`, between half and all of it at random.
fn backoff(base: Duration, n: u32) -> Duration {
    let full = base.saturating_mul(2u32.saturating_pow(n.saturating_sub(1).min(16)));
    let full = full.min(Duration::from_secs(60));
    full.mul_f64(rand::rng().random_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
