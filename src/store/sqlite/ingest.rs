//! SQLite: a source run written in bounded transactions (known proxies
//! updated only where something changed, new ones inserted and counted, links
//! the list left out unlisted).

use std::collections::BTreeMap;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::Sqlite;
use super::rows::bump_change_seq;
use crate::model::{Candidate, CandidateList};
use crate::proxy::{Anonymity, Scheme};
use crate::store::ingest::addresses_repeat;
use crate::store::{SourceRun, StoreError, UpsertCounts};

/// Candidates written per transaction: a few tens of milliseconds of
/// work, far below the busy timeout of anyone waiting for the lock. Two
/// chunks outweigh one transaction of the writer, so that each commits
/// alone, without the savepoint a job sharing a transaction needs.
const SOURCE_CHUNK: usize = 6_000;
const _: () = assert!(2 * SOURCE_CHUNK > super::writer::MAX_WEIGHT);

/// A source's listed links read per transaction when unlisting those a
/// new list left out: reading is cheap, and most pages write nothing.
const UNLIST_PAGE: usize = 50_000;

impl Sqlite {
    pub(crate) async fn record_source_run_into(
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
        let list = super::joined_blocking(
            tokio::task::spawn_blocking(move || {
                if list.len() > SOURCE_CHUNK {
                    list.sort_by_identity_text();
                }
                list
            })
            .await,
        )?;
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
    StoreError::Database(crate::store::DbError::unexpected(what))
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
                        bump_change_seq(tx)?;
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
                    bump_change_seq(tx)?;
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
                super::super::rows::PROXY_COLUMNS
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
