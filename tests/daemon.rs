//! The daemon in-process on 127.0.0.1:0, harvesting loopback sources and
//! checking loopback proxies against its own `/judge`: what the API serves
//! must be alive, match every filter, survive a restart, and be guarded by
//! the token when one is set.

mod common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use common::fakes::{self, FakeHttpProxy, FakeSocks5, HttpProxyOpts, ProxyKind, SocksOpts};
use proxywarden::config::Config;
use proxywarden::store::Store;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

struct Daemon {
    addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
    http: reqwest::Client,
    token: Option<String>,
}

impl Daemon {
    async fn start(dir: &Path, sources: &str, api_extra: &str) -> Daemon {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Without sources the built-in public ones would be used: tests
        // never reach the internet, so give them an empty local list.
        let empty;
        let sources = if sources.is_empty() {
            let path = dir.join("empty.txt");
            std::fs::write(&path, "").unwrap();
            empty = format!(
                "[[sources]]\nname = \"empty\"\nurl = \"{}\"\n",
                path.display()
            );
            empty.as_str()
        } else {
            sources
        };
        let toml = format!(
            r#"
[database]
path = "{db}"

[check]
judges = [{{ url = "http://{addr}/judge", marker = "proxywarden-judge" }}]
concurrency = 32
connect_timeout = "1s"
timeout = "2s"
https = false

[api]
listen = "{addr}"
{api_extra}

{sources}
"#,
            db = dir.join("daemon.db").display(),
        );
        let config = Config::from_toml(&toml, "daemon.toml").unwrap();
        let token = config.api.token.as_ref().map(|t| t.0.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(proxywarden::daemon::run(config, listener, shutdown.clone()));
        Daemon {
            addr,
            shutdown,
            task,
            http: client(),
            token,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    async fn get(&self, path: &str) -> reqwest::Response {
        let mut req = self.http.get(self.url(path));
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        req.send().await.unwrap()
    }

    async fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = self.get(path).await;
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }

    /// Waits until a check round has finished (polling `/stats`).
    async fn checked(&self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, stats) = self.json("/stats").await;
            if !stats["last_check"].is_null() {
                return stats;
            }
            assert!(
                Instant::now() < deadline,
                "no check round within 30 s: {stats}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn stop(self) -> Duration {
        let started = Instant::now();
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap();
        started.elapsed()
    }
}

/// A test client: direct, with the crate's TLS setup (no other provider is
/// compiled in).
fn client() -> reqwest::Client {
    let tls =
        proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .no_proxy()
        .build()
        .unwrap()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_serves_only_alive_proxies_matching_the_filters() {
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
    let d = Daemon::start(dir.path(), &sources, "").await;
    let stats = d.checked().await;
    assert_eq!(stats["last_check"]["checked"], 5);
    assert_eq!(stats["last_check"]["alive"], 3);
    assert_eq!(stats["servable"], 3);

    let alive: BTreeSet<String> = [us_elite.addr(), de_anon.addr()]
        .iter()
        .map(|a| format!("http://{a}"))
        .chain([format!("socks5://{}", de_socks.addr())])
        .collect();

    // Plain /proxy: only ever one of the alive three.
    let mut served = BTreeSet::new();
    for _ in 0..60 {
        let (status, p) = d.json("/proxy").await;
        assert_eq!(status, 200, "{p}");
        assert_eq!(p["status"], "alive");
        served.insert(p["url"].as_str().unwrap().to_owned());
    }
    assert!(served.is_subset(&alive), "{served:?}");
    assert!(served.len() >= 2, "load is spread: {served:?}");

    // Filters.
    let one = |q: &'static str| {
        let d = &d;
        async move { d.json(&format!("/proxy?{q}")).await }
    };
    let (_, p) = one("country=de&scheme=socks5").await;
    assert_eq!(p["url"], format!("socks5://{}", de_socks.addr()));
    let (_, p) = one("country=US,FR").await;
    assert_eq!(p["url"], format!("http://{}", us_elite.addr()));
    let (_, p) = one("anonymity=elite&scheme=http").await;
    assert_eq!(p["url"], format!("http://{}", us_elite.addr()));
    let (_, p) = one("anonymity=anonymous&country=DE&scheme=http").await;
    assert_eq!(p["url"], format!("http://{}", de_anon.addr()));
    assert_eq!(p["anonymity"], "anonymous");
    let (status, e) = one("country=FR").await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["code"], "not_found");
    let (status, _) = one("https=true").await;
    assert_eq!(status, 404, "https was not tested, so nothing qualifies");
    let excl = format!("/proxy?country=US&exclude={}", us_elite.addr());
    assert_eq!(d.json(&excl).await.0, 404);

    let text = d.get("/proxy?format=text&country=US").await;
    assert_eq!(text.status(), 200);
    assert_eq!(
        text.text().await.unwrap(),
        format!("http://{}", us_elite.addr())
    );

    // verify=true re-checks through the judge before answering.
    let (status, p) = one("verify=true&country=US").await;
    assert_eq!(status, 200);
    assert_eq!(p["url"], format!("http://{}", us_elite.addr()));

    // Bad parameters name themselves.
    for (q, needle) in [
        ("country=USA", "country"),
        ("scheme=ftp", "scheme"),
        ("anonymity=high", "anonymity"),
        ("max_latency_ms=fast", "max_latency_ms"),
        ("max_age=soon", "max_age"),
        ("https=maybe", "https"),
        ("colour=red", "colour"),
        ("format=xml", "format"),
    ] {
        let (status, e) = d.json(&format!("/proxy?{q}")).await;
        assert_eq!(status, 400, "{q}");
        assert_eq!(e["error"]["code"], "bad_request");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{q}: {e}"
        );
    }
    let (status, e) = d.json("/proxies?limit=5000").await;
    assert_eq!(status, 400);
    assert!(e["error"]["message"].as_str().unwrap().contains("limit"));
    let (status, e) = d.json("/no/such/route").await;
    assert_eq!(status, 404);
    assert_eq!(e["error"]["code"], "not_found");

