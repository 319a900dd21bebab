//! One request to a judge, directly or through a proxy, without building an
//! HTTP client per proxy: a stream from the dialer (its own connect timeout,
//! then absolute-form forwarding, CONNECT, SOCKS4 or SOCKS5), TLS from the
//! one shared rustls configuration where the judge is https, and one GET
//! written and its answer read over it (see `super::answer`).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use url::Url;

use super::answer;
use crate::model::Reason;
use crate::net::{self, DialOptions, proxy_authorization};
use crate::proxy::{Proxy, Scheme};

/// A judge URL resolved once per round.
#[derive(Clone, Debug)]
pub struct Target {
    /// Host name for the Host header and TLS SNI.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Resolved address (SOCKS4 needs an address; direct requests use it).
    pub addr: SocketAddr,
    /// Path and query, without the nonce.
    pub path: String,
    /// True for https judges.
    pub tls: bool,
    /// An https judge known to speak TLS 1.2, which its probes then use
    /// (see [`net::tls::ProbeTls`]).
    pub tls12: bool,
    /// `host` and `port` as a CONNECT asks for them: the name, unresolved.
    named: net::Target,
    /// `named` for Host headers and absolute-form (IPv6 in brackets).
    authority: String,
    /// This judge's own TLS configurations (see [`Prober::own_sessions`]);
    /// the prober's shared ones when `None`.
    sessions: Option<net::tls::ProbeTls>,
}

impl Target {
    /// Resolves `url` (DNS once, here, not per proxy).
    pub async fn resolve(url: &Url) -> io::Result<Target> {
        let host = url
            .host_str()
            .ok_or_else(|| io::Error::other("judge URL has no host"))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| io::Error::other("judge URL has no port"))?;
        let named = net::Target::new(&host, port).map_err(io::Error::other)?;
        let addr = tokio::net::lookup_host((host.as_str(), port))
            .await?
            .next()
            .ok_or_else(|| io::Error::other(format!("{host} has no address")))?;
        let mut path = url.path().to_owned();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        Ok(Target {
            host,
            port,
            addr,
            path,
            tls: url.scheme() == "https",
            tls12: false,
            authority: named.to_string(),
            named,
            sessions: None,
        })
    }

    /// The path with the nonce appended to the query.
    fn path_with(&self, nonce: &str) -> String {
        let sep = if self.path.contains('?') { '&' } else { '?' };
        format!("{}{sep}{}={nonce}", self.path, super::judge::NONCE_PARAM)
    }
}

/// How a request reaches the judge.
#[derive(Clone, Copy, Debug)]
pub enum Route<'a> {
    /// Straight to the judge (learning our own address).
    Direct,
    /// An absolute-form request to an HTTP proxy (plain judges only).
    Forward(&'a Proxy),
    /// A tunnel: CONNECT for HTTP proxies, the SOCKS handshake otherwise.
    Tunnel(&'a Proxy),
}

/// The part of a fetch a failure happened in, which says whom it can be
/// blamed on: the connect and the proxy's handshake are the proxy's alone,
/// while TLS and the request also involve the judge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// The TCP connect to the proxy (to the judge, when direct).
    Connect,
    /// The proxy's handshake: a CONNECT, or the SOCKS greeting and request.
    Handshake,
    /// The TLS handshake with an https judge (through the tunnel).
    Tls,
    /// The HTTP request and its answer.
    Request,
}

/// A failed fetch: why, and in which phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The reason, as stored.
    pub reason: Reason,
    /// Where it happened.
    pub phase: Phase,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.reason.fmt(f)
    }
}

impl Failure {
    /// True for the failures worth one more try within the same check of a
    /// proxy that worked before: a reset or refused connection, which flaky
    /// proxies produce now and then.
    pub fn retryable(&self) -> bool {
        matches!(self.reason, Reason::Reset | Reason::Refused)
    }

    fn at(phase: Phase) -> impl Fn(Reason) -> Failure {
        move |reason| Failure { reason, phase }
    }
}

/// A judge's answer.
#[derive(Debug)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The body (at most 64 KiB).
    pub body: Bytes,
    /// From the start of the connect to the end of the body.
    pub latency: Duration,
}

