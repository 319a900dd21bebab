//! `cargo bench --bench nodes_crawl`: a crawl job taken over across nodes.
//!
//! Two `serve` processes (the built binary) on one real PostgreSQL server
//! (started here, as the tests start it). A crawl job of 200 pages whose
//! robots.txt asks for a Crawl-delay of 0.1 s is posted to node A; node B
//! starts once A crawls; A is killed with `kill -9` 6 s after the post.
//! Targets: B finishes the job, every page fetched, at most 4 pages
//! fetched twice, and no two requests to the site closer than the delay
//! (the smallest gap is printed beside it). Figures are printed next to
//! their targets, not asserted. The site and the proxies run in a child
//! (`--serve-farm`) that reports, when its stdin closes, every request the
//! site saw.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::fakes::{FakeHttpProxy, HttpProxyOpts};
use common::node::Node;
use common::postgres::PgServer;
use common::site::{Reply, Site, SiteOpts, tree_page};
use common::{AliveProxy, put_alive, until};
use proxywarden::store::Store;

const FARM_ARG: &str = "--serve-farm";
/// Pages of the site.
const PAGES: usize = 200;
/// Its robots.txt's Crawl-delay.
const CRAWL_DELAY: Duration = Duration::from_millis(100);
/// Working proxies.
const PROXIES: usize = 8;
/// When node A is killed, after the job's post.
const KILL_AFTER: Duration = Duration::from_secs(6);

fn main() {
    if std::env::args().any(|a| a == FARM_ARG) {
        serve_farm();
        return;
    }
    measure();
}

/// Proxy `i`'s outgoing address.
fn upstream_ip(i: usize) -> IpAddr {
    IpAddr::from([127, 1, 0, 2 + i as u8])
}

fn serve_farm() {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        let mut opts = SiteOpts::new(|p, _| tree_page(p, PAGES, 4));
        opts.robots = Some(Reply::text(format!(
            "User-agent: *\nCrawl-delay: {}\n",
            CRAWL_DELAY.as_secs_f64()
        )));
        let site = Site::start(opts).await;
        let mut proxies = Vec::new();
        for i in 0..PROXIES {
            proxies.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    connect: true,
                    upstream_bind: Some(upstream_ip(i)),
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "site {}", site.url("/")).unwrap();
            for p in &proxies {
                writeln!(out, "proxy {}", p.url()).unwrap();
            }
            writeln!(out, "ready").unwrap();
            out.flush().unwrap();
        }
        let started = Instant::now();
        let mut line = String::new();
        // "kill": the measuring process killed node A now.
        let mut killed_at = None;
        let stdin = std::io::stdin();
        while stdin.lock().read_line(&mut line).unwrap_or(0) > 0 {
            if line.trim() == "kill" {
                killed_at = Some(started.elapsed());
            }
            line.clear();
        }
        let log = site.log();
        let mut out = std::io::stdout().lock();
        for h in &log {
            let at = h.at.saturating_duration_since(started);
            let after_kill = killed_at.is_some_and(|k| at >= k);
            writeln!(out, "hit {} {} {}", at.as_micros(), after_kill, h.path).unwrap();
        }
        writeln!(out, "end").unwrap();
        out.flush().unwrap();
        drop(proxies);
    });
    rt.shutdown_background();
}

