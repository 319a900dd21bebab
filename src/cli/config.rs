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
            let problems = problems(&config);
            if !problems.is_empty() {
                for problem in &problems {
                    eprintln!("{origin}: {problem}");
                }
                return Ok(ExitCode::from(1));
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

/// What the text cannot show but would leave `serve` storing nothing: a
/// database folder that does not exist, and enabled sources that are all
/// on addresses the harvest refuses.
fn problems(config: &Config) -> Vec<String> {
    let mut problems = Vec::new();
    if config.database.postgres.is_none() {
        let path = &config.database.path;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir.filter(|d| !d.is_dir()) {
            problems.push(format!(
                "database.path: the folder {} does not exist (create it, or set database.path)",
                dir.display()
            ));
        }
    }
    if !config.harvest.allow_private_addresses {
        let enabled: Vec<&config::SourceConfig> =
            config.sources.iter().filter(|s| s.enabled).collect();
        let refused: Vec<String> = enabled
            .iter()
            .filter_map(|s| match &s.location {
                config::SourceLocation::Http(url) => {
                    let url = url::Url::parse(&url.replace("{page}", "1")).ok()?;
                    let kind = crate::harvest::fetch::private_host(&url)?;
                    Some(format!("{} ({kind})", s.name))
                }
                config::SourceLocation::File(_) => None,
            })
            .collect();
        if !enabled.is_empty() && refused.len() == enabled.len() {
            problems.push(format!(
                "every enabled source is on an address the harvest refuses: {}; \
                 harvest.allow_private_addresses = true allows them",
                refused.join(", ")
            ));
        }
    }
    problems
}