/// Shared probe settings: cheap to clone.
#[derive(Clone)]
pub struct Prober {
    tls: net::tls::ProbeTls,
    connect_timeout: Duration,
    timeout: Duration,
    user_agent: Arc<str>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("connect_timeout", &self.connect_timeout)
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl Prober {
    /// A prober using `tls` for every https judge.
    pub fn new(
        tls: net::tls::ProbeTls,
        connect_timeout: Duration,
        timeout: Duration,
        user_agent: &str,
    ) -> Prober {
        Prober {
            tls,
            connect_timeout,
            timeout,
            user_agent: user_agent.into(),
        }
    }

    /// `target` with TLS sessions kept for it alone (when https): judges
    /// sharing a host name do not take each other's sessions.
    pub fn own_sessions(&self, mut target: Target) -> Target {
        if target.tls {
            target.sessions = Some(self.tls.own_sessions());
        }
        target
    }

    /// GETs the judge `target` (with `nonce` in the query) by `route`,
    /// within the connect and total timeouts. A failure names the phase it
    /// happened in (for a timeout, the phase it interrupted).
    pub async fn fetch(
        &self,
        route: Route<'_>,
        target: &Target,
        nonce: &str,
    ) -> Result<Answer, Failure> {
        let start = Instant::now();
        let mut phase = Phase::Connect;
        let fetched = tokio::time::timeout(
            self.timeout,
            self.fetch_inner(route, target, nonce, start, &mut phase),
        )
        .await;
        fetched.unwrap_or(Err(Failure {
            reason: Reason::Timeout,
            phase,
        }))
    }

    async fn fetch_inner(
        &self,
        route: Route<'_>,
        target: &Target,
        nonce: &str,
        start: Instant,
        phase: &mut Phase,
    ) -> Result<Answer, Failure> {
        // SOCKS gets the address resolved once per round, as the checker has
        // always sent it (SOCKS4 has no names without 4a); CONNECT gets the
        // judge's name.
        let (proxy, dial_target, forward) = match route {
            Route::Direct => (None, net::Target::from(target.addr), false),
            Route::Forward(p) => (Some(p), target.named.clone(), true),
            Route::Tunnel(p) if p.scheme == Scheme::Http => (Some(p), target.named.clone(), false),
            Route::Tunnel(p) => (Some(p), net::Target::from(target.addr), false),
        };
        let opts = DialOptions {
            connect_timeout: self.connect_timeout,
            // A proxy that takes the connection and never answers its
            // handshake is as dead as one that never takes it: it costs
            // the connect timeout, not the whole one.
            handshake_timeout: self.connect_timeout,
            forward,
        };
        let dialed = net::dial(proxy, &dial_target, &opts)
            .await
            .map_err(|e| Failure {
                reason: e.reason,
                phase: match e.stage {
                    net::DialStage::Connect => Phase::Connect,
                    net::DialStage::Handshake => Phase::Handshake,
                    net::DialStage::Tls => Phase::Tls,
                },
            })?;
        *phase = Phase::Request;
        // A check's connection ends with a reset, not the FIN exchange of
        // an orderly close: the answer has been read in full by then (or
        // the check has failed), and the exchange, on the proxy's side too,
        // was a tenth of a re-check's CPU. Nor is a TIME_WAIT left behind.
        // A socket that refuses the option closes the usual way.
        let _ = dialed.stream.set_zero_linger();
        let path = target.path_with(nonce);
        let (status, body) = match proxy.filter(|_| dialed.forward) {
            Some(p) => {
                // Absolute-form asks the proxy to fetch the URL for us.
                let uri = format!("http://{}{path}", target.authority);
                self.over(
                    dialed.stream,
                    target,
                    &uri,
                    proxy_authorization(p).as_deref(),
                    phase,
                )
                .await?
            }
            None => self.over(dialed.stream, target, &path, None, phase).await?,
        };
        Ok(Answer {
            status,
            body,
            latency: start.elapsed(),
        })
    }

    /// TLS first when the judge is https, then the request.
    async fn over(
        &self,
        stream: TcpStream,
        target: &Target,
        uri: &str,
        proxy_auth: Option<&str>,
        phase: &mut Phase,
    ) -> Result<(u16, Bytes), Failure> {
        if target.tls {
            *phase = Phase::Tls;
            let tls = target.sessions.as_ref().unwrap_or(&self.tls);
            let config = match target.tls12 {
                true => &tls.tls12,
                false => &tls.any,
            };
            let tls = net::tls::connect(config, &target.host, stream)
                .await
                .map_err(Failure::at(Phase::Tls))?;
            *phase = Phase::Request;
            // Boxed: otherwise every check's future reserves room for the
            // TLS path (about 2.8 KiB each, 28 MB at 10,000 in flight).
            Box::pin(self.request(tls, target, uri, proxy_auth))
                .await
                .map_err(Failure::at(Phase::Request))
        } else {
            self.request(stream, target, uri, proxy_auth)
                .await
                .map_err(Failure::at(Phase::Request))
        }
    }

    /// One HTTP/1.1 GET over `stream` (see [`super::answer`]).
    async fn request<S>(
        &self,
        mut stream: S,
        target: &Target,
        uri: &str,
        proxy_auth: Option<&str>,
    ) -> Result<(u16, Bytes), Reason>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let get = answer::Get {
            uri,
            host: &target.authority,
            user_agent: &self.user_agent,
            proxy_auth,
        };
        answer::exchange(&mut stream, &get).await
    }
}
