//! One request to a judge, directly or through a proxy, without building an
//! HTTP client per proxy: a TCP connection with its own connect timeout, the
//! proxy's handshake (absolute-form forwarding, CONNECT, SOCKS4 or SOCKS5),
//! TLS from the one shared rustls configuration where the judge is https,
//! and hyper's HTTP/1.1 client connection for the request itself.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use url::Url;

use crate::model::Reason;
use crate::proxy::{Proxy, Scheme};

/// Judge answers are small; anything longer is not a judge answer.
const MAX_BODY: usize = 64 * 1024;

/// A CONNECT response head longer than this is not a proxy speaking HTTP.
const MAX_CONNECT_HEAD: usize = 16 * 1024;

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
        })
    }

    /// `host:port` for Host headers and CONNECT (IPv6 in brackets).
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
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
    tls: TlsConnector,
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
        tls: Arc<rustls::ClientConfig>,
        connect_timeout: Duration,
        timeout: Duration,
        user_agent: &str,
    ) -> Prober {
        Prober {
            tls: TlsConnector::from(tls),
            connect_timeout,
            timeout,
            user_agent: user_agent.into(),
        }
    }

    /// GETs the judge `target` (with `nonce` in the query) by `route`,
    /// within the connect and total timeouts.
    pub async fn fetch(
        &self,
        route: Route<'_>,
        target: &Target,
        nonce: &str,
    ) -> Result<Answer, Reason> {
        let start = Instant::now();
        match tokio::time::timeout(self.timeout, self.fetch_inner(route, target, nonce, start))
            .await
        {
            Ok(r) => r,
            Err(_) => Err(Reason::Timeout),
        }
    }

    async fn fetch_inner(
        &self,
        route: Route<'_>,
        target: &Target,
        nonce: &str,
        start: Instant,
    ) -> Result<Answer, Reason> {
        let peer = match route {
            Route::Direct => target.addr,
            Route::Forward(p) | Route::Tunnel(p) => SocketAddr::new(p.host, p.port),
        };
        let tcp = match tokio::time::timeout(self.connect_timeout, TcpStream::connect(peer)).await {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return Err(connect_reason(&e)),
            Err(_) => return Err(Reason::ConnectTimeout),
        };
        // Small request, small answer: no reason to wait for Nagle.
        let _ = tcp.set_nodelay(true);
        let path = target.path_with(nonce);
        let (status, body) = match route {
            Route::Direct => self.over(tcp, target, &path, None).await?,
            Route::Forward(p) => {
                // Absolute-form asks the proxy to fetch the URL for us.
                let uri = format!("http://{}{path}", target.authority());
                self.over(tcp, target, &uri, proxy_authorization(p).as_deref())
                    .await?
            }
            Route::Tunnel(p) => match p.scheme {
                Scheme::Http => {
                    let tcp = connect_tunnel(tcp, target, p).await?;
                    self.over(tcp, target, &path, None).await?
                }
                Scheme::Socks4 => {
                    let s = match &p.auth {
                        Some(a) => {
                            tokio_socks::tcp::Socks4Stream::connect_with_userid_and_socket(
                                tcp,
                                target.addr,
                                &a.username,
                            )
                            .await
                        }
                        None => {
                            tokio_socks::tcp::Socks4Stream::connect_with_socket(tcp, target.addr)
                                .await
                        }
                    }
                    .map_err(|e| socks_reason(&e))?;
                    self.over(s, target, &path, None).await?
                }
                Scheme::Socks5 => {
                    let s = match &p.auth {
                        Some(a) => {
                            tokio_socks::tcp::Socks5Stream::connect_with_password_and_socket(
                                tcp,
                                target.addr,
                                &a.username,
                                &a.password,
                            )
                            .await
                        }
                        None => {
                            tokio_socks::tcp::Socks5Stream::connect_with_socket(tcp, target.addr)
                                .await
                        }
                    }
                    .map_err(|e| socks_reason(&e))?;
                    self.over(s, target, &path, None).await?
                }
            },
        };
        Ok(Answer {
            status,
            body,
            latency: start.elapsed(),
        })
    }

    /// TLS first when the judge is https, then the request.
    async fn over<S>(
        &self,
        stream: S,
        target: &Target,
        uri: &str,
        proxy_auth: Option<&str>,
    ) -> Result<(u16, Bytes), Reason>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        if target.tls {
            let name = ServerName::try_from(target.host.clone()).map_err(|_| Reason::TlsError)?;
            let tls = self
                .tls
                .connect(name, stream)
                .await
                .map_err(|e| match io_reason(&e) {
                    Some(r) => r,
                    None => Reason::TlsError,
                })?;
            // Boxed: otherwise every check's future reserves room for the
            // TLS path (about 2.8 KiB each, 28 MB at 10,000 in flight).
            Box::pin(self.request(tls, target, uri, proxy_auth)).await
        } else {
            self.request(stream, target, uri, proxy_auth).await
        }
    }

    /// One HTTP/1.1 GET over `stream` with hyper's client connection.
    async fn request<S>(
        &self,
        stream: S,
        target: &Target,
        uri: &str,
        proxy_auth: Option<&str>,
    ) -> Result<(u16, Bytes), Reason>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| hyper_reason(&e))?;
        let mut req = http::Request::get(uri)
            .header(http::header::HOST, target.authority())
            .header(http::header::USER_AGENT, &*self.user_agent)
            .header(http::header::ACCEPT, "*/*")
            .header(http::header::CONNECTION, "close");
        if let Some(auth) = proxy_auth {
            req = req.header(http::header::PROXY_AUTHORIZATION, auth);
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|_| Reason::ProtocolError)?;
        let exchange = async move {
            let resp = sender
                .send_request(req)
                .await
                .map_err(|e| hyper_reason(&e))?;
            let status = resp.status().as_u16();
            if status == 407 {
                return Err(Reason::ProxyAuthRequired);
            }
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| match e.downcast_ref::<hyper::Error>() {
                    Some(h) => hyper_reason(h),
                    // Limited's own error: far too long for a judge answer.
                    None => Reason::ContentMismatch,
                })?
                .to_bytes();
            Ok((status, body))
        };
        // The connection future drives the I/O. The exchange usually ends
        // first; if the connection ends first, the exchange still holds the
        // answer (or the precise error) and is awaited.
        tokio::pin!(exchange);
        tokio::select! {
            biased;
            r = &mut exchange => r,
            c = conn => match (exchange.await, c) {
                (Ok(v), _) => Ok(v),
                (Err(Reason::Reset), Err(e)) => Err(hyper_reason(&e)),
                (Err(r), _) => Err(r),
            },
        }
    }
}

