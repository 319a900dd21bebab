//! The daemon in-process on 127.0.0.1:0, harvesting loopback sources and
//! checking loopback proxies against its own `/judge`: what the API serves
//! must be alive, match every filter, survive a restart, and be guarded by
//! the token when one is set.

use crate::common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::daemon::{self, Daemon};
use common::fakes::{
    self, Behavior, FakeHttpProxy, FakeSocks5, HttpProxyOpts, ProxyKind, SocksOpts,
};
use common::site::{Reply, Site};
use proxywarden::config::Config;
use proxywarden::store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A daemon with `api_extra` (`key = value` lines) added to `[api]`.
async fn start(dir: &Path, sources: &str, api_extra: &str) -> Daemon {
    start_with(dir, sources, |c| c.lines("api", api_extra)).await
}

/// A daemon checking at concurrency 32, whose config `tune` adjusts last.
async fn start_with(
    dir: &Path,
    sources: &str,
    tune: impl FnOnce(common::TestConfig) -> common::TestConfig,
) -> Daemon {
    Daemon::start(dir, sources, |c| tune(c.set("check", "concurrency", "32"))).await
}

/// A test client (see [`daemon::client`]).
fn client() -> reqwest::Client {
    daemon::client(Duration::from_secs(30))
}

fn exit() -> Option<std::net::IpAddr> {
    Some("127.0.0.2".parse().unwrap())
}

/// A JSON source listing the fakes with countries.
fn json_source(dir: &Path, items: &[(SocketAddr, &str, &str)]) -> String {
    let list: Vec<serde_json::Value> = items
        .iter()
        .map(|(a, scheme, country)| {
            serde_json::json!({"ip": a.ip().to_string(), "port": a.port(), "protocols": [scheme], "country": country})
        })
        .collect();
    let path = dir.join("list.json");
    std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
    format!(
        "[[sources]]\nname = \"fixture\"\nurl = \"{}\"\nformat = \"json\"\n",
        path.display()
    )
}

fn proxy_set(rows: &serde_json::Value) -> BTreeSet<String> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| r["url"].as_str().unwrap().to_owned())
        .collect()
}

/// A daemon that has checked five proxies: three alive (an elite http one
/// in the US, an anonymous http one and a socks5 one in Germany), a liar
/// and a closed port.
struct Checked {
    d: Daemon,
    us_elite: FakeHttpProxy,
    de_anon: FakeHttpProxy,
    de_socks: FakeSocks5,
    _liar: FakeHttpProxy,
    _closed: fakes::ClosedPort,
    _dir: tempfile::TempDir,
}

impl Checked {
    async fn start() -> Checked {
        let dir = tempfile::tempdir().unwrap();
        let us_elite = FakeHttpProxy::start(HttpProxyOpts {
            kind: ProxyKind::Elite,
            upstream_bind: exit(),
            ..HttpProxyOpts::default()
        })
        .await;
        let de_anon = FakeHttpProxy::start(HttpProxyOpts {
            kind: ProxyKind::Anonymous,
            upstream_bind: exit(),
            ..HttpProxyOpts::default()
        })
        .await;
        let de_socks = FakeSocks5::start(SocksOpts {
            upstream_bind: exit(),
            ..SocksOpts::default()
        })
        .await;
        let liar = FakeHttpProxy::start(HttpProxyOpts {
            behavior: fakes::Behavior::Liar,
            ..HttpProxyOpts::default()
        })
        .await;
        let closed = fakes::closed_port();
        let sources = json_source(
            dir.path(),
            &[
                (us_elite.addr(), "http", "US"),
                (de_anon.addr(), "http", "DE"),
                (de_socks.addr(), "socks5", "DE"),
                (liar.addr(), "http", "US"),
                (closed.addr(), "http", "US"),
            ],
        );
        let d = start(dir.path(), &sources, "").await;
        until_checked(&d, 5).await;
        // The index takes a verdict just after the store has it.
        d.until_servable(3).await;
        let (_, stats) = d.json("/stats").await;
        assert_eq!(stats["by_status"]["alive"], 3, "{stats}");
        Checked {
            d,
            us_elite,
            de_anon,
            de_socks,
            _liar: liar,
            _closed: closed,
            _dir: dir,
        }
    }

