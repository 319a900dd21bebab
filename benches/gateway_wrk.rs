//! `cargo bench --bench gateway_wrk`: the gateway as users run it
//! (`proxywarden serve`, a process of its own, on proxies it harvested and
//! checked) under wrk's load, against the same load sent to one upstream
//! proxy directly.
//!
//! - `plain`: `wrk -t2 -c32 --latency` keep-alive GETs for a small page,
//!   absolute-form (as a proxy client sends them), alternating slices
//!   between (a) one upstream proxy directly and (b) the gateway in front
//!   of the same kind of upstreams. It prints both rates and their ratio
//!   (target ≥ 0.9), both p50s and the gateway's added p50 (target
//!   ≤ 0.3 ms), and the daemon's CPU per request (user + sys of its
//!   process).
//! - `connect`: new CONNECT tunnels (connect, CONNECT, one byte each way,
//!   close) from 32 concurrent clients in this process, alternating between
//!   one upstream directly and the gateway: tunnels/s and the daemon's CPU
//!   per tunnel.
//!
//! When `GATEWAY_BENCH_OLD_BIN` names an older `proxywarden` binary (e.g.
//! commit f7b9d6a built in a worktree), a daemon of it runs beside this
//! build's, and both passes take turns between the two: the ratios new ÷
//! old of the rates (tunnels/s target ≥ 1.5) and of the CPU per request.
//!
//! The judge, the site, a TCP echo target and 8 upstream proxies (kept-alive
//! connections to clients and to the site, as most real proxies keep them)
//! run in a child process (`--serve-farm`) so that their CPU is not the
//! daemon's. wrk, the farm and the daemon share this machine's cores: the
//! rate ratio is bounded by that sharing, and the daemon's CPU per request
//! is its own cost. `GATEWAY_BENCH_PASS=plain|connect` runs one pass;
//! `GATEWAY_BENCH_SECS` sets the seconds per path (6), run in 3 alternating
//! slices. wrk is Debian's package `wrk`; without it the plain pass says so
//! and is skipped. Files are kept in `target/tmp/gateway_wrk/`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use common::fakes::{EchoServer, FakeHttpProxy, HttpProxyOpts, raise_nofile_limit, tunnel_once};
use common::judges::Judge;
use common::site::{Reply, Site, SiteOpts};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

const FARM_ARG: &str = "--serve-farm";
const OLD_BIN_ENV: &str = "GATEWAY_BENCH_OLD_BIN";
/// Upstream proxies in the farm.
const UPSTREAMS: usize = 8;
/// wrk's connections, and the concurrent tunnel clients.
const CONNECTIONS: usize = 32;
/// Alternating slices per path.
const SLICES: u32 = 3;