/// `Basic base64(user:pass)` for HTTP proxies with credentials.
fn proxy_authorization(p: &Proxy) -> Option<String> {
    let a = p.auth.as_ref()?;
    let raw = format!("{}:{}", a.username, a.password);
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
}

/// Opens a CONNECT tunnel. The handshake is one request and one response
/// head, parsed with httparse; the stream then belongs to the tunnel.
async fn connect_tunnel(
    mut tcp: TcpStream,
    target: &Target,
    p: &Proxy,
) -> Result<TcpStream, Reason> {
    let authority = target.authority();
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n");
    if let Some(auth) = proxy_authorization(p) {
        head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    head.push_str("\r\n");
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|e| io_reason(&e).unwrap_or(Reason::ProtocolError))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        let n = tcp
            .read(&mut chunk)
            .await
            .map_err(|e| io_reason(&e).unwrap_or(Reason::ProtocolError))?;
        if n == 0 {
            return Err(Reason::Reset);
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(len)) => {
                let code = resp.code.unwrap_or(0);
                return match code {
                    200..=299 if len == buf.len() => Ok(tcp),
                    // Bytes after the head before we said anything: not a tunnel.
                    200..=299 => Err(Reason::ProtocolError),
                    407 => Err(Reason::ProxyAuthRequired),
                    _ => Err(Reason::BadStatus),
                };
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_CONNECT_HEAD => continue,
            _ => return Err(Reason::ProtocolError),
        }
    }
}

fn connect_reason(e: &io::Error) -> Reason {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Reason::Refused,
        io::ErrorKind::TimedOut => Reason::ConnectTimeout,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Reason::Reset,
        _ => Reason::Unreachable,
    }
}

/// Resets and early closes; `None` for errors that mean something else.
fn io_reason(e: &io::Error) -> Option<Reason> {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Some(Reason::Reset),
        io::ErrorKind::TimedOut => Some(Reason::Timeout),
        _ => None,
    }
}

fn hyper_reason(e: &hyper::Error) -> Reason {
    if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        return Reason::ProtocolError;
    }
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        return Reason::Reset;
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            if let Some(r) = io_reason(io) {
                return r;
            }
            if io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
            {
                return Reason::TlsError;
            }
        }
        if s.is::<rustls::Error>() {
            return Reason::TlsError;
        }
        src = s.source();
    }
    Reason::ProtocolError
}

fn socks_reason(e: &tokio_socks::Error) -> Reason {
    use tokio_socks::Error as E;
    match e {
        E::Io(io) => io_reason(io).unwrap_or(Reason::ProtocolError),
        E::PasswordAuthFailure(_)
        | E::AuthorizationRequired
        | E::NoAcceptableAuthMethods
        | E::IdentdAuthFailure
        | E::InvalidUserIdAuthFailure => Reason::ProxyAuthRequired,
        // The proxy spoke SOCKS but could not or would not reach the judge.
        E::GeneralSocksServerFailure
        | E::ConnectionNotAllowedByRuleset
        | E::NetworkUnreachable
        | E::HostUnreachable
        | E::ConnectionRefused
        | E::TtlExpired
        | E::ProxyServerUnreachable => Reason::BadStatus,
        _ => Reason::ProtocolError,
    }
}
