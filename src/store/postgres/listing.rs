//! PostgreSQL: proxy records, filtered listings, pages, sources and the
//! counts for `stats`.

use std::collections::HashMap;

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::Postgres;
use crate::proxy::{Country, Credentials, Proxy, Scheme, Status};
use crate::store::{
    Page, Presence, ProxyFilter, ProxyRecord, ProxySort, SourceRecord, Stats, StoreError,
};

/// A proxy's columns in [`proxy_from_row`]'s order, over `proxies p`.
pub(super) const PROXY_COLUMNS: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
    p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, \
    greatest(p.last_seen, coalesce((SELECT max(s.listed_at) FROM sources s \
       JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id \
       WHERE ps.listed), 0)), \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, \
    (SELECT string_agg(s.name, E'\\n') FROM sources s \
       JOIN proxy_sources ps ON ps.source_id = s.id AND ps.proxy_id = p.id), p.failed_in_use_at";

/// [`PROXY_COLUMNS`] without the two lookups in a proxy's links: its own
/// `last_seen` and no sources, for [`attach_sources`] to complete with one
/// query for the links of every record rather than two per record.
const PROXY_COLUMNS_OWN: &str = "p.id, p.scheme, p.host, p.port, p.username, p.password, \
    p.scheme_detect, p.status, p.country, p.country_source, p.anonymity, p.https, \
    p.latency_ms, p.exit_ip, p.last_checked, p.last_alive, p.first_seen, p.last_seen, \
    p.last_reason, p.hint_anonymity, p.hint_https, p.checks_total, p.checks_ok, \
    p.consecutive_failures, p.next_check_at, NULL::text, p.failed_in_use_at";

/// Completes records read with [`PROXY_COLUMNS_OWN`] (in the same
/// snapshot) as [`PROXY_COLUMNS`] reads them: each record's sources, and
/// its `last_seen` raised to the latest list of a source that still lists
/// it.
async fn attach_sources(
    c: &impl GenericClient,
    records: &mut [ProxyRecord],
) -> Result<(), StoreError> {
    if records.is_empty() {
        return Ok(());
    }
    let at: std::collections::HashMap<i64, usize> =
        records.iter().enumerate().map(|(i, r)| (r.id, i)).collect();
    let ids: Vec<i64> = records.iter().map(|r| r.id).collect();
    let (low, high) = ids
        .iter()
        .fold((i64::MAX, i64::MIN), |(l, h), &id| (l.min(id), h.max(id)));
    // Links are keyed by (source, proxy). Records close together in id (a
    // page of an export) are read as one range per source, which costs the
    // links in that range; scattered records as one probe per source and
    // record, which costs the same whatever the range. A range over more
    // than a few times as many ids as there are records reads the links of
    // proxies not asked for, so it takes the probes; the map above skips
    // the links of proxies in the range but not in the records. Links are
    // keyed by source first (there is no index by proxy): the sources are
    // named in the condition, so that each read is index ranges of the
    // primary key whatever the planner's statistics say (without it, a
    // table not yet analyzed got a scan of every link for each page of an
    // export).
    let span = u64::try_from(high.saturating_sub(low)).unwrap_or(u64::MAX);
    let links = if span < 4 * ids.len() as u64 {
        c.query(
            "SELECT ps.proxy_id, s.name, ps.listed, s.listed_at
               FROM proxy_sources ps JOIN sources s ON s.id = ps.source_id
              WHERE ps.source_id = ANY (ARRAY(SELECT id FROM sources))
                AND ps.proxy_id BETWEEN $1 AND $2",
            &[&low, &high],
        )
        .await?
    } else {
        c.query(
            "SELECT ps.proxy_id, s.name, ps.listed, s.listed_at
               FROM proxy_sources ps JOIN sources s ON s.id = ps.source_id
              WHERE ps.source_id = ANY (ARRAY(SELECT id FROM sources))
                AND ps.proxy_id = ANY($1::bigint[])",
            &[&ids],
        )
        .await?
    };
    for l in links {
        let Some(&i) = at.get(&l.try_get::<_, i64>(0)?) else {
            continue;
        };
        let r = &mut records[i];
        r.sources.push(l.try_get(1)?);
        let listed_at: Option<i64> = l.try_get(3)?;
        if let (true, Some(t)) = (l.try_get::<_, bool>(2)?, listed_at) {
            r.last_seen = r.last_seen.max(t);
        }
    }
    for r in records.iter_mut() {
        r.sources.sort();
    }
    Ok(())
}

