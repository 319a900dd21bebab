//! How a row becomes one of the store's records, and the change number
//! every proxy write carries.

use std::net::IpAddr;

use rusqlite::{Connection, OptionalExtension, Row};

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

/// [`PROXY_COLUMNS`] without the two lookups in a proxy's links: its own
/// `last_seen` and no sources, for [`attach_sources`] to complete. A
/// listing of many proxies reads their links a source at a time, in the
/// links' own order, rather than probing every source's links for each
/// proxy (two probes per source and proxy: most of loading 100,000 alive
/// proxies out of a million).
pub(super) const PROXY_COLUMNS_OWN: &str = "p.id, p.scheme, p.host, p.port, p.username, \
    p.password, p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, p.last_seen, \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, NULL, p.failed_in_use_at";

/// Completes records read with [`PROXY_COLUMNS_OWN`] (in the same read
/// transaction) as [`PROXY_COLUMNS`] would have read them: each record's
/// sources, and its `last_seen` raised to the latest list of a source that
/// still lists it. Each source's links between the records' lowest and
/// highest ids are read in one range of the links' key when the records
/// are dense enough there; a few records far apart are probed one by one.
pub(super) fn attach_sources(
    conn: &Connection,
    records: &mut [ProxyRecord],
) -> Result<(), StoreError> {
    let (Some(lo), Some(hi)) = (
        records.iter().map(|r| r.id).min(),
        records.iter().map(|r| r.id).max(),
    ) else {
        return Ok(());
    };
    let at: std::collections::HashMap<i64, usize> =
        records.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    let sources: Vec<(i64, String, Option<i64>)> = conn
        .prepare_cached("SELECT id, name, listed_at FROM sources ORDER BY name")?
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<Result<_, _>>()?;
    // A probe costs about what reading a score of links in order does.
    let scan = (records.len() as i64).saturating_mul(20) > hi - lo;
    let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
    let mut link = |i: usize, name: &str, listed: bool, listed_at: Option<i64>| {
        let r = &mut records[i];
        r.sources.push(name.to_owned());
        if let (true, Some(t)) = (listed, listed_at) {
            r.last_seen = r.last_seen.max(t);
        }
    };
    for (source, name, listed_at) in &sources {
        if scan {
            let mut stmt = conn.prepare_cached(
                "SELECT proxy_id, listed FROM proxy_sources
                  WHERE source_id = ?1 AND proxy_id BETWEEN ?2 AND ?3",
            )?;
            let mut rows = stmt.query(rusqlite::params![source, lo, hi])?;
            while let Some(row) = rows.next()? {
                if let Some(&i) = at.get(&row.get::<_, i64>(0)?) {
                    link(i, name, row.get(1)?, *listed_at);
                }
            }
        } else {
            let mut stmt = conn.prepare_cached(
                "SELECT listed FROM proxy_sources WHERE source_id = ?1 AND proxy_id = ?2",
            )?;
            for (i, id) in ids.iter().enumerate() {
                let listed: Option<bool> = stmt
                    .query_row(rusqlite::params![source, id], |r| r.get(0))
                    .optional()?;
                if let Some(listed) = listed {
                    link(i, name, listed, *listed_at);
                }
            }
        }
    }
    for r in records.iter_mut() {
        r.sources.sort();
    }
    Ok(())
}

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
