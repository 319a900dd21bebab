//! The files a config names (the extra CA, the GeoIP database, local
//! sources) and whether they can be read: taken from a validated config, or
//! from the raw table of one whose text has problems, so that `config
//! check` reports file problems together with the rest.

use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::{Config, Problem, SourceLocation};

/// A local source's file, by the key that names it.
struct SourceFile {
    key: String,
    url: String,
    path: PathBuf,
}

/// The files a config names.
pub(super) struct FileRefs {
    extra_ca: Option<PathBuf>,
    geoip: Option<PathBuf>,
    /// Enabled local sources.
    sources: Vec<SourceFile>,
}

impl FileRefs {
    /// The files a validated config names.
    pub(super) fn of(config: &Config) -> FileRefs {
        let sources = config
            .sources
            .iter()
            .filter(|s| s.enabled)
            .filter_map(|s| match &s.location {
                SourceLocation::File(path) => Some(SourceFile {
                    key: format!("{}.url", s.key),
                    url: s.url.clone(),
                    path: path.clone(),
                }),
                SourceLocation::Http(_) => None,
            })
            .collect();
        FileRefs {
            extra_ca: config.check.extra_ca_file.clone(),
            geoip: config.geoip.database.clone(),
            sources,
        }
    }

    /// The files the user's table names where it names them plainly (a
    /// non-empty string), whatever else in it is wrong.
    pub(super) fn of_table(table: &Table) -> FileRefs {
        let path_at = |section: &str, key: &str| {
            table
                .get(section)
                .and_then(|s| s.get(key))
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        let mut sources = Vec::new();
        for list in ["sources", "extra_sources"] {
            let Some(Value::Array(items)) = table.get(list) else {
                continue;
            };
            for (i, item) in items.iter().enumerate() {
                let enabled = item.get("enabled").and_then(Value::as_bool) != Some(false);
                let Some(url) = item.get("url").and_then(Value::as_str) else {
                    continue;
                };
                if let (true, Ok(SourceLocation::File(path))) =
                    (enabled, super::sources::parse_location(url))
                {
                    sources.push(SourceFile {
                        key: format!("{list}[{i}].url"),
                        url: url.to_owned(),
                        path,
                    });
                }
            }
        }
        FileRefs {
            extra_ca: path_at("check", "extra_ca_file"),
            geoip: path_at("geoip", "database"),
            sources,
        }
    }

    /// What cannot be read; local sources only with `sources`.
    pub(super) fn problems(&self, sources: bool) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut check = |key: &str, path: &Path| {
            if let Err(e) = readable_file(path) {
                problems.push(Problem {
                    key: key.to_owned(),
                    message: format!("cannot read {}: {e}", path.display()),
                });
            }
        };
        if let Some(ca) = &self.extra_ca {
            check("check.extra_ca_file", ca);
        }
        if let Some(db) = &self.geoip {
            check("geoip.database", db);
        }
        // A readable file that is not a country database would only fail
        // when the first check round opens it.
        if let Some(db) = &self.geoip
            && readable_file(db).is_ok()
            && let Err(e) = maxminddb::Reader::open_readfile(db)
        {
            problems.push(Problem {
                key: "geoip.database".into(),
                message: format!(
                    "{} is not a MaxMind country database (.mmdb): {e}",
                    db.display()
                ),
            });
        }
        if !sources {
            return problems;
        }
        for s in &self.sources {
            let Err(e) = readable_file(&s.path) else {
                continue;
            };
            // `example.com/list.txt` is more likely a URL missing its
            // scheme than a relative path.
            let looks_like_a_path = Path::new(&s.url).is_absolute()
                || s.url.starts_with("./")
                || s.url.starts_with("../")
                || s.url.to_ascii_lowercase().starts_with("file:");
            let message = if looks_like_a_path {
                format!("cannot read {}: {e}", s.path.display())
            } else {
                format!(
                    "{:?} is neither an http(s) URL nor a readable file ({e}); a URL needs http:// or https://",
                    s.url
                )
            };
            problems.push(Problem {
                key: s.key.clone(),
                message,
            });
        }
        problems
    }
}

/// Ok when `path` is a file this process can read.
fn readable_file(path: &Path) -> std::io::Result<()> {
    use std::io::Read;
    // Looked at before opening: opening a FIFO would wait for a writer.
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return Err(std::io::Error::other("it is a directory"));
    }
    if !meta.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    // Opening can succeed where reading does not (a broken mount).
    let _bytes = std::fs::File::open(path)?.read(&mut [0u8; 1])?;
    Ok(())
}
