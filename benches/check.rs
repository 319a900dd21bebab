//! `cargo bench --bench check`: the check-round budgets on loopback. A round
//! of 10,000 fake proxies (most silent, the rest answering or refusing) should
//! finish within 1.2× of the ideal schedule (silent × timeout ÷ concurrency)
//! at concurrency 2,000 and spend at most 0.3 ms of CPU per alive plain-HTTP
//! check (measured on a pass of working proxies only); 10,000 checks in
//! flight should stay under 200 MB of peak memory.
//! The figures are printed next to their targets, not asserted; wrong
//! verdicts (a working proxy found dead, say) fail the run.
//!
//! Three roles, one binary. Without arguments it runs each pass in a fresh
//! measuring process (`--measure PASS`), so every pass's peak memory is its
//! own. A measuring process starts the judge and the fake proxies in a
//! child (`--serve-farm ALIVE SILENT`) so that their CPU and memory stay out
//! of the figures, then harvests, checks and reports. `BENCH_TIMELINE=1`
//! prints the count of finished checks over time to stderr.
//!
//! `versus` (issue 9, Must 6) compares two builds in one run: this one and
//! an older `proxywarden` binary named by `BENCH_OLD_BIN` (build commit
//! dbbd7e2 in a worktree). A mixed farm of 10,000 loopback proxies (3,150
//! working, 300 of them slow; 1,200 that accept and never answer; liars;
//! the rest refusing or hanging up; http, socks5 and socks4) is checked by
//! each binary's own `proxywarden check --all` on its own database of the
//! same list, after one unmeasured round each (so the measured round is a
//! re-check round, as a daemon's are), at concurrency 1,000, connect 1 s,
//! total 2 s, with an https judge. Wall and CPU time are each child's own
//! (CPU from our `cutime`/`cstime` once it is reaped); verdicts are read
//! from its database and must have precision and recall 1.0 with every
//! liar dead. `cargo bench --bench check -- versus` runs this pass alone.
//! `BENCH_ROUND=first` measures a first round instead (a fresh database of
//! the list each time: every HTTPS support is due, no proxy was alive
//! before), `BENCH_HTTPS=off` turns the HTTPS test off, and `BENCH_REPEAT=N`
//! alternates the contenders N times. `BENCH_MID_BIN` names a third build
//! measured between the two (to tell apart what each step changed), and
//! `BENCH_WRAP` a tool each measured round runs under, `{name}` standing
//! for the contender (`BENCH_WRAP="strace -c -f -o /tmp/{name}.strace"`;
//! the tool's CPU is then counted too). The older build must know
//! `harvest.allow_private_addresses` (the farm is on loopback).
//!
//! `scale` (`cargo bench --bench check -- scale`) measures how a round's
//! cost grows: rounds of 10,000, 40,000 and 100,000 loopback proxies (half
//! working, a tenth silent, the rest refused; `BENCH_SCALE_SIZES` names
//! others), each in a fresh measuring process at concurrency 2,000, the
//! proxies in farm children of 12,000 listeners each on loopback addresses
//! of their own (127.0.110.1 and up; the refused ports on 127.0.120.x). Per
//! size it prints CPU per proxy, wall against the timeout floor (silent ×
//! timeout ÷ concurrency), the round's peak RSS and this process's
//! voluntary and involuntary context switches per proxy; then the growth
//! of each from one size to the next (target: CPU grows no faster than
//! the proxies, CPU per proxy flat).

#[allow(dead_code)]
#[path = "../tests/common/fakes.rs"]
mod fakes;
#[allow(dead_code)]
#[path = "../tests/common/judges.rs"]
mod judges;

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proxywarden::check::{CheckOptions, Checker, RoundProgress, check_round};
use proxywarden::config::Config;
use proxywarden::harvest::harvest_all;
use proxywarden::health::{Feedback, HealthIndex};
use proxywarden::model::Reason;
use proxywarden::store::Store;
use tokio_util::sync::CancellationToken;

const MEASURE_ARG: &str = "--measure";
const FARM_ARG: &str = "--serve-farm";
const MIXED_FARM_ARG: &str = "--serve-mixed-farm";
const VERSUS_ARG: &str = "versus";
/// The older binary `versus` compares with.
const OLD_BIN_ENV: &str = "BENCH_OLD_BIN";
/// A third binary `versus` measures beside the two, named "mid".
const MID_BIN_ENV: &str = "BENCH_MID_BIN";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const TIMEOUT: Duration = Duration::from_secs(2);

/// The farm's working proxies forward from these addresses in turn, so no
/// one address's ephemeral ports bound the upstream connections.
const UPSTREAM_BINDS: [Ipv4Addr; 4] = [
    Ipv4Addr::new(127, 0, 0, 2),
    Ipv4Addr::new(127, 0, 0, 3),
    Ipv4Addr::new(127, 0, 0, 4),
    Ipv4Addr::new(127, 0, 0, 5),
];
/// Closed ports live here: nothing else in the bench binds this address.
const CLOSED_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 9);
/// Descriptors kept free besides sockets (the database, pipes, the runtime).
const FD_MARGIN: u64 = 512;

/// One round's shape.
#[derive(Clone, Copy, Debug)]
struct Pass {
    /// For `--measure` and the report.
    name: &'static str,
    /// Working elite HTTP proxies in the farm.
    alive: usize,
    /// Listeners that accept and never answer.
    silent: usize,
    /// Ports where nothing listens (instant refusal).
    closed: usize,
    /// Checks in flight.
    concurrency: usize,
}

/// Silent proxies are a whole number of rounds of concurrency: equal
/// timeouts started together end together, so 5,000 silent at 2,000 would
/// take three full timeouts (1.2× the formula) on any checker.
///
/// The "alive" pass has working proxies only, so its CPU per check is the
/// cost of an alive check itself; in "mixed" the CPU of the silent and
/// refused checks is charged to the alive ones as well.
const PASSES: [Pass; 3] = [
    Pass {
        name: "alive",
        alive: 5_000,
        silent: 0,
        closed: 0,
        concurrency: 2_000,
    },
    Pass {
        name: "mixed",
        alive: 3_000,
        silent: 6_000,
        closed: 1_000,
        concurrency: 2_000,
    },
    Pass {
        name: "in-flight",
        alive: 0,
        silent: 10_000,
        closed: 0,
        concurrency: 10_000,
    },
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == MIXED_FARM_ARG) {
        let dir = args
            .get(i + 1)
            .unwrap_or_else(|| panic!("usage: {MIXED_FARM_ARG} DIR"));
        serve_mixed_farm(Path::new(dir));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == SCALE_FARM_ARG) {
        let count = |j: usize| -> usize {
            args.get(i + j)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("usage: {SCALE_FARM_ARG} ALIVE SILENT INDEX"))
        };
        let (listen, binds) = scale_farm_addrs(count(3));
        serve_farm_on(count(1), count(2), listen, &binds, false);
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == SCALE_JUDGE_ARG) {
        let (Some(dir), Some(tls)) = (args.get(i + 1), args.get(i + 2)) else {
            panic!("usage: {SCALE_JUDGE_ARG} DIR TLS");
        };
        serve_scale_judge(Path::new(dir), tls == "true");
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == SCALE_MEASURE_ARG) {
        let size = args.get(i + 1).and_then(|s| s.parse().ok());
        let Some(size) = size else {
            eprintln!("usage: {SCALE_MEASURE_ARG} PROXIES");
            return ExitCode::FAILURE;
        };
        return match measure_scale(size) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("check bench, scale {size}: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == SCALE_ARG) {
        return match scale() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("check bench, scale: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if args.iter().any(|a| a == VERSUS_ARG) {
        return match versus() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("check bench, versus: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(i) = args.iter().position(|a| a == FARM_ARG) {
        let count = |j: usize| -> usize {
            args.get(i + j)
                .and_then(|s| s.parse().ok())
                .unwrap_or_else(|| panic!("usage: {FARM_ARG} ALIVE SILENT"))
        };
        serve_farm(count(1), count(2));
        return ExitCode::SUCCESS;
    }
    if let Some(i) = args.iter().position(|a| a == MEASURE_ARG) {
        let name = args.get(i + 1).map(String::as_str).unwrap_or_default();
        let pass = PASSES
            .iter()
            .find(|p| p.name == name)
            .unwrap_or_else(|| panic!("no pass named {name:?}"));
        return match measure(*pass) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("check bench, pass {}: {e:#}", pass.name);
                ExitCode::FAILURE
            }
        };
    }
    orchestrate()
}

