//! The gateway as clients use it: curl and reqwest pointed at it as their
//! HTTP or SOCKS5 proxy, in front of loopback upstream proxies and sites.
//! Each upstream forwards from its own 127.0.0.x address, so a site tells
//! which proxy carried a request — and that the gateway never came itself
//! (its own connections would come from 127.0.0.1).

use crate::common;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::daemon::Daemon;
use common::fakes::{
    FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, SocksOpts, closed_port, http_proxy, ip,
};
use common::gateway::Gw;
use common::judges::{Judge, JudgeEcho};
use common::site::{Reply, Site, SiteOpts};
use common::{AliveProxy, TestConfig, ThreeCountries, store_with_alive, within, working_proxies};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

mod kept;

/// Runs curl with `args` (always silent but for errors, bounded); status,
/// stdout, stderr.
async fn curl(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "--noproxy", ""])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("all_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .output()
        .await
        .expect("curl runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn peers(site: &Site) -> Vec<IpAddr> {
    site.log().iter().map(|h| h.peer).collect()
}

fn proxy_id(resp: &reqwest::Response) -> i64 {
    resp.headers()
        .get("x-proxywarden-proxy")
        .expect("the answer names its proxy")
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn plain_http_rotates_per_request_and_names_the_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let (_proxies, alive) = working_proxies(3).await;
        let gw = Gw::start(dir.path(), &alive).await;
        let client = gw.client(None);
        let mut used = Vec::new();
        for _ in 0..6 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            used.push(proxy_id(&resp));
            assert_eq!(resp.text().await.unwrap(), "page a");
        }
        // A new proxy per request: every one of them, never twice in a row.
        assert_eq!(used.iter().collect::<HashSet<_>>().len(), 3, "{used:?}");
        assert!(used.windows(2).all(|w| w[0] != w[1]), "{used:?}");
        assert!(used.iter().all(|id| gw.ids.contains(id)));
        let seen: HashSet<IpAddr> = peers(&site).into_iter().collect();
        assert_eq!(seen, HashSet::from([ip(2), ip(3), ip(4)]));

        // The guide's curl line (docs/src/gateway.md).
        let (code, body, err) = curl(&["-x", &gw.url(), &site.url("/a")]).await;
        assert_eq!((code, body.as_str()), (0, "page a"), "{err}");
        assert!(!peers(&site).contains(&ip(1)), "the gateway went direct");
    })
    .await;
}

/// A working HTTP proxy forwarding from 127.0.0.`last` that keeps its
/// clients' connections open across requests.
async fn kept_alive_proxy(last: u8) -> FakeHttpProxy {
    FakeHttpProxy::start(HttpProxyOpts {
        keep_alive: true,
        upstream_bind: Some(ip(last)),
        ..HttpProxyOpts::default()
    })
    .await
}

#[tokio::test]
async fn kept_alive_upstream_connections_are_reused_while_requests_still_rotate() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![
            ("/a", Reply::html("page a")),
            ("/t", Reply::text("plain text")),
        ]))
        .await;
        let proxies = [
            kept_alive_proxy(2).await,
            kept_alive_proxy(3).await,
            kept_alive_proxy(4).await,
        ];
        let alive: Vec<AliveProxy> = proxies.iter().map(|p| AliveProxy::new(p.url())).collect();
        let gw = Gw::start(dir.path(), &alive).await;
        let client = gw.client(None);
        let mut used = Vec::new();
        for i in 0..12 {
            // Pages read whole (small HTML) and streamed (text) alike.
            let path = if i % 2 == 0 { "/a" } else { "/t" };
            let resp = client.get(site.url(path)).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            used.push(proxy_id(&resp));
            let want = if i % 2 == 0 { "page a" } else { "plain text" };
            assert_eq!(resp.text().await.unwrap(), want);
        }
        // Still a new proxy per request, every one of them.
        assert_eq!(used.iter().collect::<HashSet<_>>().len(), 3, "{used:?}");
        assert!(used.windows(2).all(|w| w[0] != w[1]), "{used:?}");
        let seen: HashSet<IpAddr> = peers(&site).into_iter().collect();
        assert_eq!(seen, HashSet::from([ip(2), ip(3), ip(4)]));
        // Each proxy carried four requests on fewer connections.
        for p in &proxies {
            assert_eq!(p.requests(), 4);
            assert!(p.connections() < 4, "{} connections", p.connections());
        }
        assert!(!peers(&site).contains(&ip(1)), "the gateway went direct");
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_died_with_kept_connections_is_not_handed_out_again() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/t", Reply::text("ok"))])).await;
        let mut proxies = vec![kept_alive_proxy(2).await, kept_alive_proxy(3).await];
        let alive: Vec<AliveProxy> = proxies.iter().map(|p| AliveProxy::new(p.url())).collect();
        let gw = Gw::start(dir.path(), &alive).await;
        let client = gw.client(None);
        for _ in 0..4 {
            let resp = client.get(site.url("/t")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.unwrap(), "ok");
        }
        // The first proxy goes away, its kept connections with it.
        let dead = proxies.remove(0);
        drop(dead);
        for _ in 0..6 {
            let resp = client.get(site.url("/t")).send().await.unwrap();
            assert_eq!(resp.status(), 200, "retried on the other proxy");
            assert_eq!(proxy_id(&resp), gw.ids[1]);
            assert_eq!(resp.text().await.unwrap(), "ok");
        }
        assert!(
            gw.feedback.index().get(gw.ids[0]).is_none(),
            "the dead proxy is no longer served"
        );
        assert!(gw.gateway.pool().is_cooling(gw.ids[0]));
    })
    .await;
}

