//! `cargo bench --bench harvest`: harvest write speed (issue 9, Must 7).
//! A list of 2,500,000 distinct proxies (`BENCH_HARVEST_N` to change it) in
//! a local text file is harvested by the release `proxywarden harvest`, run
//! as a child on a fresh database, twice: the first harvest (every proxy
//! new) and a re-harvest of the unchanged list (every proxy known). Each
//! run reports its wall time, the part of it spent storing (the source's
//! time in the harvest table minus the fetch-and-parse time the source's
//! row records), both per candidate, the child's CPU time (user + system,
//! per candidate: the steadiest figure on a shared machine) and its peak
//! RSS. Targets:
//! at most 3 µs per candidate stored, for new and for known proxies, and a
//! peak RSS of at most 300 MB.
//!
//! With `BENCH_OLD_BIN` naming an older `proxywarden` (build commit dbbd7e2
//! in a worktree), that binary runs the same harvests in the same run,
//! interleaved with this one, and the ratios new/old are printed.
//! `BENCH_REPEAT` runs each contender that many times (medians are
//! compared). The figures are printed next to their targets, not asserted;
//! wrong counts fail the run.
//!
//! Each `proxywarden` runs under a measuring process (this binary with
//! `--measure-child`) whose only child it is, so the peak RSS that process
//! reads for its children (getrusage) is that harvest's own.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const CHILD_ARG: &str = "--measure-child";
/// The older binary to compare with.
const OLD_BIN_ENV: &str = "BENCH_OLD_BIN";
/// Proxies in the list.
const N_ENV: &str = "BENCH_HARVEST_N";
const DEFAULT_N: usize = 2_500_000;
const SOURCE: &str = "big";