/// Runs every pass in its own measuring process, in order.
fn orchestrate() -> ExitCode {
    let exe = std::env::current_exe().expect("current exe");
    println!(
        "check bench: {} CPUs, connect timeout {:?}, timeout {:?}, https off, plain-HTTP judge on loopback",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        CONNECT_TIMEOUT,
        TIMEOUT,
    );
    let mut failed = false;
    for pass in PASSES {
        let status = Command::new(&exe)
            .args([MEASURE_ARG, pass.name])
            .status()
            .expect("run a measuring process");
        if !status.success() {
            eprintln!("check bench: pass {} failed ({status})", pass.name);
            failed = true;
        }
    }
    if let Err(e) = versus() {
        eprintln!("check bench, versus: {e:#}");
        failed = true;
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

// ---------------------------------------------------------------------------
// The farm child

/// Starts the judge and the farm, prints `judge URL`, one `alive ADDR` or
/// `silent ADDR` line per proxy and `ready`, then serves until stdin closes.
fn serve_farm(alive: usize, silent: usize) {
    serve_farm_on(alive, silent, fakes::FARM_IP, &UPSTREAM_BINDS, true);
}

/// [`serve_farm`] listening on `listen`, the working proxies forwarding
/// from `binds` in turn; with a judge of its own when `with_judge`.
fn serve_farm_on(
    alive: usize,
    silent: usize,
    listen: IpAddr,
    binds: &[Ipv4Addr],
    with_judge: bool,
) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        fakes::raise_nofile_limit();
        let judge = match with_judge {
            true => Some(judges::Judge::plain().await),
            false => None,
        };
        // One farm per upstream address; the silent listeners go with the
        // first, their upstream is never used.
        let mut farms = Vec::new();
        for (i, ip) in binds.iter().enumerate() {
            let share = alive / binds.len() + usize::from(i < alive % binds.len());
            let mute = if i == 0 { silent } else { 0 };
            farms.push(fakes::FakeFarm::start_at(listen, share, mute, Some(IpAddr::V4(*ip))).await);
        }
        {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            if let Some(judge) = &judge {
                writeln!(out, "judge {}", judge.url()).expect("write to the parent");
            }
            for farm in &farms {
                for a in farm.alive_addrs() {
                    writeln!(out, "alive {a}").expect("write to the parent");
                }
                for a in farm.silent_addrs() {
                    writeln!(out, "silent {a}").expect("write to the parent");
                }
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        // The parent closes our stdin when its round is over (or it dies).
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        drop(farms);
        drop(judge);
    });
    // Thousands of connection tasks need no orderly teardown.
    rt.shutdown_background();
}

/// The farm: one or more children (more when one process's open-file limit
/// cannot hold every listener and connection) and what they serve. Dropping
/// it closes the children's stdin, which stops them.
struct Farm {
    children: Vec<(Child, Option<ChildStdin>)>,
    /// The first child's judge; the others' go unused.
    judge: String,
    /// Every child's plain and TLS judges (the scale pass's judge
    /// children).
    judges: Vec<String>,
    tls_judges: Vec<String>,
    /// Children run at a higher priority than the machine's other work
    /// (`renice -10`, where allowed).
    ahead: bool,
    alive: Vec<SocketAddr>,
    silent: Vec<SocketAddr>,
}

impl Farm {
    /// Starts `alive` working and `silent` mute proxies spread evenly over
    /// `children` processes.
    fn start(alive: usize, silent: usize, children: usize) -> anyhow::Result<Farm> {
        let mut farm = Farm::empty(alive, silent);
        let share = |n: usize, i: usize| n / children + usize::from(i < n % children);
        for i in 0..children {
            farm.spawn(share(alive, i), share(silent, i))?;
        }
        anyhow::ensure!(!farm.judge.is_empty(), "the farm started no judge");
        Ok(farm)
    }

    /// No children yet, room for `alive` and `silent` proxies.
    fn empty(alive: usize, silent: usize) -> Farm {
        Farm {
            children: Vec::new(),
            judge: String::new(),
            judges: Vec::new(),
            tls_judges: Vec::new(),
            ahead: false,
            alive: Vec::with_capacity(alive),
            silent: Vec::with_capacity(silent),
        }
    }

    fn spawn(&mut self, alive: usize, silent: usize) -> anyhow::Result<()> {
        let args = [FARM_ARG.to_owned(), alive.to_string(), silent.to_string()];
        self.spawn_with(&args, alive, silent)
    }

    /// Starts a farm child with `args` serving `alive` and `silent` proxies.
    fn spawn_with(&mut self, args: &[String], alive: usize, silent: usize) -> anyhow::Result<()> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        if self.ahead {
            // Ahead of the machine's other work, so that a loaded machine
            // slows the measured checker, not the answers it waits for
            // (a working proxy answering after the timeout is a wrong
            // verdict). Allowed to root only; otherwise nothing changes.
            let _ = Command::new("renice")
                .args(["-n", "-10", "-p", &child.id().to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        self.children.push((child, stdin));
        let (mut judge, mut a, mut s) = (String::new(), 0, 0);
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            let (kind, value) = line.split_once(' ').unwrap_or((line.as_str(), ""));
            match kind {
                "judge" => {
                    judge = value.to_owned();
                    self.judges.push(judge.clone());
                }
                "tls-judge" => self.tls_judges.push(value.to_owned()),
                "alive" => {
                    self.alive.push(value.parse()?);
                    a += 1;
                }
                "silent" => {
                    self.silent.push(value.parse()?);
                    s += 1;
                }
                "ready" => break,
                other => anyhow::bail!("farm child said {other:?}"),
            }
        }
        anyhow::ensure!(
            a == alive && s == silent,
            "a farm child started {a} alive and {s} silent proxies (wanted {alive} and {silent})",
        );
        if self.judge.is_empty() {
            self.judge = judge;
        }
        Ok(())
    }

    /// The children's process ids.
    fn pids(&self) -> Vec<u32> {
        self.children.iter().map(|(c, _)| c.id()).collect()
    }
}

impl Drop for Farm {
    fn drop(&mut self) {
        for (_, stdin) in &mut self.children {
            drop(stdin.take());
        }
        for (child, _) in &mut self.children {
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// The measuring process

/// Raises this process's open-file limit (inherited by the farm children):
/// soft up to hard, then the hard limit itself to `wanted` where allowed
/// (CAP_SYS_RESOURCE). Returns the limit in force.
fn raise_nofile_to(wanted: u64) -> u64 {
    let limit = fakes::raise_nofile_limit();
    if limit >= wanted {
        return limit;
    }
    match rlimit::setrlimit(rlimit::Resource::NOFILE, wanted, wanted) {
        Ok(()) => wanted,
        Err(_) => limit,
    }
}

/// Descriptors one farm child needs when it serves `listeners` proxies and,
/// at worst, every check in flight lands on it: the accepted connection,
/// plus the upstream and the judge's side for a working proxy.
fn child_needs(listeners: usize, pass: &Pass) -> u64 {
    let working = pass.concurrency.min(pass.alive);
    (listeners + 3 * working + (pass.concurrency - working)) as u64 + FD_MARGIN
}

/// Fits the pass into the open-file limit: as many farm children as it
/// takes to hold the listeners, and fewer checks in flight only if one
/// child cannot hold the connections of a full round. Says what it did.
fn fit_to_limit(pass: &mut Pass) -> usize {
    const MAX_CHILDREN: usize = 8;
    let listeners = pass.alive + pass.silent;
    let limit = raise_nofile_to(child_needs(listeners, pass));
    let children = (1..=MAX_CHILDREN)
        .find(|k| child_needs(listeners.div_ceil(*k), pass) <= limit)
        .unwrap_or(MAX_CHILDREN);
    let held = listeners.div_ceil(children) as u64 + FD_MARGIN;
    if child_needs(listeners.div_ceil(children), pass) > limit {
        let per_check = if pass.alive > 0 { 3 } else { 1 };
        let fits = (limit.saturating_sub(held) / per_check).max(1) as usize;
        println!(
            "[{}] open-file limit {limit}: a farm child cannot hold {} checks in flight, so {fits}",
            pass.name, pass.concurrency
        );
        pass.concurrency = fits;
    }
    if children > 1 {
        println!(
            "[{}] open-file limit {limit} (hard; raising it needs CAP_SYS_RESOURCE): \
             the farm runs in {children} child processes",
            pass.name
        );
    }
    children
}

fn measure(mut pass: Pass) -> anyhow::Result<()> {
    let children = fit_to_limit(&mut pass);
    // The closed ports' sockets live here too.
    let concurrency = proxywarden::check::clamp_concurrency(pass.concurrency + pass.closed)
        .saturating_sub(pass.closed);
    if concurrency < pass.concurrency {
        println!(
            "[{}] this process's open-file limit allows {concurrency} checks in flight, not {}",
            pass.name, pass.concurrency
        );
    }

    // Read once, outside the measured span (it runs `getconf`).
    clock_ticks();
    let farm = Farm::start(pass.alive, pass.silent, children)?;
    // Bound but never listening: a connect is refused at once. Held for the
    // round so no other socket can take the port.
    let closed: Vec<tokio::net::TcpSocket> = (0..pass.closed)
        .map(|_| {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(SocketAddr::new(IpAddr::V4(CLOSED_IP), 0))?;
            Ok(s)
        })
        .collect::<std::io::Result<_>>()?;
    let closed_addrs: Vec<SocketAddr> = closed
        .iter()
        .map(tokio::net::TcpSocket::local_addr)
        .collect::<std::io::Result<_>>()?;
    let entries = interleave(&[&farm.alive, &farm.silent, &closed_addrs]);

    let dir = tempfile::tempdir()?;
    let config = write_config(dir.path(), &farm.judge, &entries, concurrency)?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(round(&config, concurrency, &farm.pids()));
    drop(closed);
    drop(farm);
    let m = result?;

    let mut problems = Vec::new();
    let expect = |what: &str, got: u64, want: usize, problems: &mut Vec<String>| {
        if got != want as u64 {
            problems.push(format!("{what}: {got}, expected {want}"));
        }
    };
    let reason = |r: Reason| m.summary.dead_by_reason.get(&r).copied().unwrap_or(0);
    expect("checked", m.summary.checked, entries.len(), &mut problems);
    expect("alive", m.summary.alive, pass.alive, &mut problems);
    expect(
        "timeout",
        reason(Reason::Timeout),
        pass.silent,
        &mut problems,
    );
    expect(
        "refused",
        reason(Reason::Refused),
        pass.closed,
        &mut problems,
    );
    report(&pass, concurrency, &m);
    if !problems.is_empty() {
        anyhow::bail!(
            "the round's verdicts are wrong: {}; dead by reason {:?}",
            problems.join(", "),
            m.summary.dead_by_reason
        );
    }
    Ok(())
}

/// Entries in proportion to each group's size, spread through the list as in
/// a real one rather than in blocks.
fn interleave(groups: &[&[SocketAddr]]) -> Vec<String> {
    let total: usize = groups.iter().map(|g| g.len()).sum();
    let mut taken = vec![0usize; groups.len()];
    let mut out = Vec::with_capacity(total);
    for _ in 0..total {
        // The group furthest behind its share so far.
        let (i, _) = groups
            .iter()
            .enumerate()
            .filter(|(i, g)| taken[*i] < g.len())
            .map(|(i, g)| (i, taken[i] as f64 / g.len() as f64))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .expect("entries remain");
        out.push(format!("http://{}", groups[i][taken[i]]));
        taken[i] += 1;
    }
    out
}

fn write_config(
    dir: &Path,
    judge: &str,
    entries: &[String],
    concurrency: usize,
) -> anyhow::Result<Config> {
    let list = dir.join("list.txt");
    std::fs::write(&list, entries.join("\n"))?;
    let toml = format!(
        r#"
[database]
path = "{db}"

[harvest]
# The farm listens on loopback.
allow_private_addresses = true

[check]
judges = ["{judge}"]
concurrency = {concurrency}
connect_timeout = "{connect}ms"
timeout = "{timeout}ms"
https = false

[[sources]]
name = "farm"
url = "{list}"
"#,
        db = dir.join("bench.db").display(),
        list = list.display(),
        connect = CONNECT_TIMEOUT.as_millis(),
        timeout = TIMEOUT.as_millis(),
    );
    Ok(Config::from_toml(&toml, "bench.toml")?)
}

/// What one round measured.
struct Measured {
    summary: proxywarden::check::RoundSummary,
    wall: Duration,
    cpu: Duration,
    /// The kernel's share of `cpu`: on loopback it includes the TCP work of
    /// the farm's side of each connection, run in our context.
    system: Duration,
    farm_cpu: Option<Duration>,
    rss_before_kib: u64,
    hwm_kib: u64,
    last_check: Duration,
    /// CPU the rest of the machine used during the round (other work
    /// competing for the cores), when /proc/stat could be read.
    others_cpu: Option<Duration>,
    /// Voluntary and involuntary context switches of this process (every
    /// thread) during the round, from getrusage.
    switches: (i64, i64),
}

/// This process's voluntary and involuntary context switches so far.
fn context_switches() -> (i64, i64) {
    use nix::sys::resource::{UsageWho, getrusage};
    getrusage(UsageWho::RUSAGE_SELF).map_or((0, 0), |u| {
        (
            u.voluntary_context_switches(),
            u.involuntary_context_switches(),
        )
    })
}

async fn round(config: &Config, concurrency: usize, farm_pids: &[u32]) -> anyhow::Result<Measured> {
    let store = Store::open(&config.database.path)?;
    let harvested = harvest_all(config, &store).await?;
    anyhow::ensure!(
        harvested.any_worked(),
        "harvesting the list failed: {:?}",
        harvested.sources
    );
    let opts = CheckOptions {
        all: false,
        concurrency,
        https: config.check.https,
        ..CheckOptions::from_config(&config.check)
    };
    let checker = Arc::new(Checker::prepare(config, &opts, None).await?);
    let policy = config.check.recheck_policy();

    // The peak (VmHWM) starts again from here, so that it is the round's
    // and not the harvest's (Linux 4.0 and later).
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    let rss_before_kib = proc_status_kib("VmRSS:");
    let switches_before = context_switches();
    let cpu_before = cpu_times("self").unwrap_or_default();
    let farm_before = farm_cpu(farm_pids);
    let machine_before = machine_busy();
    let progress = Arc::new(RoundProgress::default());
    let started = Instant::now();
    let watcher = tokio::spawn(watch(progress.clone(), started));
    let feedback = Feedback::new(HealthIndex::new(), store.clone());
    let summary = check_round(
        checker,
        &store,
        &feedback,
        &opts,
        policy,
        &CancellationToken::new(),
        progress,
    )
    .await?;
    let wall = started.elapsed();
    watcher.abort();
    // Missed by the watcher only if the round returned within its tick.
    let last_check = watcher.await.ok().flatten().unwrap_or(wall);
    let cpu_after = cpu_times("self").unwrap_or_default();
    let switches_after = context_switches();
    let (user, system) = (cpu_after.0 - cpu_before.0, cpu_after.1 - cpu_before.1);
    let cpu = user + system;
    let farm_cpu = farm_cpu(farm_pids).zip(farm_before).map(|(a, b)| a - b);
    let machine = machine_busy().zip(machine_before).map(|(a, b)| a - b);
    Ok(Measured {
        summary,
        wall,
        cpu,
        system,
        farm_cpu,
        rss_before_kib,
        hwm_kib: proc_status_kib("VmHWM:"),
        last_check,
        others_cpu: machine
            .zip(farm_cpu)
            .map(|(m, f)| m.saturating_sub(f + cpu)),
        switches: (
            switches_after.0 - switches_before.0,
            switches_after.1 - switches_before.1,
        ),
    })
}

/// When the last check of the round finished (to 5 ms), which separates
/// the checks from committing their results.
async fn watch(progress: Arc<RoundProgress>, started: Instant) -> Option<Duration> {
    let timeline = std::env::var_os("BENCH_TIMELINE").is_some();
    let mut tick = tokio::time::interval(Duration::from_millis(5));
    let mut last = 0;
    loop {
        tick.tick().await;
        let total = progress.total.load(std::sync::atomic::Ordering::Relaxed);
        let done = progress.done.load(std::sync::atomic::Ordering::Relaxed);
        if timeline && done != last {
            eprintln!("{:>6} ms {done}", started.elapsed().as_millis());
            last = done;
        }
        if total > 0 && done >= total {
            return Some(started.elapsed());
        }
    }
}

fn report(pass: &Pass, concurrency: usize, m: &Measured) {
    let name = pass.name;
    let s = &m.summary;
    let wall = m.wall.as_secs_f64();
    let ideal = TIMEOUT.as_secs_f64() * pass.silent as f64 / concurrency as f64;
    // Equal timeouts started together end together: the silent checks run
    // in whole waves, so a partial last wave costs a full timeout.
    let waves = TIMEOUT.as_secs_f64() * pass.silent.div_ceil(concurrency) as f64;
    let target = |t: &str, applies: bool| {
        if applies {
            format!("(target {t})")
        } else {
            format!("(target {t} applies to the other pass)")
        }
    };
    println!(
        "[{name}] {} proxies: {} alive (answering HTTP), {} silent, {} closed; concurrency {concurrency}",
        s.checked, s.alive, pass.silent, pass.closed
    );
    if pass.silent == 0 {
        println!(
            "[{name}]   wall        {wall:.3} s (no silent proxies: no timeout schedule to compare with)"
        );
    }
    let mut wall_line = format!(
        "[{name}]   wall        {wall:.3} s vs ideal {ideal:.3} s ({} silent x {:?} / {concurrency}) = {:.2}x  {}",
        pass.silent,
        TIMEOUT,
        wall / ideal,
        target("<= 1.20x at concurrency 2,000", concurrency == 2_000),
    );
    if waves > ideal {
        wall_line.push_str(&format!(
            "; whole waves of timeouts take {waves:.3} s = {:.2}x of ideal",
            waves / ideal
        ));
    }
    if pass.silent > 0 {
        println!("{wall_line}");
    }
    println!(
        "[{name}]               the last check ended at {:.3} s, the rest is committing results",
        m.last_check.as_secs_f64()
    );
    println!(
        "[{name}]   throughput  {:.0} checks/s",
        s.checked as f64 / wall
    );
    let cpu = m.cpu.as_secs_f64();
    if s.alive > 0 {
        println!(
            "[{name}]   CPU         {cpu:.2} s in the round ({:.2} s system) = {:.3} s per 1,000 alive checks = {:.3} ms per alive check  {}",
            m.system.as_secs_f64(),
            cpu * 1000.0 / s.alive as f64,
            cpu * 1000.0 / s.alive as f64,
            if s.alive == s.checked {
                "(target <= 0.3 ms)".to_owned()
            } else {
                format!(
                    "(includes the {} checks that failed; target <= 0.3 ms applies to the alive pass)",
                    s.checked - s.alive
                )
            }
        );
    } else {
        println!(
            "[{name}]   CPU         {cpu:.2} s in the round ({:.2} s system) = {:.3} ms per check, no alive checks  {}",
            m.system.as_secs_f64(),
            cpu * 1000.0 / s.checked.max(1) as f64,
            target("<= 0.3 ms per alive check", false),
        );
    }
    let hwm = m.hwm_kib as f64 * 1024.0;
    let before = m.rss_before_kib as f64 * 1024.0;
    println!(
        "[{name}]   memory      peak RSS (VmHWM) {:.1} MB = {:.1} MiB; RSS before the round {:.1} MB; \
         {:.1} KiB per check in flight  {}",
        hwm / 1e6,
        hwm / (1024.0 * 1024.0),
        before / 1e6,
        (hwm - before) / 1024.0 / concurrency.min(s.checked as usize).max(1) as f64,
        target("< 200 MB at 10,000 in flight", concurrency >= 10_000),
    );
    if let Some(f) = m.farm_cpu {
        println!(
            "[{name}]   (farm, not counted: {:.2} s CPU = {:.0}% of one core over the round)",
            f.as_secs_f64(),
            100.0 * f.as_secs_f64() / wall
        );
    }
    if let Some(o) = m.others_cpu {
        let share = o.as_secs_f64() / wall;
        println!(
            "[{name}]   (rest of the machine: {:.2} s CPU = {:.0}% of one core over the round{})",
            o.as_secs_f64(),
            100.0 * share,
            if share > 0.2 {
                "; the machine was busy, figures are pessimistic"
            } else {
                ""
            }
        );
    }
}

// ---------------------------------------------------------------------------
// /proc readings

/// A `kB` field of /proc/self/status, in KiB (0 if missing).
fn proc_status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// User and system CPU time of a process (`self` or a pid), all threads,
/// from /proc/PID/stat.
fn cpu_times(pid: &str) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may contain spaces: state is
    // field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| -> Option<Duration> {
        let t: u64 = fields.get(i)?.parse().ok()?;
        Some(Duration::from_secs_f64(t as f64 / clock_ticks() as f64))
    };
    Some((ticks(11)?, ticks(12)?))
}

/// User plus system CPU time of a process.
fn cpu_time(pid: &str) -> Option<Duration> {
    cpu_times(pid).map(|(u, s)| u + s)
}

/// Busy CPU time of the whole machine (every core), from /proc/stat.
fn machine_busy() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u64 = [0, 1, 2, 5, 6, 7]
        .iter()
        .filter_map(|&i| ticks.get(i))
        .sum();
    Some(Duration::from_secs_f64(busy as f64 / clock_ticks() as f64))
}

/// CPU time of all farm children together.
fn farm_cpu(pids: &[u32]) -> Option<Duration> {
    pids.iter().map(|p| cpu_time(&p.to_string())).sum()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux if that fails).
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100)
    })
}

