//! Configuration in two steps: TOML is read into a table, then every key is
//! validated into a [`Config`] of real types. All problems are collected and
//! reported together, each naming the file, the key and what was expected.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use toml::{Table, Value};
use url::Url;

use crate::model::{RecheckPolicy, SourceScheme};

/// The fully commented example configuration, which is also the source of
/// the built-in defaults (so the two can never disagree).
pub const EXAMPLE: &str = include_str!("../config.example.toml");

/// The environment variable naming a config file.
pub const CONFIG_ENV: &str = "PROXYWARDEN_CONFIG";

/// The file used when neither `--config` nor the environment names one.
pub const DEFAULT_FILE: &str = "proxywarden.toml";

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where the database lives.
    pub database: DatabaseConfig,
    /// How sources are fetched.
    pub harvest: HarvestConfig,
    /// The sources, in config order.
    pub sources: Vec<SourceConfig>,
    /// How proxies are checked.
    pub check: CheckConfig,
    /// Country lookups.
    pub geoip: GeoipConfig,
    /// The HTTP API.
    pub api: ApiConfig,
}

/// `[database]`
#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseConfig {
    /// The SQLite file.
    pub path: PathBuf,
}

/// `[harvest]`
#[derive(Clone, Debug, PartialEq)]
pub struct HarvestConfig {
    /// Cron expression with seconds, already validated.
    pub schedule: String,
    /// User-Agent sent to sources.
    pub user_agent: String,
    /// Connect timeout per attempt.
    pub connect_timeout: Duration,
    /// Total timeout per attempt.
    pub timeout: Duration,
    /// Largest body read, in bytes.
    pub max_body: u64,
    /// Most candidates kept per source.
    pub max_per_source: usize,
    /// Sources fetched at once.
    pub concurrency: usize,
    /// Extra attempts after transient failures.
    pub retries: u32,
    /// First retry delay; doubles.
    pub retry_backoff: Duration,
}

/// How a source's body is parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// Addresses anywhere in text.
    Text,
    /// An HTML table.
    Html(HtmlOptions),
    /// A JSON list.
    Json(JsonOptions),
}

impl SourceFormat {
    /// The config spelling.
    pub fn name(&self) -> &'static str {
        match self {
            SourceFormat::Text => "text",
            SourceFormat::Html(_) => "html",
            SourceFormat::Json(_) => "json",
        }
    }
}

/// Which table and columns to read; every field is optional and falls back
/// to recognising the table by its headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HtmlOptions {
    /// A CSS selector for the table (validated when the config is loaded).
    pub table: Option<String>,
    /// Header texts naming the columns, overriding recognition.
    pub columns: HtmlColumns,
}

/// Header texts of the columns to read (matched case-insensitively).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HtmlColumns {
    /// The address column (may also hold `host:port`).
    pub ip: Option<String>,
    /// The port column.
    pub port: Option<String>,
    /// The two-letter country code column.
    pub country: Option<String>,
    /// The anonymity column.
    pub anonymity: Option<String>,
    /// The HTTPS yes/no column.
    pub https: Option<String>,
    /// The protocol/type column.
    pub protocol: Option<String>,
}

/// Paths into the document. A path starting with `/` is a JSON pointer;
/// otherwise it is a key, with `.` separating nested keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JsonOptions {
    /// Path to the array of items (from the document root).
    pub items: Option<String>,
    /// Path to the address within an item.
    pub ip: Option<String>,
    /// Path to the port within an item.
    pub port: Option<String>,
    /// Path to the country code within an item.
    pub country: Option<String>,
    /// Path to the protocol list or string within an item.
    pub protocols: Option<String>,
    /// Path to the anonymity level within an item.
    pub anonymity: Option<String>,
    /// Path to the HTTPS flag within an item.
    pub https: Option<String>,
}

/// Where a source's body comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceLocation {
    /// An http(s) URL, possibly with `{page}` in it.
    Http(String),
    /// A local file.
    File(PathBuf),
}

/// One `[[sources]]` entry.
#[derive(Clone, PartialEq)]
pub struct SourceConfig {
    /// Unique name.
    pub name: String,
    /// The `url` key as written.
    pub url: String,
    /// Where to read it from.
    pub location: SourceLocation,
    /// How to parse it.
    pub format: SourceFormat,
    /// Scheme for entries without one.
    pub scheme: SourceScheme,
    /// Pages to fetch when the URL has `{page}`.
    pub pages: Option<u32>,
    /// Extra request headers (values may be secrets; never logged).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// False skips the source.
    pub enabled: bool,
}

