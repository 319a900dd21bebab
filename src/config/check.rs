//! `[check]`: the judges and how proxies are checked and re-checked.

use std::path::PathBuf;
use std::time::Duration;

use toml::Value;
use url::Url;

use super::section::{Section, type_name};
use crate::model::RecheckPolicy;

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

/// Validates `[check]`.
pub(super) fn read(c: &mut Section) -> CheckConfig {
    let judges = judges(c, "judges").unwrap_or_else(|| {
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
    check
}

/// Judges: each a URL string or `{ url, marker, echo }`.
fn judges(s: &mut Section, k: &str) -> Option<Vec<JudgeConfig>> {
    let v = s.take(k)?;
    let Value::Array(items) = v else {
        s.problem(
            k,
            &format!("expected an array of judge URLs, found {}", type_name(&v)),
        );
        return None;
    };
    if items.is_empty() {
        s.problem(k, "needs at least one judge");
    }
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let key = format!("{k}[{i}]");
        let (url, marker, echo) = match item {
            Value::String(u) => (Some(u), None, true),
            Value::Table(t) => {
                let mut j = Section::new(&s.key(&key), t);
                let url = j.required_string("url");
                let marker = j.string("marker").filter(|m| !m.is_empty());
                let echo = j.boolean("echo").unwrap_or(true);
                if !echo && marker.is_none() {
                    j.problem(
                        "marker",
                        "is required when echo = false (otherwise any page would pass)",
                    );
                }
                s.absorb(j);
                (url, marker, echo)
            }
            other => {
                s.problem(
                    &key,
                    &format!(
                        "expected a URL or {{ url = ..., marker = ... }}, found {}",
                        type_name(&other)
                    ),
                );
                continue;
            }
        };
        let Some(u) = url else { continue };
        match Url::parse(&u) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                out.push(JudgeConfig { url, marker, echo })
            }
            Ok(_) => s.problem(&key, &format!("expected an http(s) URL, found {u:?}")),
            Err(e) => s.problem(&key, &format!("invalid URL {u:?}: {e}")),
        }
    }
    Some(out)
}
