//! `[harvest]`: when and how sources are fetched.

use std::time::Duration;

use super::schedule::Schedule;
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
