//! What the daemon's rounds last did, written by the harvest and check
//! components and read by `/stats`, `/proxy`'s empty answers and the
//! dashboard.

use std::sync::{Arc, Mutex};

use super::dashboard::RoundHistory;
use super::{CheckInfo, Rounds};
use crate::lock;

/// The last harvest and check rounds, and the latest check rounds for the
/// dashboard's chart. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct LastRounds {
    last: Arc<Mutex<Rounds>>,
    checks: Arc<Mutex<RoundHistory>>,
}

impl LastRounds {
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
