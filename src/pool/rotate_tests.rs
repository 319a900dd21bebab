//! `Pool::rotate` on paused time with a scripted [`Attempt`]: the budgets
//! (rotations, target retries, rate-limit moves, the wait for a proxy, the
//! longest `Retry-After`), the quorums (unreached, refusals, failing alike)
//! and who is charged. A proxy's failure charges the proxy; the site's or
//! the request's own failure charges none.

use std::collections::HashMap;

use super::*;
use crate::store::ProxyRecord;

const SITE: &str = "shop.test";

fn rec(id: i64) -> ProxyRecord {
    ProxyRecord::alive_for_test(id, 100)
}

/// A round-robin pool of proxies 1..=n on an index of its own.
fn pool_of(dir: &std::path::Path, n: i64) -> Pool {
    let store = Store::open(&dir.join("r.db")).unwrap();
    let index = HealthIndex::from_records((1..=n).map(rec).collect());
    Pool::new(
        Feedback::new(index, store),
        SharedOptions::default(),
        PoolOptions {
            strategy: StrategyKind::RoundRobin,
            ..PoolOptions::default()
        },
    )
    .unwrap()
}

/// How one scripted attempt ends.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// The site answered with this verdict.
    Answer(UseVerdict),
    /// A refusal or rate limit with a `Retry-After`.
    Blocked(Block, Option<Duration>),
    /// The proxy failed before the request went.
    Failed(Reason),
    /// The proxy failed once the request went.
    FailedAfterSending(Reason),
    /// The proxy could not reach the target.
    Unreached,
    /// The request itself ends the use (the client's fault).
    Stop,
}

/// An attempt that plays `script` per proxy (the last step repeats, and
/// `default` for proxies without one), recording what the loop told it.
struct Scripted {
    script: HashMap<i64, Vec<Step>>,
    default: Step,
    /// Proxies tried, in order.
    tried: Vec<i64>,
    /// What the loop said each proxy was charged with or taught.
    learnt: Vec<(i64, UseVerdict)>,
    moved_on: u32,
}

impl Scripted {
    fn new(default: Step) -> Scripted {
        Scripted {
            script: HashMap::new(),
            default,
            tried: Vec::new(),
            learnt: Vec::new(),
            moved_on: 0,
        }
    }

    fn with(mut self, id: i64, steps: &[Step]) -> Scripted {
        self.script.insert(id, steps.to_vec());
        self
    }

    /// Proxies the loop charged a failure.
    fn charged(&self) -> Vec<i64> {
        self.learnt
            .iter()
            .filter(|(_, v)| matches!(v, UseVerdict::ProxyFailed(_)))
            .map(|(id, _)| *id)
            .collect()
    }
}

#[derive(Debug, PartialEq, Eq)]
struct ClientFault;

impl Attempt for Scripted {
    type Answer = i64;
    type Stop = ClientFault;

    async fn attempt(&mut self, lease: Option<&Lease>) -> Result<Tried<i64>, ClientFault> {
        let id = lease.expect("these uses never go direct").id();
        self.tried.push(id);
        let step = match self.script.get_mut(&id) {
            Some(steps) if steps.len() > 1 => steps.remove(0),
            Some(steps) => steps[0],
            None => self.default,
        };
        // Some time passes in every attempt, as on a network.
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok(match step {
            Step::Answer(v) => Tried::answered(v, id, None),
            Step::Blocked(b, wait) => Tried::answered(UseVerdict::Blocked(b), id, wait),
            Step::Failed(r) => Tried::ended(UseVerdict::failed(r)),
            Step::FailedAfterSending(r) => Tried::failed_after_sending(r),
            Step::Unreached => Tried::ended(UseVerdict::Unreached),
            Step::Stop => return Err(ClientFault),
        })
    }

    async fn learnt(&mut self, lease: &Lease, verdict: UseVerdict) {
        self.learnt.push((lease.id(), verdict));
    }

    fn moved_on(&mut self) {
        self.moved_on += 1;
    }
}

fn want(query: &ProxyQuery) -> Want<'_> {
    Want {
        query,
        session: None,
        site: SITE,
        https: false,
    }
}

/// The gateway's kind of rotation: two more proxies, quorums of two,
/// rate limits move on.
fn rot() -> Rotation {
    Rotation {
        no_proxy: NoProxy::Fail,
        rotations: 2,
        target_retries: 0,
        retry_backoff: Duration::from_millis(100),
        rate_limits: RateLimits::MoveOn(1),
        unreached_quorum: 2,
        refusal_quorum: 2,
        alike_quorum: 2,
        alike_ends: true,
        keep_refusal: false,
    }
}

/// Asserts proxy `id` was charged by the pool: it rests, has left the
/// index, and the stats count it.
fn assert_charged(pool: &Pool, id: i64) {
    assert!(pool.is_cooling(id), "{id} should rest");
    assert!(
        pool.index().get(id).is_none(),
        "{id} should leave the index"
    );
}

