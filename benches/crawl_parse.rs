//! `cargo bench --bench crawl_parse`: does a crawl job parsing hostile pages
//! keep the daemon responsive (issue 21, Must 5)? `proxywarden serve`, run
//! as a user runs it (`harvest`, `check --all`, then `serve` on the
//! database they filled), crawls through 8 loopback proxies a site whose
//! pages are 4 MB each: links, 3.5 MB of paragraphs, then 100,000 nested
//! elements. Meanwhile `GET /healthz` is asked every 20 ms on one kept
//! connection, each latency counted from when its probe was due (so a
//! stall counts for every probe it held back). It prints the job's end and pages, its wall time, the
//! daemon's CPU, and the `/healthz` latency (p50, p99, max), and judges:
//!
//! - `/healthz` p99 < 100 ms while the job runs;
//! - the job finishes, with every page fetched;
//!
//! exiting 1 if either fails. `CRAWL_PARSE_PAGES=N` sets the number of
//! pages (200). The bench binary plays two roles: without arguments it
//! measures; with `--serve-farm` it is the child holding the judge, the
//! site and the proxies (so their CPU is not the daemon's), which exits
//! when its stdin closes. Files are kept in `target/tmp/crawl_parse/`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use common::daemon::client;
use common::fakes::{FakeHttpProxy, HttpProxyOpts, raise_nofile_limit};
use common::judges::Judge;
use common::site::{Reply, Site, SiteOpts};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const FARM_ARG: &str = "--serve-farm";
const PROXIES: usize = 8;
/// Nested elements at the end of every page.
const NESTED: usize = 100_000;
/// Bytes of paragraphs before them.
const FLAT: usize = 3_500_000;
const HEALTHZ_EVERY: Duration = Duration::from_millis(20);
const P99_TARGET: Duration = Duration::from_millis(100);
/// The job must end within this.
const JOB_LIMIT: Duration = Duration::from_secs(300);