/// A text column as an enum; a value we did not write is an error that
/// names it, not a panic.
fn parse_col<T: std::str::FromStr<Err = crate::proxy::ParseError>>(
    row: &Row,
    idx: usize,
) -> Result<Option<T>, StoreError> {
    let v: Option<String> = row.try_get(idx)?;
    v.map(|s| {
        s.parse::<T>().map_err(|e| {
            StoreError::Database(crate::store::DbError::unexpected(format!(
                "column {idx} holds {s:?}: {e}"
            )))
        })
    })
    .transpose()
}

pub(super) fn proxy_from_row(row: &Row) -> Result<ProxyRecord, StoreError> {
    let host: String = row.try_get(2)?;
    let host = host.parse().map_err(|e: std::net::AddrParseError| {
        StoreError::Database(crate::store::DbError::unexpected(format!(
            "host {host:?}: {e}"
        )))
    })?;
    let port: i32 = row.try_get(3)?;
    let username: String = row.try_get(4)?;
    let password: Option<String> = row.try_get(5)?;
    let sources: Option<String> = row.try_get(25)?;
    Ok(ProxyRecord {
        id: row.try_get(0)?,
        proxy: Proxy {
            scheme: parse_col(row, 1)?.unwrap_or(Scheme::Http),
            host,
            port: u16::try_from(port).unwrap_or(0),
            auth: (!username.is_empty()).then(|| Credentials {
                username,
                password: password.unwrap_or_default(),
            }),
        },
        scheme_detect: row.try_get(6)?,
        status: parse_col(row, 7)?.unwrap_or(Status::Unknown),
        country: row
            .try_get::<_, Option<String>>(8)?
            .as_deref()
            .and_then(Country::parse),
        country_source: row.try_get(9)?,
        anonymity: parse_col(row, 10)?,
        https: row.try_get(11)?,
        latency_ms: row.try_get(12)?,
        exit_ip: row.try_get(13)?,
        last_checked: row.try_get(14)?,
        last_alive: row.try_get(15)?,
        first_seen: row.try_get(16)?,
        last_seen: row.try_get(17)?,
        reason: row.try_get(18)?,
        hint_anonymity: parse_col(row, 19)?,
        hint_https: row.try_get(20)?,
        checks_total: row.try_get(21)?,
        checks_ok: row.try_get(22)?,
        consecutive_failures: row.try_get(23)?,
        next_check_at: row.try_get(24)?,
        sources: sources
            .map(|s| {
                let mut v: Vec<String> = s.split('\n').map(str::to_owned).collect();
                v.sort();
                v
            })
            .unwrap_or_default(),
        failed_in_use_at: row.try_get(26)?,
    })
}

/// The proxies with these ids, by id (missing ids are skipped).
pub(super) async fn proxies_by_ids(
    c: &impl GenericClient,
    ids: &[i64],
) -> Result<Vec<ProxyRecord>, StoreError> {
    let rows = c
        .query(
            &format!("SELECT {PROXY_COLUMNS} FROM proxies p WHERE p.id = ANY($1) ORDER BY p.id"),
            &[&ids],
        )
        .await?;
    rows.iter().map(proxy_from_row).collect()
}

pub(super) type Args = Vec<Box<dyn ToSql + Sync + Send>>;

