//! `[crawls]`: the daemon's crawl jobs (`POST /crawls`): how many run at
//! once and how many pages one may store.

use super::section::Section;

/// `[crawls]`
#[derive(Clone, Debug, PartialEq)]
pub struct CrawlsConfig {
    /// Jobs crawling at once; more wait, queued, for a turn.
    pub max_running: usize,
    /// Pages one job may fetch and store at most (its `max_pages` is
    /// capped at this and defaults to it).
    pub max_pages: u64,
    /// Jobs waiting for a turn at most; more submissions are refused.
    pub max_queued: usize,
}

/// Validates `[crawls]`.
pub(super) fn read(s: &mut Section) -> Option<CrawlsConfig> {
    let max_running = s.int("max_running", 1, 64);
    let max_pages = s.int("max_pages", 1, 100_000_000);
    let max_queued = s.int("max_queued", 0, 100_000);
    // The ranges were checked, so the casts cannot truncate.
    Some(CrawlsConfig {
        max_running: max_running? as usize,
        max_pages: max_pages? as u64,
        max_queued: max_queued? as usize,
    })
}
