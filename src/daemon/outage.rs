//! What the daemon's components share about a failure that goes on (no
//! judge answers, the disk refuses writes): it is logged at its first sign
//! and then once a minute with a count, and ends in one line when it
//! clears, so that a long outage is a handful of lines, not one per try.

use std::time::{Duration, Instant};

/// How often a failure that goes on is logged again.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(60);

/// A failure that may be going on: since when, how many signs of it, and
/// when it was last logged.
#[derive(Debug, Default)]
pub(super) struct Outage {
    since: Option<Instant>,
    logged: Option<Instant>,
    signs: u64,
}

/// What to say in a line about an outage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Told {
    /// How long it has lasted (whole seconds, at least one).
    pub lasted: Duration,
    /// Signs of it so far (failed attempts).
    pub signs: u64,
}

impl Told {
    /// `lasted` for people: `1m 5s`.
    pub fn lasted(&self) -> humantime::FormattedDuration {
        humantime::format_duration(self.lasted)
    }
}

impl Outage {
    /// One more sign of the failure. Returns what to log when a line is
    /// due: at the first sign, then once every [`LOG_EVERY`].
    pub fn note(&mut self) -> Option<Told> {
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        self.signs += 1;
        if self.logged.is_some_and(|at| at.elapsed() < LOG_EVERY) {
            return None;
        }
        self.logged = Some(now);
        Some(self.told(since))
    }

    /// The failure is over: what to say about it, if it was going on.
    pub fn end(&mut self) -> Option<Told> {
        let since = self.since.take()?;
        let told = self.told(since);
        self.logged = None;
        self.signs = 0;
        Some(told)
    }

    fn told(&self, since: Instant) -> Told {
        Told {
            lasted: Duration::from_secs(since.elapsed().as_secs().max(1)),
            signs: self.signs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_told_at_its_first_sign_then_once_a_minute_and_at_its_end() {
        let mut o = Outage::default();
        assert!(o.end().is_none(), "nothing to end");
        let first = o.note().expect("the first sign is told");
        assert_eq!(first.signs, 1);
        assert!(o.note().is_none() && o.note().is_none());
        // A minute on, the next sign is told with the count.
        o.logged = Some(Instant::now() - LOG_EVERY);
        assert_eq!(o.note().map(|t| t.signs), Some(4));
        assert!(o.note().is_none());
        assert_eq!(o.end().map(|t| t.signs), Some(5));
        assert!(o.end().is_none(), "ended once");
        assert!(o.note().is_some(), "a new outage is told again at once");
    }
}
