//! The dialer: a TCP stream to `host:port`, directly or through an HTTP
//! (forward or CONNECT), SOCKS4/4a or SOCKS5/5h proxy, with a timeout per
//! phase and every failure a [`DialError`]: the stage it failed at and a
//! [`Reason`].

use std::borrow::Cow;
use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use base64::Engine;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_socks::TargetAddr;
use tokio_socks::tcp::{Socks4Stream, Socks5Stream};

use crate::model::Reason;
use crate::proxy::{Proxy, Scheme};

/// A CONNECT response head longer than this is not a proxy speaking HTTP.
const MAX_CONNECT_HEAD: usize = 16 * 1024;

/// The longest domain name in text form (RFC 1035, without the final dot);
/// it also fits SOCKS5's one-byte length field.
const MAX_DOMAIN: usize = 253;

/// tokio-socks builds a SOCKS4 request in a 513-byte buffer: 8 fixed bytes,
/// the user ID, the domain (SOCKS4a) and two NULs must fit or it panics.
const SOCKS4_REQUEST_MAX: usize = 513;

/// The host part of a [`Target`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Host {
    /// A domain name, sent to the proxy as is (CONNECT, SOCKS4a, SOCKS5h);
    /// resolved locally only for direct connections.
    Domain(String),
    /// An IP address, sent as an address.
    Ip(IpAddr),
}

/// Where a dialed stream leads: a host and a port.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Target {
    host: Host,
    port: u16,
}

/// A target host that is neither an IP address nor a plain domain name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IP address or a domain name")]
pub struct InvalidHost(pub String);

impl Target {
    /// `host` is an IP literal (IPv6 with or without brackets) or a domain
    /// name of letters, digits, `-`, `_` and `.` up to 253 bytes. Anything
    /// else is refused here: it would be written into a CONNECT line or a
    /// SOCKS request, where CR, LF or NUL could smuggle extra protocol.
    pub fn new(host: &str, port: u16) -> Result<Target, InvalidHost> {
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Target {
                host: Host::Ip(ip),
                port,
            });
        }
        let plain = host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if host.is_empty() || host.len() > MAX_DOMAIN || !plain {
            return Err(InvalidHost(host.to_owned()));
        }
        Ok(Target {
            host: Host::Domain(host.to_owned()),
            port,
        })
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host as SOCKS sends it: an address, or a name for the proxy to
    /// resolve (SOCKS4a, SOCKS5h).
    fn socks_addr(&self) -> TargetAddr<'_> {
        match &self.host {
            Host::Ip(ip) => TargetAddr::Ip(SocketAddr::new(*ip, self.port)),
            Host::Domain(name) => TargetAddr::Domain(Cow::Borrowed(name), self.port),
        }
    }
}

impl From<SocketAddr> for Target {
    fn from(addr: SocketAddr) -> Target {
        Target {
            host: Host::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

/// `host:port`, IPv6 in brackets: the form of CONNECT and Host headers.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Domain(name) => write!(f, "{name}:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}:{}", self.port),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]:{}", self.port),
        }
    }
}

/// Timeouts and the mode for one [`dial`]. The caller keeps its own total
/// timeout over the dial and whatever it sends afterwards.
#[derive(Clone, Copy, Debug)]
pub struct DialOptions {
    /// Bound on the TCP connect to the proxy (to the target, name resolution
    /// included, when direct); elapsed is [`Reason::ConnectTimeout`].
    pub connect_timeout: Duration,
    /// Bound on the proxy handshake (CONNECT or SOCKS) after the connect;
    /// elapsed is [`Reason::Timeout`].
    pub handshake_timeout: Duration,
    /// HTTP proxies only: hand back the connection to the proxy itself, for
    /// absolute-form requests, instead of opening a CONNECT tunnel. SOCKS
    /// proxies always tunnel; direct connections ignore it.
    pub forward: bool,
}