#[tokio::test]
async fn connect_tunnels_tls_end_to_end_and_rotates_per_tunnel() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        opts.tls_dir = Some(dir.path().to_owned());
        let site = Site::start(opts).await;
        let a = http_proxy(2).await;
        let b = http_proxy(3).await;
        let gw = Gw::start(
            dir.path(),
            &[AliveProxy::new(a.url()), AliveProxy::new(b.url())],
        )
        .await;
        let ca = site.ca_file().display().to_string();
        for _ in 0..4 {
            let (code, body, err) =
                curl(&["--cacert", &ca, "-x", &gw.url(), &site.url("/s")]).await;
            assert_eq!((code, body.as_str()), (0, "secret page"), "{err}");
        }
        // The certificate checked out against the site's CA: nothing in
        // between looked inside. One proxy per tunnel, in turn.
        assert_eq!(peers(&site), vec![ip(2), ip(3), ip(2), ip(3)]);
        assert_eq!(a.targets().len(), 2);
        assert_eq!(b.targets().len(), 2);
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!(stats.connect_tunnels.get("ok"), Some(&4));
        assert!(
            stats.bytes_received > 0 && stats.bytes_sent > 0,
            "{stats:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn socks5h_clients_use_the_same_port_to_reach_names_and_addresses() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let plain = Site::start(SiteOpts::routes(vec![("/p", Reply::html("plain page"))])).await;
        let mut opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(opts).await;
        let s5 = FakeSocks5::start(SocksOpts {
            auth: Some(("carol".into(), "pw3".into())),
            upstream_bind: Some(ip(4)),
            ..SocksOpts::default()
        })
        .await;
        let s4 = FakeSocks4::start(SocksOpts {
            upstream_bind: Some(ip(5)),
            ..SocksOpts::default()
        })
        .await;
        let gw = Gw::start(
            dir.path(),
            &[
                AliveProxy::new(format!("socks5://carol:pw3@{}", s5.addr())),
                AliveProxy::new(s4.url()),
            ],
        )
        .await;
        let socks = format!("socks5h://{}", gw.addr);
        // A name (sent as a name: SOCKS5h, then SOCKS4a upstream).
        let by_name = format!("http://localhost:{}/p", plain.addr.port());
        for _ in 0..2 {
            let (code, body, err) = curl(&["-x", &socks, &by_name]).await;
            assert_eq!((code, body.as_str()), (0, "plain page"), "{err}");
        }
        // An address, with TLS end to end.
        let ca = tls.ca_file().display().to_string();
        for _ in 0..2 {
            let (code, body, err) = curl(&["--cacert", &ca, "-x", &socks, &tls.url("/s")]).await;
            assert_eq!((code, body.as_str()), (0, "secret page"), "{err}");
        }
        let mut seen = peers(&plain);
        seen.extend(peers(&tls));
        seen.sort();
        assert_eq!(seen, vec![ip(4), ip(4), ip(5), ip(5)]);
        let names: Vec<String> = s5
            .targets()
            .iter()
            .chain(s4.targets().iter())
            .map(|t| format!("{t:?}"))
            .collect();
        assert!(
            names.iter().filter(|t| t.contains("localhost")).count() == 2,
            "the names went to the upstreams unresolved: {names:?}"
        );
        assert_eq!(
            gw.gateway.metrics().snapshot().socks_tunnels.get("ok"),
            Some(&4)
        );
    })
    .await;
}

#[tokio::test]
async fn a_session_keeps_its_proxy_until_the_proxy_fails() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let (mut proxies, alive) = working_proxies(3).await;
        let gw = Gw::start(dir.path(), &alive).await;
        let client = gw.client(Some(("session-abc", "x")));
        let mut used = Vec::new();
        for _ in 0..5 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            used.push(proxy_id(&resp));
        }
        assert!(used.iter().all(|id| *id == used[0]), "{used:?}");
        // Another session gets its own proxy (round-robin moves on).
        let other = gw.client(Some(("session-xyz", "x")));
        let resp = other.get(site.url("/a")).send().await.unwrap();
        assert_ne!(proxy_id(&resp), used[0]);

        // The session's proxy dies: the next request moves (transparently)
        // and the session sticks to its new proxy.
        let dead = gw.ids.iter().position(|id| *id == used[0]).unwrap();
        drop(proxies.remove(dead));
        let mut after = Vec::new();
        for _ in 0..4 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            after.push(proxy_id(&resp));
        }
        assert_ne!(after[0], used[0]);
        assert!(after.iter().all(|id| *id == after[0]), "{after:?}");
        // The failure went down the feedback path: no longer served.
        assert!(gw.feedback.index().get(used[0]).is_none());
    })
    .await;
}

#[tokio::test]
async fn a_full_sessions_table_evicts_the_oldest_session_and_counts_it() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let (_proxies, alive) = working_proxies(3).await;
        let gw = Gw::start_with(dir.path(), &alive, |c| c.set("pool", "max_sessions", "2")).await;
        let sticky = |name: &str| gw.client(Some((&*format!("session-{name}"), "x")));
        for name in ["a", "b"] {
            let resp = sticky(name).get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!((stats.sessions, stats.sessions_evicted), (2, 0));

        // A third session finds the table full: the oldest (a) makes room,
        // and the new one sticks to its proxy as every session does.
        let c = sticky("c");
        let mut used = Vec::new();
        for _ in 0..4 {
            let resp = c.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            used.push(proxy_id(&resp));
        }
        assert!(used.iter().all(|id| *id == used[0]), "{used:?}");
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!((stats.sessions, stats.sessions_evicted), (2, 1));

        // What an operator scrapes says so too.
        let metrics = proxywarden::api::metrics::Metrics::new();
        metrics.register_gateway(&gw.gateway.metrics());
        let text = metrics.render(&[], 0);
        assert!(
            text.contains("proxywarden_gateway_sessions 2\n")
                && text.contains("proxywarden_gateway_sessions_evicted_total 1\n"),
            "{text}"
        );
    })
    .await;
}

