//! `proxywarden check --list FILE|-`: checks a list given by hand, with no
//! config and no database needed, and prints the proxies that work with
//! the verdicts the daemon records. Every address the list names is
//! checked, private ones included: the user chose them, unlike a public
//! list's.

use std::io::{IsTerminal, Read, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use serde::Serialize;

use super::check::{CheckArgs, ListFormat};
use super::{checkpoint, load, open_store};
use crate::check::{self, Checker, RoundProgress};
use crate::config::{Config, JudgeConfig};
use crate::harvest::{Candidates, text};
use crate::model::{Candidate, CandidateList, Hints, Outcome, SourceScheme};
use crate::proxy::Proxy;
use crate::store::{CheckRecord, SourceRun, now_ms};

/// The largest list read: far beyond any list checked by hand, and a bound
/// on what `-` reads from a pipe that never ends.
const MAX_LIST: u64 = 256 << 20;
/// Lines not read that are quoted in the summary; the rest are counted.
const QUOTED_BAD_LINES: usize = 3;
/// The longest part of a bad line quoted.
const QUOTE_CHARS: usize = 60;

/// What a list held.
#[derive(Debug)]
pub struct ParsedList {
    /// The distinct entries, in the list's order.
    pub candidates: Vec<Candidate>,
    /// Lines (not blank, not comments) with no proxy in them.
    pub bad_lines: usize,
    /// The first few of those, as `line N: "text"`.
    pub quoted: Vec<String>,
    /// True when entries past `limit` were left out.
    pub truncated: bool,
}

/// Reads `body` line by line with harvest's text parser; a line with no
/// proxy in it is counted, not fatal. At most `limit` distinct entries.
pub fn parse_list(body: &str, default: SourceScheme, limit: usize) -> ParsedList {
    let mut all = Candidates::new(limit);
    let mut bad_lines = 0;
    let mut quoted = Vec::new();
    for (n, line) in body.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let mut found = Candidates::new(usize::MAX);
        text::parse(trimmed, default, &mut found);
        if found.is_empty() {
            bad_lines += 1;
            if quoted.len() < QUOTED_BAD_LINES {
                let shown: String = trimmed.chars().take(QUOTE_CHARS).collect();
                let more = if shown.len() < trimmed.len() {
                    "…"
                } else {
                    ""
                };
                quoted.push(format!("line {}: {shown:?}{more}", n + 1));
            }
            continue;
        }
        for c in found.into_vec() {
            if !all.push(c) {
                break;
            }
        }
        if all.truncated() {
            break;
        }
    }
    ParsedList {
        truncated: all.truncated(),
        candidates: all.into_vec(),
        bad_lines,
        quoted,
    }
}

/// A working proxy as printed.
#[derive(Clone, Debug, Serialize)]
pub struct WorkingRow {
    /// `scheme://[user:pass@]host:port`.
    pub url: String,
    /// `http`, `socks4` or `socks5` (the detected one for detected entries).
    pub scheme: &'static str,
    /// Address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// `transparent`, `anonymous` or `elite`.
    pub anonymity: Option<&'static str>,
    /// Whether HTTPS tunnels through it (empty when not tested).
    pub https: Option<bool>,
    /// Latency of the judge's answer through it.
    pub latency_ms: u64,
    /// Country of the exit address (with a GeoIP database configured).
    pub country: Option<String>,
    /// The address the judge saw.
    pub exit_ip: Option<String>,
}

impl WorkingRow {
    fn new(proxy: &Proxy, o: &Outcome) -> WorkingRow {
        WorkingRow {
            url: proxy.to_string(),
            scheme: proxy.scheme.as_str(),
            host: proxy.host.to_string(),
            port: proxy.port,
            anonymity: o.anonymity.map(|a| a.as_str()),
            https: o.https,
            latency_ms: o.latency.map_or(0, |l| l.as_millis() as u64),
            country: o.country.map(|c| c.to_string()),
            exit_ip: o.exit_ip.map(|ip| ip.to_string()),
        }
    }
}