// ---------------------------------------------------------------------------
// versus: this build against an older binary, one mixed farm, one run

/// Checks in flight in `versus`, as issue 9 measured them.
const VERSUS_CONCURRENCY: usize = 1_000;

/// What a proxy of the mixed farm does, and so the verdict it deserves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// Works at once.
    Working,
    /// Works, answering 700 ms late.
    Slow,
    /// Accepts the connection and never answers (request or handshake).
    Silent,
    /// Answers every request with its own page.
    Liar,
    /// Nothing listens: refused at once.
    Refusing,
    /// Reads the request and resets the connection.
    HangUp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Working => "working",
            Kind::Slow => "slow",
            Kind::Silent => "silent",
            Kind::Liar => "liar",
            Kind::Refusing => "refusing",
            Kind::HangUp => "hangup",
        }
    }

    fn parse(s: &str) -> Option<Kind> {
        [
            Kind::Working,
            Kind::Slow,
            Kind::Silent,
            Kind::Liar,
            Kind::Refusing,
            Kind::HangUp,
        ]
        .into_iter()
        .find(|k| k.name() == s)
    }

    /// Whether a check should find it alive.
    fn works(self) -> bool {
        matches!(self, Kind::Working | Kind::Slow)
    }
}

/// The mixed farm: (kind, scheme, how many). 10,000 in all: 3,150 working
/// (300 slow), 1,200 silent, 150 liars, 2,700 refusing, 2,800 hanging up.
/// The refusing ones are ports the measuring process holds closed.
const MIX: &[(Kind, &str, usize)] = &[
    (Kind::Working, "http", 2_000),
    (Kind::Working, "socks5", 500),
    (Kind::Working, "socks4", 350),
    (Kind::Slow, "http", 300),
    (Kind::Silent, "http", 500),
    (Kind::Silent, "socks5", 400),
    (Kind::Silent, "socks4", 300),
    (Kind::Liar, "http", 150),
    (Kind::Refusing, "http", 1_700),
    (Kind::Refusing, "socks5", 600),
    (Kind::Refusing, "socks4", 400),
    (Kind::HangUp, "http", 2_800),
];

