//! `proxywarden stats`: counts by status, scheme, country and source.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::{load, name_width};
use crate::store::{Stats, Store, rfc3339};

/// `stats` options.
#[derive(Debug, Args)]
pub struct StatsArgs {
    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}
/// Runs `stats`.
pub(super) async fn run(config_path: Option<&Path>, args: StatsArgs) -> anyhow::Result<ExitCode> {
    let (config, _) = load(config_path)?;
    let store = Store::open_configured_read_only(&config.database).await?;
    let stats = store.stats().await?;
    // Servable as `/proxy` and `export` count it: alive, and its last passed
    // check within api.max_age.
    let query = crate::health::ProxyQuery {
        max_age: Some(config.api.max_age),
        ..Default::default()
    };
    let servable = crate::health::load_index(&store)
        .await?
        .select(&query, crate::store::now_ms())
        .len();
    let mut out = std::io::stdout().lock();
    if args.json {
        #[derive(serde::Serialize)]
        struct WithServable<'a> {
            servable: usize,
            #[serde(flatten)]
            stats: &'a Stats,
        }
        serde_json::to_writer_pretty(
            &mut out,
            &WithServable {
                servable,
                stats: &stats,
            },
        )?;
        writeln!(out)?;
    } else {
        print_stats(&stats, Some(servable), &mut out)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Human-readable tables of [`Stats`], with the servable count when known.
/// Every count of every section lines up in one column, whatever the
/// longest name (a failure reason, a country) is.
pub fn print_stats(
    stats: &Stats,
    servable: Option<usize>,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let maps = [
        &stats.by_status,
        &stats.by_scheme,
        &stats.by_anonymity,
        &stats.by_reason,
        &stats.by_country,
    ];
    // The head lines ("proxies", "servable") are indented like the rows.
    let width = maps
        .iter()
        .flat_map(|m| m.keys().map(String::len))
        .chain(["servable".len()])
        .max()
        .unwrap_or(0);
    let digits = maps
        .iter()
        .flat_map(|m| m.values())
        .copied()
        .chain([stats.total])
        .map(|v| v.to_string().len())
        .max()
        .unwrap_or(1)
        .max(5);
    writeln!(out, "  {:<width$}  {:>digits$}", "proxies", stats.total)?;
    if let Some(servable) = servable {
        writeln!(out, "  {:<width$}  {:>digits$}", "servable", servable)?;
    }
    let section = |out: &mut dyn Write,
                   title: &str,
                   map: &std::collections::BTreeMap<String, i64>|
     -> std::io::Result<()> {
        writeln!(out, "\n{title}")?;
        let mut rows: Vec<(&String, &i64)> = map.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (k, v) in rows {
            writeln!(out, "  {k:<width$}  {v:>digits$}")?;
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