/// Writes the working proxies in `format`.
pub fn write_working(rows: &[WorkingRow], format: ListFormat, w: impl Write) -> anyhow::Result<()> {
    let mut w = std::io::BufWriter::new(w);
    match format {
        ListFormat::Txt => {
            for r in rows {
                writeln!(w, "{}", r.url)?;
            }
        }
        ListFormat::Json => {
            serde_json::to_writer_pretty(&mut w, rows)?;
            writeln!(w)?;
        }
        ListFormat::Csv => {
            let mut csv = csv::Writer::from_writer(&mut w);
            for r in rows {
                csv.serialize(r)?;
            }
            if rows.is_empty() {
                csv.write_record([
                    "url",
                    "scheme",
                    "host",
                    "port",
                    "anonymity",
                    "https",
                    "latency_ms",
                    "country",
                    "exit_ip",
                ])?;
            }
            csv.flush()?;
        }
    }
    w.flush()?;
    Ok(())
}

/// Reads the list named on the command line.
fn read_list(path: &Path) -> anyhow::Result<String> {
    let mut bytes = Vec::new();
    let named = path.display();
    if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(MAX_LIST + 1)
            .read_to_end(&mut bytes)
            .context("cannot read the list from stdin")?;
    } else {
        std::fs::File::open(path)
            .with_context(|| format!("cannot open the list {named}"))?
            .take(MAX_LIST + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("cannot read the list {named}"))?;
    }
    if bytes.len() as u64 > MAX_LIST {
        bail!(
            "the list {named} is larger than {} MiB: split it",
            MAX_LIST >> 20
        );
    }
    // A stray byte that is not UTF-8 spoils one line, not the list.
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The judges `--judge` names, each an http(s) URL.
fn judges_from(urls: &[String]) -> anyhow::Result<Vec<JudgeConfig>> {
    urls.iter()
        .map(|u| match url::Url::parse(u) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                Ok(JudgeConfig {
                    url,
                    marker: None,
                    echo: true,
                })
            }
            Ok(_) => bail!("--judge {u:?}: expected an http(s) URL"),
            Err(e) => bail!("--judge {u:?}: not a URL ({e})"),
        })
        .collect()
}