    fn alive(&self) -> BTreeSet<String> {
        [self.us_elite.addr(), self.de_anon.addr()]
            .iter()
            .map(|a| format!("http://{a}"))
            .chain([format!("socks5://{}", self.de_socks.addr())])
            .collect()
    }

    async fn one(&self, query: &str) -> (u16, serde_json::Value) {
        self.d.json(&format!("/proxy?{query}")).await
    }

    async fn report(&self, id: i64, body: reqwest::Body) -> reqwest::Response {
        self.d
            .http
            .post(self.d.url(&format!("/proxies/{id}/report")))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap()
    }

    async fn stop(self) {
        let took = self.d.stop().await;
        assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_proxy_serves_only_alive_proxies_and_spreads_load() {
    let c = Checked::start().await;
    let mut served = BTreeSet::new();
    for _ in 0..60 {
        let (status, p) = c.d.json("/proxy").await;
        assert_eq!(status, 200, "{p}");
        assert_eq!(p["status"], "alive");
        served.insert(p["url"].as_str().unwrap().to_owned());
    }
    assert!(served.is_subset(&c.alive()), "{served:?}");
    assert!(served.len() >= 2, "load is spread: {served:?}");
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_text_and_verify_select_the_matching_proxy() {
    let c = Checked::start().await;
    let (_, p) = c.one("country=de&scheme=socks5").await;
    assert_eq!(p["url"], format!("socks5://{}", c.de_socks.addr()));
    let (_, p) = c.one("country=US,FR").await;
    assert_eq!(p["url"], format!("http://{}", c.us_elite.addr()));
    let (_, p) = c.one("anonymity=elite&scheme=http").await;
    assert_eq!(p["url"], format!("http://{}", c.us_elite.addr()));
    let (_, p) = c.one("anonymity=anonymous&country=DE&scheme=http").await;
    assert_eq!(p["url"], format!("http://{}", c.de_anon.addr()));
    assert_eq!(p["anonymity"], "anonymous");
    let (status, e) = c.one("country=FR").await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["code"], "not_found");
    let (status, _) = c.one("https=true").await;
    assert_eq!(status, 404, "https was not tested, so nothing qualifies");
    let excl = format!("country=US&exclude={}", c.us_elite.addr());
    assert_eq!(c.one(&excl).await.0, 404);

    let text = c.d.get("/proxy?format=text&country=US").await;
    assert_eq!(text.status(), 200);
    assert_eq!(
        text.text().await.unwrap(),
        format!("http://{}", c.us_elite.addr())
    );

    // verify=true re-checks through the judge before answering.
    let (status, p) = c.one("verify=true&country=US").await;
    assert_eq!(status, 200);
    assert_eq!(p["url"], format!("http://{}", c.us_elite.addr()));
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_page_and_sort_every_status() {
    let c = Checked::start().await;
    let d = &c.d;
    let (_, page) = d
        .json("/proxies?status=all&sort=latency&limit=2&offset=0")
        .await;
    assert_eq!(page["total"], 5);
    assert_eq!(page["proxies"].as_array().unwrap().len(), 2);
    let (_, rest) = d
        .json("/proxies?status=all&sort=latency&limit=2&offset=2")
        .await;
    let (_, last) = d
        .json("/proxies?status=all&sort=latency&limit=2&offset=4")
        .await;
    assert_eq!(last["proxies"].as_array().unwrap().len(), 1);
    let mut everything = proxy_set(&page["proxies"]);
    everything.extend(proxy_set(&rest["proxies"]));
    everything.extend(proxy_set(&last["proxies"]));
    assert_eq!(everything.len(), 5);
    let latencies: Vec<Option<i64>> = page["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["proxies"].as_array().unwrap())
        .map(|r| r["latency_ms"].as_i64())
        .collect();
    let known: Vec<i64> = latencies.iter().flatten().copied().collect();
    assert!(known.windows(2).all(|w| w[0] <= w[1]), "{latencies:?}");
    assert_eq!(
        latencies.iter().position(Option::is_none).unwrap_or(4),
        known.len(),
        "never-passed proxies sort last: {latencies:?}"
    );
    let (_, dead) = d.json("/proxies?status=dead").await;
    assert_eq!(dead["total"], 2);
    let reasons: BTreeSet<&str> = dead["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, BTreeSet::from(["content_mismatch", "refused"]));
    let (_, alive) = d.json("/proxies?status=alive&scheme=http").await;
    assert_eq!(alive["total"], 2);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exports_parse_back_to_the_healthy_set() {
    let c = Checked::start().await;
    let alive = c.alive();
    let (_, json) = c.d.json("/export?format=json").await;
    assert_eq!(proxy_set(&json), alive);
    let txt = c.d.get("/export?format=txt").await.text().await.unwrap();
    assert_eq!(
        txt.lines().map(str::to_owned).collect::<BTreeSet<_>>(),
        alive
    );
    let csv_body = c.d.get("/export?format=csv").await.text().await.unwrap();
    let mut reader = csv::Reader::from_reader(csv_body.as_bytes());
    let from_csv: BTreeSet<String> = reader
        .records()
        .map(|r| r.unwrap()[1].to_string())
        .collect();
    assert_eq!(from_csv, alive);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_as_prometheus_text() {
    let c = Checked::start().await;
    c.d.json("/proxy").await;
    let metrics = c.d.get("/metrics").await.text().await.unwrap();
    let lines = metrics.lines().map(|l| Ok(l.to_owned()));
    let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
    let value = |name: &str, label: (&str, &str)| {
        scrape
            .samples
            .iter()
            .find(|s| s.metric == name && s.labels.get(label.0) == Some(label.1))
            .map(|s| match s.value {
                prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Untyped(v) => v,
                _ => f64::NAN,
            })
    };
    assert_eq!(
        value("proxywarden_checks_total", ("outcome", "alive")),
        Some(3.0)
    );
    assert_eq!(
        value("proxywarden_checks_total", ("outcome", "refused")),
        Some(1.0)
    );
    assert_eq!(
        value("proxywarden_api_requests_total", ("route", "/proxy")),
        Some(1.0)
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("proxywarden_check_latency_seconds"))
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_report_hides_a_proxy_at_once() {
    let c = Checked::start().await;
    let (_, p) = c.one("country=DE&scheme=socks5").await;
    let id = p["id"].as_i64().unwrap();
    let resp = c
        .report(id, r#"{"ok": false, "reason": "timeout"}"#.into())
        .await;
    assert_eq!(resp.status(), 200);
    let body: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(body["hidden"], true);
    assert_eq!(c.one("country=DE&scheme=socks5").await.0, 404);
    assert_eq!(c.report(id, "not json".into()).await.status(), 400);
    let resp = c.report(id, vec![b' '; 100_000].into()).await;
    assert_eq!(resp.status(), 413);
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "payload_too_large");
    assert_eq!(
        c.report(999_999, r#"{"ok": true}"#.into()).await.status(),
        404
    );
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_serves_the_same_healthy_set_from_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let a = FakeHttpProxy::start(HttpProxyOpts {
        upstream_bind: exit(),
        ..HttpProxyOpts::default()
    })
    .await;
    let b = FakeSocks5::start(SocksOpts {
        upstream_bind: exit(),
        ..SocksOpts::default()
    })
    .await;
    let closed = fakes::closed_port();
    let sources = json_source(
        dir.path(),
        &[
            (a.addr(), "http", "NL"),
            (b.addr(), "socks5", "NL"),
            (closed.addr(), "http", "NL"),
        ],
    );
    let d = start(dir.path(), &sources, "").await;
    until_checked(&d, 3).await;
    let (_, before) = d.json("/export?format=json").await;
    assert_eq!(proxy_set(&before).len(), 2);
    d.stop().await;

    // The sources are gone now; the healthy set comes from the database.
    std::fs::remove_file(dir.path().join("list.json")).unwrap();
    let d = start(dir.path(), &sources, "").await;
    let (_, after) = d.json("/export?format=json").await;
    assert_eq!(proxy_set(&after), proxy_set(&before));
    let (status, _) = d.json("/proxy?country=NL").await;
    assert_eq!(status, 200);
    d.stop().await;

    // The CLI's export picks the healthy list the same way.
    let cfg = dir.path().join("cli.toml");
    std::fs::write(
        &cfg,
        format!(
            "[database]\npath = \"{}\"\n",
            dir.path().join("daemon.db").display()
        ),
    )
    .unwrap();
    let export = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .arg("-c")
            .arg(&cfg)
            .arg("export")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&export(&["--format", "json"])).unwrap();
    assert_eq!(proxy_set(&json), proxy_set(&before));
    let socks = export(&["--scheme", "socks5", "--anonymity", "elite"]);
    assert_eq!(socks.trim(), format!("socks5://{}", b.addr()));
    assert_eq!(
        export(&["--max-age", "1ms"]),
        "",
        "nothing was checked in the last millisecond"
    );
    let dead = export(&["--status", "dead"]);
    assert_eq!(dead.lines().count(), 1);
}

#[tokio::test]
async fn the_token_guards_every_route_but_healthz_and_judge() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), "", "token = \"s3cret-token\"").await;
    let plain = client();
    for path in [
        "/proxy", "/proxies", "/export", "/stats", "/sources", "/metrics",
    ] {
        let resp = plain.get(d.url(path)).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{path} without a token");
        let body: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        let resp = plain
            .get(d.url(path))
            .bearer_auth("wrong-token")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "{path} with a wrong token");
    }
    let resp = plain
        .post(d.url("/proxies/1/report"))
        .json(&serde_json::json!({"ok": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401);
    assert_eq!(d.get("/stats").await.status(), 200, "the right token");
    assert_eq!(
        plain.get(d.url("/healthz")).send().await.unwrap().status(),
        200
    );
    assert_eq!(
        plain.get(d.url("/judge")).send().await.unwrap().status(),
        200
    );
    d.stop().await;
}

#[test]
fn binding_a_public_address_without_a_token_is_refused() {
    let err = Config::from_toml("[api]\nlisten = \"0.0.0.0:8080\"\n", "public.toml").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("api.listen"), "{msg}");
    assert!(msg.contains("api.token"), "{msg}");
    // A token guessable by whoever can reach the port is refused (issue 10).
    let err =
        Config::from_toml("[api]\nlisten = \"0.0.0.0:8080\"\ntoken = \"t\"\n", "t").unwrap_err();
    assert!(err.to_string().contains("at least 16 characters"), "{err}");
    assert!(
        Config::from_toml(
            "[api]\nlisten = \"0.0.0.0:8080\"\ntoken = \"a-long-enough-token\"\n",
            "t"
        )
        .is_ok()
    );
}

#[tokio::test]
async fn the_judge_can_be_switched_off_and_is_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), "", "judge_per_minute = 3").await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(d.get("/judge").await.status().as_u16());
    }
    // The daemon asks its own judge directly too (from the same address),
    // so the test's first or second request may already be one too many.
    let ok = codes.iter().filter(|c| **c == 200).count();
    assert!((2..=3).contains(&ok), "{codes:?}");
    assert!(codes[..ok].iter().all(|c| *c == 200), "{codes:?}");
    assert!(codes[ok..].iter().all(|c| *c == 429), "{codes:?}");
    d.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path(), "", "judge = false").await;
    assert_eq!(d.get("/judge").await.status(), 404);
    d.stop().await;
}