/// A dialed stream.
#[derive(Debug)]
pub struct Dialed {
    /// The connection: to the target (direct or tunnelled), or to an HTTP
    /// proxy when `forward` is set.
    pub stream: TcpStream,
    /// True when `stream` leads to an HTTP proxy that expects absolute-form
    /// requests, with [`proxy_authorization`] when it has credentials.
    pub forward: bool,
}

/// Where a dial failed: who had been told what by then.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DialStage {
    /// The TCP connect: to the proxy, or (direct) to the target. Nothing
    /// was said yet.
    Connect,
    /// The proxy's handshake (CONNECT, SOCKS) once connected: the target
    /// was named to the proxy.
    Handshake,
    /// TLS to the target over the dialed stream (set up by the caller,
    /// which says so with [`DialError::tls`]).
    Tls,
}

impl fmt::Display for DialStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DialStage::Connect => "connect",
            DialStage::Handshake => "proxy handshake",
            DialStage::Tls => "TLS handshake",
        })
    }
}

/// Why a dial failed: the stage and the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{reason} at the {stage}")]
pub struct DialError {
    /// Where it failed.
    pub stage: DialStage,
    /// How.
    pub reason: Reason,
}

impl DialError {
    /// A failure of the TCP connect.
    pub fn connect(reason: Reason) -> DialError {
        DialError {
            stage: DialStage::Connect,
            reason,
        }
    }

    /// A failure of the proxy's handshake.
    pub fn handshake(reason: Reason) -> DialError {
        DialError {
            stage: DialStage::Handshake,
            reason,
        }
    }

    /// A failure of TLS over a dialed stream.
    pub fn tls(reason: Reason) -> DialError {
        DialError {
            stage: DialStage::Tls,
            reason,
        }
    }
}

/// Opens a stream to `target`: through `proxy` when given, otherwise
/// directly (the host resolved here). Through a proxy, a domain target is
/// never resolved locally: CONNECT, SOCKS4a and SOCKS5h send the name.
pub async fn dial(
    proxy: Option<&Proxy>,
    target: &Target,
    opts: &DialOptions,
) -> Result<Dialed, DialError> {
    let Some(proxy) = proxy else {
        let stream = connect(opts.connect_timeout, async {
            match &target.host {
                Host::Ip(ip) => TcpStream::connect((*ip, target.port)).await,
                Host::Domain(name) => TcpStream::connect((name.as_str(), target.port)).await,
            }
        })
        .await
        .map_err(DialError::connect)?;
        return Ok(Dialed {
            stream,
            forward: false,
        });
    };
    let mut stream = connect(
        opts.connect_timeout,
        TcpStream::connect((proxy.host, proxy.port)),
    )
    .await
    .map_err(DialError::connect)?;
    if proxy.scheme == Scheme::Http && opts.forward {
        return Ok(Dialed {
            stream,
            forward: true,
        });
    }
    let handshake = async {
        match proxy.scheme {
            Scheme::Http => connect_tunnel(&mut stream, target, proxy)
                .await
                .map(|()| stream),
            Scheme::Socks4 => socks4(stream, target, proxy).await,
            Scheme::Socks5 => socks5(stream, target, proxy).await,
        }
    };
    match tokio::time::timeout(opts.handshake_timeout, handshake).await {
        Ok(stream) => Ok(Dialed {
            stream: stream.map_err(DialError::handshake)?,
            forward: false,
        }),
        Err(_) => Err(DialError::handshake(Reason::Timeout)),
    }
}

/// The TCP connect phase, bounded by `limit`.
async fn connect(
    limit: Duration,
    connecting: impl Future<Output = io::Result<TcpStream>>,
) -> Result<TcpStream, Reason> {
    let stream = match tokio::time::timeout(limit, connecting).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(connect_reason(&e)),
        Err(_) => return Err(Reason::ConnectTimeout),
    };
    // Requests through proxies are small writes answered at once: Nagle
    // would only hold them back.
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// `Basic base64(user:pass)`, the `Proxy-Authorization` value for an HTTP
/// proxy with credentials; `None` without credentials.
pub fn proxy_authorization(p: &Proxy) -> Option<String> {
    let a = p.auth.as_ref()?;
    let raw = format!("{}:{}", a.username, a.password);
    Some(format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    ))
}

