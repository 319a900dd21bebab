//! `cargo bench --bench soak`: `proxywarden serve` for ten minutes, run the
//! way a user runs it, on a farm of misbehaving proxies (issue 20, Must 6).
//! `SOAK_MINUTES=2 cargo bench --bench soak` runs a shorter soak.
//!
//! The scenario: 300 loopback HTTP proxies listed in a local source file, a
//! third of them never listening and 40 resetting every other connection;
//! every minute 10–30% of the working ones go down and those that went down
//! the minute before come back. A site bans 15% of the proxies' addresses
//! (a captcha page with 403) and lets each address send 2 requests a
//! second (429 with `Retry-After: 1` beyond). The built binary
//! (`CARGO_BIN_EXE_proxywarden`, which `cargo bench` builds in the release
//! profile) runs `harvest`, then `check --all`, then `serve`, at once, on
//! the database the CLI just filled. While it serves:
//!
//! - a gateway client sends a plain GET to the site every 250 ms, and 16
//!   more send GETs back to back during seconds 20–50 of every minute
//!   (waiting 100 ms after an answer that is not a 200, as a scraper backs
//!   off);
//! - `GET /proxy?format=text` is asked 20 times a second and each answer
//!   is compared with the proxies that are down at that moment;
//! - one crawl job (`POST /crawls`) crawls the site, which asks for a
//!   Crawl-delay of 0.5 s.
//!
//! Every minute it prints a row: gateway answers by status, the share of
//! 200s (the site's page), `/proxy` answers and how many named a proxy that
//! was down, the crawl job's pages, the servable count from `/stats`, the
//! proxies taken down and brought back, and the daemon's CPU, RSS, open
//! file descriptors and threads (from `/proc`). At the end it judges:
//!
//! - every minute ≥ 99% of gateway answers are 200, counting only requests
//!   sent while `/stats` said something was servable;
//! - every minute ≤ 1% of `/proxy` answers name a proxy that was down (each
//!   minute holds a wave of deaths, so each is a "minute after" window);
//! - RSS and open fds are flat: the last minute's peak is at most 1.2 times
//!   the second minute's (the first holds the start-up); judged from three
//!   minutes on;
//! - the crawl job fetched at least 30 pages every minute after the first
//!   (which holds its start), a quarter of what its Crawl-delay allows;
//!
//! and exits 1 if any of these fails. The bench binary plays two roles:
//! without arguments it measures; with `--serve-farm` it is the child
//! holding the judges, the site and the proxies (so their CPU is not the
//! daemon's), which takes proxies down and up on `kill I…`/`revive I…`
//! lines on stdin and exits when stdin closes. The daemon's log, config and
//! database are kept in `target/tmp/soak/`, with `gateway.csv`: every
//! gateway answer (when it was asked, by which client, status, error code,
//! time taken), to see within a minute when and how the gateway failed,
//! and `proxy.csv`: each wave of deaths and each `/proxy` answer that named
//! a proxy down, in ms since the start, to see how long after a death it
//! was still handed out.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashSet;
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use common::fakes::{Behavior, FakeHttpProxy, HttpProxyOpts, raise_nofile_limit};
use common::judges::Judge;
use common::site::{CAPTCHA_PAGE, RateLimit, Reply, Site, SiteOpts, tree_page};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand::{RngExt, rngs::StdRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout};
use tokio_util::sync::CancellationToken;

const FARM_ARG: &str = "--serve-farm";
/// Proxies listed in the source.
const PROXIES: usize = 300;
/// The port every proxy listens on, each on an address of its own. It is
/// below Linux's ephemeral range, so no outgoing connection can take it
/// while its proxy is down and the proxy always comes back where it was.
const PROXY_PORT: u16 = 23_128;
/// Pages on the site: more than any crawl reaches in the soak.
const PAGES: usize = 200_000;
const FANOUT: usize = 10;
/// The site's answer time.
const SITE_LATENCY: Duration = Duration::from_millis(20);
/// robots.txt's Crawl-delay, seconds.
const CRAWL_DELAY: f64 = 0.5;
/// Requests per second the site allows one address.
const RATE_LIMIT: usize = 2;
/// Clients that send back to back during the burst.
const BURST_CLIENTS: usize = 16;
/// Seconds of each minute during which the burst clients send.
const BURST: std::ops::Range<u64> = 20..50;
/// Second of each minute at which proxies go down and come back.
const CHURN_AT: u64 = 10;
/// The steady client's period: 4 requests a second.
const STEADY_EVERY: Duration = Duration::from_millis(250);
/// `GET /proxy` period: 20 a second.
const PROXY_EVERY: Duration = Duration::from_millis(50);
/// The share of 200s each minute must reach, and the most dead answers.
const MIN_OK_SHARE: f64 = 0.99;
const MAX_DEAD_SHARE: f64 = 0.01;
/// How much the last minute's RSS or fds may exceed the second minute's.
const FLAT: f64 = 1.2;
/// The share of what Crawl-delay allows (120 pages a minute) the crawl job
/// must fetch each minute: it shares the addresses' 2 requests a second
/// with the gateway's burst, but a few pages a minute is no crawl at all.
const MIN_CRAWL_PACE: f64 = 0.25;

