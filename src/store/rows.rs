//! The records the store hands out: a proxy with its sources, a source
//! with its last run, the counts for `stats`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::proxy::{Anonymity, Country, Proxy, Scheme, Status};

/// Everything stored about one proxy.
#[derive(Clone, Debug, PartialEq)]
pub struct ProxyRecord {
    /// Row id, stable for the life of the proxy.
    pub id: i64,
    /// Identity and credentials.
    pub proxy: Proxy,
    /// True while the scheme awaits detection.
    pub scheme_detect: bool,
    /// Last verdict.
    pub status: Status,
    /// Country code (from a source hint or GeoIP).
    pub country: Option<Country>,
    /// Where the country came from: `source` or `geoip`.
    pub country_source: Option<String>,
    /// Checked anonymity.
    pub anonymity: Option<Anonymity>,
    /// Checked HTTPS (CONNECT) support.
    pub https: Option<bool>,
    /// Latency of the last passed check.
    pub latency_ms: Option<i64>,
    /// The address the judge saw.
    pub exit_ip: Option<String>,
    /// Last check (unix ms).
    pub last_checked: Option<i64>,
    /// Last passed check (unix ms).
    pub last_alive: Option<i64>,
    /// First listed by a source (unix ms).
    pub first_seen: i64,
    /// Last listed by a source (unix ms).
    pub last_seen: i64,
    /// Reason of the last failure.
    pub reason: Option<String>,
    /// Anonymity claimed by a source.
    pub hint_anonymity: Option<Anonymity>,
    /// HTTPS support claimed by a source.
    pub hint_https: Option<bool>,
    /// Checks run.
    pub checks_total: i64,
    /// Checks passed.
    pub checks_ok: i64,
    /// Failures since the last pass.
    pub consecutive_failures: i64,
    /// When the proxy is due for a check (unix ms).
    pub next_check_at: i64,
    /// Names of the sources that list it.
    pub sources: Vec<String>,
    /// When it last failed in use (unix ms), on any node: a proxy that
    /// failed after its last check is not served until a check passes.
    pub failed_in_use_at: Option<i64>,
}

#[cfg(test)]
impl ProxyRecord {
    /// An alive plain-HTTP proxy for unit tests: `id` at an address of its
    /// own (`10.a.b.c` from the id's bytes), checked once, successfully,
    /// at 1,000 ms, in `latency_ms`.
    pub(crate) fn alive_for_test(id: i64, latency_ms: i64) -> ProxyRecord {
        ProxyRecord {
            id,
            proxy: Proxy {
                scheme: crate::proxy::Scheme::Http,
                host: std::net::Ipv4Addr::new(10, (id >> 16) as u8, (id >> 8) as u8, id as u8)
                    .into(),
                port: 8080,
                auth: None,
            },
            scheme_detect: false,
            status: Status::Alive,
            country: None,
            country_source: None,
            anonymity: None,
            https: None,
            latency_ms: Some(latency_ms),
            exit_ip: None,
            last_checked: Some(1_000),
            last_alive: Some(1_000),
            first_seen: 0,
            last_seen: 0,
            reason: None,
            hint_anonymity: None,
            hint_https: None,
            checks_total: 1,
            checks_ok: 1,
            consecutive_failures: 0,
            next_check_at: 0,
            sources: Vec::new(),
            failed_in_use_at: None,
        }
    }
}

impl ProxyRecord {
    /// True when it failed in use after its last check: no node serves it
    /// until a newer check passes.
    pub fn failed_since_checked(&self) -> bool {
        self.failed_in_use_at
            .is_some_and(|f| self.last_checked.is_none_or(|c| c < f))
    }
}

/// A source's row: the record of its last fetch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SourceRecord {
    /// Configured name.
    pub name: String,
    /// URL as configured.
    pub url: String,
    /// Format name.
    pub format: String,
    /// Last fetch (unix ms).
    pub last_fetch_at: Option<i64>,
    /// Last fetch without error (unix ms).
    pub last_ok_at: Option<i64>,
    /// Last HTTP status.
    pub last_http_status: Option<i64>,
    /// Duration of the last fetch.
    pub last_duration_ms: Option<i64>,
    /// Proxies found by the last fetch.
    pub last_found: Option<i64>,
    /// Of those, new to the store.
    pub last_new: Option<i64>,
    /// Entries the last fetch dropped for their address (private, or the
    /// daemon's own).
    pub last_private: Option<i64>,
    /// Error of the last fetch.
    pub last_error: Option<String>,
    /// Fetches recorded.
    pub fetches_total: i64,
    /// Fetches that failed.
    pub fetches_failed: i64,
    /// Proxies currently linked to the source.
    pub proxies: i64,
    /// Of those, alive.
    pub alive: i64,
    /// Of those, proxies no other source lists: what the pool would lose
    /// without this source.
    pub unique: i64,
}

/// Whether the store holds any proxy, and any checked one: what an empty
/// pool's 404 needs to say why nothing is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Presence {
    /// At least one proxy is stored.
    pub stored: bool,
    /// At least one proxy has been checked (is alive or dead).
    pub checked: bool,
}

/// Counts for `stats`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// All stored proxies.
    pub total: i64,
    /// By status name.
    pub by_status: BTreeMap<String, i64>,
    /// By scheme name.
    pub by_scheme: BTreeMap<String, i64>,
    /// By country code (`unknown` when none).
    pub by_country: BTreeMap<String, i64>,
    /// Alive proxies by checked anonymity.
    pub by_anonymity: BTreeMap<String, i64>,
    /// By failure reason of dead proxies.
    pub by_reason: BTreeMap<String, i64>,
    /// Per source.
    pub sources: Vec<SourceRecord>,
    /// By status and scheme together (for `/metrics`).
    #[serde(skip)]
    pub by_status_scheme: BTreeMap<(String, String), i64>,
}

impl Stats {
    /// Adds `n` proxies of one (status, scheme, country, anonymity,
    /// failure reason) group, `""` standing for none.
    pub(crate) fn add_count(&mut self, group: (String, String, String, String, String, i64)) {
        let (status, scheme, country, anonymity, reason, n) = group;
        self.total += n;
        let country = if country.is_empty() {
            "unknown".to_owned()
        } else {
            country
        };
        *self.by_country.entry(country).or_default() += n;
        *self
            .by_status_scheme
            .entry((status.clone(), scheme.clone()))
            .or_default() += n;
        *self.by_scheme.entry(scheme).or_default() += n;
        if status == "alive" && !anonymity.is_empty() {
            *self.by_anonymity.entry(anonymity).or_default() += n;
        }
        if status == "dead" && !reason.is_empty() {
            *self.by_reason.entry(reason).or_default() += n;
        }
        *self.by_status.entry(status).or_default() += n;
    }

    /// The proxies of every (status, scheme), 0 for those no proxy has.
    pub fn by_status_and_scheme(&self) -> Vec<(String, String, i64)> {
        let mut out = Vec::with_capacity(9);
        for status in [Status::Unknown, Status::Alive, Status::Dead] {
            for scheme in [Scheme::Http, Scheme::Socks4, Scheme::Socks5] {
                let key = (status.as_str().to_owned(), scheme.as_str().to_owned());
                let n = self.by_status_scheme.get(&key).copied().unwrap_or(0);
                out.push((key.0, key.1, n));
            }
        }
        out
    }

    /// Names every status in `by_status`, with 0 for those no proxy has.
    pub(crate) fn by_status_complete(&mut self) {
        for s in [Status::Unknown, Status::Alive, Status::Dead] {
            self.by_status.entry(s.as_str().to_owned()).or_insert(0);
        }
    }
}
