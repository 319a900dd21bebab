//! systemd's notify protocol: READY, STOPPING, STATUS (what `systemctl
//! status` shows) and watchdog pings. Outside systemd every call is a no-op.

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

/// How often the status line is brought up to date.
const STATUS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The status line `systemctl status` shows: how many proxies are served.
pub fn status_line(served: usize) -> String {
    let plural = if served == 1 { "proxy" } else { "proxies" };
    format!("serving {served} {plural}")
}

/// Keeps systemd's status line (`STATUS=serving 336 proxies`) up to date
/// until `stop`, sending it when it changes; returns at once outside
/// systemd.
pub async fn status(index: crate::health::HealthIndex, stop: CancellationToken) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut sent = None;
    let mut tick = tokio::time::interval(STATUS_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {
                let served = index.len();
                if sent != Some(served) {
                    notify(&[sd_notify::NotifyState::Status(&status_line(served))]);
                    sent = Some(served);
                }
            }
        }
    }
}