/// Listed but never listening: a list's dead entries (100 of 300).
fn dead_at_start(i: usize) -> bool {
    i % 3 == 2
}

/// Resets every other connection (40 of the 200 that listen).
fn flaky(i: usize) -> bool {
    !dead_at_start(i) && i.is_multiple_of(5)
}

/// Banned by the site: 3 residues of 20, 15% of the addresses, spread
/// over the dead, flaky and working ones alike.
fn banned(i: usize) -> bool {
    (i * 7 + 3) % 20 < 3
}

/// Proxy `i` listens on, and forwards from, an address of its own, so the
/// site tells the proxies apart (bans, rate limits) and the judge tells
/// proxied requests from the daemon's own (127.0.0.1).
fn proxy_ip(i: usize) -> IpAddr {
    IpAddr::from([127, 20, (i / 200) as u8, 1 + (i % 200) as u8])
}

fn proxy_addr(i: usize) -> SocketAddr {
    SocketAddr::new(proxy_ip(i), PROXY_PORT)
}

/// How `/proxy?format=text` names proxy `i`.
fn proxy_url(i: usize) -> String {
    format!("http://{}", proxy_addr(i))
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == FARM_ARG) {
        serve_farm();
        return ExitCode::SUCCESS;
    }
    let minutes: usize = match std::env::var("SOAK_MINUTES") {
        Ok(v) => match v.parse() {
            Ok(m) if m >= 1 => m,
            _ => {
                eprintln!("SOAK_MINUTES={v:?}: expected a whole number of minutes, at least 1");
                return ExitCode::FAILURE;
            }
        },
        Err(_) => 10,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    match rt.block_on(soak(minutes)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("soak bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// The child: judges, site, proxies

/// Starts proxy `i` on its fixed address.
fn start_proxy(i: usize) -> std::io::Result<FakeHttpProxy> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    // A proxy taken down leaves the connections it closed in TIME_WAIT;
    // without SO_REUSEADDR it could not listen again for a minute.
    socket.set_reuseaddr(true)?;
    socket.bind(proxy_addr(i))?;
    let listener = socket.listen(1024)?;
    Ok(FakeHttpProxy::start_on(
        listener,
        HttpProxyOpts {
            connect: true,
            upstream_bind: Some(proxy_ip(i)),
            behavior: if flaky(i) {
                Behavior::ResetEveryOther
            } else {
                Behavior::Normal
            },
            // As most real proxies do; it also keeps the farm's CPU low.
            keep_alive: true,
            reuse_site: true,
            ..HttpProxyOpts::default()
        },
    ))
}

/// Prints `judge URL` twice, `site ADDR` and `ready`; then answers each
/// `kill I J …` and `revive I J …` line with `done` (and the proxies that
/// could not listen again, if any).
fn serve_farm() {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        // Two judges, as the guide's Checking chapter advises for each kind in use.
        let judges = [Judge::plain().await, Judge::plain().await];
        let mut opts = SiteOpts::new(|path, _| {
            let bare = path.split('?').next().unwrap_or(path);
            tree_page(bare, PAGES, FANOUT)
        });
        opts.robots = Some(Reply::text(format!(
            "User-agent: *\nCrawl-delay: {CRAWL_DELAY}\n"
        )));
        opts.banned = (0..PROXIES).filter(|&i| banned(i)).map(proxy_ip).collect();
        // The site: a captcha page with 403.
        opts.ban_reply = Reply {
            status: 403,
            ..Reply::html(CAPTCHA_PAGE)
        };
        opts.rate_limit = Some(RateLimit {
            max: RATE_LIMIT,
            window: Duration::from_secs(1),
            retry_after: 1,
        });
        opts.latency = SITE_LATENCY;
        let site = Site::start(opts).await;
        let mut proxies: Vec<Option<FakeHttpProxy>> = Vec::with_capacity(PROXIES);
        for i in 0..PROXIES {
            proxies.push(if dead_at_start(i) {
                None
            } else {
                Some(start_proxy(i).unwrap_or_else(|e| panic!("listen on {}: {e}", proxy_addr(i))))
            });
        }
        {
            let mut out = std::io::stdout().lock();
            for j in &judges {
                writeln!(out, "judge {}", j.url()).expect("write to the parent");
            }
            writeln!(out, "site {}", site.addr).expect("write to the parent");
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut words = line.split_whitespace();
            let verb = words.next().unwrap_or_default();
            let which: Vec<usize> = words.filter_map(|w| w.parse().ok()).collect();
            let mut failed = Vec::new();
            match verb {
                "kill" => {
                    for &i in &which {
                        proxies[i] = None;
                    }
                    // Dropping aborts the accept loop and its connections;
                    // let the runtime run the aborts before saying done.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                "revive" => {
                    for &i in &which {
                        let mut tries = 0;
                        proxies[i] = loop {
                            match start_proxy(i) {
                                Ok(p) => break Some(p),
                                Err(_) if tries < 20 => {
                                    tries += 1;
                                    tokio::time::sleep(Duration::from_millis(100)).await;
                                }
                                Err(_) => {
                                    failed.push(i);
                                    break None;
                                }
                            }
                        };
                    }
                }
                _ => {}
            }
            let failed: Vec<String> = failed.iter().map(usize::to_string).collect();
            println!("done {}", failed.join(" "));
        }
        drop(proxies);
        drop(site);
        drop(judges);
    });
    rt.shutdown_background();
}

