//! What the store reads and writes: a source run with its candidates (one
//! transaction), proxy listings with filters, and counts for `stats`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;

use super::{Store, StoreError};
use crate::model::Candidate;
use crate::proxy::{Anonymity, Country, Credentials, Proxy, Scheme, Status};

/// Candidates written per transaction: a few tens of milliseconds of
/// work, far below the busy timeout of anyone waiting for the lock.
const SOURCE_CHUNK: usize = 5_000;

/// What happened when one source was fetched.
#[derive(Clone, Debug)]
pub struct SourceRun {
    /// The source's configured name.
    pub name: String,
    /// Its URL as configured.
    pub url: String,
    /// Its format name.
    pub format: String,
    /// When the fetch started (unix ms); also the `last_seen` of what it found.
    pub started_at: i64,
    /// The last HTTP status received, if any.
    pub http_status: Option<u16>,
    /// How long fetching and parsing took.
    pub duration_ms: i64,
    /// Why the source failed, if it did.
    pub error: Option<String>,
}

/// How a batch of candidates landed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpsertCounts {
    /// Distinct candidates written.
    pub found: usize,
    /// Of those, proxies the store had never seen.
    pub new: usize,
}

/// Which proxies a listing returns. Empty lists and `None` mean "any".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyFilter {
    /// `None` for every status.
    pub status: Option<Status>,
    /// Any of these countries.
    pub countries: Vec<Country>,
    /// Any of these schemes.
    pub schemes: Vec<Scheme>,
    /// At least this anonymous.
    pub min_anonymity: Option<Anonymity>,
    /// Only proxies that passed the HTTPS test.
    pub https: bool,
    /// Only proxies whose last passed check took at most this long.
    pub max_latency_ms: Option<i64>,
    /// Only proxies that last passed a check at or after this time (unix ms).
    pub alive_since: Option<i64>,
    /// Leave these ids out.
    pub exclude_ids: Vec<i64>,
    /// Leave these addresses out.
    pub exclude_addrs: Vec<SocketAddr>,
}

/// The order of a listing page; ties go by id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxySort {
    /// By id.
    #[default]
    Id,
    /// Fastest last passed check first; never passed last.
    Latency,
    /// Most recently checked first; never checked last.
    LastChecked,
    /// Highest share of passed checks first.
    Uptime,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// How many proxies match in all.
    pub total: i64,
    /// The proxies of this page.
    pub proxies: Vec<ProxyRecord>,
}

impl ProxyFilter {
    /// The `WHERE` clause (over `proxies p`) and its arguments.
    fn sql(&self) -> (String, Vec<rusqlite::types::Value>) {
        use rusqlite::types::Value;
        let mut sql = String::from("1 = 1");
        let mut args: Vec<Value> = Vec::new();
        let arg = |v: Value, args: &mut Vec<Value>| {
            args.push(v);
            format!("?{}", args.len())
        };
        if let Some(s) = self.status {
            let a = arg(Value::Text(s.as_str().into()), &mut args);
            sql.push_str(&format!(" AND p.status = {a}"));
        }
        let mut any_of = |column: &str, values: Vec<String>, args: &mut Vec<Value>| {
            if !values.is_empty() {
                let list = serde_json::to_string(&values).unwrap_or_else(|_| "[]".into());
                let a = arg(Value::Text(list), args);
                sql.push_str(&format!(
                    " AND {column} IN (SELECT value FROM json_each({a}))"
                ));
            }
        };
        any_of(
            "p.country",
            self.countries.iter().map(|c| c.to_string()).collect(),
            &mut args,
        );
        any_of(
            "p.scheme",
            self.schemes.iter().map(|s| s.as_str().to_owned()).collect(),
            &mut args,
        );
        if let Some(min) = self.min_anonymity {
            let levels: Vec<String> = [
                Anonymity::Transparent,
                Anonymity::Anonymous,
                Anonymity::Elite,
            ]
            .into_iter()
            .filter(|a| *a >= min)
            .map(|a| a.as_str().to_owned())
            .collect();
            any_of("p.anonymity", levels, &mut args);
        }
        if self.https {
            sql.push_str(" AND p.https = 1");
        }
        if let Some(max) = self.max_latency_ms {
            let a = arg(Value::Integer(max), &mut args);
            sql.push_str(&format!(" AND p.latency_ms <= {a}"));
        }
        if let Some(since) = self.alive_since {
            let a = arg(Value::Integer(since), &mut args);
            sql.push_str(&format!(" AND p.last_alive >= {a}"));
        }
        if !self.exclude_ids.is_empty() {
            let list = serde_json::to_string(&self.exclude_ids).unwrap_or_else(|_| "[]".into());
            let a = arg(Value::Text(list), &mut args);
            sql.push_str(&format!(
                " AND p.id NOT IN (SELECT value FROM json_each({a}))"
            ));
        }
        if !self.exclude_addrs.is_empty() {
            let pairs: Vec<(String, u16)> = self
                .exclude_addrs
                .iter()
                .map(|a| (a.ip().to_string(), a.port()))
                .collect();
            let list = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into());
            let a = arg(Value::Text(list), &mut args);
            sql.push_str(&format!(
                " AND NOT EXISTS (SELECT 1 FROM json_each({a}) x
                   WHERE x.value ->> 0 = p.host AND x.value ->> 1 = p.port)"
            ));
        }
        (sql, args)
    }
}

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