/// Opens a CONNECT tunnel. The handshake is one request and one response
/// head, parsed with httparse; the stream then belongs to the tunnel.
async fn connect_tunnel(tcp: &mut TcpStream, target: &Target, p: &Proxy) -> Result<(), Reason> {
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
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
        match connect_status(&buf) {
            Some(r) => return r,
            None if buf.len() < MAX_CONNECT_HEAD => continue,
            None => return Err(Reason::ProtocolError),
        }
    }
}

/// The verdict on a CONNECT response read so far; `None` while the head
/// is incomplete.
fn connect_status(buf: &[u8]) -> Option<Result<(), Reason>> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => Some(match resp.code.unwrap_or(0) {
            200..=299 if len == buf.len() => Ok(()),
            // Bytes after the head before we said anything: not a tunnel.
            200..=299 => Err(Reason::ProtocolError),
            407 => Err(Reason::ProxyAuthRequired),
            _ => Err(Reason::BadStatus),
        }),
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(Err(Reason::ProtocolError)),
    }
}

/// SOCKS4 with an IPv4 target, SOCKS4a with a domain; the user ID is the
/// username when the proxy has credentials.
async fn socks4(tcp: TcpStream, target: &Target, p: &Proxy) -> Result<TcpStream, Reason> {
    let user_id = p.auth.as_ref().map(|a| a.username.as_str());
    if let Host::Domain(name) = &target.host
        && 10 + user_id.map_or(0, str::len) + name.len() > SOCKS4_REQUEST_MAX
    {
        return Err(Reason::ProtocolError);
    }
    let addr = target.socks_addr();
    let s = match user_id {
        Some(id) => Socks4Stream::connect_with_userid_and_socket(tcp, addr, id).await,
        None => Socks4Stream::connect_with_socket(tcp, addr).await,
    }
    .map_err(|e| socks_reason(&e))?;
    Ok(s.into_inner())
}

/// SOCKS5 (5h with a domain), with username/password authentication when
/// the proxy has credentials.
async fn socks5(tcp: TcpStream, target: &Target, p: &Proxy) -> Result<TcpStream, Reason> {
    let addr = target.socks_addr();
    let s = match &p.auth {
        Some(a) => {
            Socks5Stream::connect_with_password_and_socket(tcp, addr, &a.username, &a.password)
                .await
        }
        None => Socks5Stream::connect_with_socket(tcp, addr).await,
    }
    .map_err(|e| socks_reason(&e))?;
    Ok(s.into_inner())
}

fn connect_reason(e: &io::Error) -> Reason {
    match e.kind() {
        io::ErrorKind::ConnectionRefused => Reason::Refused,
        io::ErrorKind::TimedOut => Reason::ConnectTimeout,
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Reason::Reset,
        _ => Reason::Unreachable,
    }
}

/// The reason for an I/O error on an established stream: resets and early
/// closes, or a timeout; `None` for errors that mean something else, which
/// the caller maps in its own context.
pub fn io_reason(e: &io::Error) -> Option<Reason> {
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Some(Reason::Reset),
        io::ErrorKind::TimedOut => Some(Reason::Timeout),
        _ => None,
    }
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
        // The proxy spoke SOCKS but could not or would not reach the target.
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

