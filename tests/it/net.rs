//! The dialer against real loopback proxies of every kind: what reaches the
//! proxy (names unresolved, credentials), whether bytes cross the tunnel,
//! and the stage and reason a caller gets for each way a proxy fails.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::fakes::{
    Behavior, EchoServer, FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, Requested,
    SocksBehavior, SocksOpts, closed_port,
};
use common::judges::{Judge, JudgeEcho};
use proxywarden::model::Reason;
use proxywarden::net::{self, DialError, DialOptions, Target, dial};
use proxywarden::proxy::{Credentials, Proxy, Scheme};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// No test may take longer than this, whatever a server does.
const TEST_LIMIT: Duration = Duration::from_secs(10);

/// Short enough that a silent proxy costs the test little, long enough
/// that loopback handshakes never hit it.
const HANDSHAKE: Duration = Duration::from_millis(300);

/// Runs a test body under [`TEST_LIMIT`].
async fn within<F: Future<Output = ()>>(body: F) {
    tokio::time::timeout(TEST_LIMIT, body)
        .await
        .expect("test exceeded its time limit");
}

fn proxy(scheme: Scheme, addr: SocketAddr, auth: Option<(&str, &str)>) -> Proxy {
    Proxy {
        scheme,
        host: addr.ip(),
        port: addr.port(),
        auth: auth.map(|(username, password)| Credentials {
            username: username.into(),
            password: password.into(),
        }),
    }
}

/// An HTTP proxy that wants `alice:s3cret`, and tunnels when `connect`.
async fn alice_proxy(connect: bool) -> FakeHttpProxy {
    FakeHttpProxy::start(HttpProxyOpts {
        connect,
        auth: Some(("alice".into(), "s3cret".into())),
        ..HttpProxyOpts::default()
    })
    .await
}

fn tunnel() -> DialOptions {
    DialOptions {
        connect_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(2),
        forward: false,
    }
}

fn localhost(port: u16) -> Target {
    Target::new("localhost", port).unwrap()
}

/// Sends a line through `stream` to an [`EchoServer`] and reads it back.
async fn assert_echoes<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S) {
    let msg = b"bytes through the tunnel\n";
    stream.write_all(msg).await.unwrap();
    let mut back = [0u8; 25];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, msg);
}

/// Reads an HTTP response head; returns it and whatever body followed.
async fn read_response<S: AsyncRead + Unpin>(stream: &mut S) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let body = buf.split_off(end + 4);
            return (String::from_utf8(buf).unwrap(), body);
        }
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "closed before a full head: {buf:?}");
        buf.extend_from_slice(&chunk[..n]);
    }
}

#[tokio::test]
async fn http_forward_hands_back_the_proxy_for_absolute_form_requests() {
    within(async {
        let judge = Judge::echo().await;
        let http = alice_proxy(false).await;
        let p = proxy(Scheme::Http, http.addr(), Some(("alice", "s3cret")));
        let opts = DialOptions {
            forward: true,
            ..tunnel()
        };
        let mut dialed = dial(Some(&p), &Target::from(judge.addr), &opts)
            .await
            .unwrap();
        assert!(dialed.forward);
        let auth = net::proxy_authorization(&p).unwrap();
        let req = format!(
            "GET {}?n=1 HTTP/1.1\r\nHost: {}\r\nProxy-Authorization: {auth}\r\n\
             Connection: close\r\n\r\n",
            judge.url(),
            judge.addr
        );
        dialed.stream.write_all(req.as_bytes()).await.unwrap();
        let (head, mut body) = read_response(&mut dialed.stream).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
        dialed.stream.read_to_end(&mut body).await.unwrap();
        let echo = JudgeEcho::parse(std::str::from_utf8(&body).unwrap()).unwrap();
        // The proxy fetched the URL itself and passed on the origin form.
        assert_eq!(echo.url, "/judge?n=1");
        assert_eq!(http.requests(), 1);
        assert!(http.targets().is_empty(), "no CONNECT was sent");
    })
    .await;
}