const PROXY_COLUMNS: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
    p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, p.last_seen, \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, \
    (SELECT group_concat(s.name, char(10)) FROM proxy_sources ps \
       JOIN sources s ON s.id = ps.source_id WHERE ps.proxy_id = p.id)";

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

fn proxy_from_row(row: &Row) -> rusqlite::Result<ProxyRecord> {
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

impl Store {
    /// Records one source fetch and writes its candidates. New proxies
    /// start `unknown` and due at once; known ones keep their checked facts
    /// and get `last_seen`, the source link and the source's hints updated.
    /// The candidates go in chunks of bounded transactions, so a huge list
    /// never holds the write lock longer than another process waits for it;
    /// the source's row records the run once every chunk is in.
    pub async fn record_source_run(
        &self,
        run: SourceRun,
        candidates: Vec<Candidate>,
    ) -> Result<UpsertCounts, StoreError> {
        let run = std::sync::Arc::new(run);
        let source = {
            let run = run.clone();
            self.write(move |tx| source_id(tx, &run)).await?
        };
        let now = run.started_at;
        let mut counts = UpsertCounts::default();
        let mut rest = candidates;
        while !rest.is_empty() {
            let tail = rest.split_off(rest.len().min(SOURCE_CHUNK));
            let chunk = std::mem::replace(&mut rest, tail);
            let weight = chunk.len();
            let c = self
                .write_weighted(weight, move |tx| upsert_candidates(tx, source, now, &chunk))
                .await?;
            counts.found += c.found;
            counts.new += c.new;
        }
        self.write(move |tx| finish_source_run(tx, source, &run, counts))
            .await?;
        Ok(counts)
    }

    /// Proxies matching `filter`, ordered by id.
    pub async fn list_proxies(&self, filter: ProxyFilter) -> Result<Vec<ProxyRecord>, StoreError> {
        self.read(move |c| list_proxies(c, &filter)).await
    }

    /// One page of the proxies matching `filter`, in `sort` order: only the
    /// page is read, whatever the size of the table.
    pub async fn list_page(
        &self,
        filter: ProxyFilter,
        sort: ProxySort,
        limit: usize,
        offset: usize,
    ) -> Result<Page, StoreError> {
        self.read(move |c| list_page(c, &filter, sort, limit, offset))
            .await
    }

    /// The proxies with these ids (missing ids are skipped).
    pub async fn proxies_by_ids(&self, ids: Vec<i64>) -> Result<Vec<ProxyRecord>, StoreError> {
        self.read(move |c| proxies_by_ids(c, &ids)).await
    }

    /// Proxy counts per (status, scheme), every combination included.
    pub async fn count_by_status_scheme(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.read(count_by_status_scheme).await
    }

    /// Whether any proxy is stored and any was checked, from index seeks
    /// (no count): it answers every `/proxy` while nothing is servable,
    /// whatever the number of proxies.
    pub async fn presence(&self) -> Result<Presence, StoreError> {
        self.read(|c| {
            Ok(c.query_row(
                "SELECT EXISTS (SELECT 1 FROM proxies),
                        EXISTS (SELECT 1 FROM proxies WHERE status = 'alive')
                     OR EXISTS (SELECT 1 FROM proxies WHERE status = 'dead')",
                [],
                |r| {
                    Ok(Presence {
                        stored: r.get(0)?,
                        checked: r.get(1)?,
                    })
                },
            )?)
        })
        .await
    }

    /// Every source's record with its proxy counts, by name.
    pub async fn list_sources(&self) -> Result<Vec<SourceRecord>, StoreError> {
        self.read(list_sources).await
    }

    /// How many distinct proxies were listed at or after `since` (unix ms).
    pub async fn count_seen_since(&self, since: i64) -> Result<i64, StoreError> {
        self.read(move |c| {
            Ok(c.query_row(
                "SELECT count(*) FROM proxies WHERE last_seen >= ?1",
                [since],
                |r| r.get(0),
            )?)
        })
        .await
    }

    /// Counts by status, scheme, country, failure reason and source.
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        self.read(stats).await
    }
}

