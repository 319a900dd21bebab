//! Tunnels for CONNECT and SOCKS5: a stream to the target through a proxy
//! the pool picks, retried on another proxy while the set-up fails, then
//! bytes relayed both ways until one side closes or the tunnel goes quiet.

use std::convert::Infallible;
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
use crate::pool::{Attempt, End, Lease, NoProxy, RateLimits, Rotation, Tried, Want};

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
    let query = controls.query(&s.base);
    let site = site(target, 443);
    let want = Want {
        query: &query,
        session: controls.session.as_deref(),
        site: &site,
        https: true,
    };
    let mut dial = Dial {
        gw,
        target,
        opts: DialOptions {
            connect_timeout: s.connect_timeout,
            handshake_timeout: s.timeout,
            forward: false,
        },
    };
    let rotated = gw.pool().rotate(&want, &rotation(gw), &mut dial).await;
    match rotated.end {
        End::Answer(a) => Ok(Opened {
            stream: a.answer,
            lease: a.lease.ok_or(TunnelError::Failed(Reason::ProtocolError))?,
            dial: a.latency,
        }),
        end => Err(failure(end)),
    }
}

/// Why a tunnel that did not open failed.
fn failure(end: End<TcpStream, Infallible>) -> TunnelError {
    match end {
        End::NoProxy {
            last: Some(last), ..
        } => failure(*last),
        End::NoProxy { error, last: None } => TunnelError::NoProxy(no_proxy_why(&error)),
        End::Unreachable => TunnelError::Unreachable,
        End::Failed(reason) | End::Alike { reason, .. } => TunnelError::Failed(reason),
        // A tunnel set-up gets no answer from the site to refuse or wait on.
        End::Answer(_) | End::Refused(..) | End::RetryAfterTooLong(_) => {
            TunnelError::Failed(Reason::ProtocolError)
        }
        End::Stopped(never) => match never {},
    }
}

/// The gateway's budgets and quorums, for plain requests and tunnels:
/// `gateway.retries` other proxies; two proxies agreeing that a target
/// cannot be reached, or refusing alike, or failing alike once the request
/// went, are believed; rate limits move on at once.
pub(super) fn rotation(gw: &Gateway) -> Rotation {
    Rotation {
        // Clients want an answer now: queue briefly, never go direct.
        no_proxy: match gw.pool().options().no_proxy {
            NoProxy::Direct => NoProxy::Fail,
            p => p,
        },
        rotations: gw.settings().retries,
        // The site's own error is the client's answer.
        target_retries: 0,
        retry_backoff: Duration::ZERO,
        rate_limits: RateLimits::MoveOn(RATE_LIMITED_MAX),
        unreached_quorum: UNREACHED_QUORUM,
        refusal_quorum: 2,
        alike_quorum: 2,
        alike_ends: false,
        keep_refusal: true,
    }
}

/// Rate-limited answers (429, 503) a plain request moves on from, besides
/// `gateway.retries`: each rests its (proxy, site) pair, so under a limit
/// per address a request finds a rested address within a few; a limit on
/// the whole site answers the client after this many.
const RATE_LIMITED_MAX: u32 = 6;

/// A tunnel set-up, through one proxy at a time.
struct Dial<'a> {
    gw: &'a Gateway,
    target: &'a Target,
    opts: DialOptions,
}

impl Attempt for Dial<'_> {
    type Answer = TcpStream;
    type Stop = Infallible;

    async fn attempt(&mut self, lease: Option<&Lease>) -> Result<Tried<TcpStream>, Infallible> {
        let Some(lease) = lease else {
            // The gateway never goes direct.
            return Ok(Tried::ended(UseVerdict::failed(Reason::ProtocolError)));
        };
        Ok(
            match net::dial(Some(lease.proxy()), self.target, &self.opts).await {
                Ok(dialed) => Tried::answered(UseVerdict::Worked, dialed.stream, None),
                // The proxy answered the handshake but would not or could
                // not reach the target: the target's fault until others
                // agree.
                Err(Reason::BadStatus) => Tried::ended(UseVerdict::Unreached),
                // Before the target was named: the proxy's own failure.
                Err(
                    reason @ (Reason::Refused
                    | Reason::ConnectTimeout
                    | Reason::Unreachable
                    | Reason::ProxyAuthRequired),
                ) => Tried::ended(UseVerdict::failed(reason)),
                // Once the target was named: the proxy's, or the target's
                // when others fail alike.
                Err(reason) => Tried::failed_after_sending(reason),
            },
        )
    }

    async fn learnt(&mut self, lease: &Lease, verdict: UseVerdict) {
        charged(self.gw, lease, verdict);
    }

    fn moved_on(&mut self) {
        self.gw.inner.metrics.retried();
    }
}

/// The pool charged the lease's proxy a failure: counted, and its kept
/// connections closed.
pub(super) fn charged(gw: &Gateway, lease: &Lease, verdict: UseVerdict) {
    if let UseVerdict::ProxyFailed(reason) = verdict {
        gw.inner
            .metrics
            .upstream_failed(reason.unwrap_or(Reason::ProtocolError));
        gw.inner.upstreams.forget(lease.id());
    }
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
