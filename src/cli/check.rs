//! `proxywarden check`: the command's options (its two modes' alike), and one
//! check round of the stored proxies with a progress display; `check_list`
//! is the other mode, a list given by hand.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::bail;
use clap::Args;

use super::{Signals, checkpoint, load, open_store, parse_duration};
use crate::model::SourceScheme;
use crate::proxy::Scheme;
use crate::store::WriteFailure;

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
    /// Checking a list given by hand.
    #[command(flatten)]
    pub list: ListArgs,
}

/// `check --list` options (only with `--list`).
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Check the proxies listed in FILE (`-` for stdin) instead of the
    /// stored ones, and print those that work. Any text list harvest reads:
    /// `host:port`, `scheme://[user:pass@]host:port`, `host:port:user:pass`,
    /// `host port` columns; blank lines and `#` comments are skipped. No
    /// config or database is needed.
    #[arg(long, value_name = "FILE", conflicts_with = "all")]
    pub list: Option<PathBuf>,
    /// The scheme of entries that carry none (default: detect, trying
    /// http, socks5 and socks4 in turn).
    #[arg(long, value_enum, requires = "list")]
    pub scheme: Option<ListScheme>,
    /// Ask this judge instead of the configured ones (repeatable): an
    /// http(s) URL that echoes the request, such as another proxywarden's
    /// /judge or an httpbin-style /get.
    #[arg(long = "judge", value_name = "URL", requires = "list")]
    pub judges: Vec<String>,
    /// How the working proxies are printed, fastest first.
    #[arg(long, value_enum, default_value = "txt", requires = "list")]
    pub format: ListFormat,
    /// Also add the working proxies, with their verdicts, to the database
    /// (as the source `list:NAME`, NAME being the file's name).
    #[arg(long, requires = "list")]
    pub store: bool,
}

/// `check --scheme`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListScheme {
    /// Plain HTTP proxies (CONNECT tested for HTTPS).
    Http,
    /// SOCKS4 (and 4a).
    Socks4,
    /// SOCKS5.
    Socks5,
    /// Try http, socks5 and socks4 in turn.
    Detect,
}

impl From<ListScheme> for SourceScheme {
    fn from(s: ListScheme) -> SourceScheme {
        match s {
            ListScheme::Http => SourceScheme::Fixed(Scheme::Http),
            ListScheme::Socks4 => SourceScheme::Fixed(Scheme::Socks4),
            ListScheme::Socks5 => SourceScheme::Fixed(Scheme::Socks5),
            ListScheme::Detect => SourceScheme::Detect,
        }
    }
}

/// `check --format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ListFormat {
    /// `scheme://[user:pass@]host:port` per line.
    Txt,
    /// A JSON array of objects with the verdicts.
    Json,
    /// CSV with a header row, the JSON fields as columns.
    Csv,
}

/// The round's options: `[check]` with the command line's overrides.
pub(super) fn options(
    config: &crate::config::Config,
    args: &CheckArgs,
) -> anyhow::Result<crate::check::CheckOptions> {
    let mut opts = crate::check::CheckOptions::from_config(&config.check);
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
    opts.concurrency = crate::check::clamp_concurrency(opts.concurrency);
    Ok(opts)
}

/// Cancels `cancel` on the first SIGTERM or SIGINT (a service manager,
/// `kill` and Ctrl-C alike), letting the checks in flight finish; a second
/// one quits at once with status 130.
pub(super) fn on_signals(cancel: tokio_util::sync::CancellationToken) -> anyhow::Result<()> {
    let mut signals = Signals::new()?;
    tokio::spawn(async move {
        signals.next().await;
        eprintln!("\ninterrupted: finishing the checks in flight (Ctrl-C again to quit now)…");
        cancel.cancel();
        signals.next().await;
        // Every committed result stays; those in flight are checked again.
        std::process::exit(130);
    });
    Ok(())
}

