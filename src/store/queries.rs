//! What the store reads and writes: a source run with its candidates (one
//! transaction), proxy listings with filters, and counts for `stats`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde::Serialize;

use super::{Store, StoreError};
use crate::model::{Candidate, CandidateList};
use crate::proxy::{Anonymity, Country, Credentials, Proxy, Scheme, Status};

/// Candidates written per transaction: a few tens of milliseconds of
/// work, far below the busy timeout of anyone waiting for the lock. Two
/// chunks outweigh one transaction of the writer, so that each commits
/// alone, without the savepoint a job sharing a transaction needs.
const SOURCE_CHUNK: usize = 6_000;
const _: () = assert!(2 * SOURCE_CHUNK > super::writer::MAX_WEIGHT);

/// A source's listed links read per transaction when unlisting those a
/// new list left out: reading is cheap, and most pages write nothing.
const UNLIST_PAGE: usize = 50_000;

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
    /// Entries dropped for their address (private, or the daemon's own).
    pub private: usize,
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

const PROXY_COLUMNS: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
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
    /// and get the source link and the source's hints updated, and a row
    /// is written only when something in it changes, so a re-harvest of an
    /// unchanged list costs lookups, not writes. A list longer than one
    /// transaction is written in identity order (see
    /// [`CandidateList::sort_by_identity_text`]), so the lookups and inserts
    /// walk the identity index in order. The
    /// candidates go in chunks of bounded transactions, so a huge list never
    /// holds the write lock longer than another process waits for it; then
    /// the source's links that this list left out are unlisted, and the
    /// source's row records the run.
    pub async fn record_source_run(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
    ) -> Result<UpsertCounts, StoreError> {
        let mut counts = UpsertCounts::default();
        self.record_source_run_into(run, candidates, &mut counts)
            .await
            .map(|()| counts)
    }

    /// [`Store::record_source_run`], adding to `counts` what each chunk
    /// wrote as it commits: when a later chunk fails (a full disk), the
    /// chunks before it stay written and `counts` says how many.
    pub async fn record_source_run_into(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
        counts: &mut UpsertCounts,
    ) -> Result<(), StoreError> {
        let mut list: CandidateList = candidates.into();
        let run = std::sync::Arc::new(run);
        let (source, listed_before) = {
            let run = run.clone();
            self.write(move |tx| source_id(tx, &run)).await?
        };
        let now = run.started_at;
        // Sorting millions of entries is CPU work: off the runtime. A list
        // that fits one transaction keeps its order, so its new proxies
        // are numbered (and first checked) in the order the source gives.
        let list = match tokio::task::spawn_blocking(move || {
            if list.len() > SOURCE_CHUNK {
                list.sort_by_identity_text();
            }
            list
        })
        .await
        {
            Ok(l) => l,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        // The proxies this list names, to unlist the source's others.
        let mut seen: Vec<i64> = Vec::with_capacity(list.len());
        {
            let add = |counts: &mut UpsertCounts, c: UpsertCounts| {
                counts.found += c.found;
                counts.new += c.new;
            };
            // The next chunk is made and queued while the writer writes
            // this one, so that it never waits for it.
            let mut items = list.iter();
            let mut written = None;
            loop {
                let chunk: Vec<Candidate> = items.by_ref().take(SOURCE_CHUNK).collect();
                let queued = match chunk.is_empty() {
                    true => Ok(None),
                    false => self
                        .submit_weighted(chunk.len(), move |tx| {
                            upsert_candidates(tx, source, now, &chunk)
                        })
                        .await
                        .map(Some),
                };
                let (previous, failed) = match queued {
                    Ok(queued) => (std::mem::replace(&mut written, queued), None),
                    Err(e) => (written.take(), Some(e)),
                };
                if let Some(previous) = previous {
                    match previous.await {
                        Ok((c, ids)) => {
                            add(counts, c);
                            seen.extend(ids);
                        }
                        Err(e) => {
                            // The chunk queued after it may have been
                            // written all the same: it is counted.
                            if let Some(Ok((c, _))) = match written.take() {
                                Some(next) => Some(next.await),
                                None => None,
                            } {
                                add(counts, c);
                            }
                            return Err(e);
                        }
                    }
                }
                if let Some(e) = failed {
                    return Err(e);
                }
                if written.is_none() {
                    break;
                }
            }
        }
        drop(list);
        // A run that stored nothing (a failed fetch) leaves the last list
        // standing; before the first list there is nothing to unlist.
        if let (true, Some(listed_before)) = (counts.found > 0, listed_before) {
            seen.sort_unstable();
            seen.dedup();
            let seen = std::sync::Arc::new(seen);
            let mut after = i64::MIN;
            loop {
                let seen = seen.clone();
                let next = self
                    .write_weighted(SOURCE_CHUNK, move |tx| {
                        unlist_missing(tx, source, listed_before, after, &seen)
                    })
                    .await?;
                match next {
                    Some(last) => after = last,
                    None => break,
                }
            }
        }
        let total = *counts;
        self.write(move |tx| finish_source_run(tx, source, &run, total))
            .await
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

    /// Proxy counts per (status, scheme), every combination included, from
    /// the counts every write keeps (no table scan).
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
        self.read(move |c| count_seen_since(c, since)).await
    }

    /// Counts by status, scheme, country, failure reason and source.
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        self.read(stats).await
    }

    /// The counts of [`Store::stats`] without the sources: a read of a few
    /// rows kept up to date by every write, cheap enough for each API
    /// request whatever the number of proxies.
    pub async fn counts(&self) -> Result<Stats, StoreError> {
        self.read(counts).await
    }
}

