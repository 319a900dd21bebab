//! The loopback fakes (`tests/common/fakes.rs`) driven by curl, an
//! independent client: what a working, lying or broken proxy looks like from
//! outside must be what the checker's tests assume.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use common::fakes::{
    Behavior, FakeFarm, FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, LIAR_PAGE, ProxyKind,
    SocksBehavior, SocksOpts, VIA, closed_port,
};
use common::judges::{Judge, JudgeEcho};
use common::site::{Reply, Site};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const CURL: &str = "/usr/bin/curl";

fn lo(last: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
}

/// What one curl run produced.
#[derive(Debug)]
struct Curl {
    /// curl's exit code (0 on success; 7 refused, 28 timeout, 56 recv…).
    exit: i32,
    /// The final HTTP status (`%{http_code}`), 0 if none.
    status: u16,
    /// The CONNECT response status (`%{http_connect}`), 0 if none.
    connect_status: u16,
    /// The response body.
    body: String,
}

impl Curl {
    fn echo(&self) -> JudgeEcho {
        JudgeEcho::parse(&self.body).unwrap_or_else(|| panic!("not a judge echo: {self:?}"))
    }
}

/// Runs curl with `args` and a clean environment (no proxy variables, no
/// ~/.curlrc), capped at `max_time` seconds.
async fn curl(max_time: &str, args: &[&str]) -> Curl {
    let out = tokio::process::Command::new(CURL)
        .env_clear()
        .arg("-q")
        .args(["-s", "--max-time", max_time])
        .args(["-w", "\n%{http_code} %{http_connect}"])
        .args(args)
        .output()
        .await
        .expect("run curl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, codes) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    let mut codes = codes.split(' ').map(|c| c.parse().unwrap_or(0));
    Curl {
        exit: out.status.code().unwrap_or(-1),
        status: codes.next().unwrap_or(0),
        connect_status: codes.next().unwrap_or(0),
        body: body.to_owned(),
    }
}

fn opts(kind: ProxyKind, bind: u8) -> HttpProxyOpts {
    HttpProxyOpts {
        kind,
        upstream_bind: Some(lo(bind)),
        ..HttpProxyOpts::default()
    }
}

#[tokio::test]
async fn direct_requests_come_from_127_0_0_1() {
    let judge = Judge::echo().await;
    let r = curl("5", &["--noproxy", "*", &judge.at("/direct?a=b")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(1));
    assert_eq!(echo.url, "/direct?a=b");
    assert_eq!(judge.requests(), 1);
}

#[tokio::test]
async fn elite_proxy_forwards_from_its_bind_address_and_adds_nothing() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(opts(ProxyKind::Elite, 2)).await;
    let r = curl(
        "5",
        &[
            "--proxy",
            &proxy.url(),
            "-H",
            "X-Probe: 42",
            &judge.at("/x?n=1"),
        ],
    )
    .await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(2));
    assert_eq!(echo.url, "/x?n=1", "rewritten to origin-form");
    assert_eq!(echo.header("x-probe"), Some("42"));
    assert_eq!(echo.header("host"), Some(judge.addr.to_string().as_str()));
    for revealing in ["via", "x-forwarded-for", "forwarded", "proxy-connection"] {
        assert_eq!(echo.header(revealing), None, "{revealing} leaked: {echo:?}");
    }
    assert_eq!(proxy.requests(), 1);
}

#[tokio::test]
async fn anonymous_proxy_adds_via_only() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(opts(ProxyKind::Anonymous, 3)).await;
    let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/a")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(3));
    assert_eq!(echo.header("via"), Some(VIA));
    assert_eq!(echo.header("x-forwarded-for"), None);
}

#[tokio::test]
async fn transparent_proxy_reveals_the_client_address() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(opts(ProxyKind::Transparent, 2)).await;
    let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/t")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(2));
    assert_eq!(echo.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(echo.header("via"), Some(VIA));
}

#[tokio::test]
async fn post_bodies_are_forwarded() {
    let target = Site::routes(vec![("/form", Reply::ok("posted"))]).await;
    let proxy = FakeHttpProxy::start(opts(ProxyKind::Elite, 2)).await;
    let r = curl(
        "5",
        &[
            "--proxy",
            &proxy.url(),
            "--data",
            "a=1&b=2",
            &target.url("/form"),
        ],
    )
    .await;
    assert_eq!((r.exit, r.status, r.body.as_str()), (0, 200, "posted"));
    assert_eq!(target.hits("/form"), 1);
}

