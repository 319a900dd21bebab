//! `[[sources]]`: where proxy lists come from and how each is parsed.
//! [`HtmlOptions`], [`HtmlColumns`] and [`JsonOptions`] are plain data here;
//! the parsers that use them live in `harvest`.

use std::collections::BTreeSet;
use std::fmt;
use std::path::PathBuf;

use reqwest::header::{HeaderName, HeaderValue};
use toml::{Table, Value};
use url::Url;

use super::section::{Section, type_name};
use crate::model::SourceScheme;

/// How a source's body is parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// Addresses anywhere in text.
    Text(TextOptions),
    /// Entries matched by a regular expression with named groups.
    Regex(RegexOptions),
    /// An HTML table.
    Html(HtmlOptions),
    /// A JSON list.
    Json(JsonOptions),
}

impl SourceFormat {
    /// The config spelling.
    pub fn name(&self) -> &'static str {
        match self {
            SourceFormat::Text(_) => "text",
            SourceFormat::Regex(_) => "regex",
            SourceFormat::Html(_) => "html",
            SourceFormat::Json(_) => "json",
        }
    }
}

/// The `text` format's options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextOptions {
    /// Read what lists write after an address (`1.2.3.4:80 US-H-S +`,
    /// `1.2.3.4:80:Germany`) as hints.
    pub annotations: bool,
}

impl Default for TextOptions {
    fn default() -> TextOptions {
        TextOptions { annotations: true }
    }
}

/// The `regex` format's options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegexOptions {
    /// The expression, checked when the config is loaded.
    pub pattern: ListPattern,
}

/// A regular expression with the named groups of [`ListPattern::GROUPS`],
/// `ip` and `port` among them, compiled with limits: the `regex` crate
/// matches in linear time, and its compiled size is capped so that a
/// pattern cannot take the daemon's memory either.
#[derive(Clone, Debug)]
pub struct ListPattern(regex::Regex);

impl PartialEq for ListPattern {
    fn eq(&self, other: &ListPattern) -> bool {
        self.0.as_str() == other.0.as_str()
    }
}

impl Eq for ListPattern {}

impl ListPattern {
    /// The group names a pattern may use; `ip` and `port` are required.
    pub const GROUPS: [&'static str; 8] = [
        "ip",
        "port",
        "scheme",
        "country",
        "anonymity",
        "https",
        "user",
        "pass",
    ];
    /// Longest pattern accepted, in bytes.
    pub const MAX_LEN: usize = 4096;
    /// Compiled size allowed, in bytes (the `regex` crate's `size_limit`).
    pub const MAX_COMPILED: usize = 1 << 20;

    /// Compiles `pattern`, or says what is wrong with it.
    pub fn new(pattern: &str) -> Result<ListPattern, String> {
        if pattern.len() > Self::MAX_LEN {
            return Err(format!(
                "is {} bytes long; at most {} are accepted",
                pattern.len(),
                Self::MAX_LEN
            ));
        }
        let re = regex::RegexBuilder::new(pattern)
            .size_limit(Self::MAX_COMPILED)
            .dfa_size_limit(2 * Self::MAX_COMPILED)
            .nest_limit(64)
            .build()
            .map_err(|e| format!("invalid regular expression: {e}"))?;
        let names: Vec<&str> = re.capture_names().flatten().collect();
        if let Some(unknown) = names.iter().find(|n| !Self::GROUPS.contains(n)) {
            return Err(format!(
                "unknown group name {unknown:?} (known: {})",
                Self::GROUPS.join(", ")
            ));
        }
        let missing: Vec<&str> = ["ip", "port"]
            .into_iter()
            .filter(|g| !names.contains(g))
            .collect();
        if !missing.is_empty() {
            return Err(format!(
                "needs the named groups (?P<ip>...) and (?P<port>...); missing {}",
                missing.join(" and ")
            ));
        }
        Ok(ListPattern(re))
    }

