//! `cargo bench --bench crawl`: the crawler's budgets on loopback.
//!
//! - `polite`: 300 pages, Crawl-delay 0.1 s, 20 proxies of which 4 dead, 2
//!   banned by the site (captcha), 2 that accept and never answer; a per-IP
//!   rate limit answering 429 + Retry-After. Every reachable page, 0
//!   duplicate fetches (pages the site served twice; a ban page or a 429
//!   answered, then retried through another proxy, is counted apart), 0
//!   robots-disallowed fetches, 0 direct requests, never
//!   more requests in a 1 s window than the delay allows, wall ≤ 1.2 ×
//!   pages × delay.
//! - `throughput`: 20,000 pages, no delay, concurrency 64 through 500
//!   working proxies, 20 ms per page: wall ≤ 1.5 × ideal, CPU per page
//!   ≤ 0.3 ms, peak RSS ≤ 150 MB.
//! - `frontier`: 1,001 pages of 1,000 links each (1,000,000 URLs
//!   discovered): peak RSS ≤ 200 MB.
//!
//! The working proxies keep client connections alive, as most real ones
//! do (`CRAWL_BENCH_CLOSE=1`: they close after every answer). Figures are
//! printed next to their targets, not asserted. Each pass runs
//! in its own measuring process (`--measure PASS`), which starts the site
//! and the proxies in a child (`--serve-farm PASS`) so their CPU and memory
//! are not counted; the child reports what the site saw when its stdin
//! closes.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::IpAddr;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fakes::{Behavior, FakeHttpProxy, HttpProxyOpts, closed_port, raise_nofile_limit};
use common::site::{RateLimit, Reply, Site, SiteOpts};
use common::{AliveProxy, store_with_alive};
use proxywarden::crawl::{CrawlOptions, Progress, crawl};
use proxywarden::pool::{NoProxy, Pool, PoolOptions};
use tokio_util::sync::CancellationToken;

const MEASURE_ARG: &str = "--measure";
/// Mean pages in flight during the crawl, in hundredths.
static IN_FLIGHT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const FARM_ARG: &str = "--serve-farm";

#[derive(Clone, Copy, Debug)]
struct Pass {
    name: &'static str,
    pages: usize,
    fanout: usize,
    /// robots.txt Crawl-delay, seconds.
    crawl_delay: Option<f64>,
    latency: Duration,
    working: usize,
    dead: usize,
    banned: usize,
    hanging: usize,
    concurrency: usize,
    per_host: usize,
    max_pages: Option<u64>,
}

