//! Judges' health during a round. A monitor asks every judge directly once a
//! second; each judge also keeps score of its answers through proxies that a
//! second judge contradicted. A judge that misbehaves is quarantined: it is
//! asked only when no healthy judge of its kind is left, and a failure seen
//! through it never kills a proxy on its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::Checker;

/// How often the monitor asks each judge directly.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A quarantine lasts at least this long, so that a judge failing one
/// request in three cannot flip back in between its failures...
const QUARANTINE_MIN: Duration = Duration::from_secs(10);
/// ...and ends after this many genuine direct answers in a row.
const RELEASE_AFTER: u32 = 3;
/// Direct requests in a row a judge must leave unanswered to count as out
/// of reach: one lost under load (a full listen backlog) is not an outage.
const LOST_AFTER: u32 = 2;
/// Answers through proxies a judge is scored on (the latest ones).
const WINDOW: usize = 32;
/// A judge is quarantined once at least this many of its answers in the
/// window were wrong...
const WRONG_MIN: usize = 3;
/// ...making up at least a quarter of the window so far: one proxy flaky
/// between two requests must not bench a judge.
const WRONG_SHARE_DENOMINATOR: usize = 4;

/// What one direct request to a judge found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Probe {
    /// A 2xx answer echoing the nonce (and marker).
    Genuine,
    /// An answer, but a wrong one (status, content, not even HTTP).
    Wrong,
    /// No answer at all: refused, reset or timed out.
    Silent,
}

/// One judge's health, shared by every check of a round.
#[derive(Debug)]
pub(super) struct Health {
    /// Read by every pick; written under `state`'s lock.
    healthy: AtomicBool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// When the current quarantine began.
    quarantined_at: Option<Instant>,
    /// Genuine direct answers in a row.
    good_probes: u32,
    /// Scores of the latest answers through proxies: true when wrong.
    recent: VecDeque<bool>,
    /// Direct requests in a row that got no answer, and when the first of
    /// them started.
    silent: u32,
    silent_since: Option<Instant>,
}

impl Health {
    /// A judge that has just answered a direct request genuinely.
    pub(super) fn new() -> Health {
        Health {
            healthy: AtomicBool::new(true),
            state: Mutex::default(),
        }
    }

    /// True unless quarantined.
    pub(super) fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// When this judge went out of reach: the start of the first of at
    /// least [`LOST_AFTER`] direct requests in a row it left unanswered.
    pub(super) fn out_of_reach_since(&self) -> Option<Instant> {
        let s = self.lock();
        (s.silent >= LOST_AFTER).then_some(s.silent_since).flatten()
    }

    /// Notes the result of a direct request that started at `started`;
    /// returns true when it changed the judge's standing (for the log).
    pub(super) fn probed(&self, probe: Probe, started: Instant) -> bool {
        let mut s = self.lock();
        if probe == Probe::Silent {
            s.silent += 1;
            s.silent_since.get_or_insert(started);
        } else {
            s.silent = 0;
            s.silent_since = None;
        }
        match probe {
            Probe::Genuine => {
                s.good_probes += 1;
                let served = s
                    .quarantined_at
                    .is_some_and(|at| at.elapsed() >= QUARANTINE_MIN);
                if served && s.good_probes >= RELEASE_AFTER {
                    s.quarantined_at = None;
                    s.recent.clear();
                    self.healthy.store(true, Ordering::Relaxed);
                    return true;
                }
                false
            }
            Probe::Wrong => {
                s.good_probes = 0;
                self.quarantine(&mut s)
            }
            // One request lost under load (a full listen backlog) is not a
            // judge gone wrong; a few in a row are.
            Probe::Silent => {
                s.good_probes = 0;
                s.silent >= LOST_AFTER && self.quarantine(&mut s)
            }
        }
    }

    /// A check through this judge passed.
    pub(super) fn passed(&self) {
        self.score(false);
    }

    /// This judge's answer through a proxy was wrong: another judge passed
    /// the same proxy right after, or the proxy had passed its last check
    /// and nothing else can confirm the failure. Returns true when the
    /// judge is now quarantined because of it.
    pub(super) fn wrong(&self) -> bool {
        self.score(true)
    }

    fn score(&self, wrong: bool) -> bool {
        let mut s = self.lock();
        if s.recent.len() == WINDOW {
            s.recent.pop_front();
        }
        s.recent.push_back(wrong);
        let wrongs = s.recent.iter().filter(|w| **w).count();
        if wrong && wrongs >= WRONG_MIN && wrongs * WRONG_SHARE_DENOMINATOR >= s.recent.len() {
            self.quarantine(&mut s)
        } else {
            false
        }
    }

