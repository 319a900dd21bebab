//! systemd's notify protocol: READY, STOPPING and watchdog pings. Outside
//! systemd every call is a no-op.

use tokio_util::sync::CancellationToken;

/// Sends `state` to systemd, if it is listening.
pub fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(state) {
        tracing::debug!(error = %e, "systemd notification failed");
    }
}

/// Pings the watchdog at half its interval until `stop`, when systemd
/// asked for a watchdog; returns at once otherwise.
pub async fn watchdog(stop: CancellationToken) {
    let Some(every) = sd_notify::watchdog_enabled() else {
        return;
    };
    let mut tick = tokio::time::interval(every / 2);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => notify(&[sd_notify::NotifyState::Watchdog]),
        }
    }
}
