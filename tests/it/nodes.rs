//! Several `serve` nodes on one PostgreSQL database: the real binary,
//! twice, on a real server the test starts, checking a farm of fake
//! proxies against a judge in the test. They split the checks (each proxy
//! once per interval in all), serve the same pool, stop serving a proxy
//! that failed in use on another node within a second, finish the round of
//! a node killed with SIGKILL, and harvest each source once per slot.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use common::fakes::{FakeHttpProxy, HttpProxyOpts};
use common::judges::Judge;
use common::postgres::PgServer;
use common::site::{Reply, Site};
use proxywarden::store::Store;

/// One `serve` process of the built binary.
struct Node {
    api: SocketAddr,
    child: tokio::process::Child,
    log: PathBuf,
    http: reqwest::Client,
}

impl Node {
    /// Starts node `id` on `url` with the config `base` (sources, judges,
    /// check settings) gives; waits until its API answers.
    async fn start(dir: &Path, id: &str, url: &str, base: &common::TestConfig) -> Node {
        let port = common::free_port();
        let node_dir = dir.join(id);
        std::fs::create_dir_all(&node_dir).unwrap();
        let config = base
            .clone()
            .set(
                "database",
                "path",
                &format!("\"{}\"", node_dir.join("local.db").display()),
            )
            .set("database", "url", &format!("\"{url}\""))
            .set("node", "id", &format!("\"{id}\""))
            .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
            .set("gateway", "enabled", "false");
        let path = node_dir.join("proxywarden.toml");
        std::fs::write(&path, config.toml()).unwrap();
        let log = node_dir.join("serve.log");
        let (child, _pid) =
            common::binary::spawn_serve(env!("CARGO_BIN_EXE_proxywarden"), &path, &log).unwrap();
        let node = Node {
            api: SocketAddr::from(([127, 0, 0, 1], port)),
            child,
            log,
            http: common::daemon::client(Duration::from_secs(10)),
        };
        common::until(
            &format!("node {id} answers /healthz"),
            Duration::from_secs(30),
            || async { node.http.get(node.url("/healthz")).send().await.is_ok() },
        )
        .await;
        node
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.api)
    }

    async fn json(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = self.http.get(self.url(path)).send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or_default())
    }

    /// Proxies it serves now.
    async fn servable(&self) -> u64 {
        self.json("/stats").await.1["servable"]
            .as_u64()
            .unwrap_or(0)
    }

    /// Checks it has made (`/metrics`).
    async fn checks(&self) -> f64 {
        let metrics = self
            .http
            .get(self.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metrics
            .lines()
            .filter(|l| l.starts_with("proxywarden_checks_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: no shutdown, no lease given back.
    async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}

/// A judge answering the checker's direct requests at once and those
/// through proxies (from 127.0.0.2) `delay` late, counting the latter.
async fn judge(delay: Duration, proxied: Arc<AtomicUsize>) -> Judge {
    let open = Arc::new(tokio::sync::Semaphore::new(
        tokio::sync::Semaphore::MAX_PERMITS,
    ));
    judge_gated(delay, proxied, open).await
}

/// [`judge`], answering through a proxy only while `gate` has permits.
async fn judge_gated(
    delay: Duration,
    proxied: Arc<AtomicUsize>,
    gate: Arc<tokio::sync::Semaphore>,
) -> Judge {
    let app = axum::Router::new().route(
        "/judge",
        get(
            move |info: ConnectInfo<SocketAddr>, m: Method, u: Uri, h: HeaderMap| {
                let through_proxy = info.0.ip() != IpAddr::from([127, 0, 0, 1]);
                if through_proxy {
                    proxied.fetch_add(1, Ordering::SeqCst);
                }
                let gate = gate.clone();
                async move {
                    if through_proxy {
                        drop(gate.acquire().await);
                        tokio::time::sleep(delay).await;
                    }
                    proxywarden::api::judge::judge(info, m, u, h)
                        .await
                        .into_response()
                }
            },
        ),
    );
    Judge::plain_with(app).await
}

/// `n` working proxies forwarding from 127.0.0.2.
async fn farm(n: usize) -> Vec<FakeHttpProxy> {
    let mut proxies = Vec::with_capacity(n);
    for _ in 0..n {
        proxies.push(
            FakeHttpProxy::start(HttpProxyOpts {
                upstream_bind: Some(IpAddr::from([127, 0, 0, 2])),
                ..HttpProxyOpts::default()
            })
            .await,
        );
    }
    proxies
}

/// A JSON list of `proxies`, the first in DE and the rest in US.
fn json_list(proxies: &[FakeHttpProxy]) -> String {
    let items: Vec<serde_json::Value> = proxies
        .iter()
        .enumerate()
        .map(|(i, p)| {
            serde_json::json!({
                "ip": p.addr().ip().to_string(),
                "port": p.addr().port(),
                "protocols": ["http"],
                "country": if i == 0 { "DE" } else { "US" },
            })
        })
        .collect();
    serde_json::to_string(&items).unwrap()
}

/// The config both nodes share: `source` harvested, `judge` asked,
/// `concurrency` checks in flight per node, leases of `lease`, and
/// served proxies re-checked only after ten minutes, so that a second
/// check of a proxy within the test would be a check twice in one
/// interval. Every proxy works, so checks get long timeouts: a check cut
/// short by a loaded machine would be re-checked and counted twice.
fn base(
    dir: &Path,
    source: &str,
    judge: &Judge,
    concurrency: u32,
    lease: &str,
) -> common::TestConfig {
    common::TestConfig::new(dir)
        .judges(&format!(
            "[{{ url = \"{}\", marker = \"proxywarden-judge\" }}]",
            judge.url()
        ))
        .set("check", "https", "false")
        .set("check", "connect_timeout", "\"10s\"")
        .set("check", "timeout", "\"10s\"")
        .set("check", "concurrency", &concurrency.to_string())
        .set("check", "serve_recheck_min", "\"10m\"")
        .set("check", "recheck_alive", "\"10m\"")
        .set("node", "lease", &format!("\"{lease}\""))
        .source("list", source, "format = \"json\"")
}

async fn pg() -> PgServer {
    tokio::task::spawn_blocking(PgServer::start).await.unwrap()
}

/// Requests each proxy received.
fn per_proxy(proxies: &[FakeHttpProxy]) -> Vec<usize> {
    proxies.iter().map(FakeHttpProxy::requests).collect()
}

/// (a), (b), (c): two nodes split one round (each proxy checked once in
/// all, both nodes checking), serve the same pool, and a proxy reported
/// failed on one node stops being handed out by the other within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_split_checks_serve_one_pool_and_drop_a_failed_proxy_within_a_second() {
    const N: usize = 40;
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let proxied = Arc::new(AtomicUsize::new(0));
    // No check passes before both nodes are up: a node that started after
    // the other had checked a proxy would re-check it at once, as a node
    // does what it loads, and count it twice.
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let judge = judge_gated(Duration::from_millis(200), proxied.clone(), gate.clone()).await;
    let proxies = farm(N).await;
    let site = Site::routes(vec![("/list.json", Reply::ok(json_list(&proxies)))]).await;
    let base = base(dir.path(), &site.url("/list.json"), &judge, 4, "20s");
    let url = server.url();
    let (a, b) = tokio::join!(
        Node::start(dir.path(), "a", &url, &base),
        Node::start(dir.path(), "b", &url, &base)
    );
    gate.add_permits(tokio::sync::Semaphore::MAX_PERMITS);
    common::until(
        "both nodes serve every proxy",
        Duration::from_secs(60),
        || async { a.servable().await == N as u64 && b.servable().await == N as u64 },
    )
    .await;
    // (a) Every proxy checked once in all; both nodes took part.
    assert_eq!(per_proxy(&proxies), vec![1; N], "each proxy checked once");
    assert_eq!(
        proxied.load(Ordering::SeqCst),
        N,
        "judge requests through proxies"
    );
    let (checks_a, checks_b) = (a.checks().await, b.checks().await);
    assert_eq!(checks_a + checks_b, N as f64);
    assert!(
        checks_a > 0.0 && checks_b > 0.0,
        "both nodes checked: {checks_a} + {checks_b}"
    );

    // (b) The same pool on both: the same proxies exported.
    let export = |n: &Node| {
        let url = n.url("/export?format=txt");
        let http = n.http.clone();
        async move {
            let text = http.get(url).send().await.unwrap().text().await.unwrap();
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            lines.sort();
            lines
        }
    };
    let (ea, eb) = (export(&a).await, export(&b).await);
    assert_eq!(ea.len(), N);
    assert_eq!(ea, eb);

    // (c) The one DE proxy fails in use on a; b stops handing it out
    // within a second.
    let (status, p) = b.json("/proxy?country=DE").await;
    assert_eq!(status, 200, "{p}");
    let id = p["id"].as_i64().unwrap();
    let reported = a
        .http
        .post(a.url(&format!("/proxies/{id}/report")))
        .header("content-type", "application/json")
        .body(r#"{"ok": false, "reason": "timeout"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(reported.status(), 200);
    common::until(
        "node b stops serving the proxy that failed on node a",
        Duration::from_secs(1),
        || async { b.json("/proxy?country=DE").await.0 == 404 },
    )
    .await;
    assert_eq!(a.json("/proxy?country=DE").await.0, 404);
    // The rest is still served by both.
    assert_eq!(b.json("/proxy?country=US").await.0, 200);
    a.kill().await;
    b.kill().await;
}

/// (d): a node killed with SIGKILL in the middle of a round: the other
/// finishes the round, taking the proxies the dead one held once its
/// leases run out; every proxy ends up with a verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_round_leaves_its_proxies_to_the_other() {
    const N: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let proxied = Arc::new(AtomicUsize::new(0));
    let judge = judge(Duration::from_millis(400), proxied.clone()).await;
    let proxies = farm(N).await;
    let site = Site::routes(vec![("/list.json", Reply::ok(json_list(&proxies)))]).await;
    let base = base(dir.path(), &site.url("/list.json"), &judge, 4, "3s");
    let url = server.url();
    let (a, b) = tokio::join!(
        Node::start(dir.path(), "a", &url, &base),
        Node::start(dir.path(), "b", &url, &base)
    );
    common::until(
        "the round is under way on node a",
        Duration::from_secs(30),
        || async { a.checks().await >= 4.0 },
    )
    .await;
    let done_by_a = a.checks().await;
    a.kill().await;
    assert!(
        (done_by_a as usize) < N,
        "node a was killed mid-round, after {done_by_a} checks"
    );
    common::until(
        "node b finishes the round",
        Duration::from_secs(60),
        || async { b.servable().await == N as u64 },
    )
    .await;
    let store = Store::connect(&server.url()).await.unwrap();
    let stats = store.counts().await.unwrap();
    assert_eq!(
        stats.by_status.get("unknown").copied().unwrap_or(0),
        0,
        "{stats:?}"
    );
    assert_eq!(
        stats.by_status.get("alive").copied(),
        Some(N as i64),
        "{stats:?}"
    );
    // A proxy is checked a second time only if node a was checking it
    // when it died: at most its checks in flight (4) and the page it held.
    let twice = per_proxy(&proxies).iter().filter(|n| **n > 1).count();
    assert!(twice <= 8, "{twice} proxies checked twice");
    assert!(per_proxy(&proxies).iter().all(|n| *n >= 1));
    b.kill().await;
}

/// A node killed with SIGKILL mid-round and started again under the same
/// node.id takes back the proxies its last run leased at once, rather than
/// after the leases (ten minutes here) end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_under_its_id_takes_back_its_leases_at_once() {
    const N: usize = 24;
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let proxied = Arc::new(AtomicUsize::new(0));
    let judge = judge(Duration::from_millis(400), proxied.clone()).await;
    let proxies = farm(N).await;
    let site = Site::routes(vec![("/list.json", Reply::ok(json_list(&proxies)))]).await;
    let base = base(dir.path(), &site.url("/list.json"), &judge, 4, "10m");
    let url = server.url();
    let a = Node::start(dir.path(), "a", &url, &base).await;
    common::until(
        "the round is under way on node a",
        Duration::from_secs(30),
        || async { a.checks().await >= 4.0 },
    )
    .await;
    a.kill().await;
    let store = Store::connect(&url).await.unwrap();
    let unknown = store
        .counts()
        .await
        .unwrap()
        .by_status
        .get("unknown")
        .copied();
    assert!(unknown.unwrap_or(0) > 0, "node a was killed mid-round");
    let a = Node::start(dir.path(), "a", &url, &base).await;
    common::until(
        "node a, back, says it took back its leases",
        Duration::from_secs(30),
        || async {
            std::fs::read_to_string(&a.log)
                .is_ok_and(|l| l.contains("took back the check leases of this node's last run"))
        },
    )
    .await;
    common::until(
        "node a, back, finishes the round",
        Duration::from_secs(60),
        || async { a.servable().await == N as u64 },
    )
    .await;
    a.kill().await;
}

/// (e): two nodes harvesting every two seconds fetch each source once per
/// slot in all, and the node that skips a slot says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_harvest_each_source_once_per_slot() {
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let proxied = Arc::new(AtomicUsize::new(0));
    let judge = judge(Duration::ZERO, proxied).await;
    let proxies = farm(2).await;
    let site = Site::routes(vec![("/list.json", Reply::ok(json_list(&proxies)))]).await;
    let base = base(dir.path(), &site.url("/list.json"), &judge, 4, "20s").set(
        "harvest",
        "schedule",
        "\"*/2 * * * * *\"",
    );
    let url = server.url();
    let (a, b) = tokio::join!(
        Node::start(dir.path(), "a", &url, &base),
        Node::start(dir.path(), "b", &url, &base)
    );
    let skipped = "another node harvests these sources in this slot";
    common::until("five slots pass", Duration::from_secs(30), || async {
        site.hits("/list.json") >= 5
    })
    .await;
    // Counted from the claims: one row per slot harvested.
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let hits_before = site.hits("/list.json");
    let claims: i64 = client
        .query_one(
            "SELECT count(*) FROM harvest_claims WHERE source = 'list'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let hits_after = site.hits("/list.json");
    // A claim is written just before its fetch: the count lies between the
    // fetches seen before and after it.
    assert!(
        (hits_before as i64..=hits_after as i64 + 1).contains(&claims),
        "{claims} slots claimed, {hits_before}..{hits_after} fetches"
    );
    let slots: i64 = client
        .query_one(
            "SELECT count(DISTINCT slot) FROM harvest_claims WHERE source = 'list'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(slots, claims, "one claim per slot");
    // Nodes agree on the slot a trigger is for: claims are whole slots
    // apart, never two for one run.
    let at: Vec<i64> = client
        .query(
            "SELECT slot FROM harvest_claims WHERE source = 'list' ORDER BY slot",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        at.windows(2).all(|w| w[1] - w[0] >= 2_000),
        "claims for one run: {at:?}"
    );
    let (log_a, log_b) = (a.log(), b.log());
    assert!(
        log_a.contains(skipped) || log_b.contains(skipped),
        "neither node said it skipped a slot:\n{log_a}\n{log_b}"
    );
    a.kill().await;
    b.kill().await;
}

/// The change sequence on PostgreSQL under writers committing at once: a
/// reader following it from its mark, as every node's index sync does,
/// misses no committed change. Many reports (each a new change number)
/// race from several connections while the reader follows; at the end it
/// has read every proxy's last failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_sequence_misses_no_commit_of_concurrent_writers() {
    use proxywarden::model::{Candidate, Hints, SourceScheme};

    let server = pg().await;
    let store = Store::connect(&server.url()).await.unwrap();
    let candidates: Vec<Candidate> = (0..200u32)
        .map(|i| {
            Candidate::new(
                IpAddr::from([10, 9, (i / 250) as u8, (i % 250) as u8 + 1]),
                8080,
                None,
                None,
                SourceScheme::Fixed(proxywarden::proxy::Scheme::Http),
                Hints::default(),
            )
        })
        .collect();
    store
        .record_source_run(
            common::source_run("s", "http://127.0.0.1/x", 1_000),
            candidates,
        )
        .await
        .unwrap();
    let ids = common::ids_of(&store).await;
    let mut mark = store.change_seq().await.unwrap();
    // Writers: four nodes, each reporting failures of every proxy, at
    // increasing times.
    let mut writers = Vec::new();
    for w in 0..4i64 {
        let node = Store::connect(&server.url()).await.unwrap();
        let ids = ids.clone();
        writers.push(tokio::spawn(async move {
            for round in 0..5i64 {
                for id in &ids {
                    let at = 10_000 + round * 10 + w;
                    node.record_report(*id, false, at).await.unwrap();
                }
            }
        }));
    }
    // The reader follows the sequence while they write, and once more
    // after; what it read last of each proxy is the latest failure.
    let mut seen = std::collections::HashMap::new();
    let follow = async |mark: &mut i64, seen: &mut std::collections::HashMap<i64, i64>| loop {
        let (records, next, full) = store.changed_since(*mark, 1_000, Vec::new()).await.unwrap();
        for r in records {
            seen.insert(r.id, r.failed_in_use_at.unwrap());
        }
        *mark = next;
        if !full {
            return;
        }
    };
    while writers.iter().any(|w| !w.is_finished()) {
        follow(&mut mark, &mut seen).await;
    }
    for w in writers {
        w.await.unwrap();
    }
    follow(&mut mark, &mut seen).await;
    let stored = store.proxies_by_ids(ids.clone()).await.unwrap();
    assert_eq!(stored.len(), ids.len());
    for r in stored {
        assert_eq!(
            seen.get(&r.id).copied(),
            r.failed_in_use_at,
            "proxy {}: what the follower read last is what is stored",
            r.id
        );
    }
}

/// A write PostgreSQL refuses (here: the database turned read-only) makes
/// the daemon say it is degraded, naming the store, as a full disk does on
/// SQLite; once writes work again it says so and is healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_postgres_refuses_makes_the_daemon_degraded_until_writes_work() {
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let url = server.url();
    let d = common::daemon::Daemon::start(dir.path(), "", |c| {
        c.set("database", "url", &format!("\"{url}\""))
            .set("gateway", "enabled", "false")
    })
    .await;
    common::until("the daemon answers ok", Duration::from_secs(30), || async {
        d.http
            .get(d.url("/healthz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert_eq!(d.json("/healthz").await.1["status"], "ok");
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // New sessions are read-only; the daemon's are ended, so its pool opens
    // new ones.
    let read_only = |on: bool| {
        format!(
            "ALTER DATABASE postgres SET default_transaction_read_only = {on};
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = 'proxywarden'"
        )
    };
    admin.batch_execute(&read_only(true)).await.unwrap();
    common::until(
        "the daemon says it cannot write the database",
        Duration::from_secs(20),
        || async {
            // A report is a write.
            let _ = d
                .http
                .post(d.url("/proxies/1/report"))
                .header("content-type", "application/json")
                .body(r#"{"ok": false}"#)
                .send()
                .await;
            let (_, health) = d.json("/healthz").await;
            health["status"] == "degraded"
                && health["reasons"][0]["component"] == "store"
                && health["reasons"][0]["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("read-only"))
        },
    )
    .await;
    admin.batch_execute(&read_only(false)).await.unwrap();
    common::until(
        "the daemon is healthy once writes work again",
        Duration::from_secs(30),
        || async { d.json("/healthz").await.1["status"] == "ok" },
    )
    .await;
    d.stop().await;
}

/// Two nodes starting together harvest each source once; the node that
/// claimed a source and is killed with SIGKILL mid-fetch leaves a claim
/// that lapses with its lease, and the other node takes the source over
/// and harvests it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_harvest_claim_of_a_killed_node_lapses_and_another_node_takes_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let proxied = Arc::new(AtomicUsize::new(0));
    let judge = judge(Duration::ZERO, proxied).await;
    let proxies = farm(2).await;
    let list = json_list(&proxies);
    // The first fetch of slow.json never ends; later ones answer.
    let site = Site::start(common::site::SiteOpts::new(move |path, hit| match path {
        "/list.json" => Reply::ok(list.clone()),
        "/slow.json" if hit == 1 => Reply::hang(),
        "/slow.json" => Reply::ok(list.clone()),
        _ => Reply::status(404),
    }))
    .await;
    let base = base(dir.path(), &site.url("/list.json"), &judge, 4, "2s")
        .source("slow", &site.url("/slow.json"), "format = \"json\"")
        .set("harvest", "schedule", "\"0 0 0 1 1 *\"")
        .set("harvest", "timeout", "\"5m\"");
    let url = server.url();
    let (a, b) = tokio::join!(
        Node::start(dir.path(), "a", &url, &base),
        Node::start(dir.path(), "b", &url, &base)
    );
    common::until(
        "both sources are fetched",
        Duration::from_secs(30),
        || async { site.hits("/list.json") >= 1 && site.hits("/slow.json") >= 1 },
    )
    .await;
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let claim = async || -> (String, bool) {
        let row = client
            .query_one(
                "SELECT node, lease_until IS NULL FROM harvest_claims WHERE source = 'slow'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    // The fetched list is stored and its claim ended before the kill: a
    // node killed between the fetch and the store leaves that source to be
    // taken over too, which is right but not what this test counts.
    common::until("the list's claim ends", Duration::from_secs(30), || async {
        client
            .query_one(
                "SELECT lease_until IS NULL FROM harvest_claims WHERE source = 'list'",
                &[],
            )
            .await
            .unwrap()
            .get::<_, bool>(0)
    })
    .await;
    let (holder, done) = claim().await;
    assert!(!done, "the hanging harvest is still running");
    let (dead, survivor) = if holder == "a" { (a, b) } else { (b, a) };
    dead.kill().await;

    common::until(
        "the other node takes the source over and harvests it",
        Duration::from_secs(30),
        || async { claim().await.1 },
    )
    .await;
    let (holder, _) = claim().await;
    let survivor_id = if holder == "a" { "a" } else { "b" };
    assert_eq!(site.hits("/slow.json"), 2, "fetched once more, by one node");
    assert_eq!(
        site.hits("/list.json"),
        1,
        "the other source once in all; survivor's log:\n{}",
        survivor.log()
    );
    let ok: Option<i64> = client
        .query_one("SELECT last_ok_at FROM sources WHERE name = 'slow'", &[])
        .await
        .unwrap()
        .get(0);
    assert!(ok.is_some(), "the source taken over was stored");
    let log = survivor.log();
    assert!(
        log.contains("taking over harvests whose node stopped before they ended")
            && log.contains("slow"),
        "node {survivor_id}:\n{log}"
    );
    survivor.kill().await;
}
