//! How a row becomes one of the store's records, and the change number
//! every proxy write carries.

use std::net::IpAddr;

use rusqlite::{Connection, Row};

use crate::proxy::{Country, Credentials, Proxy, Scheme, Status};
use crate::store::{ProxyRecord, StoreError};

pub(super) const PROXY_COLUMNS: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
    p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, \
    max(p.last_seen, coalesce((SELECT max(s.listed_at) FROM sources s \
       CROSS JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id \
       WHERE ps.listed = 1), 0)), \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, \
    (SELECT group_concat(s.name, char(10)) FROM sources s \
       CROSS JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id), p.failed_in_use_at";

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
        failed_in_use_at: row.get(26)?,
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
