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
//! - Both passes also send the same load through a bare TCP relay in a
//!   process of its own (`--serve-relay`: accept, connect to the upstream,
//!   copy bytes both ways; no parsing, no pick) in front of the same
//!   upstream. It is the least any forwarding hop costs on these shared
//!   cores: its rate ÷ direct is the ceiling for the gateway's, and its CPU
//!   per request or tunnel the floor for the daemon's. The CPU of wrk and
//!   of the tunnel clients per request or tunnel is printed too.
//!
//! - `spread`: 300 upstreams, a daemon of their own, and haproxy (Debian's
//!   package, a child with a generated config; skipped, saying so, when it
//!   is not installed) in tcp mode balancing round-robin over the same
//!   300. The same wrk load goes to each in alternating slices, once with
//!   kept-alive client connections and once with `Connection: close`
//!   (where haproxy too takes a new upstream per request); then new CONNECT
//!   tunnels from 32 clients. Plain requests also go through haproxy in
//!   http mode (a new upstream per request, upstream connections kept for
//!   any request: the gateway's work, where tcp mode's is a relay's). It
//!   prints the rates, each process's CPU per request or tunnel (per
//!   request also split into user space and kernel, with context
//!   switches), how many of the 300 upstreams each side's requests reached
//!   (the farm counts the site's requests per upstream), the ratios
//!   gateway ÷ haproxy (targets, against tcp mode: rate ≥ 1, CPU ≤ 1,
//!   tunnels/s ≥ 1) and haproxy's http mode ÷ its tcp mode (what
//!   parsing each request costs haproxy itself). With `GATEWAY_BENCH_OLD_BIN`
//!   an older build's daemon is one more side, and new ÷ old is printed
//!   too.
//!
//! When `GATEWAY_BENCH_OLD_BIN` names an older `proxywarden` binary (e.g.
//! commit f7b9d6a built in a worktree), a daemon of it runs beside this
//! build's, and both passes take turns between the two: the ratios new ÷
//! old of the rates (tunnels/s target ≥ 1.5) and of the CPU per request,
//! as totals and as the median (and range) of the ratios of the slices
//! run next to each other. Every path gets a warm-up first, and 6 slices
//! by default, so that each of relay, new and old goes first, second and
//! third equally often; a run with the same binary as old shows the noise.
//!
//! The judge, the site, a TCP echo target and 8 upstream proxies (kept-alive
//! connections to clients and to the site, as most real proxies keep them)
//! run in a child process (`--serve-farm`) so that their CPU is not the
//! daemon's. wrk, the farm and the daemon share this machine's cores: the
//! rate ratio is bounded by that sharing, and the daemon's CPU per request
//! is its own cost. `GATEWAY_BENCH_PASS=plain|connect|spread` runs one pass;
//! `GATEWAY_BENCH_SECS` sets the seconds per path (6), run in 3 alternating
//! slices (6 with an old binary; `GATEWAY_BENCH_SLICES` sets them). wrk is Debian's package `wrk`; without it the plain pass says so
//! and is skipped. Files are kept in `target/tmp/gateway_wrk/`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
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
const RELAY_ARG: &str = "--serve-relay";
const OLD_BIN_ENV: &str = "GATEWAY_BENCH_OLD_BIN";
/// Upstream proxies in the farm.
const UPSTREAMS: usize = 8;
/// wrk's connections, and the concurrent tunnel clients.
const CONNECTIONS: usize = 32;
/// Alternating slices per path, unless `GATEWAY_BENCH_SLICES` says.
const SLICES: u32 = 3;
/// Alternating slices per path when an older binary runs beside this
/// build's: a multiple of the three hops (relay, new, old) so each goes
/// first, second and third equally often.
const SLICES_OLD: u32 = 6;

