//! A crawl's options, as a job's JSON or from `proxywarden crawl`'s
//! flags, validated by one function into the crawl's and the pool's
//! options: the same defaults and bounds either way, errors naming the
//! option (the field, or the flag on the command line).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{CrawlOptions, ScopeKind, Select};
use crate::config::CrawlsConfig;
use crate::health::{ProxyQuery, filters};
use crate::pool::{NoProxy, PoolOptions};

/// How long the pages in flight of a job that is cancelled or stopped by
/// a shutdown may take to finish: inside the daemon's stop limit.
pub(super) const JOB_GRACE: Duration = Duration::from_secs(5);
/// Seeds one job may start from.
const MAX_SEEDS: usize = 1000;
/// The longest a crawl's request may wait for a proxy: a crawl waiting
/// longer looks stuck.
const MAX_NO_PROXY_WAIT: Duration = Duration::from_secs(3600);
/// The longest `delay`: a site slower than one page an hour is not crawled.
const MAX_DELAY: Duration = Duration::from_secs(3600);
/// Pages in flight by default, and at most.
pub const CONCURRENCY: (u32, u32) = (16, 1024);
/// Pages of one host in flight by default, and at most.
pub const PER_HOST_CONCURRENCY: (u32, u32) = (2, 256);

/// A crawl's options: a job's JSON and the shared options of `proxywarden crawl`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CrawlSpec {
    /// Where to start (http or https URLs).
    pub seeds: Vec<String>,
    /// Links followed from a seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// Pages fetched at most (at most `crawls.max_pages`, the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pages: Option<u64>,
    /// `same-host` (default), `same-site` or `any`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// URLs must match one of these regexes, when any are given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// URLs must match none of these regexes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Query parameters dropped besides `utm_*`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub strip_params: Vec<String>,
    /// Pages in flight (default 16, at most 1,024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<u32>,
    /// Pages in flight per host (default 2, at most 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_host_concurrency: Option<u32>,
    /// Least time between request starts to a host, like `"500ms"` (at
    /// most 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay: Option<String>,
    /// Skip robots.txt.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ignore_robots: bool,
    /// Fields to extract: name → CSS selector (text of the first match).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub select: BTreeMap<String, String>,
    /// Every match of each selector, not only the first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub select_all: bool,
    /// Only proxies in these countries (ISO codes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub country: Vec<String>,
    /// Only proxies of these schemes (`http`, `socks4`, `socks5`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scheme: Vec<String>,
    /// Only proxies at least this anonymous.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anonymity: Option<String>,
    /// Only proxies that tunnel HTTPS.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub https: bool,
    /// Only proxies at most this slow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_latency_ms: Option<u32>,
    /// Only proxies checked this recently, like `"10m"` (default
    /// `api.max_age`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<String>,
    /// The user agent sent and matched against robots.txt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_agent: Option<String>,
    /// How long a request waits for a usable proxy, like `"30s"` (default
    /// 60 s, at most 1h); a job whose filters match no proxy fails after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_proxy_wait: Option<String>,
}

/// A crawl option that is not valid: which one, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SpecError {
    /// The option (`seeds[1]`, `max_pages`, …; `body` for the whole).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl SpecError {
    /// The option as `proxywarden crawl` spells it: `--max-pages`,
    /// `--include` for `include[2]`, `--select price` for `select.price`,
    /// `URL` for a seed.
    pub fn flag(&self) -> String {
        let field = self.field.as_str();
        if let Some(name) = field.strip_prefix("select.") {
            return format!("--select {name}");
        }
        // A list's items are repeated or comma-separated flags.
        let field = field.split_once('[').map_or(field, |(list, _)| list);
        if field == "seeds" {
            return "URL".to_owned();
        }
        format!("--{}", field.replace('_', "-"))
    }

    /// The error as the command line shows it, naming the flag.
    pub fn for_command_line(&self) -> String {
        format!("{}: {}", self.flag(), self.message)
    }
}

/// What differs between a job and `proxywarden crawl`: the options'
/// defaults and bounds do not.
#[derive(Clone, Copy, Debug)]
pub struct SpecContext {
    /// A job's `crawls.max_pages`: the cap on `max_pages` and its default;
    /// none on the command line, whose operator owns the machine.
    pub page_cap: Option<u64>,
    /// `max_age` when none is given (`api.max_age`).
    pub default_age: Duration,
    /// No seed is needed: the command line resumes a crawl's state file.
    pub resuming: bool,
}

impl SpecContext {
    /// For a job under `limits`.
    pub fn job(limits: &CrawlsConfig, default_age: Duration) -> SpecContext {
        SpecContext {
            page_cap: Some(limits.max_pages),
            default_age,
            resuming: false,
        }
    }
}

fn bad(field: impl Into<String>, message: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        message: message.into(),
    }
}