#[tokio::test]
async fn auth_is_required_for_requests_and_connect() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        connect: true,
        auth: Some(("user".into(), "pa:ss".into())),
        upstream_bind: Some(lo(2)),
        ..HttpProxyOpts::default()
    })
    .await;
    let url = judge.at("/auth");

    let r = curl("5", &["--proxy", &proxy.url(), &url]).await;
    assert_eq!(r.status, 407, "{r:?}");
    let r = curl("5", &["-i", "--proxy", &proxy.url(), &url]).await;
    assert!(
        r.body.contains("Proxy-Authenticate: Basic realm=\"fake\""),
        "{r:?}"
    );
    let r = curl(
        "5",
        &["--proxy", &proxy.url(), "--proxy-user", "user:wrong", &url],
    )
    .await;
    assert_eq!(r.status, 407, "{r:?}");

    let r = curl(
        "5",
        &["--proxy", &proxy.url(), "--proxy-user", "user:pa:ss", &url],
    )
    .await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(2));
    assert_eq!(
        echo.header("proxy-authorization"),
        None,
        "credentials must not reach the target"
    );

    let r = curl("5", &["-p", "--proxy", &proxy.url(), &url]).await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert_eq!(r.connect_status, 407, "{r:?}");
    let r = curl(
        "5",
        &[
            "-p",
            "--proxy",
            &proxy.url(),
            "--proxy-user",
            "user:pa:ss",
            &url,
        ],
    )
    .await;
    assert_eq!((r.exit, r.status, r.connect_status), (0, 200, 200), "{r:?}");
    assert_eq!(judge.requests(), 2);
}

#[tokio::test]
async fn connect_tunnels_bytes_without_touching_headers() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        kind: ProxyKind::Transparent,
        connect: true,
        upstream_bind: Some(lo(3)),
        ..HttpProxyOpts::default()
    })
    .await;
    let r = curl("5", &["-p", "--proxy", &proxy.url(), &judge.at("/tunnel")]).await;
    assert_eq!((r.exit, r.status, r.connect_status), (0, 200, 200), "{r:?}");
    let echo = r.echo();
    assert_eq!(echo.remote_addr.ip(), lo(3));
    assert_eq!(echo.url, "/tunnel");
    assert_eq!(echo.header("via"), None, "a tunnel cannot add headers");
    assert_eq!(echo.header("x-forwarded-for"), None);
}

#[tokio::test]
async fn connect_is_refused_when_disabled() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts::default()).await;
    let r = curl("5", &["-p", "--proxy", &proxy.url(), &judge.at("/")]).await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert_eq!(r.connect_status, 405, "{r:?}");
    assert_eq!(judge.requests(), 0);
    assert_eq!(proxy.requests(), 1);
}

#[tokio::test]
async fn liar_serves_its_own_page_and_never_reaches_the_target() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        behavior: Behavior::Liar,
        connect: true,
        ..HttpProxyOpts::default()
    })
    .await;
    let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/x")]).await;
    assert_eq!((r.exit, r.status, r.body.as_str()), (0, 200, LIAR_PAGE));
    let r = curl("5", &["-p", "--proxy", &proxy.url(), &judge.at("/x")]).await;
    assert_eq!(r.connect_status, 200, "{r:?}");
    assert_ne!(r.exit, 0, "the tunnel closes at once: {r:?}");
    assert_eq!(judge.requests(), 0);
}

#[tokio::test]
async fn always_status_answers_every_request_with_it() {
    let judge = Judge::echo().await;
    for status in [403u16, 407, 502] {
        let proxy = FakeHttpProxy::start(HttpProxyOpts {
            behavior: Behavior::AlwaysStatus(status),
            connect: true,
            ..HttpProxyOpts::default()
        })
        .await;
        let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/")]).await;
        assert_eq!((r.exit, r.status), (0, status), "{r:?}");
        let r = curl("5", &["-p", "--proxy", &proxy.url(), &judge.at("/")]).await;
        assert_eq!(r.connect_status, status, "{r:?}");
    }
    assert_eq!(judge.requests(), 0);
}

