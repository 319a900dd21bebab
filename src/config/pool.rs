//! `[pool]`: what holds for every client of the daemon's one fetch pool
//! together (the gateway, crawl jobs): how many requests one proxy carries
//! at once.

use super::section::Section;

/// `[pool]`
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// Requests and tunnels through one upstream proxy at once, for the
    /// gateway and every crawl job together.
    pub max_per_proxy: u32,
}

/// Validates `[pool]`.
pub(super) fn read(s: &mut Section) -> Option<PoolConfig> {
    let max_per_proxy = s.int("max_per_proxy", 1, 100_000);
    Some(PoolConfig {
        // The range was checked, so the cast cannot truncate.
        max_per_proxy: max_per_proxy? as u32,
    })
}