/// The source's row id, creating the row on its first run, and when its
/// latest list was taken.
fn source_id(tx: &Connection, run: &SourceRun) -> Result<(i64, Option<i64>), StoreError> {
    Ok(tx.query_row(
        "INSERT INTO sources (name, url, format) VALUES (?1, ?2, ?3)
             ON CONFLICT (name) DO UPDATE SET url = excluded.url, format = excluded.format
             RETURNING id, listed_at",
        params![run.name, run.url, run.format],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?)
}

/// What a candidate finds in the store: its row, whether writing the
/// candidate's hints would change that row (and its country, which bumps
/// its change number), and the state of its link to the source.
struct Found {
    id: i64,
    changes: bool,
    country_changes: bool,
    /// Whether its scheme is still to be detected.
    detect: bool,
    /// `None` without a link, else whether the link is listed.
    listed: Option<bool>,
}

/// Columns read to decide whether a known proxy's row changes; see
/// [`found`] for their order.
const FOUND_COLUMNS: &str = "p.id, p.password, p.scheme_detect, p.country, p.country_source, \
    p.hint_anonymity, p.hint_https";

/// Compares a candidate with its stored row (as `FOUND_COLUMNS` and then
/// the link's `listed`) without copying the row.
fn found(row: &Row, c: &Candidate) -> rusqlite::Result<Found> {
    use rusqlite::types::ValueRef;
    let text = |i: usize| -> rusqlite::Result<Option<&str>> {
        match row.get_ref(i)? {
            ValueRef::Null => Ok(None),
            v => Ok(Some(v.as_str()?)),
        }
    };
    let password = c.proxy.auth.as_ref().map(|a| a.password.as_str());
    let detect: bool = row.get(2)?;
    let country = c.hints.country.as_ref().map(|c| c.as_str());
    let country_source = text(4)?;
    // The same rules as the update statement: a GeoIP country is what the
    // exit address really is, and a source's claim never overrides it.
    let country_changes =
        country_source != Some("geoip") && country.is_some() && text(3)? != country;
    let changes = country_changes
        || (password.is_some() && text(1)? != password)
        || (detect && !c.detect)
        || (country.is_some()
            && country_source != Some("geoip")
            && country_source != Some("source"))
        || (c.hints.anonymity.is_some() && text(5)? != c.hints.anonymity.map(Anonymity::as_str))
        || (c.hints.https.is_some() && row.get::<_, Option<bool>>(6)? != c.hints.https);
    Ok(Found {
        id: row.get(0)?,
        changes,
        country_changes,
        detect,
        listed: row.get(7)?,
    })
}

/// Writes one chunk of a source's candidates, linked to the source, and
/// returns the counts and the row id of every candidate.
fn upsert_candidates(
    tx: &Connection,
    source_id: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    if let Some(c) = candidates.iter().find(|c| c.proxy.port == 0) {
        return Err(unexpected(format!(
            "{}: port 0 is not a proxy's port",
            c.proxy
        )));
    }
    if addresses_repeat(candidates) {
        upsert_rowwise(tx, source_id, now, candidates)
    } else {
        upsert_batched(tx, source_id, now, candidates)
    }
}

/// Updates a known proxy from a candidate: `?1` id, `?2` password, `?3`
/// detect, `?4` country, `?5` anonymity, `?6` https, `?7` whether the row
/// takes a new change number.
const UPDATE_KNOWN: &str = "UPDATE proxies SET
                 password = coalesce(?2, password),
                 scheme_detect = min(scheme_detect, ?3),
                 country = CASE WHEN country_source = 'geoip' OR ?4 IS NULL
                                THEN country ELSE ?4 END,
                 country_source = CASE WHEN country_source = 'geoip' OR ?4 IS NULL
                                THEN country_source ELSE 'source' END,
                 hint_anonymity = coalesce(?5, hint_anonymity),
                 hint_https = coalesce(?6, hint_https),
                 changed_seq = CASE WHEN ?7 THEN (SELECT change_seq FROM meta) ELSE changed_seq END
             WHERE id = ?1";

/// Links a proxy to a source's latest list: `?1` proxy, `?2` source, `?3`
/// the list's time.
const LINK_SOURCE: &str =
    "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
             VALUES (?1, ?2, ?3, ?3, 1)
             ON CONFLICT (proxy_id, source_id) DO UPDATE SET
                 listed = 1, last_seen = max(last_seen, excluded.last_seen)";

/// Adds new proxies to the counts `/stats` reads (migration 0008): `?1`
/// scheme, `?2` country, `?3` how many. A new proxy is `unknown`, with no
/// checked anonymity and no failure reason.
const COUNT_NEW: &str = "INSERT INTO proxy_counts (status, scheme, country, anonymity, reason, n)
     VALUES ('unknown', ?1, coalesce(?2, ''), '', '', ?3)
     ON CONFLICT (status, scheme, country, anonymity, reason) DO UPDATE SET n = n + excluded.n";

/// True when two candidates of the chunk share an address (and user
/// name), whatever their schemes: one may then find or change the row the
/// other writes, which only the row-by-row path sees.
fn addresses_repeat(candidates: &[Candidate]) -> bool {
    // Sorting a chunk's addresses costs less than hashing them.
    let mut addresses: Vec<_> = candidates
        .iter()
        .map(|c| (c.proxy.host, c.proxy.port, c.proxy.username()))
        .collect();
    addresses.sort_unstable();
    addresses.windows(2).any(|w| w[0] == w[1])
}

/// Appends `ip` as text, as its `Display` writes it: an IPv4 address
/// without the formatting machinery, which cost more than a tenth of
/// storing a new proxy.
fn push_host(buf: &mut String, ip: std::net::IpAddr) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf.push('.');
                }
                if octet >= 100 {
                    buf.push(char::from(b'0' + octet / 100));
                }
                if octet >= 10 {
                    buf.push(char::from(b'0' + octet / 10 % 10));
                }
                buf.push(char::from(b'0' + octet % 10));
            }
        }
        std::net::IpAddr::V6(v6) => {
            std::fmt::Write::write_fmt(buf, format_args!("{v6}"))
                .expect("formatting an address into a String cannot fail");
        }
    }
}