    /// The compiled expression.
    pub fn regex(&self) -> &regex::Regex {
        &self.0
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
    /// Where the entry is written, as problems name it: `sources[2]`, or
    /// `extra_sources[0]` for one added to the list.
    pub key: String,
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

/// Defaults of the per-source keys. Sources are array entries, which the
/// example cannot give defaults to, so these live here (the example's comment
/// on `[[sources]]` states them).
pub(super) const DEFAULT_FORMAT: &str = "text";
/// See [`DEFAULT_FORMAT`].
pub(super) const DEFAULT_SCHEME: &str = "http";
/// See [`DEFAULT_FORMAT`].
pub(super) const DEFAULT_ENABLED: bool = true;

/// Validates the `sources` array of the root table: the user's list if the
/// file has one (replacing the built-in list whole), else the example's;
/// then `extra_sources`, added to that list, so that a config can add a
/// source without copying the built-in ones.
pub(super) fn read(root: &mut Section) -> Vec<SourceConfig> {
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    if let Some(v) = root.required("sources") {
        entries(root, "sources", v, &mut names, &mut out);
    }
    if let Some(v) = root.take("extra_sources") {
        entries(root, "extra_sources", v, &mut names, &mut out);
    }
    out
}

/// Validates the entries of the array `list` into `out`.
fn entries(
    root: &mut Section,
    list: &str,
    v: Value,
    names: &mut BTreeSet<String>,
    out: &mut Vec<SourceConfig>,
) {
    let Value::Array(items) = v else {
        root.problem(
            list,
            &format!(
                "expected an array of tables ([[{list}]]), found {}",
                type_name(&v)
            ),
        );
        return;
    };
    for (i, item) in items.into_iter().enumerate() {
        let key = format!("{list}[{i}]");
        match item {
            Value::Table(t) => {
                let mut s = Section::new(&key, t, Table::new());
                out.extend(source(&mut s, names));
                root.absorb(s);
            }
            other => root.problem(
                &key,
                &format!("expected a table, found {}", type_name(&other)),
            ),
        }
    }
}

/// Validates one `[[sources]]` table; `names` are those of the entries
/// before it.
fn source(s: &mut Section, names: &mut BTreeSet<String>) -> Option<SourceConfig> {
    let name = s.string("name");
    if let Some(n) = &name {
        if n.trim().is_empty() {
            s.problem("name", "must not be empty");
        }
        // Checked whether or not the rest of the entry is valid, so that a
        // duplicate is reported together with the entry's other problems.
        if !names.insert(n.clone()) {
            s.problem("name", &format!("duplicate source name {n:?}"));
        }
    }
    let url = s.string("url");
    let location = url.as_deref().and_then(|u| match parse_location(u) {
        Ok(l) => Some(l),
        Err(e) => {
            s.problem("url", &e);
            None
        }
    });
    let format_name = s
        .optional("format", Section::string)
        .unwrap_or_else(|| DEFAULT_FORMAT.to_owned());
    let scheme_name = s
        .optional("scheme", Section::string)
        .unwrap_or_else(|| DEFAULT_SCHEME.to_owned());
    let scheme = SourceScheme::parse(&scheme_name);
    if scheme.is_none() {
        s.problem(
            "scheme",
            &format!(
                "expected \"http\", \"socks4\", \"socks5\" or \"detect\", found {scheme_name:?}"
            ),
        );
    }
    // The range was checked, so the cast cannot truncate.
    let pages = s
        .optional("pages", |s, k| s.int(k, 1, 10_000))
        .map(|p| p as u32);
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
    let headers = headers(s, "headers");
    let enabled = s
        .optional("enabled", Section::boolean)
        .unwrap_or(DEFAULT_ENABLED);

    const HTML_KEYS: [&str; 2] = ["table", "columns"];
    const TEXT_KEYS: [&str; 1] = ["annotations"];
    const REGEX_KEYS: [&str; 1] = ["pattern"];
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
        "text" => Some(SourceFormat::Text(TextOptions {
            annotations: s.optional("annotations", Section::boolean).unwrap_or(true),
        })),
        "regex" => match s.string("pattern").map(|p| ListPattern::new(&p)) {
            Some(Ok(pattern)) => Some(SourceFormat::Regex(RegexOptions { pattern })),
            Some(Err(e)) => {
                s.problem("pattern", &e);
                None
            }
            None => None,
        },
        "html" => {
            let table = s.optional("table", Section::string);
            if let Some(sel) = &table
                && let Err(e) = scraper::Selector::parse(sel)
            {
                s.problem("table", &format!("invalid CSS selector {sel:?}: {e}"));
            }
            let columns = s.read_section("columns", |cols| HtmlColumns {
                ip: cols.optional("ip", Section::string),
                port: cols.optional("port", Section::string),
                country: cols.optional("country", Section::string),
                anonymity: cols.optional("anonymity", Section::string),
                https: cols.optional("https", Section::string),
                protocol: cols.optional("protocol", Section::string),
            });
            Some(SourceFormat::Html(HtmlOptions { table, columns }))
        }
        "json" => Some(SourceFormat::Json(JsonOptions {
            items: s.optional("items", Section::string),
            ip: s.optional("ip", Section::string),
            port: s.optional("port", Section::string),
            country: s.optional("country", Section::string),
            protocols: s.optional("protocols", Section::string),
            anonymity: s.optional("anonymity", Section::string),
            https: s.optional("https", Section::string),
        })),
        other => {
            s.problem(
                "format",
                &format!("expected \"text\", \"regex\", \"html\" or \"json\", found {other:?}"),
            );
            None
        }
    };
    // Keys of another format are mistakes, not silently ignored options.
    let all = [
        &TEXT_KEYS[..],
        &REGEX_KEYS[..],
        &HTML_KEYS[..],
        &JSON_KEYS[..],
    ];
    let own: &[&str] = match format_name.as_str() {
        "text" => &TEXT_KEYS,
        "regex" => &REGEX_KEYS,
        "html" => &HTML_KEYS,
        "json" => &JSON_KEYS,
        _ => &[],
    };
    let foreign: Vec<&str> = if own.is_empty() {
        Vec::new()
    } else {
        all.concat()
            .into_iter()
            .filter(|k| !own.contains(k))
            .collect()
    };
    for k in foreign {
        if s.take(k).is_some() {
            s.problem(k, &format!("is not an option of format = {format_name:?}"));
        }
    }
    Some(SourceConfig {
        key: s.key("").trim_end_matches('.').to_owned(),
        name: name?,
        url: url?,
        location: location?,
        format: format?,
        scheme: scheme?,
        pages,
        headers,
        enabled,
    })
}

/// Extra request headers: a table of header name → value.
fn headers(s: &mut Section, k: &str) -> Vec<(HeaderName, HeaderValue)> {
    s.read_section(k, |sec| {
        let mut out = Vec::new();
        for name in sec.keys() {
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
        out
    })
}

/// `http(s)://…` stays a URL (with `{page}` substituted to check it);
/// `file://…` and anything without a scheme are local paths.
pub(super) fn parse_location(u: &str) -> Result<SourceLocation, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}

#[cfg(test)]
mod format_tests {
    use crate::config::{Config, SourceFormat};

