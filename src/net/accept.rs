//! Accepting connections on a listener until shutdown, for the servers
//! (the API and the gateway).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// How long to wait before accepting again after `accept` failed (out of
/// file descriptors, typically), instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The next connection on `listener`, or `None` once `shutdown` is
/// cancelled. A failed accept is logged (naming `what` is accepted) and
/// tried again after a short pause.
pub async fn accept(
    listener: &TcpListener,
    shutdown: &CancellationToken,
    what: &str,
) -> Option<(TcpStream, SocketAddr)> {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(a) => return Some(a),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot accept {what} connection");
                    tokio::select! {
                        _ = shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                    }
                }
            },
        }
    }
}
