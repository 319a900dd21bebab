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
use crate::net::{DialOptions, Host, Target};
use crate::pool::{Attempt, End, Lease, NoProxy, RateLimits, Rotation, Tried, Want, dial_failed};

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
    // Built by hand: once per request, and `format!` of an address and a
    // port cost more than the rest of the pick.
    let mut site = String::with_capacity(48);
    match target.host() {
        Host::Domain(d) => {
            site.push_str(d);
            site.make_ascii_lowercase();
        }
        Host::Ip(std::net::IpAddr::V6(ip)) => {
            use std::fmt::Write;
            let _ = write!(site, "[{ip}]");
        }
        Host::Ip(std::net::IpAddr::V4(ip)) => {
            for (i, octet) in ip.octets().into_iter().enumerate() {
                if i > 0 {
                    site.push('.');
                }
                push_number(&mut site, octet.into());
            }
        }
    }
    if target.port() != default {
        site.push(':');
        push_number(&mut site, target.port());
    }
    site
}

/// Appends `n` in decimal.
fn push_number(s: &mut String, n: u16) {
    let mut digits = [0u8; 5];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        s.push(d as char);
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
        Ok(match lease.dial(self.target, &self.opts).await {
            Ok(dialed) => Tried::answered(UseVerdict::Worked, dialed.stream, None),
            Err(e) => dial_failed(e, true),
        })
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
        gw.pool().forwards().forget(lease.id());
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_is_its_host_and_a_port_other_than_the_default() {
        let t = |h: &str, p| Target::new(h, p).unwrap();
        assert_eq!(site(&t("Shop.Example", 80), 80), "shop.example");
        assert_eq!(site(&t("shop.example", 8080), 80), "shop.example:8080");
        assert_eq!(site(&t("10.0.255.7", 443), 443), "10.0.255.7");
        assert_eq!(site(&t("0.0.0.1", 65535), 443), "0.0.0.1:65535");
        assert_eq!(site(&t("::1", 8443), 443), "[::1]:8443");
    }
}
