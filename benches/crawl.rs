//! `cargo bench --bench crawl`: the crawler's budgets on loopback.
//!
//! - `polite`: 240 pages of one site, Crawl-delay 0.25 s (about a minute),
//!   20 proxies of which 4 dead, 2 banned by the site (captcha), 2 that
//!   accept and never answer; a per-IP rate limit answering 429 +
//!   Retry-After. CPU per page ≤ 0.3 ms: a polite crawl mostly waits, and
//!   waiting should cost nothing. Every reachable page, 0
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
//! closes. CPU is user plus system time of the whole measuring process
//! (every thread), from getrusage.
//!
//! `versus` compares builds in one run: this one's `proxywarden crawl` and
//! older `proxywarden` binaries named by `BENCH_OLD_BIN` (`NAME=PATH`,
//! comma-separated; build a commit in a worktree with `cargo build
//! --release`). Each run gets a fresh farm (with a judge), a fresh database
//! of the farm's proxies (`harvest`, `check --all`, unmeasured), then the
//! measured `crawl` of the site: its wall and CPU (user + system of the
//! crawl process, from our reaped children's rusage). Contenders alternate
//! `BENCH_REPEAT=N` times (default 2); `CRAWL_BENCH_PASS` picks the pass
//! (default `polite`; `throughput` works too). On the polite pass each
//! round also runs the floor (`--floor`, in a child): a bare loop that
//! wakes every Crawl-delay, sends one request on a kept-alive connection
//! and writes one line, and nothing else. Its CPU per wake-up is the least
//! a polite page can cost on this machine, whatever the crawler does
//! (`CRAWL_BENCH_FLOOR_CYCLES`, default 80). `CRAWL_BENCH_DELAY` sets the
//! polite pass's Crawl-delay in seconds (default 0.25), the floor's with it;
//! `CRAWL_BENCH_CONCURRENCY` any pass's pages in flight (and per host).

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
use proxywarden::pool::{NoProxy, Pool, PoolOptions, SharedOptions};
use tokio_util::sync::CancellationToken;

const MEASURE_ARG: &str = "--measure";
/// Mean pages in flight during the crawl, in hundredths.
static IN_FLIGHT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
const FARM_ARG: &str = "--serve-farm";
const VERSUS_ARG: &str = "versus";
/// The floor's role: `--floor DELAY_MS CYCLES [--process]`.
const FLOOR_ARG: &str = "--floor";
/// The floor measured as the polite pass measures the crawl: on a
/// multi-thread runtime, the CPU of the whole process.
const FLOOR_PROCESS_ARG: &str = "--process";
/// Older builds `versus` compares with: `NAME=PATH`, comma-separated.
const OLD_BIN_ENV: &str = "BENCH_OLD_BIN";

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
        pages: 240,
        fanout: 4,
        crawl_delay: Some(0.25),
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

