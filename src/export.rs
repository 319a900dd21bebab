//! Exporting proxies as `txt` (one URL per line), `json` (an array of
//! objects) or `csv` (the same fields with a header row), and writing files
//! atomically so a reader never sees half a list.

use std::borrow::Borrow;
use std::io::{self, Write};
use std::path::Path;

use serde::Serialize;

use crate::store::{ProxyRecord, rfc3339};

/// An export format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `scheme://[user:pass@]host:port` per line.
    Txt,
    /// A JSON array of objects.
    Json,
    /// CSV with a header row.
    Csv,
}

/// One exported proxy: every field a user filters or sorts on, times as
/// RFC 3339, `null` where unknown.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct ExportRow {
    /// Store id.
    pub id: i64,
    /// `scheme://[user:pass@]host:port`.
    pub url: String,
    /// `http`, `socks4` or `socks5`.
    pub scheme: &'static str,
    /// Address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Username, if the proxy needs one.
    pub username: Option<String>,
    /// Password, if the proxy needs one.
    pub password: Option<String>,
    /// `unknown`, `alive` or `dead`.
    pub status: &'static str,
    /// Country code.
    pub country: Option<String>,
    /// `source` or `geoip`.
    pub country_source: Option<String>,
    /// Checked anonymity.
    pub anonymity: Option<&'static str>,
    /// Checked HTTPS support.
    pub https: Option<bool>,
    /// Latency of the last passed check.
    pub latency_ms: Option<i64>,
    /// Exit address seen by the judge.
    pub exit_ip: Option<String>,
    /// Last check.
    pub last_checked: Option<String>,
    /// Last passed check.
    pub last_alive: Option<String>,
    /// First listed.
    pub first_seen: String,
    /// Last listed.
    pub last_seen: String,
    /// Reason of the last failure.
    pub reason: Option<String>,
    /// Anonymity a source claims.
    pub source_anonymity: Option<&'static str>,
    /// HTTPS support a source claims.
    pub source_https: Option<bool>,
    /// Checks run.
    pub checks_total: i64,
    /// Checks passed.
    pub checks_ok: i64,
    /// Failures since the last pass.
    pub consecutive_failures: i64,
    /// When the next check is due.
    pub next_check: String,
    /// Sources listing it.
    pub sources: Vec<String>,
}

/// The CSV columns, in order: every field of [`ExportRow`].
pub const CSV_COLUMNS: [&str; 26] = [
    "id",
    "url",
    "scheme",
    "host",
    "port",
    "username",
    "password",
    "status",
    "country",
    "country_source",
    "anonymity",
    "https",
    "latency_ms",
    "exit_ip",
    "last_checked",
    "last_alive",
    "first_seen",
    "last_seen",
    "reason",
    "source_anonymity",
    "source_https",
    "checks_total",
    "checks_ok",
    "consecutive_failures",
    "next_check",
    "sources",
];

impl Format {
    /// The Content-Type of this format.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Txt => "text/plain; charset=utf-8",
            Format::Json => "application/json",
            Format::Csv => "text/csv; charset=utf-8",
        }
    }
}

impl From<&ProxyRecord> for ExportRow {
    fn from(r: &ProxyRecord) -> ExportRow {
        let auth = r.proxy.auth.as_ref();
        ExportRow {
            id: r.id,
            url: r.proxy.to_string(),
            scheme: r.proxy.scheme.as_str(),
            host: r.proxy.host.to_string(),
            port: r.proxy.port,
            username: auth.map(|a| a.username.clone()),
            password: auth.map(|a| a.password.clone()),
            status: r.status.as_str(),
            country: r.country.map(|c| c.to_string()),
            country_source: r.country_source.clone(),
            anonymity: r.anonymity.map(|a| a.as_str()),
            https: r.https,
            latency_ms: r.latency_ms,
            exit_ip: r.exit_ip.clone(),
            last_checked: r.last_checked.map(rfc3339),
            last_alive: r.last_alive.map(rfc3339),
            first_seen: rfc3339(r.first_seen),
            last_seen: rfc3339(r.last_seen),
            reason: r.reason.clone(),
            source_anonymity: r.hint_anonymity.map(|a| a.as_str()),
            source_https: r.hint_https,
            checks_total: r.checks_total,
            checks_ok: r.checks_ok,
            consecutive_failures: r.consecutive_failures,
            next_check: rfc3339(r.next_check_at),
            sources: r.sources.clone(),
        }
    }
}