/// Runs `check --list`.
pub(super) async fn run(
    config_path: Option<&Path>,
    args: CheckArgs,
    list: &Path,
) -> anyhow::Result<ExitCode> {
    let (mut config, origin) = load(config_path)?;
    if !args.list.judges.is_empty() {
        config.check.judges = judges_from(&args.list.judges)?;
    }
    config.check_runtime_files(&origin.to_string())?;
    let opts = super::check::options(&config, &args)?;

    let body = read_list(list)?;
    let default = args.list.scheme.map_or(SourceScheme::Detect, Into::into);
    let parsed = parse_list(&body, default, config.harvest.max_per_source);
    drop(body);
    let named = list.display();
    if parsed.candidates.is_empty() {
        eprintln!(
            "error: no proxy found in {named}{}",
            bad_lines_text(&parsed).map_or(String::new(), |t| format!(" ({t})"))
        );
        return Ok(ExitCode::from(1));
    }
    if parsed.truncated {
        eprintln!(
            "warning: only the first {} distinct proxies are checked (harvest.max_per_source)",
            parsed.candidates.len()
        );
    }

    // Listened to before the judges are asked: a signal then still ends
    // the command as interrupted.
    let cancel = tokio_util::sync::CancellationToken::new();
    super::check::on_signals(cancel.clone())?;
    let geoip = check::open_geoip(&config)?;
    let checker = Arc::new(Checker::prepare(&config, &opts, geoip).await?);
    let progress = Arc::new(RoundProgress::default());
    progress
        .total
        .store(parsed.candidates.len() as u64, Ordering::Relaxed);
    let terminal = std::io::stderr().is_terminal();
    // A bar on a terminal; piped, nothing but the result.
    let display = terminal.then(|| {
        let progress = progress.clone();
        tokio::spawn(async move { super::check::show_progress(&progress, true).await })
    });
    let started = Instant::now();
    let bad_lines = bad_lines_text(&parsed);
    let results = check_all(
        checker,
        parsed.candidates,
        opts.concurrency,
        &cancel,
        &progress,
    )
    .await;
    let elapsed = started.elapsed();
    if let Some(display) = display {
        display.abort();
        let _ = display.await;
        // Clear the progress line.
        eprint!("\r\x1b[2K");
    }
    let interrupted = cancel.is_cancelled();

    let mut working: Vec<(Candidate, Outcome)> =
        results.iter().filter(|(_, o)| o.alive()).cloned().collect();
    working.sort_by_key(|(_, o)| o.latency.unwrap_or(Duration::MAX));
    let rows: Vec<WorkingRow> = working
        .iter()
        .map(|(c, o)| WorkingRow::new(&c.proxy, o))
        .collect();
    write_working(&rows, args.list.format, std::io::stdout().lock())?;

    let mut err = std::io::stderr().lock();
    let dead = results.len() - working.len();
    writeln!(
        err,
        "checked {} in {:.1}s{}: {} working, {dead} dead",
        crate::cli::proxies(results.len() as u64),
        elapsed.as_secs_f64(),
        if interrupted { " (interrupted)" } else { "" },
        working.len(),
    )?;
    if interrupted {
        let left = progress.total.load(Ordering::Relaxed) - results.len() as u64;
        writeln!(err, "not checked: {left} (interrupted)")?;
    }
    if let Some(t) = bad_lines {
        writeln!(err, "{t}")?;
    }
    drop(err);
    if args.list.store {
        store_working(&config, list, &working).await?;
    }
    Ok(if interrupted {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// "N lines not read: line 3: "…", …", if any.
fn bad_lines_text(parsed: &ParsedList) -> Option<String> {
    if parsed.bad_lines == 0 {
        return None;
    }
    let plural = if parsed.bad_lines == 1 { "" } else { "s" };
    let more = parsed.bad_lines - parsed.quoted.len();
    let mut text = format!(
        "{} line{plural} without a proxy skipped: {}",
        parsed.bad_lines,
        parsed.quoted.join(", ")
    );
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    Some(text)
}

/// Checks every candidate, `concurrency` at a time, until `cancel`: then
/// no new check starts and those in flight finish within their timeout.
/// Returns the candidates checked with the scheme found for detected
/// entries.
async fn check_all(
    checker: Arc<Checker>,
    candidates: Vec<Candidate>,
    concurrency: usize,
    cancel: &tokio_util::sync::CancellationToken,
    progress: &RoundProgress,
) -> Vec<(Candidate, Outcome)> {
    futures::stream::iter(candidates)
        .take_until(cancel.clone().cancelled_owned())
        .map(|c| {
            let checker = checker.clone();
            async move {
                let outcome = checker.check(&c.proxy, c.detect).await;
                let mut c = c;
                if let Some(scheme) = outcome.detected {
                    c.proxy.scheme = scheme;
                    c.detect = false;
                }
                (c, outcome)
            }
        })
        .buffer_unordered(concurrency.max(1))
        .inspect(|(_, o)| {
            progress.done.fetch_add(1, Ordering::Relaxed);
            if o.alive() {
                progress.alive.fetch_add(1, Ordering::Relaxed);
            }
        })
        .collect()
        .await
}

/// Adds the working proxies to the database as the source `list:NAME`,
/// then records their checks through the one feedback path. The daemon's
/// own addresses are never stored.
async fn store_working(
    config: &Config,
    list: &Path,
    working: &[(Candidate, Outcome)],
) -> anyhow::Result<()> {
    let own = crate::harvest::AddressPolicy::from_config(config);
    let (kept, own_dropped): (Vec<_>, Vec<_>) = working
        .iter()
        .partition(|(c, _)| !own.is_own(c.proxy.host, c.proxy.port));
    let store = open_store(config).await?;
    let name = if list == Path::new("-") {
        "list:stdin".to_owned()
    } else {
        let file = list.file_name().unwrap_or(list.as_os_str());
        format!("list:{}", file.to_string_lossy())
    };
    let url = if list == Path::new("-") {
        "-".to_owned()
    } else {
        std::path::absolute(list)
            .unwrap_or_else(|_| list.to_path_buf())
            .display()
            .to_string()
    };
    let mut items = CandidateList::new();
    for (c, _) in &kept {
        items.push(Candidate {
            hints: Hints::default(),
            ..c.clone()
        });
    }
    let run = SourceRun {
        name: name.clone(),
        url,
        format: "text".into(),
        started_at: now_ms(),
        http_status: None,
        duration_ms: 0,
        error: None,
        private: 0,
    };
    let stored = async {
        let counts = store.record_source_run(run, items).await?;
        let ids = store
            .proxy_ids(kept.iter().map(|(c, _)| c.proxy.clone()).collect())
            .await?;
        let checked_at = now_ms();
        let records: Vec<CheckRecord> = ids
            .into_iter()
            .zip(&kept)
            .filter_map(|(id, (_, outcome))| {
                Some(CheckRecord {
                    id: id?,
                    checked_at,
                    outcome: Outcome {
                        detected: None,
                        ..outcome.clone()
                    },
                })
            })
            .collect();
        let feedback =
            crate::health::Feedback::new(crate::health::HealthIndex::new(), store.clone());
        feedback
            .commit_checks(records, config.check.recheck_policy())
            .await?;
        anyhow::Ok(counts)
    }
    .await;
    checkpoint(&store).await;
    let counts = stored.with_context(|| {
        format!(
            "cannot add the working proxies to {}",
            config.database.path.display()
        )
    })?;
    eprintln!(
        "stored {} working proxies ({} new) in {} as source {name}",
        counts.found,
        counts.new,
        config.database.path.display()
    );
    if !own_dropped.is_empty() {
        eprintln!(
            "not stored: {} on this daemon's own API or gateway address",
            own_dropped.len()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Scheme;

    #[test]
    fn lists_are_read_line_by_line_and_bad_lines_counted() {
        let body = "# my list\n\
                    1.2.3.4:8080\n\
                    socks5://user:pw@5.6.7.8:1080\n\
                    \n\
                    garbage here\n\
                    9.9.9.9 3128\n\
                    1.2.3.4:8080\n\
                    10.0.0.1:99999\n";
        let parsed = parse_list(body, SourceScheme::Fixed(Scheme::Http), 100);
        let urls: Vec<String> = parsed
            .candidates
            .iter()
            .map(|c| c.proxy.to_string())
            .collect();
        assert_eq!(
            urls,
            [
                "http://1.2.3.4:8080",
                "socks5://user:pw@5.6.7.8:1080",
                "http://9.9.9.9:3128"
            ]
        );
        assert_eq!(parsed.bad_lines, 2);
        assert_eq!(
            bad_lines_text(&parsed).unwrap(),
            "2 lines without a proxy skipped: line 5: \"garbage here\", line 8: \"10.0.0.1:99999\""
        );
        assert!(!parsed.truncated);
    }

    #[test]
    fn private_addresses_are_kept_and_detect_is_the_default() {
        let parsed = parse_list("127.0.0.1:3128\n[::1]:80\n", SourceScheme::Detect, 10);
        assert_eq!(parsed.candidates.len(), 2);
        assert!(parsed.candidates.iter().all(|c| c.detect));
    }

    #[test]
    fn long_lists_stop_at_the_limit() {
        let body: String = (1..=20).map(|i| format!("1.1.1.{i}:80\n")).collect();
        let parsed = parse_list(&body, SourceScheme::Detect, 5);
        assert_eq!(parsed.candidates.len(), 5);
        assert!(parsed.truncated);
    }
}