/// The pass named `name`, with the Crawl-delay `CRAWL_BENCH_DELAY`
/// (seconds) given the polite pass, if set: the floor follows it, so the
/// two can be compared at another pace (how much of a page's cost is waking
/// up cold); and with `CRAWL_BENCH_CONCURRENCY` pages in flight (and per
/// host), if set: one at a time without a delay shows what a page costs
/// alone.
fn pass_named(name: &str) -> Pass {
    let mut pass = *PASSES
        .iter()
        .find(|p| p.name == name)
        .unwrap_or_else(|| panic!("no pass named {name:?}"));
    if pass.crawl_delay.is_some()
        && let Some(d) = std::env::var("CRAWL_BENCH_DELAY")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .filter(|d| *d > 0.0)
    {
        pass.crawl_delay = Some(d);
    }
    if let Some(n) = std::env::var("CRAWL_BENCH_CONCURRENCY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        pass.concurrency = n;
        pass.per_host = n;
    }
    pass
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let pass_at = |i: usize| pass_named(args.get(i + 1).map(String::as_str).unwrap_or_default());
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        serve_farm(pass_at(i));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == MEASURE_ARG) {
        measure(pass_at(i));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == FLOOR_ARG) {
        let arg = |k: usize| args.get(i + k).and_then(|v| v.parse::<u64>().ok());
        let cycles = arg(2).and_then(|c| u32::try_from(c).ok()).unwrap_or(80);
        let process = args.iter().any(|a| a == FLOOR_PROCESS_ARG);
        floor(
            Duration::from_millis(arg(1).unwrap_or(250)),
            cycles,
            process,
        );
        return ExitCode::SUCCESS;
    }
    if args.iter().any(|a| a == VERSUS_ARG) {
        let name = std::env::var("CRAWL_BENCH_PASS").unwrap_or_else(|_| "polite".into());
        let pass = pass_named(&name);
        return match versus(pass) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("[versus] {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    let exe = std::env::current_exe().expect("current exe");
    // `cargo bench --bench crawl -- polite` runs that pass alone, as
    // CRAWL_BENCH_PASS=polite does.
    let only = std::env::var("CRAWL_BENCH_PASS").ok().or_else(|| {
        args.iter()
            .skip(1)
            .find(|a| PASSES.iter().any(|p| p.name == a.as_str()))
            .cloned()
    });
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
        // For `versus`, whose contenders check the proxies themselves.
        let judge = common::judges::Judge::plain().await;
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "site {}", site.url("/")).unwrap();
            writeln!(out, "judge {}", judge.url()).unwrap();
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

/// A pass's site, proxies and judge, served by a child process.
struct Farm {
    child: std::process::Child,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    site: String,
    judge: String,
    proxies: Vec<String>,
}

impl Farm {
    fn start(pass: Pass) -> Farm {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = Command::new(exe)
            .args([FARM_ARG, pass.name])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the farm");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let (mut site, mut judge) = (String::new(), String::new());
        let mut proxies = Vec::new();
        for line in lines.by_ref() {
            let line = line.expect("farm output");
            match line.split_once(' ') {
                Some(("site", u)) => site = u.to_owned(),
                Some(("judge", u)) => judge = u.to_owned(),
                Some(("proxy", u)) => proxies.push(u.to_owned()),
                _ if line == "ready" => break,
                _ => {}
            }
        }
        Farm {
            child,
            lines,
            site,
            judge,
            proxies,
        }
    }

    /// Stops the farm; what its site saw (`seen` fields by name).
    fn finish(mut self) -> HashMap<String, f64> {
        drop(self.child.stdin.take());
        let mut seen = HashMap::new();
        for line in self.lines.map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("seen ") {
                for kv in rest.split_whitespace() {
                    if let Some((k, v)) = kv.split_once('=') {
                        seen.insert(k.to_owned(), v.parse::<f64>().unwrap_or(0.0));
                    }
                }
            }
        }
        let _ = self.child.wait();
        seen
    }
}

