//! `[harvest]`: when and how sources are fetched.

use std::time::Duration;

use super::section::Section;

/// `[harvest]`
#[derive(Clone, Debug, PartialEq)]
pub struct HarvestConfig {
    /// Cron expression with seconds, already validated.
    pub schedule: String,
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
}

/// Validates `[harvest]`.
pub(super) fn read(h: &mut Section) -> HarvestConfig {
    let harvest = HarvestConfig {
        schedule: h
            .cron("schedule")
            .unwrap_or_else(|| "0 */30 * * * *".into()),
        user_agent: h
            .string("user_agent")
            .unwrap_or_else(|| "proxywarden/0.1".into()),
        connect_timeout: h
            .duration("connect_timeout")
            .unwrap_or(Duration::from_secs(5)),
        timeout: h.duration("timeout").unwrap_or(Duration::from_secs(30)),
        max_body: h
            .size("max_body", 1024, 1 << 30)
            .unwrap_or(10 * 1024 * 1024),
        max_per_source: h.int("max_per_source", 1, 10_000_000).unwrap_or(100_000) as usize,
        concurrency: h.int("concurrency", 1, 256).unwrap_or(8) as usize,
        retries: h.int("retries", 0, 10).unwrap_or(2) as u32,
        retry_backoff: h
            .duration("retry_backoff")
            .unwrap_or(Duration::from_secs(1)),
    };
    if harvest.connect_timeout > harvest.timeout {
        h.problem("connect_timeout", "must not be longer than harvest.timeout");
    }
    harvest
}