#[tokio::test]
async fn slow_proxy_answers_late() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        behavior: Behavior::Slow(Duration::from_millis(400)),
        ..HttpProxyOpts::default()
    })
    .await;
    let r = curl("0.15", &["--proxy", &proxy.url(), &judge.at("/")]).await;
    assert_eq!(r.exit, 28, "timed out: {r:?}");
    let started = Instant::now();
    let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn reset_garbage_and_hang_break_the_client() {
    let judge = Judge::echo().await;
    let url = judge.at("/");
    for behavior in [Behavior::Reset, Behavior::Garbage, Behavior::Hang] {
        let proxy = FakeHttpProxy::start(HttpProxyOpts {
            behavior: behavior.clone(),
            ..HttpProxyOpts::default()
        })
        .await;
        let r = curl("0.5", &["--proxy", &proxy.url(), &url]).await;
        match behavior {
            // 56: "Recv failure: Connection reset by peer".
            Behavior::Reset => assert_eq!(r.exit, 56, "{r:?}"),
            // Not HTTP at all: curl refuses an HTTP/0.9-looking answer.
            Behavior::Garbage => assert!(r.exit != 0 && r.exit != 28, "{r:?}"),
            Behavior::Hang => assert_eq!(r.exit, 28, "{r:?}"),
            _ => unreachable!(),
        }
        assert_eq!(r.status, 0, "{behavior:?}: {r:?}");
        assert_eq!(proxy.requests(), 1, "{behavior:?}");
    }
    assert_eq!(judge.requests(), 0);
}

#[tokio::test]
async fn hang_holds_the_connection_open() {
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        behavior: Behavior::Hang,
        ..HttpProxyOpts::default()
    })
    .await;
    let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await;
    assert!(read.is_err(), "no answer and no close: {read:?}");
}

#[tokio::test]
async fn closed_ports_refuse() {
    let closed = closed_port();
    let r = curl("5", &["--noproxy", "*", &format!("http://{closed}/")]).await;
    assert_eq!(r.exit, 7, "couldn't connect: {r:?}");
    let r = curl(
        "5",
        &[
            "--proxy",
            &format!("http://{closed}"),
            "http://127.0.0.1:1/",
        ],
    )
    .await;
    assert_eq!(r.exit, 7, "{r:?}");

    // A working proxy whose target refuses says 502.
    let proxy = FakeHttpProxy::start(HttpProxyOpts::default()).await;
    let r = curl(
        "5",
        &["--proxy", &proxy.url(), &format!("http://{closed}/")],
    )
    .await;
    assert_eq!((r.exit, r.status), (0, 502), "{r:?}");
}

#[tokio::test]
async fn fakes_never_leave_loopback() {
    let http = FakeHttpProxy::start(HttpProxyOpts {
        connect: true,
        ..HttpProxyOpts::default()
    })
    .await;
    // TEST-NET-1 and a name: refused before any connect or DNS lookup.
    for url in ["http://192.0.2.1/", "http://example.com/"] {
        let r = curl("5", &["--proxy", &http.url(), url]).await;
        assert!(matches!(r.status, 403 | 502), "{url}: {r:?}");
    }
    let socks = FakeSocks5::start(SocksOpts::default()).await;
    let r = curl(
        "5",
        &[
            "--proxy",
            &format!("socks5h://{}", socks.addr()),
            "http://192.0.2.1/",
        ],
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
}

#[tokio::test]
async fn many_concurrent_connections_through_one_proxy() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(opts(ProxyKind::Elite, 2)).await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (proxy, judge) = (proxy.addr(), judge.addr);
        tasks.spawn(async move { raw_get(proxy, judge, &format!("/c{i}")).await });
    }
    while let Some(echo) = tasks.join_next().await {
        assert_eq!(echo.unwrap().remote_addr.ip(), lo(2));
    }
    assert_eq!(proxy.requests(), 200);
    assert_eq!(judge.requests(), 200);
}