fn measure(pass: Pass) {
    let farm = Farm::start(pass);
    let (site, proxies) = (farm.site.clone(), farm.proxies.clone());
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let dir = tempfile::tempdir().unwrap();
    let (summary, wall, cpu) = rt.block_on(async {
        raise_nofile_limit();
        let alive: Vec<AliveProxy> = proxies.iter().map(|u| AliveProxy::new(u.clone())).collect();
        let (store, _) = store_with_alive(&dir.path().join("p.db"), &alive).await;
        let pool = Pool::from_store(
            &store,
            SharedOptions::default(),
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
            // The frontier pass measures a million URLs held, not the
            // bound a page limit puts on them by default.
            max_frontier: Some(u64::MAX),
            ..CrawlOptions::default()
        };
        let progress = Arc::new(Progress::default());
        // Pages in flight, sampled every 10 ms: a wall far above the ideal
        // with fewer than `concurrency` in flight is the crawler's own
        // serialisation; with all in flight, each page takes longer. Not
        // on a polite pass, whose pages come a Crawl-delay apart: the
        // samples would wake this process as often as the crawl does and
        // count as the crawler's CPU.
        let every = Duration::from_millis(10);
        let sampler = pass.crawl_delay.is_none().then(|| {
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
        });
        let cpu0 = cpu_time();
        let t0 = Instant::now();
        let summary = crawl(&pool, opts, CancellationToken::new(), progress)
            .await
            .expect("crawl");
        let out = (summary, t0.elapsed(), cpu_time() - cpu0);
        if let Some(s) = sampler {
            s.abort();
        }
        out
    });
    rt.shutdown_background();
    let seen = farm.finish();
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
    if pass.crawl_delay.is_none() {
        println!(
            "[{}] mean pages in flight {:.1} of {}",
            pass.name,
            IN_FLIGHT.load(std::sync::atomic::Ordering::Relaxed) as f64 / 100.0,
            pass.concurrency
        );
    }
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
            // The floor wakes as often as the crawl fetched pages, measured
            // as the crawl is: the ratio is what the crawler adds to waiting.
            let cycles = std::env::var("CRAWL_BENCH_FLOOR_CYCLES")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(u32::try_from(pages).unwrap_or(u32::MAX).max(1));
            match floor_child(Duration::from_secs_f64(delay), cycles, true) {
                Ok(floor) => {
                    let per_page = cpu.as_secs_f64() * 1000.0 / pages.max(1) as f64;
                    println!(
                        "[polite] floor: {floor:.3} ms CPU per wake-up of a bare task ({cycles} sleeps of \
                         {delay} s, one keep-alive request and one output line each, same runtime and \
                         CPU count as the crawl); crawl ÷ floor {:.2}× (target ≤ 2×)",
                        per_page / floor
                    );
                }
                Err(e) => println!("[polite] floor failed: {e:#}"),
            }
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

/// One build's `proxywarden` in `versus`.
struct Contender {
    name: String,
    bin: std::path::PathBuf,
}

/// One measured crawl of a contender.
struct VersusRun {
    wall: Duration,
    cpu: Duration,
    pages: usize,
    ok: usize,
    seen: HashMap<String, f64>,
}

impl VersusRun {
    fn cpu_per_page_ms(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / self.pages.max(1) as f64
    }
}

/// `versus`: each contender's `proxywarden crawl` of a fresh farm, in turn.
fn versus(pass: Pass) -> anyhow::Result<()> {
    let mut contenders = Vec::new();
    if let Ok(list) = std::env::var(OLD_BIN_ENV) {
        for (i, item) in list.split(',').filter(|s| !s.is_empty()).enumerate() {
            let (name, path) = item
                .split_once('=')
                .unwrap_or((if i == 0 { "old" } else { "older" }, item));
            contenders.push(Contender {
                name: name.to_owned(),
                bin: path.into(),
            });
        }
    } else {
        println!("[versus] {OLD_BIN_ENV} is not set: measuring this build alone");
    }
    contenders.push(Contender {
        name: "new".into(),
        bin: env!("CARGO_BIN_EXE_proxywarden").into(),
    });
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(1);
    let tmp = tempfile::tempdir()?;
    let mut results: Vec<Vec<VersusRun>> = contenders.iter().map(|_| Vec::new()).collect();
    let mut floors: Vec<f64> = Vec::new();
    // Interleaved, so that a busy spell on the machine does not fall on
    // one contender only.
    for round in 0..repeat {
        for (c, runs) in contenders.iter().zip(&mut results) {
            let dir = tmp.path().join(format!("{}-{round}", c.name));
            let run = versus_run(pass, c, &dir)?;
            println!(
                "[versus {}] {:>5} #{}: wall {:.1} s, CPU {:.3} s = {:.3} ms/page ({} pages, {} ok); \
                 site: served twice {}, most requests in 1 s {}",
                pass.name,
                c.name,
                round + 1,
                run.wall.as_secs_f64(),
                run.cpu.as_secs_f64(),
                run.cpu_per_page_ms(),
                run.pages,
                run.ok,
                run.seen.get("duplicates").copied().unwrap_or(-1.0),
                run.seen.get("max_1s").copied().unwrap_or(-1.0),
            );
            runs.push(run);
            let _ = std::fs::remove_dir_all(&dir);
        }
        if let Some(delay) = pass.crawl_delay {
            let ms = floor_run(Duration::from_secs_f64(delay))?;
            println!(
                "[versus {}] floor #{}: {ms:.3} ms CPU per wake-up",
                pass.name,
                round + 1
            );
            floors.push(ms);
        }
    }
    let median = |mut v: Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let medians: Vec<(f64, f64)> = results
        .iter()
        .map(|runs| {
            (
                median(runs.iter().map(VersusRun::cpu_per_page_ms).collect()),
                median(runs.iter().map(|r| r.wall.as_secs_f64()).collect()),
            )
        })
        .collect();
    let (new_cpu, new_wall) = *medians.last().expect("the new build");
    for (c, (cpu, wall)) in contenders.iter().zip(&medians) {
        println!(
            "[versus {}] {:>5} median: CPU {cpu:.3} ms/page, wall {wall:.1} s; new/{}: CPU {:.2}×, wall {:.2}×",
            pass.name,
            c.name,
            c.name,
            new_cpu / cpu,
            new_wall / wall,
        );
    }
    println!(
        "[versus {}] target: ≤ 0.3 ms CPU per page (new: {new_cpu:.3})",
        pass.name
    );
    if !floors.is_empty() {
        let floor = median(floors);
        println!(
            "[versus {}] floor median: {floor:.3} ms CPU per wake-up of a bare loop (one timer, one \
             keep-alive request, one output line every Crawl-delay); new ÷ floor {:.1}×",
            pass.name,
            new_cpu / floor
        );
    }
    Ok(())
}

/// Runs the floor (`--floor`) in a child and returns its CPU per wake-up, in
/// milliseconds.
fn floor_run(delay: Duration) -> anyhow::Result<f64> {
    let cycles: u32 = std::env::var("CRAWL_BENCH_FLOOR_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(80);
    floor_child(delay, cycles, false)
}

/// Runs the floor in a child for `cycles` wake-ups (`process`: measured as
/// the crawl is) and returns its CPU per wake-up, in milliseconds.
fn floor_child(delay: Duration, cycles: u32, process: bool) -> anyhow::Result<f64> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args([
        FLOOR_ARG,
        &delay.as_millis().to_string(),
        &cycles.to_string(),
    ]);
    if process {
        cmd.arg(FLOOR_PROCESS_ARG);
    }
    let out = cmd.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        out.status.success(),
        "the floor failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("the floor printed {text:?}"))
}

/// The least a polite crawl's page can cost on this machine: a thread that
/// wakes up every `delay` (a tokio timer on a current-thread runtime),
/// sends one request on a kept-alive connection, reads the answer and
/// appends a line to a file, with nothing else to do. Prints the CPU of
/// that thread (user + system, `RUSAGE_THREAD`) per wake-up, in
/// milliseconds. The answering server is another thread, not counted.
///
/// With `process`, the loop is a task on a multi-thread runtime (as the
/// polite pass runs the crawl) and the CPU is the whole process's less the
/// server thread's own.
fn floor(delay: Duration, cycles: u32, process: bool) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let server = std::thread::spawn(move || {
        use std::io::Read;
        let server_cpu = || rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_THREAD);
        let Ok((mut s, _)) = listener.accept() else {
            return server_cpu();
        };
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf) {
            if n == 0 {
                return server_cpu();
            }
            let body = "<html><body><a href=\"/p/1\">1</a></body></html>";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if s.write_all(format!("{head}{body}").as_bytes()).is_err() {
                return server_cpu();
            }
        }
        server_cpu()
    });
    let dir = tempfile::tempdir().expect("temp dir");
    if process {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let cpu0 = cpu_time();
        rt.block_on(async move {
            let conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let out = std::fs::File::create(dir.path().join("out.jsonl")).expect("output");
            tokio::spawn(floor_loop(conn, out, delay, cycles))
                .await
                .expect("the floor's task");
        });
        let server = server.join().expect("the floor's server");
        let cpu = cpu_time().saturating_sub(cpu0).saturating_sub(server);
        rt.shutdown_background();
        println!(
            "{:.4}",
            cpu.as_secs_f64() * 1000.0 / f64::from(cycles.max(1))
        );
        return;
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let per = rt.block_on(async move {
        let mut conn = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let mut out = std::fs::File::create(dir.path().join("out.jsonl")).expect("output");
        let mut buf = vec![0u8; 8192];
        let thread_cpu = || rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_THREAD);
        let cpu0 = thread_cpu();
        for i in 0..cycles {
            tokio::time::sleep(delay).await;
            conn.write_all(b"GET /p/0 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                .await
                .expect("request");
            let n = conn.read(&mut buf).await.expect("answer");
            writeln!(out, "{{\"page\":{i},\"bytes\":{n}}}").expect("line");
        }
        (thread_cpu() - cpu0).as_secs_f64() * 1000.0 / f64::from(cycles.max(1))
    });
    println!("{per:.4}");
}

