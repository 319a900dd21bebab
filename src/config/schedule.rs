//! [`Schedule`]: a cron expression with seconds, parsed once at load.

use std::fmt;
use std::time::Duration;

use chrono::SubsecRound;
use chrono::{DateTime, Utc};
use croner::Cron;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds};

/// A cron expression with seconds (sec min hour day-of-month month
/// day-of-week), validated and parsed once; times are UTC. The daemon's
/// cron fires from this parsed form, so what passes `config check` is what
/// runs.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    cron: Cron,
}

impl Schedule {
    /// Parses an expression with seconds required.
    pub fn parse(text: &str) -> Result<Schedule, CronError> {
        let cron = CronParser::builder()
            .seconds(Seconds::Required)
            .build()
            .parse(text)?;
        Ok(Schedule {
            text: text.to_owned(),
            cron,
        })
    }

    /// The expression as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The first run strictly after `after`; `None` if the expression never
    /// matches again (e.g. February 30th).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&after, false).ok()
    }

    /// The slot `at` falls in: the latest run at or before `at`, if any in
    /// the last 400 days. Nodes that fire for one run a little apart
    /// agree on it, which makes it a key for claiming that run.
    pub fn slot_at(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        const LOOKBACK_SECS: [i64; 7] = [1, 10, 60, 600, 3600, 86_400, 400 * 86_400];
        // Runs fall on whole seconds; the search keeps the fraction of
        // where it starts.
        let at = at.trunc_subsecs(0);
        let mut found = LOOKBACK_SECS.iter().find_map(|back| {
            self.next_after(at - chrono::TimeDelta::seconds(*back))
                .filter(|run| *run <= at)
        })?;
        // Found within a lookback at most ten times the step before it:
        // few runs to walk forward.
        while let Some(run) = self.next_after(found).filter(|run| *run <= at) {
            found = run;
        }
        Some(found)
    }

    /// The run nearest to `at`, before or after: what a trigger fired at
    /// `at` is for. A trigger fires a moment late (and a node whose clock
    /// runs ahead fires early), so nodes firing for one run agree on it either way.
    pub fn nearest_run(&self, at: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let before = self.slot_at(at);
        let after = self.next_after(at.trunc_subsecs(0));
        match (before, after) {
            (Some(b), Some(a)) => Some(if a - at < at - b { a } else { b }),
            (b, a) => b.or(a),
        }
    }

    /// The time between the first two runs after `after`: how long a source
    /// may go without a harvest before it is overdue. Irregular schedules
    /// (`0 0 9,17 * * *`) give the gap that follows `after`.
    pub fn interval_after(&self, after: DateTime<Utc>) -> Option<Duration> {
        let first = self.next_after(after)?;
        let second = self.next_after(first)?;
        (second - first).to_std().ok()
    }
}

/// Two schedules are equal when written the same: the parsed form follows
/// from the text.
impl PartialEq for Schedule {
    fn eq(&self, other: &Schedule) -> bool {
        self.text == other.text
    }
}

impl Eq for Schedule {}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2025, 3, 10, h, m, s).unwrap()
    }

    #[test]
    fn interval_between_consecutive_runs() {
        let every_half_hour = Schedule::parse("0 */30 * * * *").unwrap();
        assert_eq!(every_half_hour.as_str(), "0 */30 * * * *");
        assert_eq!(
            every_half_hour.next_after(at(10, 0, 0)),
            Some(at(10, 30, 0))
        );
        let half_hour = Some(Duration::from_secs(30 * 60));
        assert_eq!(every_half_hour.interval_after(at(10, 0, 0)), half_hour);
        assert_eq!(every_half_hour.interval_after(at(10, 17, 42)), half_hour);

        // Irregular: the gap that follows the given time.
        let twice_a_day = Schedule::parse("0 0 9,17 * * *").unwrap();
        let hours = |h: u64| Some(Duration::from_secs(h * 3600));
        assert_eq!(twice_a_day.interval_after(at(8, 0, 0)), hours(8));
        assert_eq!(twice_a_day.interval_after(at(12, 0, 0)), hours(16));
    }

    #[test]
    fn a_slot_is_the_latest_run_at_or_before_a_moment() {
        let s = Schedule::parse("0 */30 * * * *").unwrap();
        assert_eq!(s.slot_at(at(10, 30, 0)), Some(at(10, 30, 0)));
        assert_eq!(s.slot_at(at(10, 30, 2)), Some(at(10, 30, 0)));
        assert_eq!(s.slot_at(at(10, 59, 59)), Some(at(10, 30, 0)));
        let every_2s = Schedule::parse("*/2 * * * * *").unwrap();
        assert_eq!(every_2s.slot_at(at(10, 0, 3)), Some(at(10, 0, 2)));
        // A trigger fired a moment early is for the run it precedes.
        let late_or_early = |h, m, s, ms| at(h, m, s) + chrono::TimeDelta::milliseconds(ms);
        assert_eq!(
            every_2s.nearest_run(late_or_early(10, 0, 1, 998)),
            Some(at(10, 0, 2))
        );
        assert_eq!(
            every_2s.nearest_run(late_or_early(10, 0, 2, 40)),
            Some(at(10, 0, 2))
        );
        assert_eq!(
            every_2s.slot_at(late_or_early(10, 0, 3, 500)),
            Some(at(10, 0, 2))
        );
        let never = Schedule::parse("0 0 0 30 2 *").unwrap();
        assert_eq!(never.slot_at(at(10, 0, 0)), None);
    }

    #[test]
    fn seconds_are_required() {
        assert!(Schedule::parse("*/30 * * * *").is_err());
        assert!(Schedule::parse("every day").is_err());
    }
}
