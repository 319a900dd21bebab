//! The counts `/stats`, `/sources` and the dashboard show: the store's
//! counts and sources, read in one snapshot of the store (so one answer
//! never mixes two moments), with the time they were counted.
//!
//! While counting is cheap (it took under [`LIVE_BELOW`] last time) every
//! answer counts afresh. Once the store is so big that counting takes
//! longer (about a second at a million proxies on either backend), answers
//! are served from the latest count in memory, and counting goes on in the
//! background: after each harvest, check round and purge (see
//! [`LastRounds`]), when a count is older than [`MAX_AGE`] (other nodes
//! write too), never two at once, and each one waits as long as the last
//! took since it ended, so counting takes at most half of one reader's time.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::LastRounds;
use crate::lock;
use crate::store::{Presence, Stats, Store, StoreError, now_ms};

/// Counting that took less than this is done again for every answer.
pub const LIVE_BELOW: Duration = Duration::from_millis(20);

/// A count older than this is counted again in the background when it is
/// asked for.
pub const MAX_AGE: Duration = Duration::from_secs(60);

/// One count of the store.
#[derive(Debug)]
pub struct Counts {
    /// The counts, and the sources with theirs.
    pub stats: Stats,
    /// When it was counted (unix ms; the snapshot was taken then or just
    /// after).
    pub at_ms: i64,
    started: Instant,
    /// The rounds ended before it was counted.
    rounds: u64,
}

impl Counts {
    /// Whether the store held any proxy, and any checked one.
    pub fn presence(&self) -> Presence {
        let n = |s: &str| self.stats.by_status.get(s).copied().unwrap_or(0);
        Presence {
            stored: self.stats.total > 0,
            checked: n("alive") + n("dead") > 0,
        }
    }
}

/// The latest count and how counting goes. Shared by the API's handlers.
#[derive(Debug)]
pub struct Counted {
    store: Store,
    rounds: LastRounds,
    live_below: Duration,
    state: Mutex<State>,
    /// Held while counting: one count at a time.
    counting: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct State {
    latest: Option<Arc<Counts>>,
    /// How long the latest count took.
    took: Duration,
    /// When it ended.
    ended: Option<Instant>,
    /// A background count is running or waiting its turn.
    background: bool,
}

impl State {
    /// Whether the latest count misses a round that ended since, or is
    /// older than [`MAX_AGE`].
    fn stale(&self, rounds: u64) -> bool {
        self.latest
            .as_ref()
            .is_none_or(|c| c.rounds != rounds || c.started.elapsed() > MAX_AGE)
    }
}

impl Counted {
    /// Counts of `store`, following the rounds `rounds` records; counting
    /// that takes under `live_below` is done for every answer.
    pub fn new(store: Store, rounds: LastRounds, live_below: Duration) -> Counted {
        Counted {
            store,
            rounds,
            live_below,
            state: Mutex::default(),
            counting: tokio::sync::Mutex::new(()),
        }
    }

    /// The counts to show now: counted for this answer while that is
    /// cheap, else the latest count (a new one starting in the background
    /// when it is stale). Only the first answer of all waits for a count
    /// that is not cheap.
    pub async fn get(self: &Arc<Self>) -> Result<Arc<Counts>, StoreError> {
        let (latest, cheap, stale) = {
            let s = lock(&self.state);
            (
                s.latest.clone(),
                s.took < self.live_below,
                s.stale(self.rounds.ended()),
            )
        };
        match latest {
            Some(c) if !cheap => {
                if stale {
                    self.refresh();
                }
                Ok(c)
            }
            _ => self.count(Instant::now()).await,
        }
    }

    /// Whether the latest count follows every round ended (and is not
    /// older than [`MAX_AGE`]).
    pub fn current(&self) -> bool {
        !lock(&self.state).stale(self.rounds.ended())
    }

    /// A count begun at or after `asked`: the one that runs when it is
    /// asked for (those asking meanwhile share it), else a new one.
    async fn count(&self, asked: Instant) -> Result<Arc<Counts>, StoreError> {
        let _turn = self.counting.lock().await;
        if let Some(c) = lock(&self.state).latest.clone()
            && c.started >= asked
        {
            return Ok(c);
        }
        let rounds = self.rounds.ended();
        let started = Instant::now();
        let at_ms = now_ms();
        let stats = self.store.stats().await?;
        let counts = Arc::new(Counts {
            stats,
            at_ms,
            started,
            rounds,
        });
        let mut s = lock(&self.state);
        s.took = started.elapsed();
        s.ended = Some(Instant::now());
        s.latest = Some(counts.clone());
        Ok(counts)
    }

    /// Starts counting in the background unless it already is: after a
    /// pause as long as the last count took, and again while rounds ended
    /// during the count.
    pub fn refresh(self: &Arc<Self>) {
        {
            let mut s = lock(&self.state);
            if s.background {
                return;
            }
            s.background = true;
        }
        let this = self.clone();
        tokio::spawn(async move {
            loop {
                let pause = {
                    let s = lock(&this.state);
                    s.ended
                        .map(|e| (e + s.took).saturating_duration_since(Instant::now()))
                        .unwrap_or_default()
                };
                tokio::time::sleep(pause).await;
                let counted = this.count(Instant::now()).await;
                let mut s = lock(&this.state);
                if let Err(e) = &counted {
                    tracing::warn!(error = %e, "counting the store failed");
                }
                if counted.is_err() || !s.stale(this.rounds.ended()) {
                    s.background = false;
                    return;
                }
            }
        });
    }

    /// Counts in the background once now and after each round that ends,
    /// until `stop`.
    pub fn follow(self: &Arc<Self>, stop: CancellationToken) {
        let this = self.clone();
        let mut endings = self.rounds.endings();
        tokio::spawn(async move {
            this.refresh();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    changed = endings.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        this.refresh();
                    }
                }
            }
        });
    }
}