#[tokio::test]
async fn filters_in_the_username_or_headers_choose_the_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let three = ThreeCountries::start().await;
        let gw = Gw::start(dir.path(), &three.alive()).await;
        let client = gw.client(Some(("country-de+anonymity-elite", "")));
        for _ in 0..3 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(proxy_id(&resp), gw.ids[0]);
        }
        let client = gw.client(Some(("country-us+scheme-socks5", "")));
        for _ in 0..2 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(proxy_id(&resp), gw.ids[2]);
        }
        // Headers for plain HTTP, over the username.
        let client = gw.client(Some(("country-de", "")));
        let resp = client
            .get(site.url("/a"))
            .header("X-Proxywarden-Country", "us")
            .header("X-Proxywarden-Scheme", "http")
            .send()
            .await
            .unwrap();
        assert_eq!(proxy_id(&resp), gw.ids[1]);
        // Through a tunnel too (curl, CONNECT).
        let mut opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(opts).await;
        let ca = tls.ca_file().display().to_string();
        let via = format!("http://country-de+session-s1:x@{}", gw.addr);
        let (code, body, err) = curl(&["--cacert", &ca, "-x", &via, &tls.url("/s")]).await;
        assert_eq!((code, body.as_str()), (0, "secret page"), "{err}");
        assert_eq!(peers(&tls), vec![ip(2)]);

        // Nothing in France: 503 with a JSON reason, and nothing sent.
        let hits = site.log().len();
        let client = gw.client(Some(("country-fr", "")));
        let resp = client.get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 503);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_proxy");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("FR"),
            "{v}"
        );
        // A control that means nothing is a clear 400.
        let client = gw.client(Some(("colour-red", "")));
        let resp = client.get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 400);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains("colour"),
            "{v}"
        );
        assert_eq!(site.log().len(), hits);
    })
    .await;
}

#[tokio::test]
async fn a_dead_upstream_is_retried_on_another_for_requests_and_tunnels() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let mut opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(opts).await;
        let dead1 = closed_port();
        let dead2 = closed_port();
        let good = http_proxy(2).await;
        let gw = Gw::start(
            dir.path(),
            &[
                AliveProxy::new(format!("http://{}", dead1.addr())),
                AliveProxy::new(format!("http://{}", dead2.addr())),
                AliveProxy::new(good.url()),
            ],
        )
        .await;
        let client = gw.client(None);
        let resp = client
            .post(site.url("/a"))
            .body("a small body")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(proxy_id(&resp), gw.ids[2]);
        // Both dead ones were tried (round-robin from the first) and are
        // no longer served.
        assert!(gw.feedback.index().get(gw.ids[0]).is_none());
        let stats = gw.gateway.metrics().snapshot();
        assert!(stats.retries >= 1, "{stats:?}");
        assert!(
            stats
                .upstream_failures
                .get("refused")
                .is_some_and(|n| *n >= 1),
            "{stats:?}"
        );

        // A CONNECT whose proxy refuses is retried before the tunnel is up.
        // Bring the dead back to the index for it: a fresh gateway.
        let dir2 = tempfile::tempdir().unwrap();
        let gw2 = Gw::start(
            dir2.path(),
            &[
                AliveProxy::new(format!("http://{}", dead1.addr())),
                AliveProxy::new(good.url()),
            ],
        )
        .await;
        let ca = tls.ca_file().display().to_string();
        let (code, body, err) = curl(&["--cacert", &ca, "-x", &gw2.url(), &tls.url("/s")]).await;
        assert_eq!((code, body.as_str()), (0, "secret page"), "{err}");
        assert!(gw2.feedback.index().get(gw2.ids[0]).is_none());
        assert_eq!(gw2.gateway.metrics().snapshot().retries, 1);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_the_site_bans_is_left_for_another() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::routes(vec![("/a", Reply::html("page a"))]);
        opts.banned = vec![ip(2)];
        let site = Site::start(opts).await;
        let banned = http_proxy(2).await;
        let fine = http_proxy(3).await;
        let gw = Gw::start(
            dir.path(),
            &[AliveProxy::new(banned.url()), AliveProxy::new(fine.url())],
        )
        .await;
        let client = gw.client(None);
        for _ in 0..4 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(proxy_id(&resp), gw.ids[1]);
            assert_eq!(resp.text().await.unwrap(), "page a");
        }
        // The captcha came once; the pair is banned, the proxy still served.
        assert_eq!(peers(&site).iter().filter(|p| **p == ip(2)).count(), 1);
        let site_name = format!("127.0.0.1:{}", site.addr.port());
        assert!(gw.feedback.is_banned(gw.ids[0], &site_name));
        assert!(gw.feedback.index().get(gw.ids[0]).is_some());
    })
    .await;
}

#[tokio::test]
async fn without_a_matching_proxy_clients_get_503_or_the_socks_code_and_nothing_goes_direct() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let gw = Gw::start(dir.path(), &[]).await;
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 503);
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "application/json"
        );
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "no_proxy");
        let (code, _, err) = curl(&["-x", &gw.url(), "-p", &site.url("/a")]).await;
        assert_ne!(code, 0);
        assert!(err.contains("503"), "{err}");
        // A failed CONNECT's body is never shown; its head says why.
        let (code, _, err) = curl(&["-v", "-x", &gw.url(), "-p", &site.url("/a")]).await;
        assert_ne!(code, 0);
        assert!(
            err.to_ascii_lowercase().contains(
                "< x-proxywarden-error: no_proxy: no working proxy can take this request"
            ),
            "{err}"
        );
        let (code, _, _) = curl(&["-x", &format!("socks5h://{}", gw.addr), &site.url("/a")]).await;
        assert_ne!(code, 0);
        // By hand, to see the reply code: 2, "connection not allowed by
        // ruleset" (the filters allow no proxy).
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(&[5, 1, 0]).await.unwrap();
        let mut chosen = [0u8; 2];
        s.read_exact(&mut chosen).await.unwrap();
        assert_eq!(chosen, [5, 0]);
        let port = site.addr.port().to_be_bytes();
        s.write_all(&[5, 1, 0, 1, 127, 0, 0, 1, port[0], port[1]])
            .await
            .unwrap();
        let mut reply = [0u8; 10];
        s.read_exact(&mut reply).await.unwrap();
        assert_eq!(reply[..2], [5, 2]);
        assert!(
            site.log().is_empty(),
            "the gateway connected to the site itself"
        );
    })
    .await;
}

