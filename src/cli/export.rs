//! `proxywarden export`: the stored proxies as txt, json or csv.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::Args;

use super::{ProxyFilterArgs, load};
use crate::export::{self, Exporter, Format};
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

/// Proxies read from the store per page of an export of dead, unknown or
/// all proxies.
const PAGE: usize = 1_000;

/// Runs `export`.
pub(super) async fn run(config_path: Option<&Path>, args: ExportArgs) -> anyhow::Result<ExitCode> {
    let (config, _) = load(config_path)?;
    let store = Store::open_configured_read_only(&config.database).await?;
    let format: Format = args.format.into();
    let mut file = match &args.output {
        Some(path) => Some(
            export::FileOutput::create(path)
                .with_context(|| format!("cannot write {}", path.display()))?,
        ),
        None => None,
    };
    let stdout = std::io::stdout();
    let w: Box<dyn Write + '_> = match &mut file {
        Some(f) => Box::new(f.file()),
        // `export | head` closing the pipe early ends quietly (main).
        None => Box::new(stdout.lock()),
    };
    let mut out = Exporter::new(format, BufWriter::new(w))?;
    let mut q = args.filter.query(config.api.max_age);
    if args.status == StatusFilter::Alive {
        // The healthy list, chosen exactly as the API's /export does.
        let index = crate::health::load_index(&store).await?;
        for e in index.select(&q, crate::store::now_ms()) {
            out.row(&e.record)?;
        }
    } else {
        // Read and written a page at a time: the whole table may be
        // millions of proxies.
        q.max_age = None;
        let status = match args.status {
            StatusFilter::Dead => Some(Status::Dead),
            StatusFilter::Unknown => Some(Status::Unknown),
            _ => None,
        };
        let filter = q.to_filter(status, crate::store::now_ms());
        let mut after = 0;
        loop {
            let page = store
                .list_proxies_after(filter.clone(), after, PAGE)
                .await?;
            let Some(last) = page.last() else { break };
            after = last.id;
            for r in &page {
                out.row(r)?;
            }
        }
    }
    let (rows, secret) = (out.rows(), out.secret());
    out.finish()?.flush()?;
    if rows == 0 {
        // An empty list says nothing of why; a person asked for something.
        eprintln!("no stored proxy matched the status and filters given");
    }
    if let (Some(file), Some(path)) = (file, &args.output) {
        file.persist(secret)
            .with_context(|| format!("cannot write {}", path.display()))?;
        eprintln!("wrote {rows} proxies to {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
