//! `cargo bench --bench nodes`: several `serve` nodes on one PostgreSQL
//! database: checks split between nodes. A farm of 4,000 working
//! fake proxies is listed in a source file; the judge answers requests that
//! come through a proxy 200 ms late, as a distant judge behind free proxies
//! does, so a round is bound by checks in flight, not by a core. The
//! built `proxywarden serve` binary runs as each node, at concurrency 100
//! per node, on a real PostgreSQL server the bench starts (a database per
//! pass), and once on SQLite. Passes, in order:
//!
//! - `one`: one node on PostgreSQL harvests and checks the farm;
//! - `two`: two nodes on one PostgreSQL database do the same, and then both
//!   must serve the same pool (`/export`);
//! - `kill`: two nodes, and one is killed with SIGKILL a quarter into the
//!   round: the other must finish it (its leases expire and are taken);
//! - `sqlite`: one node on SQLite, for the PostgreSQL/SQLite ratios;
//! - `/proxy` throughput of the `one` and `sqlite` nodes, 16 clients for
//!   3 s each, alternated twice.
//!
//! A round's time is read from the database: from the harvest's insert of
//! the proxies (`min(first_seen)`) to the last verdict (`max(last_checked)`).
//! Judge requests are those that came through a proxy. CPU is each node
//! process's user+system time. Targets: two nodes ≤ 0.65× one node's
//! round, judge requests ≤ 1.1× one node's. The figures are printed next to
//! their targets, not asserted; a pass that does not finish fails the run.
//! The farm and judge run in a child (`--serve-farm`) so their CPU stays
//! out of the nodes' figures.

#[allow(dead_code)]
#[path = "../tests/common/fakes.rs"]
mod fakes;
#[allow(dead_code)]
#[path = "../tests/common/judges.rs"]
mod judges;
#[allow(dead_code)]
#[path = "../tests/common/postgres.rs"]
mod postgres;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