/// Targets of issue 9, Must 7.
const TARGET_US: f64 = 3.0;
const TARGET_RSS_MB: f64 = 300.0;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == CHILD_ARG) {
        return measure_child(&args[i + 1..]);
    }
    match orchestrate() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("harvest bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs `BIN ARGS...` in the working directory, with its stdout to
/// `harvest.out` there, and reports its wall time and peak RSS on stdout.
fn measure_child(args: &[String]) -> ExitCode {
    let (bin, rest) = args
        .split_first()
        .expect("usage: --measure-child BIN ARGS...");
    let out = std::fs::File::create("harvest.out").expect("create harvest.out");
    let started = Instant::now();
    let status = Command::new(bin)
        .args(rest)
        .stdin(Stdio::null())
        .stdout(out)
        .status()
        .expect("run the harvest");
    let wall = started.elapsed();
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .expect("getrusage");
    // Linux reports ru_maxrss in KiB.
    println!("wall_us {}", wall.as_micros());
    println!("maxrss_kib {}", usage.max_rss());
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() * 1_000_000 + t.tv_usec();
    println!(
        "cpu_us {}",
        micros(usage.user_time()) + micros(usage.system_time())
    );
    println!("status {}", status.code().unwrap_or(-1));
    ExitCode::SUCCESS
}

/// A small deterministic generator: the list must be the same every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Writes `n` distinct proxies with usable addresses, one per line, in no
/// particular order:
/// addresses are a permutation of the index (an odd multiplier is a
/// bijection on u32), ports from the common ones, one in ten with a
/// `socks5://` and one in ten with a `socks4://` prefix.
fn write_list(path: &Path, n: usize) -> std::io::Result<u64> {
    const PORTS: [u16; 8] = [80, 8080, 3128, 1080, 8888, 9999, 4145, 999];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut written = 0;
    for i in 0..=u32::MAX {
        if written == n {
            break;
        }
        let ip = std::net::Ipv4Addr::from(i.wrapping_mul(0x9e37_79b1).wrapping_add(0x0101_0101));
        // Addresses the parser refuses (multicast, broadcast...) or the
        // harvest drops (private, loopback, reserved...) would not be
        // stored: the list holds only usable, public ones, the same for an
        // older build.
        if !proxywarden::proxy::usable_ip(ip.into())
            || proxywarden::harvest::addresses::special_kind(ip.into()).is_some()
        {
            continue;
        }
        written += 1;
        let r = rng.next();
        let port = PORTS[(r % 8) as usize];
        let prefix = match r >> 8 & 15 {
            0 => "socks5://",
            1 => "socks4://",
            _ => "",
        };
        writeln!(out, "{prefix}{ip}:{port}")?;
    }
    out.flush()?;
    Ok(std::fs::metadata(path)?.len())
}

/// One binary's side: its directory, config and database.
struct Contender {
    name: &'static str,
    bin: PathBuf,
    dir: PathBuf,
}

/// What one harvest cost.
#[derive(Clone, Copy, Debug)]
struct Run {
    wall: Duration,
    store: Duration,
    cpu: Duration,
    rss_kib: u64,
    found: u64,
    new: u64,
}

impl Contender {
    fn config(&self, list: &Path) -> String {
        format!(
            r#"[database]
path = "{db}"

[harvest]
max_body = "1GiB"
max_per_source = 10000000
timeout = "600s"

[[sources]]
name = "{SOURCE}"
url = "{list}"
format = "text"
scheme = "http"
"#,
            db = self.dir.join("bench.db").display(),
            list = list.display(),
        )
    }

    /// A fresh directory and database.
    fn reset(&self, list: &Path) -> anyhow::Result<()> {
        if self.dir.exists() {
            std::fs::remove_dir_all(&self.dir)?;
        }
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(self.dir.join("proxywarden.toml"), self.config(list))?;
        Ok(())
    }

    /// Runs one `proxywarden harvest` under a measuring process.
    fn harvest(&self) -> anyhow::Result<Run> {
        let exe = std::env::current_exe()?;
        let out = Command::new(exe)
            .arg(CHILD_ARG)
            .arg(&self.bin)
            .args(["--config", "proxywarden.toml", "harvest"])
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()?;
        anyhow::ensure!(out.status.success(), "the measuring process failed");
        let report = String::from_utf8_lossy(&out.stdout);
        let field = |name: &str| -> anyhow::Result<u64> {
            report
                .lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .ok_or_else(|| anyhow::anyhow!("no {name} from the measuring process"))
        };
        let printed = std::fs::read_to_string(self.dir.join("harvest.out"))?;
        anyhow::ensure!(
            field("status ")? == 0,
            "{} harvest failed:\n{printed}",
            self.name
        );
        // SOURCE  FOUND  NEW  HTTP  TIME  ERROR
        let row: Vec<&str> = printed
            .lines()
            .find(|l| l.split_whitespace().next() == Some(SOURCE))
            .ok_or_else(|| anyhow::anyhow!("no {SOURCE} row in:\n{printed}"))?
            .split_whitespace()
            .collect();
        let secs: f64 = row
            .get(4)
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no time in the {SOURCE} row:\n{printed}"))?;
        let db = rusqlite::Connection::open(self.dir.join("bench.db"))?;
        let fetch_parse_ms: i64 = db.query_row(
            "SELECT last_duration_ms FROM sources WHERE name = ?1",
            [SOURCE],
            |r| r.get(0),
        )?;
        Ok(Run {
            wall: Duration::from_micros(field("wall_us ")?),
            cpu: Duration::from_micros(field("cpu_us ")?),
            store: Duration::from_secs_f64((secs - fetch_parse_ms as f64 / 1e3).max(0.0)),
            rss_kib: field("maxrss_kib ")?,
            found: row.get(1).and_then(|v| v.parse().ok()).unwrap_or(0),
            new: row.get(2).and_then(|v| v.parse().ok()).unwrap_or(0),
        })
    }

    /// How many proxies the database holds.
    fn stored(&self) -> anyhow::Result<u64> {
        let db = rusqlite::Connection::open(self.dir.join("bench.db"))?;
        let n: i64 = db.query_row("SELECT count(*) FROM proxies", [], |r| r.get(0))?;
        Ok(n as u64)
    }
}

fn orchestrate() -> anyhow::Result<()> {
    let n: usize = std::env::var(N_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_N);
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let tmp = tempfile::tempdir()?;
    let list = tmp.path().join("list.txt");
    let bytes = write_list(&list, n)?;
    let mut contenders = Vec::new();
    match std::env::var_os(OLD_BIN_ENV) {
        Some(bin) => contenders.push(Contender {
            name: "old",
            bin: PathBuf::from(bin),
            dir: tmp.path().join("old"),
        }),
        None => println!(
            "harvest bench: {OLD_BIN_ENV} is not set: measuring this build alone \
             (build commit dbbd7e2's proxywarden and name it there to compare)"
        ),
    }
    contenders.push(Contender {
        name: "new",
        bin: PathBuf::from(env!("CARGO_BIN_EXE_proxywarden")),
        dir: tmp.path().join("new"),
    });
    println!(
        "harvest bench: {n} distinct proxies, a {:.1} MB text file, {} CPUs, {repeat} round(s)",
        bytes as f64 / 1e6,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    // [contender][pass] → runs; pass 0 is the first harvest, 1 the re-harvest.
    let mut results: Vec<[Vec<Run>; 2]> = contenders.iter().map(|_| [vec![], vec![]]).collect();
    let mut problems = Vec::new();
    // Interleaved, so that a busy spell on the machine does not fall on one
    // contender only.
    for round in 1..=repeat {
        for (c, r) in contenders.iter().zip(&mut results) {
            c.reset(&list)?;
            for (pass, want_new) in [(0, n as u64), (1, 0)] {
                let run = c.harvest()?;
                let stored = c.stored()?;
                print_run(c.name, round, pass, n, &run);
                if run.found != n as u64 || run.new != want_new || stored != n as u64 {
                    problems.push(format!(
                        "{} #{round} {}: found {}, new {} (want {n} and {want_new}), stored {stored}",
                        c.name,
                        pass_name(pass),
                        run.found,
                        run.new
                    ));
                }
                r[pass].push(run);
            }
        }
    }
    let median = |runs: &[Run], f: &dyn Fn(&Run) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for pass in 0..2 {
        let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
        let figures: Vec<(f64, f64, f64, f64)> = results
            .iter()
            .map(|r| {
                (
                    median(&r[pass], &|x| per(x.store)),
                    median(&r[pass], &|x| per(x.wall)),
                    median(&r[pass], &|x| per(x.cpu)),
                    median(&r[pass], &|x| x.rss_kib as f64 * 1024.0 / 1e6),
                )
            })
            .collect();
        if let [
            (old_store, old_wall, old_cpu, old_rss),
            (new_store, new_wall, new_cpu, new_rss),
        ] = figures[..]
        {
            println!(
                "[{}] new/old: store {new_store:.2} / {old_store:.2} µs per candidate = {:.3}x; \
                 whole harvest {new_wall:.2} / {old_wall:.2} µs = {:.3}x; CPU {new_cpu:.2} / {old_cpu:.2} µs = {:.3}x; \
                 peak RSS {new_rss:.0} / {old_rss:.0} MB = {:.2}x",
                pass_name(pass),
                new_store / old_store,
                new_wall / old_wall,
                new_cpu / old_cpu,
                new_rss / old_rss,
            );
        }
        if let Some(&(store, _, cpu, rss)) = figures.last() {
            println!(
                "[{}] this build: store {store:.2} µs per candidate (target <= {TARGET_US:.1}), \
                 CPU {cpu:.2} µs per candidate, peak RSS {rss:.0} MB (target <= {TARGET_RSS_MB:.0})",
                pass_name(pass)
            );
        }
    }
    anyhow::ensure!(problems.is_empty(), "wrong counts: {}", problems.join("; "));
    Ok(())
}

fn pass_name(pass: usize) -> &'static str {
    ["first harvest", "re-harvest"][pass]
}

fn print_run(name: &str, round: usize, pass: usize, n: usize, r: &Run) {
    let per = |d: Duration| d.as_secs_f64() * 1e6 / n as f64;
    println!(
        "[{}] {name:>3} #{round}: wall {:.2} s ({:.2} µs per candidate), store {:.2} s ({:.2} µs per candidate), \
         CPU {:.2} µs per candidate, peak RSS {:.0} MB; found {}, new {}",
        pass_name(pass),
        r.wall.as_secs_f64(),
        per(r.wall),
        r.store.as_secs_f64(),
        per(r.store),
        per(r.cpu),
        r.rss_kib as f64 * 1024.0 / 1e6,
        r.found,
        r.new,
    );
}