/// The parent's end of the child.
struct Farm {
    child: Child,
    stdin: ChildStdin,
    lines: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Farm {
    /// Sends a `kill`/`revive` line; the proxies that failed to come back.
    async fn control(&mut self, verb: &str, which: &[usize]) -> anyhow::Result<Vec<usize>> {
        let list: Vec<String> = which.iter().map(usize::to_string).collect();
        self.stdin
            .write_all(format!("{verb} {}\n", list.join(" ")).as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.lines.next_line().await?.context("the farm exited")?;
        let failed = line
            .strip_prefix("done")
            .with_context(|| format!("unexpected farm line {line:?}"))?;
        Ok(failed
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect())
    }
}

// ---------------------------------------------------------------------------
// The measuring process

/// One minute's figures, filled by the load tasks as answers arrive.
#[derive(Default)]
struct Minute {
    /// Gateway answers counted: 200 with the page, and by other outcomes.
    gw_ok: AtomicU64,
    gw_503: AtomicU64,
    gw_502: AtomicU64,
    gw_403: AtomicU64,
    gw_429: AtomicU64,
    gw_other: AtomicU64,
    /// No answer: a transport error or the client's 60 s timeout.
    gw_error: AtomicU64,
    /// Requests sent while `/stats` said nothing was servable: not counted.
    gw_excluded: AtomicU64,
    /// Milliseconds each counted 200 took.
    gw_ms: Mutex<Vec<u32>>,
    proxy_answers: AtomicU64,
    /// `/proxy` answers naming a proxy that was down when it arrived.
    proxy_dead: AtomicU64,
    proxy_404: AtomicU64,
    proxy_other: AtomicU64,
    /// `/stats` servable, least and most seen (least starts at MAX).
    servable_min: AtomicU64,
    servable_max: AtomicU64,
    killed: AtomicU64,
    revived: AtomicU64,
    /// The daemon's peaks over the minute.
    rss_kib: AtomicU64,
    fds: AtomicU64,
    threads: AtomicU64,
}

impl Minute {
    fn gw_counted(&self) -> u64 {
        [
            &self.gw_ok,
            &self.gw_503,
            &self.gw_502,
            &self.gw_403,
            &self.gw_429,
            &self.gw_other,
            &self.gw_error,
        ]
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum()
    }

    fn ok_share(&self) -> Option<f64> {
        let n = self.gw_counted();
        (n > 0).then(|| self.gw_ok.load(Ordering::Relaxed) as f64 / n as f64)
    }

    fn dead_share(&self) -> Option<f64> {
        let n = self.proxy_answers.load(Ordering::Relaxed);
        (n > 0).then(|| self.proxy_dead.load(Ordering::Relaxed) as f64 / n as f64)
    }
}

/// What the load tasks share.
struct Shared {
    started: Instant,
    minutes: Vec<Minute>,
    /// Proxy URLs down right now (never listening, or taken down).
    down: Mutex<HashSet<String>>,
    /// `/stats` servable at the last sample.
    servable: AtomicU64,
    /// Every gateway answer, one CSV line each, for a closer look than a
    /// minute's (when the gateway stopped, with what error).
    answers: Mutex<std::io::BufWriter<std::fs::File>>,
    /// Every churn and every `/proxy` answer naming a proxy that was down,
    /// one CSV line each: how long after its death a proxy was still
    /// handed out.
    deaths: Mutex<std::io::BufWriter<std::fs::File>>,
}

impl Shared {
    /// Notes that proxies `ids` are down now.
    fn mark_down(&self, ids: &[usize]) {
        let mut down = self.down.lock().unwrap();
        for &i in ids {
            down.insert(proxy_url(i));
        }
    }

    /// The minute now, or `None` once the soak is over.
    fn minute(&self) -> Option<&Minute> {
        self.minutes
            .get((self.started.elapsed().as_secs() / 60) as usize)
    }

    /// A line of `proxy.csv`, stamped with the time since the start.
    fn note(&self, event: &str, what: &str) {
        let at = self.started.elapsed().as_millis();
        let _ = writeln!(self.deaths.lock().unwrap(), "{at},{event},{what}");
    }

    fn second_of_minute(&self) -> u64 {
        self.started.elapsed().as_secs() % 60
    }
}

/// A client with the crate's TLS setup (no other provider is compiled in),
/// through `proxy` if given.
fn client(timeout: Duration, proxy: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let tls = proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1)?;
    let builder = reqwest::Client::builder()
        .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
        .timeout(timeout);
    let builder = match proxy {
        Some(p) => builder.proxy(reqwest::Proxy::http(p)?),
        None => builder.no_proxy(),
    };
    Ok(builder.build()?)
}

/// A free port on 127.0.0.1 (bound, then released for the daemon).
fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The daemon's resident memory (KiB), open descriptors and threads.
fn proc_sample(pid: u32) -> Option<(u64, u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64;
    Some((field("VmRSS:")?, fds, field("Threads:")?))
}

/// Runs the CLI with `args` on `config`, prints its output indented, and
/// fails if it does.
async fn cli(bin: &str, config: &Path, args: &[&str]) -> anyhow::Result<()> {
    let started = Instant::now();
    let out = common::binary::run(bin, config, args).await?;
    println!(
        "$ proxywarden {} ({:.1}s, {})",
        args.join(" "),
        started.elapsed().as_secs_f64(),
        out.status
    );
    for line in String::from_utf8_lossy(&out.stdout)
        .lines()
        .chain(String::from_utf8_lossy(&out.stderr).lines())
    {
        println!("    {line}");
    }
    anyhow::ensure!(
        out.status.success(),
        "proxywarden {} failed",
        args.join(" ")
    );
    Ok(())
}

async fn soak(minutes: usize) -> anyhow::Result<bool> {
    raise_nofile_limit();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("soak");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    let (child, stdin, lines) = common::binary::spawn_role(&[FARM_ARG])?;
    let mut farm = Farm {
        stdin,
        lines,
        child,
    };
    let mut judges = Vec::new();
    let mut site: Option<SocketAddr> = None;
    loop {
        let line = farm.lines.next_line().await?.context("the farm exited")?;
        match line.split_once(' ') {
            Some(("judge", url)) => judges.push(url.to_owned()),
            Some(("site", addr)) => site = Some(addr.parse()?),
            _ if line == "ready" => break,
            _ => anyhow::bail!("unexpected farm line {line:?}"),
        }
    }
    let site = site.context("the farm named no site")?;

    // What a user writes: a source listing the farm, the judges, where the
    // API and the gateway listen. Everything else is the default but for
    // the dead proxies' re-check, which by default (15 min, doubling) is
    // longer than the soak: proxies that come back would never be seen to.
    let list = dir.join("farm.txt");
    let text: String = (0..PROXIES)
        .map(|i| format!("{}\n", proxy_addr(i)))
        .collect();
    std::fs::write(&list, text)?;
    let api = free_port()?;
    let gateway = free_port()?;
    let judges_toml: Vec<String> = judges
        .iter()
        .map(|u| format!("{{ url = \"{u}\", marker = \"proxywarden-judge\" }}"))
        .collect();
    let config = dir.join("proxywarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\npath = \"{db}\"\n\n\
             [harvest]\nallow_private_addresses = true\n\n\
             [check]\njudges = [{judges}]\nhttps = false\n\
             recheck_dead = \"1m\"\nrecheck_dead_max = \"2m\"\n\n\
             [api]\nlisten = \"{api}\"\n\n\
             [gateway]\nlisten = \"{gateway}\"\n\n\
             [[sources]]\nname = \"farm\"\nurl = \"{list}\"\nformat = \"text\"\nscheme = \"http\"\n",
            db = dir.join("soak.db").display(),
            judges = judges_toml.join(", "),
            list = list.display(),
        ),
    )?;
    println!(
        "soak: {minutes} min; {PROXIES} proxies ({} never listening, {} flaky, {} banned by the site); \
         site {site} allows {RATE_LIMIT} req/s per address; files in {}",
        (0..PROXIES).filter(|&i| dead_at_start(i)).count(),
        (0..PROXIES).filter(|&i| flaky(i)).count(),
        (0..PROXIES).filter(|&i| banned(i)).count(),
        dir.display()
    );
    cli(bin, &config, &["harvest"]).await?;
    cli(bin, &config, &["check", "--all"]).await?;