/// The store of `config` holding one proxy at `addr`, and its id.
async fn store_with_one_proxy(config: Config, addr: SocketAddr) -> (Config, Store, i64) {
    use proxywarden::model::{Candidate, Hints, SourceScheme};
    use proxywarden::store::ProxyFilter;

    let store = Store::open(&config.database.path).unwrap();
    let run = common::source_run("s", "u", 1);
    let c = Candidate::new(
        addr.ip(),
        addr.port(),
        None,
        None,
        SourceScheme::Fixed(proxywarden::proxy::Scheme::Http),
        Hints::default(),
    );
    store.record_source_run(run, vec![c]).await.unwrap();
    let id = store.list_proxies(ProxyFilter::default()).await.unwrap()[0].id;
    (config, store, id)
}

/// A request that outlasts api.request_timeout (here a verify=true whose
/// proxy stopped answering) is answered 503 in the JSON envelope.
#[tokio::test]
async fn a_request_over_the_timeout_gets_a_json_503() {
    use proxywarden::api;
    use proxywarden::check::{CheckOptions, Checker};
    use proxywarden::daemon::Service;
    use proxywarden::health::{Feedback, load_index};
    use proxywarden::store::now_ms;

    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let hang = FakeHttpProxy::start(HttpProxyOpts {
        behavior: fakes::Behavior::Hang,
        ..HttpProxyOpts::default()
    })
    .await;
    // The check itself never times out: only api.request_timeout can end
    // the request, and a request it does not end hangs the test.
    let config = common::TestConfig::new(dir.path())
        .judges(&format!("[\"{}\"]", judge.url()))
        .set("api", "request_timeout", "\"300ms\"")
        .set("check", "timeout", "\"1h\"")
        .build();
    let (config, store, id) = store_with_one_proxy(config, hang.addr()).await;
    store
        .record_checks(
            vec![common::alive_at(id, now_ms())],
            config.check.recheck_policy(),
        )
        .await
        .unwrap();
    let opts = CheckOptions::from_config(&config.check);
    let checker = Checker::prepare(&config, &opts, None).await.unwrap();
    let service = Service::new(
        store.clone(),
        Feedback::new(load_index(&store).await.unwrap(), store.clone()),
        std::sync::Arc::new(config),
    );
    service.checker.set(std::sync::Arc::new(checker));
    let state = service.api();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(api::serve(listener, state, stop.clone()));

    let resp = common::within(
        client()
            .get(format!("http://{addr}/proxy?verify=true"))
            .send(),
    )
    .await
    .unwrap();
    assert_eq!(resp.status(), 503);
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "timeout");
    stop.cancel();
    server.await.unwrap().unwrap();
}

