//! The records the store hands out and how a row becomes one: a proxy with
//! its sources, a source with its last run, the counts for `stats`; and the
//! change number every proxy write carries.

use std::collections::BTreeMap;
use std::net::IpAddr;

use rusqlite::{Connection, Row};
use serde::Serialize;

use super::StoreError;
use crate::proxy::{Anonymity, Country, Credentials, Proxy, Scheme, Status};

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
}

pub(super) const PROXY_COLUMNS: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
    p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, \
    max(p.last_seen, coalesce((SELECT max(s.listed_at) FROM sources s \
       CROSS JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id \
       WHERE ps.listed = 1), 0)), \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, \
    (SELECT group_concat(s.name, char(10)) FROM sources s \
       CROSS JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id)";

/// Turns a text column into an enum, reporting bad values as conversion
/// errors rather than panicking (the database may have been edited by hand).
fn parse_col<T: std::str::FromStr<Err = crate::proxy::ParseError>>(
    row: &Row,
    idx: usize,
) -> rusqlite::Result<Option<T>> {
    let v: Option<String> = row.get(idx)?;
    v.map(|s| {
        s.parse::<T>().map_err(|e| {
            rusqlite::Error::FromSqlConversionFailure(idx, rusqlite::types::Type::Text, e.into())
        })
    })
    .transpose()
}

pub(super) fn proxy_from_row(row: &Row) -> rusqlite::Result<ProxyRecord> {
    let host: String = row.get(2)?;
    let host: IpAddr = host.parse().map_err(|e: std::net::AddrParseError| {
        rusqlite::Error::FromSqlConversionFailure(2, rusqlite::types::Type::Text, e.into())
    })?;
    let username: String = row.get(4)?;
    let password: Option<String> = row.get(5)?;
    let auth = (!username.is_empty()).then(|| Credentials {
        username,
        password: password.unwrap_or_default(),
    });
    let sources: Option<String> = row.get(25)?;
    Ok(ProxyRecord {
        id: row.get(0)?,
        proxy: Proxy {
            scheme: parse_col(row, 1)?.unwrap_or(Scheme::Http),
            host,
            port: row.get(3)?,
            auth,
        },
        scheme_detect: row.get(6)?,
        status: parse_col(row, 7)?.unwrap_or(Status::Unknown),
        country: row
            .get::<_, Option<String>>(8)?
            .as_deref()
            .and_then(Country::parse),
        country_source: row.get(9)?,
        anonymity: parse_col(row, 10)?,
        https: row.get(11)?,
        latency_ms: row.get(12)?,
        exit_ip: row.get(13)?,
        last_checked: row.get(14)?,
        last_alive: row.get(15)?,
        first_seen: row.get(16)?,
        last_seen: row.get(17)?,
        reason: row.get(18)?,
        hint_anonymity: parse_col(row, 19)?,
        hint_https: row.get(20)?,
        checks_total: row.get(21)?,
        checks_ok: row.get(22)?,
        consecutive_failures: row.get(23)?,
        next_check_at: row.get(24)?,
        sources: sources
            .map(|s| {
                let mut v: Vec<String> = s.split('\n').map(str::to_owned).collect();
                v.sort();
                v
            })
            .unwrap_or_default(),
    })
}

/// The proxies with these ids (missing ids are skipped).
pub(super) fn proxies_by_ids(
    conn: &Connection,
    ids: &[i64],
) -> Result<Vec<ProxyRecord>, StoreError> {
    let list = serde_json::to_string(ids).unwrap_or_else(|_| "[]".into());
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {PROXY_COLUMNS} FROM proxies p WHERE p.id IN (SELECT value FROM json_each(?1))"
    ))?;
    let rows = stmt.query_map([list], proxy_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Starts a new change number for the rows this transaction writes (see
/// migration 0003).
pub(super) fn bump_change_seq(tx: &Connection) -> Result<(), StoreError> {
    tx.execute("UPDATE meta SET change_seq = change_seq + 1", [])?;
    Ok(())
}