fn pages() -> usize {
    std::env::var("CRAWL_PARSE_PAGES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == FARM_ARG) {
        serve_farm();
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(measure()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("crawl_parse: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Page `i` of `n`: the root links to every other page.
fn heavy_page(i: usize, n: usize) -> String {
    let mut s = String::with_capacity(FLAT + NESTED * 5 + 4096);
    s.push_str(&format!(
        "<html><head><title>Heavy {i}</title></head><body>"
    ));
    if i == 0 {
        for j in 1..n {
            s.push_str(&format!("<a href=\"/p/{j}\">page {j}</a>\n"));
        }
    }
    while s.len() < FLAT {
        s.push_str("<p>Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do.</p>\n");
    }
    s.push_str(&"<div>".repeat(NESTED));
    s.push_str("</body></html>");
    s
}

// ---------------------------------------------------------------------------
// The child: judge, site, proxies

fn serve_farm() {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        let judge = Judge::plain().await;
        let n = pages();
        // The root and one page every other path shares: little memory
        // for any number of pages.
        let (root, other) = (Reply::html(heavy_page(0, n)), Reply::html(heavy_page(1, n)));
        let site = Site::start(SiteOpts::new(move |path, _| {
            let i = match path {
                "/" => Some(0),
                p => p.strip_prefix("/p/").and_then(|i| i.parse::<usize>().ok()),
            };
            match i {
                Some(0) => root.clone(),
                Some(i) if i < n => other.clone(),
                _ => Reply::status(404),
            }
        }))
        .await;
        let mut proxies = Vec::new();
        for _ in 0..PROXIES {
            proxies.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    keep_alive: true,
                    reuse_site: true,
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "judge {}", judge.url()).expect("write to the parent");
            writeln!(out, "site {}", site.addr).expect("write to the parent");
            for p in &proxies {
                writeln!(out, "proxy {}", p.addr()).expect("write to the parent");
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(_)) = lines.next_line().await {}
        drop(proxies);
        drop(site);
        drop(judge);
    });
    rt.shutdown_background();
}

// ---------------------------------------------------------------------------
// The parent: the daemon, the job, the prober

/// A free port on 127.0.0.1 (bound, then released for the daemon).
fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn cli(bin: &str, config: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = common::binary::run(bin, config, args).await?;
    anyhow::ensure!(
        out.status.success(),
        "proxywarden {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn measure() -> anyhow::Result<bool> {
    raise_nofile_limit();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("crawl_parse");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    let (_farm, _farm_stdin, mut lines) = common::binary::spawn_role(&[FARM_ARG])?;
    let (mut judge, mut site, mut proxies) = (None, None, Vec::new());
    loop {
        let line = lines.next_line().await?.context("the farm exited")?;
        match line.split_once(' ') {
            Some(("judge", url)) => judge = Some(url.to_owned()),
            Some(("site", addr)) => site = Some(addr.parse::<SocketAddr>()?),
            Some(("proxy", addr)) => proxies.push(addr.to_owned()),
            _ if line == "ready" => break,
            _ => anyhow::bail!("unexpected farm line {line:?}"),
        }
    }
    let judge = judge.context("the farm named no judge")?;
    let site = site.context("the farm named no site")?;

    let list = dir.join("proxies.txt");
    std::fs::write(&list, proxies.join("\n") + "\n")?;
    let api = free_port()?;
    let gateway = free_port()?;
    let config = dir.join("proxywarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\npath = \"{db}\"\n\n\
             [harvest]\nallow_private_addresses = true\n\n\
             [check]\njudges = [{{ url = \"{judge}\", marker = \"proxywarden-judge\" }}]\n\
             https = false\n\n\
             [api]\nlisten = \"{api}\"\n\n\
             [gateway]\nlisten = \"{gateway}\"\n\n\
             [[sources]]\nname = \"farm\"\nurl = \"{list}\"\nformat = \"text\"\nscheme = \"http\"\n",
            db = dir.join("bench.db").display(),
            list = list.display(),
        ),
    )?;
    cli(bin, &config, &["harvest"]).await?;
    cli(bin, &config, &["check", "--all"]).await?;

    let (mut daemon, pid) = common::binary::spawn_serve(bin, &config, &dir.join("daemon.log"))?;
    common::binary::wait_healthy(&mut daemon, api, Duration::from_secs(30))
        .await
        .with_context(|| format!("see {}", dir.display()))?;
    let http = client(Duration::from_secs(30));

    let n = pages();
    let created = http
        .post(format!("http://{api}/crawls"))
        .json(&serde_json::json!({
            "seeds": [format!("http://{site}/")],
            "max_pages": n,
        }))
        .send()
        .await?;
    anyhow::ensure!(
        created.status().is_success(),
        "POST /crawls: {}",
        created.text().await?
    );
    let job: serde_json::Value = created.json().await?;
    let id = job["id"].as_i64().context("the job's id")?;
    let started = Instant::now();
    let cpu0 = common::cpu_seconds(pid);

    // The prober: one kept connection, as a monitoring agent asks, every
    // 20 ms on a fixed schedule. Each answer's latency counts from when
    // its probe was due, so a stall counts for every probe it held back,
    // not once.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = {
        let stop = stop.clone();
        let http = client(Duration::from_secs(120));
        tokio::spawn(async move {
            let mut took = Vec::new();
            let first = tokio::time::Instant::now();
            let mut k = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let due = first + HEALTHZ_EVERY * k;
                k += 1;
                tokio::time::sleep_until(due).await;
                let ok = http
                    .get(format!("http://{api}/healthz"))
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success());
                took.push((due.elapsed(), ok));
            }
            took
        })
    };

    let mut view = serde_json::Value::Null;
    while started.elapsed() < JOB_LIMIT {
        tokio::time::sleep(Duration::from_millis(250)).await;
        // A daemon too busy to answer within the client's timeout is what
        // the prober measures; the poll just asks again.
        match http.get(format!("http://{api}/crawls/{id}")).send().await {
            Ok(r) => view = r.json().await?,
            Err(e) => println!("  GET /crawls/{id}: {e}"),
        }
        if matches!(
            view["state"].as_str(),
            Some("finished" | "failed" | "cancelled")
        ) {
            break;
        }
    }
    let wall = started.elapsed();
    let cpu = common::cpu_seconds(pid) - cpu0;
    stop.store(true, Ordering::Relaxed);
    let probes = prober.await?;
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .await;
    let _ = tokio::time::timeout(Duration::from_secs(30), daemon.wait()).await;

    let failed_probes = probes.iter().filter(|(_, ok)| !ok).count();
    let mut took: Vec<Duration> = probes.iter().map(|(d, _)| *d).collect();
    took.sort();
    let (p50, p99, max) = (
        percentile(&took, 0.5),
        percentile(&took, 0.99),
        took.last().copied().unwrap_or_default(),
    );
    let state = view["state"].as_str().unwrap_or("?").to_owned();
    let pages_done = view["summary"]["pages_ok"].as_u64().unwrap_or(0);
    let mb = view["summary"]["bytes"].as_u64().unwrap_or(0) as f64 / 1e6;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "crawl_parse: {n} pages of {:.1} MB ({NESTED} nested elements each) through {PROXIES} proxies",
        (FLAT + NESTED * 5) as f64 / 1e6
    );
    println!(
        "  job {id}: {state}, {pages_done} pages ({mb:.0} MB) in {:.1}s, daemon CPU {cpu:.1}s",
        wall.as_secs_f64()
    );
    println!(
        "  /healthz: {} asked ({failed_probes} failed), p50 {:.1} ms, p99 {:.1} ms (target < {} ms), max {:.1} ms",
        took.len(),
        ms(p50),
        ms(p99),
        P99_TARGET.as_millis(),
        ms(max)
    );
    let finished = state == "finished" && pages_done == n as u64;
    println!(
        "  job finished with every page: {} (target yes)",
        if finished { "yes" } else { "no" }
    );
    let ok = finished && p99 < P99_TARGET && failed_probes == 0;
    if !ok {
        println!("  FAILED; see {}", dir.display());
    }
    Ok(ok)
}
