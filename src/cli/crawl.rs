//! `proxywarden crawl`: a polite crawl through the pool, resumable from its
//! state file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser};

use crate::crawl::spec::{CrawlSpec, SpecContext, Validated};
use crate::model::StrategyKind;

use super::{Cli, Command, ProxyFilterArgs, Signals, checkpoint, load, open_store, parse_duration};

/// `crawl` options.
#[derive(Debug, Args)]
pub struct CrawlArgs {
    /// Where to start. Without one, `--state` resumes the crawl it holds
    /// with the options it was started with.
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
    // The options a crawl job takes too are read as the job reads its
    // JSON, and checked by its validator: same defaults, bounds and words.
    /// Links followed from a start URL (default: no limit).
    #[arg(long, value_name = "N")]
    pub max_depth: Option<u32>,
    /// Pages fetched, over every resumed run (default: no limit).
    #[arg(long, value_name = "N")]
    pub max_pages: Option<u64>,
    /// One JSON line per page to this file (failed pages also to
    /// failed.jsonl beside it); stdout if not given.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Store every body in this directory, named by its SHA-256.
    #[arg(long, value_name = "DIR")]
    pub bodies: Option<PathBuf>,
    /// A field to extract: the text of the first element matching a CSS
    /// selector (repeatable), e.g. --select price=.price
    #[arg(long = "select", value_name = "NAME=CSS", value_parser = parse_select)]
    pub selects: Vec<(String, String)>,
    /// Extract every match of each --select, as an array.
    #[arg(long)]
    pub select_all: bool,
    /// Which hosts links may lead to: same-host (default), same-site or any.
    #[arg(long, value_name = "SCOPE")]
    pub scope: Option<String>,
    /// Only URLs matching this regex (repeatable: any of them).
    #[arg(long, value_name = "REGEX")]
    pub include: Vec<String>,
    /// No URL matching this regex (repeatable).
    #[arg(long, value_name = "REGEX")]
    pub exclude: Vec<String>,
    /// Drop this query parameter before comparing URLs (repeatable; utm_*,
    /// ref, fbclid, gclid and other trackers always are).
    #[arg(long = "strip-param", value_name = "NAME")]
    pub strip_params: Vec<String>,
    /// Crawl state (SQLite): resumable; run the same line again to resume.
    #[arg(long, value_name = "FILE")]
    pub state: Option<PathBuf>,
    /// Put the pages that used up their retries back in the queue.
    #[arg(long, requires = "state")]
    pub retry_failed: bool,
    /// Pages in flight (default 16, at most 1,024).
    #[arg(long, value_name = "N")]
    pub concurrency: Option<u32>,
    /// Pages in flight per host (default 2, at most 256).
    #[arg(long, value_name = "N")]
    pub per_host_concurrency: Option<u32>,
    /// Least time between requests to one host (robots.txt's Crawl-delay
    /// applies when longer), e.g. 500ms (at most 1h).
    #[arg(long, value_name = "DURATION")]
    pub delay: Option<String>,
    /// Do not fetch or obey robots.txt.
    #[arg(long)]
    pub ignore_robots: bool,
    /// The User-Agent sent; its first word is matched against robots.txt.
    #[arg(long, value_name = "UA")]
    pub user_agent: Option<String>,
    /// Which proxies to fetch through.
    #[command(flatten)]
    pub filter: ProxyFilterArgs,
    /// How a proxy is chosen for each request.
    #[arg(long, value_enum, default_value = "fastest-of-two")]
    pub strategy: StrategyKind,
    /// What a request does when no proxy can take it.
    #[arg(long, value_enum, default_value = "wait")]
    pub on_no_proxy: NoProxyArg,
    /// How long --on-no-proxy wait waits (default 60s, at most 1h).
    #[arg(long, value_name = "DURATION")]
    pub no_proxy_wait: Option<String>,
    /// Fetch without proxies, directly from this machine.
    #[arg(long, conflicts_with = "on_no_proxy")]
    pub direct: bool,
    /// Time to connect to a proxy.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<std::time::Duration>,
    /// Time from connecting to the answer's first byte.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub first_byte_timeout: Option<std::time::Duration>,
    /// Time for one attempt, body included.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Largest body, e.g. 5MiB.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub max_body: Option<u64>,
    /// New proxies one page may try after failures and blocks.
    #[arg(long, value_name = "N")]
    pub rotations: Option<u32>,
    /// Repeats of one page after the site failed or rate-limited.
    #[arg(long, value_name = "N")]
    pub retries: Option<u32>,
    /// Extra trusted CA certificates (PEM) for https sites.
    #[arg(long, value_name = "FILE")]
    pub ca_file: Option<PathBuf>,
    /// After Ctrl-C, how long pages in flight may take to finish.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s")]
    pub grace: std::time::Duration,
}