impl fmt::Debug for SourceConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let headers: Vec<String> = self
            .headers
            .iter()
            .map(|(n, _)| format!("{n}: <redacted>"))
            .collect();
        f.debug_struct("SourceConfig")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("format", &self.format)
            .field("scheme", &self.scheme)
            .field("pages", &self.pages)
            .field("headers", &headers)
            .field("enabled", &self.enabled)
            .finish()
    }
}

/// `[check]`
#[derive(Clone, Debug, PartialEq)]
pub struct CheckConfig {
    /// Judges, used in rotation.
    pub judges: Vec<JudgeConfig>,
    /// Extra PEM roots for private judges.
    pub extra_ca_file: Option<PathBuf>,
    /// Checks in flight.
    pub concurrency: usize,
    /// Connect timeout per check.
    pub connect_timeout: Duration,
    /// Total timeout per check.
    pub timeout: Duration,
    /// Also test CONNECT + TLS.
    pub https: bool,
    /// Re-check interval for alive proxies.
    pub recheck_alive: Duration,
    /// First backoff for dead proxies.
    pub recheck_dead: Duration,
    /// Backoff cap.
    pub recheck_dead_max: Duration,
    /// Dead and unlisted this long → deleted.
    pub purge_after: Duration,
}

impl CheckConfig {
    /// When proxies are checked again, as `[check]` sets it.
    pub fn recheck_policy(&self) -> RecheckPolicy {
        RecheckPolicy {
            alive: self.recheck_alive,
            dead: self.recheck_dead,
            dead_max: self.recheck_dead_max,
        }
    }
}

/// One judge: a URL that answers with the request it received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JudgeConfig {
    /// The http(s) URL asked through each proxy.
    pub url: Url,
    /// Text the judge's answer always contains, if required.
    pub marker: Option<String>,
    /// True when the judge echoes the request URL, so that the per-check
    /// nonce must come back (defeats caches and captive portals).
    pub echo: bool,
}

/// `[geoip]`
#[derive(Clone, Debug, PartialEq)]
pub struct GeoipConfig {
    /// A MaxMind-format country database.
    pub database: Option<PathBuf>,
}

/// `[api]`
#[derive(Clone, Debug, PartialEq)]
pub struct ApiConfig {
    /// Listen address.
    pub listen: SocketAddr,
    /// Bearer token, if any.
    pub token: Option<Secret>,
    /// Freshness required of served proxies.
    pub max_age: Duration,
    /// Serve `GET /judge`.
    pub judge: bool,
    /// `/judge` requests allowed per client address per minute.
    pub judge_per_minute: u32,
    /// Longest a request may take before it is answered 503.
    pub request_timeout: Duration,
}

/// A string that never appears in `Debug` output or logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Every problem found in a config file.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    /// The file, or `<built-in>` for the defaults.
    pub file: String,
    /// Every problem, in the order found.
    pub problems: Vec<Problem>,
}

/// One problem in a config file: the key it concerns (dotted, with array
/// indices, e.g. `sources[2].url`; empty for the file as a whole) and what
/// is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The key, e.g. `harvest.timeout`.
    pub key: String,
    /// What was expected or found.
    pub message: String,
}

impl Problem {
    fn file(message: String) -> Problem {
        Problem {
            key: String::new(),
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "{}: {n} problem{}",
            self.file,
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {}: {p}", self.file)?;
        }
        Ok(())
    }
}

/// Which file a config came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// Built-in defaults.
    Defaults,
    /// A file on disk.
    File(PathBuf),
}