/// Starts the judges (plain, and TLS with its CA written to `dir`) and the
/// mixed farm but its refusing ports; prints `judge URL`, `tls-judge URL`,
/// `proxy KIND SCHEME ADDR` lines and `ready`, then serves until stdin
/// closes.
fn serve_mixed_farm(dir: &Path) {
    use fakes::{Behavior, FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, SocksBehavior};
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        fakes::raise_nofile_limit();
        let judge = judges::Judge::plain().await;
        let tls_judge = judges::Judge::tls(dir).await;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        writeln!(out, "judge {}", judge.url()).expect("write to the parent");
        writeln!(out, "tls-judge {}", tls_judge.url()).expect("write to the parent");
        let mut http = Vec::new();
        let mut socks4 = Vec::new();
        let mut socks5 = Vec::new();
        let mut n = 0usize;
        for &(kind, scheme, count) in MIX {
            if kind == Kind::Refusing {
                continue;
            }
            for _ in 0..count {
                // Working proxies forward from 127.0.0.2..5 in turn, so no
                // one address's ephemeral ports bound their upstreams.
                let bind = Some(IpAddr::V4(UPSTREAM_BINDS[n % UPSTREAM_BINDS.len()]));
                n += 1;
                let addr = match scheme {
                    "http" => {
                        let behavior = match kind {
                            Kind::Slow => Behavior::Slow(Duration::from_millis(700)),
                            Kind::Silent => Behavior::Hang,
                            Kind::Liar => Behavior::Liar,
                            Kind::HangUp => Behavior::Reset,
                            _ => Behavior::Normal,
                        };
                        let p = FakeHttpProxy::start(HttpProxyOpts {
                            connect: true,
                            upstream_bind: bind,
                            behavior,
                            ..HttpProxyOpts::default()
                        })
                        .await;
                        let a = p.addr();
                        http.push(p);
                        a
                    }
                    _ => {
                        let opts = fakes::SocksOpts {
                            upstream_bind: bind,
                            behavior: if kind == Kind::Silent {
                                SocksBehavior::Hang
                            } else {
                                SocksBehavior::Normal
                            },
                            ..fakes::SocksOpts::default()
                        };
                        if scheme == "socks5" {
                            let p = FakeSocks5::start(opts).await;
                            let a = p.addr();
                            socks5.push(p);
                            a
                        } else {
                            let p = FakeSocks4::start(opts).await;
                            let a = p.addr();
                            socks4.push(p);
                            a
                        }
                    }
                };
                writeln!(out, "proxy {} {scheme} {addr}", kind.name())
                    .expect("write to the parent");
            }
        }
        writeln!(out, "ready").expect("write to the parent");
        out.flush().expect("write to the parent");
        drop(out);
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        drop((http, socks4, socks5, judge, tls_judge));
    });
    rt.shutdown_background();
}