/// `crawl --on-no-proxy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NoProxyArg {
    /// Wait (--no-proxy-wait) for one.
    Wait,
    /// Fail the page.
    Fail,
    /// Fetch directly from this machine.
    Direct,
}

/// `--select NAME=CSS` split; the selector is checked with the others.
fn parse_select(s: &str) -> Result<(String, String), String> {
    crate::crawl::Select::split(s).map(|(name, css)| (name.to_owned(), css.to_owned()))
}

fn parse_size(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.0)
        .map_err(|e| format!("expected a size like 5MiB ({e})"))
}

impl CrawlArgs {
    /// The options a crawl job takes too, as a job's spec. The proxy
    /// filters are not among them: `ProxyFilterArgs` reads them with the
    /// same parser (`health::filters`) for every command.
    fn spec(&self) -> CrawlSpec {
        CrawlSpec {
            seeds: self.urls.clone(),
            max_depth: self.max_depth,
            max_pages: self.max_pages,
            scope: self.scope.clone(),
            include: self.include.clone(),
            exclude: self.exclude.clone(),
            strip_params: self.strip_params.clone(),
            concurrency: self.concurrency,
            per_host_concurrency: self.per_host_concurrency,
            delay: self.delay.clone(),
            ignore_robots: self.ignore_robots,
            select: self.selects.iter().cloned().collect(),
            select_all: self.select_all,
            user_agent: self.user_agent.clone(),
            no_proxy_wait: self.no_proxy_wait.clone(),
            ..CrawlSpec::default()
        }
    }

    /// The crawl's and the pool's options: the job's validator on the
    /// shared options (an error names the flag), then the command line's
    /// own; `max_age` defaults to `default_age`.
    fn validate(&self, default_age: std::time::Duration) -> anyhow::Result<Validated> {
        use crate::pool::NoProxy;
        let ctx = SpecContext {
            page_cap: None,
            default_age,
            resuming: self.urls.is_empty() && self.state.as_ref().is_some_and(|s| s.exists()),
        };
        let Validated {
            mut crawl,
            mut pool,
        } = self
            .spec()
            .validate(&ctx)
            .map_err(|e| anyhow::Error::msg(e.for_command_line()))?;
        pool.query = self.filter.query(default_age);
        pool.strategy = self.strategy;
        match (self.direct, self.on_no_proxy) {
            (true, _) | (_, NoProxyArg::Direct) => pool.no_proxy = NoProxy::Direct,
            (_, NoProxyArg::Fail) => pool.no_proxy = NoProxy::Fail,
            // --no-proxy-wait, read by the validator.
            (_, NoProxyArg::Wait) => {}
        }
        if let Some(t) = self.connect_timeout {
            pool.connect_timeout = t;
        }
        if let Some(t) = self.first_byte_timeout {
            pool.first_byte_timeout = t;
        }
        if let Some(t) = self.timeout {
            pool.total_timeout = t;
        }
        if let Some(b) = self.max_body {
            pool.max_body = usize::try_from(b).unwrap_or(usize::MAX);
        }
        if let Some(n) = self.rotations {
            pool.rotations = n;
        }
        if let Some(n) = self.retries {
            pool.target_retries = n;
        }
        crawl.output = self.output.clone();
        crawl.bodies = self.bodies.clone();
        crawl.state = self.state.clone();
        crawl.retry_failed = self.retry_failed;
        crawl.grace = self.grace;
        Ok(Validated { crawl, pool })
    }
}

/// The meta key holding the command line a crawl state was started with.
const CRAWL_ARGV: &str = "argv";