impl fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigOrigin::Defaults => f.write_str("built-in defaults"),
            ConfigOrigin::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl Config {
    /// The built-in defaults: the example configuration.
    pub fn defaults() -> Config {
        // The example is part of the binary and covered by tests, so a
        // failure here is a build defect, not a user error.
        Config::from_toml(EXAMPLE, "<built-in>").expect("the built-in example config is valid")
    }

    /// Finds and loads the config: `explicit` (from `--config`), else
    /// `$PROXYWARDEN_CONFIG`, else `./proxywarden.toml` if present, else the
    /// built-in defaults.
    pub fn discover(explicit: Option<&Path>) -> Result<(Config, ConfigOrigin), ConfigError> {
        let env = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
        let path = match (explicit, env) {
            (Some(p), _) => Some(p.to_path_buf()),
            (None, Some(e)) => Some(PathBuf::from(e)),
            (None, None) => {
                let p = PathBuf::from(DEFAULT_FILE);
                p.exists().then_some(p)
            }
        };
        match path {
            Some(p) => Ok((Config::load(&p)?, ConfigOrigin::File(p))),
            None => Ok((Config::defaults(), ConfigOrigin::Defaults)),
        }
    }

    /// Reads and validates one file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            problems: vec![Problem::file(format!("cannot read the file: {e}"))],
        })?;
        Config::from_toml(&text, &file)
    }

    /// Validates TOML text; `file` names it in messages.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let table: Table = text.parse().map_err(|e: toml::de::Error| ConfigError {
            file: file.to_owned(),
            problems: vec![Problem::file(format!(
                "not valid TOML: {}",
                e.to_string().trim_end()
            ))],
        })?;
        let mut root = Section::new("", table);
        let config = build(&mut root);
        let problems = root.finish();
        match config {
            Some(c) if problems.is_empty() => Ok(c),
            _ => Err(ConfigError {
                file: file.to_owned(),
                problems,
            }),
        }
    }
}

/// Validates every section. Each section reads its keys with defaults, so a
/// missing section is the same as an empty one.
fn build(root: &mut Section) -> Option<Config> {
    let mut db = root.section("database");
    let database = DatabaseConfig {
        path: db
            .path("path")
            .unwrap_or_else(|| PathBuf::from("proxywarden.db")),
    };
    root.absorb(db);

    let mut h = root.section("harvest");
    let harvest = HarvestConfig {
        schedule: h
            .cron("schedule")
            .unwrap_or_else(|| "0 */30 * * * *".into()),
        user_agent: h
            .string("user_agent")
            .unwrap_or_else(|| "proxywarden/0.1".into()),
        connect_timeout: h
            .duration("connect_timeout")
            .unwrap_or(Duration::from_secs(5)),
        timeout: h.duration("timeout").unwrap_or(Duration::from_secs(30)),
        max_body: h
            .size("max_body", 1024, 1 << 30)
            .unwrap_or(10 * 1024 * 1024),
        max_per_source: h.int("max_per_source", 1, 10_000_000).unwrap_or(100_000) as usize,
        concurrency: h.int("concurrency", 1, 256).unwrap_or(8) as usize,
        retries: h.int("retries", 0, 10).unwrap_or(2) as u32,
        retry_backoff: h
            .duration("retry_backoff")
            .unwrap_or(Duration::from_secs(1)),
    };
    if harvest.connect_timeout > harvest.timeout {
        h.problem("connect_timeout", "must not be longer than harvest.timeout");
    }
    root.absorb(h);

    let sources = match root.take("sources") {
        None => default_sources(),
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            let mut names = BTreeSet::new();
            for (i, item) in items.into_iter().enumerate() {
                let key = format!("sources[{i}]");
                match item {
                    Value::Table(t) => {
                        let mut s = Section::new(&key, t);
                        if let Some(src) = source(&mut s) {
                            if !names.insert(src.name.clone()) {
                                s.problem("name", &format!("duplicate source name {:?}", src.name));
                            }
                            out.push(src);
                        }
                        root.absorb(s);
                    }
                    other => root.problem(
                        &key,
                        &format!("expected a table, found {}", type_name(&other)),
                    ),
                }
            }
            out
        }
        Some(other) => {
            root.problem(
                "sources",
                &format!(
                    "expected an array of tables ([[sources]]), found {}",
                    type_name(&other)
                ),
            );
            Vec::new()
        }
    };

    let mut c = root.section("check");
    let judges = c.judges("judges").unwrap_or_else(|| {
        [
            "http://httpbin.org/get",
            "https://httpbin.org/get",
            "http://azenv.net/",
        ]
        .iter()
        .filter_map(|u| Url::parse(u).ok())
        .map(|url| JudgeConfig {
            url,
            marker: None,
            echo: true,
        })
        .collect()
    });
    let check = CheckConfig {
        judges,
        extra_ca_file: c.path("extra_ca_file"),
        concurrency: c.int("concurrency", 1, 100_000).unwrap_or(512) as usize,
        connect_timeout: c
            .duration("connect_timeout")
            .unwrap_or(Duration::from_secs(3)),
        timeout: c.duration("timeout").unwrap_or(Duration::from_secs(8)),
        https: c.boolean("https").unwrap_or(true),
        recheck_alive: c
            .duration("recheck_alive")
            .unwrap_or(Duration::from_secs(600)),
        recheck_dead: c
            .duration("recheck_dead")
            .unwrap_or(Duration::from_secs(900)),
        recheck_dead_max: c
            .duration("recheck_dead_max")
            .unwrap_or(Duration::from_secs(86_400)),
        purge_after: c
            .duration("purge_after")
            .unwrap_or(Duration::from_secs(7 * 86_400)),
    };
    if check.connect_timeout > check.timeout {
        c.problem("connect_timeout", "must not be longer than check.timeout");
    }
    if check.recheck_dead > check.recheck_dead_max {
        c.problem(
            "recheck_dead",
            "must not be longer than check.recheck_dead_max",
        );
    }
    root.absorb(c);

    let mut g = root.section("geoip");
    let geoip = GeoipConfig {
        database: g.path("database"),
    };
    root.absorb(g);

    let mut a = root.section("api");
    let api = ApiConfig {
        listen: a
            .parsed::<SocketAddr>("listen", "an address like \"127.0.0.1:8080\"")
            .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 8080))),
        token: a.string("token").filter(|t| !t.is_empty()).map(Secret),
        max_age: a.duration("max_age").unwrap_or(Duration::from_secs(1800)),
        judge: a.boolean("judge").unwrap_or(true),
        judge_per_minute: a.int("judge_per_minute", 1, 1_000_000).unwrap_or(120) as u32,
        request_timeout: a
            .duration("request_timeout")
            .unwrap_or(Duration::from_secs(15)),
    };
    if !api.listen.ip().is_loopback() && api.token.is_none() {
        a.problem(
            "listen",
            &format!(
                "{} is not a loopback address: set api.token so that strangers cannot use the API",
                api.listen
            ),
        );
    }
    root.absorb(a);

    Some(Config {
        database,
        harvest,
        sources,
        check,
        geoip,
        api,
    })
}