/// The `WHERE` clause (over `proxies p`) of `filter` and its arguments.
pub(super) fn filter_sql(f: &ProxyFilter) -> (String, Args) {
    let mut sql = String::from("true");
    let mut args: Args = Vec::new();
    let arg = |v: Box<dyn ToSql + Sync + Send>, args: &mut Args| {
        args.push(v);
        format!("${}", args.len())
    };
    if let Some(s) = f.status {
        let a = arg(Box::new(s.as_str().to_owned()), &mut args);
        sql.push_str(&format!(" AND p.status = {a}"));
    }
    let mut any_of = |column: &str, values: Vec<String>, args: &mut Args| {
        if !values.is_empty() {
            let a = arg(Box::new(values), args);
            sql.push_str(&format!(" AND {column} = ANY({a}::text[])"));
        }
    };
    any_of(
        "p.country",
        f.countries.iter().map(|c| c.to_string()).collect(),
        &mut args,
    );
    any_of(
        "p.scheme",
        f.schemes.iter().map(|s| s.as_str().to_owned()).collect(),
        &mut args,
    );
    any_of("p.anonymity", f.anonymity_levels(), &mut args);
    if f.https {
        sql.push_str(" AND p.https");
    }
    if let Some(max) = f.max_latency_ms {
        let a = arg(Box::new(max), &mut args);
        sql.push_str(&format!(" AND p.latency_ms <= {a}"));
    }
    if let Some(since) = f.alive_since {
        let a = arg(Box::new(since), &mut args);
        sql.push_str(&format!(" AND p.last_alive >= {a}"));
    }
    if !f.exclude_ids.is_empty() {
        let a = arg(Box::new(f.exclude_ids.clone()), &mut args);
        sql.push_str(&format!(" AND NOT (p.id = ANY({a}::bigint[]))"));
    }
    if !f.exclude_addrs.is_empty() {
        let hosts: Vec<String> = f.exclude_addrs.iter().map(|a| a.ip().to_string()).collect();
        let ports: Vec<i32> = f
            .exclude_addrs
            .iter()
            .map(|a| i32::from(a.port()))
            .collect();
        let h = arg(Box::new(hosts), &mut args);
        let p = arg(Box::new(ports), &mut args);
        sql.push_str(&format!(
            " AND NOT EXISTS (SELECT 1 FROM unnest({h}::text[], {p}::integer[]) x(host, port)
                   WHERE x.host = p.host AND x.port = p.port)"
        ));
    }
    (sql, args)
}

pub(super) fn refs(args: &Args) -> Vec<&(dyn ToSql + Sync)> {
    args.iter()
        .map(|a| a.as_ref() as &(dyn ToSql + Sync))
        .collect()
}

impl Postgres {
    pub(crate) async fn list_proxies(
        &self,
        filter: ProxyFilter,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        let (clause, args) = filter_sql(&filter);
        self.proxies_with_sources(
            &format!("SELECT {PROXY_COLUMNS_OWN} FROM proxies p WHERE {clause} ORDER BY p.id"),
            &args,
        )
        .await
    }

    pub(crate) async fn list_proxies_after(
        &self,
        filter: ProxyFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        let (clause, mut args) = filter_sql(&filter);
        args.push(Box::new(after));
        args.push(Box::new(i64::try_from(limit).unwrap_or(i64::MAX)));
        let n = args.len();
        self.proxies_with_sources(
            &format!(
                "SELECT {PROXY_COLUMNS_OWN} FROM proxies p WHERE {clause} AND p.id > ${}
                 ORDER BY p.id LIMIT ${n}",
                n - 1
            ),
            &args,
        )
        .await
    }

