//! `cargo bench --bench freshness`: what keeping served proxies fresh costs,
//! and what it buys. The daemon serves 2,000 working loopback proxies on its
//! default settings but for 80 re-checks a second (its judge is its own);
//! the bench measures its CPU over a minute of steady
//! state (target: at most 2% of one core), then 30% of the proxies die at
//! once and it counts how many plain `GET /proxy` answers over the next
//! minute name a dead proxy (target: at most 1%).
//!
//! Then the case of a start right after a bulk check: `proxywarden
//! harvest` and `proxywarden check` fill a database with 1,100 working
//! proxies, `serve` starts on it at the defaults (20 re-checks a second),
//! 30% of the proxies die one second later, and it counts the `GET /proxy`
//! answers naming a dead one over the next minute (target: at most 1%).
//! `cargo bench --bench freshness -- steady` or `-- cold` runs one case.
//!
//! Two roles, one binary. Without arguments it is the measuring process: it
//! starts the judge and the proxies in a child (`--serve-farm N`), so their
//! CPU stays out of the figures, and runs the daemon in-process. The child
//! stops `K` proxies when it reads `kill K` on stdin, and exits when stdin
//! closes.

#[allow(dead_code)]
#[path = "../tests/common/fakes.rs"]
mod fakes;
#[allow(dead_code)]
#[path = "../tests/common/judges.rs"]
mod judges;

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use proxywarden::config::Config;
use tokio::io::AsyncBufReadExt;
use tokio_util::sync::CancellationToken;

const FARM_ARG: &str = "--serve-farm";
/// Working proxies served.
const PROXIES: usize = 2_000;
/// Re-checks a second (`check.serve_recheck_rate`), as with a judge of
/// one's own.
const RATE: u32 = 80;
/// The share that dies at once.
const DYING: usize = PROXIES * 3 / 10;
/// Steady state measured, and the time after the deaths measured.
const WINDOW: Duration = Duration::from_secs(60);
/// The proxies forward from these addresses in turn, so no one address's
/// ephemeral ports bound their upstream connections.
const UPSTREAM_BINDS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(127, 0, 0, 2),
    Ipv4Addr::new(127, 0, 0, 3),
    Ipv4Addr::new(127, 0, 0, 4),
    Ipv4Addr::new(127, 0, 0, 5),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        let n = args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("usage: {FARM_ARG} N"));
        serve_farm(n);
        return ExitCode::SUCCESS;
    }
    // `RUST_LOG=proxywarden=info` shows what the daemon does, with times.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let only = |case: &str| {
        !args.iter().any(|a| a == "steady" || a == "cold") || args.iter().any(|a| a == case)
    };
    let run = async {
        if only("steady") {
            measure().await?;
        }
        if only("cold") {
            measure_cold().await?;
        }
        anyhow::Ok(())
    };
    match rt.block_on(run) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("freshness bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The child: a judge and `n` working proxies; prints `judge URL`, one
/// `proxy ADDR` line each and `ready`; stops the first `K` on `kill K`.
fn serve_farm(n: usize) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        fakes::raise_nofile_limit();
        let judge = judges::Judge::plain().await;
        let mut proxies = std::collections::VecDeque::new();
        for i in 0..n {
            let ip = UPSTREAM_BINDS[i % UPSTREAM_BINDS.len()];
            proxies.push_back(
                fakes::FakeHttpProxy::start(fakes::HttpProxyOpts {
                    upstream_bind: Some(IpAddr::V4(ip)),
                    ..fakes::HttpProxyOpts::default()
                })
                .await,
            );
        }
        {
            let mut out = std::io::stdout().lock();
            writeln!(out, "judge {}", judge.url()).expect("write to the parent");
            for p in &proxies {
                writeln!(out, "proxy {}", p.addr()).expect("write to the parent");
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            if let Some(k) = line.strip_prefix("kill ").and_then(|k| k.parse().ok()) {
                for _ in 0..k {
                    proxies.pop_front();
                }
                println!("killed");
            }
        }
        drop(proxies);
        drop(judge);
    });
    rt.shutdown_background();
}

/// Checks the daemon has recorded in the database so far.
fn checks_recorded(db: &std::path::Path) -> anyhow::Result<i64> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    Ok(conn.query_row(
        "SELECT coalesce(sum(checks_total), 0) FROM proxies",
        [],
        |r| r.get(0),
    )?)
}

/// User plus system CPU time of this process, from /proc/self/stat.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = &stat[stat.rfind(')').map_or(0, |i| i + 1)..];
    let fields: Vec<u64> = rest
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    let per_second = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(100);
    Duration::from_secs_f64(ticks as f64 / per_second as f64)
}

