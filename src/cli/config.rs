//! `proxywarden config`: validate a config file or print the example.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;

use crate::config::{self, Config};

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config (from -c, the environment or ./proxywarden.toml)
    /// and name every problem; a PostgreSQL database is connected to.
    Check {
        /// Do not connect to a PostgreSQL database named by database.url.
        #[arg(long)]
        offline: bool,
    },
    /// Print the fully commented example config.
    Example,
}

/// Runs `config check` or `config example`.
pub(super) async fn run(
    config_path: Option<&Path>,
    command: ConfigCommand,
) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Example => {
            // Not print!, which panics on a closed pipe.
            std::io::stdout()
                .lock()
                .write_all(config::EXAMPLE.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check { offline } => {
            // The text and what would only fail later, files that cannot
            // be read, reported together.
            let (config, origin) = Config::discover_checked(config_path)?;
            // A server that cannot be reached, a database that is not
            // there or a login refused would only show at `serve`.
            if let (Some(url), false) = (&config.database.postgres, offline) {
                crate::store::Store::reach(url.as_str())
                    .await
                    .map_err(|e| anyhow::anyhow!("{origin}: database.url: {e}"))?;
            }
            let enabled = config.sources.iter().filter(|s| s.enabled).count();
            println!(
                "{origin}: ok ({} sources, {enabled} enabled; database {})",
                config.sources.len(),
                config.database.shown()
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}