/// The built-in source list: the `[[sources]]` of the example file.
fn default_sources() -> Vec<SourceConfig> {
    thread_local! {
        static SOURCES: Vec<SourceConfig> = {
            let table: Table = EXAMPLE.parse().expect("the example config is valid TOML");
            let mut out = Vec::new();
            if let Some(Value::Array(items)) = table.get("sources") {
                for (i, item) in items.iter().enumerate() {
                    if let Value::Table(t) = item {
                        let mut s = Section::new(&format!("sources[{i}]"), t.clone());
                        out.extend(source(&mut s));
                    }
                }
            }
            out
        };
    }
    SOURCES.with(|s| s.clone())
}

/// Validates one `[[sources]]` table.
fn source(s: &mut Section) -> Option<SourceConfig> {
    let name = s.required_string("name");
    if let Some(n) = &name
        && n.trim().is_empty()
    {
        s.problem("name", "must not be empty");
    }
    let url = s.required_string("url");
    let location = url.as_deref().and_then(|u| match parse_location(u) {
        Ok(l) => Some(l),
        Err(e) => {
            s.problem("url", &e);
            None
        }
    });
    let format_name = s.string("format").unwrap_or_else(|| "text".into());
    let scheme = match s.string("scheme") {
        None => SourceScheme::Fixed(crate::proxy::Scheme::Http),
        Some(w) => SourceScheme::parse(&w).unwrap_or_else(|| {
            s.problem(
                "scheme",
                &format!("expected \"http\", \"socks4\", \"socks5\" or \"detect\", found {w:?}"),
            );
            SourceScheme::Fixed(crate::proxy::Scheme::Http)
        }),
    };
    let pages = s.int("pages", 1, 10_000).map(|p| p as u32);
    if let Some(u) = &url {
        let has_page = u.contains("{page}");
        if pages.is_some() && !has_page {
            s.problem("pages", "needs {page} in the url");
        }
        if has_page && pages.is_none() {
            s.problem("url", "contains {page} but the source has no `pages`");
        }
        if has_page && matches!(location, Some(SourceLocation::File(_))) {
            s.problem("url", "{page} only works with http(s) URLs");
        }
    }
    let headers = s.headers("headers");
    let enabled = s.boolean("enabled").unwrap_or(true);

    const HTML_KEYS: [&str; 2] = ["table", "columns"];
    const JSON_KEYS: [&str; 7] = [
        "items",
        "ip",
        "port",
        "country",
        "protocols",
        "anonymity",
        "https",
    ];
    let format = match format_name.as_str() {
        "text" => Some(SourceFormat::Text),
        "html" => {
            let table = s.string("table");
            if let Some(sel) = &table
                && let Err(e) = scraper::Selector::parse(sel)
            {
                s.problem("table", &format!("invalid CSS selector {sel:?}: {e}"));
            }
            let mut cols = s.section("columns");
            let columns = HtmlColumns {
                ip: cols.string("ip"),
                port: cols.string("port"),
                country: cols.string("country"),
                anonymity: cols.string("anonymity"),
                https: cols.string("https"),
                protocol: cols.string("protocol"),
            };
            s.absorb(cols);
            Some(SourceFormat::Html(HtmlOptions { table, columns }))
        }
        "json" => Some(SourceFormat::Json(JsonOptions {
            items: s.string("items"),
            ip: s.string("ip"),
            port: s.string("port"),
            country: s.string("country"),
            protocols: s.string("protocols"),
            anonymity: s.string("anonymity"),
            https: s.string("https"),
        })),
        other => {
            s.problem(
                "format",
                &format!("expected \"text\", \"html\" or \"json\", found {other:?}"),
            );
            None
        }
    };
    // Keys of another format are mistakes, not silently ignored options.
    let foreign: Vec<&str> = match format_name.as_str() {
        "text" => HTML_KEYS.iter().chain(JSON_KEYS.iter()).copied().collect(),
        "html" => JSON_KEYS.to_vec(),
        "json" => HTML_KEYS.to_vec(),
        _ => Vec::new(),
    };
    for k in foreign {
        if s.take(k).is_some() {
            s.problem(k, &format!("is not an option of format = {format_name:?}"));
        }
    }
    Some(SourceConfig {
        name: name?,
        url: url?,
        location: location?,
        format: format?,
        scheme,
        pages,
        headers,
        enabled,
    })
}

