//! `cargo bench --bench crawl_bounds`: what a hostile site can cost a
//! `serve` process (the built binary) crawling it as a job.
//!
//! - `memory`: a job on 8 flat pages of 10 MiB of `<br>` at concurrency 8
//!   (and 8 per host). Targets: `serve`'s peak RSS (VmHWM) under 512 MiB,
//!   and its RSS back within 200 MiB of where it started within a minute
//!   after the job ended.
//! - `disk`: a job on a link farm (every page links 10,000 new same-host
//!   URLs) for 25 s (`CRAWL_BOUNDS_FARM_SECS`), then `DELETE`. Targets: the
//!   database and its log grow by at most 256 MB, and the job's frontier is
//!   gone after the `DELETE`. A build slower than release needs longer to
//!   fill the job's frontier (250,000 URLs: 250 pages).
//!
//! The site and its proxies run in a child (`--serve-farm PASS`), so their
//! memory is not `serve`'s; figures are printed next to their targets, not
//! asserted. `CRAWL_BOUNDS_PASS` picks one pass (default both);
//! `CRAWL_BOUNDS_BIN` runs another `proxywarden` binary as `serve` (an
//! older build, to compare).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::fakes::{FakeHttpProxy, HttpProxyOpts};
use common::site::{Reply, Site, SiteOpts};
use common::{AliveProxy, TestConfig, store_with_alive};

const FARM_ARG: &str = "--serve-farm";
/// Working proxies of the farm.
const PROXIES: usize = 8;
/// Flat pages of the `memory` pass.
const FLAT_PAGES: usize = 8;
/// Their size: just under the pool's 10 MiB body cap.
const FLAT_BYTES: usize = 10 * 1024 * 1024 - 4096;
/// Links per page of the `disk` pass.
const FARM_LINKS: usize = 10_000;
/// How long the `disk` pass crawls before its `DELETE`, by default.
const FARM_TIME: Duration = Duration::from_secs(25);

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        serve_farm(args.get(i + 1).map(String::as_str).unwrap_or_default());
        return;
    }
    let only = std::env::var("CRAWL_BOUNDS_PASS").ok();
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    for pass in ["memory", "disk"] {
        if only.as_deref().is_some_and(|o| o != pass) {
            continue;
        }
        if let Err(e) = rt.block_on(measure(pass)) {
            eprintln!("[{pass}] failed: {e:#}");
        }
    }
}

/// The site of `pass` and its proxies; prints where they listen, then
/// serves until stdin closes.
fn serve_farm(pass: &str) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        let opts = match pass {
            "memory" => {
                let flat = Reply::html("<br>".repeat(FLAT_BYTES / 4));
                SiteOpts::new(move |path, _| match path {
                    "/" => Reply::html(
                        (1..=FLAT_PAGES)
                            .map(|i| format!("<a href=\"/flat/{i}\">{i}</a>"))
                            .collect::<String>(),
                    ),
                    _ => flat.clone(),
                })
            }
            _ => SiteOpts::new(|path, _| {
                let base = path.trim_end_matches('/');
                let links: String = (0..FARM_LINKS)
                    .map(|i| format!("<a href=\"{base}/{i}\">{i}</a>"))
                    .collect();
                Reply::html(links)
            }),
        };
        let site = Site::start(opts).await;
        let mut proxies = Vec::new();
        for _ in 0..PROXIES {
            proxies.push(FakeHttpProxy::start(HttpProxyOpts::default()).await);
        }
        println!("site {}", site.url("/"));
        for p in &proxies {
            println!("proxy {}", p.url());
        }
        println!("ready");
        let _ = tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).unwrap_or(0) > 0 {}
        })
        .await;
    });
    rt.shutdown_background();
}

/// `serve`'s RSS (`field` `VmRSS:` or `VmHWM:`) in MiB.
fn rss_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// The database and its log, in MB.
fn db_mb(db: &Path) -> f64 {
    ["", "-wal", "-shm"]
        .iter()
        .map(|s| {
            let mut p = db.as_os_str().to_owned();
            p.push(s);
            std::fs::metadata(p).map_or(0, |m| m.len())
        })
        .sum::<u64>() as f64
        / 1e6
}

