//! `[database]`: which backend holds the store, and where. `url` picks it:
//! a file path or `sqlite:` URL (the embedded default, also `path`) or a
//! `postgres://` URL for a database several nodes share.

use std::path::PathBuf;

use super::section::Section;

/// `[database]`
#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseConfig {
    /// The SQLite file. With PostgreSQL, files the node keeps for itself
    /// (crawl jobs' pages) still live beside it.
    pub path: PathBuf,
    /// The PostgreSQL database, when `url` names one.
    pub postgres: Option<PostgresUrl>,
}

/// A `postgres://` (or `postgresql://`) URL, checked when the config is
/// read. Its password never shows in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresUrl(String);

impl PostgresUrl {
    /// The URL as written, password included: for connecting only.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", redact_password(&self.0))
    }
}

/// `url` with its password, if any, shown as `***`: for logs and errors.
pub fn redact_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        Ok(_) => url.to_owned(),
        Err(_) => "postgres://…".to_owned(),
    }
}

impl DatabaseConfig {
    /// Where the store is, as `config check` and logs show it: the file,
    /// or the PostgreSQL URL without its password.
    pub fn shown(&self) -> String {
        match &self.postgres {
            Some(url) => redact_password(url.as_str()),
            None => self.path.display().to_string(),
        }
    }
}

/// Validates `[database]`.
pub(super) fn read(s: &mut Section) -> Option<DatabaseConfig> {
    let url = s.optional("url", Section::string);
    let path = s.path("path")?;
    let Some(url) = url else {
        return Some(DatabaseConfig {
            path,
            postgres: None,
        });
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        if let Err(e) = url.parse::<tokio_postgres::Config>() {
            s.problem(
                "url",
                &format!("not a usable PostgreSQL URL ({e}): expected postgres://user:password@host:port/database"),
            );
            return None;
        }
        return Some(DatabaseConfig {
            path,
            postgres: Some(PostgresUrl(url)),
        });
    }
    let file = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(&url);
    if file.is_empty() || file.contains("://") {
        s.problem(
            "url",
            &format!("expected a file path, a sqlite: URL or a postgres:// URL, found {url:?}"),
        );
        return None;
    }
    Some(DatabaseConfig {
        path: PathBuf::from(file),
        postgres: None,
    })
}
