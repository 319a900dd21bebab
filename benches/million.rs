//! `cargo bench --bench million`: a million stored proxies, on SQLite and
//! on PostgreSQL in one run. Each backend's database is filled by the
//! release `proxywarden harvest` of ten generated lists of 100,000
//! proxies (1,000,000 distinct, on loopback addresses whose port nothing
//! listens on), then one SQL update gives them verdicts as rounds of
//! checks would have: 100,000 alive, 600,000 dead, 300,000 never checked,
//! with countries, anonymity, latencies and recent check times. Then
//! `proxywarden serve` runs as a child (its judge a closed loopback port,
//! so no round ever starts and nothing connects to the fake addresses; the
//! harvest scheduled once a year) and the bench measures, beside each
//! target:
//!
//! - start: the time to the first answer of `/healthz`, and the RSS
//!   (VmRSS, VmHWM) then;
//! - `/proxy?country=XX` at 1,000 requests a second for `BENCH_SECONDS`
//!   (default 20), open loop: each request's latency counts from when it
//!   was due, so a stall counts for every request it delays; p50, p99, max;
//! - `/stats`, `/sources` and the dashboard's page (`/`): median and
//!   slowest of 10;
//! - `/export` (json and csv, the 100,000 servable) and the CLI's `export`
//!   (`--status all --format csv`: the million; `--status alive --format
//!   json`): time to the first byte, the whole, bytes, and the peak RSS
//!   (VmHWM) of the process that exports;
//! - a full count of the store as `/stats` takes one (the CLI's `stats`, a
//!   process of its own): wall and CPU, the median of 3;
//! - the RSS of `serve` after all of it.
//!
//! `BENCH_BIN=<path>` measures another build of `proxywarden` (an older
//! one, say) on the same data; `BENCH_BACKEND=sqlite|postgres` runs one
//! backend; `BENCH_SECONDS` sets the load's length; `BENCH_LOG=<filter>`
//! runs `serve` with that `RUST_LOG` and keeps its log in the temporary
//! folder.
//!
//! The PostgreSQL server runs as the tests run it (`fsync=off`): the
//! figures are the daemon's work, not the disk's.

#[allow(dead_code)]
#[path = "../tests/common/postgres.rs"]
mod postgres;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

const LISTS: usize = 10;
const PER_LIST: usize = 100_000;
const TOTAL: usize = LISTS * PER_LIST;
const RATE: u64 = 1_000;
const WORKERS: usize = 32;

const COUNTRIES: [&str; 20] = [
    "US", "DE", "FR", "GB", "NL", "BR", "IN", "CN", "RU", "JP", "KR", "ID", "TR", "IT", "ES", "PL",
    "UA", "VN", "TH", "MX",
];

/// Targets.
const START_S: f64 = 5.0;
const RSS_MB: f64 = 300.0;
const P99_MS: f64 = 5.0;
const PAGE_MS: f64 = 100.0;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("million bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `i`th proxy: a loopback address with the discard port, where
/// nothing listens.
fn proxy(i: usize) -> String {
    format!("127.{}.{}.{}:9", 1 + (i >> 16), (i >> 8) & 255, i & 255)
}

/// Writes the lists into `dir`; their `[[sources]]` blocks.
fn write_lists(dir: &Path) -> anyhow::Result<String> {
    let mut toml = String::new();
    for l in 0..LISTS {
        let path = dir.join(format!("list{l}.txt"));
        let text: String = (l * PER_LIST..(l + 1) * PER_LIST)
            .map(|i| proxy(i) + "\n")
            .collect();
        std::fs::write(&path, text)?;
        toml.push_str(&format!(
            "[[sources]]\nname = \"list{l}\"\nurl = \"{}\"\n",
            path.display()
        ));
    }
    Ok(toml)
}

/// A free port on loopback (bound, then let go for the child to bind).
fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The config of one backend's runs.
fn config(database: &str, api: u16, gateway: u16, sources: &str) -> String {
    format!(
        "[database]\n{database}\n\n\
         [harvest]\nschedule = \"0 0 0 1 1 *\"\nmax_body = \"16MiB\"\nallow_private_addresses = true\n\n\
         [check]\njudges = [\"http://127.0.0.1:9/judge\"]\nrecheck_alive = \"24h\"\n\
         recheck_dead = \"24h\"\nrecheck_dead_max = \"24h\"\n\n\
         [api]\nlisten = \"127.0.0.1:{api}\"\n\n\
         [gateway]\nlisten = \"127.0.0.1:{gateway}\"\n\n{sources}"
    )
}

/// The binary measured: `BENCH_BIN` (another build, to compare), else this
/// one.
fn proxywarden(dir: &Path, config: &Path) -> Command {
    let bin =
        std::env::var_os("BENCH_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_proxywarden").into());
    let mut c = Command::new(bin);
    c.arg("-c")
        .arg(config)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    if let Some(filter) = std::env::var_os("BENCH_LOG") {
        c.env("RUST_LOG", filter);
    }
    c
}

