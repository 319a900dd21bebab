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
    let mut out = Exporter::new(format, io::BufWriter::new(w))?;
    for r in records {
        out.row(r.borrow())?;
    }
    out.finish()?.flush()
}

/// An export written a row at a time: what [`write()`] writes, without the
/// whole list at hand, so that a long list streams (from the store's pages
/// or the index's matches) in the memory of one row.
pub struct Exporter<W: Write> {
    format: Format,
    w: W,
    rows: u64,
    secret: bool,
}

/// Writes one CSV record to `w`: a writer per record keeps no state
/// between records, so the output is what one writer for all would write.
fn csv_record<I, T>(w: &mut impl Write, record: I) -> io::Result<()>
where
    I: IntoIterator<Item = T>,
    T: AsRef<[u8]>,
{
    let mut csv = csv::WriterBuilder::new()
        .buffer_capacity(1024)
        .from_writer(w);
    csv.write_record(record)?;
    csv.flush()
}

impl<W: Write> Exporter<W> {
    /// Starts an export in `format` to `w` (the CSV header is written at
    /// once).
    pub fn new(format: Format, mut w: W) -> io::Result<Exporter<W>> {
        if format == Format::Csv {
            csv_record(&mut w, CSV_COLUMNS)?;
        }
        Ok(Exporter {
            format,
            w,
            rows: 0,
            secret: false,
        })
    }

    /// Writes one proxy.
    pub fn row(&mut self, r: &ProxyRecord) -> io::Result<()> {
        self.secret |= r.proxy.auth.is_some();
        let first = self.rows == 0;
        self.rows += 1;
        let w = &mut self.w;
        match self.format {
            Format::Txt => writeln!(w, "{}", r.proxy),
            Format::Json => {
                // The array serde_json writes pretty, an element at a
                // time: each element's lines indented by two spaces (a
                // string never holds a raw newline, so lines are safe to
                // indent), elements separated by ",\n".
                let element = serde_json::to_string_pretty(&ExportRow::from(r))?;
                w.write_all(if first { b"[\n" } else { b",\n" })?;
                for (i, line) in element.split('\n').enumerate() {
                    if i > 0 {
                        w.write_all(b"\n")?;
                    }
                    w.write_all(b"  ")?;
                    w.write_all(line.as_bytes())?;
                }
                Ok(())
            }
            Format::Csv => {
                let row = serde_json::to_value(ExportRow::from(r))?;
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
                csv_record(w, cells)
            }
        }
    }

    /// The proxies written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Whether any proxy written so far carries credentials.
    pub fn secret(&self) -> bool {
        self.secret
    }

    /// Ends the export (the JSON array's close) and hands back the writer.
    pub fn finish(mut self) -> io::Result<W> {
        if self.format == Format::Json {
            let end: &[u8] = if self.rows == 0 { b"[]\n" } else { b"\n]\n" };
            self.w.write_all(end)?;
        }
        Ok(self.w)
    }
}

impl Exporter<Vec<u8>> {
    /// What was written since the last call: the next chunk of a streamed
    /// body.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.w)
    }
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
    let mut file = FileOutput::create(path)?;
    let mut out = Exporter::new(format, io::BufWriter::new(file.file()))?;
    for r in records {
        out.row(r.borrow())?;
    }
    let secret = out.secret();
    out.finish()?.flush()?;
    file.persist(secret)
}

/// A file written as [`write_file`] writes it (a temporary beside it, then
/// a rename), for an export that streams its rows.
pub struct FileOutput {
    tmp: tempfile::NamedTempFile,
    path: std::path::PathBuf,
}

