//! Tunnels for CONNECT and SOCKS5: a stream to the target through a proxy
//! the pool picks, retried on another proxy while the set-up fails, then
//! bytes relayed both ways until one side closes or the tunnel goes quiet.

use std::collections::HashSet;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::controls::Controls;
use crate::model::Reason;
use crate::model::UseVerdict;
use crate::net::{self, DialOptions, Host, Target};
use crate::pool::{Lease, Want};

/// Proxies that answer but cannot reach a target before the gateway
/// believes it cannot be reached.
const UNREACHED_QUORUM: u32 = 2;

/// Why no tunnel was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum TunnelError {
    /// No usable proxy could take the tunnel: why, as the pool says.
    NoProxy(String),
    /// Proxies that work say the target cannot be reached.
    Unreachable,
    /// Every proxy tried failed; the last reason.
    Failed(Reason),
}

/// An open tunnel: the stream and the proxy carrying it (its in-flight
/// slot is held while the tunnel lives).
pub(super) struct Opened {
    pub stream: TcpStream,
    pub lease: Lease,
    /// The last, successful dial: the upstream's share of the set-up time.
    pub dial: Duration,
}

/// The site a target names for bans: its host, with the port unless it is
/// `default`.
pub(super) fn site(target: &Target, default: u16) -> String {
    let host = match target.host() {
        Host::Domain(d) => d.to_ascii_lowercase(),
        Host::Ip(std::net::IpAddr::V6(ip)) => format!("[{ip}]"),
        Host::Ip(ip) => ip.to_string(),
    };
    if target.port() == default {
        host
    } else {
        format!("{host}:{}", target.port())
    }
}

/// Opens a tunnel to `target` through a proxy matching `controls`, moving
/// on to another proxy while the set-up fails (up to `retries`). Every
/// outcome is reported to the pool.
pub(super) async fn open(
    gw: &Gateway,
    controls: &Controls,
    target: &Target,
) -> Result<Opened, TunnelError> {
    let s = gw.settings();
    let metrics = &gw.inner.metrics;
    let query = controls.query(&s.base);
    let site = site(target, 443);
    let want = Want {
        query: &query,
        session: controls.session.as_deref(),
        site: &site,
        https: true,
    };
    let opts = DialOptions {
        connect_timeout: s.connect_timeout,
        handshake_timeout: s.timeout,
        forward: false,
    };
    let mut tried = HashSet::new();
    let (mut retries, mut unreached) = (0u32, 0u32);
    let mut last = None;
    // Failures once the proxy was asked for this target, charged as for
    // plain requests: when another proxy opens the tunnel, or when they
    // differ; alike on two or more, the target is the likely cause.
    let mut alike: Vec<(Lease, Reason)> = Vec::new();
    let result = loop {
        let lease = match gw.pool().take(&want, &tried).await {
            Ok(lease) => lease,
            Err(e) => {
                break Err(last.unwrap_or_else(|| TunnelError::NoProxy(no_proxy_why(&e))));
            }
        };
        tried.insert(lease.id());
        let t0 = Instant::now();
        match net::dial(Some(lease.proxy()), target, &opts).await {
            Ok(dialed) => {
                let dial = t0.elapsed();
                gw.pool()
                    .settle(&lease, UseVerdict::Worked, dial, None)
                    .await;
                break Ok(Opened {
                    stream: dialed.stream,
                    lease,
                    dial,
                });
            }
            // The proxy answered the handshake but would not or could not
            // reach the target: the target's fault until others agree.
            Err(Reason::BadStatus) => {
                gw.pool()
                    .settle(&lease, UseVerdict::Unreached, Duration::ZERO, None)
                    .await;
                unreached += 1;
                if unreached >= UNREACHED_QUORUM {
                    break Err(TunnelError::Unreachable);
                }
                last = Some(TunnelError::Unreachable);
            }
            // Before the target was named: the proxy's own failure.
            Err(
                reason @ (Reason::Refused
                | Reason::ConnectTimeout
                | Reason::Unreachable
                | Reason::ProxyAuthRequired),
            ) => {
                charge(gw, &lease, reason).await;
                last = Some(TunnelError::Failed(reason));
            }
            Err(reason) => {
                alike.push((lease, reason));
                last = Some(TunnelError::Failed(reason));
            }
        }
        if retries >= s.retries {
            break Err(last.expect("set by every failed attempt"));
        }
        retries += 1;
        metrics.retried();
    };
    let excused =
        result.is_err() && alike.len() >= 2 && alike.iter().all(|(_, r)| *r == alike[0].1);
    if excused {
        tracing::debug!(%target, proxies = alike.len(), "proxies failed alike on one tunnel; none charged");
    } else {
        for (failed, reason) in &alike {
            charge(gw, failed, *reason).await;
        }
    }
    result
}

/// Charges a failure to the lease's proxy: it rests, stops being served
/// and loses its kept connections.
pub(super) async fn charge(gw: &Gateway, lease: &Lease, reason: Reason) {
    gw.inner.metrics.upstream_failed(reason);
    gw.inner.upstreams.forget(lease.id());
    gw.pool()
        .settle(lease, UseVerdict::failed(reason), Duration::ZERO, None)
        .await;
}

/// Relays bytes between `client` and `upstream` until either side ends,
/// nothing moves for `idle`, or `shutdown` is cancelled; counts the bytes.
pub(super) async fn relay<C>(
    gw: &Gateway,
    client: C,
    upstream: TcpStream,
    idle: Duration,
    shutdown: &CancellationToken,
) where
    C: AsyncRead + AsyncWrite + Unpin,
{
    let metrics = &gw.inner.metrics;
    metrics.tunnel(1);
    let epoch = Instant::now();
    let last = Arc::new(AtomicU64::new(0));
    let mut client = Watched::new(client, epoch, last.clone());
    let mut upstream = Watched::new(upstream, epoch, last.clone());
    let quiet = async {
        loop {
            let since = Duration::from_millis(last.load(Ordering::Relaxed));
            let deadline = epoch + since + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
        _ = quiet => {}
        _ = shutdown.cancelled() => {}
    }
    metrics.sent(client.read.load(Ordering::Relaxed));
    metrics.received(upstream.read.load(Ordering::Relaxed));
    metrics.tunnel(-1);
}

/// A stream that notes when bytes last moved and how many it read.
struct Watched<S> {
    inner: S,
    epoch: Instant,
    last: Arc<AtomicU64>,
    read: AtomicU64,
}

impl<S> Watched<S> {
    fn new(inner: S, epoch: Instant, last: Arc<AtomicU64>) -> Watched<S> {
        Watched {
            inner,
            epoch,
            last,
            read: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.last.fetch_max(ms, Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            this.read.fetch_add(n as u64, Ordering::Relaxed);
            this.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.touch();
        }
        r
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// What a `no_proxy` answer says of why no proxy could be taken.
pub(super) fn no_proxy_why(e: &crate::pool::FetchError) -> String {
    match e {
        crate::pool::FetchError::NoProxy {
            hint: Some(hint), ..
        } => hint.clone(),
        other => other.to_string(),
    }
}
