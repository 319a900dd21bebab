//! The command tree and what each command prints. Commands return an exit
//! code; errors carry context for the user and are printed by `main`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use crate::config::{self, Config, ConfigOrigin};
use crate::export::{self, Format};
use crate::harvest::{self, HarvestReport, Progress, SourceReport};
use crate::proxy::{Country, Scheme, Status};
use crate::store::{Stats, Store, rfc3339};

/// Keeps a pool of working free proxies.
#[derive(Debug, Parser)]
#[command(name = "proxywarden", version, about)]
pub struct Cli {
    /// Config file (else $PROXYWARDEN_CONFIG, else ./proxywarden.toml, else
    /// built-in defaults).
    #[arg(short, long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// More log output (-v info, -vv debug; RUST_LOG overrides). Logs go to
    /// stderr, except for `serve`, which logs to stdout (for journald).
    /// Colours only on a terminal and never with NO_COLOR set.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: scheduled harvests, continuous checks and the HTTP API.
    Serve,
    /// Fetch every enabled source once and store what they list.
    Harvest(HarvestArgs),
    /// Check the due proxies once (or all of them) against the judges.
    Check(CheckArgs),
    /// Delete proxies dead for longer than check.purge_after that no source lists any more.
    Purge,
    /// Counts by status, scheme, country and source.
    Stats(StatsArgs),
    /// Write the stored proxies as txt, json or csv.
    Export(ExportArgs),
    /// Crawl a site through the alive proxies, politely, as JSON lines.
    // Later options win, so a resumed crawl's stored command line can be
    // followed by today's changes.
    #[command(args_override_self = true)]
    Crawl(Box<CrawlArgs>),
    /// Validate a config file or print the example.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script (e.g. `proxywarden completions bash >
    /// /etc/bash_completion.d/proxywarden`).
    Completions {
        /// The shell: bash, elvish, fish, powershell or zsh.
        shell: clap_complete::Shell,
    },
    /// Print the manual page, in roff (`proxywarden man | man -l -`).
    Man,
}

/// `harvest` options.
#[derive(Debug, Args)]
pub struct HarvestArgs {
    /// Only these sources (by name; repeatable).
    #[arg(long = "source", value_name = "NAME")]
    pub sources: Vec<String>,
}

/// `check` options; each overrides its `[check]` key.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Check every stored proxy, not only the due ones.
    #[arg(long)]
    pub all: bool,
    /// Checks in flight (check.concurrency).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub concurrency: Option<u32>,
    /// Total time per check, e.g. 4s (check.timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Time to connect to a proxy, e.g. 2s (check.connect_timeout).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<std::time::Duration>,
    /// Skip the CONNECT + TLS test (check.https = false).
    #[arg(long)]
    pub no_https: bool,
}

fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err("must be longer than zero".into()),
        Err(e) => Err(format!("expected a duration like 4s or 500ms ({e})")),
    }
}

/// `stats` options.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Which statuses to export.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StatusFilter {
    /// Passed the last check.
    Alive,
    /// Failed the last check.
    Dead,
    /// Never checked.
    Unknown,
    /// Everything stored.
    All,
}

/// `export` options.
#[derive(Debug, Args)]
pub struct ExportArgs {
    /// Which proxies.
    #[arg(long, value_enum, default_value = "alive")]
    pub status: StatusFilter,
    /// Output format.
    #[arg(long, value_enum, default_value = "txt")]
    pub format: ExportFormat,
    /// Write to this file (atomically) instead of stdout.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Which proxies.
    #[command(flatten)]
    pub filter: ProxyFilterArgs,
}

