//! What the daemon's rounds last did, written by the harvest and check
//! components and read by `/stats`, `/proxy`'s empty answers and the
//! dashboard.

use std::sync::{Arc, Mutex};

use super::dashboard::RoundHistory;
use super::{CheckInfo, Rounds};
use crate::lock;

/// The last harvest and check rounds, and the latest check rounds for the
/// dashboard's chart. Cheap to clone.
#[derive(Clone, Debug)]
pub struct LastRounds {
    last: Arc<Mutex<Rounds>>,
    checks: Arc<Mutex<RoundHistory>>,
    /// How many rounds (harvests, check rounds, purges) have ended: what
    /// the counts follow.
    ended: Arc<tokio::sync::watch::Sender<u64>>,
}

impl Default for LastRounds {
    fn default() -> LastRounds {
        LastRounds {
            last: Arc::default(),
            checks: Arc::default(),
            ended: Arc::new(tokio::sync::watch::Sender::new(0)),
        }
    }
}

impl LastRounds {
    /// Notes that a purge ended: the stored counts changed.
    pub fn purged(&self) {
        self.ended.send_modify(|n| *n += 1);
    }

    /// How many rounds have ended.
    pub(crate) fn ended(&self) -> u64 {
        *self.ended.borrow()
    }

    /// Wakes when a round ends.
    pub(crate) fn endings(&self) -> tokio::sync::watch::Receiver<u64> {
        self.ended.subscribe()
    }

    /// Records what a round did.
    pub fn record(&self, update: impl FnOnce(&mut Rounds)) {
        let finished = {
            let mut rounds = lock(&self.last);
            let before = rounds.last_check.as_ref().map(|c| c.finished_at.clone());
            update(&mut rounds);
            // A check round that finished is kept for the dashboard's chart.
            rounds
                .last_check
                .clone()
                .filter(|c| Some(&c.finished_at) != before.as_ref())
        };
        if let Some(round) = finished {
            lock(&self.checks).push(round);
        }
        self.ended.send_modify(|n| *n += 1);
    }

    /// The last rounds.
    pub fn last(&self) -> Rounds {
        lock(&self.last).clone()
    }

    /// The latest check rounds, oldest first.
    pub(crate) fn checks(&self) -> Vec<CheckInfo> {
        lock(&self.checks).to_vec()
    }
}