/// The verdicts, as SQL for this backend (`boolean` is how a flag is
/// written: `x` for PostgreSQL, `CAST(x AS INTEGER)` for SQLite).
fn verdicts_sql(now: i64, postgres: bool) -> String {
    let countries: String = COUNTRIES.concat();
    let https = if postgres { "(id % 2 = 0)" } else { "(id % 2)" };
    let day = 86_400_000;
    format!(
        "UPDATE proxies SET
            country = substr('{countries}', CAST((id / 10 % 20) * 2 + 1 AS INTEGER), 2),
            country_source = 'source',
            status = CASE WHEN id % 10 = 0 THEN 'alive'
                          WHEN id % 10 <= 6 THEN 'dead' ELSE 'unknown' END,
            last_checked = CASE WHEN id % 10 <= 6 THEN {now} - id % 60000 END,
            last_alive = CASE WHEN id % 10 = 0 THEN {now} - id % 60000 END,
            latency_ms = CASE WHEN id % 10 = 0 THEN 50 + id % 3000 END,
            anonymity = CASE WHEN id % 10 = 0 THEN
                CASE id % 3 WHEN 0 THEN 'transparent' WHEN 1 THEN 'anonymous' ELSE 'elite' END END,
            https = CASE WHEN id % 10 = 0 THEN {https} END,
            https_checked_at = CASE WHEN id % 10 = 0 THEN {now} END,
            checks_total = CASE WHEN id % 10 <= 6 THEN 10 ELSE 0 END,
            checks_ok = CASE WHEN id % 10 = 0 THEN 8 ELSE 0 END,
            consecutive_failures = CASE WHEN id % 10 BETWEEN 1 AND 6 THEN 3 ELSE 0 END,
            last_reason = CASE WHEN id % 10 BETWEEN 1 AND 6 THEN 'refused' END,
            next_check_at = {now} + {day} + id"
    )
}

/// VmRSS and VmHWM of `pid`, in MB.
fn rss(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(name))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// One GET over a fresh connection: status, time to the first byte of the
/// answer, time to its end, and the bytes read (head included). The body
/// is counted, not kept.
fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Duration, Duration, u64)> {
    let started = Instant::now();
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = vec![0; 64 * 1024];
    let mut first = None;
    let mut head = Vec::new();
    let mut bytes = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        first.get_or_insert_with(|| started.elapsed());
        if head.len() < 16 {
            head.extend_from_slice(&buf[..n.min(16)]);
        }
        bytes += n as u64;
    }
    let status = std::str::from_utf8(&head)
        .ok()
        .and_then(|h| h.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    Ok((status, first.unwrap_or_default(), started.elapsed(), bytes))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

/// `proxy?country=..` at [`RATE`] a second for `seconds`, open loop: the
/// latencies from each request's due time, by the second of the load it
/// was due in, and the requests that failed.
async fn load(addr: SocketAddr, seconds: u64) -> anyhow::Result<(Vec<Vec<Duration>>, usize)> {
    let total = (RATE * seconds) as usize;
    let period = Duration::from_nanos(1_000_000_000 / RATE);
    let start = tokio::time::Instant::now() + Duration::from_millis(200);
    let mut tasks = Vec::new();
    for w in 0..WORKERS {
        tasks.push(tokio::spawn(async move {
            let tcp = tokio::net::TcpStream::connect(addr).await?;
            tcp.set_nodelay(true)?;
            let (mut sender, conn) =
                hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await?;
            tokio::spawn(conn);
            let mut lat = Vec::with_capacity(total / WORKERS + 1);
            let mut errors = 0;
            for i in (w..total).step_by(WORKERS) {
                let due = start + period * i as u32;
                tokio::time::sleep_until(due).await;
                let path = format!("/proxy?country={}", COUNTRIES[i % COUNTRIES.len()]);
                let req = http::Request::get(path)
                    .header(http::header::HOST, addr.to_string())
                    .body(Empty::<Bytes>::new())?;
                let resp = sender.send_request(req).await?;
                let ok = resp.status().is_success();
                resp.into_body().collect().await?;
                lat.push((i / RATE as usize, due.elapsed()));
                errors += usize::from(!ok);
            }
            anyhow::Ok((lat, errors))
        }));
    }
    let mut by_second = vec![Vec::with_capacity(RATE as usize); seconds as usize];
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await??;
        for (second, l) in lat {
            by_second[second].push(l);
        }
        errors += e;
    }
    for s in &mut by_second {
        s.sort();
    }
    Ok((by_second, errors))
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

/// Stops the child it holds when dropped (a failed run leaves no daemon).
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The CLI's `export` with `args`: time to its first byte on stdout, its
/// whole time, the bytes and its peak RSS (MB).
fn cli_export(
    dir: &Path,
    config: &Path,
    args: &[&str],
) -> anyhow::Result<(Duration, Duration, u64, f64)> {
    let started = Instant::now();
    let mut child = proxywarden(dir, config)
        .arg("export")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let mut out = child.stdout.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0; 64 * 1024];
        let mut first = None;
        let mut bytes = 0u64;
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            first.get_or_insert_with(|| started.elapsed());
            bytes += n as u64;
        }
        (first.unwrap_or_default(), bytes)
    });
    let mut peak: f64 = 0.0;
    let status = loop {
        if let Some((_, hwm)) = rss(pid) {
            peak = peak.max(hwm);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let took = started.elapsed();
    let (first, bytes) = reader.join().expect("reader");
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err)?;
    }
    anyhow::ensure!(status.success(), "export {args:?} failed: {err}");
    Ok((first, took, bytes, peak))
}

