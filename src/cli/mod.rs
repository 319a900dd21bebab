//! The command tree: a file per command, each with its options and what it
//! prints. Commands return an exit code; errors carry context for the user
//! and are printed by `main`.

mod check;
mod check_list;
mod config;
mod crawl;
mod export;
mod harvest;
mod man;
mod purge;
mod serve;
mod stats;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

pub use check::{CheckArgs, print_check_summary, rate_text};
pub use check::{ListArgs, ListFormat, ListScheme};
pub use config::ConfigCommand;
pub use crawl::{CrawlArgs, NoProxyArg};
pub use export::{ExportArgs, ExportFormat, StatusFilter};
pub use harvest::{HarvestArgs, print_harvest, progress_line};
pub use stats::{StatsArgs, print_stats};

use crate::config::{Config, ConfigOrigin};
use crate::health::filters;
use crate::proxy::{Country, Scheme};
use crate::store::Store;

/// Keeps a pool of working free proxies.
#[derive(Debug, Parser)]
#[command(name = "proxywarden", version = crate::VERSION, about)]
pub struct Cli {
    /// Config file (else $PROXYWARDEN_CONFIG, else ./proxywarden.toml, else
    /// built-in defaults).
    #[arg(short, long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// More log output (-v info, -vv debug; RUST_LOG overrides). Logs go to
    /// stderr, except for `serve`, which logs to stdout (for journald).
    /// Colours only on a terminal and never with NO_COLOR set.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: scheduled harvests, continuous checks and the HTTP API.
    Serve,
    /// Fetch every enabled source once and store what they list.
    Harvest(HarvestArgs),
    /// Check the due proxies once (or all of them, or a list given by hand
    /// with --list) against the judges.
    Check(CheckArgs),
    /// Delete proxies dead for longer than check.purge_after that no source lists any more.
    Purge,
    /// Counts by status, scheme, country and source.
    Stats(StatsArgs),
    /// Write the stored proxies as txt, json or csv.
    Export(ExportArgs),
    /// Crawl a site through the alive proxies, politely, as JSON lines.
    // Later options win, so a resumed crawl's stored command line can be
    // followed by today's changes.
    #[command(args_override_self = true)]
    Crawl(Box<CrawlArgs>),
    /// Validate a config file or print the example.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script (e.g. `proxywarden completions bash >
    /// /etc/bash_completion.d/proxywarden`).
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, in roff (`proxywarden man | man -l -`).
    Man,
}
fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    crate::config::parse_duration(s)
}
/// The proxy filters `export` and `crawl` share, as the API's.
#[derive(Debug, Args)]
pub struct ProxyFilterArgs {
    /// Only proxies in these countries (comma-separated ISO codes).
    #[arg(long, value_delimiter = ',', value_parser = filter(filters::country))]
    pub country: Vec<Country>,
    /// Only these schemes (comma-separated: http, socks4, socks5).
    #[arg(long, value_delimiter = ',', value_parser = filter(filters::scheme))]
    pub scheme: Vec<Scheme>,
    /// At least this anonymous (transparent < anonymous < elite).
    #[arg(long, value_parser = filter(filters::anonymity))]
    pub anonymity: Option<crate::proxy::Anonymity>,
    /// Only proxies that tunnel HTTPS.
    #[arg(long)]
    pub https: bool,
    /// Only proxies at most this slow.
    #[arg(long, value_name = "MS", value_parser = filter(filters::max_latency_ms))]
    pub max_latency_ms: Option<i64>,
    /// Alive proxies whose last passed check is at most this old (default:
    /// api.max_age, as the API serves them).
    #[arg(long, value_name = "DURATION", value_parser = filter(filters::max_age))]
    pub max_age: Option<std::time::Duration>,
}