    fn load(source: &str) -> Result<Config, String> {
        let toml = format!("[[sources]]\nname = \"s\"\nurl = \"/tmp/l.txt\"\n{source}\n");
        Config::from_toml(&toml, "my.toml").map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn regex_patterns_and_text_annotations_are_checked_when_loaded() {
        let ok = load("format = \"regex\"\npattern = '(?P<ip>[\\d.]+) (?P<port>\\d+)'").unwrap();
        assert!(matches!(ok.sources[0].format, SourceFormat::Regex(_)));
        let off = load("annotations = false").unwrap();
        assert_eq!(
            off.sources[0].format,
            SourceFormat::Text(super::TextOptions { annotations: false })
        );
        for (source, needle) in [
            (
                "format = \"regex\"\npattern = '(?P<ip>'",
                "sources[0].pattern: invalid regular expression",
            ),
            (
                "format = \"regex\"\npattern = '(?P<ip>\\S+)'",
                "sources[0].pattern: needs the named groups (?P<ip>...) and (?P<port>...); \
                 missing port",
            ),
            (
                "format = \"regex\"\npattern = '(?P<ip>\\S+) (?P<port>\\d+) (?P<cc>\\w+)'",
                "sources[0].pattern: unknown group name \"cc\"",
            ),
            ("format = \"regex\"", "sources[0].pattern: is required"),
            (
                "format = \"json\"\nannotations = false",
                "sources[0].annotations: is not an option of format = \"json\"",
            ),
            (
                "pattern = 'x'",
                "sources[0].pattern: is not an option of format = \"text\"",
            ),
        ] {
            let err = load(source).unwrap_err();
            assert!(err.contains(needle), "{source}: {err}");
        }
    }
}
