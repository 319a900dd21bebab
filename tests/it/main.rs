//! The integration tests, one test crate so the suite links once: a module
//! per area, all on the loopback servers and helpers of `tests/common`
//! (shared with the benches). One area runs alone with
//! `cargo test --test it gateway::`.

#[path = "../common/mod.rs"]
mod common;

mod api;
mod attacks;
mod browse;
mod check;
mod cli;
mod client_faults;
mod counts;
mod crawl;
mod crawl_jobs;
mod crawl_nodes;
mod daemon;
mod dashboard;
mod deadlines;
mod deploy;
mod differential;
mod disk_full;
mod fakes_selftest;
mod freshness;
mod gateway;
mod grafana;
mod guards;
mod guide;
mod harvest;
mod inputs_fuzz;
mod lists;
mod net;
mod nodes;
mod openapi;
mod operator_logs;
mod parsers_fuzz;
mod pg_faults;
mod pool;
mod reload;
mod rotation;
mod scale;
mod serving;
mod sites;
mod stop;
mod store;
mod verify;