#[tokio::test]
async fn the_token_is_the_proxy_password_when_set() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let p = http_proxy(2).await;
        let s5 = FakeSocks5::start(SocksOpts::default()).await;
        let token = "gateway-token-0123456789";
        let gw = Gw::start_with(
            dir.path(),
            &[AliveProxy::new(p.url()), AliveProxy::new(s5.url())],
            |c| c.set("gateway", "token", &format!("\"{token}\"")),
        )
        .await;
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 407);
        assert!(resp.headers().contains_key("proxy-authenticate"));
        let resp = gw
            .client(Some(("", "wrong")))
            .get(site.url("/a"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 407);
        assert!(site.log().is_empty());
        let resp = gw
            .client(Some(("", token)))
            .get(site.url("/a"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        // SOCKS5: username/password, the same token.
        let bad = format!("socks5h://x:wrong@{}", gw.addr);
        let (code, _, _) = curl(&["-x", &bad, &site.url("/a")]).await;
        assert_ne!(code, 0);
        let none = format!("socks5h://{}", gw.addr);
        let (code, _, _) = curl(&["-x", &none, &site.url("/a")]).await;
        assert_ne!(code, 0);
        let good = format!("socks5h://scheme-socks5:{token}@{}", gw.addr);
        let (code, body, err) = curl(&["-x", &good, &site.url("/a")]).await;
        assert_eq!((code, body.as_str()), (0, "page a"), "{err}");
        assert_eq!(site.log().len(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_non_loopback_gateway_without_a_token_is_a_config_error() {
    let dir = tempfile::tempdir().unwrap();
    let toml = TestConfig::new(dir.path())
        .set("gateway", "listen", "\"0.0.0.0:8081\"")
        .toml();
    let e = proxywarden::config::Config::from_toml(&toml, "t.toml").unwrap_err();
    assert!(
        e.to_string()
            .contains("gateway.listen: 0.0.0.0:8081 is not a loopback address: set gateway.token"),
        "{e}"
    );
    let ok = TestConfig::new(dir.path())
        .set("gateway", "listen", "\"0.0.0.0:8081\"")
        .set("gateway", "token", "\"a-long-enough-token-1\"")
        .toml();
    assert!(proxywarden::config::Config::from_toml(&ok, "t.toml").is_ok());
}

#[tokio::test]
async fn a_local_port_is_reached_only_through_the_upstream_never_by_the_gateway() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // Stands for an admin port on the gateway's own host.
        let admin = Site::start(SiteOpts::routes(vec![("/", Reply::text("admin"))])).await;
        let upstream = http_proxy(2).await;
        let gw = Gw::start(dir.path(), &[AliveProxy::new(upstream.url())]).await;
        let target = format!("http://127.0.0.1:{}/", admin.addr.port());
        let resp = gw.client(None).get(&target).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(upstream.requests(), 1, "the request went to the upstream");
        // The only connection the admin port saw came from the upstream.
        assert_eq!(peers(&admin), vec![ip(2)]);
        // CONNECT and SOCKS to it likewise go to the upstream.
        let (code, _, err) = curl(&["-x", &gw.url(), "-p", &target]).await;
        assert_eq!(code, 0, "{err}");
        assert_eq!(upstream.targets().len(), 1);
        assert_eq!(peers(&admin), vec![ip(2), ip(2)]);
    })
    .await;
}

#[tokio::test]
async fn headers_are_cleaned_both_ways_and_nothing_is_added() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let judge = Judge::echo().await;
        let upstream = FakeHttpProxy::start(HttpProxyOpts {
            auth: Some(("alice".into(), "secret-pw".into())),
            upstream_bind: Some(ip(2)),
            ..HttpProxyOpts::default()
        })
        .await;
        let gw = Gw::start(
            dir.path(),
            &[AliveProxy::new(format!(
                "http://alice:secret-pw@{}",
                upstream.addr()
            ))],
        )
        .await;
        let resp = gw
            .client(Some(("", "client-pw")))
            .get(judge.at("/echo?x=1"))
            .header("X-Keep", "kept")
            .header("Connection", "X-Drop")
            .header("X-Drop", "dropped")
            .header("Proxy-Connection", "keep-alive")
            .header("X-Proxywarden-Session", "s1")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let named = resp.headers()["x-proxywarden-proxy"]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(named, gw.ids[0].to_string(), "an id, never credentials");
        let echo = JudgeEcho::parse(&resp.text().await.unwrap()).expect("the judge's echo");
        assert_eq!(echo.header("x-keep"), Some("kept"));
        for gone in [
            "x-drop",
            "proxy-connection",
            "proxy-authorization",
            "x-proxywarden-session",
            "via",
            "x-forwarded-for",
            "forwarded",
        ] {
            assert_eq!(echo.header(gone), None, "{gone} reached the site: {echo:?}");
        }
        assert_eq!(echo.url, "/echo?x=1");
        assert_eq!(echo.remote_addr.ip(), ip(2));
    })
    .await;
}

#[tokio::test]
async fn slow_silent_and_oversized_clients_are_cut_off() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let p = http_proxy(2).await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(p.url())], |c| {
            c.set("gateway", "header_timeout", "\"1s\"")
                .set("gateway", "max_header_size", "\"8 KiB\"")
                .set("gateway", "max_connections", "3")
        })
        .await;
        // A head larger than the cap: 431, never forwarded.
        let big = "x".repeat(16 * 1024);
        let resp = gw
            .client(None)
            .get("http://127.0.0.1:9/")
            .header("X-Big", big)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 431);
        assert_eq!(p.requests(), 0);
        // A client that never finishes its head is closed after the
        // header timeout.
        let mut slow = TcpStream::connect(gw.addr).await.unwrap();
        slow.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        let closed =
            tokio::time::timeout(Duration::from_secs(10), slow.read_to_end(&mut buf)).await;
        assert!(
            closed.is_ok(),
            "a slow client was held past the header timeout"
        );
        // At the cap, a further connection closes the oldest one that is
        // still waiting for its head, and is served.
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let mut held = hold(&gw, 3).await;
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        let n = tokio::time::timeout(Duration::from_secs(10), held[0].read(&mut [0u8; 16]))
            .await
            .expect("the oldest waiting connection was closed")
            .unwrap_or(0);
        assert_eq!(n, 0);
        drop(held);
        assert!(gw.gateway.metrics().snapshot().evicted >= 1);
    })
    .await;
}

