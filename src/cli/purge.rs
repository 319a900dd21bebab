//! `proxywarden purge`: long-dead proxies no source lists any more.

use std::path::Path;
use std::process::ExitCode;

use super::{checkpoint, load, open_store};

/// Runs `purge`.
pub(super) async fn run(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (config, _) = load(config_path)?;
    let store = open_store(&config).await?;
    let purged = store
        .purge(crate::store::now_ms(), config.check.purge_after)
        .await?;
    checkpoint(&store).await;
    println!("purged {}", super::proxies(purged as u64));
    Ok(ExitCode::SUCCESS)
}