    /// The proxies `sql` selects, with their sources, read in one snapshot.
    async fn proxies_with_sources(
        &self,
        sql: &str,
        args: &Args,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        let rows = tx.query(sql, &refs(args)).await?;
        let mut records = rows
            .iter()
            .map(proxy_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        drop(rows);
        attach_sources(&tx, &mut records).await?;
        tx.commit().await?;
        Ok(records)
    }

    pub(crate) async fn list_page(
        &self,
        filter: ProxyFilter,
        sort: ProxySort,
        limit: usize,
        offset: usize,
    ) -> Result<Page, StoreError> {
        let (clause, mut args) = filter_sql(&filter);
        let c = self.client().await?;
        let total: i64 = c
            .query_one(
                &format!("SELECT count(*) FROM proxies p WHERE {clause}"),
                &refs(&args),
            )
            .await?
            .get(0);
        let order = match sort {
            ProxySort::Id => "p.id",
            ProxySort::Latency => "p.latency_ms IS NULL, p.latency_ms, p.id",
            ProxySort::LastChecked => "p.last_checked IS NULL, p.last_checked DESC, p.id",
            ProxySort::Uptime => {
                "CASE WHEN p.checks_total = 0 THEN 0.0
                      ELSE p.checks_ok::double precision / p.checks_total END DESC, p.id"
            }
        };
        args.push(Box::new(limit as i64));
        args.push(Box::new(i64::try_from(offset).unwrap_or(i64::MAX)));
        let n = args.len();
        let rows = c
            .query(
                &format!(
                    "SELECT {PROXY_COLUMNS} FROM proxies p WHERE {clause} ORDER BY {order}
                     LIMIT ${} OFFSET ${n}",
                    n - 1
                ),
                &refs(&args),
            )
            .await?;
        Ok(Page {
            total,
            proxies: rows.iter().map(proxy_from_row).collect::<Result<_, _>>()?,
        })
    }

    pub(crate) async fn proxies_by_ids(
        &self,
        ids: Vec<i64>,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        proxies_by_ids(&self.client().await?, &ids).await
    }

    pub(crate) async fn count_by_status_scheme(
        &self,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        // One scan, where a count per pair would take nine.
        let rows = self
            .client()
            .await?
            .query(
                "SELECT status, scheme, count(*) FROM proxies GROUP BY status, scheme",
                &[],
            )
            .await?;
        let mut stats = Stats::default();
        for r in &rows {
            let (status, scheme, n): (String, String, i64) = (r.get(0), r.get(1), r.get(2));
            stats.by_status_scheme.insert((status, scheme), n);
        }
        Ok(stats.by_status_and_scheme())
    }

    pub(crate) async fn list_sources(&self) -> Result<Vec<SourceRecord>, StoreError> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        let sources = sources_in(&tx).await?;
        tx.commit().await?;
        Ok(sources)
    }

    pub(crate) async fn source_runs(&self) -> Result<Vec<SourceRecord>, StoreError> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        let sources = source_rows(&tx, &HashMap::new()).await?;
        tx.commit().await?;
        Ok(sources)
    }

    pub(crate) async fn presence(&self) -> Result<Presence, StoreError> {
        let r = self
            .client()
            .await?
            .query_one(
                "SELECT EXISTS (SELECT 1 FROM proxies),
                        EXISTS (SELECT 1 FROM proxies WHERE status IN ('alive', 'dead'))",
                &[],
            )
            .await?;
        Ok(Presence {
            stored: r.get(0),
            checked: r.get(1),
        })
    }

    pub(crate) async fn count_seen_since(&self, since: i64) -> Result<i64, StoreError> {
        let row = self
            .client()
            .await?
            .query_one(
                "SELECT count(*) FROM proxies p WHERE p.last_seen >= $1
                     OR EXISTS (SELECT 1 FROM proxy_sources ps JOIN sources s ON s.id = ps.source_id
                                WHERE ps.proxy_id = p.id AND ps.listed AND s.listed_at >= $1)",
                &[&since],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Counted from the table: PostgreSQL aggregates it in one scan.
    pub(crate) async fn counts(&self) -> Result<Stats, StoreError> {
        counts_in(&self.client().await?).await
    }

    /// The counts and the sources, read in one snapshot: what one answer
    /// shows never mixes two moments.
    pub(crate) async fn stats(&self) -> Result<Stats, StoreError> {
        let mut c = self.client().await?;
        let tx = snapshot(&mut c).await?;
        let counts = counts_in(&tx).await?;
        let sources = sources_in(&tx).await?;
        tx.commit().await?;
        Ok(Stats { sources, ..counts })
    }
}

/// A read-only transaction on one snapshot of the store (repeatable
/// read), so that what one answer reads never mixes two moments.
async fn snapshot(
    c: &mut deadpool_postgres::Object,
) -> Result<deadpool_postgres::Transaction<'_>, StoreError> {
    Ok(c.build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?)
}