/// Opens `n` connections that send one byte of a request head and wait,
/// once the gateway holds them all.
async fn hold(gw: &Gw, n: usize) -> Vec<TcpStream> {
    let mut v = Vec::new();
    for _ in 0..n {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"G").await.unwrap();
        v.push(s);
    }
    common::until("connections accepted", Duration::from_secs(10), || async {
        gw.gateway.metrics().snapshot().connections >= n as i64
    })
    .await;
    v
}

#[tokio::test]
async fn serve_runs_the_gateway_and_shows_its_counters_in_stats_and_metrics() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let p = http_proxy(2).await;
        let dead = closed_port();
        let (store, _) = store_with_alive(
            &dir.path().join("test.db"),
            &[
                AliveProxy::new(format!("http://{}", dead.addr())),
                AliveProxy::new(p.url()),
            ],
        )
        .await;
        drop(store);
        // The database store_with_alive filled, not the fixture's own.
        let (daemon, gw_addr) =
            Daemon::start_with_gateway(dir.path(), "", |c| c.db("test.db")).await;
        let api_addr = daemon.addr;
        let tls =
            proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H1).unwrap();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
            .proxy(reqwest::Proxy::all(format!("http://{gw_addr}")).unwrap())
            .build()
            .unwrap();
        for _ in 0..2 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        let tls =
            proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H1).unwrap();
        let direct = reqwest::Client::builder()
            .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
            .no_proxy()
            .build()
            .unwrap();
        let stats: serde_json::Value = direct
            .get(format!("http://{api_addr}/stats"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let g = &stats["gateway"];
        assert_eq!(g["requests"]["ok"], 2, "{g}");
        assert_eq!(g["retries"], 1, "{g}");
        assert_eq!(g["upstream_failures"]["refused"], 1, "{g}");
        assert!(g["bytes_received"].as_u64().unwrap() >= 12, "{g}");
        let metrics = direct
            .get(format!("http://{api_addr}/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        for line in [
            "proxywarden_gateway_requests_total{kind=\"plain\",result=\"ok\"} 2",
            "proxywarden_gateway_retries_total 1",
            "proxywarden_gateway_upstream_failures_total{reason=\"refused\"} 1",
            "proxywarden_gateway_added_latency_seconds_count 2",
        ] {
            assert!(metrics.contains(line), "{line} missing from\n{metrics}");
        }
        assert!(metrics.contains("proxywarden_gateway_bytes_total{direction=\"received\"}"));
        daemon.stop().await;
    })
    .await;
}

#[tokio::test]
async fn quiet_kept_alive_connections_and_tunnels_are_closed() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let echo = common::fakes::EchoServer::start().await;
        let p = http_proxy(2).await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(p.url())], |c| {
            c.set("gateway", "header_timeout", "\"1s\"")
                .set("gateway", "idle_timeout", "\"1s\"")
        })
        .await;
        // One request, then silence: the kept-alive connection is closed.
        let mut conn = TcpStream::connect(gw.addr).await.unwrap();
        let head = format!(
            "GET {} HTTP/1.1\r\nHost: {}\r\n\r\n",
            site.url("/a"),
            site.addr
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut buf = [0u8; 4096];
            loop {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
        })
        .await;
        assert!(read.is_ok(), "an idle kept-alive connection was held");
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("page a"),
            "{text}"
        );

        // A tunnel that carries data, then goes quiet, is closed.
        let mut t = TcpStream::connect(gw.addr).await.unwrap();
        let connect = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", echo.addr());
        t.write_all(connect.as_bytes()).await.unwrap();
        let mut buf = [0u8; 256];
        let n = t.read(&mut buf).await.unwrap();
        assert!(
            buf[..n].starts_with(b"HTTP/1.1 200"),
            "{:?}",
            String::from_utf8_lossy(&buf[..n])
        );
        t.write_all(b"ping").await.unwrap();
        let mut echoed = [0u8; 4];
        t.read_exact(&mut echoed).await.unwrap();
        assert_eq!(&echoed, b"ping");
        let closed = tokio::time::timeout(Duration::from_secs(10), t.read(&mut buf)).await;
        assert!(
            matches!(closed, Ok(Ok(0)) | Ok(Err(_))),
            "a quiet tunnel was held"
        );
        assert_eq!(gw.gateway.metrics().snapshot().tunnels_open, 0);
    })
    .await;
}

#[tokio::test]
async fn a_page_that_refuses_everyone_is_passed_on_after_two_proxies() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/private", Reply::status(403))])).await;
        let (_proxies, alive) = working_proxies(4).await;
        let gw = Gw::start(dir.path(), &alive).await;
        let resp = gw
            .client(None)
            .get(site.url("/private"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403);
        assert_eq!(resp.text().await.unwrap(), "status 403");
        // Two proxies refused alike: the page means it; the others were
        // not spent on it.
        assert_eq!(site.log().len(), 2);
        assert_eq!(gw.gateway.metrics().snapshot().retries, 1);
    })
    .await;
}

// ---------------------------------------------------------------------------
// Issue 25: the gateway against its own clients. What a client sees, and
// that nothing a client's own request causes is charged to a proxy.

/// Sends `bytes` on a new connection to the gateway and reads everything
/// it answers until it closes the connection.
async fn raw(gw: &Gw, bytes: &[u8]) -> String {
    let mut c = TcpStream::connect(gw.addr).await.unwrap();
    // The gateway may answer (and close) before it has read everything.
    let _ = c.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).into_owned()
}