/// The proxy filters `export` and `crawl` share, as the API's.
#[derive(Debug, Args)]
pub struct ProxyFilterArgs {
    /// Only proxies in these countries (comma-separated ISO codes).
    #[arg(long, value_delimiter = ',', value_parser = parse_country)]
    pub country: Vec<Country>,
    /// Only these schemes (comma-separated: http, socks4, socks5).
    #[arg(long, value_delimiter = ',', value_parser = parse_scheme)]
    pub scheme: Vec<Scheme>,
    /// At least this anonymous (transparent < anonymous < elite).
    #[arg(long, value_parser = parse_anonymity)]
    pub anonymity: Option<crate::proxy::Anonymity>,
    /// Only proxies that tunnel HTTPS.
    #[arg(long)]
    pub https: bool,
    /// Only proxies at most this slow.
    #[arg(long, value_name = "MS")]
    pub max_latency_ms: Option<u32>,
    /// Alive proxies whose last passed check is at most this old (default:
    /// api.max_age, as the API serves them).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub max_age: Option<std::time::Duration>,
}

impl ProxyFilterArgs {
    /// The query these flags ask for, `default_max_age` unless one is given.
    fn query(&self, default_max_age: std::time::Duration) -> crate::health::ProxyQuery {
        crate::health::ProxyQuery {
            countries: self.country.clone(),
            schemes: self.scheme.clone(),
            min_anonymity: self.anonymity,
            https: self.https,
            max_latency_ms: self.max_latency_ms.map(i64::from),
            max_age: Some(self.max_age.unwrap_or(default_max_age)),
            ..Default::default()
        }
    }
}

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
    pub scope: ScopeArg,
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
    pub strategy: StrategyArg,
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

/// `crawl --scope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ScopeArg {
    /// The start URLs' hosts.
    SameHost,
    /// The start URLs' registrable domains (public suffix list).
    SameSite,
    /// Anywhere.
    Any,
}

/// `crawl --strategy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum StrategyArg {
    /// Every proxy in turn.
    RoundRobin,
    /// Any proxy at random.
    Random,
    /// The least busy proxy.
    LeastUsed,
    /// The better of two random proxies by success and latency.
    FastestOfTwo,
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
    humantime::parse_duration(s).map_err(|e| format!("expected a duration like 500ms ({e})"))
}

/// `export --format`: the command line's names for [`Format`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// `scheme://[user:pass@]host:port` per line.
    Txt,
    /// A JSON array of objects.
    Json,
    /// CSV with a header row.
    Csv,
}

impl From<ExportFormat> for Format {
    fn from(f: ExportFormat) -> Format {
        match f {
            ExportFormat::Txt => Format::Txt,
            ExportFormat::Json => Format::Json,
            ExportFormat::Csv => Format::Csv,
        }
    }
}

fn parse_anonymity(s: &str) -> Result<crate::proxy::Anonymity, crate::proxy::ParseError> {
    s.trim().to_ascii_lowercase().parse()
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate the config (from -c, the environment or ./proxywarden.toml)
    /// and name every problem.
    Check,
    /// Print the fully commented example config.
    Example,
}

fn parse_country(s: &str) -> Result<Country, String> {
    Country::parse(s).ok_or_else(|| format!("{s:?} is not a two-letter country code"))
}

