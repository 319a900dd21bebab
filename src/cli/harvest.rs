//! `proxywarden harvest`: every enabled source once, a line per source as
//! it finishes on a terminal, and the table.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};

use anyhow::bail;
use clap::Args;

use super::{checkpoint, free_space, load, name_width, open_store};
use crate::harvest::{self, HarvestReport, Progress, SourceReport};

/// `harvest` options.
#[derive(Debug, Args)]
pub struct HarvestArgs {
    /// Only these sources (by name; repeatable).
    #[arg(long = "source", value_name = "NAME")]
    pub sources: Vec<String>,
}

/// Runs `harvest`.
pub(super) async fn run(config_path: Option<&Path>, args: HarvestArgs) -> anyhow::Result<ExitCode> {
    let (mut config, origin) = load(config_path)?;
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
    let store = open_store(&config).await?;
    // On a terminal each source is shown as it finishes, so a slow
    // one does not look like a hang; piped, only the table is printed.
    let terminal = std::io::stderr().is_terminal();
    let pending: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(
        config
            .sources
            .iter()
            .filter(|s| s.enabled)
            .map(|s| s.name.clone())
            .collect(),
    ));
    let show = |r: &SourceReport, p: Progress| {
        lock(&pending).retain(|name| name != &r.name);
        if terminal {
            eprintln!("[{}/{}] {}", p.finished, p.total, progress_line(r));
        }
    };
    // A source that hangs is named while the others wait for it.
    let waiting = terminal.then(|| {
        let pending = pending.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            tokio::time::sleep(PENDING_FIRST).await;
            loop {
                let names = lock(&pending).clone();
                if !names.is_empty() {
                    eprintln!("{}", pending_line(&names, started.elapsed()));
                }
                tokio::time::sleep(PENDING_EVERY).await;
            }
        })
    });
    let report = harvest::harvest_all_reporting(&config, &store, &show).await;
    if let Some(waiting) = waiting {
        waiting.abort();
    }
    checkpoint(&store).await;
    let report = report?;
    print_harvest(&report, &mut std::io::stdout().lock())?;
    if let Some(e) = report.store_error() {
        let stored: usize = report.sources.iter().map(|s| s.stored).sum();
        let found: usize = report.sources.iter().map(|s| s.found).sum();
        // Disk space is named only when the disk refused the write; any
        // other failure is the cause its message names.
        let advice = match report.sources.iter().find_map(|s| s.unwritable) {
            Some(kind) => format!("{} and harvest again", free_space(&store, kind)),
            None => "harvest again".to_owned(),
        };
        eprintln!(
            "error: {e}; {stored} of the {found} proxies found were stored, in whole \
             transactions, and the rest were not: {advice}"
        );
        Ok(ExitCode::from(1))
    } else if report.any_worked() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!(
            "error: all {} sources failed; nothing was harvested (each source's error is in \
             the table above; check the network, or configure sources as [[sources]] tables: \
             `proxywarden config example` shows them)",
            report.sources.len()
        );
        Ok(ExitCode::from(1))
    }
}

/// When the sources still pending are first named on a terminal: most
/// sources answer within a second or two.
const PENDING_FIRST: std::time::Duration = std::time::Duration::from_secs(2);
/// How often they are named again.
const PENDING_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
/// The most pending sources named in one line; the rest are counted.
const PENDING_NAMED: usize = 5;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The sources still being fetched, `after` the start, in one line.
pub fn pending_line(names: &[String], after: std::time::Duration) -> String {
    let shown = names
        .iter()
        .take(PENDING_NAMED)
        .cloned()
        .collect::<Vec<_>>();
    let more = names.len().saturating_sub(PENDING_NAMED);
    let more = if more > 0 {
        format!(" and {more} more")
    } else {
        String::new()
    };
    format!(
        "… still waiting after {}s for: {}{more}",
        after.as_secs(),
        shown.join(", ")
    )
}

/// What a finished source did, in one line for progress. A failure's
/// reason is left to the table printed at the end, so that a terminal
/// shows it once.
pub fn progress_line(s: &SourceReport) -> String {
    let took = s.duration.as_secs_f64();
    let line = match &s.error {
        Some(_) if !s.worked() => format!("{}: failed after {took:.1}s", s.name),
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
