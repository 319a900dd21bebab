//! The whole service, run for tens of seconds the way people run it:
//! `serve` started on a database the CLI just filled, the gateway in front
//! of loopback proxies some of which are flaky or die, a site that bans
//! some proxy addresses and rate-limits every one, many clients. Each test
//! runs long enough (several freshness windows, made short by the config)
//! for what broke after the first seconds to show.

use crate::common;

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use common::daemon::Daemon;
use common::fakes::{Behavior, FakeHttpProxy, HttpProxyOpts, ip};
use common::judges::Judge;
use common::site::{RateLimit, Reply, Site, SiteOpts};
use common::{AliveProxy, TestConfig, store_with_alive};
use tokio::time::Instant;

/// A test that runs the service for `secs` seconds may take this long on a
/// loaded machine before it counts as hung.
fn bound(secs: u64) -> Duration {
    Duration::from_secs(secs * 3 + 60)
}

/// Short re-check cycles, so that the freshness window (two cycles and a
/// check's timeout: 2 × 1 s + 2 s here) passes many times in one test.
fn short_cycles(c: TestConfig) -> TestConfig {
    // Every loopback proxy reaches the daemon's own judge from one /24,
    // which the judge's per-network limit would count as one client.
    c.set("api", "judge_per_minute", "1000000")
        .set("check", "serve_recheck_min", "\"1s\"")
        .set("check", "timeout", "\"2s\"")
        .set("check", "connect_timeout", "\"1s\"")
        .set("gateway", "connect_timeout", "\"1s\"")
        .set("gateway", "timeout", "\"5s\"")
}

/// An HTTP proxy forwarding from 127.0.0.`last`, behaving as `behavior`.
async fn proxy(last: u8, behavior: Behavior) -> FakeHttpProxy {
    FakeHttpProxy::start(HttpProxyOpts {
        connect: true,
        upstream_bind: Some(ip(last)),
        behavior,
        ..HttpProxyOpts::default()
    })
    .await
}

/// A farm as users meet one: `working` proxies that work, `flaky` that
/// reset every other connection, forwarding from 127.0.0.2 up.
async fn farm(working: u8, flaky: u8) -> Vec<FakeHttpProxy> {
    let mut v = Vec::new();
    for last in 2..2 + working {
        v.push(proxy(last, Behavior::Normal).await);
    }
    for last in 2 + working..2 + working + flaky {
        v.push(proxy(last, Behavior::ResetEveryOther).await);
    }
    v
}

/// A site with pages under `/p/…` that bans the addresses in `banned` with
/// a captcha page and lets each address send 2 requests a second.
async fn site(banned: Vec<IpAddr>) -> Site {
    let mut opts = SiteOpts::new(|path, _| Reply::html(format!("<title>{path}</title>page")));
    opts.banned = banned;
    opts.rate_limit = Some(RateLimit {
        max: 2,
        window: Duration::from_secs(1),
        retry_after: 1,
    });
    Site::start(opts).await
}

/// Fills `dir/test.db` as `check --all` leaves it: every proxy alive,
/// checked just now, due again in about ten minutes.
async fn cli_filled(dir: &Path, proxies: &[FakeHttpProxy]) -> Vec<i64> {
    let alive: Vec<AliveProxy> = proxies.iter().map(|p| AliveProxy::new(p.url())).collect();
    let (store, ids) = store_with_alive(&dir.join("test.db"), &alive).await;
    drop(store);
    ids
}

/// A client using the gateway at `gw` as its HTTP proxy.
fn gateway_client(gw: SocketAddr) -> reqwest::Client {
    gateway_client_as(gw, None)
}

/// A client using the gateway at `gw` as its HTTP proxy, with `user` (the
/// controls) as the proxy username when given.
fn gateway_client_as(gw: SocketAddr, user: Option<&str>) -> reqwest::Client {
    let mut proxy = reqwest::Proxy::http(format!("http://{gw}")).unwrap();
    if let Some(user) = user {
        proxy = proxy.basic_auth(user, "");
    }
    common::daemon::proxied_client(proxy)
}

/// Statuses of the answers a client got, and what the 503s said.
#[derive(Default)]
struct Tally {
    ok: usize,
    other: Vec<String>,
}

impl Tally {
    fn total(&self) -> usize {
        self.ok + self.other.len()
    }

    fn share_ok(&self) -> f64 {
        self.ok as f64 / self.total().max(1) as f64
    }

    async fn add(&mut self, resp: reqwest::Result<reqwest::Response>) {
        match resp {
            Ok(r) if r.status() == 200 => self.ok += 1,
            Ok(r) => {
                let status = r.status();
                let body = r.text().await.unwrap_or_default();
                self.other.push(format!("{status} {body}"));
            }
            Err(e) => self.other.push(format!("error: {e}")),
        }
    }

    fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.other.extend(other.other);
    }

    fn summary(&self) -> String {
        let mut firsts = self.other.clone();
        firsts.truncate(5);
        format!(
            "{} of {} answered 200; first others: {firsts:#?}",
            self.ok,
            self.total()
        )
    }
}

/// `n` gateway clients at `gw` at once for `secs` seconds, client k asking
/// for `url(k)`: back to back, or each once every `every` (their starts
/// spread over it). What they got, together.
async fn crowd(
    gw: SocketAddr,
    n: u64,
    secs: u64,
    every: Option<Duration>,
    url: impl Fn(u64) -> String,
) -> Tally {
    let start = Instant::now();
    let end = start + Duration::from_secs(secs);
    let clients: Vec<_> = (0..n)
        .map(|k| {
            let client = gateway_client(gw);
            let url = url(k);
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut tick = every.map(|every| {
                    tokio::time::interval_at(start + every * k as u32 / n as u32, every)
                });
                while Instant::now() < end {
                    if let Some(t) = tick.as_mut() {
                        t.tick().await;
                    }
                    tally.add(client.get(&url).send().await).await;
                }
                tally
            })
        })
        .collect();
    let mut all = Tally::default();
    for c in clients {
        all.merge(c.await.unwrap());
    }
    all
}

/// One gateway client at `gw` sending a request every 250 ms, as a steady
/// scraper does, for `secs` seconds: the n-th for `url(n)`.
async fn steady(gw: SocketAddr, secs: u64, url: impl Fn(u64) -> String) -> Tally {
    crowd(gw, 1, secs, Some(Duration::from_millis(250)), url).await
}

/// Posts a crawl job of `site` from `/` with `options` (JSON members) and
/// returns its id.
async fn start_crawl(daemon: &Daemon, site: &Site, options: &str) -> i64 {
    let resp = daemon
        .req(reqwest::Method::POST, "/crawls")
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"seeds": ["{}"], "max_pages": 5000, {options}}}"#,
            site.url("/")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let job: serde_json::Value = resp.json().await.unwrap();
    job["id"].as_i64().unwrap()
}