/// `http(s)://…` stays a URL (with `{page}` substituted to check it);
/// `file://…` and anything without a scheme are local paths.
fn parse_location(u: &str) -> Result<SourceLocation, String> {
    let lower = u.to_ascii_lowercase();
    if lower.starts_with("http://") || lower.starts_with("https://") {
        let probe = u.replace("{page}", "1");
        let parsed = Url::parse(&probe).map_err(|e| format!("invalid URL {u:?}: {e}"))?;
        if parsed.host_str().is_none_or(str::is_empty) {
            return Err(format!("invalid URL {u:?}: no host"));
        }
        Ok(SourceLocation::Http(u.to_owned()))
    } else if lower.starts_with("file://") {
        let parsed = Url::parse(u).map_err(|e| format!("invalid file URL {u:?}: {e}"))?;
        let path = parsed
            .to_file_path()
            .map_err(|()| format!("invalid file URL {u:?}: not a local absolute path"))?;
        Ok(SourceLocation::File(path))
    } else if let Some((scheme, _)) = u.split_once("://") {
        Err(format!(
            "unsupported URL scheme {scheme:?} in {u:?} (expected http, https, file or a path)"
        ))
    } else if u.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(SourceLocation::File(PathBuf::from(u)))
    }
}

/// A byte count the way config files write it: `10 MiB`, `512 KiB`, `100 B`.
pub fn size_text(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * 1024 * 1024;
    match bytes {
        0 => "0 B".into(),
        b if b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} B"),
    }
}

fn type_name(v: &Value) -> &'static str {
    v.type_str()
}

/// A table being validated: keys are taken out as they are read, so that
/// whatever is left at the end is unknown.
struct Section {
    prefix: String,
    table: Table,
    problems: Vec<Problem>,
}

impl Section {
    fn new(prefix: &str, table: Table) -> Section {
        Section {
            prefix: prefix.to_owned(),
            table,
            problems: Vec::new(),
        }
    }

    fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    fn problem(&mut self, k: &str, msg: &str) {
        let key = self.key(k);
        self.problems.push(Problem {
            key,
            message: msg.to_owned(),
        });
    }

    fn take(&mut self, k: &str) -> Option<Value> {
        self.table.remove(k)
    }