    // `serve` at once on what the CLI just filled, as in the issue.
    let (mut daemon, pid) = common::binary::spawn_serve(bin, &config, &dir.join("daemon.log"))?;
    let http = client(Duration::from_secs(10), None)?;
    let up = common::binary::wait_healthy(&mut daemon, api, Duration::from_secs(30))
        .await
        .with_context(|| format!("see {}", dir.display()))?;
    println!(
        "serve (pid {pid}) answered /healthz after {:.2}s; API {api}, gateway {gateway}",
        up.as_secs_f64()
    );

    let shared = Arc::new(Shared {
        started: Instant::now(),
        minutes: (0..minutes)
            .map(|_| Minute {
                servable_min: AtomicU64::new(u64::MAX),
                ..Minute::default()
            })
            .collect(),
        down: Mutex::new(
            (0..PROXIES)
                .filter(|&i| dead_at_start(i))
                .map(proxy_url)
                .collect(),
        ),
        servable: AtomicU64::new(0),
        answers: Mutex::new(std::io::BufWriter::new(std::fs::File::create(
            dir.join("gateway.csv"),
        )?)),
        deaths: Mutex::new(std::io::BufWriter::new(std::fs::File::create(
            dir.join("proxy.csv"),
        )?)),
    });
    writeln!(shared.deaths.lock().unwrap(), "at_ms,event,proxies")?;
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    // The start in the daemon log's clock, to line the two up.
    shared.note("unix_ms", &unix_ms.to_string());
    writeln!(
        shared.answers.lock().unwrap(),
        "sent_ms,client,status,error_code,took_ms"
    )?;
    let stop = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();