#[tokio::test]
async fn socks5_connects_ipv4_domain_and_ipv6_targets() {
    let judge = Judge::echo().await;
    let socks = FakeSocks5::start(SocksOpts {
        upstream_bind: Some(lo(2)),
        ..SocksOpts::default()
    })
    .await;
    let port = judge.addr.port();
    let cases = [
        // IPv4 address type.
        (socks.url(), format!("http://127.0.0.1:{port}/v4")),
        // Domain address type: the proxy resolves the name.
        (
            format!("socks5h://{}", socks.addr()),
            format!("http://localhost:{port}/name"),
        ),
        // IPv6 address type, IPv4-mapped so the test stays on 127.0.0.0/8.
        (socks.url(), format!("http://[::ffff:127.0.0.1]:{port}/v6")),
    ];
    for (proxy, url) in &cases {
        let r = curl("5", &["--proxy", proxy, url]).await;
        assert_eq!((r.exit, r.status), (0, 200), "{proxy} {url}: {r:?}");
        assert_eq!(r.echo().remote_addr.ip(), lo(2));
    }
    assert_eq!(socks.requests(), 3);
}

#[tokio::test]
async fn socks5_checks_credentials() {
    let judge = Judge::echo().await;
    let socks = FakeSocks5::start(SocksOpts {
        auth: Some(("user".into(), "pass".into())),
        upstream_bind: Some(lo(3)),
        ..SocksOpts::default()
    })
    .await;
    let url = judge.at("/s5");
    let addr = socks.addr();

    let r = curl(
        "5",
        &["--proxy", &format!("socks5://user:pass@{addr}"), &url],
    )
    .await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    assert_eq!(r.echo().remote_addr.ip(), lo(3));

    let r = curl(
        "5",
        &["--proxy", &format!("socks5://user:nope@{addr}"), &url],
    )
    .await;
    assert_ne!(r.exit, 0, "wrong password: {r:?}");
    let r = curl("5", &["--proxy", &format!("socks5://{addr}"), &url]).await;
    assert_ne!(r.exit, 0, "no acceptable method: {r:?}");
    assert_eq!(judge.requests(), 1);
}

#[tokio::test]
async fn socks5_handshake_by_hand() {
    let judge = Judge::echo().await;
    let socks = FakeSocks5::start(SocksOpts::default()).await;

    // Only user/pass offered to a no-auth server: 0xFF.
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&[5, 1, 2]).await.unwrap();
    let mut b = [0u8; 2];
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(b, [5, 0xFF]);

    // A refused target: reply 0x05.
    let closed = closed_port();
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    s.read_exact(&mut b).await.unwrap();
    assert_eq!(b, [5, 0]);
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&closed.port().to_be_bytes());
    s.write_all(&req).await.unwrap();
    let mut reply = [0u8; 10];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[..2], [5, 5]);

    // Success reports the bound address of the upstream connection.
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&[5, 1, 0]).await.unwrap();
    s.read_exact(&mut b).await.unwrap();
    let mut req = vec![5, 1, 0, 1, 127, 0, 0, 1];
    req.extend_from_slice(&judge.addr.port().to_be_bytes());
    s.write_all(&req).await.unwrap();
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[..4], [5, 0, 0, 1]);
    assert_eq!(reply[4..8], [127, 0, 0, 1]);
    assert_ne!(u16::from_be_bytes([reply[8], reply[9]]), 0);

    // Domain and IPv6 (IPv4-mapped) address types.
    let port = judge.addr.port().to_be_bytes();
    let mut by_name = vec![5, 1, 0, 3, 9];
    by_name.extend_from_slice(b"localhost");
    let mut by_v6 = vec![5, 1, 0, 4];
    by_v6.extend_from_slice(&"::ffff:127.0.0.1".parse::<Ipv6Addr>().unwrap().octets());
    for mut req in [by_name, by_v6] {
        req.extend_from_slice(&port);
        let mut s = TcpStream::connect(socks.addr()).await.unwrap();
        s.write_all(&[5, 1, 0]).await.unwrap();
        s.read_exact(&mut b).await.unwrap();
        s.write_all(&req).await.unwrap();
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[..2], [5, 0], "{req:?}");
        let echo = get_over(s, judge.addr, "/typed").await;
        assert_eq!(echo.url, "/typed");
    }

    // Nonsense never panics the server; it keeps serving.
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&[5, 255, 0, 0, 0]).await.unwrap();
    drop(s);
    let r = curl("5", &["--proxy", &socks.url(), &judge.at("/after")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
}

#[tokio::test]
async fn socks4_and_4a_connect() {
    let judge = Judge::echo().await;
    let socks = FakeSocks4::start(SocksOpts {
        upstream_bind: Some(lo(3)),
        ..SocksOpts::default()
    })
    .await;
    let port = judge.addr.port();
    let addr = socks.addr();
    for (proxy, url) in [
        (socks.url(), judge.at("/s4")),
        // 4a: curl sends the name, the server resolves it.
        (
            format!("socks4a://{addr}"),
            format!("http://localhost:{port}/s4a"),
        ),
    ] {
        let r = curl("5", &["--proxy", &proxy, &url]).await;
        assert_eq!((r.exit, r.status), (0, 200), "{proxy} {url}: {r:?}");
        assert_eq!(r.echo().remote_addr.ip(), lo(3));
    }

    // A refused target is rejected (0x5B).
    let r = curl(
        "5",
        &[
            "--proxy",
            &socks.url(),
            &format!("http://{}/", closed_port()),
        ],
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert_eq!(r.status, 0);
}

#[tokio::test]
async fn socks4a_handshake_by_hand() {
    let judge = Judge::echo().await;
    let socks = FakeSocks4::start(SocksOpts::default()).await;
    let mut req = vec![4, 1];
    req.extend_from_slice(&judge.addr.port().to_be_bytes());
    req.extend_from_slice(&[0, 0, 0, 1]);
    req.extend_from_slice(b"someone\0localhost\0");
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&req).await.unwrap();
    let mut reply = [0u8; 8];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[..2], [0, 0x5A]);
    assert_eq!(get_over(s, judge.addr, "/4a").await.url, "/4a");

    // A name that would need DNS is rejected.
    let mut req = vec![4, 1, 0, 80, 0, 0, 0, 1];
    req.extend_from_slice(b"\0example.com\0");
    let mut s = TcpStream::connect(socks.addr()).await.unwrap();
    s.write_all(&req).await.unwrap();
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(reply[..2], [0, 0x5B]);
}