/// The mixed farm child and the ports held closed, with each proxy's kind.
struct MixedFarm {
    child: Child,
    stdin: Option<ChildStdin>,
    judge: String,
    tls_judge: String,
    ca_file: std::path::PathBuf,
    /// (scheme, address) → kind, for every proxy of the list.
    proxies: std::collections::HashMap<(String, SocketAddr), Kind>,
    /// Bound, never listening: held for the farm's life.
    _closed: Vec<tokio::net::TcpSocket>,
}

impl MixedFarm {
    fn start(dir: &Path) -> anyhow::Result<MixedFarm> {
        let mut child = Command::new(std::env::current_exe()?)
            .args([MIXED_FARM_ARG, &dir.display().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (mut judge, mut tls_judge) = (String::new(), String::new());
        let mut proxies = std::collections::HashMap::new();
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            let mut words = line.split(' ');
            match words.next() {
                Some("judge") => judge = words.next().unwrap_or_default().to_owned(),
                Some("tls-judge") => tls_judge = words.next().unwrap_or_default().to_owned(),
                Some("proxy") => {
                    let (Some(kind), Some(scheme), Some(addr)) =
                        (words.next(), words.next(), words.next())
                    else {
                        anyhow::bail!("farm child said {line:?}");
                    };
                    let kind = Kind::parse(kind)
                        .ok_or_else(|| anyhow::anyhow!("unknown kind in {line:?}"))?;
                    proxies.insert((scheme.to_owned(), addr.parse()?), kind);
                }
                Some("ready") => break,
                _ => anyhow::bail!("farm child said {line:?}"),
            }
        }
        let mut closed = Vec::new();
        for &(kind, scheme, count) in MIX {
            if kind != Kind::Refusing {
                continue;
            }
            for _ in 0..count {
                let s = tokio::net::TcpSocket::new_v4()?;
                s.bind(SocketAddr::new(IpAddr::V4(CLOSED_IP), 0))?;
                proxies.insert((scheme.to_owned(), s.local_addr()?), kind);
                closed.push(s);
            }
        }
        let wanted: usize = MIX.iter().map(|m| m.2).sum();
        anyhow::ensure!(
            proxies.len() == wanted && !judge.is_empty() && !tls_judge.is_empty(),
            "the mixed farm started {} of {wanted} proxies",
            proxies.len()
        );
        Ok(MixedFarm {
            child,
            stdin,
            judge,
            tls_judge,
            ca_file: dir.join("ca.pem"),
            proxies,
            _closed: closed,
        })
    }

    /// The list a source serves: every proxy with its scheme, spread so
    /// that each kind runs through the list as in a real one.
    fn list(&self) -> String {
        let mut entries: Vec<(&(String, SocketAddr), &Kind)> = self.proxies.iter().collect();
        // A fixed shuffle: by a hash of the address, the same every run.
        entries.sort_by_key(|((scheme, addr), _)| {
            let mut h = std::hash::DefaultHasher::new();
            std::hash::Hash::hash(&(scheme, addr), &mut h);
            std::hash::Hasher::finish(&h)
        });
        entries
            .iter()
            .map(|((scheme, addr), _)| format!("{scheme}://{addr}\n"))
            .collect()
    }
}

impl Drop for MixedFarm {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// One binary's side of `versus`: its directory, config and database.
struct Contender {
    name: &'static str,
    bin: std::path::PathBuf,
    dir: std::path::PathBuf,
}

/// What one measured round of a contender cost and found.
struct VersusRound {
    wall: Duration,
    cpu: Duration,
    /// The kernel's part of `cpu`.
    sys: Duration,
    alive: usize,
    true_alive: usize,
    working: usize,
    liars_dead: usize,
    liars: usize,
    /// (kind, scheme, verdict) → proxies.
    by_kind: std::collections::BTreeMap<(Kind, String, String), usize>,
}

impl Contender {
    fn config(&self, farm: &MixedFarm) -> String {
        // The farm listens on loopback, which builds drop from lists unless
        // told to keep it.
        let harvest = "[harvest]\nallow_private_addresses = true\n";
        let https = https_test();
        format!(
            r#"[database]
path = "{db}"

{harvest}
[check]
judges = ["{judge}", "{tls}"]
extra_ca_file = "{ca}"
concurrency = {VERSUS_CONCURRENCY}
connect_timeout = "{connect}ms"
timeout = "{timeout}ms"
https = {https}

[[sources]]
name = "farm"
url = "{list}"
"#,
            db = self.dir.join("bench.db").display(),
            judge = farm.judge,
            tls = farm.tls_judge,
            ca = farm.ca_file.display(),
            connect = CONNECT_TIMEOUT.as_millis(),
            timeout = TIMEOUT.as_millis(),
            list = self.dir.join("list.txt").display(),
        )
    }

    fn prepare(&self, farm: &MixedFarm) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.dir)?;
        std::fs::write(self.dir.join("list.txt"), farm.list())?;
        std::fs::write(self.dir.join("proxywarden.toml"), self.config(farm))?;
        self.run(&["harvest"])?;
        if !first_round() {
            // The unmeasured first round: afterwards every proxy has a
            // verdict and the measured round re-checks them, as a daemon's
            // rounds do.
            self.run(&["check", "--all"])?;
        }
        Ok(())
    }

    /// Runs the binary with `args` in its directory; returns its wall and
    /// CPU time (user + system, read from our children's times once it is
    /// reaped).
    fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        self.run_wrapped(args, false).map(drop)
    }

    /// [`Contender::run`], under `BENCH_WRAP`'s tool when `wrapped`.
    fn run_wrapped(
        &self,
        args: &[&str],
        wrapped: bool,
    ) -> anyhow::Result<(Duration, Duration, Duration)> {
        let before = children_cpu().unwrap_or_default();
        let started = Instant::now();
        // `BENCH_WRAP="strace -c -f -o /tmp/{name}.strace"` runs each
        // contender under a tool ({name} is the contender), for profiles:
        // its CPU is then counted too.
        let wrap: Vec<String> = std::env::var("BENCH_WRAP")
            .ok()
            .filter(|_| wrapped)
            .map(|w| {
                w.split_whitespace()
                    .map(|a| a.replace("{name}", self.name))
                    .collect()
            })
            .unwrap_or_default();
        let mut cmd = match wrap.split_first() {
            Some((tool, tool_args)) => {
                let mut c = Command::new(tool);
                c.args(tool_args).arg(&self.bin);
                c
            }
            None => Command::new(&self.bin),
        };
        let out = cmd
            .args(["--config", "proxywarden.toml"])
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()?;
        let wall = started.elapsed();
        let after = children_cpu().unwrap_or_default();
        let cpu = after.0.saturating_sub(before.0);
        let sys = after.1.saturating_sub(before.1);
        anyhow::ensure!(
            out.status.success(),
            "{} {args:?} failed ({}): {}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((wall, cpu, sys))
    }

    fn measure(&self, farm: &MixedFarm) -> anyhow::Result<VersusRound> {
        if first_round() {
            for name in ["bench.db", "bench.db-wal", "bench.db-shm"] {
                let _ = std::fs::remove_file(self.dir.join(name));
            }
            self.run(&["harvest"])?;
        }
        let (wall, cpu, sys) = self.run_wrapped(&["check", "--all"], true)?;
        let db = rusqlite::Connection::open(self.dir.join("bench.db"))?;
        let mut stmt = db.prepare("SELECT scheme, host, port, status, last_reason FROM proxies")?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, u16>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, Option<String>>(4)?,
            ))
        })?;
        let mut round = VersusRound {
            wall,
            cpu,
            sys,
            alive: 0,
            true_alive: 0,
            working: farm.proxies.values().filter(|k| k.works()).count(),
            liars_dead: 0,
            liars: farm.proxies.values().filter(|k| **k == Kind::Liar).count(),
            by_kind: Default::default(),
        };
        for row in rows {
            let (scheme, host, port, status, reason) = row?;
            let addr = SocketAddr::new(host.parse()?, port);
            let kind = *farm
                .proxies
                .get(&(scheme.clone(), addr))
                .ok_or_else(|| anyhow::anyhow!("{scheme}://{addr} is not in the farm"))?;
            let alive = status == "alive";
            round.alive += usize::from(alive);
            round.true_alive += usize::from(alive && kind.works());
            round.liars_dead += usize::from(kind == Kind::Liar && status == "dead");
            let verdict = if alive {
                "alive".to_owned()
            } else {
                reason.unwrap_or(status)
            };
            *round.by_kind.entry((kind, scheme, verdict)).or_default() += 1;
        }
        Ok(round)
    }
}

/// `BENCH_HTTPS=off` turns the HTTPS test off.
fn https_test() -> bool {
    !std::env::var("BENCH_HTTPS").is_ok_and(|v| v == "off")
}

/// `BENCH_ROUND=first`: `versus` measures first rounds, not re-checks.
fn first_round() -> bool {
    std::env::var("BENCH_ROUND").is_ok_and(|v| v == "first")
}