/// The floor's loop measured as a whole process: wakes every `delay`,
/// one request on `conn`, one line to `out`; closes `conn` at the end.
async fn floor_loop(
    mut conn: tokio::net::TcpStream,
    mut out: std::fs::File,
    delay: Duration,
    cycles: u32,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 8192];
    for i in 0..cycles {
        tokio::time::sleep(delay).await;
        conn.write_all(b"GET /p/0 HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
            .await
            .expect("request");
        let n = conn.read(&mut buf).await.expect("answer");
        writeln!(out, "{{\"page\":{i},\"bytes\":{n}}}").expect("line");
    }
}

/// A fresh farm and database for contender `c`, then its measured crawl.
fn versus_run(pass: Pass, c: &Contender, dir: &std::path::Path) -> anyhow::Result<VersusRun> {
    std::fs::create_dir_all(dir)?;
    let farm = Farm::start(pass);
    let list: String = farm.proxies.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(dir.join("list.txt"), list)?;
    // The farm listens on loopback, which builds drop from lists unless
    // told to keep it.
    std::fs::write(
        dir.join("proxywarden.toml"),
        format!(
            r#"[database]
path = "{db}"

[harvest]
allow_private_addresses = true

[check]
judges = ["{judge}"]
https = false
connect_timeout = "1s"
timeout = "2s"

[[sources]]
name = "farm"
url = "{list}"
"#,
            db = dir.join("bench.db").display(),
            judge = farm.judge,
            list = dir.join("list.txt").display(),
        ),
    )?;
    let run = |args: &[String]| -> anyhow::Result<(Duration, Duration)> {
        let before = rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_CHILDREN);
        let started = Instant::now();
        let out = Command::new(&c.bin)
            .args(["--config", "proxywarden.toml"])
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()?;
        let wall = started.elapsed();
        // The farm is reaped last: our reaped children's time grew by this
        // child's alone.
        let cpu = rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_CHILDREN) - before;
        anyhow::ensure!(
            out.status.success(),
            "{} {args:?} failed ({}): {}",
            c.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((wall, cpu))
    };
    let owned = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    run(&owned(&["harvest"]))?;
    run(&owned(&["check", "--all"]))?;
    let mut args = owned(&[
        "crawl",
        &farm.site,
        "--output",
        "pages.jsonl",
        "--connect-timeout",
        "1s",
        "--first-byte-timeout",
        "2s",
        "--timeout",
        "5s",
        "--no-proxy-wait",
        "30s",
    ]);
    args.extend([
        "--concurrency".into(),
        pass.concurrency.to_string(),
        "--per-host-concurrency".into(),
        pass.per_host.to_string(),
    ]);
    if let Some(m) = pass.max_pages {
        args.extend(["--max-pages".into(), m.to_string()]);
    }
    let (wall, cpu) = run(&args)?;
    let (mut pages, mut ok) = (0, 0);
    for line in std::fs::read_to_string(dir.join("pages.jsonl"))?.lines() {
        let v: serde_json::Value = serde_json::from_str(line)?;
        pages += 1;
        ok += usize::from(v["error"].is_null());
    }
    Ok(VersusRun {
        wall,
        cpu,
        pages,
        ok,
        seen: farm.finish(),
    })
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

/// User plus system CPU time of this process (all threads), to the
/// microsecond: a polite crawl spends a fraction of a second in a minute.
fn cpu_time() -> Duration {
    rusage_cpu(nix::sys::resource::UsageWho::RUSAGE_SELF)
}

/// User plus system CPU time of `who`.
fn rusage_cpu(who: nix::sys::resource::UsageWho) -> Duration {
    let usage = nix::sys::resource::getrusage(who).expect("getrusage");
    let micros = |t: nix::sys::time::TimeVal| (t.tv_sec() * 1_000_000 + t.tv_usec()) as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}
