//! The `proxywarden` binary: parse the command line, start logging, run.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use proxywarden::cli::{self, Cli, Command};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

/// How long work still running on the runtime's blocking threads (a parse,
/// a query nobody waits for) may hold up the exit once the command is done:
/// the daemon's own stop has had its time (see `daemon::run`).
const EXIT_GRACE: Duration = Duration::from_secs(1);

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon logs its rounds at info; one-shot commands print their own
    // results and only log problems.
    let serving = matches!(cli.command, Command::Serve);
    let base = match (cli.verbose, serving) {
        (0, false) => "warn",
        (0, true) | (1, _) => "info",
        _ => "debug",
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(cli::log_filter(base)));
    // Under systemd, journald adds its own timestamps and shows no colours.
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    // The daemon logs to stdout (journald's stream); commands keep stdout
    // for their results. `--help` says the same.
    let (writer, terminal) = if serving {
        (
            BoxMakeWriter::new(std::io::stdout),
            std::io::stdout().is_terminal(),
        )
    } else {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    };
    // Colours only for a person at a terminal, and never with NO_COLOR set
    // (https://no-color.org: any non-empty value).
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(terminal && !no_color && !journald);
    // `log.level` (at start and on a reload) swaps the filter, unless
    // RUST_LOG chose it.
    let reloadable = std::env::var_os("RUST_LOG").is_none();
    if journald {
        let builder = builder.without_time().with_filter_reloading();
        if reloadable {
            install_level(base, builder.reload_handle());
        }
        builder.init();
    } else {
        let builder = builder.with_filter_reloading();
        if reloadable {
            install_level(base, builder.reload_handle());
        }
        builder.init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = runtime.block_on(cli::run(cli));
    // Dropping the runtime would wait for every blocking task however long
    // it runs; the process ends instead (SQLite rolls back whatever was
    // not committed).
    runtime.shutdown_timeout(EXIT_GRACE);
    match result {
        Ok(code) => code,
        // `proxywarden stats | head -1`: the reader has all it wanted.
        Err(e) if cli::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Lets `log.level` swap the filter behind `handle`; `base` is the level
/// in force now.
fn install_level<S: 'static>(base: &str, handle: tracing_subscriber::reload::Handle<EnvFilter, S>) {
    proxywarden::log_level::install(base, move |level| {
        handle
            .reload(EnvFilter::new(cli::log_filter(level)))
            .map_err(|e| e.to_string())
    });
}