async fn counts_in(c: &impl GenericClient) -> Result<Stats, StoreError> {
    let rows = c
        .query(
            "SELECT status, scheme, coalesce(country, ''), coalesce(anonymity, ''),
                    coalesce(last_reason, ''), count(*)
             FROM proxies GROUP BY 1, 2, 3, 4, 5",
            &[],
        )
        .await?;
    let mut stats = Stats::default();
    for r in rows {
        stats.add_count((r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)));
    }
    stats.by_status_complete();
    Ok(stats)
}

/// Every source with the counts of its links, in the transaction `tx`.
async fn sources_in(tx: &tokio_postgres::Transaction<'_>) -> Result<Vec<SourceRecord>, StoreError> {
    let counts = link_counts(tx).await?;
    source_rows(tx, &counts).await
}

/// Every source's record, with its counts from `counts` (by source id;
/// zero for a source not in it).
async fn source_rows(
    c: &tokio_postgres::Transaction<'_>,
    counts: &HashMap<i64, (i64, i64, i64)>,
) -> Result<Vec<SourceRecord>, StoreError> {
    let rows = c
        .query(
            "SELECT s.name, s.url, s.format, s.last_fetch_at, s.last_ok_at, s.last_http_status,
                    s.last_duration_ms, s.last_found, s.last_new, s.last_error,
                    s.fetches_total, s.fetches_failed, s.id, s.last_private
             FROM sources s
             ORDER BY s.name",
            &[],
        )
        .await?;
    rows.iter()
        .map(|r| {
            let id: i64 = r.try_get(12)?;
            let (proxies, alive, unique) = counts.get(&id).copied().unwrap_or_default();
            Ok(SourceRecord {
                name: r.try_get(0)?,
                url: r.try_get(1)?,
                format: r.try_get(2)?,
                last_fetch_at: r.try_get(3)?,
                last_ok_at: r.try_get(4)?,
                last_http_status: r.try_get(5)?,
                last_duration_ms: r.try_get(6)?,
                last_found: r.try_get(7)?,
                last_new: r.try_get(8)?,
                last_error: r.try_get(9)?,
                fetches_total: r.try_get(10)?,
                fetches_failed: r.try_get(11)?,
                proxies,
                alive,
                last_private: r.try_get(13)?,
                unique,
            })
        })
        .collect()
}

/// Ids read per round trip by [`Ids`].
const IDS_BATCH: i64 = 20_000;

/// The ids a query yields in order, a batch at a time, each batch one
/// array (a row per id cost more to decode than the merge that reads
/// them): the statement takes the last id read (`$1`), the batch's size
/// (`$2`) and the stream's key (`$3`, when it has one), and answers one
/// `bigint[]` of the next ids in order, or NULL past the end. Several are
/// read side by side in one transaction.
struct Ids<'t, 'c> {
    tx: &'t tokio_postgres::Transaction<'c>,
    statement: tokio_postgres::Statement,
    key: Option<i64>,
    after: i64,
    batch: std::vec::IntoIter<i64>,
    done: bool,
}

