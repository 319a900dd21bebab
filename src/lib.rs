//! proxywarden keeps a pool of working free proxies: it harvests public
//! lists, checks every proxy, records the results in SQLite and serves the
//! ones that work.
//!
//! - [`proxy`]: proxy identity, schemes, anonymity, statuses, countries
//! - [`model`]: the shared vocabulary: candidates and hints, outcomes, failure reasons, re-check policy
//! - [`config`]: raw TOML → validated [`config::Config`]
//! - [`net`]: the dialer: a stream to host:port directly or through any proxy; TLS setup
//! - [`harvest`]: fetch sources with limits; parse text, HTML and JSON lists
//! - [`check`]: probes per scheme, judges, anonymity, the batched check round
//! - [`store`]: SQLite (WAL): migrations, upserts, check results, listings
//! - [`health`]: the in-memory index of servable proxies, selection, the one feedback path
//! - [`pool`]: fetch through proxies: strategies, sticky sessions, cooldowns, bans, retries
//! - [`crawl`]: the polite crawler: frontier in SQLite, per-host politeness, robots.txt, extraction, output
//! - [`api`]: the axum router: serving, listings, reports, metrics, the judge
//! - [`export`]: proxies as txt, json or csv, files written atomically
//! - [`daemon`]: `serve`: scheduler, check loop, API and shutdown wired together
//! - [`cli`]: the clap command tree and each command's output

pub mod api;
pub mod check;
pub mod cli;
pub mod config;
pub mod crawl;
pub mod daemon;
pub mod export;
pub mod harvest;
pub mod health;
pub mod model;
pub mod net;
pub mod pool;
pub mod proxy;
pub mod store;