/// `proxywarden crawl`: a pool from the store (refreshed from it while the
/// crawl runs), a progress line on a terminal, the summary on stderr, and
/// Ctrl-C or SIGTERM finishing the pages in flight (exit status 130; a
/// second signal exits at once, the state stays consistent).
pub(super) async fn run(config_path: Option<&Path>, args: CrawlArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use std::sync::Arc;

    use crate::crawl::Progress;
    use crate::pool::Pool;

    let args = resume_args(args).await?;
    let (config, _) = load(config_path)?;
    let Validated {
        crawl: options,
        pool: opts,
    } = args.validate(config.api.max_age)?;
    let store = open_store(&config).await?;
    let shared = shared_options(&config.pool, &args);
    let pool = if args.direct {
        // No proxy at all: an empty index, so every request goes direct.
        let feedback =
            crate::health::Feedback::new(crate::health::HealthIndex::new(), store.clone());
        Pool::new(feedback, shared, opts)?
    } else {
        Pool::from_store(&store, shared, opts)?
    };
    if let Some(state) = &args.state
        && !args.urls.is_empty()
    {
        // Kept so that `crawl --state FILE` alone resumes with these options.
        let argv: Vec<String> = std::env::args().collect();
        let mut f = crate::crawl::frontier::Frontier::open(Some(state)).await?;
        f.set_meta(CRAWL_ARGV, &serde_json::to_string(&argv)?)
            .await?;
        f.close().await;
    }
    if let Some(dir) = &args.bodies {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let cancel = tokio_util::sync::CancellationToken::new();
    {
        let cancel = cancel.clone();
        // SIGTERM (systemd, `kill`) takes the same path as Ctrl-C.
        let mut signals = Signals::new()?;
        tokio::spawn(async move {
            signals.next().await;
            eprintln!("\ninterrupted: finishing the pages in flight (Ctrl-C again to quit now)…");
            cancel.cancel();
            signals.next().await;
            // Every line written is whole and every commit atomic: the
            // state resumes from here.
            std::process::exit(130);
        });
    }
    let progress = Arc::new(Progress::default());
    let terminal = std::io::stderr().is_terminal();
    let display = terminal.then(|| {
        let progress = progress.clone();
        let pool = pool.clone();
        tokio::spawn(async move { show_crawl_progress(&progress, &pool).await })
    });
    let result = crate::crawl::crawl(&pool, options, cancel, progress).await;
    // The proxies' worked-use counts are written in batches; the last one now.
    if let Err(e) = pool.feedback().flush().await {
        tracing::warn!(error = %e, "cannot record proxies' worked uses");
    }
    checkpoint(&store).await;
    if let Some(display) = display {
        display.abort();
        let _ = display.await;
        eprint!("\r\x1b[2K");
    }
    let summary = result?;
    eprint!("{summary}");
    if summary.failed() > 0
        && let Some(out) = &args.output
    {
        let failed = out.parent().unwrap_or(Path::new("")).join("failed.jsonl");
        eprintln!("  failed pages are listed in {}", failed.display());
    }
    Ok(if summary.interrupted {
        ExitCode::from(130)
    } else if summary.ok() == 0 && summary.failed() > 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The pool's caps from `[pool]` (a proxy carries at most
/// `pool.max_per_proxy` requests at once, as in the daemon), with the
/// command line's extra CA.
fn shared_options(
    config: &crate::config::PoolConfig,
    args: &CrawlArgs,
) -> crate::pool::SharedOptions {
    crate::pool::SharedOptions {
        extra_ca: args.ca_file.clone(),
        ..crate::pool::SharedOptions::from(config)
    }
}

/// With no URL, a `--state` file's stored command line, followed by this
/// one's options (which win).
async fn resume_args(args: CrawlArgs) -> anyhow::Result<CrawlArgs> {
    let Some(state) = args
        .state
        .as_ref()
        .filter(|s| args.urls.is_empty() && s.exists())
    else {
        return Ok(args);
    };
    let mut f = crate::crawl::frontier::Frontier::open(Some(state)).await?;
    let stored = f.meta(CRAWL_ARGV).await?;
    f.close().await;
    let Some(stored) = stored else {
        return Ok(args);
    };
    let mut argv: Vec<String> =
        serde_json::from_str(&stored).context("the crawl state's stored command line")?;
    let now: Vec<String> = std::env::args().collect();
    if let Some(i) = now.iter().position(|a| a == "crawl") {
        argv.extend(now[i + 1..].iter().cloned());
    }
    match Cli::try_parse_from(&argv)?.command {
        Command::Crawl(a) => Ok(*a),
        _ => Ok(args),
    }
}

/// One line on the terminal, redrawn a few times a second.
async fn show_crawl_progress(progress: &crate::crawl::Progress, pool: &crate::pool::Pool) {
    let started = std::time::Instant::now();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(250));
    loop {
        tick.tick().await;
        eprint!(
            "\r\x1b[2K{}",
            crawl_progress_line(progress, &pool.stats(), started.elapsed())
        );
    }
}

/// The crawl's progress in one line: pages done and failed, queued, in
/// flight, pages/s, and the proxies busy, cooling and banned.
fn crawl_progress_line(
    progress: &crate::crawl::Progress,
    pool: &crate::pool::PoolStats,
    elapsed: std::time::Duration,
) -> String {
    use std::sync::atomic::Ordering;
    let done = progress.done.load(Ordering::Relaxed);
    let banned: u64 = pool.banned_by_site.values().sum();
    format!(
        "{done} pages ({} failed), {} queued, {} in flight, {:.1} pages/s; proxies {} busy, {} cooling, {banned} banned",
        progress.failed.load(Ordering::Relaxed),
        progress.queued.load(Ordering::Relaxed),
        progress.in_flight.load(Ordering::Relaxed),
        done as f64 / elapsed.as_secs_f64().max(0.001),
        pool.proxies_busy,
        pool.proxies_cooling,
    )
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn crawl_args(argv: &[&str]) -> CrawlArgs {
        let argv = ["proxywarden", "crawl"].iter().chain(argv);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Crawl(args) => *args,
            _ => unreachable!("a crawl command line"),
        }
    }

    #[test]
    fn the_pool_takes_its_per_proxy_cap_from_the_config() {
        let config =
            crate::config::Config::from_toml("[pool]\nmax_per_proxy = 1\n", "t.toml").unwrap();
        let args = crawl_args(&["--ca-file", "ca.pem", "http://a/"]);
        let shared = shared_options(&config.pool, &args);
        assert_eq!(shared.max_in_flight, 1);
        assert_eq!(shared.extra_ca.as_deref(), Some(Path::new("ca.pem")));
    }

    #[test]
    fn the_command_line_and_a_job_have_the_same_defaults() {
        let age = Duration::from_secs(1800);
        let cli = crawl_args(&["http://a/"]).validate(age).unwrap();
        let ctx = SpecContext {
            page_cap: None,
            default_age: age,
            resuming: false,
        };
        let job = CrawlSpec::from_json(br#"{"seeds": ["http://a/"]}"#)
            .unwrap()
            .validate(&ctx)
            .unwrap();
        let crawl = |v: &Validated| {
            let c = &v.crawl;
            (
                c.seeds.iter().map(|u| u.to_string()).collect::<Vec<_>>(),
                (c.max_depth, c.max_pages, c.scope),
                (c.include.len(), c.exclude.len(), c.strip_params.clone()),
                (c.concurrency, c.per_host_concurrency, c.delay),
                (c.ignore_robots, c.selects.len(), c.select_all),
            )
        };
        assert_eq!(crawl(&cli), crawl(&job));
        assert_eq!(cli.crawl.concurrency, 16);
        assert_eq!(cli.crawl.per_host_concurrency, 2);
        let pool = |v: &Validated| {
            let p = &v.pool;
            (p.query.clone(), p.no_proxy, p.user_agent.clone())
        };
        assert_eq!(pool(&cli), pool(&job));
        // The command line's own: no page cap, a longer grace.
        assert_eq!(cli.crawl.max_pages, None);
        assert_eq!(cli.crawl.grace, Duration::from_secs(30));
    }

    #[test]
    fn the_command_line_names_the_flag_of_a_bad_option() {
        let age = Duration::from_secs(1800);
        let err = |argv: &[&str]| crawl_args(argv).validate(age).unwrap_err().to_string();
        assert_eq!(
            err(&["http://a/", "--concurrency", "5000"]),
            "--concurrency: must be between 1 and 1024, found 5000"
        );
        assert_eq!(
            err(&["http://a/", "--per-host-concurrency", "0"]),
            "--per-host-concurrency: must be between 1 and 256, found 0"
        );
        assert_eq!(err(&["http://a/", "--delay", "2h"]), "--delay: at most 1h");
        assert!(err(&["http://a/", "--include", "("]).starts_with("--include: "));
        assert!(err(&["http://a/", "--select", "t="]).starts_with("--select t: "));
        assert!(err(&["ftp://a/"]).starts_with("URL: "));
        assert_eq!(err(&[]), "URL: give at least one URL to start from");
    }

    #[test]
    fn the_crawl_progress_line_shows_pages_rate_and_proxies() {
        use std::sync::atomic::Ordering;
        let p = crate::crawl::Progress::default();
        p.done.store(120, Ordering::Relaxed);
        p.failed.store(3, Ordering::Relaxed);
        p.queued.store(40, Ordering::Relaxed);
        p.in_flight.store(6, Ordering::Relaxed);
        let mut pool = crate::pool::PoolStats {
            proxies_busy: 5,
            proxies_cooling: 2,
            ..Default::default()
        };
        pool.banned_by_site.insert("a".into(), 1);
        pool.banned_by_site.insert("b".into(), 3);
        assert_eq!(
            crawl_progress_line(&p, &pool, std::time::Duration::from_secs(8)),
            "120 pages (3 failed), 40 queued, 6 in flight, 15.0 pages/s; \
             proxies 5 busy, 2 cooling, 4 banned"
        );
    }
}