/// Candidates per step of the batched path: one lookup statement (each
/// candidate brings one identity, three for a candidate whose scheme is to
/// be detected, of five parameters) and one insert of the new proxies (11
/// parameters each) and of their links.
const BATCH: usize = 64;

/// `n` groups of `group` placeholders: `(?,?),(?,?)`.
fn placeholders(n: usize, group: &str) -> String {
    let mut s = String::with_capacity(n * (group.len() + 1));
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(group);
    }
    s
}

/// A chunk's candidates with their addresses as text, which the lookup
/// and the insert bind.
struct Batched<'a> {
    candidates: &'a [Candidate],
    host_text: String,
    host_ends: Vec<usize>,
}

impl<'a> Batched<'a> {
    fn new(candidates: &'a [Candidate]) -> Self {
        // Every candidate's address as text, in one buffer.
        let mut host_text = String::with_capacity(candidates.len() * 16);
        let mut host_ends = Vec::with_capacity(candidates.len());
        for c in candidates {
            push_host(&mut host_text, c.proxy.host);
            host_ends.push(host_text.len());
        }
        Batched {
            candidates,
            host_text,
            host_ends,
        }
    }

    fn host(&self, at: usize) -> &str {
        let start = if at == 0 { 0 } else { self.host_ends[at - 1] };
        &self.host_text[start..self.host_ends[at]]
    }

