//! proxywarden keeps a pool of working free proxies: it harvests public
//! lists, checks every proxy, records the results in its store (SQLite, or
//! PostgreSQL for several nodes) and serves the ones that work.
//! `ARCHITECTURE.md` is the map: the paths through these modules and where
//! to add a source format, a strategy or a store backend.
//!
//! Modules, lowest first; a module imports only from those above it here:
//!
//! - [`proxy`]: proxy identity, schemes, anonymity, statuses, countries
//! - [`model`]: the shared vocabulary: candidates and hints, outcomes, failure reasons, re-check policy, strategy and scope kinds
//! - [`auth`]: failed authentications per client address, one limiter for every token
//! - [`config`]: raw TOML over the example's defaults → validated [`config::Config`]
//! - [`html`]: bounded HTML parsing (nesting depth and time caps) shared by harvest and crawl
//! - [`net`]: the dialer: a stream to host:port directly or through any proxy; TLS setup
//! - [`store`]: the durable record behind one surface: SQLite (embedded default; WAL, one writer thread) or PostgreSQL (several nodes, leases), migrations per backend, listings, what sites taught, crawl jobs and frontiers
//! - [`health`]: the in-memory index of servable proxies, the filters' values, selection, the one feedback path with the (proxy, site) records
//! - [`harvest`]: fetch sources with limits (gzip recognised by its bytes); parse text, HTML, JSON and regex lists
//! - [`check`]: probes per scheme over the dialer, judges, anonymity, the batched check round
//! - [`pool`]: fetch through proxies, one pool per process with a client per user: strategies, sticky sessions, caps with a line, cooldowns, bans, per-site pacing, retries
//! - [`crawl`]: the polite crawler: frontier through the store, per-host politeness, robots.txt, extraction, output
//! - [`gateway`]: the local rotating forward proxy: HTTP (absolute-form, CONNECT) and SOCKS5 on one port, through the pool
//! - [`export`]: proxies as txt, json or csv, files written atomically
//! - [`api`]: the axum router: serving, listings, reports, metrics, health and what is degraded, the judge, the dashboard, the OpenAPI document; bounded connections
//! - [`daemon`]: the composition root ([`daemon::Service`] builds the shared parts) and `serve`: the API, check loop, harvests, purge, the watch on store writes and watchdog as components on one task tracker
//! - [`cli`]: the clap command tree, a file per command with its options and output

pub mod api;
pub mod auth;
pub mod check;
pub mod cli;
pub mod config;
pub mod crawl;
pub mod daemon;
pub mod export;
pub mod gateway;
#[cfg(test)]
mod growth;
pub mod harvest;
pub mod health;
pub mod html;
pub mod log_level;
pub mod model;
pub mod net;
pub mod pool;
pub mod proxy;
pub mod store;

/// The version `--version` prints: the package version and the commit the
/// binary was built from (`unknown` when built outside a git checkout).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("PROXYWARDEN_COMMIT"),
    ")"
);

/// Locks `m`. A poisoned lock only means a panic elsewhere: every mutex in
/// the crate guards state that stays sound between statements, so it is
/// used as it is.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
