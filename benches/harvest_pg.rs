//! `cargo bench --bench harvest_pg`: the same harvest into PostgreSQL and
//! into SQLite, in one run. Ten local text lists of 100,000 proxies each
//! (1,000,000 candidates) that overlap as public lists do: each shares
//! 70 % of its proxies with the next, 370,000 distinct in all. The release
//! `proxywarden harvest` runs as a child on a fresh database of each
//! backend (a PostgreSQL server the bench starts on loopback, as the tests
//! do, and a SQLite file), `BENCH_REPEAT` times each (default 3),
//! interleaved; the medians of wall time are printed with the ratio
//! PostgreSQL / SQLite. Target: at most 3×. Both databases must end up
//! with the same distinct proxies and links, or the run fails.
//!
//! The server runs as the tests run it (`fsync=off`,
//! `synchronous_commit=off`): the figure is the store's work, not the
//! disk's.

#[allow(dead_code)]
#[path = "../tests/common/postgres.rs"]
mod postgres;

use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const LISTS: usize = 10;
const PER_LIST: usize = 100_000;
/// How far each list starts after the previous one: it shares
/// `PER_LIST - STRIDE` proxies with the next.
const STRIDE: usize = 30_000;
const DISTINCT: usize = (LISTS - 1) * STRIDE + PER_LIST;
const TARGET_RATIO: f64 = 3.0;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("harvest_pg bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The `i`th proxy of the universe, on a public-looking address.
fn proxy(i: usize) -> String {
    format!(
        "11.{}.{}.{}:{}",
        (i >> 16) & 255,
        (i >> 8) & 255,
        i & 255,
        8000 + i % 1000
    )
}

/// Writes the lists into `dir`; their `[[sources]]` blocks.
fn write_lists(dir: &Path) -> anyhow::Result<String> {
    let mut toml = String::new();
    for l in 0..LISTS {
        let path = dir.join(format!("list{l}.txt"));
        let text: String = (l * STRIDE..l * STRIDE + PER_LIST)
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

/// One `proxywarden harvest` on the database `database` (a TOML line of
/// `[database]`): its wall time.
fn harvest(dir: &Path, name: &str, database: &str, sources: &str) -> anyhow::Result<Duration> {
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "[database]\n{database}\n\n[harvest]\nmax_body = \"16MiB\"\n\
             allow_private_addresses = true\n\n{sources}"
        ),
    )?;
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .arg("harvest")
        .arg("-c")
        .arg(&config)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()?;
    let took = started.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "{name}: harvest failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(took)
}

/// Distinct proxies and source links in the SQLite file.
fn sqlite_counts(path: &Path) -> anyhow::Result<(i64, i64)> {
    let c = rusqlite::Connection::open(path)?;
    let proxies = c.query_row("SELECT count(*) FROM proxies", [], |r| r.get(0))?;
    let links = c.query_row("SELECT count(*) FROM proxy_sources", [], |r| r.get(0))?;
    Ok((proxies, links))
}

/// Distinct proxies and source links in the PostgreSQL database.
async fn postgres_counts(url: &str) -> anyhow::Result<(i64, i64)> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    let proxies = client
        .query_one("SELECT count(*) FROM proxies", &[])
        .await?
        .get(0);
    let links = client
        .query_one("SELECT count(*) FROM proxy_sources", &[])
        .await?
        .get(0);
    Ok((proxies, links))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn run() -> anyhow::Result<()> {
    let rt = tokio::runtime::Runtime::new()?;
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
        .max(1);
    let dir = tempfile::Builder::new()
        .prefix("proxywarden-harvest-pg-bench-")
        .tempdir()?;
    let sources = write_lists(dir.path())?;
    let server = postgres::PgServer::start();
    let (admin, conn) = rt.block_on(tokio_postgres::connect(
        &server.url(),
        tokio_postgres::NoTls,
    ))?;
    rt.spawn(conn);
    println!(
        "harvest_pg bench: {LISTS} lists of {PER_LIST} ({} candidates, {DISTINCT} distinct), \
         {repeat} run(s) per backend",
        LISTS * PER_LIST
    );
    let (mut pg_times, mut sqlite_times) = (Vec::new(), Vec::new());
    for run in 0..repeat {
        let db = format!("bench{run}");
        rt.block_on(admin.batch_execute(&format!("CREATE DATABASE {db}")))?;
        let url = server.url_as("postgres", &db);
        let pg = harvest(
            dir.path(),
            &format!("pg{run}"),
            &format!("url = \"{url}\""),
            &sources,
        )?;
        let file = dir.path().join(format!("sqlite{run}.db"));
        let sqlite = harvest(
            dir.path(),
            &format!("sqlite{run}"),
            &format!("path = \"{}\"", file.display()),
            &sources,
        )?;
        let pg_counts = rt.block_on(postgres_counts(&url))?;
        let sqlite_counts = sqlite_counts(&file)?;
        anyhow::ensure!(
            pg_counts == sqlite_counts && pg_counts.0 == DISTINCT as i64,
            "the backends stored different things: PostgreSQL {pg_counts:?}, SQLite \
             {sqlite_counts:?} (proxies, links), {DISTINCT} distinct expected"
        );
        println!(
            "run {run}: PostgreSQL {:.2} s, SQLite {:.2} s ({} proxies, {} links each)",
            pg.as_secs_f64(),
            sqlite.as_secs_f64(),
            pg_counts.0,
            pg_counts.1
        );
        pg_times.push(pg);
        sqlite_times.push(sqlite);
        std::fs::remove_file(&file).ok();
    }
    let (pg, sqlite) = (median(pg_times), median(sqlite_times));
    let ratio = pg.as_secs_f64() / sqlite.as_secs_f64();
    println!(
        "median: PostgreSQL {:.2} s, SQLite {:.2} s, ratio {ratio:.2}x (target at most \
         {TARGET_RATIO}x): {}",
        pg.as_secs_f64(),
        sqlite.as_secs_f64(),
        if ratio <= TARGET_RATIO {
            "met"
        } else {
            "NOT met"
        }
    );
    Ok(())
}