    /// Finds what the store holds for the candidates in `range`, into
    /// `known` (one entry per candidate of the range). The source is
    /// written into the statement, not bound: SQLite compiles a statement
    /// again whenever a value bound in its WHERE clause changes, and that
    /// would be on every batch.
    fn lookup(
        &self,
        tx: &Connection,
        source_id: i64,
        range: std::ops::Range<usize>,
        known: &mut [Option<Found>],
    ) -> Result<(), StoreError> {
        let base = range.start;
        let batch = &self.candidates[range];
        let keys: usize = batch.iter().map(|c| if c.detect { 3 } else { 1 }).sum();
        let mut find = tx.prepare_cached(&format!(
            "SELECT {FOUND_COLUMNS}, ps.listed, k.column5
                 FROM (VALUES {}) k
                 CROSS JOIN proxies p ON p.scheme = k.column1 AND p.host = k.column2
                     AND p.port = k.column3 AND p.username = k.column4
                 LEFT JOIN proxy_sources ps ON ps.proxy_id = p.id AND ps.source_id = {source_id}",
            placeholders(keys, "(?,?,?,?,?)")
        ))?;
        let mut i = 1;
        for (j, c) in batch.iter().enumerate() {
            let schemes: &[Scheme] = if c.detect {
                &[Scheme::Http, Scheme::Socks4, Scheme::Socks5]
            } else {
                std::slice::from_ref(&c.proxy.scheme)
            };
            for s in schemes {
                find.raw_bind_parameter(i, s.as_str())?;
                find.raw_bind_parameter(i + 1, self.host(base + j))?;
                find.raw_bind_parameter(i + 2, c.proxy.port)?;
                find.raw_bind_parameter(i + 3, c.proxy.username())?;
                find.raw_bind_parameter(i + 4, j as i64)?;
                i += 5;
            }
        }
        let mut rows = find.raw_query();
        while let Some(r) = rows.next()? {
            let j = r.get::<_, i64>(8)? as usize;
            let f = found(r, &batch[j])?;
            // A candidate to detect is the row with a settled scheme
            // first, then the oldest: as `ORDER BY scheme_detect, id`.
            let better = match &known[j] {
                None => true,
                Some(old) => (f.detect, f.id) < (old.detect, old.id),
            };
            if better {
                known[j] = Some(f);
            }
        }
        Ok(())
    }

    /// Inserts the new proxies `rows` (a candidate's index and the id it
    /// takes) with `OR IGNORE`, and returns how many were written: a
    /// candidate whose identity is stored already is skipped. `OR IGNORE`
    /// also spares SQLite a statement journal for a statement that cannot
    /// fail halfway. What is the same for every row (the time) is written
    /// into the statement rather than bound, row after row.
    fn insert(
        &self,
        tx: &Connection,
        now: i64,
        rows: &[(usize, i64)],
    ) -> Result<usize, StoreError> {
        use rusqlite::ToSql;
        let mut insert = tx.prepare_cached(&format!(
            "INSERT OR IGNORE INTO proxies (id, scheme, host, port, username, password, scheme_detect,
                     country, country_source, hint_anonymity, hint_https,
                     first_seen, last_seen, next_check_at)
                 VALUES {}",
            placeholders(rows.len(), &format!("(?,?,?,?,?,?,?,?,?,?,?,{now},{now},{now})"))
        ))?;
        for (j, &(at, id)) in rows.iter().enumerate() {
            let c = &self.candidates[at];
            let country = c.hints.country.as_ref().map(|c| c.as_str());
            let values: [&dyn ToSql; 11] = [
                &id,
                &c.proxy.scheme.as_str(),
                &self.host(at),
                &c.proxy.port,
                &c.proxy.username(),
                &c.proxy.auth.as_ref().map(|a| a.password.as_str()),
                &c.detect,
                &country,
                &country.map(|_| "source"),
                &c.hints.anonymity.map(Anonymity::as_str),
                &c.hints.https,
            ];
            for (k, v) in values.iter().enumerate() {
                insert.raw_bind_parameter(j * 11 + k + 1, v)?;
            }
        }
        Ok(insert.raw_execute()?)
    }
}

