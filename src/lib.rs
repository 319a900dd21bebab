//! proxywarden keeps a pool of working free proxies: it harvests public
//! lists, checks every proxy, records the results in SQLite and serves the
//! ones that work.
//!
//! - [`proxy`]: proxy identity, schemes, anonymity, statuses, countries
//! - [`harvest`]: fetch sources with limits and parse text, HTML and JSON lists
//! - [`config`]: raw TOML → validated [`config::Config`]
//! - [`store`]: SQLite (WAL): migrations, upserts, queries, source records
//! - [`export`]: stored proxies as txt, json or csv
//! - [`cli`]: the clap command tree and each command's output

pub mod harvest;
pub mod proxy;