fn measure() {
    let exe = std::env::current_exe().expect("current exe");
    let mut farm = Command::new(exe)
        .arg(FARM_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the farm");
    let mut lines = BufReader::new(farm.stdout.take().unwrap()).lines();
    let mut site = String::new();
    let mut proxies = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("farm output");
        match line.split_once(' ') {
            Some(("site", u)) => site = u.to_owned(),
            Some(("proxy", u)) => proxies.push(u.to_owned()),
            _ if line == "ready" => break,
            _ => {}
        }
    }
    let mut farm_in = farm.stdin.take().unwrap();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().unwrap();
    let (posted_to_end, kill_to_end) = rt.block_on(async {
        let pg = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
        let alive: Vec<AliveProxy> = proxies.iter().map(|u| AliveProxy::new(u.clone())).collect();
        put_alive(&Store::connect(&pg.url()).await.unwrap(), &alive).await;
        let a = Node::start(&dir.path().join("a"), &pg.url(), bin).await;
        let (status, job) = a
            .post_crawl(format!(
                r#"{{"seeds": ["{site}"], "per_host_concurrency": 2, "max_pages": {PAGES}}}"#
            ))
            .await;
        assert_eq!(status, 201, "{job}");
        let posted = Instant::now();
        let id = job["id"].as_i64().unwrap();
        until("node a crawls", Duration::from_secs(30), || async {
            a.json(&format!("/crawls/{id}")).await.1["progress"]["pages"]
                .as_u64()
                .unwrap_or(0)
                > 0
        })
        .await;
        let b = Node::start(&dir.path().join("b"), &pg.url(), bin).await;
        tokio::time::sleep_until((posted + KILL_AFTER).into()).await;
        a.kill().await;
        writeln!(farm_in, "kill").unwrap();
        let killed = Instant::now();
        until(
            "node b finishes the job",
            Duration::from_secs(300),
            || async { b.state(id).await == "finished" },
        )
        .await;
        let (_, view) = b.json(&format!("/crawls/{id}")).await;
        println!("job as node b shows it: {}", view["summary"]);
        (posted.elapsed(), killed.elapsed())
    });
    drop(farm_in);
    let mut hits: Vec<(Duration, bool, String)> = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("farm output");
        if line == "end" {
            break;
        }
        let mut parts = line.splitn(4, ' ');
        if parts.next() != Some("hit") {
            continue;
        }
        let us: u64 = parts.next().unwrap().parse().unwrap();
        let after: bool = parts.next().unwrap().parse().unwrap();
        hits.push((
            Duration::from_micros(us),
            after,
            parts.next().unwrap().to_owned(),
        ));
    }
    let _ = farm.wait();
    let mut per_path: HashMap<&str, usize> = HashMap::new();
    for (_, _, p) in &hits {
        *per_path.entry(p.as_str()).or_default() += 1;
    }
    let pages = per_path.keys().filter(|p| **p != "/robots.txt").count();
    let twice: usize = per_path
        .iter()
        .filter(|(p, _)| **p != "/robots.txt")
        .map(|(_, n)| n - 1)
        .sum();
    let by_a = hits.iter().filter(|h| !h.1).count();
    let by_b = hits.len() - by_a;
    let smallest = hits
        .windows(2)
        .map(|w| w[1].0 - w[0].0)
        .min()
        .unwrap_or_default();
    let gaps: Vec<Duration> = hits.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let short = gaps
        .iter()
        .filter(|g| **g < CRAWL_DELAY.mul_f64(0.9))
        .count();
    let mean_gap = match (hits.first(), hits.last()) {
        (Some(f), Some(l)) if hits.len() > 1 => (l.0 - f.0) / (hits.len() as u32 - 1),
        _ => Duration::ZERO,
    };
    // The most requests any 1 s window held: the delay allows 1 s / delay
    // (+1 for the request that opens the window).
    let mut max_1s = 0;
    let mut j = 0;
    for i in 0..hits.len() {
        while hits[i].0 - hits[j].0 >= Duration::from_secs(1) {
            j += 1;
        }
        max_1s = max_1s.max(i - j + 1);
    }
    let last_a = hits.iter().filter(|h| !h.1).map(|h| h.0).max();
    let first_b = hits.iter().filter(|h| h.1).map(|h| h.0).min();
    let handover = match (last_a, first_b) {
        (Some(a), Some(b)) => format!("{:.1} s", (b - a).as_secs_f64()),
        _ => "n/a".into(),
    };
    println!(
        "requests {} (node a {by_a}, node b {by_b}); pages {pages} of {PAGES}; robots.txt {}",
        hits.len(),
        per_path.get("/robots.txt").copied().unwrap_or(0)
    );
    println!("pages fetched twice: {twice} (target <= 4)");
    println!(
        "smallest gap between two requests: {:.1} ms (Crawl-delay {} ms)",
        smallest.as_secs_f64() * 1000.0,
        CRAWL_DELAY.as_millis()
    );
    println!(
        "gaps under 90% of the delay: {short} of {}; mean gap {:.1} ms (node b's handover wait included); \
         most requests in any 1 s: {max_1s} (the delay allows {})",
        gaps.len(),
        mean_gap.as_secs_f64() * 1000.0,
        (Duration::from_secs(1).as_micros() / CRAWL_DELAY.as_micros()) + 1
    );
    println!("node a's last request to node b's first: {handover}");
    println!(
        "post to finished {:.1} s; kill to finished {:.1} s",
        posted_to_end.as_secs_f64(),
        kill_to_end.as_secs_f64()
    );
}
