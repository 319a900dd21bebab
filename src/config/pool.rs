//! `[pool]`: what holds for every client of the daemon's one fetch pool
//! together (the gateway, crawl jobs): how many requests one proxy carries
//! at once, how many sticky sessions are held.

use super::section::Section;

/// `[pool]`
#[derive(Clone, Debug, PartialEq)]
pub struct PoolConfig {
    /// Requests and tunnels through one upstream proxy at once, for the
    /// gateway and every crawl job together.
    pub max_per_proxy: u32,
    /// Sticky sessions held at once; a new one beyond it evicts the
    /// oldest.
    pub max_sessions: usize,
}

/// Validates `[pool]`.
pub(super) fn read(s: &mut Section) -> Option<PoolConfig> {
    let max_per_proxy = s.int("max_per_proxy", 1, 100_000);
    let max_sessions = s.int("max_sessions", 1, 10_000_000);
    Some(PoolConfig {
        // The ranges were checked, so the casts cannot truncate.
        max_per_proxy: max_per_proxy? as u32,
        max_sessions: max_sessions? as usize,
    })
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn the_cap_per_proxy_is_the_pools_and_the_old_key_names_it() {
        let config = Config::from_toml("[pool]\nmax_per_proxy = 2\n", "t.toml").unwrap();
        assert_eq!(config.pool.max_per_proxy, 2);
        assert_eq!(
            Config::from_toml("", "t.toml").unwrap().pool.max_per_proxy,
            32
        );
        let err = Config::from_toml("[gateway]\nmax_per_proxy = 2\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gateway.max_per_proxy") && err.contains("pool.max_per_proxy"),
            "{err}"
        );
        let err = Config::from_toml("[pool]\nmax_per_proxy = 0\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool.max_per_proxy"), "{err}");
    }

    #[test]
    fn the_sessions_table_has_a_configurable_cap() {
        let config = Config::from_toml("[pool]\nmax_sessions = 3\n", "t.toml").unwrap();
        assert_eq!(config.pool.max_sessions, 3);
        assert_eq!(
            Config::from_toml("", "t.toml").unwrap().pool.max_sessions,
            100_000
        );
        let err = Config::from_toml("[pool]\nmax_sessions = 0\n", "t.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("pool.max_sessions"), "{err}");
    }
}
