//! `[harvest]`: when and how sources are fetched, and [`Schedule`], the
//! cron expression parsed once at load.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::errors::CronError;
use croner::parser::{CronParser, Seconds};

use super::section::Section;

/// `[harvest]`
#[derive(Clone, Debug, PartialEq)]
pub struct HarvestConfig {
    /// When `serve` harvests.
    pub schedule: Schedule,
    /// User-Agent sent to sources.
    pub user_agent: String,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Total timeout per attempt.
    pub timeout: Duration,
    /// Largest body read, in bytes.
    pub max_body: u64,
    /// Most candidates kept per source.
    pub max_per_source: usize,
    /// Sources fetched at once.
    pub concurrency: usize,
    /// Extra attempts after transient failures.
    pub retries: u32,
    /// First retry delay; doubles.
    pub retry_backoff: Duration,
    /// How soon `serve` tries the sources that failed again; doubles while
    /// they keep failing, never later than the next scheduled harvest.
    pub failed_retry: Duration,
    /// Keep candidates on loopback, private, link-local and other
    /// non-public addresses, and follow a source's redirects to them (labs
    /// and test farms); off by default, as a public list is hostile.
    pub allow_private_addresses: bool,
}

/// A cron expression with seconds (sec min hour day-of-month month
/// day-of-week), validated and parsed once. The text is kept because
/// tokio-cron-scheduler takes the expression as text; times are UTC, as there.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    cron: Cron,
}

impl Schedule {
    /// Parses an expression the way tokio-cron-scheduler does (seconds
    /// required), so that what passes here also schedules there.
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

/// Validates `[harvest]`.
pub(super) fn read(h: &mut Section) -> Option<HarvestConfig> {
    let schedule = h.schedule("schedule");
    let user_agent = h
        .string("user_agent")
        .and_then(|ua| match header_text_problem(&ua) {
            None => Some(ua),
            Some(problem) => {
                h.problem("user_agent", &problem);
                None
            }
        });
    let connect_timeout = h.duration("connect_timeout");
    let timeout = h.duration("timeout");
    let max_body = h.size("max_body", 1024, 1 << 30);
    let max_per_source = h.int("max_per_source", 1, 10_000_000);
    let concurrency = h.int("concurrency", 1, 256);
    let retries = h.int("retries", 0, 10);
    let retry_backoff = h.duration("retry_backoff");
    let failed_retry = h.duration("failed_retry");
    let allow_private_addresses = h.boolean("allow_private_addresses");
    if let (Some(connect), Some(total)) = (connect_timeout, timeout)
        && connect > total
    {
        h.problem("connect_timeout", "must not be longer than harvest.timeout");
    }
    // Ranges were checked above, so the casts cannot truncate.
    Some(HarvestConfig {
        schedule: schedule?,
        user_agent: user_agent?,
        connect_timeout: connect_timeout?,
        timeout: timeout?,
        max_body: max_body?,
        max_per_source: max_per_source? as usize,
        concurrency: concurrency? as usize,
        retries: retries? as u32,
        retry_backoff: retry_backoff?,
        failed_retry: failed_retry?,
        allow_private_addresses: allow_private_addresses?,
    })
}

/// Why `text` cannot be sent as a header value, or `None`: it must be
/// printable ASCII, not blank. CR or LF would end the header (and let the
/// text add its own), NUL is refused by every HTTP library, and other
/// bytes are read differently by different servers.
pub(super) fn header_text_problem(text: &str) -> Option<String> {
    if text.trim().is_empty() {
        return Some("must not be blank".into());
    }
    let bad = text
        .chars()
        .find(|c| !(c.is_ascii_graphic() || *c == ' '))?;
    let name = match bad {
        '\r' => "a carriage return (CR)".to_owned(),
        '\n' => "a line feed (LF)".to_owned(),
        '\0' => "a NUL byte".to_owned(),
        c if c.is_control() => format!("the control character U+{:04X}", c as u32),
        c => format!("{c:?}, which is not ASCII"),
    };
    Some(format!(
        "must be printable ASCII text (it is sent as a header), found {name}"
    ))
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
    fn seconds_are_required_as_in_the_scheduler() {
        assert!(Schedule::parse("*/30 * * * *").is_err());
        assert!(Schedule::parse("every day").is_err());
    }
}
