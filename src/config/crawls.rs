//! `[crawls]`: the daemon's crawl jobs (`POST /crawls`): how many run at
//! once, how many pages and frontier URLs one may store, and how long
//! ended jobs are kept.

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
    /// URLs one job's frontier holds at most (and at most 10 per page it
    /// may fetch); more are counted as `frontier_full`, not stored.
    pub max_frontier: u64,
    /// Ended jobs kept at most, the newest; older ones are deleted with
    /// their pages.
    pub keep_ended: usize,
    /// How long an ended job is kept at most.
    pub keep_ended_for: std::time::Duration,
}

/// Validates `[crawls]`.
pub(super) fn read(s: &mut Section) -> Option<CrawlsConfig> {
    let max_running = s.int("max_running", 1, 64);
    let max_pages = s.int("max_pages", 1, 100_000_000);
    let max_queued = s.int("max_queued", 0, 100_000);
    let max_frontier = s.int("max_frontier", 1, 1_000_000_000);
    let keep_ended = s.int("keep_ended", 0, 1_000_000);
    let keep_ended_for = s.duration("keep_ended_for");
    // The ranges were checked, so the casts cannot truncate.
    Some(CrawlsConfig {
        max_running: max_running? as usize,
        max_pages: max_pages? as u64,
        max_queued: max_queued? as usize,
        max_frontier: max_frontier? as u64,
        keep_ended: keep_ended? as usize,
        keep_ended_for: keep_ended_for?,
    })
}