impl<'t, 'c> Ids<'t, 'c> {
    async fn open(
        tx: &'t tokio_postgres::Transaction<'c>,
        sql: &str,
        key: Option<i64>,
    ) -> Result<Ids<'t, 'c>, StoreError> {
        let statement = tx.prepare(sql).await?;
        Ok(Ids {
            tx,
            statement,
            key,
            after: i64::MIN,
            batch: Vec::new().into_iter(),
            done: false,
        })
    }

    async fn next(&mut self) -> Result<Option<i64>, StoreError> {
        loop {
            if let Some(id) = self.batch.next() {
                self.after = id;
                return Ok(Some(id));
            }
            if self.done {
                return Ok(None);
            }
            let row = match self.key {
                Some(key) => {
                    self.tx
                        .query_one(&self.statement, &[&self.after, &IDS_BATCH, &key])
                        .await?
                }
                None => {
                    self.tx
                        .query_one(&self.statement, &[&self.after, &IDS_BATCH])
                        .await?
                }
            };
            let ids: Vec<i64> = row.try_get::<_, Option<Vec<i64>>>(0)?.unwrap_or_default();
            self.done = ids.len() < IDS_BATCH as usize;
            self.batch = ids.into_iter();
        }
    }
}

/// Per source id: the proxies it lists, those of them alive, and those no
/// other source lists, as SQLite counts them: each source's links (its
/// primary key's order) and the alive proxies are read in proxy order and
/// merged in one pass, with no grouping of every link by proxy (a hash
/// aggregate of a million links took about 20 seconds).
async fn link_counts(
    tx: &tokio_postgres::Transaction<'_>,
) -> Result<std::collections::HashMap<i64, (i64, i64, i64)>, StoreError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let sources: Vec<i64> = tx
        .query("SELECT id FROM sources ORDER BY id", &[])
        .await?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    let mut alive = Ids::open(
        tx,
        "SELECT array_agg(id ORDER BY id) FROM (
             SELECT id FROM proxies WHERE status = 'alive' AND id > $1 ORDER BY id LIMIT $2
         ) batch",
        None,
    )
    .await?;
    let mut streams = Vec::with_capacity(sources.len());
    for source in &sources {
        streams.push(
            Ids::open(
                tx,
                "SELECT array_agg(proxy_id ORDER BY proxy_id) FROM (
                     SELECT proxy_id FROM proxy_sources
                     WHERE source_id = $3 AND proxy_id > $1 ORDER BY proxy_id LIMIT $2
                 ) batch",
                Some(*source),
            )
            .await?,
        );
    }
    let mut heads = BinaryHeap::with_capacity(streams.len());
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(id) = s.next().await? {
            heads.push(Reverse((id, i)));
        }
    }
    let mut counts = vec![(0i64, 0i64, 0i64); sources.len()];
    let mut next_alive = alive.next().await?;
    let mut listing = Vec::new();
    while let Some(Reverse((proxy, _))) = heads.peek().copied() {
        // A million links are merged on the runtime's workers, between
        // reads that come back at once: without a turn now and then for
        // the tasks waiting behind it, `/proxy` answers queued for tens of
        // milliseconds while a count ran (at start-up, after each round).
        tokio::task::coop::consume_budget().await;
        // Every source listing this proxy.
        listing.clear();
        while let Some(&Reverse((p, i))) = heads.peek() {
            if p != proxy {
                break;
            }
            heads.pop();
            listing.push(i);
            if let Some(next) = streams[i].next().await? {
                heads.push(Reverse((next, i)));
            }
        }
        while next_alive.is_some_and(|a| a < proxy) {
            next_alive = alive.next().await?;
        }
        let is_alive = next_alive == Some(proxy);
        for &i in &listing {
            counts[i].0 += 1;
            counts[i].1 += i64::from(is_alive);
            counts[i].2 += i64::from(listing.len() == 1);
        }
    }
    Ok(sources.into_iter().zip(counts).collect())
}