    /// A nested table (missing = empty). Merge it back with `absorb`.
    fn section(&mut self, k: &str) -> Section {
        let key = self.key(k);
        match self.take(k) {
            None => Section::new(&key, Table::new()),
            Some(Value::Table(t)) => Section::new(&key, t),
            Some(other) => {
                self.problem(k, &format!("expected a table, found {}", type_name(&other)));
                Section::new(&key, Table::new())
            }
        }
    }

    /// Collects a finished child's problems, including its unknown keys.
    fn absorb(&mut self, child: Section) {
        let problems = child.finish();
        self.problems.extend(problems);
    }

    /// All problems, with leftover keys reported as unknown.
    fn finish(mut self) -> Vec<Problem> {
        let leftover: Vec<String> = self.table.keys().cloned().collect();
        for k in leftover {
            self.problem(&k, "unknown key");
        }
        self.problems
    }

    fn string(&mut self, k: &str) -> Option<String> {
        match self.take(k)? {
            Value::String(s) => Some(s),
            other => {
                self.problem(
                    k,
                    &format!("expected a string, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    fn required_string(&mut self, k: &str) -> Option<String> {
        if !self.table.contains_key(k) {
            self.problem(k, "is required");
            return None;
        }
        self.string(k)
    }

    fn parsed<T: std::str::FromStr>(&mut self, k: &str, expected: &str) -> Option<T> {
        let s = self.string(k)?;
        match s.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.problem(k, &format!("expected {expected}, found {s:?}"));
                None
            }
        }
    }

    fn path(&mut self, k: &str) -> Option<PathBuf> {
        self.string(k).filter(|s| !s.is_empty()).map(PathBuf::from)
    }

    fn duration(&mut self, k: &str) -> Option<Duration> {
        let s = self.string(k)?;
        match humantime::parse_duration(&s) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.problem(k, "must be longer than zero");
                None
            }
            Err(e) => {
                self.problem(
                    k,
                    &format!("expected a duration like \"30s\" or \"10m\", found {s:?} ({e})"),
                );
                None
            }
        }
    }

    fn size(&mut self, k: &str, min: u64, max: u64) -> Option<u64> {
        let v = self.take(k)?;
        let bytes = match &v {
            Value::Integer(i) if *i >= 0 => Some(*i as u64),
            Value::String(s) => s.trim().parse::<bytesize::ByteSize>().ok().map(|b| b.0),
            _ => None,
        };
        match bytes {
            Some(b) if (min..=max).contains(&b) => Some(b),
            Some(b) => {
                self.problem(
                    k,
                    &format!(
                        "must be between {} and {}, found {}",
                        size_text(min),
                        size_text(max),
                        size_text(b)
                    ),
                );
                None
            }
            None => {
                self.problem(k, &format!("expected a size like \"10MiB\", found {v}"));
                None
            }
        }
    }