/// The JSON body of a raw answer.
fn json_body(answer: &str) -> serde_json::Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

/// A request head for `url` of exactly `size` bytes, padded with one
/// header, asking the gateway to close the connection after answering.
fn head_of(url: &str, size: usize) -> Vec<u8> {
    let start = format!("GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nX-Pad: ");
    let pad = size - start.len() - 4;
    let mut head = start.into_bytes();
    head.extend(std::iter::repeat_n(b'p', pad));
    head.extend_from_slice(b"\r\n\r\n");
    assert_eq!(head.len(), size);
    head
}

/// Asserts that no proxy was charged: each still served, none resting,
/// no upstream failure counted.
fn none_charged(gw: &Gw) {
    for id in &gw.ids {
        assert!(
            gw.feedback.index().get(*id).is_some(),
            "proxy {id} was taken out"
        );
        assert!(!gw.gateway.pool().is_cooling(*id), "proxy {id} rests");
    }
    let stats = gw.gateway.metrics().snapshot();
    assert!(stats.upstream_failures.is_empty(), "{stats:?}");
}

#[tokio::test]
async fn a_head_over_max_header_size_is_a_json_431_and_costs_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let (proxies, alive) = working_proxies(2).await;
        let gw = Gw::start_with(dir.path(), &alive, |c| {
            c.set("gateway", "max_header_size", "\"8 KiB\"")
        })
        .await;
        // Exactly the limit goes through.
        let answer = raw(&gw, &head_of(&site.url("/a"), 8192)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        assert!(answer.ends_with("page a"), "{answer:?}");
        // One byte more, and ten times more (sent whole, as one write): a
        // 431 in the JSON envelope, no proxy chosen.
        for size in [8193, 80 * 1024] {
            let answer = raw(&gw, &head_of(&site.url("/a"), size)).await;
            assert!(answer.starts_with("HTTP/1.1 431"), "{size}: {answer:?}");
            let json = json_body(&answer);
            assert_eq!(json["error"]["code"], "headers_too_large", "{json}");
            let message = json["error"]["message"].as_str().unwrap();
            assert!(
                message.contains("gateway.max_header_size (8192 bytes)"),
                "{message}"
            );
        }
        // The same on a kept-alive connection, after a request that fit.
        let mut c = TcpStream::connect(gw.addr).await.unwrap();
        let first = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", site.url("/a"));
        c.write_all(first.as_bytes()).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let mut got = String::new();
        while !got.ends_with("page a") {
            let n = c.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early: {got:?}");
            got.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
        let _ = c.write_all(&head_of(&site.url("/a"), 9000)).await;
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest).await;
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.starts_with("HTTP/1.1 431"), "{rest:?}");
        assert_eq!(json_body(&rest)["error"]["code"], "headers_too_large");
        // A malformed head is a 400, and reaches no proxy either.
        let answer = raw(&gw, b"GET http://a.example/ HTTP/1.1\r\nBad Header\r\n\r\n").await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
        // Only the two heads that fit reached a proxy.
        let carried: usize = proxies.iter().map(|p| p.requests()).sum();
        assert_eq!(carried, 2);
        assert_eq!(site.log().len(), 2);
        none_charged(&gw);
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!(stats.requests.get("too_large"), Some(&3), "{stats:?}");
        assert_eq!(stats.requests.get("bad_request"), Some(&1), "{stats:?}");
    })
    .await;
}

#[tokio::test]
async fn a_request_every_proxy_fails_on_alike_is_not_charged_to_them() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        // Proxies that close on this request (as proxies do on a head too
        // large or too odd for them).
        let mut resetting = Vec::new();
        for _ in 0..3 {
            resetting.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    behavior: common::fakes::Behavior::Reset,
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        let alive: Vec<AliveProxy> = resetting.iter().map(|p| AliveProxy::new(p.url())).collect();
        let gw = Gw::start(dir.path(), &alive).await;
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 502);
        let json: serde_json::Value = resp.json().await.unwrap();
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("3 proxies failed alike (reset)")
                && message.contains("none of them was charged"),
            "{message}"
        );
        assert!(resetting.iter().all(|p| p.requests() == 1));
        none_charged(&gw);
        // Proxies answering their own 502 alike (a name none can resolve,
        // say) are not charged either.
        let mut failing = Vec::new();
        for _ in 0..2 {
            failing.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    behavior: common::fakes::Behavior::AlwaysStatus(502),
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        let alive: Vec<AliveProxy> = failing.iter().map(|p| AliveProxy::new(p.url())).collect();
        let dir2 = tempfile::tempdir().unwrap();
        let gw2 = Gw::start(dir2.path(), &alive).await;
        let resp = gw2
            .client(None)
            .get("http://no-such-name.invalid/")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 502);
        let json: serde_json::Value = resp.json().await.unwrap();
        let message = json["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("2 proxies failed alike (bad_status)"),
            "{message}"
        );
        none_charged(&gw2);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_failed_where_another_carried_the_request_is_charged() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let broken = FakeHttpProxy::start(HttpProxyOpts {
            behavior: common::fakes::Behavior::Reset,
            ..HttpProxyOpts::default()
        })
        .await;
        let good = http_proxy(3).await;
        let gw = Gw::start(
            dir.path(),
            &[AliveProxy::new(broken.url()), AliveProxy::new(good.url())],
        )
        .await;
        // Round robin: one of the two requests tries the broken proxy
        // first, and the good one carries it.
        for _ in 0..2 {
            let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(proxy_id(&resp), gw.ids[1]);
        }
        assert_eq!(broken.requests(), 1);
        assert!(gw.gateway.pool().is_cooling(gw.ids[0]));
        assert!(gw.feedback.index().get(gw.ids[0]).is_none());
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!(stats.upstream_failures.get("reset"), Some(&1), "{stats:?}");
    })
    .await;
}

