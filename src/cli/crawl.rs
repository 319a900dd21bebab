//! `proxywarden crawl`: a polite crawl through the pool, resumable from its
//! state file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser};

use crate::model::{ScopeKind, StrategyKind};

use super::{Cli, Command, ProxyFilterArgs, Signals, checkpoint, load, open_store, parse_duration};

/// `crawl` options.
#[derive(Debug, Args)]
pub struct CrawlArgs {
    /// Where to start. Without one, `--state` resumes the crawl it holds
    /// with the options it was started with.
    #[arg(value_name = "URL")]
    pub urls: Vec<String>,
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
    pub selects: Vec<crate::crawl::Select>,
    /// Extract every match of each --select, as an array.
    #[arg(long)]
    pub select_all: bool,
    /// Which hosts links may lead to.
    #[arg(long, value_enum, default_value = "same-host")]
    pub scope: ScopeKind,
    /// Only URLs matching this regex (repeatable: any of them).
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub include: Vec<regex::Regex>,
    /// No URL matching this regex (repeatable).
    #[arg(long, value_name = "REGEX", value_parser = parse_regex)]
    pub exclude: Vec<regex::Regex>,
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
    /// Pages in flight.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub concurrency: u32,
    /// Pages in flight per host.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    pub per_host_concurrency: u32,
    /// Least time between requests to one host (robots.txt's Crawl-delay
    /// applies when longer), e.g. 500ms.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration_or_zero)]
    pub delay: Option<std::time::Duration>,
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
    /// How long --on-no-proxy wait waits.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    pub no_proxy_wait: std::time::Duration,
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

fn parse_select(s: &str) -> Result<crate::crawl::Select, String> {
    crate::crawl::Select::parse(s)
}

fn parse_regex(s: &str) -> Result<regex::Regex, String> {
    regex::Regex::new(s).map_err(|e| e.to_string())
}

fn parse_size(s: &str) -> Result<u64, String> {
    s.trim()
        .parse::<bytesize::ByteSize>()
        .map(|b| b.0)
        .map_err(|e| format!("expected a size like 5MiB ({e})"))
}

fn parse_duration_or_zero(s: &str) -> Result<std::time::Duration, String> {
    match crate::config::parse_duration(s) {
        Err(_) if humantime::parse_duration(s.trim()).is_ok_and(|d| d.is_zero()) => {
            Ok(std::time::Duration::ZERO)
        }
        other => other,
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

    use crate::crawl::{CrawlOptions, Progress};
    use crate::pool::{NoProxy, Pool, PoolOptions};

    let args = resume_args(args)?;
    let mut seeds = Vec::new();
    for u in &args.urls {
        seeds.push(crate::crawl::url::parse_seed(u).map_err(anyhow::Error::msg)?);
    }
    if seeds.is_empty() && args.state.as_ref().is_none_or(|s| !s.exists()) {
        bail!("give a URL to crawl (or --state FILE of a crawl to resume)");
    }
    let (config, _) = load(config_path)?;
    let store = open_store(&config).await?;
    let mut opts = PoolOptions {
        query: args.filter.query(config.api.max_age),
        strategy: args.strategy,
        no_proxy: match (args.direct, args.on_no_proxy) {
            (true, _) | (_, NoProxyArg::Direct) => NoProxy::Direct,
            (_, NoProxyArg::Fail) => NoProxy::Fail,
            (_, NoProxyArg::Wait) => NoProxy::Wait(args.no_proxy_wait),
        },
        extra_ca: args.ca_file.clone(),
        ..PoolOptions::default()
    };
    if let Some(ua) = &args.user_agent {
        opts.user_agent = ua.clone();
    }
    if let Some(t) = args.connect_timeout {
        opts.connect_timeout = t;
    }
    if let Some(t) = args.first_byte_timeout {
        opts.first_byte_timeout = t;
    }
    if let Some(t) = args.timeout {
        opts.total_timeout = t;
    }
    if let Some(b) = args.max_body {
        opts.max_body = usize::try_from(b).unwrap_or(usize::MAX);
    }
    if let Some(n) = args.rotations {
        opts.rotations = n;
    }
    if let Some(n) = args.retries {
        opts.target_retries = n;
    }
    let pool = if args.direct {
        // No proxy at all: an empty index, so every request goes direct.
        let feedback =
            crate::health::Feedback::new(crate::health::HealthIndex::new(), store.clone());
        Pool::new(feedback, opts)?
    } else {
        Pool::from_store(&store, opts)?
    };
    if let Some(state) = &args.state
        && !args.urls.is_empty()
    {
        // Kept so that `crawl --state FILE` alone resumes with these options.
        let argv: Vec<String> = std::env::args().collect();
        let mut f = crate::crawl::frontier::Frontier::open(Some(state))?;
        f.set_meta(CRAWL_ARGV, &serde_json::to_string(&argv)?)?;
    }
    if let Some(dir) = &args.bodies {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let options = CrawlOptions {
        seeds,
        max_depth: args.max_depth,
        max_pages: args.max_pages,
        scope: args.scope,
        include: args.include.clone(),
        exclude: args.exclude.clone(),
        strip_params: args.strip_params.clone(),
        concurrency: args.concurrency as usize,
        per_host_concurrency: args.per_host_concurrency as usize,
        delay: args.delay.unwrap_or_default(),
        ignore_robots: args.ignore_robots,
        output: args.output.clone(),
        bodies: args.bodies.clone(),
        selects: args.selects.clone(),
        select_all: args.select_all,
        state: args.state.clone(),
        retry_failed: args.retry_failed,
        grace: args.grace,
        ..CrawlOptions::default()
    };

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

/// With no URL, a `--state` file's stored command line, followed by this
/// one's options (which win).
fn resume_args(args: CrawlArgs) -> anyhow::Result<CrawlArgs> {
    let Some(state) = args
        .state
        .as_ref()
        .filter(|s| args.urls.is_empty() && s.exists())
    else {
        return Ok(args);
    };
    let f = crate::crawl::frontier::Frontier::open(Some(state))?;
    let Some(stored) = f.meta(CRAWL_ARGV)? else {
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
    use super::*;

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