    fn int(&mut self, k: &str, min: i64, max: i64) -> Option<i64> {
        match self.take(k)? {
            Value::Integer(i) if (min..=max).contains(&i) => Some(i),
            Value::Integer(i) => {
                self.problem(k, &format!("must be between {min} and {max}, found {i}"));
                None
            }
            other => {
                self.problem(
                    k,
                    &format!("expected a whole number, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    fn boolean(&mut self, k: &str) -> Option<bool> {
        match self.take(k)? {
            Value::Boolean(b) => Some(b),
            other => {
                self.problem(
                    k,
                    &format!("expected true or false, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    fn cron(&mut self, k: &str) -> Option<String> {
        let s = self.string(k)?;
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse(&s);
        match parsed {
            Ok(_) => Some(s),
            Err(e) => {
                self.problem(
                    k,
                    &format!(
                        "expected a cron expression with seconds like \"0 */30 * * * *\", found {s:?} ({e})"
                    ),
                );
                None
            }
        }
    }

    /// Judges: each a URL string or `{ url, marker, echo }`.
    fn judges(&mut self, k: &str) -> Option<Vec<JudgeConfig>> {
        let v = self.take(k)?;
        let Value::Array(items) = v else {
            self.problem(
                k,
                &format!("expected an array of judge URLs, found {}", type_name(&v)),
            );
            return None;
        };
        if items.is_empty() {
            self.problem(k, "needs at least one judge");
        }
        let mut out = Vec::new();
        for (i, item) in items.into_iter().enumerate() {
            let key = format!("{k}[{i}]");
            let (url, marker, echo) = match item {
                Value::String(s) => (Some(s), None, true),
                Value::Table(t) => {
                    let mut j = Section::new(&self.key(&key), t);
                    let url = j.required_string("url");
                    let marker = j.string("marker").filter(|m| !m.is_empty());
                    let echo = j.boolean("echo").unwrap_or(true);
                    if !echo && marker.is_none() {
                        j.problem(
                            "marker",
                            "is required when echo = false (otherwise any page would pass)",
                        );
                    }
                    self.absorb(j);
                    (url, marker, echo)
                }
                other => {
                    self.problem(
                        &key,
                        &format!(
                            "expected a URL or {{ url = ..., marker = ... }}, found {}",
                            type_name(&other)
                        ),
                    );
                    continue;
                }
            };
            let Some(s) = url else { continue };
            match Url::parse(&s) {
                Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                    out.push(JudgeConfig { url, marker, echo })
                }
                Ok(_) => self.problem(&key, &format!("expected an http(s) URL, found {s:?}")),
                Err(e) => self.problem(&key, &format!("invalid URL {s:?}: {e}")),
            }
        }
        Some(out)
    }

    fn headers(&mut self, k: &str) -> Vec<(HeaderName, HeaderValue)> {
        let mut sec = self.section(k);
        let mut out = Vec::new();
        let keys: Vec<String> = sec.table.keys().cloned().collect();
        for name in keys {
            let Some(value) = sec.string(&name) else {
                continue;
            };
            let n = HeaderName::from_bytes(name.as_bytes());
            let v = HeaderValue::from_str(&value);
            match (n, v) {
                (Ok(n), Ok(v)) => out.push((n, v)),
                (Err(_), _) => sec.problem(&name, "is not a valid HTTP header name"),
                (_, Err(_)) => sec.problem(&name, "is not a valid HTTP header value"),
            }
        }
        self.absorb(sec);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_is_the_default() {
        let from_example = Config::from_toml(EXAMPLE, "example").unwrap();
        let empty = Config::from_toml("", "empty").unwrap();
        assert_eq!(from_example, empty);
        assert!(empty.sources.len() >= 12);
        let formats: BTreeSet<&str> = empty.sources.iter().map(|s| s.format.name()).collect();
        assert_eq!(formats, BTreeSet::from(["html", "json", "text"]));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = r#"
            bogus = 1
            [harvest]
            timeout = "soon"
            max_body = "lots"
            concurrency = 0
            colour = "red"
            schedule = "every day"
            [[sources]]
            url = "ftp://example.com/list"
            format = "xml"
            [[sources]]
            name = "a"
            url = "https://example.com/{page}"
            table = "table"
            [check]
            judges = ["not a url"]
            [api]
            listen = "everywhere"
        "#;
        let err = Config::from_toml(text, "my.toml").unwrap_err();
        let all = err.to_string();
        for needle in [
            "bogus: unknown key",
            "harvest.timeout: expected a duration",
            "harvest.max_body: expected a size",
            "harvest.concurrency: must be between 1 and 256, found 0",
            "harvest.colour: unknown key",
            "harvest.schedule: expected a cron expression",
            "sources[0].name: is required",
            "sources[0].url: unsupported URL scheme \"ftp\"",
            "sources[0].format: expected \"text\", \"html\" or \"json\", found \"xml\"",
            "sources[1].url: contains {page} but the source has no `pages`",
            "sources[1].table: is not an option of format = \"text\"",
            "check.judges[0]: invalid URL",
            "api.listen: expected an address",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert!(all.starts_with("my.toml: 13 problems"), "{all}");
    }

    #[test]
    fn locations() {
        assert_eq!(
            parse_location("/tmp/list.txt").unwrap(),
            SourceLocation::File("/tmp/list.txt".into())
        );
        assert_eq!(
            parse_location("file:///tmp/list.txt").unwrap(),
            SourceLocation::File("/tmp/list.txt".into())
        );
        assert!(matches!(
            parse_location("https://x.example/a?p={page}").unwrap(),
            SourceLocation::Http(_)
        ));
        assert!(parse_location("https://").is_err());
    }

    #[test]
    fn secrets_are_redacted() {
        let text = r#"
            [api]
            token = "hunter2"
            [[sources]]
            name = "a"
            url = "https://example.com/"
            headers = { Authorization = "Bearer hunter2" }
        "#;
        let c = Config::from_toml(text, "t").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.sources[0].headers.len(), 1);
    }
}