#[tokio::test]
async fn absolute_form_requests_carry_the_targets_host() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let judge = Judge::echo().await;
        let p = http_proxy(2).await;
        let gw = Gw::start(dir.path(), &[AliveProxy::new(p.url())]).await;
        let url = judge.at("/echo");
        let request =
            format!("GET {url} HTTP/1.1\r\nHost: client-said.example\r\nConnection: close\r\n\r\n");
        let answer = raw(&gw, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
        let body = answer.split_once("\r\n\r\n").unwrap().1;
        let echo = JudgeEcho::parse(body).expect("the judge's echo");
        let authority = judge.addr.to_string();
        assert_eq!(echo.header("host"), Some(authority.as_str()), "{echo:?}");
    })
    .await;
}

#[tokio::test]
async fn port_zero_is_a_bad_target_and_never_reaches_a_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let p = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            ..HttpProxyOpts::default()
        })
        .await;
        let gw = Gw::start(dir.path(), &[AliveProxy::new(p.url())]).await;
        for request in [
            "CONNECT 127.0.0.1:0 HTTP/1.1\r\nHost: 127.0.0.1:0\r\n\r\n",
            "CONNECT example.com:0 HTTP/1.1\r\nHost: example.com:0\r\n\r\n",
            "GET http://example.com:0/ HTTP/1.1\r\nHost: example.com:0\r\nConnection: close\r\n\r\n",
        ] {
            let mut c = TcpStream::connect(gw.addr).await.unwrap();
            c.write_all(request.as_bytes()).await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = c.read(&mut buf).await.unwrap();
            let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(answer.starts_with("HTTP/1.1 400"), "{request}: {answer:?}");
            let json = json_body(&answer);
            assert_eq!(json["error"]["code"], "bad_target", "{json}");
            assert!(json["error"]["message"].as_str().unwrap().contains("port 0"));
        }
        assert_eq!(p.requests(), 0);
        none_charged(&gw);
    })
    .await;
}

#[tokio::test]
async fn a_control_given_twice_is_a_400_and_other_username_words_are_ignored() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let p = http_proxy(2).await;
        let token = "gateway-token-0123456789";
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(p.url())], |c| {
            c.set("gateway", "token", &format!("\"{token}\""))
        })
        .await;
        let resp = gw
            .client(Some(("country-de+country-us", token)))
            .get(site.url("/a"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        let json: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(json["error"]["code"], "bad_control");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("\"country\" given twice"),
            "{json}"
        );
        let resp = gw
            .client(Some(("", token)))
            .get(site.url("/a"))
            .header("X-Proxywarden-Country", "de")
            .header("X-Proxywarden-Country", "us")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400);
        assert_eq!(p.requests(), 0);
        // Any username with the token: a word that is no control is
        // ignored, as clients that must send a user do (curl, requests).
        for user in ["user", "x", "alice+session-s1"] {
            let gw_url = format!("http://{user}:{token}@{}", gw.addr);
            let (code, body, err) = curl(&["-x", &gw_url, &site.url("/a")]).await;
            assert_eq!((code, body.as_str()), (0, "page a"), "{user}: {err}");
        }
        let socks = format!("socks5h://user:{token}@{}", gw.addr);
        let (code, body, err) = curl(&["-x", &socks, &site.url("/a")]).await;
        assert_eq!((code, body.as_str()), (0, "page a"), "{err}");
        // A misspelt control is still an error, never silently no filter.
        let typo = format!("http://contry-de:{token}@{}", gw.addr);
        let (code, _, _) = curl(&["-f", "-x", &typo, &site.url("/a")]).await;
        assert_ne!(code, 0);
    })
    .await;
}

#[tokio::test]
async fn a_kept_upstream_connection_found_closed_is_retried_fresh_and_not_charged() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::routes(vec![("/a", Reply::text("ok"))]).await;
        // A proxy that keeps connections open (HTTP/1.1, no close) yet
        // drops each after its first answer, the moment the next request
        // comes: as many free proxies do.
        let proxy = FakeHttpProxy::start(HttpProxyOpts {
            keep_alive: true,
            close_after: Some(1),
            ..HttpProxyOpts::default()
        })
        .await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(proxy.url())], |c| {
            c.set("gateway", "retries", "0")
        })
        .await;
        let client = gw.client(None);
        for _ in 0..3 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.unwrap(), "ok");
        }
        // Requests 2 and 3 each went on a kept connection first, found it
        // closed, and went again on a new one.
        assert_eq!(proxy.requests(), 5);
        assert_eq!(proxy.connections(), 3);
        none_charged(&gw);
    })
    .await;
}

/// A connection to the gateway from 127.0.0.`last`, that has sent one
/// byte of a request head.
async fn waiting_from(gw: &Gw, last: u8) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip(last), 0)).unwrap();
    let mut s = socket.connect(gw.addr).await.unwrap();
    s.write_all(b"G").await.unwrap();
    s
}

/// Waits until the gateway counts `n` open connections.
async fn open_connections(gw: &Gw, n: i64) {
    common::until("the connections open", Duration::from_secs(10), || async {
        gw.gateway.metrics().snapshot().connections == n
    })
    .await;
}