#[tokio::test]
async fn connect_with_the_right_credentials_opens_the_tunnel() {
    within(async {
        let echo = EchoServer::start().await;
        let http = alice_proxy(true).await;
        let p = proxy(Scheme::Http, http.addr(), Some(("alice", "s3cret")));
        let mut dialed = dial(Some(&p), &Target::from(echo.addr()), &tunnel())
            .await
            .unwrap();
        assert_echoes(&mut dialed.stream).await;
    })
    .await;
}

#[tokio::test]
async fn connect_without_or_with_wrong_credentials_is_proxy_auth_required() {
    within(async {
        let echo = EchoServer::start().await;
        let http = alice_proxy(true).await;
        let target = Target::from(echo.addr());
        for auth in [None, Some(("alice", "wrong"))] {
            let p = proxy(Scheme::Http, http.addr(), auth);
            let r = dial(Some(&p), &target, &tunnel()).await;
            assert_eq!(
                r.err().map(|e| e.reason),
                Some(Reason::ProxyAuthRequired),
                "auth {auth:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn connect_answered_with_an_error_status_is_bad_status() {
    within(async {
        let echo = EchoServer::start().await;
        let target = Target::from(echo.addr());
        // 405 from a proxy that forwards but does not tunnel, then a 502.
        for opts in [
            HttpProxyOpts::default(),
            HttpProxyOpts {
                connect: true,
                behavior: Behavior::AlwaysStatus(502),
                ..HttpProxyOpts::default()
            },
        ] {
            let http = FakeHttpProxy::start(opts.clone()).await;
            let p = proxy(Scheme::Http, http.addr(), None);
            let r = dial(Some(&p), &target, &tunnel()).await;
            assert_eq!(
                r.err(),
                Some(DialError::handshake(Reason::BadStatus)),
                "{opts:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn socks4_sends_the_username_as_its_user_id() {
    within(async {
        let echo = EchoServer::start().await;
        let socks = FakeSocks4::start(SocksOpts {
            auth: Some(("alice".into(), String::new())),
            ..SocksOpts::default()
        })
        .await;
        let target = Target::from(echo.addr());
        let p = proxy(Scheme::Socks4, socks.addr(), Some(("alice", "")));
        let mut dialed = dial(Some(&p), &target, &tunnel()).await.unwrap();
        assert_echoes(&mut dialed.stream).await;
        // SOCKS4 has one reply code for every rejection (0x5B), a wrong user
        // ID included, so it cannot read as an authentication failure.
        let p = proxy(Scheme::Socks4, socks.addr(), Some(("bob", "")));
        let r = dial(Some(&p), &target, &tunnel()).await;
        assert_eq!(r.err().map(|e| e.reason), Some(Reason::BadStatus));
    })
    .await;
}

#[tokio::test]
async fn socks5_password_auth_passes_with_the_right_password_only() {
    within(async {
        let echo = EchoServer::start().await;
        let socks = FakeSocks5::start(SocksOpts {
            auth: Some(("alice".into(), "s3cret".into())),
            ..SocksOpts::default()
        })
        .await;
        let target = Target::from(echo.addr());
        let p = proxy(Scheme::Socks5, socks.addr(), Some(("alice", "s3cret")));
        let mut dialed = dial(Some(&p), &target, &tunnel()).await.unwrap();
        assert_echoes(&mut dialed.stream).await;
        assert_eq!(socks.targets(), [Requested::Addr(echo.addr())]);
        // A wrong password fails the RFC 1929 exchange; no credentials at
        // all leave the client and the server no method in common.
        for auth in [Some(("alice", "wrong")), None] {
            let p = proxy(Scheme::Socks5, socks.addr(), auth);
            let r = dial(Some(&p), &target, &tunnel()).await;
            assert_eq!(
                r.err().map(|e| e.reason),
                Some(Reason::ProxyAuthRequired),
                "auth {auth:?}"
            );
        }
    })
    .await;
}

#[tokio::test]
async fn socks_failure_replies_are_bad_status() {
    within(async {
        let closed = closed_port();
        let target = Target::from(closed.addr());
        let socks4 = FakeSocks4::start(SocksOpts::default()).await;
        let socks5 = FakeSocks5::start(SocksOpts::default()).await;
        for p in [
            proxy(Scheme::Socks4, socks4.addr(), None),
            proxy(Scheme::Socks5, socks5.addr(), None),
        ] {
            let r = dial(Some(&p), &target, &tunnel()).await;
            assert_eq!(
                r.err().map(|e| e.reason),
                Some(Reason::BadStatus),
                "{:?}",
                p.scheme
            );
        }
    })
    .await;
}

#[tokio::test]
async fn socks_proxies_tunnel_even_when_forward_is_asked() {
    within(async {
        let echo = EchoServer::start().await;
        let socks = FakeSocks5::start(SocksOpts::default()).await;
        let p = proxy(Scheme::Socks5, socks.addr(), None);
        let opts = DialOptions {
            forward: true,
            ..tunnel()
        };
        let mut dialed = dial(Some(&p), &Target::from(echo.addr()), &opts)
            .await
            .unwrap();
        assert!(!dialed.forward);
        assert_echoes(&mut dialed.stream).await;
    })
    .await;
}

#[tokio::test]
async fn a_closed_port_is_refused() {
    within(async {
        let closed = closed_port();
        let echo = EchoServer::start().await;
        let target = Target::from(echo.addr());
        for scheme in [Scheme::Http, Scheme::Socks4, Scheme::Socks5] {
            let p = proxy(scheme, closed.addr(), None);
            let r = dial(Some(&p), &target, &tunnel()).await;
            assert_eq!(
                r.err(),
                Some(DialError::connect(Reason::Refused)),
                "{scheme:?}"
            );
        }
        let r = dial(None, &Target::from(closed.addr()), &tunnel()).await;
        assert_eq!(r.err(), Some(DialError::connect(Reason::Refused)), "direct");
    })
    .await;
}

/// One proxy of every scheme, all misbehaving the same way; the fakes
/// stop when this is dropped.
struct OneOfEach {
    http: FakeHttpProxy,
    socks4: FakeSocks4,
    socks5: FakeSocks5,
    proxies: [Proxy; 3],
}

impl OneOfEach {
    async fn start(http: Behavior, socks: SocksBehavior) -> OneOfEach {
        let http = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            behavior: http,
            ..HttpProxyOpts::default()
        })
        .await;
        let opts = SocksOpts {
            behavior: socks,
            ..SocksOpts::default()
        };
        let socks4 = FakeSocks4::start(opts.clone()).await;
        let socks5 = FakeSocks5::start(opts).await;
        let proxies = [
            proxy(Scheme::Http, http.addr(), None),
            proxy(Scheme::Socks4, socks4.addr(), None),
            proxy(Scheme::Socks5, socks5.addr(), None),
        ];
        OneOfEach {
            http,
            socks4,
            socks5,
            proxies,
        }
    }

    /// What the proxy of `scheme` was asked to connect to.
    fn targets(&self, scheme: Scheme) -> Vec<Requested> {
        match scheme {
            Scheme::Http => self.http.targets(),
            Scheme::Socks4 => self.socks4.targets(),
            Scheme::Socks5 => self.socks5.targets(),
        }
    }
}

/// CONNECT, SOCKS4a and SOCKS5h hand a name to the proxy as it is: the
/// proxy resolves it, never we. Bytes then go through end to end.
#[tokio::test]
async fn every_tunnel_sends_a_name_target_unresolved() {
    within(async {
        let echo = EchoServer::start().await;
        let each = OneOfEach::start(Behavior::Normal, SocksBehavior::Normal).await;
        let target = localhost(echo.addr().port());
        for p in &each.proxies {
            let mut dialed = dial(Some(p), &target, &tunnel()).await.unwrap();
            assert!(!dialed.forward, "{:?}", p.scheme);
            assert_echoes(&mut dialed.stream).await;
            assert_eq!(
                each.targets(p.scheme),
                [Requested::Name("localhost".into(), echo.addr().port())],
                "{:?}",
                p.scheme
            );
        }
    })
    .await;
}

/// An address target reaches every kind of proxy as an address.
#[tokio::test]
async fn every_tunnel_sends_an_address_target_as_an_address() {
    within(async {
        let echo = EchoServer::start().await;
        let each = OneOfEach::start(Behavior::Normal, SocksBehavior::Normal).await;
        for p in &each.proxies {
            let mut dialed = dial(Some(p), &Target::from(echo.addr()), &tunnel())
                .await
                .unwrap();
            assert_echoes(&mut dialed.stream).await;
            assert_eq!(
                each.targets(p.scheme),
                [Requested::Addr(echo.addr())],
                "{:?}",
                p.scheme
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_never_answers_hits_the_handshake_timeout() {
    within(async {
        let echo = EchoServer::start().await;
        let target = Target::from(echo.addr());
        let each = OneOfEach::start(Behavior::Hang, SocksBehavior::Hang).await;
        // The connect may take an hour: only the handshake's own timeout
        // can end these dials within the test's limit.
        let opts = DialOptions {
            handshake_timeout: HANDSHAKE,
            connect_timeout: Duration::from_secs(3600),
            ..tunnel()
        };
        for p in &each.proxies {
            let start = Instant::now();
            let r = dial(Some(p), &target, &opts).await;
            let took = start.elapsed();
            assert_eq!(
                r.err(),
                Some(DialError::handshake(Reason::Timeout)),
                "{:?}",
                p.scheme
            );
            assert!(took >= HANDSHAKE, "{:?} took {took:?}", p.scheme);
        }
    })
    .await;
}

#[tokio::test]
async fn a_garbage_reply_is_a_protocol_error() {
    within(async {
        let echo = EchoServer::start().await;
        let target = Target::from(echo.addr());
        let each = OneOfEach::start(Behavior::Garbage, SocksBehavior::Garbage).await;
        for p in &each.proxies {
            let r = dial(Some(p), &target, &tunnel()).await;
            assert_eq!(
                r.err().map(|e| e.reason),
                Some(Reason::ProtocolError),
                "{:?}",
                p.scheme
            );
        }
    })
    .await;
}

#[tokio::test]
async fn a_reset_during_connect_is_reset() {
    within(async {
        let echo = EchoServer::start().await;
        let http = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            behavior: Behavior::Reset,
            ..HttpProxyOpts::default()
        })
        .await;
        let p = proxy(Scheme::Http, http.addr(), None);
        let r = dial(Some(&p), &Target::from(echo.addr()), &tunnel()).await;
        assert_eq!(r.err().map(|e| e.reason), Some(Reason::Reset));
    })
    .await;
}

#[tokio::test]
async fn a_direct_dial_resolves_names_itself() {
    within(async {
        let echo = EchoServer::start().await;
        for target in [Target::from(echo.addr()), localhost(echo.addr().port())] {
            let mut dialed = dial(None, &target, &tunnel()).await.unwrap();
            assert!(!dialed.forward);
            assert_echoes(&mut dialed.stream).await;
        }
    })
    .await;
}

#[tokio::test]
async fn tls_through_a_tunnel_verifies_the_certificate() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let judge = Judge::tls(dir.path()).await;
        let http = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            ..HttpProxyOpts::default()
        })
        .await;
        let p = proxy(Scheme::Http, http.addr(), None);
        let target = Target::from(judge.addr);
        let trusting = net::tls::client_config(Some(judge.ca_file()), net::tls::ALPN_H1).unwrap();
        let public_roots = net::tls::client_config(None, net::tls::ALPN_H1).unwrap();
        let ip = judge.addr.ip().to_string();

        let dialed = dial(Some(&p), &target, &tunnel()).await.unwrap();
        let mut tls = net::tls::connect(&trusting, &ip, dialed.stream)
            .await
            .unwrap();
        let req = format!(
            "GET /judge HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            judge.addr
        );
        tls.write_all(req.as_bytes()).await.unwrap();
        let (head, _) = read_response(&mut tls).await;
        assert!(head.starts_with("HTTP/1.1 200 "), "{head}");

        // A CA the client does not trust, and a name the certificate does
        // not cover, both fail: the tunnel gets no interception-friendly
        // shortcut.
        for (config, name) in [(&public_roots, ip.as_str()), (&trusting, "localhost")] {
            let dialed = dial(Some(&p), &target, &tunnel()).await.unwrap();
            let r = net::tls::connect(config, name, dialed.stream).await;
            assert_eq!(r.err(), Some(Reason::TlsError), "{name}");
        }
    })
    .await;
}