/// `proxywarden check`: one round with a progress display, Ctrl-C stopping
/// it gracefully (exit status 130 after committing what was checked).
pub(super) async fn run(config_path: Option<&Path>, args: CheckArgs) -> anyhow::Result<ExitCode> {
    use std::sync::Arc;

    use crate::check::{self, Checker, RoundProgress};

    let (config, origin) = load(config_path)?;
    config.check_runtime_files(&origin.to_string())?;
    let store = open_store(&config).await?;
    if store.counts().await?.total == 0 {
        eprintln!(
            "error: the database {} holds no proxies yet: run `proxywarden harvest` first",
            store.path().display()
        );
        return Ok(ExitCode::from(1));
    }
    let mut opts = options(&config, &args)?;
    if store.is_shared() {
        // On a database nodes share, due proxies are leased as a `serve`
        // node leases them, so a check run by hand beside the nodes takes
        // none they are checking, and they take none of its. (`--all`
        // checks every proxy whoever holds it.) On SQLite a check left
        // without giving its leases back (killed, a full disk) would keep
        // the next run off those proxies for a lease's length.
        opts.lease = Some(crate::check::CheckLease {
            node: config.node.id(),
            hold: config.node.lease,
        });
    }

    // Listened to before the judges are asked: a signal then still ends
    // the command as interrupted.
    let cancel = tokio_util::sync::CancellationToken::new();
    on_signals(cancel.clone())?;
    let geoip = check::open_geoip(&config)?;
    let checker = Arc::new(Checker::prepare(&config, &opts, geoip).await?);
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
             not recorded stay due: {} and check again",
            super::free_space(&store, e.write_failure().unwrap_or(WriteFailure::DiskFull))
        ),
        other => other?,
    };
    let mut summary = summary;
    // Interrupted even when every due proxy had been started (all in
    // flight): the user stopped the command, and its status says so.
    summary.interrupted |= cancel.is_cancelled();
    print_check_summary(&summary, &mut std::io::stdout().lock())?;
    Ok(if summary.interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// A progress bar on a terminal; otherwise a log line every few seconds.
pub(super) async fn show_progress(progress: &crate::check::RoundProgress, terminal: bool) {
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
    // "with HTTPS" counts only what this round tested; the others keep
    // what an earlier test found.
    let tested = s.alive - s.https_untested.min(s.alive);
    let https = match (tested, s.https_untested) {
        (0, 0) => String::new(),
        (0, kept) => format!(" (HTTPS not tested: {kept} alive keep their earlier result)"),
        (t, 0) if t == s.alive => format!(", {} alive with HTTPS", s.https),
        (t, kept) => format!(
            ", {} of the {t} tested alive with HTTPS ({kept} alive not tested keep their earlier \
             result)",
            s.https
        ),
    };
    writeln!(
        out,
        "checked {} in {:.1}s{}: {} alive, {} dead{https}",
        crate::cli::proxies(s.checked),
        s.elapsed.as_secs_f64(),
        if s.interrupted { " (interrupted)" } else { "" },
        s.alive,
        s.dead,
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

    /// One proxy is one proxy.
    #[test]
    fn the_summary_counts_one_proxy_in_the_singular() {
        let mut s = crate::check::RoundSummary::default();
        (s.checked, s.alive) = (1, 1);
        let mut out = Vec::new();
        print_check_summary(&s, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("checked 1 proxy in "), "{text}");
        s.checked = 2;
        let mut out = Vec::new();
        print_check_summary(&s, &mut out).unwrap();
        assert!(
            String::from_utf8(out)
                .unwrap()
                .starts_with("checked 2 proxies in ")
        );
    }

    /// "alive with HTTPS" counts only the proxies this round tested.
    #[test]
    fn the_summary_names_https_results_kept_from_earlier() {
        let text = |alive, https, untested| {
            let mut s = crate::check::RoundSummary::default();
            (s.checked, s.alive, s.dead) = (alive + 1, alive, 1);
            (s.https, s.https_untested) = (https, untested);
            let mut out = Vec::new();
            print_check_summary(&s, &mut out).unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(text(7, 2, 0).contains(": 7 alive, 1 dead, 2 alive with HTTPS\n"));
        assert!(text(7, 2, 3).contains(
            ": 7 alive, 1 dead, 2 of the 4 tested alive with HTTPS (3 alive not tested keep \
             their earlier result)"
        ));
        assert!(
            text(7, 0, 7).contains(
                ": 7 alive, 1 dead (HTTPS not tested: 7 alive keep their earlier result)"
            )
        );
        assert!(text(0, 0, 0).contains(": 0 alive, 1 dead\n"));
    }

    #[test]
    fn rates_are_whole_numbers() {
        assert_eq!(rate_text(1234.5678), "1235/s");
        assert_eq!(rate_text(0.4), "0/s");
        assert_eq!(rate_text(f64::NAN), "0/s");
        assert_eq!(rate_text(f64::INFINITY), "0/s");
    }
}