/// Asserts proxy `id` was not charged: still served and not resting.
fn assert_not_charged(pool: &Pool, id: i64) {
    assert!(!pool.is_cooling(id), "{id} should not rest");
    assert!(
        pool.index().get(id).is_some(),
        "{id} should still be served"
    );
}

#[tokio::test(start_paused = true)]
async fn a_proxy_failure_charges_that_proxy_and_the_next_carries_the_request() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let q = ProxyQuery::default();
    let mut a =
        Scripted::new(Step::Answer(UseVerdict::Worked)).with(1, &[Step::Failed(Reason::Refused)]);
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    let End::Answer(answered) = end else {
        panic!("the second proxy answered");
    };
    assert_eq!((answered.answer, attempts), (2, 2));
    assert_eq!(a.tried, [1, 2]);
    assert_eq!(a.charged(), [1]);
    assert_eq!(a.moved_on, 1);
    assert_charged(&pool, 1);
    assert_not_charged(&pool, 2);
    assert_eq!(pool.stats().proxy_failures, 1);
    assert_eq!(pool.stats().rotations, 1);
}

#[tokio::test(start_paused = true)]
async fn the_rotation_budget_ends_the_use_and_every_failed_proxy_is_charged() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 5);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Failed(Reason::Reset));
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(
        matches!(end, End::Failed(Reason::Reset)),
        "{:?}",
        kind(&end)
    );
    // One proxy and `rotations` more; the other two are never touched.
    assert_eq!(attempts, 3);
    assert_eq!(a.tried, [1, 2, 3]);
    assert_eq!(a.charged(), [1, 2, 3]);
    for id in 1..=3 {
        assert_charged(&pool, id);
    }
    for id in 4..=5 {
        assert_not_charged(&pool, id);
    }
}

#[tokio::test(start_paused = true)]
async fn the_sites_own_error_is_repeated_within_its_budget_and_charges_no_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Answer(UseVerdict::TargetError));
    let r = Rotation {
        target_retries: 3,
        ..rot()
    };
    let started = Instant::now();
    let Rotated { end, attempts } = pool.rotate(&want(&q), &r, &mut a).await;
    let End::Answer(answered) = end else {
        panic!("the site's error is the answer once the repeats are spent");
    };
    assert_eq!(answered.verdict, UseVerdict::TargetError);
    assert_eq!(attempts, 4);
    assert!(a.charged().is_empty(), "{:?}", a.learnt);
    for id in 1..=3 {
        assert_not_charged(&pool, id);
    }
    assert_eq!(pool.stats().proxy_failures, 0);
    assert_eq!(pool.stats().target_retries, 3);
    // Backoff between repeats: 100, 200 and 400 ms, each between half and
    // all of it, besides 10 ms per attempt.
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(350 + 40) && took <= Duration::from_millis(700 + 40),
        "{took:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn refusals_rest_the_pair_not_the_proxy_and_two_alike_are_the_pages_answer() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 4);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Blocked(Block::Refused, None));
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    let End::Answer(answered) = end else {
        panic!("refused alike by the quorum: the page's own answer");
    };
    assert_eq!(answered.verdict, UseVerdict::Blocked(Block::Refused));
    assert_eq!(attempts, 2);
    assert!(a.charged().is_empty(), "{:?}", a.learnt);
    for id in 1..=2 {
        assert_not_charged(&pool, id);
    }
    assert_eq!(pool.stats().blocks, 2);
    assert_eq!(pool.stats().proxy_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn rate_limits_move_on_within_their_own_budget() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 5);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Blocked(Block::RateLimited, None));
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(matches!(end, End::Refused(..)), "{:?}", kind(&end));
    // The first proxy and one move for a rate limit (`MoveOn(1)`).
    assert_eq!(attempts, 2);
    assert!(a.charged().is_empty());
    assert_eq!(pool.stats().rate_limits, 2);
    assert_eq!(pool.stats().proxy_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn a_retry_after_longer_than_allowed_ends_the_use_without_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Blocked(
        Block::RateLimited,
        Some(Duration::from_secs(600)),
    ));
    let r = Rotation {
        rate_limits: RateLimits::Wait {
            max: Duration::from_secs(60),
        },
        target_retries: 2,
        ..rot()
    };
    let started = Instant::now();
    let Rotated { end, attempts } = pool.rotate(&want(&q), &r, &mut a).await;
    assert!(
        matches!(end, End::RetryAfterTooLong(w) if w == Duration::from_secs(600)),
        "{:?}",
        kind(&end)
    );
    assert_eq!(attempts, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(a.charged().is_empty());
    assert_not_charged(&pool, 1);
}