/// At start-up the daemon harvests the sources whose last harvest is
/// missing or older than the schedule's interval (a crash during the last
/// harvest must not leave them waiting for the next slot), and only those.
#[tokio::test]
async fn overdue_sources_are_harvested_at_start_up() {
    use proxywarden::model::{Candidate, Hints, SourceScheme};
    use proxywarden::store::SourceRun;

    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![
        ("/stale.txt", Reply::ok("10.7.7.1:8080\n")),
        ("/fresh.txt", Reply::ok("10.7.7.2:8080\n")),
    ])
    .await;
    {
        // A database that already holds proxies: "stale" was last fetched
        // two hours ago (the schedule runs every 30 minutes), "fresh" just
        // now, and "new" never.
        let store = Store::open(&dir.path().join("daemon.db")).unwrap();
        let now = proxywarden::store::now_ms();
        for (name, path, at) in [
            ("stale", "/stale.txt", now - 2 * 3_600_000),
            ("fresh", "/fresh.txt", now),
        ] {
            let run = SourceRun {
                name: name.into(),
                url: site.url(path),
                format: "text".into(),
                started_at: at,
                http_status: Some(200),
                duration_ms: 1,
                error: None,
                private: 0,
            };
            let c = Candidate::new(
                "10.7.7.9".parse().unwrap(),
                8080,
                None,
                None,
                SourceScheme::Fixed(proxywarden::proxy::Scheme::Http),
                Hints::default(),
            );
            store.record_source_run(run, vec![c]).await.unwrap();
        }
    }
    let new_list = dir.path().join("new.txt");
    std::fs::write(&new_list, "10.7.7.3:8080\n").unwrap();
    let sources = format!(
        "[[sources]]\nname = \"stale\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"fresh\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"new\"\nurl = \"{}\"\n",
        site.url("/stale.txt"),
        site.url("/fresh.txt"),
        new_list.display()
    );
    let d = start(dir.path(), &sources, "").await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let fetches = loop {
        let (_, sources) = d.json("/sources").await;
        let fetches = |name: &str| {
            sources
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["name"] == name)
                .map_or(0, |s| s["fetches_total"].as_i64().unwrap())
        };
        let got = (fetches("stale"), fetches("fresh"), fetches("new"));
        if got.0 >= 2 && got.2 >= 1 {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "overdue sources not harvested: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(fetches, (2, 1, 1), "only the overdue sources are harvested");
    assert_eq!(site.hits("/fresh.txt"), 0);
    assert_eq!(site.hits("/stale.txt"), 1);
    d.stop().await;
}