#[tokio::test]
async fn http_proxy_survives_bad_requests() {
    let judge = Judge::echo().await;
    let proxy = FakeHttpProxy::start(HttpProxyOpts::default()).await;
    let huge = format!(
        "GET http://{}/ HTTP/1.1\r\nX: {}\r\n",
        judge.addr,
        "a".repeat(100_000)
    );
    let bad: [&[u8]; 5] = [
        b"\r\n\r\n",
        b"GET /origin-form HTTP/1.1\r\n\r\n",
        b"GET http://[::1 HTTP/1.1\r\n\r\n",
        b"\xff\xfe\x00garbage\r\n\r\n",
        huge.as_bytes(),
    ];
    for req in bad {
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let _ = s.write_all(req).await;
        let _ = s.shutdown().await;
        let mut resp = Vec::new();
        let _ = s.read_to_end(&mut resp).await;
        let resp = String::from_utf8_lossy(&resp);
        assert!(
            resp.is_empty() || resp.starts_with("HTTP/1.1 400 "),
            "{resp}"
        );
    }
    let r = curl("5", &["--proxy", &proxy.url(), &judge.at("/still")]).await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
}

#[tokio::test]
async fn socks4_checks_the_user_id() {
    let judge = Judge::echo().await;
    let socks = FakeSocks4::start(SocksOpts {
        auth: Some(("alice".into(), String::new())),
        ..SocksOpts::default()
    })
    .await;
    let addr = socks.addr();
    let r = curl(
        "5",
        &["--proxy", &format!("socks4://alice@{addr}"), &judge.at("/")],
    )
    .await;
    assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
    let r = curl(
        "5",
        &["--proxy", &format!("socks4://bob@{addr}"), &judge.at("/")],
    )
    .await;
    assert_ne!(r.exit, 0, "{r:?}");
    assert_eq!(judge.requests(), 1);
}

#[tokio::test]
async fn socks_hang_and_garbage_fail_the_client() {
    let judge = Judge::echo().await;
    for behavior in [SocksBehavior::Hang, SocksBehavior::Garbage] {
        let opts = SocksOpts {
            behavior,
            ..SocksOpts::default()
        };
        let s4 = FakeSocks4::start(opts.clone()).await;
        let s5 = FakeSocks5::start(opts).await;
        for proxy in [s4.url(), s5.url()] {
            let r = curl("0.5", &["--proxy", &proxy, &judge.at("/")]).await;
            match behavior {
                SocksBehavior::Hang => assert_eq!(r.exit, 28, "{proxy}: {r:?}"),
                _ => assert!(r.exit != 0 && r.exit != 28, "{proxy}: {r:?}"),
            }
        }
        assert_eq!((s4.requests(), s5.requests()), (1, 1));
    }
    assert_eq!(judge.requests(), 0);
}