/// Slices per path: `GATEWAY_BENCH_SLICES`, else `SLICES_OLD` when an older
/// binary is compared, else `SLICES`.
fn slices() -> u32 {
    std::env::var("GATEWAY_BENCH_SLICES")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(if std::env::var_os(OLD_BIN_ENV).is_some() {
            SLICES_OLD
        } else {
            SLICES
        })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        let upstreams = args.get(i + 1).and_then(|a| a.parse().ok());
        serve_farm(upstreams.unwrap_or(UPSTREAMS));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == RELAY_ARG) {
        let upstream = args.get(i + 1).and_then(|a| a.parse().ok());
        let Some(upstream) = upstream else {
            eprintln!("gateway_wrk: {RELAY_ARG} needs the upstream's address");
            return ExitCode::FAILURE;
        };
        serve_relay(upstream);
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

fn serve_farm(upstreams: usize) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        let judge = Judge::plain().await;
        let site = Site::start(SiteOpts::routes(vec![("/", Reply::text("ok"))])).await;
        let echo = EchoServer::start().await;
        let mut proxies = Vec::new();
        for _ in 0..upstreams {
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
        // Each `served` line asks which upstreams forwarded a request to the
        // site since the last one: their places, comma-separated.
        let site = site.addr.to_string();
        let mut last = vec![0; proxies.len()];
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if line != SERVED {
                continue;
            }
            let mut grew = Vec::new();
            for (i, (p, last)) in proxies.iter().zip(&mut last).enumerate() {
                let now = p.forwarded_to(&site);
                if now > *last {
                    grew.push(i.to_string());
                }
                *last = now;
            }
            let mut out = std::io::stdout().lock();
            writeln!(out, "{SERVED} {}", grew.join(",")).expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        drop(proxies);
    });
    rt.shutdown_background();
}

// ---------------------------------------------------------------------------
// The floor: a bare TCP relay in a child of its own

/// Accepts connections and relays each, byte for byte, to a new connection
/// to `upstream` until both sides end: what any forwarding hop does at
/// least, on the daemon's kind of runtime.
fn serve_relay(upstream: SocketAddr) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        raise_nofile_limit();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the relay");
        {
            let mut out = std::io::stdout().lock();
            let addr = listener.local_addr().expect("the relay's address");
            writeln!(out, "relay {addr}").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let accepting = async {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(async move {
                    let _ = client.set_nodelay(true);
                    let Ok(mut up) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = up.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut up).await;
                });
            }
        };
        let mut lines = BufReader::new(tokio::io::stdin()).lines();
        tokio::select! {
            _ = accepting => {}
            _ = async { while let Ok(Some(_)) = lines.next_line().await {} } => {}
        }
    });
    rt.shutdown_background();
}

/// The relay in front of `upstream`: its process id and address; it ends
/// when the returned child is dropped.
async fn start_relay(upstream: SocketAddr) -> anyhow::Result<(Child, u32, SocketAddr)> {
    let (mut child, stdin, mut lines) =
        common::binary::spawn_role(&[RELAY_ARG, &upstream.to_string()])?;
    // The relay runs until its stdin closes: with the child.
    child.stdin = Some(stdin);
    let pid = child.id().context("the relay exited")?;
    let line = lines.next_line().await?.context("the relay exited")?;
    let addr = line
        .strip_prefix("relay ")
        .with_context(|| format!("unexpected relay line {line:?}"))?
        .parse()?;
    Ok((child, pid, addr))
}

/// CPU seconds (user + sys) of this process's waited-for children (wrk),
/// to the microsecond.
fn children_cpu() -> f64 {
    let Ok(usage) = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
    else {
        return 0.0;
    };
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    secs(usage.user_time()) + secs(usage.system_time())
}

/// Process `pid`'s CPU seconds so far in user space and in the kernel
/// (from /proc, in clock ticks of 10 ms), and the context switches of all
/// its threads (voluntary and not); zeros once it is gone. What a request
/// costs a forwarding process splits so: its own work, and the kernel's
/// (socket calls, wake-ups) that any hop pays.
fn cpu_parts(pid: u32) -> (f64, f64, u64) {
    let ticks: Vec<u64> = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // utime and stime are the 14th and 15th fields, after the
            // command name (which may hold spaces).
            let after = s.rsplit_once(')')?.1.to_owned();
            Some(
                after
                    .split_whitespace()
                    .skip(11)
                    .take(2)
                    .filter_map(|v| v.parse().ok())
                    .collect(),
            )
        })
        .unwrap_or_default();
    let switches = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum();
    match ticks[..] {
        [user, sys] => (user as f64 / 100.0, sys as f64 / 100.0, switches),
        _ => (0.0, 0.0, switches),
    }
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

/// The bare TCP relay in front of the first upstream.
struct Relay {
    pid: u32,
    addr: SocketAddr,
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