/// User plus system CPU time of this process's reaped children, and the
/// system part alone, from getrusage in microseconds (/proc's clock ticks
/// are 10 ms, 2% of a round).
fn children_cpu() -> Option<(Duration, Duration)> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_CHILDREN).ok()?;
    let time = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    let (user, system) = (time(usage.user_time()), time(usage.system_time()));
    Some((user + system, system))
}

fn versus() -> anyhow::Result<()> {
    clock_ticks();
    raise_nofile_to(20_000);
    let new_bin = std::path::PathBuf::from(env!("CARGO_BIN_EXE_proxywarden"));
    let old_bin = std::env::var_os(OLD_BIN_ENV).map(std::path::PathBuf::from);
    let tmp = tempfile::tempdir()?;
    if std::env::var_os("BENCH_KEEP").is_some() {
        println!("[versus] keeping {}", tmp.path().display());
    }
    let farm = MixedFarm::start(tmp.path())?;
    let mut contenders = Vec::new();
    match &old_bin {
        Some(bin) => contenders.push(Contender {
            name: "old",
            bin: bin.clone(),
            dir: tmp.path().join("old"),
        }),
        None => println!(
            "[versus] {OLD_BIN_ENV} is not set: measuring this build alone \
             (build commit dbbd7e2's proxywarden and name it there to compare)"
        ),
    }
    // A third build between the two (a branch's earlier commit, say), to
    // tell apart what each step changed in the same run.
    if let Some(bin) = std::env::var_os(MID_BIN_ENV) {
        contenders.push(Contender {
            name: "mid",
            bin: bin.into(),
            dir: tmp.path().join("mid"),
        });
    }
    contenders.push(Contender {
        name: "new",
        bin: new_bin,
        dir: tmp.path().join("new"),
    });
    println!(
        "[versus] {} proxies ({}), concurrency {VERSUS_CONCURRENCY}, connect {:?}, total {:?}, https judge on, {} round, https test {}",
        farm.proxies.len(),
        MIX.iter()
            .map(|(k, s, n)| format!("{n} {} {s}", k.name()))
            .collect::<Vec<_>>()
            .join(", "),
        CONNECT_TIMEOUT,
        TIMEOUT,
        if first_round() { "first" } else { "re-check" },
        std::env::var("BENCH_HTTPS").unwrap_or_else(|_| "on".into()),
    );
    for c in &contenders {
        c.prepare(&farm)?;
    }
    // Interleaved, so that a busy spell on the machine does not fall on one
    // contender only.
    let repeat: usize = std::env::var("BENCH_REPEAT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    let mut results: Vec<Vec<VersusRound>> = contenders.iter().map(|_| Vec::new()).collect();
    for _ in 0..repeat {
        for (c, r) in contenders.iter().zip(&mut results) {
            r.push(c.measure(&farm)?);
        }
    }
    let mut problems = Vec::new();
    let mut medians = Vec::new();
    for (c, rounds) in contenders.iter().zip(&results) {
        for (i, r) in rounds.iter().enumerate() {
            let precision = r.true_alive as f64 / r.alive.max(1) as f64;
            let recall = r.true_alive as f64 / r.working.max(1) as f64;
            println!(
                "[versus] {:>3} #{}: wall {:.3} s, CPU {:.3} s (system {:.3} s); {} alive, precision {precision:.4}, recall {recall:.4}, liars dead {}/{}",
                c.name,
                i + 1,
                r.wall.as_secs_f64(),
                r.cpu.as_secs_f64(),
                r.sys.as_secs_f64(),
                r.alive,
                r.liars_dead,
                r.liars,
            );
            let kinds: Vec<String> = r
                .by_kind
                .iter()
                .map(|((k, s, v), n)| format!("{} {s} {v} {n}", k.name()))
                .collect();
            println!("[versus]        verdicts: {}", kinds.join(", "));
            if precision < 1.0 || recall < 1.0 || r.liars_dead < r.liars {
                problems.push(format!(
                    "{} #{}: precision {precision:.4}, recall {recall:.4}, liars dead {}/{}",
                    c.name,
                    i + 1,
                    r.liars_dead,
                    r.liars
                ));
            }
        }
        let median = |f: fn(&VersusRound) -> Duration| {
            let mut v: Vec<Duration> = rounds.iter().map(f).collect();
            v.sort();
            v[v.len() / 2]
        };
        medians.push((c.name, median(|r| r.wall), median(|r| r.cpu)));
    }
    if let [(_, old_wall, old_cpu), .., (_, mid_wall, mid_cpu), _] = medians[..] {
        println!(
            "[versus] mid/old: wall {:.2}x, CPU {:.2}x",
            mid_wall.as_secs_f64() / old_wall.as_secs_f64(),
            mid_cpu.as_secs_f64() / old_cpu.as_secs_f64(),
        );
    }
    if let [(_, old_wall, old_cpu), .., (_, new_wall, new_cpu)] = medians[..] {
        println!(
            "[versus] new/old: wall {:.3} s / {:.3} s = {:.2}x (target <= 1.0x), CPU {:.3} s / {:.3} s = {:.2}x (target <= {}x)",
            new_wall.as_secs_f64(),
            old_wall.as_secs_f64(),
            new_wall.as_secs_f64() / old_wall.as_secs_f64(),
            new_cpu.as_secs_f64(),
            old_cpu.as_secs_f64(),
            new_cpu.as_secs_f64() / old_cpu.as_secs_f64(),
            // Issue 22's targets against commit f7b9d6a.
            if https_test() { "0.65" } else { "0.70" },
        );
    }
    drop(farm);
    if std::env::var_os("BENCH_KEEP").is_some() {
        let _ = tmp.keep();
    }
    anyhow::ensure!(
        problems.is_empty(),
        "wrong verdicts: {}",
        problems.join("; ")
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// scale: how a round's cost grows with the number of proxies

const SCALE_ARG: &str = "scale";
const SCALE_MEASURE_ARG: &str = "--measure-scale";
const SCALE_FARM_ARG: &str = "--serve-scale-farm";
const SCALE_JUDGE_ARG: &str = "--serve-scale-judge";
/// Round sizes, unless `BENCH_SCALE_SIZES` names others (comma-separated).
const SCALE_SIZES: [usize; 3] = [10_000, 40_000, 100_000];
/// Checks in flight at every size: the same machine, more proxies.
const SCALE_CONCURRENCY: usize = 2_000;
/// Listeners (or closed ports) per loopback address: binding port 0 takes
/// them from the ephemeral range, about 28,000 ports on each address.
const SCALE_PER_IP: usize = 20_000;
/// Listeners per farm child: with a round's connections they fit in an
/// open-file limit of 20,000 with room to spare.
const SCALE_PER_CHILD: usize = 10_000;
/// Judge processes, each with a plain judge (and a TLS one when the HTTPS
/// test is on), taken in turn by the checker: every working proxy's
/// request ends at a judge, more than one process answers on a small
/// machine under load, and no farm child's open files are shared with
/// them.
const SCALE_JUDGES: usize = 2;
/// `MONOSANS_BIN`: a build of monosans/proxy-scraper-checker to run on the
/// same farm after each round.
const MONOSANS_ENV: &str = "MONOSANS_BIN";

/// `BENCH_HTTPS=on`: the scale rounds test HTTPS support too (a CONNECT
/// and a TLS handshake with a TLS judge for every working proxy).
fn scale_https() -> bool {
    std::env::var("BENCH_HTTPS").is_ok_and(|v| v == "on")
}

/// Where scale farm child `index` listens, and the addresses its working
/// proxies forward from: 127.0.(110 + index).1, and .2 to .5. Nothing else
/// uses these addresses, so no other test's ports are taken.
fn scale_farm_addrs(index: usize) -> (IpAddr, [Ipv4Addr; 4]) {
    let net = 110 + u8::try_from(index).expect("fewer than 100 farm children");
    let ip = |last: u8| Ipv4Addr::new(127, 0, net, last);
    (IpAddr::V4(ip(1)), [ip(2), ip(3), ip(4), ip(5)])
}

/// A judge child: proxywarden's `/judge` on plain HTTP and, when `tls`,
/// over TLS (its CA written to `dir/ca.pem`), on 127.0.0.1. Prints
/// `judge URL`, `tls-judge URL` and `ready`, then serves until stdin closes.
fn serve_scale_judge(dir: &Path, tls: bool) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    rt.block_on(async {
        fakes::raise_nofile_limit();
        let judge = judges::Judge::plain().await;
        let tls_judge = match tls {
            true => Some(judges::Judge::tls(dir).await),
            false => None,
        };
        {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            writeln!(out, "judge {}", judge.url()).expect("write to the parent");
            if let Some(t) = &tls_judge {
                writeln!(out, "tls-judge {}", t.url()).expect("write to the parent");
            }
            writeln!(out, "ready").expect("write to the parent");
            out.flush().expect("write to the parent");
        }
        let mut sink = Vec::new();
        let _ = tokio::io::AsyncReadExt::read_to_end(&mut tokio::io::stdin(), &mut sink).await;
        drop((judge, tls_judge));
    });
    rt.shutdown_background();
}

/// The mix at every size: half working, a tenth silent (each costs a
/// whole timeout), the rest refused at once.
fn scale_mix(size: usize) -> (usize, usize, usize) {
    let alive = size / 2;
    let silent = size / 10;
    (alive, silent, size - alive - silent)
}

/// What one size's measuring process reports to the orchestrator, one
/// `scale-figures` line of `key=value` words.
#[derive(Clone, Copy, Debug, Default)]
struct ScaleFigures {
    size: usize,
    wall: f64,
    floor: f64,
    cpu: f64,
    system: f64,
    hwm_kib: u64,
    voluntary: i64,
    involuntary: i64,
    others: f64,
    /// monosans' CPU and wall on the same farm (0 when not run).
    theirs_cpu: f64,
    theirs_wall: f64,
}

impl ScaleFigures {
    fn line(&self) -> String {
        format!(
            "scale-figures size={} wall={} floor={} cpu={} system={} hwm_kib={} voluntary={} involuntary={} others={} theirs_cpu={} theirs_wall={}",
            self.size,
            self.wall,
            self.floor,
            self.cpu,
            self.system,
            self.hwm_kib,
            self.voluntary,
            self.involuntary,
            self.others,
            self.theirs_cpu,
            self.theirs_wall,
        )
    }

    fn parse(line: &str) -> Option<ScaleFigures> {
        let rest = line.strip_prefix("scale-figures ")?;
        let mut f = ScaleFigures::default();
        for word in rest.split(' ') {
            let (k, v) = word.split_once('=')?;
            match k {
                "size" => f.size = v.parse().ok()?,
                "wall" => f.wall = v.parse().ok()?,
                "floor" => f.floor = v.parse().ok()?,
                "cpu" => f.cpu = v.parse().ok()?,
                "system" => f.system = v.parse().ok()?,
                "hwm_kib" => f.hwm_kib = v.parse().ok()?,
                "voluntary" => f.voluntary = v.parse().ok()?,
                "involuntary" => f.involuntary = v.parse().ok()?,
                "others" => f.others = v.parse().ok()?,
                "theirs_cpu" => f.theirs_cpu = v.parse().ok()?,
                "theirs_wall" => f.theirs_wall = v.parse().ok()?,
                _ => return None,
            }
        }
        Some(f)
    }

    /// CPU per proxy, µs.
    fn cpu_us(&self) -> f64 {
        self.cpu * 1e6 / self.size as f64
    }
}

/// `cargo bench --bench check -- scale`: a round of each size in a fresh
/// measuring process, then how CPU, memory and context switches grew.
fn scale() -> anyhow::Result<()> {
    let sizes: Vec<usize> = match std::env::var("BENCH_SCALE_SIZES") {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().replace('_', "").parse())
            .collect::<Result<_, _>>()?,
        Err(_) => SCALE_SIZES.to_vec(),
    };
    let exe = std::env::current_exe()?;
    println!(
        "[scale] rounds of {sizes:?} loopback proxies (half working, a tenth silent, the rest refused), \
         concurrency {SCALE_CONCURRENCY}, connect {CONNECT_TIMEOUT:?}, total {TIMEOUT:?}, https {}; \
         fake proxies and {SCALE_JUDGES} judge processes in child processes",
        if scale_https() { "on" } else { "off" },
    );
    match std::env::var_os(MONOSANS_ENV) {
        Some(bin) => println!(
            "[scale] {MONOSANS_ENV}={}: each round is followed by monosans on the same farm",
            bin.to_string_lossy()
        ),
        None => println!("[scale] {MONOSANS_ENV} unset: no monosans rounds"),
    }
    let mut all = Vec::new();
    let mut failed = Vec::new();
    for size in sizes {
        let mut child = Command::new(&exe)
            .args([SCALE_MEASURE_ARG, &size.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut figures = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            match ScaleFigures::parse(&line) {
                Some(f) => figures = Some(f),
                None => println!("{line}"),
            }
        }
        let status = child.wait()?;
        // A round with wrong verdicts still printed what it cost: the
        // table shows it, and the run fails at the end.
        if !status.success() {
            failed.push(format!("the round of {size} failed ({status})"));
        }
        match figures {
            Some(f) => all.push(f),
            None => failed.push(format!("no figures from the round of {size}")),
        }
    }
    println!(
        "[scale] {:>7} | {:>8} | {:>10} | {:>14} | {:>9} | {:>13} | {:>14} | {:>20}",
        "proxies",
        "CPU s",
        "µs/proxy",
        "wall / floor",
        "peak MiB",
        "vol. csw/px",
        "invol. csw/px",
        "monosans CPU s (÷)"
    );
    for f in &all {
        let theirs = if f.theirs_cpu > 0.0 {
            format!("{:.2} ({:.2}x)", f.theirs_cpu, f.cpu / f.theirs_cpu)
        } else {
            "-".to_owned()
        };
        println!(
            "[scale] {:>7} | {:>8.2} | {:>10.1} | {:>6.2} / {:>5.2} | {:>9.1} | {:>13.3} | {:>14.3} | {:>20}",
            f.size,
            f.cpu,
            f.cpu_us(),
            f.wall,
            f.floor,
            f.hwm_kib as f64 / 1024.0,
            f.voluntary as f64 / f.size as f64,
            f.involuntary as f64 / f.size as f64,
            theirs,
        );
    }
    for pair in all.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let grew = b.size as f64 / a.size as f64;
        println!(
            "[scale] {} -> {} ({grew:.1}x the proxies): CPU {:.2}x (target <= {grew:.1}x), CPU per proxy {:.2}x (target 1.0x), \
             wall {:.2}x, voluntary switches per proxy {:.2}x, involuntary {:.2}x",
            a.size,
            b.size,
            b.cpu / a.cpu,
            b.cpu_us() / a.cpu_us(),
            b.wall / a.wall,
            (b.voluntary as f64 / b.size as f64) / (a.voluntary as f64 / a.size as f64).max(1e-9),
            (b.involuntary as f64 / b.size as f64)
                / (a.involuntary as f64 / a.size as f64).max(1e-9),
        );
        if a.theirs_cpu > 0.0 && b.theirs_cpu > 0.0 {
            println!(
                "[scale] {} -> {}: monosans' CPU {:.2}x",
                a.size,
                b.size,
                b.theirs_cpu / a.theirs_cpu
            );
        }
    }
    anyhow::ensure!(failed.is_empty(), "{}", failed.join("; "));
    Ok(())
}

/// One round of `size` proxies (see [`scale_mix`]), measured in this
/// process with the farm and the judges in children; prints its report
/// and figures.
fn measure_scale(size: usize) -> anyhow::Result<()> {
    let (alive, silent, closed) = scale_mix(size);
    let concurrency = SCALE_CONCURRENCY;
    let https = scale_https();
    // A farm child holds its listeners and, at worst, every connection of
    // the round (three for a working proxy's check).
    let needs = (SCALE_PER_CHILD + 3 * concurrency) as u64 + FD_MARGIN;
    let limit = raise_nofile_to(needs);
    anyhow::ensure!(
        limit >= needs,
        "a round of {size} needs {needs} open files and the limit is {limit} (raise it, or run as root)"
    );
    clock_ticks();
    let pass = Pass {
        name: "scale",
        alive,
        silent,
        closed,
        concurrency,
    };
    let dir = tempfile::tempdir()?;
    let children = (alive + silent).div_ceil(SCALE_PER_CHILD).max(1);
    let mut farm = Farm::empty(alive, silent);
    farm.ahead = true;
    for i in 0..SCALE_JUDGES {
        let judge_dir = dir.path().join(format!("judge-{i}"));
        std::fs::create_dir_all(&judge_dir)?;
        let args = [
            SCALE_JUDGE_ARG.to_owned(),
            judge_dir.display().to_string(),
            https.to_string(),
        ];
        farm.spawn_with(&args, 0, 0)?;
    }
    anyhow::ensure!(
        farm.judges.len() == SCALE_JUDGES
            && farm.tls_judges.len() == SCALE_JUDGES * usize::from(https),
        "the judge children started {:?} and {:?}",
        farm.judges,
        farm.tls_judges
    );
    // One file holding every TLS judge's CA.
    let ca_file = dir.path().join("judges-ca.pem");
    let mut cas = String::new();
    for i in 0..SCALE_JUDGES * usize::from(https) {
        cas.push_str(&std::fs::read_to_string(
            dir.path().join(format!("judge-{i}")).join("ca.pem"),
        )?);
    }
    std::fs::write(&ca_file, cas)?;
    let share = |n: usize, i: usize| n / children + usize::from(i < n % children);
    for i in 0..children {
        let (a, s) = (share(alive, i), share(silent, i));
        let args = [
            SCALE_FARM_ARG.to_owned(),
            a.to_string(),
            s.to_string(),
            i.to_string(),
        ];
        farm.spawn_with(&args, a, s)?;
    }
    // Ports of 127.0.120.x, where nothing listens or binds: refused at
    // once, and no descriptor held for each.
    let closed_addrs: Vec<SocketAddr> = (0..closed)
        .map(|i| {
            let net = u8::try_from(i / SCALE_PER_IP).expect("fewer than 256 addresses");
            let port = 10_000 + (i % SCALE_PER_IP) as u16;
            SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 120, 1 + net)), port)
        })
        .collect();
    let entries = interleave(&[&farm.alive, &farm.silent, &closed_addrs]);
    let config = write_scale_config(dir.path(), &farm, &ca_file, &entries, concurrency, https)?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = rt.block_on(round(&config, concurrency, &farm.pids()));
    drop(rt);
    // With the HTTPS probe on, monosans checks through the TLS judge (our
    // round checks plain and probes HTTPS), trusting the judges' CA.
    let their_judge = if https {
        (farm.tls_judges[0].as_str(), Some(ca_file.as_path()))
    } else {
        (farm.judges[0].as_str(), None)
    };
    let theirs = match std::env::var_os(MONOSANS_ENV) {
        Some(bin) => Some(run_monosans(
            Path::new(&bin),
            dir.path(),
            their_judge,
            &entries,
            concurrency,
        )?),
        None => None,
    };
    drop(farm);
    let m = result?;
    // A write-ahead log that grew through the round makes every page
    // lookup in it slower.
    let wal = std::fs::metadata(dir.path().join("bench.db-wal")).map_or(0, |m| m.len());
    let db = std::fs::metadata(dir.path().join("bench.db")).map_or(0, |m| m.len());
    println!(
        "[scale {size}]   database {:.1} MB, write-ahead log {:.1} MB at the end",
        db as f64 / 1e6,
        wal as f64 / 1e6
    );
    let reason = |r: Reason| m.summary.dead_by_reason.get(&r).copied().unwrap_or(0);
    let mut problems = Vec::new();
    for (what, got, want) in [
        ("checked", m.summary.checked, size),
        ("alive", m.summary.alive, alive),
        ("timeout", reason(Reason::Timeout), silent),
        ("refused", reason(Reason::Refused), closed),
    ] {
        if got != want as u64 {
            problems.push(format!("{what}: {got}, expected {want}"));
        }
    }
    report(&pass, concurrency, &m);
    let floor = TIMEOUT.as_secs_f64() * silent as f64 / concurrency as f64;
    println!(
        "[scale {size}]   context switches {} voluntary, {} involuntary = {:.3} and {:.3} per proxy",
        m.switches.0,
        m.switches.1,
        m.switches.0 as f64 / size as f64,
        m.switches.1 as f64 / size as f64,
    );
    if let Some(t) = &theirs {
        println!(
            "[scale {size}]   monosans on the same farm: wall {:.2} s, CPU {:.2} s ({:.2} s system) = {:.1} µs per proxy, \
             peak RSS {:.1} MiB, {} of {alive} working proxies found; ours ÷ theirs: CPU {:.2}x (target <= 0.65x), wall {:.2}x",
            t.wall.as_secs_f64(),
            t.cpu.as_secs_f64(),
            t.sys.as_secs_f64(),
            t.cpu.as_secs_f64() * 1e6 / size as f64,
            t.max_rss_kib as f64 / 1024.0,
            t.found,
            m.cpu.as_secs_f64() / t.cpu.as_secs_f64(),
            m.wall.as_secs_f64() / t.wall.as_secs_f64(),
        );
    }
    println!(
        "{}",
        ScaleFigures {
            size,
            wall: m.wall.as_secs_f64(),
            floor,
            cpu: m.cpu.as_secs_f64(),
            system: m.system.as_secs_f64(),
            hwm_kib: m.hwm_kib,
            voluntary: m.switches.0,
            involuntary: m.switches.1,
            others: m.others_cpu.map_or(0.0, |o| o.as_secs_f64()),
            theirs_cpu: theirs.as_ref().map_or(0.0, |t| t.cpu.as_secs_f64()),
            theirs_wall: theirs.as_ref().map_or(0.0, |t| t.wall.as_secs_f64()),
        }
        .line()
    );
    anyhow::ensure!(
        problems.is_empty(),
        "the round's verdicts are wrong: {}; dead by reason {:?}",
        problems.join(", "),
        m.summary.dead_by_reason
    );
    Ok(())
}

