//! The gateway: a local forward proxy on one port that speaks HTTP
//! (absolute-form requests and CONNECT) and SOCKS5, told apart by the first
//! byte, and sends everything out through proxies the pool picks. It never
//! connects to a client's target itself and never looks inside TLS.

mod controls;
mod forward;
mod head;
mod http;
mod metrics;
mod rewrite;
mod slots;
mod socks;
mod tunnel;
mod upload;

pub use controls::{ControlError, Controls, HEADER_PREFIX, admits, basic_credentials};
pub use metrics::{GatewayMetrics, GatewayStats};

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::AuthFailures;
use crate::config::{GatewayConfig, Secret};
use crate::health::ProxyQuery;
use crate::pool::{NoProxy, Pool, PoolError, PoolOptions};
use slots::{Full, Slot, Slots};

/// How long connections may take to finish after shutdown begins.
const DRAIN: Duration = Duration::from_secs(3);

/// Connections over a cap being answered at once; more are closed
/// without an answer.
const MAX_REFUSING: usize = 64;

/// How long a refused connection is given to say which protocol it
/// speaks, and then to read its answer.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// The gateway's settings, from `[gateway]`.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The password clients must give, if any.
    pub token: Option<Secret>,
    /// Other proxies a request or tunnel set-up moves on to.
    pub retries: u32,
    /// Bodies up to this size are held for a retry.
    pub retry_body_max: usize,
    /// TCP connect to an upstream proxy.
    pub connect_timeout: Duration,
    /// From the upstream connection to its answer's head.
    pub timeout: Duration,
    /// For a request head or a SOCKS handshake, and between requests.
    pub header_timeout: Duration,
    /// A quiet tunnel is closed after this.
    pub idle_timeout: Duration,
    /// Open client connections at most.
    pub max_connections: usize,
    /// Open client connections from one address at most.
    pub max_connections_per_ip: usize,
    /// The largest request head.
    pub max_header_size: usize,
    /// The filters every pick starts from (freshness).
    pub base: ProxyQuery,
}

impl Settings {
    /// From `[gateway]`; proxies served must have passed a check within
    /// `max_age` (the API's `max_age`).
    pub fn new(g: &GatewayConfig, max_age: Duration) -> Settings {
        Settings {
            token: g.token.clone(),
            retries: g.retries,
            retry_body_max: g.retry_body_max,
            connect_timeout: g.connect_timeout,
            timeout: g.timeout,
            header_timeout: g.header_timeout,
            idle_timeout: g.idle_timeout,
            max_connections: g.max_connections,
            max_connections_per_ip: g.max_connections_per_ip,
            max_header_size: g.max_header_size,
            base: ProxyQuery {
                max_age: Some(max_age),
                ..ProxyQuery::default()
            },
        }
    }
}

struct Inner {
    pool: Pool,
    settings: Settings,
    metrics: Arc<GatewayMetrics>,
    /// Wrong tokens per client address.
    auth: Arc<AuthFailures>,
}

/// A cheap, cloneable handle to the gateway: its pool, settings and
/// metrics.
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("settings", &self.inner.settings)
            .finish()
    }
}

impl Gateway {
    /// A gateway that is a client of `pool` (the daemon's one pool, whose
    /// caps, cooldowns and bans it shares with crawl jobs), configured by
    /// `[gateway]`.
    pub fn new(
        pool: &Pool,
        config: &GatewayConfig,
        max_age: Duration,
    ) -> Result<Gateway, PoolError> {
        Gateway::sharing_auth(pool, config, max_age, Arc::default())
    }

    /// [`Gateway::new`], counting wrong tokens in `auth` (the API's, in
    /// `serve`: one limiter for every token).
    pub fn sharing_auth(
        pool: &Pool,
        config: &GatewayConfig,
        max_age: Duration,
        auth: Arc<AuthFailures>,
    ) -> Result<Gateway, PoolError> {
        let settings = Settings::new(config, max_age);
        let opts = PoolOptions {
            query: settings.base.clone(),
            strategy: config.strategy,
            connect_timeout: config.connect_timeout,
            first_byte_timeout: config.timeout,
            total_timeout: config.timeout,
            rotations: config.retries,
            // A client waiting on a proxy setting wants an answer soon: it
            // waits its turn while the proxies are busy, and with none that
            // can take it gets a 503 at once, never a direct connection.
            no_proxy: NoProxy::Queue(config.queue_wait),
            // A session keeps its proxy until it fails or expires.
            session_uses: u32::MAX,
            session_age: config.session_ttl,
            ..PoolOptions::default()
        };
        let pool = pool.client(opts)?;
        let metrics = Arc::new(GatewayMetrics::new(pool.clone()));
        Ok(Gateway {
            inner: Arc::new(Inner {
                pool,
                settings,
                metrics,
                auth,
            }),
        })
    }

    /// Its counters.
    pub fn metrics(&self) -> Arc<GatewayMetrics> {
        self.inner.metrics.clone()
    }

    /// The pool it picks from.
    pub fn pool(&self) -> &Pool {
        &self.inner.pool
    }