const FARM_ARG: &str = "--serve-farm";
/// Working proxies in the farm.
const PROXIES: usize = 4_000;
/// Checks in flight per node.
const CONCURRENCY: usize = 100;
/// How late the judge answers a request through a proxy.
const JUDGE_DELAY: Duration = Duration::from_millis(200);
/// How long a lease holds: a killed node's proxies wait this long.
const LEASE: &str = "10s";
/// The farm's proxies forward from these, in turn.
const UPSTREAM_BINDS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(127, 0, 0, 2),
    Ipv4Addr::new(127, 0, 0, 3),
    Ipv4Addr::new(127, 0, 0, 4),
    Ipv4Addr::new(127, 0, 0, 5),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == FARM_ARG) {
        serve_farm();
        return ExitCode::SUCCESS;
    }
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    match rt.block_on(run()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nodes bench failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The farm child: the judge and the proxies; prints `judge URL`, one
/// `alive ADDR` per proxy and `ready`; then answers each `count` line on
/// stdin with the judge's proxied requests so far, until stdin closes.
fn serve_farm() {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        fakes::raise_nofile_limit();
        let proxied = Arc::new(AtomicUsize::new(0));
        let counter = proxied.clone();
        let app = axum::Router::new().route(
            "/judge",
            axum::routing::get(
                move |info: axum::extract::ConnectInfo<SocketAddr>,
                      m: axum::http::Method,
                      u: axum::http::Uri,
                      h: axum::http::HeaderMap| {
                    let through_proxy = info.0.ip() != IpAddr::from([127, 0, 0, 1]);
                    if through_proxy {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    async move {
                        if through_proxy {
                            tokio::time::sleep(JUDGE_DELAY).await;
                        }
                        axum::response::IntoResponse::into_response(
                            proxywarden::api::judge::judge(info, m, u, h).await,
                        )
                    }
                },
            ),
        );
        let judge = judges::Judge::plain_with(app).await;
        let mut farms = Vec::new();
        for (i, ip) in UPSTREAM_BINDS.iter().enumerate() {
            let share =
                PROXIES / UPSTREAM_BINDS.len() + usize::from(i < PROXIES % UPSTREAM_BINDS.len());
            farms.push(fakes::FakeFarm::start(share, 0, Some(IpAddr::V4(*ip))).await);
        }
        {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            writeln!(out, "judge {}", judge.url()).expect("write to the parent");
            for farm in &farms {
                for a in farm.alive_addrs() {
                    writeln!(out, "alive {a}").expect("write to the parent");
                }
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut lines =
            tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(tokio::io::stdin()));
        while let Ok(Some(_)) = lines.next_line().await {
            println!("count {}", proxied.load(Ordering::SeqCst));
        }
        drop(farms);
        drop(judge);
    });
    rt.shutdown_background();
}

/// The farm child, seen from the bench.
struct Farm {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    judge: String,
    alive: Vec<SocketAddr>,
}

impl Farm {
    fn start() -> anyhow::Result<Farm> {
        let mut child = Command::new(std::env::current_exe()?)
            .arg(FARM_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start the farm")?;
        let stdin = child.stdin.take().context("farm stdin")?;
        let mut stdout = BufReader::new(child.stdout.take().context("farm stdout")?);
        let (mut judge, mut alive) = (String::new(), Vec::new());
        loop {
            let mut line = String::new();
            if stdout.read_line(&mut line)? == 0 {
                bail!("the farm exited before it was ready");
            }
            match line.trim().split_once(' ') {
                Some(("judge", url)) => judge = url.to_owned(),
                Some(("alive", a)) => alive.push(a.parse()?),
                _ if line.trim() == "ready" => break,
                _ => bail!("the farm said {line:?}"),
            }
        }
        Ok(Farm {
            child,
            stdin,
            stdout,
            judge,
            alive,
        })
    }

    /// Judge requests through proxies so far.
    fn judged(&mut self) -> anyhow::Result<u64> {
        writeln!(self.stdin, "count")?;
        self.stdin.flush()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line)?;
        Ok(line
            .trim()
            .strip_prefix("count ")
            .context("farm count")?
            .parse()?)
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `serve` process.
struct Node {
    child: Child,
    pid: u32,
    api: SocketAddr,
}

impl Node {
    fn cpu(&self) -> f64 {
        cpu_seconds(self.pid)
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// CPU seconds (user + system) of `pid` so far, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let after = stat.rsplit_once(')').map_or("", |(_, s)| s);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // Fields 14 and 15 (utime, stime) of the whole line are 11 and 12
    // after the command name.
    (ticks(11) + ticks(12)) / 100.0
}

/// An HTTP client with the crate's TLS set-up (no other crypto provider
/// is compiled in).
fn http_client() -> reqwest::Client {
    let tls =
        proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
        .no_proxy()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Where a node keeps its data: PostgreSQL (a URL) or a SQLite file.
#[derive(Clone)]
enum Db {
    Postgres(String),
    Sqlite(PathBuf),
}

/// Starts node `id` in `dir` on `db`, harvesting `list` and asking
/// `judge`; waits until its API answers.
async fn start_node(
    bin: &str,
    dir: &Path,
    id: &str,
    db: &Db,
    list: &Path,
    judge: &str,
) -> anyhow::Result<Node> {
    let dir = dir.join(id);
    std::fs::create_dir_all(&dir)?;
    // A port no farm proxy has (on its own address): the harvest never
    // stores the node's own API port as a proxy on a loopback address.
    let farm = std::fs::read_to_string(list)?;
    let port = loop {
        let port = free_port();
        if !farm.lines().any(|l| l.ends_with(&format!(":{port}"))) {
            break port;
        }
    };
    let database = match db {
        Db::Postgres(url) => format!(
            "path = \"{}\"\nurl = \"{url}\"",
            dir.join("local.db").display()
        ),
        Db::Sqlite(path) => format!("path = \"{}\"", path.display()),
    };
    let config = format!(
        "[database]\n{database}\n\n[node]\nid = \"{id}\"\nlease = \"{LEASE}\"\n\n\
         [harvest]\nallow_private_addresses = true\n\n\
         [check]\njudges = [{{ url = \"{judge}\", marker = \"proxywarden-judge\" }}]\n\
         concurrency = {CONCURRENCY}\nconnect_timeout = \"2s\"\ntimeout = \"4s\"\nhttps = false\n\
         serve_recheck_min = \"10m\"\nrecheck_alive = \"10m\"\n\n\
         [api]\nlisten = \"127.0.0.1:{port}\"\n\n[gateway]\nenabled = false\n\n\
         [[sources]]\nname = \"farm\"\nurl = \"{}\"\n",
        list.display()
    );
    let path = dir.join("proxywarden.toml");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.join("serve.log"))?;
    let child = Command::new(bin)
        .arg("-c")
        .arg(&path)
        .arg("serve")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {bin} serve"))?;
    let pid = child.id();
    let node = Node {
        child,
        pid,
        api: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let http = http_client();
    let deadline = Instant::now() + Duration::from_secs(30);
    while http
        .get(format!("http://{}/healthz", node.api))
        .send()
        .await
        .is_err()
    {
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default();
            bail!("node {id} never answered; its log:\n{log}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(node)
}

/// (proxies stored, proxies with a verdict, round time in ms: first
/// harvested to last verdict).
async fn progress(db: &Db) -> anyhow::Result<(i64, i64, i64)> {
    const SQL: &str = "SELECT count(*), count(last_checked),
                              coalesce(max(last_checked) - min(first_seen), 0) FROM proxies";
    match db {
        Db::Postgres(url) => {
            let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            let driver = tokio::spawn(conn);
            let row = client.query_one(SQL, &[]).await?;
            drop(client);
            let _ = driver.await;
            Ok((row.get(0), row.get(1), row.get(2)))
        }
        Db::Sqlite(path) => {
            let path = path.clone();
            Ok(tokio::task::spawn_blocking(move || {
                let c = rusqlite::Connection::open_with_flags(
                    &path,
                    rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
                )?;
                c.busy_timeout(Duration::from_secs(5))?;
                c.query_row(SQL, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            })
            .await??)
        }
    }
}

/// Waits until every proxy of the farm has a verdict; `on` is called on
/// each look with how many have one.
async fn until_round_done(db: &Db, mut on: impl FnMut(i64)) -> anyhow::Result<i64> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let (stored, checked, took) = progress(db).await.unwrap_or((0, 0, 0));
        on(checked);
        if stored == PROXIES as i64 && checked == stored {
            return Ok(took);
        }
        if Instant::now() > deadline {
            bail!("the round did not finish: {checked} of {stored} checked");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What one pass measured.
struct Pass {
    round_ms: i64,
    judged: u64,
    cpu: f64,
}

/// Creates database `name` on the server.
async fn create_db(admin: &str, name: &str) -> anyhow::Result<String> {
    let (client, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let (server, _) = admin.rsplit_once('/').context("a database URL")?;
    Ok(format!("{server}/{name}"))
}

/// The set of proxies a node exports.
async fn exported(node: &Node) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let text = http_client()
        .get(format!("http://{}/export?format=txt", node.api))
        .send()
        .await?
        .text()
        .await?;
    Ok(text.lines().map(str::to_owned).collect())
}

/// `/proxy` answers per second from `node`: 16 clients for 3 s.
async fn proxy_throughput(node: &Node) -> anyhow::Result<f64> {
    let url = format!("http://{}/proxy", node.api);
    let end = Instant::now() + Duration::from_secs(3);
    let ok = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (url, ok) = (url.clone(), ok.clone());
        tasks.push(tokio::spawn(async move {
            let http = http_client();
            while Instant::now() < end {
                if let Ok(r) = http.get(&url).send().await
                    && r.status() == 200
                    && r.bytes().await.is_ok()
                {
                    ok.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for t in tasks {
        t.await?;
    }
    Ok(ok.load(Ordering::Relaxed) as f64 / 3.0)
}

async fn run() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let dir = tempfile::Builder::new()
        .prefix("proxywarden-nodes-bench-")
        .tempdir()?;
    let mut farm = Farm::start()?;
    let list = dir.path().join("farm.txt");
    let text: String = farm.alive.iter().map(|a| format!("{a}\n")).collect();
    std::fs::write(&list, text)?;
    let judge = farm.judge.clone();
    let server = tokio::task::spawn_blocking(postgres::PgServer::start).await?;
    let admin = server.url();
    println!(
        "nodes bench: {PROXIES} working proxies, judge {} ms late through a proxy, \
         concurrency {CONCURRENCY} per node, lease {LEASE}",
        JUDGE_DELAY.as_millis()
    );

    // One node on PostgreSQL.
    let db_one = Db::Postgres(create_db(&admin, "one").await?);
    let judged_before = farm.judged()?;
    let one_node = start_node(bin, dir.path(), "one", &db_one, &list, &judge).await?;
    let round_ms = until_round_done(&db_one, |_| {}).await?;
    let one = Pass {
        round_ms,
        judged: farm.judged()? - judged_before,
        cpu: one_node.cpu(),
    };
    println!(
        "one node (PostgreSQL): round {:.2} s, judge requests {}, node CPU {:.2} s",
        one.round_ms as f64 / 1000.0,
        one.judged,
        one.cpu
    );

    // Two nodes on one PostgreSQL database.
    let db_two = Db::Postgres(create_db(&admin, "two").await?);
    let judged_before = farm.judged()?;
    let (a, b) = tokio::join!(
        start_node(bin, dir.path(), "two-a", &db_two, &list, &judge),
        start_node(bin, dir.path(), "two-b", &db_two, &list, &judge)
    );
    let (a, b) = (a?, b?);
    let round_ms = match until_round_done(&db_two, |_| {}).await {
        Ok(ms) => ms,
        Err(e) => {
            for id in ["two-a", "two-b"] {
                let log = std::fs::read_to_string(dir.path().join(id).join("serve.log"))?;
                eprintln!("--- {id}:\n{log}");
            }
            return Err(e);
        }
    };
    let two = Pass {
        round_ms,
        judged: farm.judged()? - judged_before,
        cpu: a.cpu() + b.cpu(),
    };
    // Both serve the same pool: every proxy, the same set.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ea, eb) = loop {
        let (ea, eb) = (exported(&a).await?, exported(&b).await?);
        if (ea.len() == PROXIES && ea == eb) || Instant::now() > deadline {
            break (ea, eb);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ratio = two.round_ms as f64 / one.round_ms as f64;
    let judge_ratio = two.judged as f64 / one.judged as f64;
    println!(
        "two nodes (PostgreSQL): round {:.2} s = {ratio:.2}× one node (target ≤ 0.65), \
         judge requests {} = {judge_ratio:.2}× (target ≤ 1.1), nodes' CPU {:.2} s",
        two.round_ms as f64 / 1000.0,
        two.judged,
        two.cpu
    );
    println!(
        "both serve the same pool: {} (a exports {}, b exports {})",
        if ea == eb && ea.len() == PROXIES {
            "yes"
        } else {
            "NO"
        },
        ea.len(),
        eb.len()
    );
    drop((a, b));

    // Two nodes, one killed with SIGKILL a quarter into the round.
    let db_kill = Db::Postgres(create_db(&admin, "killed").await?);
    let judged_before = farm.judged()?;
    let (a, b) = tokio::join!(
        start_node(bin, dir.path(), "kill-a", &db_kill, &list, &judge),
        start_node(bin, dir.path(), "kill-b", &db_kill, &list, &judge)
    );
    let (mut a, b) = (a?, b?);
    let mut killed_at = None;
    let round_ms = until_round_done(&db_kill, |checked| {
        if killed_at.is_none() && checked >= PROXIES as i64 / 4 {
            a.kill();
            killed_at = Some(checked);
        }
    })
    .await?;
    let judged = farm.judged()? - judged_before;
    println!(
        "two nodes, one killed (SIGKILL) after {} verdicts: the other finished the round \
         in {:.2} s; judge requests {judged} ({} more than proxies: checks the killed node \
         had in flight or leased)",
        killed_at.unwrap_or(0),
        round_ms as f64 / 1000.0,
        judged.saturating_sub(PROXIES as u64)
    );
    drop((a, b));

    // One node on SQLite.
    let db_sqlite = Db::Sqlite(dir.path().join("sqlite.db"));
    let judged_before = farm.judged()?;
    let sqlite_node = start_node(bin, dir.path(), "sqlite", &db_sqlite, &list, &judge).await?;
    let round_ms = until_round_done(&db_sqlite, |_| {}).await?;
    let sqlite = Pass {
        round_ms,
        judged: farm.judged()? - judged_before,
        cpu: sqlite_node.cpu(),
    };
    println!(
        "one node (SQLite): round {:.2} s, judge requests {}, node CPU {:.2} s",
        sqlite.round_ms as f64 / 1000.0,
        sqlite.judged,
        sqlite.cpu
    );
    println!(
        "PostgreSQL / SQLite, one node: round time {:.2}×, node CPU {:.2}×",
        one.round_ms as f64 / sqlite.round_ms as f64,
        one.cpu / sqlite.cpu
    );
    // /proxy throughput, alternated.
    let (mut pg_rate, mut sqlite_rate) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        pg_rate.push(proxy_throughput(&one_node).await?);
        sqlite_rate.push(proxy_throughput(&sqlite_node).await?);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    println!(
        "/proxy throughput, 16 clients: PostgreSQL {:.0}/s, SQLite {:.0}/s: {:.2}×",
        mean(&pg_rate),
        mean(&sqlite_rate),
        mean(&pg_rate) / mean(&sqlite_rate)
    );
    drop(one_node);
    drop(sqlite_node);
    drop(server);
    Ok(())
}