/// Writes `records` in `format` to `w`.
pub fn write<R: Borrow<ProxyRecord>>(
    records: &[R],
    format: Format,
    w: impl Write,
) -> io::Result<()> {
    let mut w = io::BufWriter::new(w);
    match format {
        Format::Txt => {
            for r in records {
                writeln!(w, "{}", r.borrow().proxy)?;
            }
        }
        Format::Json => {
            let rows: Vec<ExportRow> = records
                .iter()
                .map(|r| ExportRow::from(r.borrow()))
                .collect();
            serde_json::to_writer_pretty(&mut w, &rows)?;
            writeln!(w)?;
        }
        Format::Csv => {
            let mut csv = csv::Writer::from_writer(&mut w);
            csv.write_record(CSV_COLUMNS)?;
            for r in records {
                let row = serde_json::to_value(ExportRow::from(r.borrow()))?;
                let cells = CSV_COLUMNS.iter().map(|c| match &row[*c] {
                    serde_json::Value::Null => String::new(),
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Array(a) => a
                        .iter()
                        .filter_map(|v| v.as_str())
                        .collect::<Vec<_>>()
                        .join(";"),
                    other => other.to_string(),
                });
                csv.write_record(cells)?;
            }
            csv.flush()?;
        }
    }
    w.flush()
}

/// The prefix of the temporary files an export writes before renaming.
pub const TEMP_PREFIX: &str = ".proxywarden-export";

/// Temporaries older than this are left over from a killed export (one in
/// progress touches its file as it writes) and are removed.
pub const STALE_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(10 * 60);

/// Writes `records` to `path` through a temporary file in the same
/// directory and a rename, so the file is either the old or the new list.
///
/// The file keeps the mode of the one it replaces; a new file is `0600`
/// when the export holds credentials (proxy passwords) and `0644` otherwise.
/// Temporaries a killed export left in the directory (older than
/// [`STALE_TEMP_AGE`]) are removed first.
pub fn write_file<R: Borrow<ProxyRecord>>(
    records: &[R],
    format: Format,
    path: &Path,
) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    remove_stale_temps(dir, STALE_TEMP_AGE);
    let mut tmp = tempfile::Builder::new()
        .prefix(TEMP_PREFIX)
        .tempfile_in(dir)?;
    write(records, format, tmp.as_file_mut())?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let secret = records.iter().any(|r| r.borrow().proxy.auth.is_some());
        let mode = match std::fs::metadata(path) {
            Ok(existing) => existing.permissions().mode() & 0o7777,
            Err(_) if secret => 0o600,
            // Not secret beyond what the directory allows: the usual mode.
            Err(_) => 0o644,
        };
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// Removes this tool's export temporaries in `dir` last modified more than
/// `age` ago. Best effort: what cannot be listed or removed is left.
pub fn remove_stale_temps(dir: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX) {
            continue;
        }
        // Not following links: only a plain file of ours is removed.
        let Ok(meta) = entry.path().symlink_metadata() else {
            continue;
        };
        let stale = meta
            .modified()
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if meta.is_file() && stale {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(file = %entry.path().display(), "removed a stale export temporary")
                }
                Err(e) => {
                    tracing::debug!(file = %entry.path().display(), error = %e, "cannot remove a stale export temporary")
                }
            }
        }
    }
}