async fn measure(pass: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let (_farm, _stdin, mut lines) = common::binary::spawn_role(&[FARM_ARG, pass])?;
    let mut site = String::new();
    let mut proxies = Vec::new();
    while let Some(line) = lines.next_line().await? {
        match line.split_once(' ') {
            Some(("site", u)) => site = u.to_owned(),
            Some(("proxy", u)) => proxies.push(AliveProxy::new(u)),
            _ if line == "ready" => break,
            _ => {}
        }
    }
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("test.db");
    drop(store_with_alive(&db, &proxies).await);
    let port = common::free_port();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "")?;
    let config = TestConfig::new(dir.path())
        .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
        .set("gateway", "listen", "\"127.0.0.1:0\"")
        .set("harvest", "schedule", "\"0 0 0 1 1 *\"")
        .set("check", "https", "false")
        .set("crawls", "max_running", "1")
        .judges(&format!(
            "[{{ url = \"http://127.0.0.1:{port}/judge\", marker = \"proxywarden-judge\" }}]"
        ))
        .source("empty", &empty.display().to_string(), "")
        .write();
    let bin = std::env::var("CRAWL_BOUNDS_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_proxywarden").to_owned());
    let bin = bin.as_str();
    let (mut serve, pid) =
        common::binary::spawn_serve(bin, &config, &dir.path().join("serve.log"))?;
    common::binary::wait_healthy(
        &mut serve,
        format!("127.0.0.1:{port}"),
        Duration::from_secs(60),
    )
    .await?;
    let http = common::daemon::client(Duration::from_secs(60));
    let api = |p: &str| format!("http://127.0.0.1:{port}{p}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let start_rss = rss_mib(pid, "VmRSS:");
    let start_db = db_mb(&db);
    let body = match pass {
        "memory" => format!(
            r#"{{"seeds": ["{site}"], "concurrency": 8, "per_host_concurrency": 8, "max_pages": {}}}"#,
            FLAT_PAGES + 1
        ),
        _ => format!(r#"{{"seeds": ["{site}"], "per_host_concurrency": 16}}"#),
    };
    let job: serde_json::Value = http
        .post(api("/crawls"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?
        .json()
        .await?;
    let id = job["id"].as_i64().context("a job id")?;
    let posted = Instant::now();
    let farm_time = std::env::var("CRAWL_BOUNDS_FARM_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(FARM_TIME, Duration::from_secs);
    let mut peak_db: f64 = start_db;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        peak_db = peak_db.max(db_mb(&db));
        let view: serde_json::Value = http
            .get(api(&format!("/crawls/{id}")))
            .send()
            .await?
            .json()
            .await?;
        let state = view["state"].as_str().unwrap_or_default().to_owned();
        if pass == "disk" && posted.elapsed() >= farm_time {
            let view: serde_json::Value = http
                .delete(api(&format!("/crawls/{id}")))
                .send()
                .await?
                .json()
                .await?;
            println!("[disk] summary after {farm_time:?}: {}", view["summary"]);
            break;
        }
        if pass == "memory" && !matches!(state.as_str(), "queued" | "running") {
            println!(
                "[memory] job {state} in {:.1}s: {}",
                posted.elapsed().as_secs_f64(),
                view["summary"]
            );
            break;
        }
        anyhow::ensure!(
            posted.elapsed() < Duration::from_secs(600),
            "job still {state}"
        );
    }
    let ended = Instant::now();
    match pass {
        "memory" => {
            let peak = rss_mib(pid, "VmHWM:");
            let mut after = rss_mib(pid, "VmRSS:");
            let mut back_in = None;
            while ended.elapsed() < Duration::from_secs(60) {
                after = rss_mib(pid, "VmRSS:");
                if back_in.is_none() && after <= start_rss + 200.0 {
                    back_in = Some(ended.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            println!(
                "[memory] serve RSS before the job {start_rss:.0} MiB; peak (VmHWM) {peak:.0} MiB \
                 (target < 512 MiB); a minute after the job {after:.0} MiB, {:.0} MiB above the start \
                 (target <= 200 MiB); back within 200 MiB after {}",
                after - start_rss,
                back_in.map_or("never".into(), |d| format!("{:.1}s", d.as_secs_f64()))
            );
        }
        _ => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let rows: i64 = rusqlite::Connection::open(&db)?.query_row(
                "SELECT count(*) FROM crawl_urls WHERE job = ?1",
                [id],
                |r| r.get(0),
            )?;
            println!(
                "[disk] database + log {start_db:.1} MB before; at most {peak_db:.1} MB while it ran \
                 (+{:.1} MB; target <= 256 MB); {:.1} MB after the DELETE; the job's frontier rows \
                 after it: {rows} (target 0)",
                peak_db - start_db,
                db_mb(&db)
            );
        }
    }
    serve.start_kill()?;
    let _ = serve.wait().await;
    Ok(())
}
