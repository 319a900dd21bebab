//! `proxywarden export`: the stored proxies as txt, json or csv.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::{ProxyFilterArgs, load};
use crate::export::{self, Format};
use crate::proxy::Status;
use crate::store::Store;

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

/// Runs `export`.
pub(super) async fn run(config_path: Option<&Path>, args: ExportArgs) -> anyhow::Result<ExitCode> {
    let (config, _) = load(config_path)?;
    let store = Store::open_configured_read_only(&config.database).await?;
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
    if records.is_empty() {
        // An empty list says nothing of why; a person asked for something.
        eprintln!("no stored proxy matched the status and filters given");
    }
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