const PASSES: [Pass; 3] = [
    Pass {
        name: "polite",
        pages: 300,
        fanout: 4,
        crawl_delay: Some(0.1),
        latency: Duration::from_millis(5),
        working: 12,
        dead: 4,
        banned: 2,
        hanging: 2,
        concurrency: 16,
        per_host: 2,
        max_pages: None,
    },
    Pass {
        name: "throughput",
        pages: 20_000,
        fanout: 8,
        crawl_delay: None,
        latency: Duration::from_millis(20),
        working: 500,
        dead: 0,
        banned: 0,
        hanging: 0,
        concurrency: 64,
        per_host: 64,
        max_pages: None,
    },
    Pass {
        name: "frontier",
        pages: 1_002_000,
        fanout: 1_000,
        crawl_delay: None,
        latency: Duration::ZERO,
        working: 64,
        dead: 0,
        banned: 0,
        hanging: 0,
        concurrency: 64,
        per_host: 64,
        max_pages: Some(1_001),
    },
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let pass_named = |i: usize| -> Pass {
        let name = args.get(i + 1).map(String::as_str).unwrap_or_default();
        *PASSES
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pass named {name:?}"))
    };
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        serve_farm(pass_named(i));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == MEASURE_ARG) {
        measure(pass_named(i));
        return ExitCode::SUCCESS;
    }
    let exe = std::env::current_exe().expect("current exe");
    let only = std::env::var("CRAWL_BENCH_PASS").ok();
    let mut failed = false;
    for pass in PASSES {
        if only.as_deref().is_some_and(|o| o != pass.name) {
            continue;
        }
        let status = Command::new(&exe)
            .args([MEASURE_ARG, pass.name])
            .status()
            .expect("run a measuring process");
        failed |= !status.success();
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Proxy `i`'s outgoing address: one per proxy, so the site tells them
/// apart (bans, rate limits) and none is 127.0.0.1 (a direct request).
fn upstream_ip(i: usize) -> IpAddr {
    IpAddr::from([127, 1 + (i / 250) as u8, 0, 2 + (i % 250) as u8])
}

/// A page of the tree (query ignored), with a link the robots.txt
/// disallows and a tracking variant of its first child.
fn page(path: &str, pass: Pass) -> Reply {
    let bare = path.split('?').next().unwrap_or(path);
    if bare.starts_with("/private/") {
        return Reply::html("<title>private</title>");
    }
    let mut r = common::site::tree_page(bare, pass.pages, pass.fanout);
    if r.status == 200 && pass.fanout <= 8 {
        let body = String::from_utf8(r.body).unwrap().replace(
            "</body>",
            "<a href=\"/private/x\">p</a><a href=\"/p/1?utm_source=bench\">u</a></body>",
        );
        r.body = body.into_bytes();
    }
    r
}

fn serve_farm(pass: Pass) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        let banned: Vec<IpAddr> = (pass.working..pass.working + pass.banned)
            .map(upstream_ip)
            .collect();
        let mut opts = SiteOpts::new(move |p, _| page(p, pass));
        opts.robots = Some(Reply::text(match pass.crawl_delay {
            Some(d) => format!("User-agent: *\nDisallow: /private/\nCrawl-delay: {d}\n"),
            None => "User-agent: *\nDisallow: /private/\n".into(),
        }));
        opts.banned = banned;
        opts.latency = pass.latency;
        if pass.name == "polite" {
            opts.rate_limit = Some(RateLimit {
                max: 5,
                window: Duration::from_secs(1),
                retry_after: 1,
            });
        }
        let site = Site::start(opts).await;
        // Working proxies keep client connections alive, as most real ones
        // do; CRAWL_BENCH_CLOSE=1 makes them close after every answer.
        let keep_alive = std::env::var_os("CRAWL_BENCH_CLOSE").is_none();
        let mut proxies = Vec::new();
        for i in 0..pass.working + pass.banned {
            proxies.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    connect: true,
                    upstream_bind: Some(upstream_ip(i)),
                    keep_alive,
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        for _ in 0..pass.hanging {
            proxies.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    behavior: Behavior::Hang,
                    ..HttpProxyOpts::default()
                })
                .await,
            );
        }
        let dead: Vec<_> = (0..pass.dead).map(|_| closed_port()).collect();
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "site {}", site.url("/")).unwrap();
            for p in &proxies {
                writeln!(out, "proxy {}", p.url()).unwrap();
            }
            for d in &dead {
                writeln!(out, "proxy http://{d}").unwrap();
            }
            writeln!(out, "ready").unwrap();
            out.flush().unwrap();
        }
        let cpu0 = cpu_time();
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        // The farm's own CPU while the crawl ran: on a small machine the
        // fakes compete with the crawler for the same cores.
        let farm_cpu = cpu_time() - cpu0;
        // What the site saw.
        let log = site.log();
        let per_path = site.per_path();
        let twice = |counts: &HashMap<String, usize>| -> usize {
            counts
                .iter()
                .filter(|(p, _)| *p != "/robots.txt")
                .map(|(_, n)| n.saturating_sub(1))
                .sum()
        };
        // A page the site served more than once is a duplicate fetch; a
        // request the site answered with its ban page or a 429, and that
        // was then sent again through another proxy, is a retry.
        let dups = twice(&site.served_per_path());
        let retried = twice(&per_path) - dups;
        let private = per_path
            .iter()
            .filter(|(p, _)| p.starts_with("/private/"))
            .map(|(_, n)| n)
            .sum::<usize>();
        let direct = log.iter().filter(|h| h.peer == IpAddr::from([127, 0, 0, 1])).count();
        let mut max_1s = 0;
        let mut j = 0;
        for i in 0..log.len() {
            while log[i].at - log[j].at >= Duration::from_secs(1) {
                j += 1;
            }
            max_1s = max_1s.max(i - j + 1);
        }
        println!(
            "seen requests={} paths={} duplicates={dups} retried={retried} disallowed={private} direct={direct} max_1s={max_1s} cpu_s={:.2}",
            log.len(),
            per_path.len(),
            farm_cpu.as_secs_f64()
        );
        drop(proxies);
    });
    rt.shutdown_background();
}

