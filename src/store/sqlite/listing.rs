//! SQLite: filtered listings, pages and counts.

use std::collections::HashMap;

use rusqlite::Connection;

use super::Sqlite;
use super::rows::{
    PROXY_COLUMNS, PROXY_COLUMNS_OWN, attach_sources, proxies_by_ids, proxy_from_row,
};
use crate::store::{
    Page, Presence, ProxyFilter, ProxyRecord, ProxySort, SourceRecord, Stats, StoreError,
};

impl ProxyFilter {
    /// The `WHERE` clause (over `proxies p`) and its arguments.
    pub(super) fn sql(&self) -> (String, Vec<rusqlite::types::Value>) {
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
        any_of("p.anonymity", self.anonymity_levels(), &mut args);
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

impl Sqlite {
    pub(crate) async fn list_proxies(
        &self,
        filter: ProxyFilter,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        self.read(move |c| list_proxies(c, &filter)).await
    }

    pub(crate) async fn list_proxies_after(
        &self,
        filter: ProxyFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        self.read(move |c| list_proxies_after(c, &filter, after, limit))
            .await
    }

    pub(crate) async fn list_page(
        &self,
        filter: ProxyFilter,
        sort: ProxySort,
        limit: usize,
        offset: usize,
    ) -> Result<Page, StoreError> {
        self.read(move |c| list_page(c, &filter, sort, limit, offset))
            .await
    }

    pub(crate) async fn proxies_by_ids(
        &self,
        ids: Vec<i64>,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        self.read(move |c| proxies_by_ids(c, &ids)).await
    }

    pub(crate) async fn count_by_status_scheme(
        &self,
    ) -> Result<Vec<(String, String, i64)>, StoreError> {
        self.read(count_by_status_scheme).await
    }

    pub(crate) async fn presence(&self) -> Result<Presence, StoreError> {
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

    pub(crate) async fn list_sources(&self) -> Result<Vec<SourceRecord>, StoreError> {
        self.read(list_sources).await
    }

    pub(crate) async fn source_runs(&self) -> Result<Vec<SourceRecord>, StoreError> {
        self.read(|c| source_rows(c, &HashMap::new())).await
    }

    pub(crate) async fn count_seen_since(&self, since: i64) -> Result<i64, StoreError> {
        self.read(move |c| count_seen_since(c, since)).await
    }

    pub(crate) async fn stats(&self) -> Result<Stats, StoreError> {
        self.read(stats).await
    }

    pub(crate) async fn counts(&self) -> Result<Stats, StoreError> {
        self.read(counts).await
    }
}

/// Distinct proxies listed at or after `since`: those the latest list of
/// a source taken since then names, and any other whose own `last_seen` is
/// that recent, each proxy once. Every set comes out of its b-tree in id
/// order, so one merge of the sorted streams counts their union: a probe of
/// the links for every recently seen proxy (what an anti-join costs here)
/// was a fifth of a harvest of a million new proxies.
fn count_seen_since(c: &Connection, since: i64) -> Result<i64, StoreError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let recent: Vec<i64> = c
        .prepare_cached("SELECT id FROM sources WHERE listed_at >= ?1 ORDER BY id")?
        .query_map([since], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    // One statement per stream: they step side by side.
    let mut own = c.prepare_cached("SELECT id FROM proxies WHERE last_seen >= ?1 ORDER BY id")?;
    let mut listed = recent
        .iter()
        .map(|_| {
            c.prepare_cached(
                "SELECT proxy_id FROM proxy_sources WHERE source_id = ?1 AND listed = 1
                     ORDER BY proxy_id",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    fn id(r: &rusqlite::Row) -> rusqlite::Result<i64> {
        r.get(0)
    }
    let mut streams = Vec::with_capacity(1 + recent.len());
    streams.push(own.query_map([since], id)?);
    for (stmt, source) in listed.iter_mut().zip(&recent) {
        streams.push(stmt.query_map([source], id)?);
    }
    let mut heads = BinaryHeap::with_capacity(streams.len());
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(id) = s.next().transpose()? {
            heads.push(Reverse((id, i)));
        }
    }
    let mut n: i64 = 0;
    let mut last = None;
    while let Some(Reverse((id, i))) = heads.pop() {
        if last != Some(id) {
            n += 1;
            last = Some(id);
        }
        if let Some(next) = streams[i].next().transpose()? {
            heads.push(Reverse((next, i)));
        }
    }
    Ok(n)
}

fn list_proxies(conn: &Connection, filter: &ProxyFilter) -> Result<Vec<ProxyRecord>, StoreError> {
    let (clause, args) = filter.sql();
    // One snapshot for the proxies and their links.
    let tx = conn.unchecked_transaction()?;
    let mut stmt = tx.prepare(&format!(
        "SELECT {PROXY_COLUMNS_OWN} FROM proxies p WHERE {clause} ORDER BY p.id"
    ))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), proxy_from_row)?;
    let mut records = rows.collect::<Result<Vec<_>, _>>()?;
    attach_sources(&tx, &mut records)?;
    Ok(records)
}

fn list_proxies_after(
    conn: &Connection,
    filter: &ProxyFilter,
    after: i64,
    limit: usize,
) -> Result<Vec<ProxyRecord>, StoreError> {
    let (clause, mut args) = filter.sql();
    args.push(rusqlite::types::Value::Integer(after));
    args.push(rusqlite::types::Value::Integer(
        i64::try_from(limit).unwrap_or(i64::MAX),
    ));
    let n = args.len();
    let tx = conn.unchecked_transaction()?;
    let mut stmt = tx.prepare(&format!(
        "SELECT {PROXY_COLUMNS_OWN} FROM proxies p WHERE {clause} AND p.id > ?{} ORDER BY p.id \
         LIMIT ?{n}",
        n - 1
    ))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args), proxy_from_row)?;
    let mut records = rows.collect::<Result<Vec<_>, _>>()?;
    attach_sources(&tx, &mut records)?;
    Ok(records)
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
    // One snapshot for the sources and the counts of their links.
    let tx = conn.unchecked_transaction()?;
    sources_in(&tx)
}