/// The pages crawl job `id` has fetched so far, and its view.
async fn crawled(daemon: &Daemon, id: i64) -> (u64, serde_json::Value) {
    let (_, job) = daemon.json(&format!("/crawls/{id}")).await;
    (job["progress"]["pages"].as_u64().unwrap_or(0), job)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_keeps_serving_after_a_start_on_a_cli_filled_database() {
    const SECS: u64 = 20;
    tokio::time::timeout(bound(SECS), async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = farm(12, 3).await;
        // Two of the fifteen addresses are banned by the site.
        let site = site(vec![ip(3), ip(9)]).await;
        cli_filled(dir.path(), &proxies).await;
        let (daemon, gw) =
            Daemon::start_with_gateway(dir.path(), "", |c| short_cycles(c.db("test.db"))).await;
        let tally = steady(gw, SECS, |n| site.url(&format!("/p/{n}"))).await;
        assert!(tally.share_ok() >= 0.99, "{}", tally.summary());
        // Then sixteen clients at once, each a request every two seconds,
        // their starts spread: 8 requests a second, more than one address
        // may send (the site's limit), well within what the thirteen
        // addresses it does not ban may send together.
        let every = Some(Duration::from_secs(2));
        let all = crowd(gw, 16, SECS / 2, every, |k| site.url(&format!("/c{k}"))).await;
        assert!(all.share_ok() >= 0.99, "{}", all.summary());
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_requests_wait_their_turn_when_every_proxy_is_at_its_cap() {
    const SECS: u64 = 10;
    tokio::time::timeout(bound(SECS), async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = farm(6, 0).await;
        // Pages take a while, so that the sixteen clients keep all twelve
        // slots (six proxies, two each) busy.
        let mut opts = SiteOpts::new(|path, _| Reply::html(format!("<title>{path}</title>")));
        opts.latency = Duration::from_millis(150);
        let site = Site::start(opts).await;
        cli_filled(dir.path(), &proxies).await;
        // A request that waits for a slot waits as long as it takes, so
        // one that should fail at once and waits instead fails the test.
        let (daemon, gw) = Daemon::start_with_gateway(dir.path(), "", |c| {
            short_cycles(c.db("test.db"))
                .set("pool", "max_per_proxy", "2")
                .set("gateway", "queue_wait", "\"1h\"")
        })
        .await;
        let all = crowd(gw, 16, SECS, None, |k| site.url(&format!("/c{k}"))).await;
        assert!(all.total() > 100, "{}", all.summary());
        assert!(all.share_ok() >= 0.99, "{}", all.summary());
        assert!(
            site.max_in_flight_per_peer() <= 2,
            "a proxy carried more than its cap"
        );
        // A request no proxy can take at all is not kept waiting, and the
        // answer says why.
        let resp = gateway_client_as(gw, Some("country-xx"))
            .get(site.url("/none"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 503);
        let body = resp.text().await.unwrap();
        assert!(
            body.contains("no servable proxy matches the filters"),
            "{body}"
        );
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}

/// Asks `GET /proxy?format=text` from `clients` clients at once for
/// `secs` seconds; every answer, and the statuses that were not 200.
async fn proxy_answers(daemon: &Daemon, clients: usize, secs: u64) -> (Vec<String>, Vec<u16>) {
    let end = Instant::now() + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let http = daemon.http.clone();
            let url = daemon.url("/proxy?format=text");
            tokio::spawn(async move {
                let (mut answers, mut others) = (Vec::new(), Vec::new());
                while Instant::now() < end {
                    let resp = http.get(&url).send().await.unwrap();
                    match resp.status().as_u16() {
                        200 => answers.push(resp.text().await.unwrap()),
                        s => others.push(s),
                    }
                    // About 50 answers a second from each client.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                (answers, others)
            })
        })
        .collect();
    let (mut answers, mut others) = (Vec::new(), Vec::new());
    for t in tasks {
        let (a, o) = t.await.unwrap();
        answers.extend(a);
        others.extend(o);
    }
    (answers, others)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_loaded_at_start_are_as_fresh_as_those_checked_since() {
    const SECS: u64 = 20;
    tokio::time::timeout(bound(SECS), async {
        let dir = tempfile::tempdir().unwrap();
        let mut proxies = farm(40, 0).await;
        cli_filled(dir.path(), &proxies).await;
        // The default re-check cycle (10 s at least): start-up must not
        // lean on a cycle short enough to hide what it serves unchecked.
        let daemon = Daemon::start(dir.path(), "", |c| {
            c.db("test.db")
                .set("api", "judge_per_minute", "1000000")
                .set("check", "timeout", "\"2s\"")
                .set("check", "connect_timeout", "\"1s\"")
        })
        .await;
        // 30% of them die the moment the daemon starts.
        let dead: Vec<String> = proxies.drain(..12).map(|p| p.url()).collect();
        let (answers, others) = proxy_answers(&daemon, 4, SECS).await;
        let served_dead = answers.iter().filter(|a| dead.contains(a)).count();
        assert!(
            answers.len() > 500,
            "{} answers, others {others:?}",
            answers.len()
        );
        assert!(
            served_dead * 100 <= answers.len(),
            "{served_dead} of {} answers named a dead proxy",
            answers.len()
        );
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}

/// Polls `check` every 50 ms until it holds; false after `within`.
async fn eventually<F, Fut>(within: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + within;
    while Instant::now() < end {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_outage_keeps_what_works_served_and_says_so() {
    const SECS: u64 = 15;
    tokio::time::timeout(bound(SECS + 20), async {
        let dir = tempfile::tempdir().unwrap();
        let judge = Judge::plain().await;
        let judge_url = judge.url();
        let judges = format!(
            "[{{ url = \"{}\", marker = \"proxywarden-judge\" }}]",
            judge_url
        );
        let proxies = farm(12, 0).await;
        let site = site(Vec::new()).await;
        cli_filled(dir.path(), &proxies).await;
        let (daemon, gw) = Daemon::start_with_gateway(dir.path(), "", |c| {
            short_cycles(c.db("test.db")).judges(&judges)
        })
        .await;
        assert!(
            eventually(Duration::from_secs(20), || async {
                !daemon.json("/stats").await.1["last_check"].is_null()
            })
            .await,
            "no check round finished"
        );
        // Every judge goes away (connections refused), for longer than
        // many freshness windows.
        let judge_addr = judge.addr;
        drop(judge);
        let tally = steady(gw, SECS, |n| site.url(&format!("/p/{n}"))).await;
        assert!(tally.share_ok() >= 0.99, "{}", tally.summary());
        let (status, health) = daemon.json("/healthz").await;
        assert_eq!(status, 200);
        assert_eq!(health["status"], "degraded", "{health}");
        assert_eq!(health["reasons"][0]["component"], "judges", "{health}");
        assert!(health["reasons"][0]["since"].is_string(), "{health}");

        // Every view counts what can be served alike: all twelve passed a
        // check within api.max_age, and the proxies the gateway used
        // carried requests since.
        let (_, stats) = daemon.json("/stats").await;
        assert_eq!(stats["servable"], 12, "{stats}");
        let (_, one) = daemon.json("/proxy").await;
        assert!(one["url"].is_string(), "{one}");
        let export = daemon.get("/export").await.text().await.unwrap();
        assert_eq!(export.lines().count(), 12, "{export}");
        let metrics = daemon.get("/metrics").await.text().await.unwrap();
        assert!(
            metrics.contains("proxywarden_servable_proxies 12"),
            "{metrics}"
        );
        let judge_up = format!("proxywarden_judge_up{{judge=\"{judge_url}\"}} 0");
        assert!(
            metrics.contains(&judge_up),
            "{judge_up} missing from\n{metrics}"
        );
        let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .args(["export", "-c"])
            .arg(TestConfig::new(dir.path()).db("test.db").write())
            .env_remove("RUST_LOG")
            .output()
            .await
            .unwrap();
        assert!(cli.status.success(), "{cli:?}");
        assert_eq!(String::from_utf8_lossy(&cli.stdout).lines().count(), 12);

        // The judge answers again: the daemon says so and checks again.
        let _judge = Judge::plain_at(judge_addr).await;
        assert!(
            eventually(Duration::from_secs(40), || async {
                daemon.json("/healthz").await.1["status"] == "ok"
            })
            .await,
            "still degraded after the judge came back"
        );
        let metrics = daemon.get("/metrics").await.text().await.unwrap();
        let judge_up = format!("proxywarden_judge_up{{judge=\"{judge_url}\"}} 1");
        assert!(
            metrics.contains(&judge_up),
            "{judge_up} missing from\n{metrics}"
        );
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_job_and_gateway_clients_on_the_same_proxies_both_make_progress() {
    const SECS: u64 = 20;
    tokio::time::timeout(bound(SECS), async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = farm(12, 3).await;
        let mut opts = SiteOpts::new(|path, _| common::site::tree_page(path, 5_000, 4));
        opts.banned = vec![ip(5)];
        opts.rate_limit = Some(RateLimit {
            max: 2,
            window: Duration::from_secs(1),
            retry_after: 1,
        });
        let site = Site::start(opts).await;
        cli_filled(dir.path(), &proxies).await;
        let (daemon, gw) =
            Daemon::start_with_gateway(dir.path(), "", |c| short_cycles(c.db("test.db"))).await;
        let id = start_crawl(&daemon, &site, r#""delay": "200ms", "ignore_robots": true"#).await;
        // One gateway client at 4 requests a second on the same site; the
        // crawl's pages are counted halfway and at the end.
        let gateway = steady(gw, SECS, |n| site.url(&format!("/p/{}", 4_000 + n)));
        let halfway = async {
            tokio::time::sleep(Duration::from_secs(SECS / 2)).await;
            crawled(&daemon, id).await.0
        };
        let (tally, halfway) = tokio::join!(gateway, halfway);
        let (end, job) = crawled(&daemon, id).await;
        assert!(tally.share_ok() >= 0.99, "{}", tally.summary());
        // The crawl goes on through the second half too, at its pace (a
        // page every 200 ms at most).
        assert!(
            end >= halfway + 10,
            "the crawl stalled: {halfway} pages at half time, {end} at the end: {job}"
        );
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_and_a_crawl_job_share_one_cap_per_proxy() {
    const SECS: u64 = 10;
    tokio::time::timeout(bound(SECS), async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = farm(6, 0).await;
        // Slow pages keep every slot busy.
        let mut opts = SiteOpts::new(|path, _| common::site::tree_page(path, 5_000, 4));
        opts.latency = Duration::from_millis(400);
        let site = Site::start(opts).await;
        cli_filled(dir.path(), &proxies).await;
        let (daemon, gw) = Daemon::start_with_gateway(dir.path(), "", |c| {
            short_cycles(c.db("test.db")).set("pool", "max_per_proxy", "2")
        })
        .await;
        let options = r#""delay": "0s", "ignore_robots": true, "per_host_concurrency": 8"#;
        let id = start_crawl(&daemon, &site, options).await;
        let all = crowd(gw, 16, SECS, None, |k| {
            site.url(&format!("/p/{}", 4_000 + k))
        })
        .await;
        let (pages, job) = crawled(&daemon, id).await;
        assert!(
            site.max_in_flight_per_peer() <= 2,
            "one proxy carried {} requests at once",
            site.max_in_flight_per_peer()
        );
        // Both got their turns: twelve slots, a page every 400 ms each.
        assert!(all.ok >= 20, "{}", all.summary());
        assert!(all.share_ok() >= 0.99, "{}", all.summary());
        assert!(pages >= 10, "the crawl job got {pages} pages: {job}");
        daemon.stop().await;
    })
    .await
    .expect("the test ran past its bound");
}