#[tokio::test(start_paused = true)]
async fn the_target_is_unreachable_once_the_quorum_agrees_and_no_proxy_is_charged() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 4);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Unreached);
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(matches!(end, End::Unreachable), "{:?}", kind(&end));
    assert_eq!(attempts, 2);
    assert!(a.charged().is_empty(), "{:?}", a.learnt);
    assert_eq!(
        a.learnt,
        [(1, UseVerdict::Unreached), (2, UseVerdict::Unreached)]
    );
    for id in 1..=2 {
        assert_not_charged(&pool, id);
    }
}

#[tokio::test(start_paused = true)]
async fn proxies_failing_alike_once_the_request_went_are_not_charged() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 4);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::FailedAfterSending(Reason::Timeout));
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(
        matches!(
            end,
            End::Alike {
                proxies: 2,
                reason: Reason::Timeout
            }
        ),
        "{:?}",
        kind(&end)
    );
    // `alike_ends`: a silent site costs no third proxy.
    assert_eq!(attempts, 2);
    assert!(a.charged().is_empty(), "{:?}", a.learnt);
    for id in 1..=2 {
        assert_not_charged(&pool, id);
    }
    assert_eq!(pool.stats().proxy_failures, 0);

    // Without `alike_ends`, the budget is spent first and still none is
    // charged.
    let mut a = Scripted::new(Step::FailedAfterSending(Reason::Reset));
    let r = Rotation {
        alike_ends: false,
        ..rot()
    };
    let Rotated { end, attempts } = pool.rotate(&want(&q), &r, &mut a).await;
    assert!(
        matches!(
            end,
            End::Alike {
                proxies: 3,
                reason: Reason::Reset
            }
        ),
        "{:?}",
        kind(&end)
    );
    assert_eq!(attempts, 3);
    assert!(a.charged().is_empty(), "{:?}", a.learnt);
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_sending_is_charged_once_another_proxy_gets_through() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Answer(UseVerdict::Worked))
        .with(1, &[Step::FailedAfterSending(Reason::Timeout)]);
    let Rotated { end, .. } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(matches!(end, End::Answer(_)), "{:?}", kind(&end));
    assert_eq!(a.charged(), [1]);
    assert_charged(&pool, 1);
    assert_not_charged(&pool, 2);

    // Failures that differ are each the proxy's own.
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let mut a = Scripted::new(Step::FailedAfterSending(Reason::Reset))
        .with(1, &[Step::FailedAfterSending(Reason::Timeout)]);
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(
        matches!(end, End::Failed(Reason::Reset)),
        "{:?}",
        kind(&end)
    );
    assert_eq!(attempts, 3);
    assert_eq!(a.charged(), [1, 2, 3]);
}

#[tokio::test(start_paused = true)]
async fn the_clients_fault_stops_the_use_and_charges_no_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 3);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Stop);
    let Rotated { end, attempts } = pool.rotate(&want(&q), &rot(), &mut a).await;
    assert!(matches!(end, End::Stopped(ClientFault)), "{:?}", kind(&end));
    assert_eq!(attempts, 1);
    assert!(a.learnt.is_empty(), "{:?}", a.learnt);
    assert_not_charged(&pool, 1);
    assert_eq!(pool.stats().proxy_failures, 0);
}

#[tokio::test(start_paused = true)]
async fn with_every_proxy_tried_the_use_waits_its_deadline_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool_of(dir.path(), 2);
    let q = ProxyQuery::default();
    let mut a = Scripted::new(Step::Failed(Reason::Refused));
    let r = Rotation {
        no_proxy: NoProxy::Wait(Duration::from_secs(5)),
        rotations: 10,
        ..rot()
    };
    let started = Instant::now();
    let Rotated { end, attempts } = pool.rotate(&want(&q), &r, &mut a).await;
    let took = started.elapsed();
    let End::NoProxy { error, last } = end else {
        panic!("no proxy was left to try");
    };
    assert!(
        matches!(error, FetchError::NoProxy { attempts: 2, .. }),
        "{error:?}"
    );
    assert!(matches!(
        last.as_deref(),
        Some(End::Failed(Reason::Refused))
    ));
    assert_eq!(attempts, 2);
    assert_eq!(a.charged(), [1, 2]);
    // Both proxies rest (30 s) past the wait: it ends at its deadline.
    assert!(
        took >= Duration::from_secs(5) && took < Duration::from_secs(6),
        "{took:?}"
    );
}

/// A name for how a use ended, for failure messages.
fn kind<A, S>(end: &End<A, S>) -> &'static str {
    match end {
        End::Answer(_) => "answer",
        End::Refused(..) => "refused",
        End::NoProxy { .. } => "no proxy",
        End::Failed(_) => "failed",
        End::Unreachable => "unreachable",
        End::Alike { .. } => "alike",
        End::RetryAfterTooLong(_) => "retry after too long",
        End::Stopped(_) => "stopped",
    }
}
