//! Loopback proxies for checker and dialer tests: HTTP forward proxies,
//! SOCKS4/4a and SOCKS5 servers that behave or misbehave on request and
//! record the targets asked of them, a farm of thousands of them and a raw
//! TCP echo server. Every server is bound before `start` returns and stops,
//! with all its connections, when dropped.
//!
//! Written by hand rather than with a proxy crate: fixtures must be able to
//! break the protocols on purpose. Targets are limited to loopback (`localhost`
//! or an IP literal, never DNS), so a checker under test that asks for the
//! wrong URL cannot reach the internet through them.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

/// Largest request or response head read; beyond it the peer is cut off.
const MAX_HEAD: usize = 64 * 1024;
/// Bounds an upstream connect, so a stuck loopback backlog cannot pin a task.
const UPSTREAM_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a closing server keeps reading so the peer sees the response
/// instead of a reset caused by its own unread bytes.
const LINGER: Duration = Duration::from_secs(2);
/// What the `Garbage` behaviours send: a real non-HTTP, non-SOCKS banner.
const GARBAGE: &[u8] = b"SSH-2.0-OpenSSH_8.9\r\n";
/// The page a `Liar` proxy serves instead of the target.
pub const LIAR_PAGE: &str = "<html>Welcome to FreeWifi, please log in</html>";
/// What `Via` says for anonymous and transparent proxies.
pub const VIA: &str = "1.1 fakeproxy";
/// Targets a fake remembers; later ones are not recorded, so a farm under
/// load keeps a fixed footprint.
const MAX_RECORDED: usize = 1024;

// ---------------------------------------------------------------------------
// Shared server plumbing

/// An accept loop that owns its connection tasks: aborting it drops the
/// `JoinSet`, which aborts every connection, so a dropped fake closes all.
struct Server {
    /// Where the listener is bound.
    addr: SocketAddr,
    /// The accept loop.
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `ip:0` (127.0.0.1 by default) without `SO_REUSEADDR`, which
/// `TcpListener::bind` sets: with it, Linux finds a free port for bind(0) by
/// a slow scan once some thousands are taken on one address (10,000
/// listeners took 6 s instead of 0.1 s).
fn bind(ip: Option<IpAddr>) -> TcpListener {
    let ip = ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let socket = if ip.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    };
    socket
        .and_then(|s| {
            s.bind(SocketAddr::new(ip, 0))?;
            s.listen(1024)
        })
        .unwrap_or_else(|e| panic!("listen on {ip}:0: {e}"))
}

/// Runs `handle` on its own task for every accepted connection.
fn serve<F, Fut>(listener: TcpListener, handle: F) -> Server
where
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + 'static,
    Fut: Future<Output = io::Result<()>> + Send + 'static,
{
    let addr = listener.local_addr().expect("listener address");
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, peer)) => {
                        // As servers do: a reply written in pieces (head,
                        // then body) must not wait out the client's delayed
                        // ACK (Nagle), 40 ms a time on Linux.
                        let _ = stream.set_nodelay(true);
                        conns.spawn(handle(stream, peer));
                    }
                    // Out of descriptors, most likely: back off instead of
                    // spinning, connections will close and free some.
                    Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
                },
                // Reap finished connections so the set stays small.
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Server { addr, task }
}

/// Reads until the peer closes (or errors), discarding what it sends.
async fn drain<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<()> {
    let mut sink = [0u8; 4096];
    while stream.read(&mut sink).await? > 0 {}
    Ok(())
}

/// Half-closes and lingers briefly so the peer reads everything we wrote.
async fn finish(mut stream: TcpStream) -> io::Result<()> {
    stream.shutdown().await?;
    let _ = tokio::time::timeout(LINGER, drain(&mut stream)).await;
    Ok(())
}