    /// Starts (or restarts) a quarantine; true when the judge was healthy.
    fn quarantine(&self, s: &mut State) -> bool {
        s.quarantined_at = Some(Instant::now());
        self.healthy.swap(false, Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A poisoned lock only means a panic elsewhere; the counts stand.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the monitor tells the round's writer.
#[derive(Clone, Copy, Debug)]
pub(super) struct Beat {
    /// When the latest direct request that got an answer (from any judge)
    /// started: every failure before it happened while a judge answered.
    pub answered_at: Option<Instant>,
    /// Since when no judge has answered a direct request (each left a few
    /// in a row unanswered): judges are out of reach, so failures say
    /// nothing about the proxies, unless a check passed since.
    pub lost_since: Option<Instant>,
}

/// Asks every judge directly every [`PROBE_EVERY`] until `stop`, keeping
/// their health and `beat` current. Each judge has its own loop, so one
/// that stalls delays nobody else's news.
pub(super) async fn monitor(
    checker: Arc<Checker>,
    beat: watch::Sender<Beat>,
    stop: CancellationToken,
) {
    let loops = (0..checker.judge_count()).map(|i| {
        let (checker, beat, stop) = (checker.clone(), beat.clone(), stop.clone());
        async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(PROBE_EVERY) => {}
                }
                let started = Instant::now();
                let probe = tokio::select! {
                    _ = stop.cancelled() => return,
                    p = checker.probe(i) => p,
                };
                report(&checker, &beat, probe, started);
            }
        }
    });
    futures::future::join_all(loops).await;
}

/// Asks every judge directly once, now, and returns the news.
pub(super) async fn probe_all(checker: &Checker, beat: &watch::Sender<Beat>) -> Beat {
    let started = Instant::now();
    let probes =
        futures::future::join_all((0..checker.judge_count()).map(|i| checker.probe(i))).await;
    for probe in probes {
        report(checker, beat, probe, started);
    }
    *beat.borrow()
}

fn report(checker: &Checker, beat: &watch::Sender<Beat>, probe: Probe, started: Instant) {
    let lost_since = checker.judges_out_of_reach_since();
    beat.send_modify(|b| {
        if probe != Probe::Silent {
            b.answered_at = Some(b.answered_at.map_or(started, |t| t.max(started)));
        }
        b.lost_since = lost_since;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_direct_answer_quarantines_and_only_a_streak_releases() {
        let now = Instant::now();
        let h = Health::new();
        assert!(h.is_healthy());
        assert!(h.probed(Probe::Wrong, now));
        assert!(!h.is_healthy());
        // Genuine answers right away do not end the minimum quarantine.
        for _ in 0..5 {
            assert!(!h.probed(Probe::Genuine, now));
        }
        assert!(!h.is_healthy());
        h.lock().quarantined_at = Some(now - QUARANTINE_MIN);
        h.lock().good_probes = 0;
        h.probed(Probe::Genuine, now);
        h.probed(Probe::Genuine, now);
        assert!(!h.is_healthy(), "two in a row are not enough");
        assert!(h.probed(Probe::Genuine, now));
        assert!(h.is_healthy());
    }

    #[test]
    fn a_judge_is_out_of_reach_after_two_unanswered_requests_in_a_row() {
        let t0 = Instant::now();
        let h = Health::new();
        h.probed(Probe::Silent, t0);
        assert_eq!(h.out_of_reach_since(), None, "one may be a busy moment");
        assert!(h.is_healthy());
        h.probed(Probe::Wrong, t0);
        h.probed(Probe::Silent, t0 + PROBE_EVERY);
        h.probed(Probe::Silent, t0 + 2 * PROBE_EVERY);
        assert_eq!(h.out_of_reach_since(), Some(t0 + PROBE_EVERY));
        assert!(!h.is_healthy());
        h.probed(Probe::Genuine, t0 + 3 * PROBE_EVERY);
        assert_eq!(h.out_of_reach_since(), None);
    }

    #[test]
    fn wrong_answers_through_proxies_quarantine_past_a_share() {
        let h = Health::new();
        for _ in 0..20 {
            h.passed();
        }
        // 3 of 23, then 4 of 24, 5 of 25: under a quarantine's share.
        for _ in 0..5 {
            assert!(!h.wrong());
        }
        assert!(h.is_healthy());
        // 6 of 26 is still under a quarantine's share; 7 of 27 is over.
        assert!(!h.wrong());
        assert!(h.wrong());
        assert!(!h.is_healthy());
    }
}
