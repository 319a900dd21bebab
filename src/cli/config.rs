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
    /// and name every problem.
    Check,
    /// Print the fully commented example config.
    Example,
}

/// Runs `config check` or `config example`.
pub(super) fn run(config_path: Option<&Path>, command: ConfigCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Example => {
            // Not print!, which panics on a closed pipe.
            std::io::stdout()
                .lock()
                .write_all(config::EXAMPLE.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check => {
            // The text and what would only fail later, files that cannot
            // be read, reported together.
            let (config, origin) = Config::discover_checked(config_path)?;
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