async fn measure() -> anyhow::Result<()> {
    fakes::raise_nofile_limit();
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([FARM_ARG, &PROXIES.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let mut to_farm = child.stdin.take().expect("piped stdin");
    let mut from_farm = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut judge = String::new();
    let mut proxies: Vec<SocketAddr> = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        anyhow::ensure!(from_farm.read_line(&mut line)? > 0, "the farm exited");
        match line.trim().split_once(' ') {
            Some(("judge", url)) => judge = url.to_owned(),
            Some(("proxy", addr)) => proxies.push(addr.parse()?),
            _ if line.trim() == "ready" => break,
            _ => anyhow::bail!("unexpected farm line {line:?}"),
        }
    }

    let dir = tempfile::tempdir()?;
    let list = dir.path().join("list.txt");
    let mut text = String::new();
    for p in &proxies {
        text.push_str(&format!("{p}\n"));
    }
    std::fs::write(&list, text)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    // Every check and freshness setting is the default, but for the
    // re-check rate: the judge is our own, which takes more than the
    // default's 10 a second per public judge.
    let config = Config::from_toml(
        &format!(
            "[database]\npath = \"{}\"\n[harvest]\nallow_private_addresses = true\n\
             [check]\njudges = [\"{judge}\"]\n\
             serve_recheck_rate = {RATE}\n\
             [[sources]]\nname = \"farm\"\nurl = \"{}\"\n",
            dir.path().join("fresh.db").display(),
            list.display()
        ),
        "freshness.toml",
    )?;
    let cycle = config.check.serve_cycle(PROXIES);
    let shutdown = CancellationToken::new();
    let daemon = tokio::spawn(proxywarden::daemon::run(
        config,
        listener,
        None,
        shutdown.clone(),
    ));
    let tls = proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1)?;
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    let get = |path: &str| http.get(format!("http://{addr}{path}")).send();

    let started = Instant::now();
    loop {
        let stats: serde_json::Value = get("/stats").await?.json().await?;
        if stats["servable"].as_u64() == Some(PROXIES as u64) {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "not all proxies servable after 2 minutes: {stats}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "{PROXIES} working proxies served after {:.1}s; re-check cycle {:.1}s (defaults but for {RATE} re-checks a second)",
        started.elapsed().as_secs_f64(),
        cycle.as_secs_f64()
    );
    // Let the first wave of re-checks spread out before measuring.
    tokio::time::sleep(cycle * 2).await;
    let db = dir.path().join("fresh.db");
    let checks_before = checks_recorded(&db)?;
    let cpu_before = cpu_time();
    let wall = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let cpu = cpu_time() - cpu_before;
    let checks = checks_recorded(&db)? - checks_before;
    let share = cpu.as_secs_f64() / wall.elapsed().as_secs_f64();
    println!(
        "steady state: {:.2}s CPU in {:.0}s = {:.2}% of a core (target <= 2%); \
         {checks} checks recorded ({:.1}/s, {:.3} ms CPU each)",
        cpu.as_secs_f64(),
        wall.elapsed().as_secs_f64(),
        share * 100.0,
        checks as f64 / wall.elapsed().as_secs_f64(),
        cpu.as_secs_f64() * 1000.0 / checks.max(1) as f64
    );

    let killed: HashSet<String> = proxies[..DYING]
        .iter()
        .map(|a| format!("http://{a}"))
        .collect();
    writeln!(to_farm, "kill {DYING}")?;
    to_farm.flush()?;
    line.clear();
    from_farm.read_line(&mut line)?;
    anyhow::ensure!(line.trim() == "killed", "unexpected farm line {line:?}");
    let died = Instant::now();
    tracing::info!("{DYING} proxies died");
    let mut buckets = [(0u32, 0u32); 6];
    while died.elapsed() < WINDOW {
        let bucket = (died.elapsed().as_secs() / 10).min(5) as usize;
        let resp = get("/proxy?format=text").await?;
        if resp.status().is_success() {
            let url = resp.text().await?;
            buckets[bucket].0 += 1;
            if killed.contains(&url) {
                buckets[bucket].1 += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (answers, dead) = buckets
        .iter()
        .fold((0, 0), |(a, d), (ba, bd)| (a + ba, d + bd));
    println!(
        "after {DYING} of {PROXIES} died: {dead} of {answers} answers named a dead proxy = {:.2}% (target <= 1%)",
        f64::from(dead) * 100.0 / f64::from(answers.max(1))
    );
    for (i, (a, d)) in buckets.iter().enumerate() {
        println!(
            "  {:>2}-{:>2}s: {d} of {a} dead ({:.2}%)",
            i * 10,
            i * 10 + 10,
            f64::from(*d) * 100.0 / f64::from((*a).max(1))
        );
    }
    shutdown.cancel();
    daemon.await??;
    drop(to_farm);
    let _ = child.wait();
    Ok(())
}

/// Proxies served in the start-after-a-bulk-check case.
const COLD_PROXIES: usize = 1_100;

/// A farm child: the process, its stdin (`kill K`), its stdout, the
/// judge's URL and the proxies' addresses.
type Farm = (
    std::process::Child,
    std::process::ChildStdin,
    BufReader<std::process::ChildStdout>,
    String,
    Vec<SocketAddr>,
);

/// A farm of `n` proxies and its judge in a child.
fn start_farm(n: usize) -> anyhow::Result<Farm> {
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([FARM_ARG, &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let to_farm = child.stdin.take().expect("piped stdin");
    let mut from_farm = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut judge = String::new();
    let mut proxies: Vec<SocketAddr> = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        anyhow::ensure!(from_farm.read_line(&mut line)? > 0, "the farm exited");
        match line.trim().split_once(' ') {
            Some(("judge", url)) => judge = url.to_owned(),
            Some(("proxy", addr)) => proxies.push(addr.parse()?),
            _ if line.trim() == "ready" => break,
            _ => anyhow::bail!("unexpected farm line {line:?}"),
        }
    }
    Ok((child, to_farm, from_farm, judge, proxies))
}

/// `proxywarden harvest` and `check` fill a database; `serve` starts on it
/// at the defaults; 30% of the proxies die a second later.
async fn measure_cold() -> anyhow::Result<()> {
    fakes::raise_nofile_limit();
    let (mut child, mut to_farm, mut from_farm, judge, proxies) = start_farm(COLD_PROXIES)?;
    let dir = tempfile::tempdir()?;
    let list = dir.path().join("list.txt");
    let text: String = proxies.iter().map(|p| format!("{p}\n")).collect();
    std::fs::write(&list, text)?;
    let toml = format!(
        "[database]\npath = \"{}\"\n[harvest]\nallow_private_addresses = true\n\
         [check]\njudges = [\"{judge}\"]\n\
         [[sources]]\nname = \"farm\"\nurl = \"{}\"\n",
        dir.path().join("cold.db").display(),
        list.display()
    );
    let config_path = dir.path().join("proxywarden.toml");
    std::fs::write(&config_path, &toml)?;
    for command in ["harvest", "check"] {
        let out = Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .arg("--config")
            .arg(&config_path)
            .arg(command)
            .stdin(Stdio::null())
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "proxywarden {command} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let config = Config::from_toml(&toml, "cold.toml")?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let started = Instant::now();
    let daemon = tokio::spawn(proxywarden::daemon::run(
        config,
        listener,
        None,
        shutdown.clone(),
    ));
    let tls = proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1)?;
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    let get = |path: &str| http.get(format!("http://{addr}{path}")).send();
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(started.elapsed())).await;
    let dying = COLD_PROXIES * 3 / 10;
    let killed: HashSet<String> = proxies[..dying]
        .iter()
        .map(|a| format!("http://{a}"))
        .collect();
    writeln!(to_farm, "kill {dying}")?;
    to_farm.flush()?;
    let mut line = String::new();
    from_farm.read_line(&mut line)?;
    anyhow::ensure!(line.trim() == "killed", "unexpected farm line {line:?}");
    let died = Instant::now();
    tracing::info!("{dying} proxies died");
    let mut buckets = [(0u32, 0u32); 6];
    while died.elapsed() < WINDOW {
        let bucket = (died.elapsed().as_secs() / 10).min(5) as usize;
        let resp = get("/proxy?format=text").await?;
        if resp.status().is_success() {
            let url = resp.text().await?;
            buckets[bucket].0 += 1;
            if killed.contains(&url) {
                buckets[bucket].1 += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (answers, dead) = buckets
        .iter()
        .fold((0, 0), |(a, d), (ba, bd)| (a + ba, d + bd));
    println!(
        "start on a checked database, {dying} of {COLD_PROXIES} died {:.1}s after it (defaults): \
         {dead} of {answers} answers named a dead proxy = {:.2}% (target <= 1%)",
        (died - started).as_secs_f64(),
        f64::from(dead) * 100.0 / f64::from(answers.max(1))
    );
    for (i, (a, d)) in buckets.iter().enumerate() {
        println!(
            "  {:>2}-{:>2}s: {d} of {a} dead ({:.2}%)",
            i * 10,
            i * 10 + 10,
            f64::from(*d) * 100.0 / f64::from((*a).max(1))
        );
    }
    shutdown.cancel();
    daemon.await??;
    drop(to_farm);
    let _ = child.wait();
    Ok(())
}