/// The CLI's `stats` (a full count of the store): its wall and CPU (user
/// and system, from the rusage of the reaped child), in seconds.
fn cli_stats(dir: &Path, config: &Path) -> anyhow::Result<(f64, f64)> {
    use nix::sys::resource::{UsageWho, getrusage};
    let cpu = || {
        getrusage(UsageWho::RUSAGE_CHILDREN).map(|u| {
            let t = |v: nix::sys::time::TimeVal| v.tv_sec() as f64 + v.tv_usec() as f64 / 1e6;
            t(u.user_time()) + t(u.system_time())
        })
    };
    let before = cpu()?;
    let started = Instant::now();
    let out = proxywarden(dir, config).arg("stats").output()?;
    let wall = started.elapsed().as_secs_f64();
    anyhow::ensure!(
        out.status.success(),
        "stats failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok((wall, cpu()? - before))
}

/// Every figure of one backend.
fn measure(
    rt: &tokio::runtime::Runtime,
    dir: &Path,
    name: &str,
    database: &str,
    sources: &str,
    fill: &dyn Fn() -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let (api, gw) = (free_port()?, free_port()?);
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(&config, self::config(database, api, gw, sources))?;
    let addr: SocketAddr = ([127, 0, 0, 1], api).into();

    let started = Instant::now();
    let out = proxywarden(dir, &config).arg("harvest").output()?;
    anyhow::ensure!(
        out.status.success(),
        "{name}: harvest failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let harvested = started.elapsed();
    let started = Instant::now();
    fill()?;
    println!(
        "{name}: filled with {TOTAL} proxies: harvest {:.1} s, verdicts {:.1} s",
        harvested.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );

    let log = std::fs::File::create(dir.join(format!("{name}-serve.log")))?;
    let started = Instant::now();
    let child = proxywarden(dir, &config)
        .arg("serve")
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let pid = child.id();
    let daemon = Daemon(child);
    let ready = loop {
        if let Ok((200, ..)) = get(addr, "/healthz") {
            break started.elapsed();
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "{name}: serve did not answer /healthz in 120 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let (rss0, hwm0) = rss(pid).unwrap_or_default();
    println!(
        "{name}: start to first /healthz {:.2} s (target <= {START_S} s: {}); RSS {rss0:.0} MB, \
         peak {hwm0:.0} MB (target <= {RSS_MB} MB: {})",
        ready.as_secs_f64(),
        verdict(ready.as_secs_f64() <= START_S),
        verdict(hwm0 <= RSS_MB)
    );

    let seconds: u64 = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let (by_second, errors) = rt.block_on(load(addr, seconds))?;
    let mut lat: Vec<Duration> = by_second.concat();
    lat.sort();
    let (p50, p99, max) = (pct(&lat, 0.5), pct(&lat, 0.99), pct(&lat, 1.0));
    println!(
        "{name}: /proxy?country=XX at {RATE}/s for {seconds} s ({} requests, {errors} not 2xx): \
         p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms (target p99 <= {P99_MS} ms: {})",
        lat.len(),
        ms(p50),
        ms(p99),
        ms(max),
        verdict(ms(p99) <= P99_MS && errors == 0)
    );
    let seconds: Vec<String> = by_second
        .iter()
        .map(|s| format!("{:.1}", ms(pct(s, 0.99))))
        .collect();
    println!(
        "{name}: /proxy's p99 (ms) in each second of the load: {}",
        seconds.join(" ")
    );
    let (rss1, hwm1) = rss(pid).unwrap_or_default();
    println!("{name}: after the load RSS {rss1:.0} MB, peak {hwm1:.0} MB");

    for path in ["/stats", "/sources", "/"] {
        let mut times = Vec::new();
        let mut size = 0;
        for _ in 0..10 {
            let (status, _, took, bytes) = get(addr, path)?;
            anyhow::ensure!(status == 200, "{name}: {path} answered {status}");
            times.push(took);
            size = bytes;
        }
        times.sort();
        println!(
            "{name}: {path}: median {:.1} ms, slowest {:.1} ms of 10 ({size} bytes) (target <= \
             {PAGE_MS} ms: {})",
            ms(times[5]),
            ms(times[9]),
            verdict(ms(times[9]) <= PAGE_MS)
        );
    }

    for path in ["/export?format=json", "/export?format=csv"] {
        let (_, before) = rss(pid).unwrap_or_default();
        let (status, first, took, bytes) = get(addr, path)?;
        anyhow::ensure!(status == 200, "{name}: {path} answered {status}");
        let (_, after) = rss(pid).unwrap_or_default();
        println!(
            "{name}: {path}: first byte {:.0} ms, whole {:.2} s, {:.1} MB; serve's peak RSS \
             {before:.0} -> {after:.0} MB (target <= {RSS_MB} MB: {})",
            ms(first),
            took.as_secs_f64(),
            bytes as f64 / 1e6,
            verdict(after <= RSS_MB)
        );
    }

    for args in [
        &["--status", "all", "--format", "csv"][..],
        &["--status", "alive", "--format", "json"][..],
    ] {
        let (first, took, bytes, peak) = cli_export(dir, &config, args)?;
        println!(
            "{name}: CLI export {}: first byte {:.0} ms, whole {:.2} s, {:.1} MB; peak RSS {peak:.0} \
             MB (target <= {RSS_MB} MB: {})",
            args.join(" "),
            ms(first),
            took.as_secs_f64(),
            bytes as f64 / 1e6,
            verdict(peak <= RSS_MB)
        );
    }
    let mut counts: Vec<(f64, f64)> = (0..3)
        .map(|_| cli_stats(dir, &config))
        .collect::<anyhow::Result<_>>()?;
    counts.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (wall, cpu) = counts[1];
    println!("{name}: a full count (CLI stats): wall {wall:.2} s, CPU {cpu:.2} s (median of 3)");
    let (rss2, hwm2) = rss(pid).unwrap_or_default();
    println!(
        "{name}: serve at the end RSS {rss2:.0} MB, peak {hwm2:.0} MB (target <= {RSS_MB} MB: {})",
        verdict(hwm2 <= RSS_MB)
    );
    drop(daemon);
    if std::env::var_os("BENCH_LOG").is_some() {
        let kept = std::env::temp_dir().join(format!("proxywarden-million-{name}-serve.log"));
        std::fs::copy(dir.join(format!("{name}-serve.log")), &kept)?;
        println!("{name}: serve's log kept in {}", kept.display());
    }
    Ok(())
}

fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let dir = tempfile::Builder::new()
        .prefix("proxywarden-million-bench-")
        .tempdir()?;
    let sources = write_lists(dir.path())?;
    let only = std::env::var("BENCH_BACKEND").unwrap_or_default();
    println!(
        "million bench: {TOTAL} proxies ({} alive, {} dead, {} never checked) per backend",
        TOTAL / 10,
        TOTAL * 6 / 10,
        TOTAL * 3 / 10
    );

    if only.is_empty() || only == "sqlite" {
        let file = dir.path().join("million.db");
        let fill = || -> anyhow::Result<()> {
            let c = rusqlite::Connection::open(&file)?;
            c.execute_batch(&verdicts_sql(proxywarden::store::now_ms(), false))?;
            c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")?;
            Ok(())
        };
        measure(
            &rt,
            dir.path(),
            "SQLite",
            &format!("path = \"{}\"", file.display()),
            &sources,
            &fill,
        )?;
        for suffix in ["", "-wal", "-shm"] {
            std::fs::remove_file(format!("{}{suffix}", file.display())).ok();
        }
    }

    if only.is_empty() || only == "postgres" {
        let server = postgres::PgServer::start();
        let (admin, conn) = rt.block_on(tokio_postgres::connect(
            &server.url(),
            tokio_postgres::NoTls,
        ))?;
        rt.spawn(conn);
        rt.block_on(admin.batch_execute("CREATE DATABASE million"))?;
        let url = server.url_as("postgres", "million");
        let fill = || -> anyhow::Result<()> {
            rt.block_on(async {
                let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await?;
                tokio::spawn(conn);
                c.batch_execute(&verdicts_sql(proxywarden::store::now_ms(), true))
                    .await?;
                c.batch_execute("VACUUM ANALYZE proxies").await?;
                anyhow::Ok(())
            })
        };
        measure(
            &rt,
            dir.path(),
            "PostgreSQL",
            &format!("url = \"{url}\""),
            &sources,
            &fill,
        )?;
    }
    Ok(())
}
