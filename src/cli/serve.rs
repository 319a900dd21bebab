//! `proxywarden serve`: the daemon, stopped gracefully by the first SIGTERM
//! or Ctrl-C and at once by a second.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::{Signals, load};

/// Runs `serve`.
pub(super) async fn run(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (config, origin) = load(config_path)?;
    config.check_runtime_files(&origin.to_string())?;
    let listener = tokio::net::TcpListener::bind(config.api.listen)
        .await
        .with_context(|| format!("cannot listen on {} (api.listen)", config.api.listen))?;
    let gateway = if config.gateway.enabled {
        let addr = config.gateway.listen;
        Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (gateway.listen)"))?,
        )
    } else {
        None
    };
    tracing::info!(config = %origin, "starting");
    let shutdown = tokio_util::sync::CancellationToken::new();
    {
        let shutdown = shutdown.clone();
        let mut signals = Signals::new()?;
        tokio::spawn(async move {
            signals.next().await;
            shutdown.cancel();
            // A second signal: no more waiting for the graceful stop.
            signals.next().await;
            tracing::warn!("stopping at once on a second signal");
            std::process::exit(130);
        });
    }
    crate::daemon::run(config, listener, gateway, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