fn parse_scheme(s: &str) -> Result<Scheme, crate::proxy::ParseError> {
    s.trim().to_ascii_lowercase().parse()
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "proxywarden", &mut out);
            // Not print!, which panics on a closed pipe.
            std::io::stdout().lock().write_all(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Man => {
            let mut out = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command()).render(&mut out)?;
            std::io::stdout().lock().write_all(&out)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigCommand::Example) => {
            // Not print!, which panics on a closed pipe.
            std::io::stdout()
                .lock()
                .write_all(config::EXAMPLE.as_bytes())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Config(ConfigCommand::Check) => {
            let (config, origin) = Config::discover(cli.config.as_deref())?;
            // What would only fail later: files that cannot be read.
            config.check_files(&origin.to_string())?;
            let enabled = config.sources.iter().filter(|s| s.enabled).count();
            println!(
                "{origin}: ok ({} sources, {enabled} enabled; database {})",
                config.sources.len(),
                config.database.path.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Harvest(args) => {
            let (mut config, origin) = load(cli.config.as_deref())?;
            if !args.sources.is_empty() {
                for name in &args.sources {
                    if !config.sources.iter().any(|s| &s.name == name) {
                        bail!("no source named {name:?} in {origin}");
                    }
                }
                config.sources.retain(|s| args.sources.contains(&s.name));
                for s in &mut config.sources {
                    s.enabled = true;
                }
            }
            let store = open_store(&config)?;
            // On a terminal each source is shown as it finishes, so a slow
            // one does not look like a hang; piped, only the table is printed.
            let terminal = std::io::stderr().is_terminal();
            let show = |r: &SourceReport, p: Progress| {
                if terminal {
                    eprintln!("[{}/{}] {}", p.finished, p.total, progress_line(r));
                }
            };
            let report = harvest::harvest_all_reporting(&config, &store, &show).await;
            checkpoint(&store).await;
            let report = report?;
            print_harvest(&report, &mut std::io::stdout().lock())?;
            if let Some(e) = report.store_error() {
                let stored: usize = report.sources.iter().map(|s| s.stored).sum();
                let found: usize = report.sources.iter().map(|s| s.found).sum();
                eprintln!(
                    "error: {e}; {stored} of the {found} proxies found were stored, in whole \
                     transactions, and the rest were not: free space for {} and harvest again",
                    config.database.path.display()
                );
                Ok(ExitCode::from(1))
            } else if report.any_worked() {
                Ok(ExitCode::SUCCESS)
            } else {
                eprintln!(
                    "error: all {} sources failed; nothing was harvested",
                    report.sources.len()
                );
                Ok(ExitCode::from(1))
            }
        }
        Command::Serve => {
            let (config, origin) = load(cli.config.as_deref())?;
            config.check_runtime_files(&origin.to_string())?;
            let listener = tokio::net::TcpListener::bind(config.api.listen)
                .await
                .with_context(|| format!("cannot listen on {} (api.listen)", config.api.listen))?;
            let gateway = if config.gateway.enabled {
                let addr = config.gateway.listen;
                Some(
                    tokio::net::TcpListener::bind(addr)
                        .await
                        .with_context(|| format!("cannot listen on {addr} (gateway.listen)"))?,
                )
            } else {
                None
            };
            tracing::info!(config = %origin, "starting");
            let shutdown = tokio_util::sync::CancellationToken::new();
            {
                let shutdown = shutdown.clone();
                let mut signals = Signals::new()?;
                tokio::spawn(async move {
                    signals.next().await;
                    shutdown.cancel();
                    // A second signal: no more waiting for the graceful stop.
                    signals.next().await;
                    tracing::warn!("stopping at once on a second signal");
                    std::process::exit(130);
                });
            }
            crate::daemon::run(config, listener, gateway, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check(args) => check(cli.config.as_deref(), args).await,
        Command::Crawl(args) => crawl(cli.config.as_deref(), *args).await,
        Command::Purge => {
            let (config, _) = load(cli.config.as_deref())?;
            let store = open_store(&config)?;
            let purged = store
                .purge(crate::store::now_ms(), config.check.purge_after)
                .await?;
            checkpoint(&store).await;
            println!("purged {purged} proxies");
            Ok(ExitCode::SUCCESS)
        }
        Command::Stats(args) => {
            let (config, _) = load(cli.config.as_deref())?;
            let store = Store::open_read_only(&config.database.path)?;
            let stats = store.stats().await?;
            let mut out = std::io::stdout().lock();
            if args.json {
                serde_json::to_writer_pretty(&mut out, &stats)?;
                writeln!(out)?;
            } else {
                print_stats(&stats, &mut out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Export(args) => {
            let (config, _) = load(cli.config.as_deref())?;
            let store = Store::open_read_only(&config.database.path)?;
            let mut q = args.filter.query(config.api.max_age);
            let records: Vec<crate::store::ProxyRecord> = if args.status == StatusFilter::Alive {
                // The healthy list, chosen exactly as the API's /export does.
                let index = crate::health::load_index(&store).await?;
                index
                    .select(&q, crate::store::now_ms())
                    .iter()
                    .map(|e| (*e.record).clone())
                    .collect()
            } else {
                q.max_age = None;
                let status = match args.status {
                    StatusFilter::Dead => Some(Status::Dead),
                    StatusFilter::Unknown => Some(Status::Unknown),
                    _ => None,
                };
                store
                    .list_proxies(q.to_filter(status, crate::store::now_ms()))
                    .await?
            };
            match &args.output {
                Some(path) => {
                    export::write_file(&records, args.format.into(), path)
                        .with_context(|| format!("cannot write {}", path.display()))?;
                    eprintln!("wrote {} proxies to {}", records.len(), path.display());
                }
                // `export | head` closing the pipe early ends quietly (main).
                None => export::write(&records, args.format.into(), std::io::stdout().lock())?,
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// The meta key holding the command line a crawl state was started with.
const CRAWL_ARGV: &str = "argv";

/// `proxywarden crawl`: a pool from the store (refreshed from it while the
/// crawl runs), a progress line on a terminal, the summary on stderr, and
/// Ctrl-C or SIGTERM finishing the pages in flight (exit status 130; a
/// second signal exits at once, the state stays consistent).
async fn crawl(config_path: Option<&Path>, args: CrawlArgs) -> anyhow::Result<ExitCode> {
    use std::io::IsTerminal;
    use std::sync::Arc;

    use crate::crawl::{CrawlOptions, Progress, ScopeKind};
    use crate::pool::{NoProxy, Pool, PoolOptions, StrategyKind};

    let args = resume_args(args)?;
    let mut seeds = Vec::new();
    for u in &args.urls {
        seeds.push(crate::crawl::url::parse_seed(u).map_err(anyhow::Error::msg)?);
    }
    if seeds.is_empty() && args.state.as_ref().is_none_or(|s| !s.exists()) {
        bail!("give a URL to crawl (or --state FILE of a crawl to resume)");
    }
    let (config, _) = load(config_path)?;
    let store = open_store(&config)?;
    let mut opts = PoolOptions {
        query: args.filter.query(config.api.max_age),
        strategy: match args.strategy {
            StrategyArg::RoundRobin => StrategyKind::RoundRobin,
            StrategyArg::Random => StrategyKind::Random,
            StrategyArg::LeastUsed => StrategyKind::LeastUsed,
            StrategyArg::FastestOfTwo => StrategyKind::FastestOfTwo,
        },
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
        scope: match args.scope {
            ScopeArg::SameHost => ScopeKind::SameHost,
            ScopeArg::SameSite => ScopeKind::SameSite,
            ScopeArg::Any => ScopeKind::Any,
        },
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

/// `proxywarden check`: one round with a progress display, Ctrl-C stopping
/// it gracefully (exit status 130 after committing what was checked).
async fn check(config_path: Option<&Path>, args: CheckArgs) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;

    use crate::check::{self, CheckOptions, Checker, RoundProgress};

    let (config, origin) = load(config_path)?;
    config.check_runtime_files(&origin.to_string())?;
    let store = open_store(&config)?;
    if store.counts().await?.total == 0 {
        eprintln!(
            "error: the database {} holds no proxies yet: run `proxywarden harvest` first",
            config.database.path.display()
        );
        return Ok(ExitCode::from(1));
    }
    let mut opts = CheckOptions::from_config(&config.check);
    opts.all = args.all;
    if let Some(c) = args.concurrency {
        opts.concurrency = c as usize;
    }
    if let Some(t) = args.timeout {
        opts.timeout = t;
    }
    if let Some(t) = args.connect_timeout {
        opts.connect_timeout = t;
    }
    if opts.connect_timeout > opts.timeout {
        bail!("--connect-timeout must not be longer than --timeout");
    }
    opts.https &= !args.no_https;
    opts.concurrency = check::clamp_concurrency(opts.concurrency);

    let geoip = check::open_geoip(&config)?;
    let checker = Arc::new(Checker::prepare(&config, &opts, geoip).await?);
    let cancel = tokio_util::sync::CancellationToken::new();
    {
        let cancel = cancel.clone();
        let mut signals = Signals::new()?;
        tokio::spawn(async move {
            // SIGTERM (a service manager, `kill`) is handled as Ctrl-C.
            signals.next().await;
            eprintln!("\ninterrupted: finishing the checks in flight (Ctrl-C again to quit now)…");
            cancel.cancel();
            signals.next().await;
            // Every committed result stays; those in flight are checked again.
            std::process::exit(130);
        });
    }
    let progress = Arc::new(RoundProgress::default());
    let display = {
        let progress = progress.clone();
        let terminal = std::io::stderr().is_terminal();
        tokio::spawn(async move { show_progress(&progress, terminal).await })
    };
    // Nothing is served from this process; the index only completes the
    // one feedback path the results take to the store.
    let feedback = crate::health::Feedback::new(crate::health::HealthIndex::new(), store.clone());
    let result = check::check_round(
        checker,
        &store,
        &feedback,
        &opts,
        config.check.recheck_policy(),
        &cancel,
        progress.clone(),
    )
    .await;
    checkpoint(&store).await;
    display.abort();
    let _ = display.await;
    if std::io::stderr().is_terminal() {
        // Clear the progress line.
        eprint!("\r\x1b[2K");
    }
    let summary = match result {
        Err(check::CheckError::Store(e)) if e.write_failure().is_some() => bail!(
            "{e}: the round stopped; the results committed before it are kept and the proxies \
             not recorded stay due: free space for {} and check again",
            config.database.path.display()
        ),
        other => other?,
    };
    print_check_summary(&summary, &mut std::io::stdout().lock())?;
    Ok(if summary.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// A progress bar on a terminal; otherwise a log line every few seconds.
async fn show_progress(progress: &crate::check::RoundProgress, terminal: bool) {
    use std::sync::atomic::Ordering;
    let started = std::time::Instant::now();
    let bar = terminal.then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:30} {pos}/{len} checked, {msg}, {rate}, ETA {eta}",
            )
            .map(|style| {
                // indicatif's {per_sec} has four decimals; a rate of checks
                // reads as a whole number.
                style.with_key(
                    "rate",
                    |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                        let _ = w.write_str(&rate_text(s.per_sec()));
                    },
                )
            })
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let every = if terminal {
        std::time::Duration::from_millis(200)
    } else {
        std::time::Duration::from_secs(5)
    };
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        let total = progress.total.load(Ordering::Relaxed);
        let done = progress.done.load(Ordering::Relaxed);
        let alive = progress.alive.load(Ordering::Relaxed);
        match &bar {
            Some(bar) => {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(format!("{alive} alive"));
            }
            None => {
                let rate = done as f64 / started.elapsed().as_secs_f64().max(0.001);
                eprintln!("checked {done}/{total}, {alive} alive, {}", rate_text(rate));
            }
        }
    }
}

/// A rate as people read it: a whole number per second.
pub fn rate_text(per_sec: f64) -> String {
    let per_sec = if per_sec.is_finite() {
        per_sec.max(0.0)
    } else {
        0.0
    };
    format!("{per_sec:.0}/s")
}

/// The end-of-round summary.
pub fn print_check_summary(
    s: &crate::check::RoundSummary,
    out: &mut impl Write,
) -> std::io::Result<()> {
    writeln!(
        out,
        "checked {} proxies in {:.1}s{}: {} alive, {} dead, {} alive with HTTPS",
        s.checked,
        s.elapsed.as_secs_f64(),
        if s.interrupted { " (interrupted)" } else { "" },
        s.alive,
        s.dead,
        s.https
    )?;
    if !s.by_anonymity.is_empty() {
        let parts: Vec<String> = s
            .by_anonymity
            .iter()
            .rev()
            .map(|(a, n)| format!("{a} {n}"))
            .collect();
        writeln!(out, "alive by anonymity: {}", parts.join(", "))?;
    }
    if s.unconfirmed > 0 {
        writeln!(
            out,
            "unconfirmed: {} alive proxies failed in a way that may be the judge's and no second \
             healthy judge could confirm it; they stay alive and are checked again within a minute",
            s.unconfirmed
        )?;
    }
    if !s.dead_by_reason.is_empty() {
        let mut reasons: Vec<(&crate::model::Reason, &u64)> = s.dead_by_reason.iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(a.1));
        let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{r} {n}")).collect();
        writeln!(out, "dead by reason: {}", parts.join(", "))?;
    }
    Ok(())
}

/// SIGTERM (systemd stop, `kill`) and SIGINT (Ctrl-C), listened to from
/// the start so that none is missed between two waits.
struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Signals> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?,
                int: signal(SignalKind::interrupt()).context("cannot listen for SIGINT")?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    /// The next SIGTERM or SIGINT.
    async fn next(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// True when `e` comes from writing to a pipe whose reader has gone
/// (`stats | head -1`): the command ends quietly with status 0. Looks
/// through the cause chain, as writers such as csv wrap the I/O error.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    use std::io::ErrorKind::BrokenPipe;
    e.chain().any(|cause| {
        if let Some(j) = cause.downcast_ref::<serde_json::Error>() {
            return j.io_error_kind() == Some(BrokenPipe);
        }
        let Some(io) = cause.downcast_ref::<std::io::Error>() else {
            return false;
        };
        let csv = io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<csv::Error>())
            .is_some_and(|c| matches!(c.kind(), csv::ErrorKind::Io(e) if e.kind() == BrokenPipe));
        io.kind() == BrokenPipe || csv
    })
}

fn load(explicit: Option<&Path>) -> anyhow::Result<(Config, ConfigOrigin)> {
    Ok(Config::discover(explicit)?)
}

fn open_store(config: &Config) -> anyhow::Result<Store> {
    Ok(Store::open(&config.database.path)?)
}

/// Leaves every commit in the database file itself before the command
/// exits, rather than in the write-ahead log beside it: a copy of the file
/// alone (a backup, a move) then holds everything (see
/// [`Store::checkpoint`]).
async fn checkpoint(store: &Store) {
    match store.checkpoint().await {
        Ok(true) => {}
        Ok(false) => tracing::debug!("another process is reading; part of the log stays"),
        Err(e) => tracing::warn!(error = %e, "cannot copy the write-ahead log into the database"),
    }
}

/// The width of a SOURCE column holding `names`.
fn name_width<'a>(names: impl Iterator<Item = &'a str>) -> usize {
    names.map(str::len).max().unwrap_or(0).max("SOURCE".len())
}

/// What a finished source did, in one line for progress.
pub fn progress_line(s: &SourceReport) -> String {
    let took = s.duration.as_secs_f64();
    let line = match &s.error {
        Some(e) if !s.worked() => format!("{}: failed after {took:.1}s: {e}", s.name),
        _ if s.private > 0 => format!(
            "{}: {} found, {} new, {} private dropped in {took:.1}s",
            s.name, s.found, s.new, s.private
        ),
        _ => format!("{}: {} found, {} new in {took:.1}s", s.name, s.found, s.new),
    };
    match &s.store_error {
        Some(e) => format!("{line}; only {} stored: {e}", s.stored),
        None => line,
    }
}

/// One line per source and a total.
pub fn print_harvest(report: &HarvestReport, out: &mut impl Write) -> std::io::Result<()> {
    let width = name_width(report.sources.iter().map(|s| s.name.as_str()));
    writeln!(
        out,
        "{:<width$}  {:>7}  {:>7}  {:>6}  {:>7}  ERROR",
        "SOURCE", "FOUND", "NEW", "HTTP", "TIME"
    )?;
    for s in &report.sources {
        let mut error = s.error.clone().unwrap_or_default();
        if s.truncated {
            if !error.is_empty() {
                error.push_str("; ");
            }
            error.push_str("truncated at harvest.max_per_source");
        }
        if s.private > 0 && s.error.is_none() {
            if !error.is_empty() {
                error.push_str("; ");
            }
            error.push_str(&format!(
                "{} private or own addresses dropped (harvest.allow_private_addresses)",
                s.private
            ));
        }
        writeln!(
            out,
            "{:<width$}  {:>7}  {:>7}  {:>6}  {:>6.1}s  {}",
            s.name,
            s.found,
            s.new,
            s.http_status.map_or("-".to_string(), |c| c.to_string()),
            s.duration.as_secs_f64(),
            error
        )?;
    }
    let failed = report.sources.iter().filter(|s| !s.worked()).count();
    writeln!(
        out,
        "total: {} sources ({} ok, {failed} failed), {} distinct proxies, {} new, in {:.1}s",
        report.sources.len(),
        report.sources.len() - failed,
        report.distinct,
        report.new,
        report.elapsed.as_secs_f64()
    )?;
    // The store's failure is not the sources': apart from their errors,
    // with what each source got into the store before it.
    if let Some(e) = report.store_error() {
        let parts: Vec<String> = report
            .sources
            .iter()
            .filter(|s| !s.stored_all())
            .map(|s| format!("{} {} of {}", s.name, s.stored, s.found))
            .collect();
        writeln!(out, "not stored: {e}")?;
        writeln!(out, "stored before it: {}", parts.join(", "))?;
    }
    Ok(())
}

/// Human-readable tables of [`Stats`].
pub fn print_stats(stats: &Stats, out: &mut impl Write) -> std::io::Result<()> {
    writeln!(out, "proxies: {}", stats.total)?;
    let section = |out: &mut dyn Write,
                   title: &str,
                   map: &std::collections::BTreeMap<String, i64>|
     -> std::io::Result<()> {
        writeln!(out, "\n{title}")?;
        let mut rows: Vec<(&String, &i64)> = map.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (k, v) in rows {
            writeln!(out, "  {k:<16} {v:>9}")?;
        }
        Ok(())
    };
    section(out, "by status", &stats.by_status)?;
    section(out, "by scheme", &stats.by_scheme)?;
    if !stats.by_anonymity.is_empty() {
        section(out, "alive by anonymity", &stats.by_anonymity)?;
    }
    if !stats.by_reason.is_empty() {
        section(out, "dead by reason", &stats.by_reason)?;
    }
    section(out, "by country", &stats.by_country)?;
    writeln!(out, "\nby source")?;
    let width = name_width(stats.sources.iter().map(|s| s.name.as_str()));
    writeln!(
        out,
        "  {:<width$}  {:>8}  {:>7}  {:<24}  LAST ERROR",
        "SOURCE", "PROXIES", "ALIVE", "LAST FETCH"
    )?;
    for s in &stats.sources {
        writeln!(
            out,
            "  {:<width$}  {:>8}  {:>7}  {:<24}  {}",
            s.name,
            s.proxies,
            s.alive,
            s.last_fetch_at.map(rfc3339).unwrap_or_else(|| "-".into()),
            s.last_error.as_deref().unwrap_or("")
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks no second judge could confirm are named in the summary.
    #[test]
    fn the_summary_names_unconfirmed_checks() {
        let mut s = crate::check::RoundSummary::default();
        (s.checked, s.alive, s.dead, s.unconfirmed) = (10, 7, 3, 4);
        let mut out = Vec::new();
        print_check_summary(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("unconfirmed: 4 alive proxies"), "{text}");
        s.unconfirmed = 0;
        let mut out = Vec::new();
        print_check_summary(&s, &mut out).unwrap();
        assert!(!String::from_utf8(out).unwrap().contains("unconfirmed"));
    }

    #[test]
    fn rates_are_whole_numbers() {
        assert_eq!(rate_text(1234.5678), "1235/s");
        assert_eq!(rate_text(0.4), "0/s");
        assert_eq!(rate_text(f64::NAN), "0/s");
        assert_eq!(rate_text(f64::INFINITY), "0/s");
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