/// The scale round's config: every judge child's judges, taken in turn.
fn write_scale_config(
    dir: &Path,
    farm: &Farm,
    ca_file: &Path,
    entries: &[String],
    concurrency: usize,
    https: bool,
) -> anyhow::Result<Config> {
    let list = dir.join("list.txt");
    std::fs::write(&list, entries.join("\n"))?;
    let judges: Vec<String> = farm
        .judges
        .iter()
        .chain(&farm.tls_judges)
        .map(|j| format!("{j:?}"))
        .collect();
    let toml = format!(
        r#"
[database]
path = "{db}"

[harvest]
# The farm listens on loopback.
allow_private_addresses = true

[check]
judges = [{judges}]
{ca}concurrency = {concurrency}
connect_timeout = "{connect}ms"
timeout = "{timeout}ms"
https = {https}

[[sources]]
name = "farm"
url = "{list}"
"#,
        db = dir.join("bench.db").display(),
        judges = judges.join(", "),
        ca = if https {
            format!("extra_ca_file = {:?}\n", ca_file.display().to_string())
        } else {
            String::new()
        },
        list = list.display(),
        connect = CONNECT_TIMEOUT.as_millis(),
        timeout = TIMEOUT.as_millis(),
    );
    Ok(Config::from_toml(&toml, "bench.toml")?)
}

