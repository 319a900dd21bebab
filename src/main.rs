//! The `proxywarden` binary: parse the command line, start logging, run.

use std::process::ExitCode;

use clap::Parser;
use proxywarden::cli::{self, Cli, Command};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::BoxMakeWriter;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The daemon logs its rounds at info; one-shot commands print their own
    // results and only log problems.
    let serving = matches!(cli.command, Command::Serve);
    let base = match (cli.verbose, serving) {
        (0, false) => "warn",
        (0, true) | (1, _) => "info",
        _ => "debug",
    };
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new(format!("proxywarden={base},warn")));
    // Under systemd, journald adds its own timestamps and shows no colours.
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    // The daemon logs to stdout (journald's stream); commands keep stdout
    // for their results.
    let writer = if serving {
        BoxMakeWriter::new(std::io::stdout)
    } else {
        BoxMakeWriter::new(std::io::stderr)
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(!journald);
    if journald {
        builder.without_time().init();
    } else {
        builder.init();
    }
    match cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}