/// Links the new proxies `fresh` (a candidate's index and its id) to the
/// source's latest list.
fn link_new(
    tx: &Connection,
    source_id: i64,
    now: i64,
    fresh: &[(usize, i64)],
) -> Result<(), StoreError> {
    if fresh.is_empty() {
        return Ok(());
    }
    let mut links = tx.prepare_cached(&format!(
        "INSERT OR IGNORE INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
             VALUES {}",
        placeholders(fresh.len(), &format!("(?,{source_id},{now},{now},1)"))
    ))?;
    for (j, (_, id)) in fresh.iter().enumerate() {
        links.raw_bind_parameter(j + 1, id)?;
    }
    let written = links.raw_execute()?;
    if written != fresh.len() {
        return Err(unexpected(format!(
            "wrote {written} of {} new links",
            fresh.len()
        )));
    }
    Ok(())
}

/// A candidate the store cannot take, or a write that the lookup before
/// it said could not happen: reported rather than lost.
fn unexpected(what: String) -> StoreError {
    StoreError::Sqlite(rusqlite::Error::ToSqlConversionFailure(what.into()))
}

/// Writes a chunk whose candidates all have distinct addresses, with a
/// few statements per batch of candidates instead of three per candidate:
/// the stored rows of a batch are found in one join, and new proxies and
/// their links go in multi-row inserts with ids assigned here (the next
/// after the largest, as SQLite would). After a batch of new proxies only,
/// the next batch is inserted before it is looked up (a list's new proxies
/// come in long runs) and looked up only if some of it was stored already;
/// the ids that batch set aside for those are left unused. The outcome is
/// that of [`upsert_rowwise`], which handles chunks where this does not
/// hold, but for those unused ids.
fn upsert_batched(
    tx: &Connection,
    source_id: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    let mut counts = UpsertCounts::default();
    let chunk = Batched::new(candidates);
    let mut next_id: i64 =
        tx.query_row("SELECT coalesce(max(id), 0) + 1 FROM proxies", [], |r| {
            r.get(0)
        })?;
    let mut ids = Vec::with_capacity(candidates.len());
    let mut bumped = false;
    // New proxies by (scheme, country), for the counts (a few keys, with
    // no hashing per candidate).
    let mut added: BTreeMap<(Scheme, Option<&str>), i64> = BTreeMap::new();
    let mut update = None;
    let mut link = None;
    let mut known: Vec<Option<Found>> = Vec::with_capacity(BATCH);
    let mut fresh: Vec<(usize, i64)> = Vec::with_capacity(BATCH);
    let mut only_new_before = false;
    for start in (0..candidates.len()).step_by(BATCH) {
        let range = start..(start + BATCH).min(candidates.len());
        let batch = &candidates[range.clone()];
        known.clear();
        known.resize_with(batch.len(), || None);
        fresh.clear();
        // A candidate to detect may be stored under another scheme, which
        // only the lookup finds.
        if only_new_before && !batch.iter().any(|c| c.detect) {
            let first = next_id;
            next_id += batch.len() as i64;
            fresh.extend(range.clone().zip(first..));
            let written = chunk.insert(tx, now, &fresh)?;
            if written < batch.len() {
                // Some were stored already: the rows holding the ids set
                // aside here are the new ones.
                chunk.lookup(tx, source_id, range.clone(), &mut known)?;
                for (j, k) in known.iter_mut().enumerate() {
                    match k {
                        Some(f) if f.id == first + j as i64 => *k = None,
                        Some(_) => {}
                        None => {
                            return Err(unexpected(format!(
                                "{} was neither stored nor written",
                                batch[j].proxy
                            )));
                        }
                    }
                }
                fresh.retain(|&(at, _)| known[at - start].is_none());
            }
        } else {
            chunk.lookup(tx, source_id, range.clone(), &mut known)?;
            for (j, k) in known.iter().enumerate() {
                if k.is_none() {
                    fresh.push((start + j, next_id));
                    next_id += 1;
                }
            }
            if !fresh.is_empty() {
                let written = chunk.insert(tx, now, &fresh)?;
                if written != fresh.len() {
                    return Err(unexpected(format!(
                        "wrote {written} of {} new proxies",
                        fresh.len()
                    )));
                }
            }
        }
        link_new(tx, source_id, now, &fresh)?;
        let mut fresh_at = fresh.iter();
        for (j, c) in batch.iter().enumerate() {
            let id = match &known[j] {
                Some(f) => {
                    if f.country_changes && !bumped {
                        super::checks::bump_change_seq(tx)?;
                        bumped = true;
                    }
                    if f.changes {
                        let update = match &mut update {
                            Some(u) => u,
                            None => update.insert(tx.prepare_cached(UPDATE_KNOWN)?),
                        };
                        update.execute(params![
                            f.id,
                            c.proxy.auth.as_ref().map(|a| a.password.as_str()),
                            c.detect,
                            c.hints.country.as_ref().map(|c| c.as_str()),
                            c.hints.anonymity.map(Anonymity::as_str),
                            c.hints.https,
                            f.country_changes
                        ])?;
                    }
                    if f.listed != Some(true) {
                        let link = match &mut link {
                            Some(l) => l,
                            None => link.insert(tx.prepare_cached(LINK_SOURCE)?),
                        };
                        link.execute(params![f.id, source_id, now])?;
                    }
                    f.id
                }
                None => {
                    let &(at, id) = fresh_at
                        .next()
                        .expect("every candidate not stored before was written");
                    debug_assert_eq!(at, start + j);
                    counts.new += 1;
                    *added
                        .entry((c.proxy.scheme, c.hints.country.as_ref().map(|c| c.as_str())))
                        .or_insert(0) += 1;
                    id
                }
            };
            ids.push(id);
            counts.found += 1;
        }
        only_new_before = fresh.len() == batch.len();
    }
    // No row this chunk added was updated after it (no address repeats),
    // so the counts of what it added can go in once, at the end.
    let mut count = tx.prepare_cached(COUNT_NEW)?;
    for ((scheme, country), n) in added {
        count.execute(params![scheme.as_str(), country, n])?;
    }
    Ok((counts, ids))
}

