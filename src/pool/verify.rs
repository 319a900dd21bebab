//! `verify=true`: a proxy handed out only once a fresh check through the
//! judge passed. Each candidate is leased from the pool like every other
//! use, so the per-proxy caps, cooldowns and per-site rests hold for it
//! too, and a candidate that fails is charged as a failure in use is.

use std::num::NonZeroU32;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::*;
use crate::check::{self, Prior, Verdict};

/// Candidates tried before giving up.
const TRIES: u32 = 10;

/// The longest one candidate's check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a verification waits for the first checker after start-up
/// (asking the judges directly takes a moment).
const CHECKER_WAIT: Duration = Duration::from_secs(3);

/// The longest one verification takes in all, waits for a free slot
/// included: well inside the API's default request timeout.
const BUDGET: Duration = Duration::from_secs(10);

/// Verifies proxies before they are handed out: a client of the shared
/// pool with the latest round's checker and a cap on judge checks per
/// minute for every client together. Cheap to clone.
#[derive(Clone)]
pub struct Verifier {
    pool: Pool,
    checker: check::Current,
    limiter: Arc<DefaultDirectRateLimiter>,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Verifier")
            .field("pool", &self.pool)
            .finish()
    }
}

/// Why a verification hands out no proxy.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No round has prepared a checker yet (no judge answered).
    #[error("no judge has answered yet, so nothing can be verified; try again shortly")]
    NotReady,
    /// The checks per minute are spent.
    #[error("too many verifications; retry after {retry_after:?}")]
    RateLimited {
        /// When the next check is allowed.
        retry_after: Duration,
    },
    /// No candidate could be leased in time: those that match are at
    /// their cap, resting, or rested for the site.
    #[error("{0}")]
    NoProxy(FetchError),
    /// None of the candidates tried passed; `unsure` of them failed only in
    /// a way that may be the judge's, and were not charged.
    #[error("none of the {tried} proxies tried passed a fresh check")]
    Failed {
        /// Candidates checked.
        tried: u32,
        /// Of those, failed without a verdict.
        unsure: u32,
    },
}

impl Verifier {
    /// A verifier on `pool`'s proxies (a client of it, with the default
    /// strategy), checking with what `checker` holds, at most
    /// `per_minute` checks a minute.
    pub fn new(
        pool: &Pool,
        checker: check::Current,
        per_minute: u32,
    ) -> Result<Verifier, PoolError> {
        let per_minute = NonZeroU32::new(per_minute).unwrap_or(NonZeroU32::MIN);
        Ok(Verifier {
            pool: pool.client(PoolOptions::default())?,
            checker,
            limiter: Arc::new(RateLimiter::direct(Quota::per_minute(per_minute))),
        })
    }

    /// One proxy matching `query` (and usable at `site`) that passed a
    /// check just now. Candidates are leased one at a time: one at its cap
    /// is waited for within the budget, and one that fails its check
    /// rests, leaves the index and is re-checked, as after a failed use.
    pub async fn verify(
        &self,
        query: &ProxyQuery,
        site: Option<&str>,
    ) -> Result<Arc<Entry>, VerifyError> {
        let checker = self
            .checker
            .wait(CHECKER_WAIT)
            .await
            .ok_or(VerifyError::NotReady)?;
        let pool = &self.pool;
        let counters = &pool.inner.counters;
        counters.requests.fetch_add(1, Ordering::Relaxed);
        let want = Want {
            query,
            session: None,
            site: site.unwrap_or_default(),
            https: false,
        };
        let started = Instant::now();
        let mut tried: HashSet<i64> = HashSet::new();
        let (mut checked, mut unsure) = (0u32, 0u32);
        while checked < TRIES {
            let left = BUDGET.saturating_sub(started.elapsed());
            if left.is_zero() {
                break;
            }
            let lease = match pool
                .acquire_for(&want, &tried, checked, NoProxy::Queue(left))
                .await
            {
                Ok(Some(lease)) => lease,
                Err(e) if checked == 0 => return Err(VerifyError::NoProxy(e)),
                Ok(None) | Err(_) => break,
            };
            if let Err(not_until) = self.limiter.check() {
                if checked > 0 {
                    break;
                }
                let now = governor::clock::Clock::now(self.limiter.clock());
                return Err(VerifyError::RateLimited {
                    retry_after: not_until.wait_time_from(now),
                });
            }
            checked += 1;
            counters.attempts.fetch_add(1, Ordering::Relaxed);
            tried.insert(lease.entry.id);
            let left = BUDGET.saturating_sub(started.elapsed());
            // It passed its last check: a failure that may be the judge's
            // needs a second judge before it counts. HTTPS is not re-tested
            // here; the answer says what the last full check found.
            let prior = Prior {
                alive: true,
                https_due: false,
            };
            let verdict = tokio::time::timeout(
                CHECK_TIMEOUT.min(left),
                checker.check_with(&lease.entry.proxy, false, prior),
            )
            .await;
            let reason = match verdict {
                Ok(Verdict::Checked(o)) if o.alive() => {
                    counters.pages.fetch_add(1, Ordering::Relaxed);
                    return Ok(lease.entry.clone());
                }
                Ok(Verdict::Checked(o)) => o.failure,
                // Not the proxy's fault for sure: not handed out this
                // time, but not charged either.
                Ok(Verdict::Unconfirmed(_)) => {
                    unsure += 1;
                    continue;
                }
                Err(_) => Some(Reason::Timeout),
            };
            // Dead right now: it rests, stops being served and is
            // re-checked, as after a failure in use.
            counters.proxy_failures.fetch_add(1, Ordering::Relaxed);
            pool.failed(&lease, reason).await;
        }
        counters.failed.fetch_add(1, Ordering::Relaxed);
        Err(VerifyError::Failed {
            tried: checked,
            unsure,
        })
    }
}