/// Verdicts another process writes to the same database (a `proxywarden
/// check` run beside the daemon) reach what the daemon serves within
/// seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verdicts_written_by_another_process_are_served_within_seconds() {
    let c = Checked::start().await;
    let (status, p) = c.one("country=US").await;
    assert_eq!(status, 200);
    let id = p["id"].as_i64().unwrap();
    // Another writer on the same file, as the CLI would be.
    let other = Store::open(&c._dir.path().join("daemon.db")).unwrap();
    let dead = common::refused_at(id, proxywarden::store::now_ms());
    other
        .record_checks(
            vec![dead],
            proxywarden::model::RecheckPolicy {
                alive: Duration::from_secs(600),
                alive_jitter: Duration::from_secs(150),
                dead: Duration::from_secs(900),
                dead_max: Duration::from_secs(86_400),
            },
        )
        .await
        .unwrap();
    common::until(
        "the proxy the database says is dead left what is served",
        Duration::from_secs(10),
        || async { c.one("country=US").await.0 == 404 },
    )
    .await;
    c.stop().await;
}

/// Waits until `n` proxies have a verdict.
async fn until_checked(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stats) = d.json("/stats").await;
        if stats["by_status"]["unknown"] == 0 && stats["total"].as_u64() == Some(n) {
            return;
        }
        assert!(Instant::now() < deadline, "never {n} checked: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the daemon has made `n` checks in all (`/metrics`).
async fn until_checks(d: &Daemon, n: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = d.get("/metrics").await.text().await.unwrap();
        let made: f64 = metrics
            .lines()
            .filter(|l| l.starts_with("proxywarden_checks_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if made >= n as f64 {
            return;
        }
        assert!(Instant::now() < deadline, "only {made} checks made");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// When 30% of the served proxies die at once, plain `/proxy` answers
/// (no verify) hardly ever name a dead one afterwards: served proxies are
/// re-checked on a short cycle, and a burst of failures among them makes
/// every other one suspect until it passes a check again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_mass_death_plain_proxy_answers_are_alive() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxies = Vec::new();
    for _ in 0..100 {
        proxies.push(
            FakeHttpProxy::start(HttpProxyOpts {
                upstream_bind: exit(),
                ..HttpProxyOpts::default()
            })
            .await,
        );
    }
    let items: Vec<(SocketAddr, &str, &str)> =
        proxies.iter().map(|p| (p.addr(), "http", "US")).collect();
    let sources = json_source(dir.path(), &items);
    // The cycle scales down with the pool: 100 proxies every second stand
    // for 2,000 every 20 s. The judge is the daemon's own, and every check
    // reaches it from one address (127.0.0.2): its limit per client would
    // leave most re-checks without a verdict.
    let d = start_with(dir.path(), &sources, |c| {
        c.set("check", "serve_recheck_min", "\"1s\"")
            .set("check", "serve_recheck_rate", "100")
            .set("api", "judge_per_minute", "1000000")
    })
    .await;
    d.until_servable(100).await;
    // The first round checked all of them at once, so no re-check is due
    // for the first part of a cycle: a death then goes unseen that long,
    // at any scale. Here the served proxies die once their re-checks run,
    // each proxy checked twice.
    until_checks(&d, 200).await;

    let killed: BTreeSet<String> = proxies
        .drain(..30)
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    let measured = Instant::now();
    let (mut answers, mut dead) = (0u32, 0u32);
    // A client asking every 5 ms, not as fast as it can: the tests running
    // beside this one need the CPU too.
    let mut every = tokio::time::interval(Duration::from_millis(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while measured.elapsed() < Duration::from_secs(15) {
        every.tick().await;
        let resp = d.get("/proxy?format=text").await;
        assert_eq!(resp.status(), 200);
        answers += 1;
        if killed.contains(&resp.text().await.unwrap()) {
            dead += 1;
        }
    }
    eprintln!("mass death: {dead} of {answers} answers named a dead proxy");
    assert!(answers >= 200, "only {answers} answers");
    // Before, about 30% named a dead proxy for minutes. At this scale the
    // hundred milliseconds or so before the burst is seen weigh more than
    // in the issue's minute after 2,000 die; `cargo bench --bench freshness`
    // measures that case against its 1% target.
    assert!(
        f64::from(dead) <= 0.03 * f64::from(answers),
        "{dead} of {answers} answers named a dead proxy"
    );
    d.stop().await;
}

/// After a restart on a database of checked proxies, `verify=true` works at
/// once; candidates that fail their fresh check are named in the 404 and are
/// not served afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_works_from_the_first_second_and_hides_what_it_finds_dead() {
    let dir = tempfile::tempdir().unwrap();
    let good = FakeHttpProxy::start(HttpProxyOpts {
        upstream_bind: exit(),
        ..HttpProxyOpts::default()
    })
    .await;
    let doomed = FakeHttpProxy::start(HttpProxyOpts {
        upstream_bind: exit(),
        ..HttpProxyOpts::default()
    })
    .await;
    let sources = json_source(
        dir.path(),
        &[(good.addr(), "http", "US"), (doomed.addr(), "http", "DE")],
    );
    let d = start(dir.path(), &sources, "").await;
    d.until_servable(2).await;
    d.stop().await;

    // Restarted: nothing is due for minutes, yet verify answers at once,
    // by its own check: one that waited for a scheduled check would run
    // past the API's request timeout (and the client's 30 s).
    let d = start(dir.path(), &sources, "").await;
    let (status, p) = d.json("/proxy?verify=true&country=US").await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["url"], format!("http://{}", good.addr()));

    drop(doomed);
    let (status, e) = d.json("/proxy?verify=true&country=DE").await;
    assert_eq!(status, 404, "{e}");
    // Verify's own check found it dead, or the re-checks that keep served
    // proxies fresh after a start found it first: either way it is not
    // handed out. (`verify::a_failed_verification_is_charged_as_a_failure_in_use`
    // holds the message of the first case on its own.)
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the 1 tried failed") || message.contains("no alive proxy matches"),
        "{message}"
    );
    assert_eq!(
        d.json("/proxy?country=DE").await.0,
        404,
        "served after failing"
    );
    d.stop().await;
}

/// A served proxy that fails `verify=true` in a way that may be the judge's
/// (a wrong page), with no second judge to confirm it, is not served on that
/// request but is not hidden either: like a check round, verify never turns
/// an alive proxy dead on an unconfirmed verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_skips_but_keeps_a_proxy_it_cannot_confirm_dead() {
    let dir = tempfile::tempdir().unwrap();
    let lying = Arc::new(AtomicBool::new(false));
    let proxy = FakeHttpProxy::start(HttpProxyOpts {
        upstream_bind: exit(),
        later: Some((lying.clone(), Behavior::Liar)),
        ..HttpProxyOpts::default()
    })
    .await;
    let sources = json_source(dir.path(), &[(proxy.addr(), "http", "DE")]);
    let d = start(dir.path(), &sources, "").await;
    d.until_servable(1).await;

    lying.store(true, Ordering::SeqCst);
    let (status, e) = d.json("/proxy?verify=true&country=DE").await;
    assert_eq!(status, 404, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("judge that may be at fault"), "{message}");
    let (status, p) = d.json("/proxy?country=DE").await;
    assert_eq!(status, 200, "hidden on an unconfirmed verdict: {p}");
    assert_eq!(p["url"], format!("http://{}", proxy.addr()));
    d.stop().await;
}