    let only = std::env::var("GATEWAY_BENCH_PASS").ok();
    let runs = |p: &str| only.as_deref().is_none_or(|o| o == p);
    if only.as_deref() == Some("spread") {
        return spread(&dir).await;
    }
    let (_farm_child, farm) = start_farm(UPSTREAMS).await?;

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
    let (_relay_child, pid, addr) = start_relay(farm.proxies[0]).await?;
    let relay = Relay { pid, addr };
    println!(
        "[farm] {UPSTREAMS} upstream proxies keeping connections to clients and to the site; \
         {:.0} s per path in {} alternating slices",
        run_for().as_secs_f64(),
        slices()
    );
    if runs("plain") {
        plain(&farm, &relay, &new, old.as_ref(), &dir).await?;
    }
    if runs("connect") {
        connect(&farm, &relay, &new, old.as_ref()).await;
    }
    if only.is_none() {
        // The spread pass has a farm and a daemon of its own.
        drop((new, old));
        spread(&dir).await?;
    }
    Ok(())
}

/// The farm's line asking which upstreams forwarded a request to the site
/// since it was last asked, and the start of its answer.
const SERVED: &str = "served";

/// The farm child, ended when dropped, and the pipes to ask it with.
struct FarmChild {
    _child: Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl FarmChild {
    /// The places of the upstreams that forwarded a request to the site
    /// since the last call.
    async fn served(&mut self) -> anyhow::Result<Vec<usize>> {
        use tokio::io::AsyncWriteExt;
        self.stdin
            .write_all(format!("{SERVED}\n").as_bytes())
            .await?;
        self.stdin.flush().await?;
        let line = self.lines.next_line().await?.context("the farm exited")?;
        let list = line
            .strip_prefix(SERVED)
            .with_context(|| format!("unexpected farm line {line:?}"))?
            .trim();
        list.split(',')
            .filter(|i| !i.is_empty())
            .map(|i| i.parse().context("an upstream's place"))
            .collect()
    }
}

/// The farm child with `upstreams` upstream proxies; it ends when the
/// returned child is dropped.
async fn start_farm(upstreams: usize) -> anyhow::Result<(FarmChild, Farm)> {
    let (child, stdin, mut lines) =
        common::binary::spawn_role(&[FARM_ARG, &upstreams.to_string()])?;
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
    let child = FarmChild {
        _child: child,
        stdin,
        lines,
    };
    Ok((child, farm))
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
    /// The daemon's (or relay's) CPU seconds in each slice.
    cpu_slices: Vec<f64>,
    cpu_daemon: f64,
    cpu_farm: f64,
    cpu_wrk: f64,
    /// The daemon's CPU in user space and in the kernel, and its context
    /// switches (the spread pass).
    cpu_user: f64,
    cpu_sys: f64,
    switches: u64,
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

    /// Each slice's rate and the daemon's CPU per request in it.
    fn per_slice(&self) -> Vec<(f64, f64)> {
        self.runs
            .iter()
            .zip(&self.cpu_slices)
            .map(|(r, cpu)| {
                (
                    r.requests as f64 / r.secs.max(1e-9),
                    cpu / r.requests.max(1) as f64,
                )
            })
            .collect()
    }
}

/// Each slice's rate and CPU per request or tunnel.
type PerSlice = Vec<(f64, f64)>;

/// The median and the range of `v`.
fn median_range(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    let (Some(lo), Some(hi)) = (v.first(), v.last()) else {
        return (0.0, 0.0, 0.0);
    };
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    };
    (median, *lo, *hi)
}

/// new ÷ old as the median of the ratios of slices run next to each other
/// (each pair in one round, on the machine as it was then), with their
/// range: a slow spell on the shared cores moves one pair, not the sum.
/// `per_slice` gives each slice's rate and CPU per request or tunnel.
fn paired_ratios(new: &[(f64, f64)], old: &[(f64, f64)]) -> String {
    let ratio = |f: fn(&(f64, f64)) -> f64| {
        median_range(
            new.iter()
                .zip(old)
                .map(|(n, o)| f(n) / f(o).max(1e-12))
                .collect(),
        )
    };
    let (rate, rate_lo, rate_hi) = ratio(|s| s.0);
    let (cpu, cpu_lo, cpu_hi) = ratio(|s| s.1);
    format!(
        "{rate:.2}× (slices {rate_lo:.2}–{rate_hi:.2}), {cpu:.2}× CPU per one (slices \
         {cpu_lo:.2}–{cpu_hi:.2}); median of {} paired slices",
        new.len().min(old.len())
    )
}