impl FileOutput {
    /// Starts the temporary beside `path`, after removing stale ones.
    pub fn create(path: &Path) -> io::Result<FileOutput> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        remove_stale_temps(dir, STALE_TEMP_AGE);
        let tmp = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(dir)?;
        Ok(FileOutput {
            tmp,
            path: path.to_owned(),
        })
    }

    /// The temporary, to write the export to.
    pub fn file(&mut self) -> &mut std::fs::File {
        self.tmp.as_file_mut()
    }

    /// Puts the written file in place: the mode of the one it replaces, or
    /// `0600` for a new one when `secret` (it holds credentials) and
    /// `0644` otherwise; synced, then renamed.
    pub fn persist(self, secret: bool) -> io::Result<()> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = match std::fs::metadata(&self.path) {
                Ok(existing) => existing.permissions().mode() & 0o7777,
                Err(_) if secret => 0o600,
                // Not secret beyond what the directory allows: the usual mode.
                Err(_) => 0o644,
            };
            self.tmp
                .as_file()
                .set_permissions(std::fs::Permissions::from_mode(mode))?;
        }
        #[cfg(not(unix))]
        let _ = secret;
        self.tmp.as_file().sync_all()?;
        self.tmp.persist(&self.path).map_err(|e| e.error)?;
        Ok(())
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Anonymity, Country, Credentials, Proxy, Scheme, Status};

    fn record(i: i64) -> ProxyRecord {
        ProxyRecord {
            id: i,
            proxy: Proxy {
                scheme: Scheme::Socks5,
                host: format!("11.0.0.{i}").parse().unwrap(),
                port: 1080,
                auth: (i % 2 == 0).then(|| Credentials {
                    username: format!("u{i}"),
                    password: "p,\"w\"\n;x".into(),
                }),
            },
            scheme_detect: false,
            status: Status::Alive,
            country: Country::parse("DE"),
            country_source: Some("source".into()),
            anonymity: Some(Anonymity::Elite),
            https: (i % 3 != 0).then_some(i % 3 == 1),
            latency_ms: Some(120 + i),
            exit_ip: None,
            last_checked: Some(1_700_000_000_000 + i),
            last_alive: Some(1_700_000_000_000),
            first_seen: 1_600_000_000_000,
            last_seen: 1_600_000_000_000,
            reason: None,
            hint_anonymity: None,
            hint_https: Some(true),
            checks_total: 4,
            checks_ok: 3,
            consecutive_failures: 0,
            next_check_at: 1_700_000_600_000,
            sources: (0..i % 3).map(|s| format!("source{s}")).collect(),
            failed_in_use_at: None,
        }
    }

    /// A row at a time writes what serde_json and the csv crate write for
    /// the whole list at once, for none, one and several proxies.
    #[test]
    fn rows_written_one_at_a_time_are_the_whole_list_written_at_once() {
        for n in [0, 1, 2, 5] {
            let records: Vec<ProxyRecord> = (1..=n).map(record).collect();
            let rows: Vec<ExportRow> = records.iter().map(ExportRow::from).collect();

            let mut json = Vec::new();
            write(&records, Format::Json, &mut json).unwrap();
            let whole = serde_json::to_string_pretty(&rows).unwrap() + "\n";
            assert_eq!(String::from_utf8(json).unwrap(), whole, "{n} proxies");

            let mut csv = Vec::new();
            write(&records, Format::Csv, &mut csv).unwrap();
            let mut at_once = csv::Writer::from_writer(Vec::new());
            at_once.write_record(CSV_COLUMNS).unwrap();
            for r in &rows {
                let v = serde_json::to_value(r).unwrap();
                at_once
                    .write_record(CSV_COLUMNS.iter().map(|c| {
                        match &v[*c] {
                            serde_json::Value::Null => String::new(),
                            serde_json::Value::String(s) => s.clone(),
                            serde_json::Value::Array(a) => a
                                .iter()
                                .filter_map(|v| v.as_str())
                                .collect::<Vec<_>>()
                                .join(";"),
                            other => other.to_string(),
                        }
                    }))
                    .unwrap();
            }
            let at_once = at_once.into_inner().unwrap();
            assert_eq!(
                String::from_utf8(csv).unwrap(),
                String::from_utf8(at_once).unwrap(),
                "{n} proxies"
            );

            let mut txt = Vec::new();
            write(&records, Format::Txt, &mut txt).unwrap();
            let lines: String = records.iter().map(|r| format!("{}\n", r.proxy)).collect();
            assert_eq!(String::from_utf8(txt).unwrap(), lines);
        }
    }
}