/// The reason behind a hyper client error on a dialed stream: a parse
/// error is the peer not speaking HTTP, an early close is a reset, and
/// TLS and I/O causes keep their own reasons.
pub fn hyper_reason(e: &hyper::Error) -> Reason {
    if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
        return Reason::ProtocolError;
    }
    if e.is_incomplete_message() || e.is_closed() || e.is_canceled() {
        return Reason::Reset;
    }
    let mut src: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Credentials;

    fn http_proxy(auth: Option<(&str, &str)>) -> Proxy {
        Proxy {
            scheme: Scheme::Http,
            host: IpAddr::from([127, 0, 0, 1]),
            port: 8080,
            auth: auth.map(|(u, p)| Credentials {
                username: u.into(),
                password: p.into(),
            }),
        }
    }

    #[test]
    fn targets_parse_addresses_and_names() {
        let v4 = Target::new("192.0.2.1", 80).unwrap();
        assert_eq!(v4.host(), &Host::Ip(IpAddr::from([192, 0, 2, 1])));
        assert_eq!(v4.to_string(), "192.0.2.1:80");
        let v6 = Target::new("[2001:db8::1]", 443).unwrap();
        assert_eq!(v6, Target::new("2001:db8::1", 443).unwrap());
        assert_eq!(v6.to_string(), "[2001:db8::1]:443");
        let name = Target::new("judge.example_1.org", 8080).unwrap();
        assert_eq!(name.host(), &Host::Domain("judge.example_1.org".into()));
        assert_eq!(name.to_string(), "judge.example_1.org:8080");
        assert_eq!(
            Target::from(SocketAddr::from(([127, 0, 0, 1], 9))),
            Target::new("127.0.0.1", 9).unwrap()
        );
    }

    #[test]
    fn targets_refuse_what_would_break_a_handshake() {
        let long = "a".repeat(MAX_DOMAIN + 1);
        for bad in [
            "",
            "evil.org\r\nX-Injected: 1",
            "a\0b",
            "a b",
            "user@host",
            &long,
        ] {
            assert_eq!(Target::new(bad, 80), Err(InvalidHost(bad.to_owned())));
        }
        assert!(Target::new(&"a".repeat(MAX_DOMAIN), 80).is_ok());
    }

    #[test]
    fn proxy_authorization_is_basic_user_colon_password() {
        assert_eq!(proxy_authorization(&http_proxy(None)), None);
        // RFC 7617's example.
        assert_eq!(
            proxy_authorization(&http_proxy(Some(("Aladdin", "open sesame")))).as_deref(),
            Some("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==")
        );
    }

    #[test]
    fn connect_responses_map_to_reasons() {
        let ok = b"HTTP/1.1 200 Connection established\r\n\r\n";
        assert_eq!(connect_status(ok), Some(Ok(())));
        assert_eq!(connect_status(&ok[..20]), None);
        let early = b"HTTP/1.1 200 OK\r\n\r\nSSH-2.0-x\r\n";
        assert_eq!(connect_status(early), Some(Err(Reason::ProtocolError)));
        let auth = b"HTTP/1.1 407 Proxy Authentication Required\r\n\r\n";
        assert_eq!(connect_status(auth), Some(Err(Reason::ProxyAuthRequired)));
        let denied = b"HTTP/1.0 403 Forbidden\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(connect_status(denied), Some(Err(Reason::BadStatus)));
        let garbage = b"SSH-2.0-OpenSSH_8.9\r\n";
        assert_eq!(connect_status(garbage), Some(Err(Reason::ProtocolError)));
    }

    #[test]
    fn socks_errors_map_to_reasons() {
        use tokio_socks::Error as E;
        assert_eq!(
            socks_reason(&E::PasswordAuthFailure(1)),
            Reason::ProxyAuthRequired
        );
        assert_eq!(socks_reason(&E::HostUnreachable), Reason::BadStatus);
        assert_eq!(
            socks_reason(&E::InvalidResponseVersion),
            Reason::ProtocolError
        );
        let eof = io::Error::from(io::ErrorKind::UnexpectedEof);
        assert_eq!(socks_reason(&E::Io(eof)), Reason::Reset);
    }
}