/// What monosans' run on the farm cost and found.
struct TheirRound {
    wall: Duration,
    cpu: Duration,
    sys: Duration,
    max_rss_kib: i64,
    /// Proxies it wrote out as working.
    found: usize,
}

/// Runs monosans/proxy-scraper-checker (`bin`) on the farm: the list of
/// `entries` from a file, `judge` as its check URL (an HTTPS one trusted
/// through the CA file given with it), the same concurrency and timeouts;
/// no ASN or geolocation (they would download databases), nothing else
/// named, so it reaches nothing beyond loopback. CPU is its own, read from
/// our reaped children's times around it.
fn run_monosans(
    bin: &Path,
    dir: &Path,
    (judge, ca_file): (&str, Option<&Path>),
    entries: &[String],
    concurrency: usize,
) -> anyhow::Result<TheirRound> {
    let home = dir.join("monosans");
    std::fs::create_dir_all(&home)?;
    let list = home.join("list.txt");
    let plain: Vec<&str> = entries
        .iter()
        .map(|e| e.strip_prefix("http://").unwrap_or(e))
        .collect();
    std::fs::write(&list, plain.join("\n"))?;
    let out = home.join("out");
    let config = format!(
        r#"debug = false

[output]
path = {out:?}
sort_by_speed = false

[output.txt]
enabled = true

[output.json]
enabled = false
include_asn = false
include_geolocation = false

[checking]
check_url = {judge:?}
max_concurrent_checks = {concurrency}
timeout = {timeout}
connect_timeout = {connect}
user_agent = "bench"

[scraping]
max_proxies_per_source = 0
timeout = 10.0
connect_timeout = 5.0
proxy = ""
user_agent = "bench"

[scraping.http]
enabled = true
urls = [{list:?}]

[scraping.socks4]
enabled = false
urls = []

[scraping.socks5]
enabled = false
urls = []
"#,
        out = out.display().to_string(),
        list = list.display().to_string(),
        timeout = TIMEOUT.as_secs_f64(),
        connect = CONNECT_TIMEOUT.as_secs_f64(),
    );
    let config_path = home.join("config.toml");
    std::fs::write(&config_path, config)?;
    let before = children_cpu().unwrap_or_default();
    let started = Instant::now();
    let mut command = Command::new(bin);
    if let Some(ca) = ca_file {
        command.env("SSL_CERT_FILE", ca);
    }
    let output = command
        .env("PROXY_SCRAPER_CHECKER_CONFIG", &config_path)
        .current_dir(&home)
        .stdin(Stdio::null())
        .output()?;
    let wall = started.elapsed();
    let after = children_cpu().unwrap_or_default();
    anyhow::ensure!(
        output.status.success(),
        "monosans failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let found = std::fs::read_to_string(out.join("proxies").join("all.txt"))
        .map(|s| s.lines().filter(|l| !l.trim().is_empty()).count())
        .unwrap_or(0);
    let max_rss_kib = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN)
        .map_or(0, |u| u.max_rss());
    Ok(TheirRound {
        wall,
        cpu: after.0.saturating_sub(before.0),
        sys: after.1.saturating_sub(before.1),
        max_rss_kib,
        found,
    })
}