/// True once the gateway has closed `s` (it reads end of stream).
async fn closed(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return true,
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn waiting_connections_make_room_oldest_first_and_busy_ones_never() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let hanging = FakeHttpProxy::start(HttpProxyOpts {
            behavior: common::fakes::Behavior::Hang,
            ..HttpProxyOpts::default()
        })
        .await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(hanging.url())], |c| {
            c.set("gateway", "max_connections", "3")
                .set("gateway", "timeout", "\"30s\"")
                .set("gateway", "header_timeout", "\"30s\"")
        })
        .await;
        // Three slow clients hold every slot; each new client closes the
        // oldest of them, in the order they came.
        let mut a = waiting_from(&gw, 1).await;
        open_connections(&gw, 1).await;
        let mut b = waiting_from(&gw, 1).await;
        open_connections(&gw, 2).await;
        let _c = waiting_from(&gw, 1).await;
        open_connections(&gw, 3).await;
        let _d = waiting_from(&gw, 1).await;
        assert!(closed(&mut a).await);
        let _e = waiting_from(&gw, 1).await;
        assert!(closed(&mut b).await);
        assert_eq!(gw.gateway.metrics().snapshot().evicted, 2);
        // Requests being carried are never closed for room: with every slot
        // carrying one, a new connection is refused.
        let url = site.url("/a");
        let mut busy = Vec::new();
        for _ in 0..3 {
            let client = gw.client(None);
            let url = url.clone();
            busy.push(tokio::spawn(async move { client.get(url).send().await }));
            while hanging.requests() < busy.len() {
                tokio::task::yield_now().await;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let request = format!("GET {url} HTTP/1.1\r\nHost: x\r\n\r\n");
        let answer = raw(&gw, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
        assert!(answer.contains("retry-after: 1"), "{answer:?}");
        let json = json_body(&answer);
        assert_eq!(json["error"]["code"], "busy");
        assert!(
            json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("gateway.max_connections"),
            "{json}"
        );
        assert!(gw.gateway.metrics().snapshot().refused >= 1);
        assert_eq!(hanging.requests(), 3);
        assert!(
            busy.iter().all(|t| !t.is_finished()),
            "a busy request was cut"
        );
        for t in busy {
            t.abort();
        }
    })
    .await;
}

#[tokio::test]
async fn one_address_cannot_take_every_slot() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let p = http_proxy(2).await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(p.url())], |c| {
            c.set("gateway", "max_connections", "100")
                .set("gateway", "max_connections_per_ip", "2")
                .set("gateway", "header_timeout", "\"30s\"")
        })
        .await;
        // A flood from 127.0.0.5 keeps at most two connections open: each
        // new one closes its own oldest.
        let mut flood = Vec::new();
        for n in 1..=6 {
            flood.push(waiting_from(&gw, 5).await);
            open_connections(&gw, n.min(2)).await;
        }
        for s in flood.iter_mut().take(4) {
            assert!(closed(s).await);
        }
        assert_eq!(gw.gateway.metrics().snapshot().evicted, 4);
        // Another address is not touched by it, and is served.
        let _other = waiting_from(&gw, 6).await;
        open_connections(&gw, 3).await;
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(gw.gateway.metrics().snapshot().evicted, 4);
    })
    .await;
}

#[tokio::test]
async fn with_a_token_an_unauthenticated_connection_is_closed_at_the_header_timeout() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let p = http_proxy(2).await;
        let token = "gateway-token-0123456789";
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(p.url())], |c| {
            c.set("gateway", "token", &format!("\"{token}\"")).set(
                "gateway",
                "header_timeout",
                "\"1s\"",
            )
        })
        .await;
        // A 407 ends the connection: no second try on it.
        let request = format!("GET {} HTTP/1.1\r\nHost: x\r\n\r\n", site.url("/a"));
        let answer = raw(&gw, request.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 407"), "{answer:?}");
        assert!(
            answer.to_ascii_lowercase().contains("connection: close"),
            "{answer:?}"
        );
        // A client that keeps sending, a line at a time, never a whole
        // head, still loses its slot at the header timeout.
        let started = tokio::time::Instant::now();
        let mut c = TcpStream::connect(gw.addr).await.unwrap();
        c.write_all(b"GET http://127.0.0.1:9/ HTTP/1.1\r\n")
            .await
            .unwrap();
        // It ends only when the gateway closes it: a trickle that kept it
        // would run past this bound, thirty header timeouts, not a speed.
        let trickle = async {
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            let mut sent = 0;
            loop {
                tick.tick().await;
                if c.write_all(format!("X-{sent}: 1\r\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                sent += 1;
                let mut buf = [0u8; 64];
                match tokio::time::timeout(Duration::from_millis(1), c.read(&mut buf)).await {
                    Ok(Ok(0)) | Ok(Err(_)) => break,
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), trickle)
            .await
            .expect("a client sending a header line every 100 ms was held past the header timeout");
        open_connections(&gw, 0).await;
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert_eq!(p.requests(), 0);
        // With the token, a connection is the client's for as long as its
        // requests take: a page slower than the header timeout arrives.
        let mut opts = SiteOpts::routes(vec![("/slow", Reply::text("slow page"))]);
        opts.latency = Duration::from_millis(1500);
        let slow = Site::start(opts).await;
        let client = gw.client(Some(("user", token)));
        let resp = client.get(slow.url("/slow")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.text().await.unwrap(), "slow page");
    })
    .await;
}

#[tokio::test]
async fn a_tunnel_every_proxy_fails_on_alike_is_not_charged_to_them() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::text("page a"))])).await;
        let resetting = |_| {
            FakeHttpProxy::start(HttpProxyOpts {
                connect: true,
                behavior: common::fakes::Behavior::ResetTunnels,
                ..HttpProxyOpts::default()
            })
        };
        let (a, b) = (resetting(0).await, resetting(1).await);
        let gw = Gw::start(
            dir.path(),
            &[AliveProxy::new(a.url()), AliveProxy::new(b.url())],
        )
        .await;
        let (code, _, _) = curl(&["-f", "-p", "-x", &gw.url(), &site.url("/a")]).await;
        assert_ne!(code, 0);
        assert_eq!((a.requests(), b.requests()), (1, 1));
        none_charged(&gw);
        // Where another proxy opens the tunnel, the one that reset is
        // charged.
        let c = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            ..HttpProxyOpts::default()
        })
        .await;
        let dir2 = tempfile::tempdir().unwrap();
        let gw2 = Gw::start(
            dir2.path(),
            &[AliveProxy::new(a.url()), AliveProxy::new(c.url())],
        )
        .await;
        for _ in 0..2 {
            let (code, body, err) = curl(&["-p", "-x", &gw2.url(), &site.url("/a")]).await;
            assert_eq!((code, body.as_str()), (0, "page a"), "{err}");
        }
        assert!(gw2.gateway.pool().is_cooling(gw2.ids[0]));
        assert!(!gw2.gateway.pool().is_cooling(gw2.ids[1]));
    })
    .await;
}