async fn plain(
    farm: &Farm,
    relay: &Relay,
    new: &Daemon,
    old: Option<&Daemon>,
    dir: &Path,
) -> anyhow::Result<()> {
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
    let slice = run_for().as_secs_f64() / f64::from(slices());
    let daemons: Vec<&Daemon> = std::iter::once(new).chain(old).collect();
    // The relay first, then the daemons: the paths through one more hop.
    let hops: Vec<(u32, SocketAddr)> = std::iter::once((relay.pid, relay.addr))
        .chain(daemons.iter().map(|d| (d.pid, d.gateway)))
        .collect();
    // Warm-up: connections, the pool's picks, the first store writes.
    wrk(&script, farm.proxies[0], 1.0).await?;
    for (_, addr) in &hops {
        wrk(&script, *addr, 1.0).await?;
    }
    let mut direct = Side::default();
    let mut via: Vec<Side> = hops.iter().map(|_| Side::default()).collect();
    let cpu = |pid: u32| {
        (
            common::cpu_seconds(pid),
            common::cpu_seconds(farm.pid),
            children_cpu(),
        )
    };
    for i in 0..slices() as usize {
        // The direct path first, then the others, taking turns going first.
        let (d0, f0, w0) = cpu(new.pid);
        direct
            .runs
            .push(wrk(&script, farm.proxies[0], slice).await?);
        let (d1, f1, w1) = cpu(new.pid);
        direct.cpu_daemon += d1 - d0;
        direct.cpu_farm += f1 - f0;
        direct.cpu_wrk += w1 - w0;
        for k in 0..hops.len() {
            let k = (k + i) % hops.len();
            let (pid, addr) = hops[k];
            let (d0, f0, w0) = cpu(pid);
            via[k].runs.push(wrk(&script, addr, slice).await?);
            let (d1, f1, w1) = cpu(pid);
            via[k].cpu_slices.push(d1 - d0);
            via[k].cpu_daemon += d1 - d0;
            via[k].cpu_farm += f1 - f0;
            via[k].cpu_wrk += w1 - w0;
        }
    }
    println!(
        "[plain] wrk -t2 -c{CONNECTIONS}, keep-alive, direct (one upstream): {:.0} requests/s, \
         p50 {:.3} ms, p99 {:.3} ms ({} bad); farm CPU {:.1} µs per request, wrk {:.1} µs",
        direct.rate(),
        direct.p(|r| r.p50),
        direct.p(|r| r.p99),
        direct.bad(),
        direct.us_per(direct.cpu_farm),
        direct.us_per(direct.cpu_wrk),
    );
    let (relayed, via) = via.split_first().expect("the relay's side");
    println!(
        "[plain] bare TCP relay (the floor of any hop): {:.0} requests/s, p50 {:.3} ms, p99 \
         {:.3} ms ({} bad); ÷ direct {:.2}; added p50 {:.3} ms; relay CPU {:.1} µs per \
         request, farm {:.1} µs, wrk {:.1} µs",
        relayed.rate(),
        relayed.p(|r| r.p50),
        relayed.p(|r| r.p99),
        relayed.bad(),
        relayed.rate() / direct.rate().max(1e-9),
        relayed.p(|r| r.p50) - direct.p(|r| r.p50),
        relayed.us_per(relayed.cpu_daemon),
        relayed.us_per(relayed.cpu_farm),
        relayed.us_per(relayed.cpu_wrk),
    );
    for (d, side) in daemons.iter().zip(via) {
        println!(
            "[plain] gateway ({}): {:.0} requests/s, p50 {:.3} ms, p99 {:.3} ms ({} bad); \
             ÷ direct {:.2} (target ≥ 0.9), ÷ relay {:.2}; added p50 {:.3} ms (target ≤ 0.3); \
             daemon CPU {:.1} µs per request, farm {:.1} µs, wrk {:.1} µs",
            d.name,
            side.rate(),
            side.p(|r| r.p50),
            side.p(|r| r.p99),
            side.bad(),
            side.rate() / direct.rate().max(1e-9),
            side.rate() / relayed.rate().max(1e-9),
            side.p(|r| r.p50) - direct.p(|r| r.p50),
            side.us_per(side.cpu_daemon),
            side.us_per(side.cpu_farm),
            side.us_per(side.cpu_wrk),
        );
    }
    if let [new, old] = via {
        println!(
            "[plain] new ÷ old: {:.2}× requests/s, {:.2}× daemon CPU per request (totals); \
             requests/s {}",
            new.rate() / old.rate().max(1e-9),
            new.us_per(new.cpu_daemon) / old.us_per(old.cpu_daemon).max(1e-9),
            paired_ratios(&new.per_slice(), &old.per_slice()),
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// connect: new tunnels

/// Tunnels opened through one path, and the CPU its daemon (or relay), the
/// farm and the clients (this process) used.
#[derive(Default)]
struct Tunnels {
    done: u64,
    failed: u64,
    secs: f64,
    cpu: f64,
    cpu_farm: f64,
    cpu_clients: f64,
}

impl Tunnels {
    fn rate(&self) -> f64 {
        self.done as f64 / self.secs.max(1e-9)
    }

    fn us_per(&self) -> f64 {
        self.per(self.cpu)
    }

    fn per(&self, cpu: f64) -> f64 {
        cpu * 1e6 / self.done.max(1) as f64
    }
}

/// `CONNECTIONS` clients opening tunnels through `proxies` in turn for
/// `run_for`; the CPU of `pid` meanwhile.
async fn tunnels(
    proxies: Vec<SocketAddr>,
    farm: &Farm,
    pid: Option<u32>,
    run_for: Duration,
) -> Tunnels {
    let echo = farm.echo;
    let me = std::process::id();
    let (farm0, me0) = (common::cpu_seconds(farm.pid), common::cpu_seconds(me));
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
        cpu_farm: common::cpu_seconds(farm.pid) - farm0,
        cpu_clients: common::cpu_seconds(me) - me0,
    }
}

async fn connect(farm: &Farm, relay: &Relay, new: &Daemon, old: Option<&Daemon>) {
    let slice = run_for() / slices();
    let mut direct = Tunnels::default();
    // The relay, then the daemons.
    let mut hops: Vec<(&str, u32, SocketAddr, Tunnels, PerSlice)> =
        std::iter::once(("bare TCP relay", relay.pid, relay.addr))
            .chain(
                std::iter::once(new)
                    .chain(old)
                    .map(|d| (d.name, d.pid, d.gateway)),
            )
            .map(|(name, pid, addr)| (name, pid, addr, Tunnels::default(), Vec::new()))
            .collect();
    // Warm-up: each path's connections and picks, as the plain pass does.
    for (_, pid, addr, _, _) in &hops {
        tunnels(vec![*addr], farm, Some(*pid), Duration::from_secs(1)).await;
    }
    let add = |into: &mut Tunnels, t: Tunnels| {
        into.done += t.done;
        into.failed += t.failed;
        into.secs += t.secs;
        into.cpu += t.cpu;
        into.cpu_farm += t.cpu_farm;
        into.cpu_clients += t.cpu_clients;
    };
    for i in 0..slices() {
        add(
            &mut direct,
            tunnels(vec![farm.proxies[0]], farm, None, slice).await,
        );
        // The others take turns going first.
        let n = hops.len();
        for k in 0..n {
            let (_, pid, addr, into, per) = &mut hops[(k + i as usize) % n];
            let t = tunnels(vec![*addr], farm, Some(*pid), slice).await;
            per.push((t.rate(), t.us_per()));
            add(into, t);
        }
    }
    println!(
        "[connect] {CONNECTIONS} clients, a new tunnel each time: direct (one upstream) {:.0} \
         tunnels/s ({} failed); CPU per tunnel: farm {:.1} µs, clients {:.1} µs",
        direct.rate(),
        direct.failed,
        direct.per(direct.cpu_farm),
        direct.per(direct.cpu_clients),
    );
    for (name, _, _, t, _) in &hops {
        let name = match *name {
            "new" | "old" => format!("gateway ({name})"),
            other => format!("{other} (the floor of any hop)"),
        };
        println!(
            "[connect] {name}: {:.0} tunnels/s ({} failed), {:.2}× direct; CPU per tunnel: \
             its process {:.1} µs, farm {:.1} µs, clients {:.1} µs",
            t.rate(),
            t.failed,
            t.rate() / direct.rate().max(1e-9),
            t.us_per(),
            t.per(t.cpu_farm),
            t.per(t.cpu_clients),
        );
    }
    if let [
        (_, _, _, relayed, _),
        (_, _, _, new, new_slices),
        (_, _, _, old, old_slices),
    ] = hops.as_slice()
    {
        println!(
            "[connect] new ÷ old: {:.2}× tunnels/s (target ≥ 1.5), {:.2}× CPU per tunnel \
             (totals); tunnels/s {}; bare relay ÷ old: {:.2}× tunnels/s (what a hop costing \
             nothing above the kernel's work reaches)",
            new.rate() / old.rate().max(1e-9),
            new.us_per() / old.us_per().max(1e-9),
            paired_ratios(new_slices, old_slices),
            relayed.rate() / old.rate().max(1e-9),
        );
    }
}

// ---------------------------------------------------------------------------
// spread: a new upstream for every request, against haproxy

/// Upstreams of the spread pass.
const SPREAD_UPSTREAMS: usize = 300;
/// The spread pass's side of haproxy in http mode.
const HAPROXY_HTTP: &str = "haproxy (http)";
/// The spread pass's other sides, by the names its lines print.
const GATEWAY: &str = "gateway";
const HAPROXY_TCP: &str = "haproxy";
const OLD: &str = "gateway (old)";

/// haproxy (Debian's package) in `mode` (`tcp`, or `http`: it parses each
/// request, takes the next upstream for it and keeps its connections to
/// the upstreams for any request, as the gateway does), round-robin over
/// `upstreams`, as a child with its config in `dir`: its process, pid and
/// address; `None` when haproxy is not installed.
async fn start_haproxy(
    dir: &Path,
    mode: &str,
    upstreams: &[SocketAddr],
) -> anyhow::Result<Option<(Child, u32, SocketAddr)>> {
    if std::process::Command::new("haproxy")
        .arg("-v")
        .output()
        .is_err()
    {
        return Ok(None);
    }
    let listen = free_port()?;
    // In http mode: a kept connection to an upstream carries any
    // client's next request (`http-reuse always`).
    let http = if mode == "http" {
        "    http-reuse always\n    timeout http-keep-alive 60s\n"
    } else {
        ""
    };
    let mut config = format!(
        "global\n    maxconn 8000\n\n\
         defaults\n    mode {mode}\n    timeout connect 5s\n    timeout client 60s\n    timeout server 60s\n{http}\n\
         listen spread\n    bind {listen}\n    balance roundrobin\n"
    );
    for (i, u) in upstreams.iter().enumerate() {
        config.push_str(&format!("    server u{i} {u}\n"));
    }
    // maxconn 8000: haproxy wants two descriptors a connection and
    // refuses to start above the open-file limit (20,000 here).
    let path = dir.join(format!("haproxy-{mode}.cfg"));
    std::fs::write(&path, config)?;
    let log = dir.join(format!("haproxy-{mode}.log"));
    let child = Command::new("haproxy")
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .context("start haproxy")?;
    let pid = child.id().context("haproxy exited")?;
    let started = Instant::now();
    while tokio::net::TcpStream::connect(listen).await.is_err() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(10),
            "haproxy did not listen within 10 s; see {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Some((child, pid, listen)))
}

/// `spread`: 300 upstreams, the gateway taking a new one for every plain
/// request (round-robin, its default) and every tunnel, against haproxy
/// in tcp mode balancing round-robin over the same 300, under the same
/// wrk load in alternating slices. With kept-alive client connections
/// haproxy spreads per connection (32 upstreams carry everything); with
/// `Connection: close` it spreads per request as the gateway does.
/// Plain requests also go through haproxy in http mode, which spreads per
/// request and keeps its upstream connections as the gateway does.
async fn spread(dir: &Path) -> anyhow::Result<()> {
    if std::process::Command::new("wrk")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("[spread] SKIPPED: wrk is not installed (Debian: apt-get install -y wrk)");
        return Ok(());
    }
    let dir = dir.join("spread");
    std::fs::create_dir_all(&dir)?;
    let (mut farm_child, farm) = start_farm(SPREAD_UPSTREAMS).await?;
    let Some((_haproxy_child, haproxy_pid, haproxy)) =
        start_haproxy(&dir, "tcp", &farm.proxies).await?
    else {
        println!("[spread] SKIPPED: haproxy is not installed (Debian: apt-get install -y haproxy)");
        return Ok(());
    };
    let (_l7_child, l7_pid, l7) = start_haproxy(&dir, "http", &farm.proxies)
        .await?
        .context("haproxy was there a moment ago")?;
    let daemon = start_daemon(
        "new",
        env!("CARGO_BIN_EXE_proxywarden"),
        &dir.join("new"),
        &farm,
    )
    .await?;
    println!(
        "[spread] {SPREAD_UPSTREAMS} upstream proxies; the gateway (round-robin: each plain request \
         and each tunnel a new upstream) vs haproxy 2 in tcp mode, balance roundrobin over the \
         same upstreams (the target), and for plain requests haproxy in http mode too (a new \
         upstream per request, its upstream connections kept for any request: the same work \
         as the gateway's); {:.0} s per side in {} alternating slices",
        run_for().as_secs_f64(),
        slices()
    );
    // An older build's daemon as a third side, on the same farm.
    let old = match std::env::var_os(OLD_BIN_ENV) {
        Some(bin) => {
            let bin = PathBuf::from(bin);
            let bin = bin.to_str().context("the old binary's path is not UTF-8")?;
            Some(start_daemon("old", bin, &dir.join("old"), &farm).await?)
        }
        None => None,
    };
    let slice = run_for().as_secs_f64() / f64::from(slices());
    let sides: Vec<(&str, u32, SocketAddr)> = [
        (GATEWAY, daemon.pid, daemon.gateway),
        (HAPROXY_TCP, haproxy_pid, haproxy),
        (HAPROXY_HTTP, l7_pid, l7),
    ]
    .into_iter()
    .chain(old.as_ref().map(|d| (OLD, d.pid, d.gateway)))
    .collect();
    // A side's place, by name.
    let at = |sides: &[(&str, u32, SocketAddr)], name: &str| {
        sides.iter().position(|(n, _, _)| *n == name)
    };
    for (mode, extra) in [
        ("keep-alive", ""),
        ("close", "wrk.headers[\"Connection\"] = \"close\"\n"),
    ] {
        let script = dir.join(format!("{mode}.lua"));
        std::fs::write(
            &script,
            format!(
                "wrk.method = \"GET\"\nwrk.path = \"http://{site}/\"\nwrk.headers[\"Host\"] = \"{site}\"\n{extra}",
                site = farm.site
            ),
        )?;
        for (_, _, addr) in &sides {
            wrk(&script, *addr, 1.0).await?;
        }
        farm_child.served().await?;
        let mut measured: Vec<Side> = sides.iter().map(|_| Side::default()).collect();
        let mut used: Vec<BTreeSet<usize>> = sides.iter().map(|_| BTreeSet::new()).collect();
        for i in 0..slices() as usize {
            for k in 0..sides.len() {
                let k = (k + i) % sides.len();
                let (_, pid, addr) = sides[k];
                let before = (
                    common::cpu_seconds(pid),
                    common::cpu_seconds(farm.pid),
                    children_cpu(),
                );
                let parts = cpu_parts(pid);
                measured[k].runs.push(wrk(&script, addr, slice).await?);
                let (user, sys, switches) = cpu_parts(pid);
                measured[k].cpu_user += user - parts.0;
                measured[k].cpu_sys += sys - parts.1;
                measured[k].switches += switches.saturating_sub(parts.2);
                measured[k]
                    .cpu_slices
                    .push(common::cpu_seconds(pid) - before.0);
                measured[k].cpu_daemon += common::cpu_seconds(pid) - before.0;
                measured[k].cpu_farm += common::cpu_seconds(farm.pid) - before.1;
                measured[k].cpu_wrk += children_cpu() - before.2;
                used[k].extend(farm_child.served().await?);
            }
        }
        for ((name, _, _), side) in sides.iter().zip(&measured) {
            println!(
                "[spread {mode}] {name}: {:.0} requests/s, p50 {:.3} ms, p99 {:.3} ms ({} bad); \
                 its CPU {:.1} µs per request, farm {:.1} µs, wrk {:.1} µs",
                side.rate(),
                side.p(|r| r.p50),
                side.p(|r| r.p99),
                side.bad(),
                side.us_per(side.cpu_daemon),
                side.us_per(side.cpu_farm),
                side.us_per(side.cpu_wrk),
            );
        }
        for ((name, _, _), side) in sides.iter().zip(&measured) {
            println!(
                "[spread {mode}] {name}: its CPU per request in user space {:.1} µs, in the kernel \
                 {:.1} µs; {:.2} context switches per request",
                side.us_per(side.cpu_user),
                side.us_per(side.cpu_sys),
                side.switches as f64 / side.requests().max(1) as f64,
            );
        }
        // What the target's "requests spread over all of them" asks: how
        // many upstreams each side's requests reached.
        for ((name, _, _), used) in sides.iter().zip(&used) {
            println!(
                "[spread {mode}] {name}: its requests reached {} of the {SPREAD_UPSTREAMS} upstreams",
                used.len()
            );
        }
        let side = |name| at(&sides, name).map(|k| &measured[k]);
        let (g, h) = (
            side(GATEWAY).context("the gateway's side")?,
            side(HAPROXY_TCP).context("haproxy's side")?,
        );
        println!(
            "[spread {mode}] gateway ÷ haproxy: {:.2}× requests/s (target ≥ 1.0), {:.2}× CPU per \
             request (target ≤ 1.0)",
            g.rate() / h.rate().max(1e-9),
            g.us_per(g.cpu_daemon) / h.us_per(h.cpu_daemon).max(1e-9),
        );
        let l7 = side(HAPROXY_HTTP).context("haproxy's http side")?;
        println!(
            "[spread {mode}] gateway ÷ haproxy (http): {:.2}× requests/s, {:.2}× CPU per request",
            g.rate() / l7.rate().max(1e-9),
            g.us_per(g.cpu_daemon) / l7.us_per(l7.cpu_daemon).max(1e-9),
        );
        println!(
            "[spread {mode}] haproxy (http) ÷ haproxy: {:.2}× requests/s, {:.2}× CPU per request \
             (what parsing each request and taking an upstream for it costs haproxy itself)",
            l7.rate() / h.rate().max(1e-9),
            l7.us_per(l7.cpu_daemon) / h.us_per(h.cpu_daemon).max(1e-9),
        );
        if let Some(o) = side(OLD) {
            println!(
                "[spread {mode}] new ÷ old: {:.2}× requests/s, {:.2}× CPU per request (totals); \
                 requests/s {}",
                g.rate() / o.rate().max(1e-9),
                g.us_per(g.cpu_daemon) / o.us_per(o.cpu_daemon).max(1e-9),
                paired_ratios(&g.per_slice(), &o.per_slice()),
            );
        }
    }
    // Tunnels: a new one each time, through each side in turn (haproxy in
    // tcp mode only: in http mode it would parse CONNECT as the gateway
    // does, but the target is the tcp relay's rate).
    let sides: Vec<(&str, u32, SocketAddr)> = sides
        .into_iter()
        .filter(|(name, _, _)| *name != HAPROXY_HTTP)
        .collect();
    let mut tunneled: Vec<Tunnels> = sides.iter().map(|_| Tunnels::default()).collect();
    let mut tunnel_slices: Vec<Vec<(f64, f64)>> = sides.iter().map(|_| Vec::new()).collect();
    for i in 0..slices() as usize {
        for k in 0..sides.len() {
            let k = (k + i) % sides.len();
            let (_, pid, addr) = sides[k];
            let t = tunnels(vec![addr], &farm, Some(pid), run_for() / slices()).await;
            tunnel_slices[k].push((t.rate(), t.us_per()));
            let into = &mut tunneled[k];
            into.done += t.done;
            into.failed += t.failed;
            into.secs += t.secs;
            into.cpu += t.cpu;
            into.cpu_farm += t.cpu_farm;
            into.cpu_clients += t.cpu_clients;
        }
    }
    for ((name, _, _), t) in sides.iter().zip(&tunneled) {
        println!(
            "[spread connect] {name}: {:.0} tunnels/s ({} failed); CPU per tunnel: its process \
             {:.1} µs, farm {:.1} µs, clients {:.1} µs",
            t.rate(),
            t.failed,
            t.us_per(),
            t.per(t.cpu_farm),
            t.per(t.cpu_clients),
        );
    }
    let (gk, hk) = (
        at(&sides, GATEWAY).context("the gateway's side")?,
        at(&sides, HAPROXY_TCP).context("haproxy's side")?,
    );
    let (g, h) = (&tunneled[gk], &tunneled[hk]);
    println!(
        "[spread connect] gateway ÷ haproxy: {:.2}× tunnels/s (target ≥ 1.0), {:.2}× CPU per tunnel",
        g.rate() / h.rate().max(1e-9),
        g.us_per() / h.us_per().max(1e-9),
    );
    if let Some(ok) = at(&sides, OLD) {
        let o = &tunneled[ok];
        println!(
            "[spread connect] new ÷ old: {:.2}× tunnels/s, {:.2}× CPU per tunnel (totals); \
             tunnels/s {}",
            g.rate() / o.rate().max(1e-9),
            g.us_per() / o.us_per().max(1e-9),
            paired_ratios(&tunnel_slices[gk], &tunnel_slices[ok]),
        );
    }
    Ok(())
}