    // The crawl job, started with the load.
    let job: serde_json::Value = http
        .post(format!("http://{api}/crawls"))
        .header("Content-Type", "application/json")
        .body(
            serde_json::json!({
                "seeds": [format!("http://{site}/")],
                "max_pages": 100_000,
            })
            .to_string(),
        )
        .send()
        .await?
        .json()
        .await?;
    let job_id = job["id"]
        .as_i64()
        .with_context(|| format!("POST /crawls answered {job}"))?;

    // `/stats` once a second: what counts as servable now; the first
    // sample before any request, so none is left out for want of one.
    let servable = async |http: &reqwest::Client, url: &str| -> Option<u64> {
        let stats: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
        stats["servable"].as_u64()
    };
    let stats_url = format!("http://{api}/stats");
    shared.servable.store(
        servable(&http, &stats_url).await.unwrap_or(0),
        Ordering::Relaxed,
    );
    {
        let (shared, stop, http) = (shared.clone(), stop.clone(), http.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            while !stop.is_cancelled() {
                tick.tick().await;
                // An API that does not answer says nothing about the pool.
                let Some(n) = servable(&http, &stats_url).await else {
                    continue;
                };
                shared.servable.store(n, Ordering::Relaxed);
                if let Some(m) = shared.minute() {
                    m.servable_min.fetch_min(n, Ordering::Relaxed);
                    m.servable_max.fetch_max(n, Ordering::Relaxed);
                }
            }
        });
    }
    // The daemon's RSS, fds and threads every 2 s.
    {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(2));
            while !stop.is_cancelled() {
                tick.tick().await;
                if let (Some((rss, fds, threads)), Some(m)) = (proc_sample(pid), shared.minute()) {
                    m.rss_kib.fetch_max(rss, Ordering::Relaxed);
                    m.fds.fetch_max(fds, Ordering::Relaxed);
                    m.threads.fetch_max(threads, Ordering::Relaxed);
                }
            }
        });
    }
    // The steady client and the burst clients.
    for c in 0..=BURST_CLIENTS {
        let steady = c == 0;
        let (shared, stop) = (shared.clone(), stop.clone());
        let gw = client(Duration::from_secs(60), Some(&format!("http://{gateway}")))?;
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(STEADY_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut page = c * 7_919;
            while !stop.is_cancelled() {
                if steady {
                    tick.tick().await;
                } else if !BURST.contains(&shared.second_of_minute()) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                page = (page + 1) % PAGES;
                let ok = gateway_get(&gw, c, site, page, &shared).await;
                if !ok && !steady {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        });
    }
    // `/proxy` answers against the proxies down at the time.
    {
        let (shared, stop, http) = (shared.clone(), stop.clone(), http.clone());
        let url = format!("http://{api}/proxy?format=text");
        tasks.spawn(async move {
            let mut tick = tokio::time::interval(PROXY_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.is_cancelled() {
                tick.tick().await;
                let answer = match http.get(&url).send().await {
                    Ok(r) => {
                        let status = r.status().as_u16();
                        (status, r.text().await.unwrap_or_default())
                    }
                    Err(_) => (0, String::new()),
                };
                let Some(m) = shared.minute() else { break };
                match answer {
                    (200, body) => {
                        m.proxy_answers.fetch_add(1, Ordering::Relaxed);
                        if shared.down.lock().unwrap().contains(body.trim()) {
                            m.proxy_dead.fetch_add(1, Ordering::Relaxed);
                            shared.note("dead_answer", body.trim());
                        }
                    }
                    (404, _) => {
                        m.proxy_404.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        m.proxy_other.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    // Proxies go down and come back once a minute.
    let churn = {
        let (shared, stop) = (shared.clone(), stop.clone());
        let seed = std::env::var("SOAK_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20);
        tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut taken_down: Vec<usize> = Vec::new();
            for m in 0..minutes {
                let at = shared.started + Duration::from_secs(m as u64 * 60 + CHURN_AT);
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = stop.cancelled() => break,
                }
                // Those that went down a minute ago come back first...
                {
                    let mut down = shared.down.lock().unwrap();
                    for &i in &taken_down {
                        down.remove(&proxy_url(i));
                    }
                }
                let failed = farm.control("revive", &taken_down).await?;
                if !failed.is_empty() {
                    // Still down, then: say so and go on.
                    eprintln!("warning: proxies {failed:?} could not listen again");
                    shared.mark_down(&failed);
                }
                shared.minutes[m]
                    .revived
                    .store(taken_down.len() as u64, Ordering::Relaxed);
                // ...then 10–30% of the others go down.
                let mut up: Vec<usize> = (0..PROXIES)
                    .filter(|&i| !dead_at_start(i) && !taken_down.contains(&i))
                    .collect();
                up.shuffle(&mut rng);
                let share: f64 = rng.random_range(0.10..=0.30);
                let listening = PROXIES - (0..PROXIES).filter(|&i| dead_at_start(i)).count();
                up.truncate((listening as f64 * share).round() as usize);
                farm.control("kill", &up).await?;
                shared.mark_down(&up);
                shared.note("killed", &up.len().to_string());
                shared.minutes[m]
                    .killed
                    .store(up.len() as u64, Ordering::Relaxed);
                taken_down = up;
            }
            Ok::<_, anyhow::Error>(farm)
        })
    };

    println!(
        "\n{:>3} | {:>6} {:>7} {:>5} {:>4} {:>4} {:>4} {:>4} {:>4} {:>5} {:>9} | {:>6} {:>5} {:>5} | {:>12} | {:>8} | {:>7} | {:>5} {:>6} {:>4} {:>4}",
        "min",
        "gw req",
        "200s",
        "503",
        "502",
        "403",
        "429",
        "oth",
        "err",
        "excl",
        "p50/p99ms",
        "/proxy",
        "dead",
        "404",
        "crawl",
        "servable",
        "down/up",
        "cpu%",
        "rss MB",
        "fds",
        "thr"
    );
    let mut crawl_pages = Vec::with_capacity(minutes);
    let mut cpu_before = common::cpu_seconds(pid);
    for (m, row) in shared.minutes.iter().enumerate() {
        tokio::time::sleep_until(
            (shared.started + Duration::from_secs(60 * (m as u64 + 1))).into(),
        )
        .await;
        let cpu = common::cpu_seconds(pid);
        let cpu_share = (cpu - cpu_before) / 60.0;
        cpu_before = cpu;
        let job = get_json(&http, &format!("http://{api}/crawls/{job_id}")).await;
        let pages = job["progress"]["pages"].as_u64().unwrap_or(0);
        let failed = job["progress"]["failed"].as_u64().unwrap_or(0);
        // Pages fetched so far (failed ones are not), never going back.
        let fetched = pages
            .saturating_sub(failed)
            .max(crawl_pages.last().map_or(0, |c: &(u64, _)| c.0));
        crawl_pages.push((fetched, job["state"].clone()));
        let (p50, p99) = {
            let mut ms = row.gw_ms.lock().unwrap().clone();
            ms.sort_unstable();
            let at = |p: f64| {
                ms.get(((ms.len() as f64 * p) as usize).min(ms.len().saturating_sub(1)))
                    .copied()
                    .unwrap_or(0)
            };
            (at(0.5), at(0.99))
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let servable_min = load(&row.servable_min);
        println!(
            "{:>3} | {:>6} {:>6.2}% {:>5} {:>4} {:>4} {:>4} {:>4} {:>4} {:>5} {:>9} | {:>6} {:>5} {:>5} | {:>12} | {:>8} | {:>7} | {:>4.1}% {:>6.1} {:>4} {:>4}",
            m + 1,
            row.gw_counted(),
            row.ok_share().unwrap_or(0.0) * 100.0,
            load(&row.gw_503),
            load(&row.gw_502),
            load(&row.gw_403),
            load(&row.gw_429),
            load(&row.gw_other),
            load(&row.gw_error),
            load(&row.gw_excluded),
            format!("{p50}/{p99}"),
            load(&row.proxy_answers),
            load(&row.proxy_dead),
            load(&row.proxy_404),
            format!(
                "{} (+{})",
                crawl_pages[m].0,
                crawl_pages[m].0 - m.checked_sub(1).map_or(0, |p| crawl_pages[p].0)
            ),
            format!(
                "{}-{}",
                if servable_min == u64::MAX {
                    0
                } else {
                    servable_min
                },
                load(&row.servable_max)
            ),
            format!("-{}/+{}", load(&row.killed), load(&row.revived)),
            cpu_share * 100.0,
            load(&row.rss_kib) as f64 / 1024.0,
            load(&row.fds),
            load(&row.threads),
        );
        std::io::stdout().flush()?;
    }
    stop.cancel();
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    shared.answers.lock().unwrap().flush()?;
    shared.deaths.lock().unwrap().flush()?;
    let farm = churn.await??;

    let stats = get_json(&http, &format!("http://{api}/stats")).await;
    println!("\n/stats gateway at the end: {}", stats["gateway"]);
    let job = get_json(&http, &format!("http://{api}/crawls/{job_id}")).await;
    println!(
        "crawl job {job_id}: state {}, progress {}",
        job["state"], job["progress"]
    );

    // A graceful stop, as systemd asks for one.
    let stopping = Instant::now();
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    let exit = match tokio::time::timeout(Duration::from_secs(20), daemon.wait()).await {
        Ok(status) => format!("{}", status?),
        Err(_) => {
            daemon.kill().await?;
            "still running after 20 s; killed".to_owned()
        }
    };
    println!(
        "serve stopped on SIGTERM after {:.1}s: {exit}",
        stopping.elapsed().as_secs_f64()
    );
    drop(farm.stdin);
    let mut farm_child = farm.child;
    let _ = tokio::time::timeout(Duration::from_secs(5), farm_child.wait()).await;

    Ok(verdict(&shared.minutes, &crawl_pages))
}

/// One GET through the gateway for page `page` by client `c`, counted in
/// the minute it ends in; whether it was answered with the page.
async fn gateway_get(
    gw: &reqwest::Client,
    c: usize,
    site: SocketAddr,
    page: usize,
    shared: &Shared,
) -> bool {
    let counted = shared.servable.load(Ordering::Relaxed) > 0;
    let sent = Instant::now();
    let result = gw.get(format!("http://{site}/p/{page}")).send().await;
    let outcome = match result {
        Ok(r) => {
            let status = r.status().as_u16();
            match r.text().await {
                Ok(body) => Some((status, body)),
                Err(_) => None,
            }
        }
        Err(_) => None,
    };
    let Some(m) = shared.minute() else {
        return false;
    };
    {
        // The gateway's own errors are JSON with a code (no_proxy, …).
        let code = outcome
            .as_ref()
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(body).ok())
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let _ = writeln!(
            shared.answers.lock().unwrap(),
            "{},{c},{},{code},{}",
            sent.duration_since(shared.started).as_millis(),
            outcome.as_ref().map_or(0, |(status, _)| *status),
            sent.elapsed().as_millis()
        );
    }
    if !counted {
        m.gw_excluded.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let (counter, ok) = match &outcome {
        // The site's page itself, not a proxy's or a portal's.
        Some((200, body)) if body.contains(&format!("<h1>Page {page}</h1>")) => {
            m.gw_ms
                .lock()
                .unwrap()
                .push(sent.elapsed().as_millis() as u32);
            (&m.gw_ok, true)
        }
        Some((503, _)) => (&m.gw_503, false),
        Some((502, _)) => (&m.gw_502, false),
        Some((403, _)) => (&m.gw_403, false),
        Some((429, _)) => (&m.gw_429, false),
        Some(_) => (&m.gw_other, false),
        None => (&m.gw_error, false),
    };
    counter.fetch_add(1, Ordering::Relaxed);
    ok
}

/// Prints the pass/fail lines; whether all passed.
fn verdict(minutes: &[Minute], crawl: &[(u64, serde_json::Value)]) -> bool {
    let pct = |x: f64| format!("{:.2}%", x * 100.0);
    let mut all = true;
    let mut line = |name: &str, pass: Option<bool>, detail: String| {
        let word = match pass {
            Some(true) => "PASS",
            Some(false) => "FAIL",
            None => "n/a ",
        };
        all &= pass != Some(false);
        println!("  {word}  {name}: {detail}");
    };
    println!("\nsummary over {} minutes:", minutes.len());

    let low: Vec<String> = minutes
        .iter()
        .enumerate()
        .filter(|(_, m)| m.ok_share().is_none_or(|s| s < MIN_OK_SHARE))
        .map(|(i, m)| match m.ok_share() {
            Some(s) => format!("{} ({})", i + 1, pct(s)),
            None => format!("{} (nothing counted)", i + 1),
        })
        .collect();
    let (ok, n) = minutes.iter().fold((0, 0), |(o, n), m| {
        (o + m.gw_ok.load(Ordering::Relaxed), n + m.gw_counted())
    });
    line(
        "every minute >= 99% gateway 200s while servable",
        Some(low.is_empty()),
        format!(
            "{ok} of {n} in all ({}); minutes below: {}",
            pct(ok as f64 / n.max(1) as f64),
            if low.is_empty() {
                "none".to_owned()
            } else {
                low.join(", ")
            }
        ),
    );

    let high: Vec<String> = minutes
        .iter()
        .enumerate()
        .filter(|(_, m)| m.dead_share().is_some_and(|s| s > MAX_DEAD_SHARE))
        .map(|(i, m)| format!("{} ({})", i + 1, pct(m.dead_share().unwrap_or(0.0))))
        .collect();
    let (dead, answers) = minutes.iter().fold((0, 0), |(d, a), m| {
        (
            d + m.proxy_dead.load(Ordering::Relaxed),
            a + m.proxy_answers.load(Ordering::Relaxed),
        )
    });
    line(
        "every minute <= 1% of /proxy answers dead",
        Some(high.is_empty() && answers > 0),
        format!(
            "{dead} of {answers} in all ({}); minutes above: {}",
            pct(dead as f64 / answers.max(1) as f64),
            if high.is_empty() {
                "none".to_owned()
            } else {
                high.join(", ")
            }
        ),
    );

    // The first minute holds the start-up; compare the last with the second.
    for (name, unit, digits, of) in [
        (
            "RSS flat",
            "MB",
            1,
            (|m: &Minute| m.rss_kib.load(Ordering::Relaxed) as f64 / 1024.0) as fn(&Minute) -> f64,
        ),
        ("open fds flat", "", 0, |m: &Minute| {
            m.fds.load(Ordering::Relaxed) as f64
        }),
    ] {
        let peaks: Vec<f64> = minutes.iter().map(of).collect();
        let name = format!("{name} (last minute's peak <= {FLAT} x the second's)");
        if peaks.len() < 3 {
            line(&name, None, "needs at least 3 minutes".into());
            continue;
        }
        let (second, last) = (peaks[1], peaks[peaks.len() - 1]);
        let each: Vec<String> = peaks.iter().map(|p| format!("{p:.0}")).collect();
        line(
            &name,
            Some(last <= second * FLAT),
            format!(
                "second {second:.digits$}{unit}, last {last:.digits$}{unit} ({:.2}x); per minute {}",
                last / second.max(1.0),
                each.join(" ")
            ),
        );
    }

    let pace = (60.0 / CRAWL_DELAY * MIN_CRAWL_PACE).ceil() as u64;
    let mut before = 0;
    let mut slow = Vec::new();
    for (i, (pages, _)) in crawl.iter().enumerate() {
        // The first minute holds the job's start (posted once the daemon
        // answers; robots.txt first), as it holds the daemon's for RSS.
        if i > 0 && pages - before < pace {
            slow.push(format!("{} (+{})", i + 1, pages - before));
        }
        before = *pages;
    }
    line(
        &format!(
            "the crawl job fetched >= {pace} pages every minute after the first (a quarter of its Crawl-delay's pace)"
        ),
        Some(slow.is_empty()),
        format!(
            "{before} pages, state {}; minutes below: {}",
            crawl
                .last()
                .map_or(serde_json::Value::Null, |c| c.1.clone()),
            if slow.is_empty() {
                "none".to_owned()
            } else {
                slow.join(", ")
            }
        ),
    );
    println!("result: {}", if all { "PASS" } else { "FAIL" });
    all
}

/// `GET url` as JSON; `null` when there is no answer (the daemon may be
/// stopping), an empty value when it is not JSON.
async fn get_json(http: &reqwest::Client, url: &str) -> serde_json::Value {
    match http.get(url).send().await {
        Ok(r) => r.json().await.unwrap_or_default(),
        Err(_) => serde_json::Value::Null,
    }
}