/// A job's options made real.
#[derive(Clone, Debug)]
pub struct Validated {
    /// The crawl's options (a job keeps its frontier in the store under its
    /// id, and writes its output to a file of its own).
    pub crawl: CrawlOptions,
    /// The pool's, on the daemon's index.
    pub pool: PoolOptions,
}

impl CrawlSpec {
    /// Reads a job's options from a JSON body; the error names the field.
    pub fn from_json(body: &[u8]) -> Result<CrawlSpec, SpecError> {
        // serde would take a struct from an array too.
        if body.trim_ascii_start().first() != Some(&b'{') {
            return Err(bad("body", "expected a JSON object of crawl options"));
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        serde_path_to_error::deserialize(&mut de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            let field = if matches!(path.as_str(), "." | "?" | "") {
                // Unknown fields are reported at the object that has them.
                "body".to_owned()
            } else {
                path
            };
            bad(field, inner.to_string())
        })
    }

    /// Checks every option and builds the crawl's and the pool's options;
    /// the one validator of a job and of `proxywarden crawl`.
    pub fn validate(&self, ctx: &SpecContext) -> Result<Validated, SpecError> {
        if self.seeds.is_empty() && !ctx.resuming {
            return Err(bad("seeds", "give at least one URL to start from"));
        }
        if self.seeds.len() > MAX_SEEDS {
            return Err(bad("seeds", format!("at most {MAX_SEEDS} URLs")));
        }
        let mut seeds = Vec::new();
        for (i, s) in self.seeds.iter().enumerate() {
            let url = super::url::parse_seed(s).map_err(|e| bad(format!("seeds[{i}]"), e))?;
            seeds.push(url);
        }
        let max_pages = match (self.max_pages, ctx.page_cap) {
            (Some(0), _) => return Err(bad("max_pages", "must be at least 1")),
            (Some(n), Some(cap)) if n > cap => {
                return Err(bad(
                    "max_pages",
                    format!("at most {cap} (crawls.max_pages), found {n}"),
                ));
            }
            (None, cap) => cap,
            (Some(n), _) => Some(n),
        };
        let scope = match self.scope.as_deref() {
            None => ScopeKind::default(),
            Some(s) => s.parse().map_err(|e: String| bad("scope", e))?,
        };
        let regexes = |name: &str, list: &[String]| -> Result<Vec<regex::Regex>, SpecError> {
            list.iter()
                .enumerate()
                .map(|(i, r)| {
                    regex::Regex::new(r).map_err(|e| bad(format!("{name}[{i}]"), e.to_string()))
                })
                .collect()
        };
        let include = regexes("include", &self.include)?;
        let exclude = regexes("exclude", &self.exclude)?;
        let count = |name: &str, v: Option<u32>, (default, max): (u32, u32)| match v {
            None => Ok(default as usize),
            Some(n) if (1..=max).contains(&n) => Ok(n as usize),
            Some(n) => Err(bad(name, format!("must be between 1 and {max}, found {n}"))),
        };
        let concurrency = count("concurrency", self.concurrency, CONCURRENCY)?;
        let per_host = count(
            "per_host_concurrency",
            self.per_host_concurrency,
            PER_HOST_CONCURRENCY,
        )?;
        let duration = |name: &str, v: &Option<String>| -> Result<Option<Duration>, SpecError> {
            v.as_deref()
                .map(|s| {
                    humantime::parse_duration(s.trim()).map_err(|e| {
                        bad(name, format!("{s:?} is not a duration like \"500ms\": {e}"))
                    })
                })
                .transpose()
        };
        let delay = duration("delay", &self.delay)?.unwrap_or_default();
        if delay > MAX_DELAY {
            return Err(bad("delay", "at most 1h"));
        }
        let max_age = match self.max_age.as_deref() {
            None => ctx.default_age,
            Some(a) => filters::max_age(a)
                .map_err(|e| bad("max_age", format!("expected {e}, found {a:?}")))?,
        };
        let max_latency_ms = match self.max_latency_ms {
            None => None,
            Some(ms) => Some(
                filters::max_latency_ms(&ms.to_string())
                    .map_err(|e| bad("max_latency_ms", format!("expected {e}, found {ms}")))?,
            ),
        };
        let no_proxy_wait = duration("no_proxy_wait", &self.no_proxy_wait)?;
        if no_proxy_wait.is_some_and(|w| w > MAX_NO_PROXY_WAIT) {
            return Err(bad("no_proxy_wait", "at most 1h"));
        }
        let mut selects = Vec::new();
        for (name, css) in &self.select {
            let s = Select::parse(&format!("{name}={css}"))
                .map_err(|e| bad(format!("select.{name}"), e))?;
            selects.push(s);
        }
        // Each item as the API's filters read it, named by its place.
        fn each<T>(
            name: &str,
            items: &[String],
            one: fn(&str) -> Result<T, &'static str>,
        ) -> Result<Vec<T>, SpecError> {
            items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    one(v).map_err(|e| {
                        bad(format!("{name}[{i}]"), format!("expected {e}, found {v:?}"))
                    })
                })
                .collect()
        }
        let countries = each("country", &self.country, filters::country)?;
        let schemes = each("scheme", &self.scheme, filters::scheme)?;
        let min_anonymity = self
            .anonymity
            .as_deref()
            .map(|a| {
                filters::anonymity(a)
                    .map_err(|e| bad("anonymity", format!("expected {e}, found {a:?}")))
            })
            .transpose()?;
        let mut pool = PoolOptions {
            query: ProxyQuery {
                countries,
                schemes,
                min_anonymity,
                https: self.https,
                max_latency_ms,
                max_age: Some(max_age),
                ..ProxyQuery::default()
            },
            ..PoolOptions::default()
        };
        if let Some(wait) = no_proxy_wait {
            pool.no_proxy = NoProxy::Wait(wait);
        }
        if let Some(ua) = &self.user_agent {
            if ua.trim().is_empty() || http::HeaderValue::from_str(ua).is_err() {
                return Err(bad("user_agent", "must be printable text, not blank"));
            }
            pool.user_agent = ua.clone();
        }
        let crawl = CrawlOptions {
            seeds,
            max_depth: self.max_depth,
            max_pages,
            scope,
            include,
            exclude,
            strip_params: self.strip_params.clone(),
            concurrency,
            per_host_concurrency: per_host,
            delay,
            ignore_robots: self.ignore_robots,
            selects,
            select_all: self.select_all,
            grace: JOB_GRACE,
            ..CrawlOptions::default()
        };
        Ok(Validated { crawl, pool })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Country, Scheme};

    fn limits() -> CrawlsConfig {
        CrawlsConfig {
            max_running: 2,
            max_pages: 1000,
            max_queued: 100,
            max_frontier: 250_000,
            keep_ended: 100,
            keep_ended_for: Duration::from_secs(86_400),
        }
    }

    fn check(json: &str) -> Result<Validated, SpecError> {
        CrawlSpec::from_json(json.as_bytes())?
            .validate(&SpecContext::job(&limits(), Duration::from_secs(1800)))
    }

    #[test]
    fn options_are_validated_naming_the_bad_field() {
        let field = |json: &str| check(json).unwrap_err().field;
        assert_eq!(field(r#"{"seeds": []}"#), "seeds");
        assert_eq!(field(r#"{"seeds": ["http://a/", "ftp://b/"]}"#), "seeds[1]");
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "max_pages": 5000}"#),
            "max_pages"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "max_pages": "x"}"#),
            "max_pages"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "scope": "world"}"#),
            "scope"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "include": ["("]}"#),
            "include[0]"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "delay": "soon"}"#),
            "delay"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "concurrency": 0}"#),
            "concurrency"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "country": ["USA"]}"#),
            "country[0]"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "scheme": ["ftp"]}"#),
            "scheme[0]"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "anonymity": "x"}"#),
            "anonymity"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "select": {"t": ""}}"#),
            "select.t"
        );
        assert_eq!(
            field(r#"{"seeds": ["http://a/"], "no_proxy_wait": "2h"}"#),
            "no_proxy_wait"
        );
        let unknown = check(r#"{"seeds": ["http://a/"], "max_pagez": 3}"#).unwrap_err();
        assert!(unknown.message.contains("max_pagez"), "{unknown}");
        assert_eq!(field("[1, 2]"), "body");
        assert_eq!(field("{"), "body");

        let v = check(
            r#"{"seeds": ["http://a/"], "max_pages": 10, "delay": "250ms", "country": ["de"],
                "scheme": ["socks5"], "select": {"title": "h1"}}"#,
        )
        .unwrap();
        assert_eq!(v.crawl.max_pages, Some(10));
        assert_eq!(v.crawl.delay, Duration::from_millis(250));
        assert_eq!(v.pool.query.countries, [Country::parse("DE").unwrap()]);
        assert_eq!(v.pool.query.schemes, [Scheme::Socks5]);
        assert_eq!(v.crawl.selects.len(), 1);
        // Without max_pages, the cap; without no_proxy_wait, the pool's.
        let v = check(r#"{"seeds": ["http://a/"]}"#).unwrap();
        assert_eq!(v.crawl.max_pages, Some(1000));
        assert_eq!(v.pool.no_proxy, PoolOptions::default().no_proxy);
        let v = check(r#"{"seeds": ["http://a/"], "no_proxy_wait": "0s"}"#).unwrap();
        assert_eq!(v.pool.no_proxy, NoProxy::Wait(Duration::ZERO));
    }
}