/// The source's row id, creating the row on its first run.
fn source_id(tx: &Connection, run: &SourceRun) -> Result<i64, StoreError> {
    Ok(tx.query_row(
        "INSERT INTO sources (name, url, format) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, format = excluded.format
             RETURNING id",
        params![run.name, run.url, run.format],
        |r| r.get(0),
    )?)
}

/// Writes one chunk of a source's candidates, linked to the source.
fn upsert_candidates(
    tx: &Connection,
    source_id: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<UpsertCounts, StoreError> {
    // A country from the source changes what filters select.
    super::checks::bump_change_seq(tx)?;
    let mut counts = UpsertCounts::default();
    {
        let mut find = tx.prepare_cached(
                "SELECT id FROM proxies WHERE scheme = ?1 AND host = ?2 AND port = ?3 AND username = ?4",
            )?;
        // An entry whose scheme is to be detected is the same proxy as
        // any row at its address, whatever scheme detection gave it.
        let mut find_any = tx.prepare_cached(
            "SELECT id FROM proxies WHERE host = ?1 AND port = ?2 AND username = ?3
                 ORDER BY scheme_detect, id LIMIT 1",
        )?;
        let mut insert = tx.prepare_cached(
                "INSERT INTO proxies (scheme, host, port, username, password, scheme_detect,
                     country, country_source, hint_anonymity, hint_https,
                     first_seen, last_seen, next_check_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, CASE WHEN ?7 IS NULL THEN NULL ELSE 'source' END,
                     ?8, ?9, ?10, ?10, ?10)",
            )?;
        // A GeoIP country is what the exit address really is; a source's
        // claim never overrides it.
        let mut update = tx.prepare_cached(
            "UPDATE proxies SET
                     last_seen = max(last_seen, ?2),
                     password = coalesce(?3, password),
                     scheme_detect = min(scheme_detect, ?4),
                     country = CASE WHEN country_source = 'geoip' OR ?5 IS NULL
                                    THEN country ELSE ?5 END,
                     country_source = CASE WHEN country_source = 'geoip' OR ?5 IS NULL
                                    THEN country_source ELSE 'source' END,
                     hint_anonymity = coalesce(?6, hint_anonymity),
                     hint_https = coalesce(?7, hint_https),
                     changed_seq = CASE WHEN country_source IS NOT 'geoip' AND ?5 IS NOT NULL
                                             AND country IS NOT ?5
                                        THEN (SELECT change_seq FROM meta) ELSE changed_seq END
                 WHERE id = ?1",
        )?;
        let mut link = tx.prepare_cached(
            "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen)
                 VALUES (?1, ?2, ?3, ?3)
                 ON CONFLICT (proxy_id, source_id) DO UPDATE SET last_seen = excluded.last_seen",
        )?;
        for c in candidates {
            let p = &c.proxy;
            let host = p.host.to_string();
            let password = p.auth.as_ref().map(|a| a.password.as_str());
            let country = c.hints.country.map(|c| c.as_str().to_owned());
            let anonymity = c.hints.anonymity.map(Anonymity::as_str);
            let id: Option<i64> = if c.detect {
                find_any
                    .query_row(params![host, p.port, p.username()], |r| r.get(0))
                    .optional()?
            } else {
                find.query_row(
                    params![p.scheme.as_str(), host, p.port, p.username()],
                    |r| r.get(0),
                )
                .optional()?
            };
            let id = match id {
                Some(id) => {
                    update.execute(params![
                        id,
                        now,
                        password,
                        c.detect,
                        country,
                        anonymity,
                        c.hints.https
                    ])?;
                    id
                }
                None => {
                    insert.execute(params![
                        p.scheme.as_str(),
                        host,
                        p.port,
                        p.username(),
                        password,
                        c.detect,
                        country,
                        anonymity,
                        c.hints.https,
                        now
                    ])?;
                    counts.new += 1;
                    tx.last_insert_rowid()
                }
            };
            link.execute(params![id, source_id, now])?;
            counts.found += 1;
        }
    }
    Ok(counts)
}