    /// Its settings.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// Whether a client at `peer` that gave `password` is let in: a wrong
    /// password counts against its address, and an address past its
    /// failures is refused whatever it gives (see [`crate::auth`]).
    pub(crate) fn check_token(&self, peer: Option<IpAddr>, password: Option<&str>) -> TokenCheck {
        let token = self.inner.settings.token.as_ref();
        if token.is_none() {
            return TokenCheck::Admitted;
        }
        if let Some(wait) = peer.and_then(|ip| self.inner.auth.locked(ip)) {
            return TokenCheck::Locked(wait);
        }
        if admits(token, password) {
            return TokenCheck::Admitted;
        }
        // No password at all is a client that has not been asked yet
        // (browsers wait for the 407), not a guess.
        if let (Some(ip), Some(_)) = (peer, password) {
            self.inner.auth.failed(ip, "gateway");
        }
        TokenCheck::Refused
    }
}

/// What [`Gateway::check_token`] decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TokenCheck {
    Admitted,
    Refused,
    /// Too many wrong tokens from this address: refused for this long.
    Locked(Duration),
}

/// Serves the gateway on `listener` until `shutdown` is cancelled, then
/// gives connections a moment to finish and returns.
pub async fn serve(
    listener: TcpListener,
    gateway: Gateway,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let s = gateway.settings();
    let slots = Slots::new(
        s.max_connections,
        s.max_connections_per_ip,
        s.token.is_some(),
    );
    let tasks = TaskTracker::new();
    let refusing = Arc::new(Semaphore::new(MAX_REFUSING));
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown, "a gateway").await
        else {
            break;
        };
        let slot = match slots.admit(peer.ip()) {
            Ok((slot, evicted)) => {
                if evicted {
                    tracing::debug!(%peer, "closed the oldest connection waiting for a head to make room");
                    gateway.inner.metrics.evicted();
                }
                slot
            }
            Err(full) => {
                let cap = match full {
                    Full::Total => "gateway.max_connections",
                    Full::PerIp => "gateway.max_connections_per_ip",
                };
                tracing::debug!(%peer, cap, "every gateway connection is busy; refusing one");
                gateway.inner.metrics.refused();
                // Told why when a refusal is free to answer; closed
                // otherwise, so a flood cannot pile up answers.
                if let Ok(permit) = refusing.clone().try_acquire_owned() {
                    tasks.spawn(async move {
                        refuse(stream, cap).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        let gw = gateway.clone();
        let stop = shutdown.clone();
        let slot = Arc::new(slot);
        let tunnels = tasks.clone();
        tasks.spawn(async move {
            gw.inner.metrics.connection(1);
            let close = slot.close.clone();
            let conn = slot.conn.clone();
            let header_timeout = gw.settings().header_timeout;
            // With a token, a connection that has not given it within the
            // header timeout goes, however busy it keeps itself: a client
            // without the token cannot hold a slot. Without a token every
            // connection is admitted from the start, and needs no timer.
            let unauthenticated = async {
                if !conn.is_authed() {
                    tokio::time::sleep(header_timeout).await;
                }
                if conn.is_authed() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = connection(&gw, stream, peer.ip(), &stop, slot, &tunnels) => {}
                // Closed to make room for a new connection.
                _ = close.cancelled() => {}
                _ = unauthenticated => {
                    tracing::debug!(%peer, "closing a gateway connection that gave no token");
                }
                // Slow clients end with the gateway.
                _ = async { stop.cancelled().await; tokio::time::sleep(DRAIN).await } => {}
            }
            gw.inner.metrics.connection(-1);
        });
    }
    tasks.close();
    let _ = tokio::time::timeout(DRAIN + Duration::from_secs(1), tasks.wait()).await;
    Ok(())
}

/// One client connection (from `peer`, as accepted): SOCKS5 when its first
/// byte is 5, HTTP otherwise. `slot` is the connection's place under the
/// cap, held by its tunnel too; tunnels are spawned on `tasks`.
async fn connection(
    gw: &Gateway,
    stream: TcpStream,
    peer: IpAddr,
    shutdown: &CancellationToken,
    slot: Arc<Slot>,
    tasks: &TaskTracker,
) {
    let _ = stream.set_nodelay(true);
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(gw.settings().header_timeout, stream.peek(&mut first)).await;
    match peeked {
        Ok(Ok(1)) => {}
        // Closed, failed or silent past the header timeout.
        _ => return,
    }
    match first[0] {
        socks::VERSION => socks::serve(gw, stream, peer, shutdown, slot).await,
        // SOCKS4 is not spoken here: a clear refusal beats a hang.
        4 => socks::refuse_v4(stream).await,
        _ => http::serve(gw, stream, peer, shutdown, slot, tasks).await,
    }
}

/// Answers a connection refused at `cap` in its own protocol and closes
/// it: SOCKS5 "no acceptable method", or HTTP `503` with `Retry-After` and
/// the JSON error naming the cap. What it sends is read for a moment and
/// discarded, so that the close does not reset the answer away.
async fn refuse(mut stream: TcpStream, cap: &str) {
    let mut first = [0u8; 1];
    let answered = async {
        stream.peek(&mut first).await?;
        if first[0] == socks::VERSION {
            stream.write_all(&[socks::VERSION, 0xFF]).await?;
        } else {
            let body = serde_json::json!({"error": {
                "code": "busy",
                "message": format!(
                    "the gateway has every connection {cap} allows open, each carrying a \
                     request or a tunnel; try again in a second"
                ),
            }})
            .to_string();
            let head = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                 retry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(body.as_bytes()).await?;
        }
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, answered).await;
}