impl ProxyFilterArgs {
    /// The query these flags ask for, `default_max_age` unless one is given.
    fn query(&self, default_max_age: std::time::Duration) -> crate::health::ProxyQuery {
        crate::health::ProxyQuery {
            countries: self.country.clone(),
            schemes: self.scheme.clone(),
            min_anonymity: self.anonymity,
            https: self.https,
            max_latency_ms: self.max_latency_ms,
            max_age: Some(self.max_age.unwrap_or(default_max_age)),
            ..Default::default()
        }
    }
}
/// A proxy filter's value read as the API reads it (see
/// [`filters`](crate::health::filters)).
fn filter<T>(
    read: fn(&str) -> Result<T, &'static str>,
) -> impl Fn(&str) -> Result<T, String> + Clone {
    move |s| read(s).map_err(|expected| format!("expected {expected}"))
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let config_path = cli.config.as_deref();
    match cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "proxywarden", &mut out);
            // Not print!, which panics on a closed pipe.
            std::io::stdout().lock().write_all(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut out = Vec::new();
            man::render(<Cli as clap::CommandFactory>::command(), &mut out)?;
            std::io::stdout().lock().write_all(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(command) => config::run(config_path, command).await,
        Command::Harvest(args) => harvest::run(config_path, args).await,
        Command::Serve => serve::run(config_path).await,
        // `check --list FILE` checks a list given by hand; `check` alone
        // the stored proxies.
        Command::Check(args) => match args.list.list.clone() {
            Some(list) => check_list::run(config_path, args, &list).await,
            None => check::run(config_path, args).await,
        },
        Command::Crawl(args) => crawl::run(config_path, *args).await,
        Command::Purge => purge::run(config_path).await,
        Command::Stats(args) => stats::run(config_path, args).await,
        Command::Export(args) => export::run(config_path, args).await,
    }
}

/// SIGTERM (systemd stop, `kill`) and SIGINT (Ctrl-C), listened to from
/// the start so that none is missed between two waits.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next SIGTERM or SIGINT.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// True when `e` comes from writing to a pipe whose reader has gone
/// (`stats | head -1`): the command ends quietly with status 0. Looks
/// through the cause chain, as writers such as csv wrap the I/O error.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|cause| {
        if let Some(j) = cause.downcast_ref::<serde_json::Error>() {
            return j.io_error_kind() == Some(BrokenPipe);
        }
        let Some(io) = cause.downcast_ref::<std::io::Error>() else {
            return false;
        };
        let csv = io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<csv::Error>())
            .is_some_and(|c| matches!(c.kind(), csv::ErrorKind::Io(e) if e.kind() == BrokenPipe));
        io.kind() == BrokenPipe || csv
    })
}

fn load(explicit: Option<&Path>) -> anyhow::Result<(Config, ConfigOrigin)> {
    Ok(Config::discover(explicit)?)
}

async fn open_store(config: &Config) -> anyhow::Result<Store> {
    Ok(Store::open_configured(&config.database).await?)
}

/// Leaves every commit in the database file itself before the command
/// exits, rather than in the write-ahead log beside it: a copy of the file
/// alone (a backup, a move) then holds everything (see
/// [`Store::checkpoint`]).
async fn checkpoint(store: &Store) {
    match store.checkpoint().await {
        Ok(true) => {}
        Ok(false) => tracing::debug!("another process is reading; part of the log stays"),
        Err(e) => tracing::warn!(error = %e, "cannot copy the write-ahead log into the database"),
    }
}

/// What to do when the database refused a write of `kind`: make room for
/// the SQLite file or on the PostgreSQL server (named without its
/// password), or bring that server back when it could not be reached.
fn free_space(store: &Store, kind: crate::store::WriteFailure) -> String {
    if kind == crate::store::WriteFailure::Unreachable {
        format!(
            "make the PostgreSQL server of {} reachable",
            store.path().display()
        )
    } else if store.is_shared() {
        format!(
            "free space on the PostgreSQL server of {}",
            store.path().display()
        )
    } else {
        format!("free space for {}", store.path().display())
    }
}

/// The log filter without `RUST_LOG`: proxywarden's own lines from
/// `level`, other crates' warnings. html5ever's tree builder warns about
/// markup it repairs ("foster parenting not implemented"): a parser's
/// notes on a page, not the operator's concern, so only its errors show.
pub fn log_filter(level: &str) -> String {
    format!("proxywarden={level},html5ever=error,warn")
}

/// `n proxies`, or `1 proxy`.
pub(crate) fn proxies(n: u64) -> String {
    if n == 1 {
        "1 proxy".into()
    } else {
        format!("{n} proxies")
    }
}

/// The width of a SOURCE column holding `names`.
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(str::len).max().unwrap_or(0).max("SOURCE".len())
}

#[cfg(test)]
mod log_tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn html5ever_warnings_stay_out_of_the_log() {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(super::log_filter(
                "info",
            )))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "html5ever::tree_builder", "foster parenting not implemented");
            tracing::warn!(target: "hyper::proto", "another crate warns");
            tracing::info!(target: "proxywarden::harvest", "our own line");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        assert!(!text.contains("foster parenting"), "{text}");
        assert!(
            text.contains("another crate warns") && text.contains("our own line"),
            "{text}"
        );
    }
}