/// Reads one HTTP head (through the blank line). Returns the head and any
/// bytes read past it, or `None` if the peer closed or sent too much.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find_head_end(&buf) {
            let rest = buf.split_off(end);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find_head_end(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

/// A parsed request or response head; the start line split on spaces.
struct Head {
    /// Method, or version for a response.
    first: String,
    /// Request target, or status code for a response.
    second: String,
    /// Version, or reason phrase for a response.
    third: String,
    /// Header fields in arrival order, names as sent.
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(head: &[u8]) -> Option<Head> {
        let text = std::str::from_utf8(head).ok()?;
        let mut lines = text.split("\r\n");
        let mut start = lines.next()?.splitn(3, ' ');
        let first = start.next()?.to_owned();
        let second = start.next()?.to_owned();
        let third = start.next().unwrap_or("").to_owned();
        if first.is_empty() || second.is_empty() {
            return None;
        }
        let mut headers = Vec::new();
        for line in lines.take_while(|l| !l.is_empty()) {
            let (name, value) = line.split_once(':')?;
            headers.push((name.trim().to_owned(), value.trim().to_owned()));
        }
        Some(Head {
            first,
            second,
            third,
            headers,
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        407 => "Proxy Authentication Required",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Status",
    }
}

/// Writes a complete `Connection: close` response and closes.
async fn respond(
    mut stream: TcpStream,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nConnection: close\r\n",
        reason(status),
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    finish(stream).await
}

/// `localhost` or an IP literal; anything else would need DNS, which tests
/// must not use. IPv4-mapped IPv6 addresses become IPv4.
fn resolve(host: &str) -> Option<IpAddr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Some(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Why a fake would not or could not reach a target.
enum UpstreamError {
    /// Not `localhost` or an IP literal.
    Unresolvable,
    /// Resolved outside loopback: refused so tests stay off the internet.
    NotLoopback,
    /// The connect itself failed (refused, timed out, bind failed).
    Connect,
}

/// Connects to `host:port` on loopback, from `bind` if given. Binding first
/// lets tests give the proxy's outgoing traffic its own 127.x address.
async fn connect_upstream(
    host: &str,
    port: u16,
    bind: Option<IpAddr>,
) -> Result<TcpStream, UpstreamError> {
    let ip = resolve(host).ok_or(UpstreamError::Unresolvable)?;
    if !ip.is_loopback() {
        return Err(UpstreamError::NotLoopback);
    }
    let target = SocketAddr::new(ip, port);
    let connect = async {
        let socket = if target.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        if let Some(local) = bind {
            // No SO_REUSEADDR, for the reason given at `bind`. The cost: the
            // ~28,000 ephemeral ports of one address, TIME_WAIT included,
            // bound the connections in flight through it.
            socket.bind(SocketAddr::new(local, 0))?;
        }
        socket.connect(target).await
    };
    match tokio::time::timeout(UPSTREAM_CONNECT_TIMEOUT, connect).await {
        Ok(Ok(stream)) => Ok(stream),
        _ => Err(UpstreamError::Connect),
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`; `None` if the port is
/// missing and there is no default, or does not parse.
fn split_host_port(authority: &str, default_port: Option<u16>) -> Option<(&str, u16)> {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => default_port?,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((host, port));
    }
    match authority.rsplit_once(':') {
        Some((host, port)) => Some((host, port.parse().ok()?)),
        None => Some((authority, default_port?)),
    }
}

/// A target as a client named it to a fake proxy: a CONNECT authority or a
/// SOCKS request's destination, before any resolution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requested {
    /// A host name left for the proxy to resolve (CONNECT with a name,
    /// SOCKS4a, SOCKS5 address type 3).
    Name(String, u16),
    /// An IP address.
    Addr(SocketAddr),
}

impl Requested {
    /// A CONNECT authority's host: an address if it is an IP literal.
    fn from_host(host: &str, port: u16) -> Requested {
        match host.parse::<IpAddr>() {
            Ok(ip) => Requested::Addr(SocketAddr::new(ip, port)),
            Err(_) => Requested::Name(host.to_owned(), port),
        }
    }
}

/// The targets a fake was asked for, in arrival order (the first
/// [`MAX_RECORDED`]).
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Requested>>>);

impl Recorder {
    fn record(&self, target: Requested) {
        let mut seen = self.0.lock().unwrap();
        if seen.len() < MAX_RECORDED {
            seen.push(target);
        }
    }

    fn all(&self) -> Vec<Requested> {
        self.0.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------------------
// HTTP proxy

/// What an HTTP proxy reveals about the client when forwarding plain HTTP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxyKind {
    /// Forwards end-to-end headers untouched and adds none.
    #[default]
    Elite,
    /// Adds `Via: 1.1 fakeproxy`.
    Anonymous,
    /// Adds `X-Forwarded-For: <client IP>` and `Via`.
    Transparent,
}

/// How an HTTP proxy answers each request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Behavior {
    /// A working proxy.
    #[default]
    Normal,
    /// Never contacts the target: answers `200 OK` with [`LIAR_PAGE`] to
    /// requests, and `200 Connection established` then closes to CONNECT.
    Liar,
    /// Answers every request with this status and a short body (with
    /// `Proxy-Authenticate` when it is 407).
    AlwaysStatus(u16),
    /// Waits this long after reading the request, then works normally.
    Slow(Duration),
    /// Reads the request head, then closes with a TCP reset.
    Reset,
    /// Reads the request head and never answers; holds the connection until
    /// the client closes it.
    Hang,
    /// Reads the request head, answers an SSH banner and closes.
    Garbage,
    /// Resets every other connection (the first, the third, …) as `Reset`
    /// does and works normally on the others: a flaky proxy.
    ResetEveryOther,
    /// Works for plain requests and resets every CONNECT after reading it.
    ResetTunnels,
}

/// Options for [`FakeHttpProxy`]. The default is a working elite proxy on
/// 127.0.0.1 without CONNECT, authentication or a bind address.
#[derive(Clone, Debug, Default)]
pub struct HttpProxyOpts {
    /// Which headers it adds when forwarding.
    pub kind: ProxyKind,
    /// Whether CONNECT is allowed; otherwise CONNECT gets 405.
    pub connect: bool,
    /// Required `Proxy-Authorization: Basic` user and password; without
    /// them every request, CONNECT included, gets 407.
    pub auth: Option<(String, String)>,
    /// Local address for upstream connections (e.g. 127.0.0.2), so a judge
    /// tells proxied requests from the checker's direct ones (127.0.0.1).
    pub upstream_bind: Option<IpAddr>,
    /// How it answers.
    pub behavior: Behavior,
    /// Address to listen on; 127.0.0.1 if `None`.
    pub listen: Option<IpAddr>,
    /// Once the flag is set, answers as this behaviour instead: a proxy
    /// that changes its ways while in use.
    pub later: Option<(Arc<AtomicBool>, Behavior)>,
    /// Keeps a client's connection open across plain requests whose
    /// answer has a Content-Length, as most real proxies do; otherwise
    /// every answer closes it.
    pub keep_alive: bool,
    /// With `keep_alive`: answers this many requests on a client's
    /// connection without saying it will close (the site's keep-alive
    /// answer relayed as it came), then reads the next one and hangs up, as
    /// proxies that serve one request per connection do.
    pub close_after: Option<usize>,
    /// With `keep_alive`: also keeps its own connection to the site open
    /// across a client connection's requests, as a proxy with a connection
    /// pool does (benches use it so the fake costs little per request).
    pub reuse_site: bool,
}

/// A loopback HTTP/1.1 forward proxy (absolute-form requests and CONNECT).
/// Dropping it stops the server and closes its connections.
pub struct FakeHttpProxy {
    server: Server,
    /// Request heads received (a CONNECT counts as one).
    count: Arc<AtomicUsize>,
    /// Client connections accepted.
    connections: Arc<AtomicUsize>,
    /// CONNECT targets asked for.
    targets: Recorder,
    /// Plain requests forwarded, by target authority.
    forwarded: ForwardCounts,
}

impl FakeHttpProxy {
    /// Binds and starts serving; the proxy accepts connections on return.
    pub async fn start(opts: HttpProxyOpts) -> FakeHttpProxy {
        let listener = bind(opts.listen);
        Self::serve(listener, Arc::new(opts))
    }

    /// Serves on a listener the caller bound (`opts.listen` is ignored): a
    /// fixed address, so that a proxy stopped by dropping it can come back
    /// on the same one, as a restarted proxy does.
    pub fn start_on(listener: TcpListener, opts: HttpProxyOpts) -> FakeHttpProxy {
        Self::serve(listener, Arc::new(opts))
    }

    fn serve(listener: TcpListener, opts: Arc<HttpProxyOpts>) -> FakeHttpProxy {
        let count = Arc::new(AtomicUsize::new(0));
        let counter = count.clone();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = connections.clone();
        let targets = Recorder::default();
        let recorder = targets.clone();
        let forwarded = ForwardCounts::default();
        let forwards = forwarded.clone();
        let server = serve(listener, move |stream, peer| {
            accepted.fetch_add(1, Ordering::SeqCst);
            http_proxy_conn(
                stream,
                peer,
                opts.clone(),
                counter.clone(),
                recorder.clone(),
                forwards.clone(),
            )
        });
        FakeHttpProxy {
            server,
            count,
            connections,
            targets,
            forwarded,
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// `http://ip:port`, for a client's proxy setting.
    pub fn url(&self) -> String {
        format!("http://{}", self.server.addr)
    }

    /// How many requests (heads) it has received so far.
    pub fn requests(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// How many client connections it has accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// The CONNECT targets it was asked for, as sent.
    pub fn targets(&self) -> Vec<Requested> {
        self.targets.all()
    }

    /// How many plain (absolute-form) requests for `authority`
    /// (`host[:port]`, as the client wrote it) it has taken to forward so
    /// far.
    pub fn forwarded_to(&self, authority: &str) -> usize {
        self.forwarded
            .0
            .lock()
            .unwrap()
            .get(authority)
            .copied()
            .unwrap_or(0)
    }
}

/// Plain requests a fake proxy took to forward, counted by target
/// authority (the first [`MAX_RECORDED`] authorities only).
#[derive(Clone, Default)]
struct ForwardCounts(Arc<Mutex<std::collections::HashMap<String, usize>>>);

impl ForwardCounts {
    fn count(&self, head: &Head) {
        let Ok(f) = origin_form(head) else {
            return;
        };
        let mut counts = self.0.lock().unwrap();
        if let Some(n) = counts.get_mut(f.authority) {
            *n += 1;
        } else if counts.len() < MAX_RECORDED {
            counts.insert(f.authority.to_owned(), 1);
        }
    }
}

fn authorized(head: &Head, (user, pass): &(String, String)) -> bool {
    let Some(value) = head.header("proxy-authorization") else {
        return false;
    };
    let Some((scheme, token)) = value.split_once(' ') else {
        return false;
    };
    if !scheme.eq_ignore_ascii_case("basic") {
        return false;
    }
    let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(token.trim()) else {
        return false;
    };
    decoded == format!("{user}:{pass}").as_bytes()
}

async fn http_proxy_conn(
    mut client: TcpStream,
    peer: SocketAddr,
    opts: Arc<HttpProxyOpts>,
    count: Arc<AtomicUsize>,
    targets: Recorder,
    forwarded: ForwardCounts,
) -> io::Result<()> {
    let Some((raw_head, rest)) = read_head(&mut client).await? else {
        return Ok(());
    };
    let n = count.fetch_add(1, Ordering::SeqCst);
    let behavior = match &opts.later {
        Some((flag, later)) if flag.load(Ordering::SeqCst) => later.clone(),
        _ => opts.behavior.clone(),
    };
    let flaky_reset = behavior == Behavior::ResetEveryOther && n.is_multiple_of(2);
    let tunnel_reset = behavior == Behavior::ResetTunnels
        && raw_head
            .get(..8)
            .is_some_and(|m| m.eq_ignore_ascii_case(b"CONNECT "));
    if flaky_reset || tunnel_reset {
        client.set_zero_linger()?;
        return Ok(());
    }
    match behavior {
        Behavior::Reset => {
            // SO_LINGER 0: closing sends RST instead of FIN.
            client.set_zero_linger()?;
            return Ok(());
        }
        Behavior::Hang => return drain(&mut client).await,
        Behavior::Garbage => {
            client.write_all(GARBAGE).await?;
            return finish(client).await;
        }
        Behavior::Slow(delay) => tokio::time::sleep(delay).await,
        _ => {}
    }
    let Some(head) = Head::parse(&raw_head) else {
        return respond(client, 400, &[], b"bad request").await;
    };
    if let Some(creds) = &opts.auth
        && !authorized(&head, creds)
    {
        let challenge = [("Proxy-Authenticate", "Basic realm=\"fake\"")];
        return respond(client, 407, &challenge, b"proxy authentication required").await;
    }
    let is_connect = head.first.eq_ignore_ascii_case("CONNECT");
    match behavior {
        Behavior::Liar if is_connect => {
            client
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await?;
            return finish(client).await;
        }
        Behavior::Liar => {
            return respond(
                client,
                200,
                &[("Content-Type", "text/html")],
                LIAR_PAGE.as_bytes(),
            )
            .await;
        }
        Behavior::AlwaysStatus(status) => {
            let body = format!("fake proxy says {status}");
            let challenge: &[(&str, &str)] = if status == 407 {
                &[("Proxy-Authenticate", "Basic realm=\"fake\"")]
            } else {
                &[]
            };
            return respond(client, status, challenge, body.as_bytes()).await;
        }
        _ => {}
    }
    if is_connect {
        if !opts.connect {
            return respond(client, 405, &[("Allow", "GET, HEAD, POST")], b"no CONNECT").await;
        }
        tunnel(client, &head, rest, &opts, &targets).await
    } else if opts.keep_alive && rest.is_empty() {
        let mut head = head;
        let mut site = None;
        let _ = client.set_nodelay(true);
        let mut served = 0;
        loop {
            forwarded.count(&head);
            if !forward_kept(&mut client, &head, &opts, &mut site).await? {
                return finish(client).await;
            }
            served += 1;
            if opts.close_after.is_some_and(|n| served >= n) {
                // Hangs up once the next request arrives, unanswered: the
                // client finds its kept connection closed only by using it.
                if let Ok(Some(_)) = read_head(&mut client).await {
                    count.fetch_add(1, Ordering::SeqCst);
                }
                return finish(client).await;
            }
            let Some((raw_head, rest)) = read_head(&mut client).await? else {
                return Ok(());
            };
            count.fetch_add(1, Ordering::SeqCst);
            match Head::parse(&raw_head) {
                Some(h) if rest.is_empty() && !h.first.eq_ignore_ascii_case("CONNECT") => head = h,
                _ => return respond(client, 400, &[], b"bad request").await,
            }
        }
    } else {
        forwarded.count(&head);
        forward(client, peer, &head, rest, &opts).await
    }
}

/// A plain request on its way to the site.
struct Forwarded<'a> {
    /// The target's `host[:port]`, as the client wrote it.
    authority: &'a str,
    host: &'a str,
    port: u16,
    /// The origin-form request line and the client's end-to-end headers,
    /// `Host` added when missing; the caller adds its own connection
    /// headers and the blank line.
    head: String,
}

/// Splits the absolute-form `http://` target of `head` and writes the
/// request head the site gets; otherwise what to tell the client.
fn origin_form(head: &Head) -> Result<Forwarded<'_>, &'static [u8]> {
    let target = head.second.as_str();
    let after_scheme = target
        .get(..7)
        .filter(|s| s.eq_ignore_ascii_case("http://"))
        .map(|_| &target[7..])
        .ok_or(b"absolute http:// URL required".as_slice())?;
    let split = after_scheme.find(['/', '?']).unwrap_or(after_scheme.len());
    let (authority, path) = after_scheme.split_at(split);
    let origin = match path {
        "" => "/".to_owned(),
        p if p.starts_with('?') => format!("/{p}"),
        p => p.to_owned(),
    };
    let (host, port) =
        split_host_port(authority, Some(80)).ok_or(b"bad target authority".as_slice())?;
    let listed = connection_tokens(head);
    let mut out = format!("{} {origin} HTTP/1.1\r\n", head.first);
    if head.header("host").is_none() {
        out.push_str(&format!("Host: {authority}\r\n"));
    }
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name, &listed) {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    Ok(Forwarded {
        authority,
        host,
        port,
        head: out,
    })
}

/// One plain request without a body on a kept-alive client connection: the
/// answer keeps the connection open when its length is known. `Ok(false)`
/// when the connection is to close. `site` is the connection to the site
/// kept from the last request (with [`HttpProxyOpts::reuse_site`]), by
/// authority.
async fn forward_kept(
    client: &mut TcpStream,
    head: &Head,
    opts: &HttpProxyOpts,
    site: &mut Option<(String, TcpStream)>,
) -> io::Result<bool> {
    let Ok(Forwarded {
        authority,
        host,
        port,
        head: mut out,
    }) = origin_form(head)
    else {
        return Ok(false);
    };
    // A client that asks to close gets its answer and the close, as real
    // proxies (and RFC 9112 §9.6) have it.
    let client_closes = head
        .header("connection")
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
    let kept = site
        .take()
        .filter(|(a, _)| opts.reuse_site && a == authority);
    let reused = kept.is_some();
    let mut upstream = match kept {
        Some((_, s)) => s,
        None => match connect_upstream(host, port, opts.upstream_bind).await {
            Ok(s) => s,
            Err(_) => {
                client
                    .write_all(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                    .await?;
                return Ok(true);
            }
        },
    };
    if !opts.reuse_site {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    let mut answer = None;
    if upstream.write_all(out.as_bytes()).await.is_ok() {
        answer = read_head(&mut upstream).await.ok().flatten();
    }
    if answer.is_none() && reused {
        // The site closed the kept connection meanwhile: a new one.
        let Ok(fresh) = connect_upstream(host, port, opts.upstream_bind).await else {
            return Ok(false);
        };
        upstream = fresh;
        upstream.write_all(out.as_bytes()).await?;
        answer = read_head(&mut upstream).await?;
    }
    let Some((raw_head, rest)) = answer else {
        return Ok(false);
    };
    let Some(resp) = Head::parse(&raw_head).filter(|h| h.first.starts_with("HTTP/")) else {
        return Ok(false);
    };
    let length: Option<u64> = resp
        .header("content-length")
        .and_then(|v| v.trim().parse().ok());
    let listed = connection_tokens(&resp);
    let mut out = format!("{} {} {}\r\n", resp.first, resp.second, resp.third);
    for (name, value) in &resp.headers {
        if !is_hop_by_hop(name, &listed) {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    if length.is_none() || client_closes {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    // One write for the head and what came with it: on a kept-alive
    // connection a second small write would wait for the client's delayed
    // ACK (Nagle).
    let mut answer = out.into_bytes();
    answer.extend_from_slice(&rest);
    client.write_all(&answer).await?;
    match length {
        Some(n) => {
            let left = n.saturating_sub(rest.len() as u64);
            tokio::io::copy(&mut (&mut upstream).take(left), client).await?;
            let closes = resp
                .header("connection")
                .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("close")));
            if opts.reuse_site && !closes {
                *site = Some((authority.to_owned(), upstream));
            }
            Ok(!client_closes)
        }
        None => {
            tokio::io::copy(&mut upstream, client).await?;
            Ok(false)
        }
    }
}

async fn upstream_failure(client: TcpStream, err: UpstreamError) -> io::Result<()> {
    match err {
        UpstreamError::NotLoopback => {
            respond(client, 403, &[], b"fake proxies only reach loopback").await
        }
        UpstreamError::Unresolvable => respond(client, 502, &[], b"cannot resolve").await,
        UpstreamError::Connect => respond(client, 502, &[], b"upstream connect failed").await,
    }
}

/// CONNECT: `200`, then bytes both ways.
async fn tunnel(
    mut client: TcpStream,
    head: &Head,
    rest: Vec<u8>,
    opts: &HttpProxyOpts,
    targets: &Recorder,
) -> io::Result<()> {
    let Some((host, port)) = split_host_port(&head.second, None) else {
        return respond(client, 400, &[], b"bad CONNECT target").await;
    };
    targets.record(Requested::from_host(host, port));
    let mut upstream = match connect_upstream(host, port, opts.upstream_bind).await {
        Ok(s) => s,
        Err(e) => return upstream_failure(client, e).await,
    };
    client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await?;
    upstream.write_all(&rest).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

/// Headers a proxy consumes rather than forwards (RFC 9110 §7.6.1), plus
/// `Proxy-Connection`, which clients send and elite proxies must not leak.
fn is_hop_by_hop(name: &str, listed: &[String]) -> bool {
    [
        "connection",
        "proxy-connection",
        "keep-alive",
        "proxy-authorization",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
        || listed.iter().any(|h| name.eq_ignore_ascii_case(h))
}

fn connection_tokens(head: &Head) -> Vec<String> {
    head.headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
        .flat_map(|(_, v)| v.split(','))
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty())
        .collect()
}

/// Plain HTTP: rewrite absolute-form to origin-form, send upstream with
/// `Connection: close`, relay the response until upstream closes.
async fn forward(
    mut client: TcpStream,
    peer: SocketAddr,
    head: &Head,
    rest: Vec<u8>,
    opts: &HttpProxyOpts,
) -> io::Result<()> {
    let Forwarded {
        host,
        port,
        head: mut out,
        ..
    } = match origin_form(head) {
        Ok(f) => f,
        Err(why) => return respond(client, 400, &[], why).await,
    };
    let mut upstream = match connect_upstream(host, port, opts.upstream_bind).await {
        Ok(s) => s,
        Err(e) => return upstream_failure(client, e).await,
    };

    match opts.kind {
        ProxyKind::Elite => {}
        ProxyKind::Anonymous => out.push_str(&format!("Via: {VIA}\r\n")),
        ProxyKind::Transparent => {
            out.push_str(&format!("X-Forwarded-For: {}\r\n", peer.ip()));
            out.push_str(&format!("Via: {VIA}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    upstream.write_all(out.as_bytes()).await?;

    let (mut client_rd, mut client_wr) = client.split();
    let (mut up_rd, mut up_wr) = upstream.split();
    // Whatever the client sends after the head (a body) goes upstream as is;
    // the exchange ends when the response does, not when the client stops.
    let pump_request = async {
        let _ = async {
            up_wr.write_all(&rest).await?;
            tokio::io::copy(&mut client_rd, &mut up_wr).await
        }
        .await;
        std::future::pending::<()>().await
    };
    let relayed = tokio::select! {
        r = relay_response(&mut up_rd, &mut client_wr) => r,
        () = pump_request => unreachable!("pending never completes"),
    };
    match relayed {
        Ok(true) => finish(client).await,
        Ok(false) => respond(client, 502, &[], b"upstream sent no response").await,
        Err(e) => Err(e),
    }
}

/// Copies one response, replacing its connection headers with
/// `Connection: close`. `Ok(false)` if upstream sent no valid head.
async fn relay_response<R, W>(upstream: &mut R, client: &mut W) -> io::Result<bool>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let Some((raw_head, rest)) = read_head(upstream).await? else {
        return Ok(false);
    };
    let Some(head) = Head::parse(&raw_head).filter(|h| h.first.starts_with("HTTP/")) else {
        return Ok(false);
    };
    let listed = connection_tokens(&head);
    let mut out = format!("{} {} {}\r\n", head.first, head.second, head.third);
    for (name, value) in &head.headers {
        if !is_hop_by_hop(name, &listed) {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
    }
    out.push_str("Connection: close\r\n\r\n");
    client.write_all(out.as_bytes()).await?;
    client.write_all(&rest).await?;
    tokio::io::copy(upstream, client).await?;
    Ok(true)
}

// ---------------------------------------------------------------------------
// SOCKS

/// How a SOCKS server answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SocksBehavior {
    /// A working server.
    #[default]
    Normal,
    /// Accepts and never answers the greeting; holds the connection until
    /// the client closes it.
    Hang,
    /// Reads the greeting, answers an SSH banner and closes.
    Garbage,
}

/// Options for [`FakeSocks4`] and [`FakeSocks5`]. The default is a working
/// server on 127.0.0.1 without authentication or a bind address.
#[derive(Clone, Debug, Default)]
pub struct SocksOpts {
    /// SOCKS5: required username/password (RFC 1929). SOCKS4 has no
    /// password: the user ID must equal the user and the password is ignored.
    pub auth: Option<(String, String)>,
    /// Local address for upstream connections, as for HTTP proxies.
    pub upstream_bind: Option<IpAddr>,
    /// How it answers.
    pub behavior: SocksBehavior,
    /// Address to listen on; 127.0.0.1 if `None`.
    pub listen: Option<IpAddr>,
}

/// A loopback SOCKS server of version `V` (4 or 5), CONNECT only.
/// Dropping it stops it.
pub struct FakeSocks<const V: u8> {
    server: Server,
    /// Connections accepted.
    count: Arc<AtomicUsize>,
    /// Destinations of well-formed requests.
    targets: Recorder,
}

/// A loopback SOCKS4/SOCKS4a server (CONNECT only).
pub type FakeSocks4 = FakeSocks<4>;

/// A loopback SOCKS5 server (CONNECT only, RFC 1928/1929).
pub type FakeSocks5 = FakeSocks<5>;

/// Which SOCKS dialect a server speaks.
#[derive(Clone, Copy)]
enum SocksVersion {
    Four,
    Five,
}

fn serve_socks(
    listener: TcpListener,
    opts: SocksOpts,
    version: SocksVersion,
) -> (Server, Arc<AtomicUsize>, Recorder) {
    let opts = Arc::new(opts);
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let targets = Recorder::default();
    let recorder = targets.clone();
    let server = serve(listener, move |stream, _peer| {
        counter.fetch_add(1, Ordering::SeqCst);
        socks_conn(stream, opts.clone(), version, recorder.clone())
    });
    (server, count, targets)
}

async fn socks_conn(
    mut stream: TcpStream,
    opts: Arc<SocksOpts>,
    version: SocksVersion,
    targets: Recorder,
) -> io::Result<()> {
    match (opts.behavior, version) {
        (SocksBehavior::Normal, SocksVersion::Four) => socks4_conn(stream, &opts, &targets).await,
        (SocksBehavior::Normal, SocksVersion::Five) => socks5_conn(stream, &opts, &targets).await,
        (SocksBehavior::Hang, _) => drain(&mut stream).await,
        (SocksBehavior::Garbage, _) => {
            let mut greeting = [0u8; 512];
            let _ = stream.read(&mut greeting).await?;
            stream.write_all(GARBAGE).await?;
            finish(stream).await
        }
    }
}

impl<const V: u8> FakeSocks<V> {
    /// Binds and starts serving; the server accepts connections on return.
    pub async fn start(opts: SocksOpts) -> FakeSocks<V> {
        let version = const {
            match V {
                4 => SocksVersion::Four,
                5 => SocksVersion::Five,
                _ => panic!("SOCKS versions are 4 and 5"),
            }
        };
        let listener = bind(opts.listen);
        let (server, count, targets) = serve_socks(listener, opts, version);
        FakeSocks {
            server,
            count,
            targets,
        }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// `socks4://ip:port` or `socks5://ip:port`.
    pub fn url(&self) -> String {
        format!("socks{V}://{}", self.server.addr)
    }

    /// How many connections it has accepted.
    pub fn requests(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// The destinations it was asked for: names as sent (SOCKS4a, SOCKS5
    /// address type 3), addresses otherwise.
    pub fn targets(&self) -> Vec<Requested> {
        self.targets.all()
    }
}

/// Reads a NUL-terminated string of at most 255 bytes, byte by byte so
/// nothing the client sends after it is consumed.
async fn read_cstr(stream: &mut TcpStream) -> io::Result<Option<String>> {
    let mut out = Vec::new();
    loop {
        let b = stream.read_u8().await?;
        if b == 0 {
            return Ok(String::from_utf8(out).ok());
        }
        if out.len() == 255 {
            return Ok(None);
        }
        out.push(b);
    }
}

async fn socks4_conn(
    mut client: TcpStream,
    opts: &SocksOpts,
    targets: &Recorder,
) -> io::Result<()> {
    const GRANTED: u8 = 0x5A;
    const REJECTED: u8 = 0x5B;
    async fn reply(client: &mut TcpStream, code: u8, bound: SocketAddr) -> io::Result<()> {
        let ip = match bound.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        };
        let mut msg = vec![0x00, code];
        msg.extend_from_slice(&bound.port().to_be_bytes());
        msg.extend_from_slice(&ip.octets());
        client.write_all(&msg).await
    }
    let unbound = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

    let mut req = [0u8; 8];
    client.read_exact(&mut req).await?;
    if req[0] != 4 {
        return Ok(());
    }
    let port = u16::from_be_bytes([req[2], req[3]]);
    let ip = Ipv4Addr::new(req[4], req[5], req[6], req[7]);
    let Some(user_id) = read_cstr(&mut client).await? else {
        return Ok(());
    };
    // SOCKS4a: 0.0.0.x (x ≠ 0) means a hostname follows the user ID.
    let host = match ip.octets() {
        [0, 0, 0, x] if x != 0 => match read_cstr(&mut client).await? {
            Some(name) => {
                targets.record(Requested::Name(name.clone(), port));
                name
            }
            None => return Ok(()),
        },
        _ => {
            targets.record(Requested::Addr(SocketAddr::new(IpAddr::V4(ip), port)));
            ip.to_string()
        }
    };
    let user_ok = opts.auth.as_ref().is_none_or(|(user, _)| *user == user_id);
    if req[1] != 1 || !user_ok {
        return reply(&mut client, REJECTED, unbound).await;
    }
    let mut upstream = match connect_upstream(&host, port, opts.upstream_bind).await {
        Ok(s) => s,
        Err(_) => return reply(&mut client, REJECTED, unbound).await,
    };
    reply(&mut client, GRANTED, upstream.local_addr()?).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

async fn socks5_conn(
    mut client: TcpStream,
    opts: &SocksOpts,
    targets: &Recorder,
) -> io::Result<()> {
    const NO_AUTH: u8 = 0x00;
    const USER_PASS: u8 = 0x02;
    const NO_ACCEPTABLE: u8 = 0xFF;
    async fn reply(client: &mut TcpStream, code: u8, bound: SocketAddr) -> io::Result<()> {
        let mut msg = vec![0x05, code, 0x00];
        match bound.ip() {
            IpAddr::V4(ip) => {
                msg.push(0x01);
                msg.extend_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                msg.push(0x04);
                msg.extend_from_slice(&ip.octets());
            }
        }
        msg.extend_from_slice(&bound.port().to_be_bytes());
        client.write_all(&msg).await
    }
    let unbound = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0);

    // Greeting: VER, NMETHODS, METHODS.
    let [ver, n] = {
        let mut b = [0u8; 2];
        client.read_exact(&mut b).await?;
        b
    };
    if ver != 5 {
        return Ok(());
    }
    let mut methods = vec![0u8; usize::from(n)];
    client.read_exact(&mut methods).await?;
    let wanted = if opts.auth.is_some() {
        USER_PASS
    } else {
        NO_AUTH
    };
    if !methods.contains(&wanted) {
        client.write_all(&[0x05, NO_ACCEPTABLE]).await?;
        return finish(client).await;
    }
    client.write_all(&[0x05, wanted]).await?;

    if let Some((user, pass)) = &opts.auth {
        // RFC 1929: VER=1, ULEN, UNAME, PLEN, PASSWD.
        let sub_ver = client.read_u8().await?;
        let ulen = client.read_u8().await?;
        let mut uname = vec![0u8; usize::from(ulen)];
        client.read_exact(&mut uname).await?;
        let plen = client.read_u8().await?;
        let mut passwd = vec![0u8; usize::from(plen)];
        client.read_exact(&mut passwd).await?;
        let ok = sub_ver == 1 && uname == user.as_bytes() && passwd == pass.as_bytes();
        client
            .write_all(&[0x01, if ok { 0x00 } else { 0x01 }])
            .await?;
        if !ok {
            return finish(client).await;
        }
    }

    // Request: VER, CMD, RSV, ATYP, DST.ADDR, DST.PORT.
    let mut req = [0u8; 4];
    client.read_exact(&mut req).await?;
    if req[0] != 5 {
        return Ok(());
    }
    let host = match req[3] {
        0x01 => {
            let mut b = [0u8; 4];
            client.read_exact(&mut b).await?;
            Ipv4Addr::from(b).to_string()
        }
        0x03 => {
            let len = client.read_u8().await?;
            let mut b = vec![0u8; usize::from(len)];
            client.read_exact(&mut b).await?;
            String::from_utf8_lossy(&b).into_owned()
        }
        0x04 => {
            let mut b = [0u8; 16];
            client.read_exact(&mut b).await?;
            std::net::Ipv6Addr::from(b).to_string()
        }
        _ => {
            // Address type not supported.
            reply(&mut client, 0x08, unbound).await?;
            return finish(client).await;
        }
    };
    let port = client.read_u16().await?;
    targets.record(match req[3] {
        0x03 => Requested::Name(host.clone(), port),
        _ => Requested::from_host(&host, port),
    });
    if req[1] != 0x01 {
        // Command not supported: only CONNECT.
        reply(&mut client, 0x07, unbound).await?;
        return finish(client).await;
    }
    let mut upstream = match connect_upstream(&host, port, opts.upstream_bind).await {
        Ok(s) => s,
        Err(e) => {
            let code = match e {
                UpstreamError::NotLoopback => 0x02,  // not allowed by ruleset
                UpstreamError::Unresolvable => 0x04, // host unreachable
                UpstreamError::Connect => 0x05,      // connection refused
            };
            reply(&mut client, code, unbound).await?;
            return finish(client).await;
        }
    };
    reply(&mut client, 0x00, upstream.local_addr()?).await?;
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Closed port, farm

/// A 127.0.0.1 address with nothing listening: connecting is refused.
pub fn closed_port() -> ClosedPort {
    let socket = TcpSocket::new_v4().expect("tcp socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind 127.0.0.1:0");
    let addr = socket.local_addr().expect("local addr");
    ClosedPort {
        addr,
        _socket: socket,
    }
}

/// A 127.0.0.1 port that refuses connections for as long as this value
/// lives: the socket is bound without `SO_REUSEADDR` and never listens, so
/// no listener started by a concurrent test can be handed the same port.
pub struct ClosedPort {
    addr: SocketAddr,
    _socket: TcpSocket,
}

impl ClosedPort {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }
}

impl fmt::Display for ClosedPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.addr.fmt(f)
    }
}

/// Raises the open-file soft limit to the hard limit, for tests that hold
/// thousands of sockets. Returns the limit now in force.
pub fn raise_nofile_limit() -> u64 {
    rlimit::increase_nofile_limit(u64::MAX).unwrap_or(0)
}

/// Where a [`FakeFarm`] listens: a loopback address of its own.
pub const FARM_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 100, 1));

/// Many proxies at once for scale tests: working elite HTTP proxies and
/// silent listeners that accept and never answer, each on its own
/// port of [`FARM_IP`]. One small task per listener. Dropping it stops
/// them all.
pub struct FakeFarm {
    alive: Vec<FakeHttpProxy>,
    silent: Vec<Server>,
}

impl FakeFarm {
    /// Starts `alive` elite proxies (forwarding from `upstream_bind` if
    /// given; CONNECT allowed) and `silent` mute listeners. Raises the
    /// open-file limit first. 10,000 listeners need about as many
    /// descriptors, plus two per proxied connection. They listen on
    /// [`FARM_IP`], whose ports are its own: a farm leaves 127.0.0.1's
    /// to the servers of the tests running beside it.
    pub async fn start(alive: usize, silent: usize, upstream_bind: Option<IpAddr>) -> FakeFarm {
        FakeFarm::start_at(FARM_IP, alive, silent, upstream_bind).await
    }

    /// [`FakeFarm::start`] listening on `listen` (a loopback address): one
    /// address holds about 28,000 listeners (its ephemeral port range), so
    /// larger farms take several.
    pub async fn start_at(
        listen: IpAddr,
        alive: usize,
        silent: usize,
        upstream_bind: Option<IpAddr>,
    ) -> FakeFarm {
        raise_nofile_limit();
        let opts = Arc::new(HttpProxyOpts {
            connect: true,
            upstream_bind,
            ..HttpProxyOpts::default()
        });
        let mut alive_proxies = Vec::with_capacity(alive);
        for _ in 0..alive {
            let listener = bind(Some(listen));
            alive_proxies.push(FakeHttpProxy::serve(listener, opts.clone()));
        }
        let mut silent_servers = Vec::with_capacity(silent);
        for _ in 0..silent {
            let listener = bind(Some(listen));
            silent_servers.push(serve(listener, |mut stream, _| async move {
                drain(&mut stream).await
            }));
        }
        FakeFarm {
            alive: alive_proxies,
            silent: silent_servers,
        }
    }

    /// Addresses of the working proxies.
    pub fn alive_addrs(&self) -> Vec<SocketAddr> {
        self.alive.iter().map(FakeHttpProxy::addr).collect()
    }

    /// Addresses of the listeners that never answer.
    pub fn silent_addrs(&self) -> Vec<SocketAddr> {
        self.silent.iter().map(|s| s.addr).collect()
    }

    /// Requests received by all working proxies together.
    pub fn requests(&self) -> usize {
        self.alive.iter().map(FakeHttpProxy::requests).sum()
    }

    /// Requests received by each working proxy, in the order of
    /// [`FakeFarm::alive_addrs`].
    pub fn alive_requests(&self) -> Vec<usize> {
        self.alive.iter().map(FakeHttpProxy::requests).collect()
    }
}

// ---------------------------------------------------------------------------
// Echo server

/// A raw TCP echo server on 127.0.0.1: every byte a client sends comes
/// back, so a test sees a tunnel carry data both ways. Dropping it stops it.
pub struct EchoServer {
    server: Server,
}

impl EchoServer {
    /// Binds 127.0.0.1:0 and starts serving.
    pub async fn start() -> EchoServer {
        let server = serve(bind(None), |mut stream, _| async move {
            let (mut rd, mut wr) = stream.split();
            tokio::io::copy(&mut rd, &mut wr).await?;
            Ok(())
        });
        EchoServer { server }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }
}

/// 127.0.0.`last`: a distinct loopback address, so that a site can tell
/// proxies apart by the address they forward from.
pub fn ip(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// A working HTTP proxy (CONNECT allowed) forwarding from 127.0.0.`last`.
pub async fn http_proxy(last: u8) -> FakeHttpProxy {
    FakeHttpProxy::start(HttpProxyOpts {
        connect: true,
        upstream_bind: Some(ip(last)),
        ..HttpProxyOpts::default()
    })
    .await
}

/// A new tunnel to the echo target through `proxy` (the gateway or an
/// upstream): CONNECT, one byte there and back, close.
pub async fn tunnel_once(proxy: SocketAddr, echo: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect(proxy).await else {
        return false;
    };
    let _ = s.set_nodelay(true);
    let head = format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\n\r\n");
    if s.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    if !got.starts_with(b"HTTP/1.1 200") {
        return false;
    }
    if s.write_all(b"x").await.is_err() {
        return false;
    }
    matches!(s.read(&mut buf).await, Ok(1))
}