fn measure(pass: Pass) {
    let exe = std::env::current_exe().expect("current exe");
    let mut child = Command::new(exe)
        .args([FARM_ARG, pass.name])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the farm");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
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
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().unwrap();
    let (summary, wall, cpu) = rt.block_on(async {
        raise_nofile_limit();
        let alive: Vec<AliveProxy> = proxies.iter().map(|u| AliveProxy::new(u.clone())).collect();
        let (store, _) = store_with_alive(&dir.path().join("p.db"), &alive).await;
        let pool = Pool::from_store(
            &store,
            PoolOptions {
                connect_timeout: Duration::from_secs(1),
                first_byte_timeout: Duration::from_secs(2),
                total_timeout: Duration::from_secs(5),
                no_proxy: NoProxy::Wait(Duration::from_secs(30)),
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let opts = CrawlOptions {
            seeds: vec![site.parse().unwrap()],
            output: Some(dir.path().join("pages.jsonl")),
            concurrency: pass.concurrency,
            per_host_concurrency: pass.per_host,
            max_pages: pass.max_pages,
            ..CrawlOptions::default()
        };
        let progress = Arc::new(Progress::default());
        // Pages in flight, sampled every 10 ms (every Crawl-delay on a
        // polite pass, whose pages come that far apart: a 10 ms tick would
        // wake this process a dozen times per page and count as the
        // crawler's CPU): a wall far above the ideal with fewer than
        // `concurrency` in flight is the crawler's own serialisation; with
        // all in flight, each page takes longer.
        let every = pass
            .crawl_delay
            .map_or(Duration::from_millis(10), Duration::from_secs_f64);
        let sampler = {
            let progress = progress.clone();
            tokio::spawn(async move {
                let (mut sum, mut n) = (0u64, 0u64);
                let mut tick = tokio::time::interval(every);
                loop {
                    tick.tick().await;
                    let now = progress
                        .in_flight
                        .load(std::sync::atomic::Ordering::Relaxed);
                    if now > 0 || n > 0 {
                        sum += now;
                        n += 1;
                    }
                    IN_FLIGHT.store(sum * 100 / n.max(1), std::sync::atomic::Ordering::Relaxed);
                }
            })
        };
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        let summary = crawl(&pool, opts, CancellationToken::new(), progress)
            .await
            .expect("crawl");
        let out = (summary, t0.elapsed(), cpu_time() - cpu0);
        sampler.abort();
        out
    });
    rt.shutdown_background();
    drop(child.stdin.take());
    let mut seen = HashMap::new();
    for line in lines.map_while(Result::ok) {
        if let Some(rest) = line.strip_prefix("seen ") {
            for kv in rest.split_whitespace() {
                if let Some((k, v)) = kv.split_once('=') {
                    seen.insert(k.to_owned(), v.parse::<f64>().unwrap_or(0.0));
                }
            }
        }
    }
    let _ = child.wait();
    let pages = summary.ok() + summary.failed();
    let hwm_mb = proc_status_kib("VmHWM:") as f64 / 1024.0;
    println!(
        "[{}] {}",
        pass.name,
        summary.to_string().replace('\n', "\n    ")
    );
    println!(
        "[{}] wall {:.1}s, {} pages ({} ok), CPU {:.3} ms/page, peak RSS {hwm_mb:.0} MiB",
        pass.name,
        wall.as_secs_f64(),
        pages,
        summary.ok(),
        cpu.as_secs_f64() * 1000.0 / pages.max(1) as f64
    );
    let s = |k: &str| seen.get(k).copied().unwrap_or(-1.0);
    println!(
        "[{}] site saw: pages served twice {} (target 0), requests answered by a ban page or 429 and retried {}, \
         robots-disallowed {} (target 0), direct {} (target 0), most requests in 1 s {}",
        pass.name,
        s("duplicates"),
        s("retried"),
        s("disallowed"),
        s("direct"),
        s("max_1s"),
    );
    println!(
        "[{}] mean pages in flight {:.1} of {}",
        pass.name,
        IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed) as f64 / 100.0,
        pass.concurrency
    );
    println!(
        "[{}] farm (site and proxies, another process): CPU {:.1}s = {:.0}% of one core over the wall",
        pass.name,
        s("cpu_s"),
        100.0 * s("cpu_s") / wall.as_secs_f64()
    );
    match pass.name {
        "polite" => {
            let delay = pass.crawl_delay.unwrap_or(0.0);
            let ideal = pass.pages as f64 * delay;
            println!(
                "[polite] reachable pages {} of {}; wall {:.1}s vs target ≤ {:.1}s (1.2 × pages × delay); \
                 1 s window allows {:.0}",
                summary.ok(),
                pass.pages,
                wall.as_secs_f64(),
                1.2 * ideal,
                1.0 / delay + 1.0
            );
        }
        "throughput" => {
            let ideal = pass.pages as f64 * pass.latency.as_secs_f64() / pass.concurrency as f64;
            println!(
                "[throughput] wall {:.1}s vs ideal {ideal:.2}s: {:.2}× (target ≤ 1.5×); CPU/page target ≤ 0.3 ms; RSS target ≤ 150 MiB",
                wall.as_secs_f64(),
                wall.as_secs_f64() / ideal
            );
        }
        _ => println!(
            "[frontier] {} URLs discovered; peak RSS {hwm_mb:.0} MiB (target ≤ 200 MiB)",
            summary.discovered
        ),
    }
}

/// A `kB` field of /proc/self/status, in KiB (0 if missing).
fn proc_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User plus system CPU time of this process (all threads).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 1..]);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    // Linux reports in USER_HZ, 100 on every common build.
    Duration::from_millis(ticks * 10)
}
