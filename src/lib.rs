//! proxywarden keeps a pool of working free proxies: it harvests public
//! lists, checks every proxy, records the results in SQLite and serves the
//! ones that work.
//!
//! - [`proxy`]: proxy identity, schemes, anonymity, statuses, countries
//! - [`config`]: raw TOML → validated [`config::Config`]
//! - [`harvest`]: fetch sources with limits; parse text, HTML and JSON lists
//! - [`store`]: SQLite (WAL): migrations, batched upserts, queries
//! - [`export`]: stored proxies as txt, json or csv, written atomically
//! - [`tls`]: the one shared rustls client configuration
//! - [`cli`]: the clap command tree and each command's output

pub mod api;
pub mod check;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod export;
pub mod harvest;
pub mod proxy;
pub mod store;
pub mod tls;