fn upsert_rowwise(
    tx: &Connection,
    source_id: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    let mut counts = UpsertCounts::default();
    let mut ids = Vec::with_capacity(candidates.len());
    // Bumped once, before the first row of the chunk whose country changes:
    // a country from the source changes what filters select. Rows that do
    // not change keep their change number.
    let mut bumped = false;
    let mut find = tx.prepare_cached(&format!(
        "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = ?5)
             FROM proxies p WHERE p.scheme = ?1 AND p.host = ?2 AND p.port = ?3 AND p.username = ?4"
    ))?;
    // An entry whose scheme is to be detected is the same proxy as any row
    // at its address, whatever scheme detection gave it. The scheme list
    // lets the identity index find those rows.
    let mut find_any = tx.prepare_cached(&format!(
        "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = ?4)
             FROM proxies p WHERE p.scheme IN ('http', 'socks4', 'socks5')
                 AND p.host = ?1 AND p.port = ?2 AND p.username = ?3
             ORDER BY p.scheme_detect, p.id LIMIT 1"
    ))?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO proxies (scheme, host, port, username, password, scheme_detect,
                 country, country_source, hint_anonymity, hint_https,
                 first_seen, last_seen, next_check_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, CASE WHEN ?7 IS NULL THEN NULL ELSE 'source' END,
                 ?8, ?9, ?10, ?10, ?10)",
    )?;
    let mut update = tx.prepare_cached(UPDATE_KNOWN)?;
    let mut link = tx.prepare_cached(LINK_SOURCE)?;
    let mut count_new = tx.prepare_cached(COUNT_NEW)?;
    let mut link_new = tx.prepare_cached(
        "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
             VALUES (?1, ?2, ?3, ?3, 1)",
    )?;
    let mut host = String::with_capacity(64);
    for c in candidates {
        let p = &c.proxy;
        host.clear();
        std::fmt::Write::write_fmt(&mut host, format_args!("{}", p.host))
            .expect("formatting an address into a String cannot fail");
        let password = p.auth.as_ref().map(|a| a.password.as_str());
        let country = c.hints.country.as_ref().map(|c| c.as_str());
        let anonymity = c.hints.anonymity.map(Anonymity::as_str);
        let known = if c.detect {
            find_any
                .query_row(params![host, p.port, p.username(), source_id], |r| {
                    found(r, c)
                })
                .optional()?
        } else {
            find.query_row(
                params![p.scheme.as_str(), host, p.port, p.username(), source_id],
                |r| found(r, c),
            )
            .optional()?
        };
        let (id, listed) = match known {
            Some(f) => {
                if f.country_changes && !bumped {
                    super::checks::bump_change_seq(tx)?;
                    bumped = true;
                }
                if f.changes {
                    update.execute(params![
                        f.id,
                        password,
                        c.detect,
                        country,
                        anonymity,
                        c.hints.https,
                        f.country_changes
                    ])?;
                }
                (f.id, f.listed == Some(true))
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
                let id = tx.last_insert_rowid();
                link_new.execute(params![id, source_id, now])?;
                // Counted at once: a later entry of this chunk may update
                // the row, and the update's trigger moves it in the counts.
                count_new.execute(params![p.scheme.as_str(), country, 1])?;
                (id, true)
            }
        };
        if !listed {
            link.execute(params![id, source_id, now])?;
        }
        ids.push(id);
        counts.found += 1;
    }
    Ok((counts, ids))
}