fn main() -> ExitCode {
    if std::env::args().any(|a| a == FARM_ARG) {
        serve_farm();
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(measure()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gateway_wrk: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Seconds each path runs in a pass.
fn run_for() -> Duration {
    let secs = std::env::var("GATEWAY_BENCH_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(6.0);
    Duration::from_secs_f64(secs)
}

// ---------------------------------------------------------------------------
// The child: judge, site, echo target, upstream proxies

fn serve_farm() {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        let judge = Judge::plain().await;
        let site = Site::start(SiteOpts::routes(vec![("/", Reply::text("ok"))])).await;
        let echo = EchoServer::start().await;
        let mut proxies = Vec::new();
        for _ in 0..UPSTREAMS {
            proxies.push(
                FakeHttpProxy::start(HttpProxyOpts {
                    connect: true,
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
            writeln!(out, "echo {}", echo.addr()).expect("write to the parent");
            for p in &proxies {
                writeln!(out, "proxy {}", p.addr()).expect("write to the parent");
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(_)) = lines.next_line().await {}
        drop(proxies);
    });
    rt.shutdown_background();
}

// ---------------------------------------------------------------------------
// The parent: daemons, wrk, tunnel clients

struct Farm {
    pid: u32,
    judge: String,
    site: SocketAddr,
    echo: SocketAddr,
    proxies: Vec<SocketAddr>,
}

/// A `proxywarden serve` with its gateway.
struct Daemon {
    name: &'static str,
    pid: u32,
    gateway: SocketAddr,
    _child: Child,
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

async fn cli(bin: &str, config: &Path, args: &[&str]) -> anyhow::Result<()> {
    let out = common::binary::run(bin, config, args).await?;
    anyhow::ensure!(
        out.status.success(),
        "{bin} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// Runs `bin` as a user would on the farm's proxies: `harvest`,
/// `check --all`, then `serve` with the gateway on; returns once the
/// API answers.
async fn start_daemon(
    name: &'static str,
    bin: &str,
    dir: &Path,
    farm: &Farm,
) -> anyhow::Result<Daemon> {
    std::fs::create_dir_all(dir)?;
    let list = dir.join("proxies.txt");
    let lines: Vec<String> = farm.proxies.iter().map(|p| p.to_string()).collect();
    std::fs::write(&list, lines.join("\n") + "\n")?;
    let api = free_port()?;
    let gateway = free_port()?;
    let config = dir.join("proxywarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\npath = \"{db}\"\n\n\
             [harvest]\nallow_private_addresses = true\nschedule = \"0 0 0 1 1 *\"\n\n\
             [check]\njudges = [{{ url = \"{judge}\", marker = \"proxywarden-judge\" }}]\n\
             https = false\n\n\
             [api]\nlisten = \"{api}\"\n\n\
             [gateway]\nlisten = \"{gateway}\"\n\n\
             [[sources]]\nname = \"farm\"\nurl = \"{list}\"\nformat = \"text\"\nscheme = \"http\"\n",
            db = dir.join("bench.db").display(),
            judge = farm.judge,
            list = list.display(),
        ),
    )?;
    cli(bin, &config, &["harvest"]).await?;
    cli(bin, &config, &["check", "--all"]).await?;
    let (mut child, pid) = common::binary::spawn_serve(bin, &config, &dir.join("daemon.log"))?;
    common::binary::wait_healthy(&mut child, api, Duration::from_secs(30))
        .await
        .with_context(|| format!("{bin}; see {}", dir.display()))?;
    // Warm-up: every upstream used once, connections opened.
    for _ in 0..UPSTREAMS * 4 {
        anyhow::ensure!(
            tunnel_once(gateway, farm.echo).await,
            "{name}: a tunnel through the gateway failed; see {}",
            dir.display()
        );
    }
    Ok(Daemon {
        name,
        pid,
        gateway,
        _child: child,
    })
}

async fn measure() -> anyhow::Result<()> {
    raise_nofile_limit();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gateway_wrk");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;

    let mut child = Command::new(std::env::current_exe()?)
        .arg(FARM_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let _farm_stdin = child.stdin.take().expect("piped stdin");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut farm = Farm {
        pid: child.id().context("the farm exited")?,
        judge: String::new(),
        site: free_port()?,
        echo: free_port()?,
        proxies: Vec::new(),
    };
    loop {
        let line = lines.next_line().await?.context("the farm exited")?;
        match line.split_once(' ') {
            Some(("judge", url)) => farm.judge = url.to_owned(),
            Some(("site", a)) => farm.site = a.parse()?,
            Some(("echo", a)) => farm.echo = a.parse()?,
            Some(("proxy", a)) => farm.proxies.push(a.parse()?),
            _ if line == "ready" => break,
            _ => anyhow::bail!("unexpected farm line {line:?}"),
        }
    }

    let new = start_daemon(
        "new",
        env!("CARGO_BIN_EXE_proxywarden"),
        &dir.join("new"),
        &farm,
    )
    .await?;
    let old = match std::env::var_os(OLD_BIN_ENV) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            let bin = bin.to_str().context("the old binary's path is not UTF-8")?;
            Some(start_daemon("old", bin, &dir.join("old"), &farm).await?)
        }
        None => {
            println!(
                "[connect] {OLD_BIN_ENV} is not set: tunnels through this build only, \
                 no ratio against an older one"
            );
            None
        }
    };
    let only = std::env::var("GATEWAY_BENCH_PASS").ok();
    let runs = |p: &str| only.as_deref().is_none_or(|o| o == p);
    println!(
        "[farm] {UPSTREAMS} upstream proxies keeping connections to clients and to the site; \
         {:.0} s per path in {SLICES} alternating slices",
        run_for().as_secs_f64()
    );
    if runs("plain") {
        plain(&farm, &new, old.as_ref(), &dir).await?;
    }
    if runs("connect") {
        connect(&farm, &new, old.as_ref()).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// plain: wrk

/// What one wrk run reported.
#[derive(Clone, Copy, Debug, Default)]
struct WrkRun {
    requests: u64,
    secs: f64,
    /// Latency percentiles, ms.
    p50: f64,
    p99: f64,
    /// Answers other than 2xx/3xx, and socket errors.
    bad: u64,
}

/// Parses wrk's `--latency` report.
fn parse_wrk(out: &str) -> anyhow::Result<WrkRun> {
    let mut run = WrkRun::default();
    let ms = |v: &str| -> Option<f64> {
        let (n, unit) = v.split_at(v.find(|c: char| c.is_ascii_alphabetic())?);
        let n: f64 = n.parse().ok()?;
        Some(match unit {
            "us" => n / 1000.0,
            "ms" => n,
            "s" => n * 1000.0,
            "m" => n * 60_000.0,
            _ => return None,
        })
    };
    for line in out.lines().map(str::trim) {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["50%", v] => run.p50 = ms(v).context("wrk's p50")?,
            ["99%", v] => run.p99 = ms(v).context("wrk's p99")?,
            [n, "requests", "in", t, ..] => {
                run.requests = n.parse()?;
                run.secs = ms(t.trim_end_matches(',')).context("wrk's duration")? / 1000.0;
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => run.bad += n.parse::<u64>()?,
            ["Socket", "errors:", rest @ ..] => {
                for w in rest.chunks(2) {
                    if let [_, n] = w {
                        run.bad += n.trim_end_matches(',').parse::<u64>().unwrap_or(0);
                    }
                }
            }
            _ => {}
        }
    }
    anyhow::ensure!(
        run.requests > 0 && run.p50 > 0.0,
        "no figures in wrk's output:\n{out}"
    );
    Ok(run)
}

/// wrk against `proxy` for `secs`, asking for the site's page in absolute
/// form.
async fn wrk(script: &Path, proxy: SocketAddr, secs: f64) -> anyhow::Result<WrkRun> {
    let out = Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{CONNECTIONS}"),
            &format!("-d{}s", secs.round().max(1.0) as u64),
        ])
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(format!("http://{proxy}/"))
        .output()
        .await
        .context("run wrk")?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "wrk failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    parse_wrk(&text)
}

/// Runs of one path with the CPU its processes used.
#[derive(Default)]
struct Side {
    runs: Vec<WrkRun>,
    cpu_daemon: f64,
    cpu_farm: f64,
}

impl Side {
    fn requests(&self) -> u64 {
        self.runs.iter().map(|r| r.requests).sum()
    }

    fn rate(&self) -> f64 {
        self.requests() as f64 / self.runs.iter().map(|r| r.secs).sum::<f64>().max(1e-9)
    }

    /// The median of the slices' p50s and p99s.
    fn p(&self, p: fn(&WrkRun) -> f64) -> f64 {
        let mut v: Vec<f64> = self.runs.iter().map(p).collect();
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    }

    fn bad(&self) -> u64 {
        self.runs.iter().map(|r| r.bad).sum()
    }

    fn us_per(&self, cpu: f64) -> f64 {
        cpu * 1e6 / self.requests().max(1) as f64
    }
}

async fn plain(farm: &Farm, new: &Daemon, old: Option<&Daemon>, dir: &Path) -> anyhow::Result<()> {
    if std::process::Command::new("wrk")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("[plain] SKIPPED: wrk is not installed (Debian: apt-get install -y wrk)");
        return Ok(());
    }
    let script = dir.join("absolute.lua");
    std::fs::write(
        &script,
        format!(
            "wrk.method = \"GET\"\nwrk.path = \"http://{site}/\"\nwrk.headers[\"Host\"] = \"{site}\"\n",
            site = farm.site
        ),
    )?;
    let slice = run_for().as_secs_f64() / f64::from(SLICES);
    let daemons: Vec<&Daemon> = std::iter::once(new).chain(old).collect();
    // Warm-up: connections, the pool's picks, the first store writes.
    wrk(&script, farm.proxies[0], 1.0).await?;
    for d in &daemons {
        wrk(&script, d.gateway, 1.0).await?;
    }
    let mut direct = Side::default();
    let mut via: Vec<Side> = daemons.iter().map(|_| Side::default()).collect();
    let cpu = |pid: u32| (common::cpu_seconds(pid), common::cpu_seconds(farm.pid));
    for i in 0..SLICES as usize {
        // The direct path first, then the daemons, taking turns going first.
        let (d0, f0) = cpu(new.pid);
        direct
            .runs
            .push(wrk(&script, farm.proxies[0], slice).await?);
        let (d1, f1) = cpu(new.pid);
        direct.cpu_daemon += d1 - d0;
        direct.cpu_farm += f1 - f0;
        for k in 0..daemons.len() {
            let k = (k + i) % daemons.len();
            let d = daemons[k];
            let (d0, f0) = cpu(d.pid);
            via[k].runs.push(wrk(&script, d.gateway, slice).await?);
            let (d1, f1) = cpu(d.pid);
            via[k].cpu_daemon += d1 - d0;
            via[k].cpu_farm += f1 - f0;
        }
    }
    println!(
        "[plain] wrk -t2 -c{CONNECTIONS}, keep-alive, direct (one upstream): {:.0} requests/s, \
         p50 {:.3} ms, p99 {:.3} ms ({} bad); farm CPU {:.1} µs per request",
        direct.rate(),
        direct.p(|r| r.p50),
        direct.p(|r| r.p99),
        direct.bad(),
        direct.us_per(direct.cpu_farm),
    );
    for (d, side) in daemons.iter().zip(&via) {
        println!(
            "[plain] gateway ({}): {:.0} requests/s, p50 {:.3} ms, p99 {:.3} ms ({} bad); \
             ÷ direct {:.2} (target ≥ 0.9); added p50 {:.3} ms (target ≤ 0.3); daemon CPU \
             {:.1} µs per request, farm {:.1} µs",
            d.name,
            side.rate(),
            side.p(|r| r.p50),
            side.p(|r| r.p99),
            side.bad(),
            side.rate() / direct.rate().max(1e-9),
            side.p(|r| r.p50) - direct.p(|r| r.p50),
            side.us_per(side.cpu_daemon),
            side.us_per(side.cpu_farm),
        );
    }
    if let [new, old] = via.as_slice() {
        println!(
            "[plain] new ÷ old: {:.2}× requests/s, {:.2}× daemon CPU per request",
            new.rate() / old.rate().max(1e-9),
            new.us_per(new.cpu_daemon) / old.us_per(old.cpu_daemon).max(1e-9)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// connect: new tunnels

/// Tunnels opened through one path, and the CPU its daemon used.
#[derive(Default)]
struct Tunnels {
    done: u64,
    failed: u64,
    secs: f64,
    cpu: f64,
}

impl Tunnels {
    fn rate(&self) -> f64 {
        self.done as f64 / self.secs.max(1e-9)
    }

    fn us_per(&self) -> f64 {
        self.cpu * 1e6 / self.done.max(1) as f64
    }
}

/// `CONNECTIONS` clients opening tunnels through `proxies` in turn for
/// `run_for`; the CPU of `pid` meanwhile.
async fn tunnels(
    proxies: Vec<SocketAddr>,
    echo: SocketAddr,
    pid: Option<u32>,
    run_for: Duration,
) -> Tunnels {
    let done = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let proxies = Arc::new(proxies);
    let cpu0 = pid.map_or(0.0, common::cpu_seconds);
    let t0 = Instant::now();
    let workers: Vec<_> = (0..CONNECTIONS)
        .map(|w| {
            let (done, failed, stop, proxies) =
                (done.clone(), failed.clone(), stop.clone(), proxies.clone());
            tokio::spawn(async move {
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    let ok = tunnel_once(proxies[i % proxies.len()], echo).await;
                    let n = if ok { &done } else { &failed };
                    n.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    tokio::time::sleep(run_for).await;
    stop.store(true, Ordering::Relaxed);
    let counted = done.load(Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    for w in workers {
        let _ = w.await;
    }
    Tunnels {
        done: counted,
        failed: failed.load(Ordering::Relaxed),
        secs,
        cpu: pid.map_or(0.0, common::cpu_seconds) - cpu0,
    }
}

async fn connect(farm: &Farm, new: &Daemon, old: Option<&Daemon>) {
    let slice = run_for() / SLICES;
    let mut direct = Tunnels::default();
    let mut daemons: Vec<(&Daemon, Tunnels)> = std::iter::once(new)
        .chain(old)
        .map(|d| (d, Tunnels::default()))
        .collect();
    let add = |into: &mut Tunnels, t: Tunnels| {
        into.done += t.done;
        into.failed += t.failed;
        into.secs += t.secs;
        into.cpu += t.cpu;
    };
    for i in 0..SLICES {
        add(
            &mut direct,
            tunnels(vec![farm.proxies[0]], farm.echo, None, slice).await,
        );
        // Old and new take turns going first.
        let n = daemons.len();
        for k in 0..n {
            let (d, into) = &mut daemons[(k + i as usize) % n];
            add(
                into,
                tunnels(vec![d.gateway], farm.echo, Some(d.pid), slice).await,
            );
        }
    }
    println!(
        "[connect] {CONNECTIONS} clients, a new tunnel each time: direct (one upstream) {:.0} \
         tunnels/s ({} failed)",
        direct.rate(),
        direct.failed
    );
    for (d, t) in &daemons {
        println!(
            "[connect] gateway ({}) {:.0} tunnels/s ({} failed), {:.2}× direct; daemon CPU \
             {:.1} µs per tunnel",
            d.name,
            t.rate(),
            t.failed,
            t.rate() / direct.rate().max(1e-9),
            t.us_per()
        );
    }
    if let [(_, new), (_, old)] = daemons.as_slice() {
        println!(
            "[connect] new ÷ old: {:.2}× tunnels/s (target ≥ 1.5), {:.2}× CPU per tunnel",
            new.rate() / old.rate().max(1e-9),
            new.us_per() / old.us_per().max(1e-9)
        );
    }
}