/// Records the end of a source run with what it found.
fn finish_source_run(
    tx: &Connection,
    source_id: i64,
    run: &SourceRun,
    counts: UpsertCounts,
) -> Result<(), StoreError> {
    let finished = run.started_at + run.duration_ms;
    tx.execute(
        "UPDATE sources SET
                 last_fetch_at = ?2,
                 last_ok_at = CASE WHEN ?7 IS NULL THEN ?2 ELSE last_ok_at END,
                 last_http_status = ?3,
                 last_duration_ms = ?4,
                 last_found = ?5,
                 last_new = ?6,
                 last_error = ?7,
                 fetches_total = fetches_total + 1,
                 fetches_failed = fetches_failed + (?7 IS NOT NULL)
             WHERE id = ?1",
        params![
            source_id,
            finished,
            run.http_status,
            run.duration_ms,
            counts.found as i64,
            counts.new as i64,
            run.error
        ],
    )?;
    Ok(())
}

fn list_proxies(conn: &Connection, filter: &ProxyFilter) -> Result<Vec<ProxyRecord>, StoreError> {
    let (clause, args) = filter.sql();
    let mut stmt = conn.prepare(&format!(
        "SELECT {PROXY_COLUMNS} FROM proxies p WHERE {clause} ORDER BY p.id"
    ))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), proxy_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn list_page(
    conn: &Connection,
    filter: &ProxyFilter,
    sort: ProxySort,
    limit: usize,
    offset: usize,
) -> Result<Page, StoreError> {
    let (clause, mut args) = filter.sql();
    let total: i64 = conn.query_row(
        &format!("SELECT count(*) FROM proxies p WHERE {clause}"),
        rusqlite::params_from_iter(args.iter()),
        |r| r.get(0),
    )?;
    let order = match sort {
        ProxySort::Id => "p.id",
        ProxySort::Latency => "p.latency_ms IS NULL, p.latency_ms, p.id",
        ProxySort::LastChecked => "p.last_checked IS NULL, p.last_checked DESC, p.id",
        ProxySort::Uptime => {
            "CASE WHEN p.checks_total = 0 THEN 0.0
                  ELSE CAST(p.checks_ok AS REAL) / p.checks_total END DESC, p.id"
        }
    };
    args.push(rusqlite::types::Value::Integer(limit as i64));
    args.push(rusqlite::types::Value::Integer(
        i64::try_from(offset).unwrap_or(i64::MAX),
    ));
    let n = args.len();
    let mut stmt = conn.prepare(&format!(
        "SELECT {PROXY_COLUMNS} FROM proxies p WHERE {clause} ORDER BY {order} LIMIT ?{} OFFSET ?{n}",
        n - 1
    ))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), proxy_from_row)?;
    Ok(Page {
        total,
        proxies: rows.collect::<Result<Vec<_>, _>>()?,
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

fn count_by_status_scheme(conn: &Connection) -> Result<Vec<(String, String, i64)>, StoreError> {
    let mut stmt = conn.prepare_cached(
            "SELECT st.s, sc.s, (SELECT count(*) FROM proxies p WHERE p.status = st.s AND p.scheme = sc.s)
             FROM (SELECT 'unknown' AS s UNION ALL SELECT 'alive' UNION ALL SELECT 'dead') st,
                  (SELECT 'http' AS s UNION ALL SELECT 'socks4' UNION ALL SELECT 'socks5') sc",
        )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn list_sources(conn: &Connection) -> Result<Vec<SourceRecord>, StoreError> {
    let mut stmt = conn.prepare(
        "SELECT s.name, s.url, s.format, s.last_fetch_at, s.last_ok_at, s.last_http_status,
                    s.last_duration_ms, s.last_found, s.last_new, s.last_error,
                    s.fetches_total, s.fetches_failed,
                    (SELECT count(*) FROM proxy_sources ps WHERE ps.source_id = s.id),
                    (SELECT count(*) FROM proxy_sources ps JOIN proxies p ON p.id = ps.proxy_id
                      WHERE ps.source_id = s.id AND p.status = 'alive')
             FROM sources s ORDER BY s.name",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok(SourceRecord {
            name: r.get(0)?,
            url: r.get(1)?,
            format: r.get(2)?,
            last_fetch_at: r.get(3)?,
            last_ok_at: r.get(4)?,
            last_http_status: r.get(5)?,
            last_duration_ms: r.get(6)?,
            last_found: r.get(7)?,
            last_new: r.get(8)?,
            last_error: r.get(9)?,
            fetches_total: r.get(10)?,
            fetches_failed: r.get(11)?,
            proxies: r.get(12)?,
            alive: r.get(13)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn stats(conn: &Connection) -> Result<Stats, StoreError> {
    let mut stats = Stats {
        sources: list_sources(conn)?,
        ..Stats::default()
    };
    stats.total = conn.query_row("SELECT count(*) FROM proxies", [], |r| r.get(0))?;
    for (sql, map) in [
        (
            "SELECT status, count(*) FROM proxies GROUP BY 1",
            &mut stats.by_status,
        ),
        (
            "SELECT scheme, count(*) FROM proxies GROUP BY 1",
            &mut stats.by_scheme,
        ),
        (
            "SELECT coalesce(country, 'unknown'), count(*) FROM proxies GROUP BY 1",
            &mut stats.by_country,
        ),
        (
            "SELECT anonymity, count(*) FROM proxies
                  WHERE status = 'alive' AND anonymity IS NOT NULL GROUP BY 1",
            &mut stats.by_anonymity,
        ),
        (
            "SELECT last_reason, count(*) FROM proxies
                  WHERE status = 'dead' AND last_reason IS NOT NULL GROUP BY 1",
            &mut stats.by_reason,
        ),
    ] {
        let mut stmt = conn.prepare(sql)?;
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
        for row in rows {
            let (k, v) = row?;
            map.insert(k, v);
        }
    }
    for s in [Status::Unknown, Status::Alive, Status::Dead] {
        stats.by_status.entry(s.as_str().to_owned()).or_insert(0);
    }
    Ok(stats)
}