    // /proxies: paging and sorting, every status.
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
    let (_, dead) = d.json("/proxies?status=dead").await;
    assert_eq!(dead["total"], 2);
    let reasons: BTreeSet<&str> = dead["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, BTreeSet::from(["content_mismatch", "refused"]));

    // Exports parse back to the healthy set.
    let (_, json) = d.json("/export?format=json").await;
    assert_eq!(proxy_set(&json), alive);
    let txt = d.get("/export?format=txt").await.text().await.unwrap();
    assert_eq!(
        txt.lines().map(str::to_owned).collect::<BTreeSet<_>>(),
        alive
    );
    let csv_body = d.get("/export?format=csv").await.text().await.unwrap();
    let mut reader = csv::Reader::from_reader(csv_body.as_bytes());
    let from_csv: BTreeSet<String> = reader
        .records()
        .map(|r| r.unwrap()[1].to_string())
        .collect();
    assert_eq!(from_csv, alive);

    // Metrics parse as Prometheus text.
    let metrics = d.get("/metrics").await.text().await.unwrap();
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
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric == "proxywarden_api_requests_total")
    );
    assert!(
        scrape
            .samples
            .iter()
            .any(|s| s.metric.starts_with("proxywarden_check_latency_seconds"))
    );

    // A report hides a proxy at once.
    let (_, p) = one("country=DE&scheme=socks5").await;
    let id = p["id"].as_i64().unwrap();
    let resp = d
        .http
        .post(d.url(&format!("/proxies/{id}/report")))
        .json(&serde_json::json!({"ok": false, "reason": "timeout"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(one("country=DE&scheme=socks5").await.0, 404);
    let resp = d
        .http
        .post(d.url(&format!("/proxies/{id}/report")))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = d
        .http
        .post(d.url(&format!("/proxies/{id}/report")))
        .body(vec![b' '; 100_000])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "payload_too_large");
    let resp = d
        .http
        .post(d.url("/proxies/999999/report"))
        .json(&serde_json::json!({"ok": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);

    let took = d.stop().await;
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
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
    let d = Daemon::start(dir.path(), &sources, "").await;
    d.checked().await;
    let (_, before) = d.json("/export?format=json").await;
    assert_eq!(proxy_set(&before).len(), 2);
    d.stop().await;

    // The sources are gone now; the healthy set comes from the database.
    std::fs::remove_file(dir.path().join("list.json")).unwrap();
    let d = Daemon::start(dir.path(), &sources, "").await;
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
    let d = Daemon::start(dir.path(), "", "token = \"s3cret-token\"").await;
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
    let d = Daemon::start(dir.path(), "", "judge_per_minute = 3").await;
    let mut codes = Vec::new();
    for _ in 0..5 {
        codes.push(d.get("/judge").await.status().as_u16());
    }
    assert_eq!(codes, [200, 200, 200, 429, 429]);
    d.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start(dir.path(), "", "judge = false").await;
    assert_eq!(d.get("/judge").await.status(), 404);
    d.stop().await;
}

/// A store in `dir` holding one proxy at `addr`, and its id.
async fn store_with_one_proxy(dir: &Path, addr: SocketAddr, extra: &str) -> (Config, Store, i64) {
    use proxywarden::model::{Candidate, Hints, SourceScheme};
    use proxywarden::store::{ProxyFilter, SourceRun};

    let config = Config::from_toml(
        &format!(
            "[database]\npath = \"{}\"\n{extra}",
            dir.join("q.db").display()
        ),
        "t",
    )
    .unwrap();
    let store = Store::open(&config.database.path).unwrap();
    let run = SourceRun {
        name: "s".into(),
        url: "u".into(),
        format: "text".into(),
        started_at: 1,
        http_status: None,
        duration_ms: 0,
        error: None,
    };
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
    use proxywarden::api::{self, AppState};
    use proxywarden::check::{CheckOptions, Checker};
    use proxywarden::health::{Feedback, load_index};
    use proxywarden::store::now_ms;

    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let hang = FakeHttpProxy::start(HttpProxyOpts {
        behavior: fakes::Behavior::Hang,
        ..HttpProxyOpts::default()
    })
    .await;
    let extra = format!(
        "[check]\njudges = [\"{}\"]\n[api]\nrequest_timeout = \"300ms\"\n",
        judge.url()
    );
    let (config, store, id) = store_with_one_proxy(dir.path(), hang.addr(), &extra).await;
    store
        .record_checks(
            vec![common::alive_at(id, now_ms())],
            config.check.recheck_policy(),
        )
        .await
        .unwrap();
    let opts = CheckOptions::from_config(&config.check);
    let checker = Checker::prepare(&config, &opts, None).await.unwrap();
    let state = AppState::new(
        store.clone(),
        Feedback::new(load_index(&store).await.unwrap(), store.clone()),
        std::sync::Arc::new(config),
    );
    state.set_checker(std::sync::Arc::new(checker));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let server = tokio::spawn(api::serve(listener, state, stop.clone()));

    let started = Instant::now();
    let resp = client()
        .get(format!("http://{addr}/proxy?verify=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let e: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(e["error"]["code"], "timeout");
    stop.cancel();
    server.await.unwrap().unwrap();
}
