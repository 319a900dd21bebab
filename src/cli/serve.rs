//! `proxywarden serve`: the daemon, stopped gracefully by the first SIGTERM
//! or Ctrl-C and at once by a second; SIGHUP reads the config file again
//! (`systemctl reload`).

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;

use super::{Signals, load};

/// Runs `serve`.
pub(super) async fn run(config_path: Option<&Path>) -> anyhow::Result<ExitCode> {
    let (config, origin) = load(config_path)?;
    if config.log.level.is_some()
        && let Err(e) = crate::log_level::set(config.log.level.as_deref())
    {
        tracing::error!(error = %e, "cannot change the log level");
    }
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
    let (reload_tx, reloads) = tokio::sync::mpsc::channel(1);
    reload_on_hangup(config_path.map(Path::to_path_buf), reload_tx)?;
    crate::daemon::run_reloading(config, listener, gateway, shutdown, reloads).await?;
    Ok(ExitCode::SUCCESS)
}

/// On each SIGHUP reads the config file again, as at start-up, and hands a
/// valid one to the daemon. A file with errors is refused: every error is
/// logged, and the running config stays.
fn reload_on_hangup(
    explicit: Option<std::path::PathBuf>,
    reloads: tokio::sync::mpsc::Sender<crate::config::Config>,
) -> anyhow::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut hangups = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                let read = load(explicit.as_deref()).and_then(|(config, origin)| {
                    config.check_runtime_files(&origin.to_string())?;
                    Ok((config, origin))
                });
                match read {
                    Ok((config, origin)) => {
                        tracing::info!(config = %origin, "SIGHUP: reading the config again");
                        if reloads.send(config).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => refused(&e),
                }
            }
        });
    }
    #[cfg(not(unix))]
    drop((explicit, reloads));
    Ok(())
}

/// Logs why a reload was refused: each problem of the file on a line.
fn refused(e: &anyhow::Error) {
    match e.downcast_ref::<crate::config::ConfigError>() {
        Some(c) => {
            for problem in &c.problems {
                tracing::error!(file = %c.file, "{problem}");
            }
            tracing::error!(
                file = %c.file,
                problems = c.problems.len(),
                "config reload refused; the running config is kept"
            );
        }
        None => tracing::error!(
            error = format!("{e:#}"),
            "config reload refused; the running config is kept"
        ),
    }
}