#[tokio::test]
async fn dropping_a_fake_stops_it() {
    let proxy = FakeHttpProxy::start(HttpProxyOpts::default()).await;
    let addr = proxy.addr();
    drop(proxy);
    // Abort takes effect when the runtime next runs the task.
    let deadline = Instant::now() + Duration::from_secs(2);
    while TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still listening on {addr}");
        tokio::task::yield_now().await;
    }
}

/// A GET through an HTTP proxy by hand, parsed as a judge echo.
async fn raw_get(proxy: SocketAddr, judge: SocketAddr, path: &str) -> JudgeEcho {
    let s = TcpStream::connect(proxy).await.unwrap();
    get_over(s, judge, &format!("http://{judge}{path}")).await
}

/// A GET for `target` over an open connection (to a proxy, or a tunnel to
/// the judge), parsed as a judge echo.
async fn get_over(mut s: TcpStream, judge: SocketAddr, target: &str) -> JudgeEcho {
    let req = format!("GET {target} HTTP/1.1\r\nHost: {judge}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    let (head, body) = resp.split_once("\r\n\r\n").expect("a response head");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    JudgeEcho::parse(body).expect("a judge echo")
}

#[tokio::test(flavor = "multi_thread")]
async fn farm_of_thousands() {
    let _alone = common::THOUSANDS.lock().await;
    let judge = Judge::echo().await;
    let started = Instant::now();
    let farm = FakeFarm::start(2_000, 2_000, Some(lo(2))).await;
    let alive = farm.alive_addrs();
    let silent = farm.silent_addrs();
    assert_eq!((alive.len(), silent.len()), (2_000, 2_000));
    let mut all: Vec<SocketAddr> = alive.iter().chain(&silent).copied().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 4_000, "every listener has its own port");
    eprintln!("farm of 4000 started in {:?}", started.elapsed());

    let mut tasks = tokio::task::JoinSet::new();
    for &proxy in alive.iter().step_by(20) {
        let judge = judge.addr;
        tasks.spawn(async move {
            let echo = raw_get(proxy, judge, "/farm").await;
            assert_eq!(echo.remote_addr.ip(), lo(2));
        });
    }
    for &listener in silent.iter().step_by(20) {
        tasks.spawn(async move {
            let mut s = TcpStream::connect(listener).await.expect("silent accepts");
            s.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            let mut b = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(200), s.read(&mut b)).await;
            assert!(read.is_err(), "silent listener {listener} answered");
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
    assert_eq!(farm.requests(), 100);
    assert_eq!(judge.requests(), 100);
}

#[tokio::test]
async fn plain_requests_are_counted_by_their_target_and_tunnels_are_not() {
    let (a, b) = (Judge::echo().await, Judge::echo().await);
    for keep_alive in [false, true] {
        let proxy = FakeHttpProxy::start(HttpProxyOpts {
            keep_alive,
            connect: true,
            ..opts(ProxyKind::Elite, 2)
        })
        .await;
        let (a_url, b_url) = (
            format!("http://{}/1", a.addr),
            format!("http://{}/2", b.addr),
        );
        // Two URLs on one curl: with keep-alive the second request comes on
        // the same connection.
        let r = curl("5", &["--proxy", &proxy.url(), &a_url, &a_url]).await;
        assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
        let r = curl("5", &["--proxy", &proxy.url(), &b_url]).await;
        assert_eq!((r.exit, r.status), (0, 200), "{r:?}");
        let r = curl("5", &["--proxytunnel", "--proxy", &proxy.url(), &b_url]).await;
        assert_eq!((r.exit, r.connect_status), (0, 200), "{r:?}");
        let (a_at, b_at) = (a.addr.to_string(), b.addr.to_string());
        assert_eq!(
            (proxy.forwarded_to(&a_at), proxy.forwarded_to(&b_at)),
            (2, 1),
            "keep-alive {keep_alive}"
        );
        assert_eq!(proxy.forwarded_to("127.0.0.1:1"), 0);
    }
}