/// Every source with the counts of its links, read in the transaction the
/// caller holds.
fn sources_in(tx: &Connection) -> Result<Vec<SourceRecord>, StoreError> {
    let counts = link_counts(tx)?;
    source_rows(tx, &counts)
}

/// Every source's record, with its counts from `counts` (by source id;
/// zero for a source not in it).
fn source_rows(
    tx: &Connection,
    counts: &HashMap<i64, (i64, i64, i64)>,
) -> Result<Vec<SourceRecord>, StoreError> {
    let mut stmt = tx.prepare(
        "SELECT s.name, s.url, s.format, s.last_fetch_at, s.last_ok_at, s.last_http_status,
                    s.last_duration_ms, s.last_found, s.last_new, s.last_error,
                    s.fetches_total, s.fetches_failed, s.id, s.last_private
             FROM sources s
             ORDER BY s.name",
    )?;
    let rows = stmt.query_map([], |r| {
        let id: i64 = r.get(12)?;
        let (proxies, alive, unique) = counts.get(&id).copied().unwrap_or_default();
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
            proxies,
            alive,
            last_private: r.get(13)?,
            unique,
        })
    })?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

/// Per source id: the proxies it lists, those of them alive, and those no
/// other source lists. Every source's links and the alive proxies come out
/// of their b-trees in proxy order, so one merge of the sorted streams
/// counts all three in a pass over the links; the joins and the grouping
/// of every link by proxy this replaces took seconds at a million links.
fn link_counts(
    c: &Connection,
) -> Result<std::collections::HashMap<i64, (i64, i64, i64)>, StoreError> {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let sources: Vec<i64> = c
        .prepare_cached("SELECT id FROM sources ORDER BY id")?
        .query_map([], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    fn id(r: &rusqlite::Row) -> rusqlite::Result<i64> {
        r.get(0)
    }
    // The literal status lets the partial index of alive and dead proxies
    // serve the stream.
    let mut alive_stmt =
        c.prepare_cached("SELECT id FROM proxies WHERE status = 'alive' ORDER BY id")?;
    let mut alive = alive_stmt.query_map([], id)?;
    let mut link_stmts = sources
        .iter()
        .map(|_| {
            c.prepare_cached(
                "SELECT proxy_id FROM proxy_sources WHERE source_id = ?1 ORDER BY proxy_id",
            )
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut streams = Vec::with_capacity(sources.len());
    for (stmt, source) in link_stmts.iter_mut().zip(&sources) {
        streams.push(stmt.query_map([source], id)?);
    }
    let mut heads = BinaryHeap::with_capacity(streams.len());
    for (i, s) in streams.iter_mut().enumerate() {
        if let Some(id) = s.next().transpose()? {
            heads.push(Reverse((id, i)));
        }
    }
    let mut counts = vec![(0i64, 0i64, 0i64); sources.len()];
    let mut next_alive = alive.next().transpose()?;
    let mut listing = Vec::new();
    while let Some(Reverse((proxy, _))) = heads.peek().copied() {
        // Every source listing this proxy.
        listing.clear();
        while let Some(&Reverse((p, i))) = heads.peek() {
            if p != proxy {
                break;
            }
            heads.pop();
            listing.push(i);
            if let Some(next) = streams[i].next().transpose()? {
                heads.push(Reverse((next, i)));
            }
        }
        while next_alive.is_some_and(|a| a < proxy) {
            next_alive = alive.next().transpose()?;
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

/// The counts and the sources, read in one snapshot: what one answer
/// shows never mixes two moments.
fn stats(conn: &Connection) -> Result<Stats, StoreError> {
    let tx = conn.unchecked_transaction()?;
    Ok(Stats {
        sources: sources_in(&tx)?,
        ..counts(&tx)?
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
        stats.add_count(row?);
    }
    stats.by_status_complete();
    Ok(stats)
}