/// Unlists the source's links after proxy id `after` (a bounded page of
/// them) that the new list, `seen` (sorted ids), left out: they were last
/// seen at the source's previous list, `listed_before`. Returns where the
/// next page starts, or `None` when this was the last.
fn unlist_missing(
    tx: &Connection,
    source_id: i64,
    listed_before: i64,
    after: i64,
    seen: &[i64],
) -> Result<Option<i64>, StoreError> {
    let ids: Vec<i64> = tx
        .prepare_cached(
            "SELECT proxy_id FROM proxy_sources
                 WHERE source_id = ?1 AND listed = 1 AND proxy_id > ?2
                 ORDER BY proxy_id LIMIT ?3",
        )?
        .query_map(params![source_id, after, UNLIST_PAGE as i64], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut unlist = tx.prepare_cached(
        "UPDATE proxy_sources SET listed = 0, last_seen = max(last_seen, ?3)
             WHERE proxy_id = ?1 AND source_id = ?2",
    )?;
    let mut last_seen =
        tx.prepare_cached("UPDATE proxies SET last_seen = max(last_seen, ?2) WHERE id = ?1")?;
    for &id in &ids {
        if seen.binary_search(&id).is_err() {
            unlist.execute(params![id, source_id, listed_before])?;
            last_seen.execute(params![id, listed_before])?;
        }
    }
    Ok(match ids.last() {
        Some(&last) if ids.len() == UNLIST_PAGE => Some(last),
        _ => None,
    })
}

/// Distinct proxies listed at or after `since`: those the latest list of
/// a source taken since then names (counted from the links, each proxy
/// once), and any other whose own `last_seen` is that recent.
fn count_seen_since(c: &Connection, since: i64) -> Result<i64, StoreError> {
    let recent: Vec<i64> = c
        .prepare_cached("SELECT id FROM sources WHERE listed_at >= ?1 ORDER BY id")?
        .query_map([since], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    let mut n: i64 = 0;
    for (i, source) in recent.iter().enumerate() {
        n += if i == 0 {
            c.prepare_cached(
                "SELECT count(*) FROM proxy_sources WHERE source_id = ?1 AND listed = 1",
            )?
            .query_row([source], |r| r.get::<_, i64>(0))?
        } else {
            // Each proxy once: leave out those an earlier source lists.
            let earlier = serde_json::to_string(&recent[..i]).unwrap_or_else(|_| "[]".into());
            c.prepare_cached(
                "SELECT count(*) FROM proxy_sources a WHERE a.source_id = ?1 AND a.listed = 1
                     AND NOT EXISTS (SELECT 1 FROM proxy_sources b
                         WHERE b.proxy_id = a.proxy_id AND b.listed = 1
                           AND b.source_id IN (SELECT value FROM json_each(?2)))",
            )?
            .query_row(params![source, earlier], |r| r.get::<_, i64>(0))?
        };
    }
    let all = serde_json::to_string(&recent).unwrap_or_else(|_| "[]".into());
    n += c
        .prepare_cached(
            "SELECT count(*) FROM proxies p WHERE p.last_seen >= ?1
                 AND NOT EXISTS (SELECT 1 FROM proxy_sources ps
                     WHERE ps.proxy_id = p.id AND ps.listed = 1
                       AND ps.source_id IN (SELECT value FROM json_each(?2)))",
        )?
        .query_row(params![since, all], |r| r.get::<_, i64>(0))?;
    Ok(n)
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
                 listed_at = CASE WHEN ?5 > 0 THEN ?8 ELSE listed_at END,
                 last_private = ?9,
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
            run.error,
            run.started_at,
            run.private as i64
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
        "SELECT st.s, sc.s, (SELECT coalesce(sum(c.n), 0) FROM proxy_counts c
                              WHERE c.status = st.s AND c.scheme = sc.s)
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
                      WHERE ps.source_id = s.id AND p.status = 'alive'),
                    s.last_private
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
            last_private: r.get(14)?,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn stats(conn: &Connection) -> Result<Stats, StoreError> {
    Ok(Stats {
        sources: list_sources(conn)?,
        ..counts(conn)?
    })
}

/// The proxy counts of [`Stats`] (no sources), from the few rows of
/// `proxy_counts` that triggers keep exact (migration 0005): no scan of the
/// proxies table, whatever its size.
fn counts(conn: &Connection) -> Result<Stats, StoreError> {
    let mut stats = Stats::default();
    let mut stmt = conn.prepare_cached(
        "SELECT status, scheme, country, anonymity, reason, n FROM proxy_counts WHERE n > 0",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
            r.get::<_, i64>(5)?,
        ))
    })?;
    for row in rows {
        let (status, scheme, country, anonymity, reason, n) = row?;
        stats.total += n;
        let country = if country.is_empty() {
            "unknown".to_owned()
        } else {
            country
        };
        *stats.by_country.entry(country).or_default() += n;
        *stats.by_scheme.entry(scheme).or_default() += n;
        if status == "alive" && !anonymity.is_empty() {
            *stats.by_anonymity.entry(anonymity).or_default() += n;
        }
        if status == "dead" && !reason.is_empty() {
            *stats.by_reason.entry(reason).or_default() += n;
        }
        *stats.by_status.entry(status).or_default() += n;
    }
    for s in [Status::Unknown, Status::Alive, Status::Dead] {
        stats.by_status.entry(s.as_str().to_owned()).or_insert(0);
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::push_host;

    /// Links are keyed by source first (migration 0011): a query that
    /// wants one proxy's links looks them up source by source instead of
    /// reading every link, which on a store of millions would be per row.
    #[test]
    fn one_proxys_links_are_looked_up_not_scanned() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.db");
        let mut conn = rusqlite::Connection::open(&path).unwrap();
        super::super::migrate::apply(&mut conn, &path).unwrap();
        let statements = [
            format!(
                "SELECT {} FROM proxies p WHERE p.id = ?1",
                super::PROXY_COLUMNS
            ),
            super::super::checks::PURGE.to_owned(),
            "DELETE FROM proxy_sources WHERE source_id IN (SELECT id FROM sources)
                 AND proxy_id = ?1"
                .to_owned(),
        ];
        // A new link writes its one b-tree only.
        let indexes: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema
                 WHERE type = 'index' AND tbl_name = 'proxy_sources' AND sql IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(indexes, 0);
        for sql in statements {
            let mut explain = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let ones = vec![1; explain.parameter_count()];
            let plan: Vec<String> = explain
                .query_map(rusqlite::params_from_iter(ones), |r| r.get(3))
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert!(
                plan.iter()
                    .all(|step| !step.starts_with("SCAN ps")
                        && !step.starts_with("SCAN proxy_sources")),
                "{sql}\n{plan:#?}"
            );
            assert!(
                plan.iter()
                    .any(|step| step.contains("PRIMARY KEY (source_id=? AND proxy_id=?)")),
                "{sql}\n{plan:#?}"
            );
        }
    }

    /// The identity index holds addresses as `Display` writes them; a
    /// harvest that wrote them otherwise would store every proxy again.
    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let mut octets = vec![0u8, 1, 9, 10, 11, 99, 100, 101, 199, 200, 249, 250, 255];
        octets.extend((0..=255).step_by(7));
        let mut buf = String::new();
        for (i, &a) in octets.iter().enumerate() {
            let b = octets[(i + 3) % octets.len()];
            let ip = std::net::IpAddr::from([a, b, 255 - a, b / 2]);
            buf.clear();
            push_host(&mut buf, ip);
            assert_eq!(buf, ip.to_string());
        }
        for text in ["2001:db8::1", "::ffff:1.2.3.4", "fe80::1:2:3:4"] {
            let ip: std::net::IpAddr = text.parse().unwrap();
            buf.clear();
            push_host(&mut buf, ip);
            assert_eq!(buf, ip.to_string());
        }
    }
}
