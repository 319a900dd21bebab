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
}

/// Validates `[crawls]`.
pub(super) fn read(s: &mut Section) -> Option<CrawlsConfig> {
    let max_running = s.int("max_running", 1, 64);
    let max_pages = s.int("max_pages", 1, 100_000_000);
    Some(CrawlsConfig {
        max_running: max_running? as usize,
        max_pages: max_pages? as u64,
    })
}