/// With no judge answering, `verify=true` over proxies it could verify is a
/// 503 that says why, not a 404; over an empty pool it is the 404 that says
/// why nothing can be served, at once.
#[tokio::test]
async fn verify_without_a_judge_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let closed = fakes::closed_port();
    let judges = format!("[\"http://{}/judge\"]", closed.addr());
    let d = start_with(dir.path(), "", |c| c.judges(&judges)).await;
    let (status, e) = d.json("/proxy?verify=true").await;
    assert_eq!(status, 404, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no proxy to serve"),
        "{e}"
    );
    d.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let proxy = fakes::http_proxy(2).await;
    let (store, _) = common::store_with_alive(
        &dir.path().join("test.db"),
        &[common::AliveProxy::new(proxy.url())],
    )
    .await;
    drop(store);
    let d = start_with(dir.path(), "", |c| c.db("test.db").judges(&judges)).await;
    let (status, e) = d.json("/proxy?verify=true").await;
    assert_eq!(status, 503, "{e}");
    assert_eq!(e["error"]["code"], "not_ready");
    d.stop().await;
}

/// Issue 10, Must 13: when everything checked is dead, `/proxy`'s 404 says
/// that nothing is alive (not that the filters matched nothing), in JSON
/// and in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_pool_says_nothing_is_alive() {
    let dir = tempfile::tempdir().unwrap();
    let closed = fakes::closed_port();
    let liar = FakeHttpProxy::start(HttpProxyOpts {
        behavior: fakes::Behavior::Liar,
        ..HttpProxyOpts::default()
    })
    .await;
    let sources = json_source(
        dir.path(),
        &[(closed.addr(), "http", "US"), (liar.addr(), "http", "DE")],
    );
    let d = start(dir.path(), &sources, "").await;
    until_checked(&d, 2).await;
    let (status, body) = d.json("/proxy").await;
    assert_eq!(status, 404, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("nothing alive"), "{message}");
    let resp = d.get("/proxy?format=text").await;
    assert_eq!(resp.status().as_u16(), 404);
    assert!(resp.text().await.unwrap().contains("nothing alive"));
    // The round's checks that no second judge confirmed are shown (none
    // here: nothing was alive to keep).
    let deadline = Instant::now() + Duration::from_secs(30);
    let stats = loop {
        let (_, stats) = d.json("/stats").await;
        if !stats["last_check"].is_null() {
            break stats;
        }
        assert!(Instant::now() < deadline, "no round finished: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(stats["last_check"]["unconfirmed"], 0, "{stats}");
    d.stop().await;
}

/// A judge's password in its URL never leaves the config: `/healthz` (open
/// to every Host), `/stats` and `/metrics` name the judge without it.
#[tokio::test]
async fn judge_urls_are_shown_without_their_password() {
    let dir = tempfile::tempdir().unwrap();
    let closed = fakes::closed_port();
    let proxy = fakes::http_proxy(2).await;
    let (store, _) = common::store_with_alive(
        &dir.path().join("test.db"),
        &[common::AliveProxy::new(proxy.url())],
    )
    .await;
    drop(store);
    let judges = format!(
        "[\"http://judgeuser:s3cret-judge@{}/judge\"]",
        closed.addr()
    );
    let d = start_with(dir.path(), "", |c| c.db("test.db").judges(&judges)).await;
    // verify=true asks the judge directly; it fails, and says so.
    let _ = d.json("/proxy?verify=true").await;
    let shown = format!("http://{}/judge", closed.addr());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stats = d.get("/stats").await.text().await.unwrap();
        let health = d.get("/healthz").await.text().await.unwrap();
        let metrics = d.get("/metrics").await.text().await.unwrap();
        for (what, text) in [
            ("/stats", &stats),
            ("/healthz", &health),
            ("/metrics", &metrics),
        ] {
            assert!(
                !text.contains("s3cret-judge"),
                "{what} shows the judge's password: {text}"
            );
            assert!(
                !text.contains("judgeuser"),
                "{what} shows the judge's user: {text}"
            );
        }
        if stats.contains(&shown) && metrics.contains(&shown) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the judge is not named in /stats and /metrics: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    d.stop().await;
}
