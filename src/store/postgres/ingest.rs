//! PostgreSQL: a source run written in bounded transactions (known
//! proxies updated only where something changed, new ones inserted), the
//! links the list left out unlisted, and the source's row.
//!
//! Other sources of the same harvest and other nodes write the same
//! proxies at the same time. A new proxy goes in with `ON CONFLICT DO
//! NOTHING`, and one that another transaction stored meanwhile is looked
//! up again and taken as known, so that a list is never refused for a
//! proxy another list names too. Rows are locked in one order by every
//! writer of a source run (new ones by identity, known ones by id), and a
//! transaction the server still gives up (a deadlock with a check's
//! writes, say) is run again.

use deadpool_postgres::GenericClient;

use super::Postgres;
use super::checks::bump_change_seq;
use crate::model::{Candidate, CandidateList};
use crate::proxy::Anonymity;
use crate::store::ingest::{StoredHints, addresses_repeat};
use crate::store::{DbError, SourceRun, StoreError, UpsertCounts};

/// Candidates written per transaction: a bounded time holding row locks
/// other nodes' harvests and checks may wait for.
const SOURCE_CHUNK: usize = 5_000;

/// How often a transaction the server gave up for another's sake is run
/// again before its error is returned.
const RETRIES: u32 = 8;

/// The advisory lock between a harvest's writes of links and the purge of
/// proxies ("pwlinks\0" in ASCII). Links have no foreign key: a chunk that
/// found a proxy and links it while a purge deletes it (whose trigger
/// cannot see the uncommitted link) would leave a link to no proxy. Every
/// chunk holds the lock shared, so chunks of all sources and nodes run
/// side by side; a purge takes it alone, between chunks.
pub(super) const LINKS_LOCK: i64 = 0x7077_6c69_6e6b_7300;

/// The first statement of a chunk's transaction: the links lock, shared
/// (see [`LINKS_LOCK`]), and an asynchronous commit. A harvest can be run
/// again and a crash loses at most the last fraction of a second of its
/// chunks; the source's row, written after its last chunk with the usual
/// synchronous commit, flushes them all, and so does any later verdict's
/// commit (the log is written in order), so no verdict is ever lost.
const BEGIN_CHUNK: &str =
    "SELECT pg_advisory_xact_lock_shared($1), set_config('synchronous_commit', 'off', true)";

/// Columns read to decide whether a known proxy's row changes (see
/// [`known`]), then the link's `listed` for the source.
const FOUND_COLUMNS: &str = "p.id, p.password, p.scheme_detect, p.country, p.country_source, \
    p.hint_anonymity, p.hint_https";

const UPDATE_KNOWN: &str = "UPDATE proxies SET
        password = coalesce($2, password),
        scheme_detect = scheme_detect AND $3,
        country = CASE WHEN country_source = 'geoip' OR $4::text IS NULL THEN country ELSE $4 END,
        country_source = CASE WHEN country_source = 'geoip' OR $4::text IS NULL
                         THEN country_source ELSE 'source' END,
        hint_anonymity = coalesce($5, hint_anonymity),
        hint_https = coalesce($6, hint_https)
    WHERE id = $1";

/// [`UPDATE_KNOWN`] for many rows: `$1` ids (locked beforehand in id
/// order), then the candidates' password, detect, country, anonymity and
/// https.
const UPDATE_KNOWN_MANY: &str = "UPDATE proxies p SET
        password = coalesce(u.password, p.password),
        scheme_detect = p.scheme_detect AND u.detect,
        country = CASE WHEN p.country_source = 'geoip' OR u.country IS NULL
                  THEN p.country ELSE u.country END,
        country_source = CASE WHEN p.country_source = 'geoip' OR u.country IS NULL
                         THEN p.country_source ELSE 'source' END,
        hint_anonymity = coalesce(u.anonymity, p.hint_anonymity),
        hint_https = coalesce(u.https, p.hint_https)
    FROM unnest($1::bigint[], $2::text[], $3::boolean[], $4::text[], $5::text[], $6::boolean[])
        AS u(id, password, detect, country, anonymity, https)
    WHERE p.id = u.id";

/// New links, written by [`link_new`].
const LINK_NEW: &str = "COPY proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
     FROM STDIN (FORMAT binary)";

/// Lists again proxies `$1` (in id order) whose links to source `$2` the
/// lookup found unlisted, seen at `$3`.
const RELIST: &str = "UPDATE proxy_sources SET listed = true, last_seen = greatest(last_seen, $3)
     WHERE source_id = $2 AND proxy_id = ANY($1)";

impl Postgres {
    pub(crate) async fn record_source_run_into(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
        counts: &mut UpsertCounts,
    ) -> Result<(), StoreError> {
        let mut list: CandidateList = candidates.into();
        let mut c = self.client().await?;
        let row = c
            .query_one(
                "INSERT INTO sources (name, url, format) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET url = excluded.url, format = excluded.format
                 RETURNING id, listed_at",
                &[&run.name, &run.url, &run.format],
            )
            .await?;
        let (source, listed_before): (i64, Option<i64>) = (row.get(0), row.get(1));
        let now = run.started_at;
        // As on SQLite: a list that fits one transaction keeps its order
        // (its new proxies are numbered, and first checked, in the order
        // the source gives); a longer one walks the identity index in
        // order. Sorting millions of entries is CPU work: off the runtime.
        if list.len() > SOURCE_CHUNK {
            list = match tokio::task::spawn_blocking(move || {
                list.sort_by_identity_text();
                list
            })
            .await
            {
                Ok(l) => l,
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            };
        }
        let mut seen: Vec<i64> = Vec::with_capacity(list.len());
        let mut items = list.iter();
        // A source that never stored a list has no links to look up (but
        // for a run cut short by a failure, whose links the plain insert
        // then meets: from there on they are looked up).
        let mut linked = listed_before.is_some();
        loop {
            let chunk: Vec<Candidate> = items.by_ref().take(SOURCE_CHUNK).collect();
            if chunk.is_empty() {
                break;
            }
            let (written, ids) = write_chunk(&mut c, source, now, &chunk, &mut linked).await?;
            counts.found += written.found;
            counts.new += written.new;
            seen.extend(ids);
        }
        drop(items);
        drop(list);
        // A run that stored nothing (a failed fetch) leaves the last list
        // standing; before the first list there is nothing to unlist.
        if let (true, Some(listed_before)) = (counts.found > 0, listed_before) {
            seen.sort_unstable();
            seen.dedup();
            let mut tries = 0;
            loop {
                let unlisted = c
                    .execute(
                        "WITH gone AS (
                             UPDATE proxy_sources SET listed = false,
                                 last_seen = greatest(last_seen, $3)
                             WHERE source_id = $1 AND listed
                                 AND NOT EXISTS (SELECT 1 FROM unnest($2::bigint[]) s(id)
                                                 WHERE s.id = proxy_id)
                             RETURNING proxy_id)
                         UPDATE proxies SET last_seen = greatest(last_seen, $3)
                         WHERE id IN (SELECT proxy_id FROM gone)",
                        &[&source, &seen, &listed_before],
                    )
                    .await
                    .map_err(StoreError::from);
                match unlisted {
                    Err(e) if again(&e, &mut tries) => {}
                    other => {
                        other?;
                        break;
                    }
                }
            }
        }
        let failed = i64::from(run.error.is_some());
        c.execute(
            "UPDATE sources SET
                 last_fetch_at = $2,
                 last_ok_at = CASE WHEN $7::text IS NULL THEN $2 ELSE last_ok_at END,
                 last_http_status = $3,
                 last_duration_ms = $4,
                 last_found = $5,
                 last_new = $6,
                 last_error = $7,
                 listed_at = CASE WHEN $5::bigint > 0 THEN $8 ELSE listed_at END,
                 last_private = $9,
                 fetches_total = fetches_total + 1,
                 fetches_failed = fetches_failed + $10
             WHERE id = $1",
            &[
                &source,
                &(run.started_at + run.duration_ms),
                &run.http_status.map(i64::from),
                &run.duration_ms,
                &(counts.found as i64),
                &(counts.new as i64),
                &run.error,
                &run.started_at,
                &(run.private as i64),
                &failed,
            ],
        )
        .await?;
        Ok(())
    }
}

/// Whether to run again a transaction that failed with `e`, `tries`
/// times before: when the server gave it up for another's sake, up to
/// [`RETRIES`] times.
fn again(e: &StoreError, tries: &mut u32) -> bool {
    if !e.transient() || *tries >= RETRIES {
        return false;
    }
    *tries += 1;
    tracing::debug!(error = %e, tries = *tries, "a harvest's transaction was given up for another's sake; running it again");
    true
}

/// Writes one chunk of a source's candidates in a transaction of its own,
/// run again while the server gives it up for another's sake. `linked`
/// says whether the source may have links to look up; a chunk run again
/// looks them up, and so do the chunks after it.
async fn write_chunk(
    c: &mut deadpool_postgres::Object,
    source: i64,
    now: i64,
    chunk: &[Candidate],
    linked: &mut bool,
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    if let Some(c) = chunk.iter().find(|c| c.proxy.port == 0) {
        return Err(StoreError::Database(DbError::unexpected(format!(
            "{}: port 0 is not a proxy's port",
            c.proxy
        ))));
    }
    let repeat = addresses_repeat(chunk);
    let mut tries = 0;
    loop {
        let tx = c.transaction().await?;
        tx.execute(BEGIN_CHUNK, &[&LINKS_LOCK]).await?;
        let written = if repeat {
            upsert_rowwise(&tx, source, now, chunk).await
        } else {
            upsert_batched(&tx, source, now, chunk, *linked).await
        };
        let done = match written {
            Ok(w) => tx.commit().await.map(|()| w).map_err(StoreError::from),
            // Dropping the transaction rolls it back.
            Err(e) => Err(e),
        };
        match done {
            Err(e) if again(&e, &mut tries) => *linked = true,
            other => return other,
        }
    }
}

/// A stored row a candidate names, with what writing it would do.
#[derive(Clone, Copy, Debug)]
struct Known {
    id: i64,
    detect: bool,
    changes: bool,
    country_changes: bool,
    /// `None` without a link to the source, else whether it is listed.
    listed: Option<bool>,
}

/// Compares candidate `c` with its stored row (`FOUND_COLUMNS` from
/// column `at`, then the link's `listed`).
fn known(r: &tokio_postgres::Row, at: usize, c: &Candidate) -> Known {
    let stored = StoredHints {
        password: r.get(at + 1),
        detect: r.get(at + 2),
        country: r.get(at + 3),
        country_source: r.get(at + 4),
        anonymity: r.get(at + 5),
        https: r.get(at + 6),
    };
    let (changes, country_changes) = stored.changed_by(c);
    Known {
        id: r.get(at),
        detect: stored.detect,
        changes,
        country_changes,
        listed: r.get(at + 7),
    }
}

/// Finds the stored rows of the candidates `which` (indexes into
/// `chunk`) into `found`: by identity, and for a candidate whose scheme is
/// to be detected any row at its address, the one with a settled scheme
/// first, then the oldest; with each its link to the source when `linked`
/// (else none is taken to exist).
async fn lookup(
    tx: &impl GenericClient,
    source: i64,
    linked: bool,
    chunk: &[Candidate],
    hosts: &[String],
    which: &[usize],
    found: &mut [Option<Known>],
) -> Result<(), StoreError> {
    let keys = which
        .iter()
        .map(|&i| if chunk[i].detect { 3 } else { 1 })
        .sum();
    let mut schemes: Vec<&str> = Vec::with_capacity(keys);
    let mut key_hosts: Vec<&str> = Vec::with_capacity(keys);
    let mut ports: Vec<i32> = Vec::with_capacity(keys);
    let mut users: Vec<&str> = Vec::with_capacity(keys);
    let mut at: Vec<i32> = Vec::with_capacity(keys);
    for &i in which {
        let c = &chunk[i];
        let all = ["http", "socks4", "socks5"];
        let these: &[&str] = if c.detect {
            &all
        } else {
            std::slice::from_ref(
                &all[match c.proxy.scheme {
                    crate::proxy::Scheme::Http => 0,
                    crate::proxy::Scheme::Socks4 => 1,
                    crate::proxy::Scheme::Socks5 => 2,
                }],
            )
        };
        for s in these {
            schemes.push(s);
            key_hosts.push(&hosts[i]);
            ports.push(i32::from(c.proxy.port));
            users.push(c.proxy.username());
            at.push(i as i32);
        }
    }
    let (listed, links) = match linked {
        true => (
            "ps.listed",
            "LEFT JOIN proxy_sources ps ON ps.source_id = $6 AND ps.proxy_id = p.id",
        ),
        false => ("NULL::boolean", "WHERE $6::bigint IS NOT NULL"),
    };
    let find = tx
        .prepare_cached(&format!(
            "SELECT k.i, {FOUND_COLUMNS}, {listed}
             FROM unnest($1::text[], $2::text[], $3::integer[], $4::text[], $5::integer[])
                 AS k(scheme, host, port, username, i)
             JOIN proxies p ON p.scheme = k.scheme AND p.host = k.host AND p.port = k.port
                 AND p.username = k.username
             {links}"
        ))
        .await?;
    let rows = tx
        .query(&find, &[&schemes, &key_hosts, &ports, &users, &at, &source])
        .await?;
    for r in &rows {
        let i = r.get::<_, i32>(0) as usize;
        let k = known(r, 1, &chunk[i]);
        let better = match &found[i] {
            None => true,
            Some(old) => (k.detect, k.id) < (old.detect, old.id),
        };
        if better {
            found[i] = Some(k);
        }
    }
    Ok(())
}

/// Writes a chunk whose candidates all have distinct addresses with a
/// few statements: one lookup, one insert of the new proxies, one update
/// of the known rows that change and one insert of the links. A new proxy
/// another transaction stored since the lookup is looked up again and
/// written as a known one. The outcome is that of [`upsert_rowwise`].
async fn upsert_batched(
    tx: &deadpool_postgres::Transaction<'_>,
    source: i64,
    now: i64,
    chunk: &[Candidate],
    linked: bool,
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    let mut counts = UpsertCounts::default();
    let hosts: Vec<String> = chunk.iter().map(|c| c.proxy.host.to_string()).collect();
    let mut found: Vec<Option<Known>> = vec![None; chunk.len()];
    let all: Vec<usize> = (0..chunk.len()).collect();
    lookup(tx, source, linked, chunk, &hosts, &all, &mut found).await?;
    let mut fresh: Vec<usize> = all
        .iter()
        .copied()
        .filter(|&i| found[i].is_none())
        .collect();
    // The id each candidate's row has.
    let mut ids: Vec<i64> = vec![0; chunk.len()];
    if !fresh.is_empty() {
        // Ids taken in the list's order, so that its new proxies are
        // numbered in that order although they are inserted in identity
        // order, the order every writer takes: two transactions inserting
        // the same new proxies never wait on each other crosswise.
        let mut taken: Vec<i64> = tx
            .query(
                // The sequence is named once, not once per id: without
                // `OFFSET 0` the planner folds the subquery into the
                // outer one and looks the name up in the catalog for
                // every id, a tenth of a first harvest's time.
                "SELECT nextval(q.seq) FROM
                     (SELECT pg_get_serial_sequence('proxies', 'id')::regclass AS seq OFFSET 0) q,
                     generate_series(1, $1::bigint)",
                &[&(fresh.len() as i64)],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        taken.sort_unstable();
        for (&i, id) in fresh.iter().zip(taken) {
            ids[i] = id;
        }
        let mut order = fresh.clone();
        order.sort_by(|&a, &b| {
            let key = |i: usize| {
                let p = &chunk[i].proxy;
                (p.scheme.as_str(), hosts[i].as_str(), p.port, p.username())
            };
            key(a).cmp(&key(b))
        });
        let new_ids: Vec<i64> = order.iter().map(|&i| ids[i]).collect();
        let schemes = column(&order, |i| chunk[i].proxy.scheme.as_str());
        let new_hosts = column(&order, |i| hosts[i].as_str());
        let ports = column(&order, |i| i32::from(chunk[i].proxy.port));
        let users = column(&order, |i| chunk[i].proxy.username());
        let passwords = column(&order, |i| {
            chunk[i].proxy.auth.as_ref().map(|a| a.password.as_str())
        });
        let detect = column(&order, |i| chunk[i].detect);
        let countries = column(&order, |i| {
            chunk[i].hints.country.as_ref().map(|c| c.as_str())
        });
        let anonymity = column(&order, |i| chunk[i].hints.anonymity.map(Anonymity::as_str));
        let https = column(&order, |i| chunk[i].hints.https);
        let insert = tx
            .prepare_cached(
                "INSERT INTO proxies (id, scheme, host, port, username, password, scheme_detect,
                     country, country_source, hint_anonymity, hint_https,
                     first_seen, last_seen, next_check_at)
                 SELECT id, scheme, host, port, username, password, detect, country,
                     CASE WHEN country IS NULL THEN NULL ELSE 'source' END, anonymity, https,
                     $11, $11, $11
                 FROM unnest($1::bigint[], $2::text[], $3::text[], $4::integer[], $5::text[],
                     $6::text[], $7::boolean[], $8::text[], $9::text[], $10::boolean[])
                     WITH ORDINALITY
                     AS n(id, scheme, host, port, username, password, detect, country,
                          anonymity, https, n)
                 ORDER BY n
                 ON CONFLICT (scheme, host, port, username) DO NOTHING
                 RETURNING id",
            )
            .await?;
        let mut written: Vec<i64> = tx
            .query(
                &insert,
                &[
                    &new_ids, &schemes, &new_hosts, &ports, &users, &passwords, &detect,
                    &countries, &anonymity, &https, &now,
                ],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        counts.new += written.len();
        if written.len() < fresh.len() {
            // Stored by another transaction since the lookup: known now.
            written.sort_unstable();
            let lost: Vec<usize> = fresh
                .iter()
                .copied()
                .filter(|&i| written.binary_search(&ids[i]).is_err())
                .collect();
            lookup(tx, source, linked, chunk, &hosts, &lost, &mut found).await?;
            if let Some(&i) = lost.iter().find(|&&i| found[i].is_none()) {
                // Gone again (purged) before this transaction saw it: the
                // chunk is run again.
                return Err(gone(&chunk[i].proxy));
            }
            fresh.retain(|&i| found[i].is_none());
        }
    }
    // Known rows that change, locked in id order (as every writer of a
    // source run takes them), then written in one statement.
    let mut changing: Vec<usize> = (0..chunk.len())
        .filter(|&i| found[i].is_some_and(|k| k.changes))
        .collect();
    changing.sort_by_key(|&i| found[i].map(|k| k.id));
    changing.dedup_by_key(|i| found[*i].map(|k| k.id));
    if !changing.is_empty() {
        let ids_of: Vec<i64> = changing
            .iter()
            .filter_map(|&i| found[i].map(|k| k.id))
            .collect();
        tx.execute(
            "SELECT 1 FROM (SELECT id FROM proxies WHERE id = ANY($1) ORDER BY id FOR UPDATE) l",
            &[&ids_of],
        )
        .await?;
        let passwords = column(&changing, |i| {
            chunk[i].proxy.auth.as_ref().map(|a| a.password.as_str())
        });
        let detect = column(&changing, |i| chunk[i].detect);
        let countries = column(&changing, |i| {
            chunk[i].hints.country.as_ref().map(|c| c.as_str())
        });
        let anonymity = column(&changing, |i| {
            chunk[i].hints.anonymity.map(Anonymity::as_str)
        });
        let https = column(&changing, |i| chunk[i].hints.https);
        let update = tx.prepare_cached(UPDATE_KNOWN_MANY).await?;
        tx.execute(
            &update,
            &[&ids_of, &passwords, &detect, &countries, &anonymity, &https],
        )
        .await?;
    }
    let mut link: Vec<i64> = Vec::new();
    let mut relist: Vec<i64> = Vec::new();
    let mut restamp: Vec<i64> = Vec::new();
    for i in 0..chunk.len() {
        match found[i] {
            Some(k) => {
                ids[i] = k.id;
                match k.listed {
                    None => link.push(k.id),
                    Some(false) => relist.push(k.id),
                    Some(true) => {}
                }
                if k.country_changes {
                    restamp.push(k.id);
                }
            }
            None => link.push(ids[i]),
        }
    }
    relist.sort_unstable();
    relist.dedup();
    if !relist.is_empty() {
        let st = tx.prepare_cached(RELIST).await?;
        tx.execute(&st, &[&relist, &source, &now]).await?;
    }
    link.sort_unstable();
    link.dedup();
    link_new(tx, &link, source, now)
        .await
        .map_err(linked_meanwhile)?;
    counts.found += chunk.len();
    restamp_countries(tx, restamp).await?;
    Ok((counts, ids))
}

/// A proxy whose insert found it stored that a lookup then did not find
/// (purged in between): the transaction is run again.
fn gone(p: &crate::proxy::Proxy) -> StoreError {
    StoreError::Database(DbError {
        failure: None,
        transient: true,
        source: format!("{p} was neither stored nor written").into(),
    })
}

/// Links proxies `ids` (distinct, in id order, none linked to the source
/// when looked up) to source `source`'s latest list, taken at `now`. A
/// `COPY`: the server writes the rows a page at a time, not one by one as
/// an `INSERT` does. A link written meanwhile (by a run of the same source
/// elsewhere) fails it, and the chunk is run again, looking links up (see
/// [`linked_meanwhile`]): an upsert would pay a speculative insertion per
/// link for that rare case.
async fn link_new(
    tx: &deadpool_postgres::Transaction<'_>,
    ids: &[i64],
    source: i64,
    now: i64,
) -> Result<(), tokio_postgres::Error> {
    use tokio_postgres::binary_copy::BinaryCopyInWriter;
    use tokio_postgres::types::Type;
    if ids.is_empty() {
        return Ok(());
    }
    let sink = tx.copy_in(LINK_NEW).await?;
    let types = [Type::INT8, Type::INT8, Type::INT8, Type::INT8, Type::BOOL];
    let mut writer = std::pin::pin!(BinaryCopyInWriter::new(sink, &types));
    for id in ids {
        writer
            .as_mut()
            .write(&[id, &source, &now, &now, &true])
            .await?;
    }
    writer.finish().await?;
    Ok(())
}

/// A link the insert of new links ([`link_new`]) found written since the lookup
/// (or one the lookup was told not to look for): the chunk is run again,
/// looking links up. Any other error as it is.
fn linked_meanwhile(e: tokio_postgres::Error) -> StoreError {
    if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) {
        return StoreError::Database(DbError {
            failure: None,
            transient: true,
            source: format!("a link was written meanwhile: {}", super::describe(&e)).into(),
        });
    }
    e.into()
}

/// One array parameter: `f` of each candidate index in `order`.
fn column<T>(order: &[usize], f: impl Fn(usize) -> T) -> Vec<T> {
    order.iter().map(|&i| f(i)).collect()
}

/// Stamps the rows whose country changed (a country from the source
/// changes what filters select) with a new change number, rows first and
/// the counter last as every writer does (see `checks::record_checks`).
async fn restamp_countries(
    tx: &impl GenericClient,
    mut restamp: Vec<i64>,
) -> Result<(), StoreError> {
    if restamp.is_empty() {
        return Ok(());
    }
    restamp.sort_unstable();
    restamp.dedup();
    bump_change_seq(tx).await?;
    tx.execute(
        "UPDATE proxies SET changed_seq = (SELECT change_seq FROM meta) WHERE id = ANY($1)",
        &[&restamp],
    )
    .await?;
    Ok(())
}

/// Writes a chunk row by row, in order: for chunks where two candidates
/// share an address, so that one finds what the other wrote.
async fn upsert_rowwise(
    tx: &impl GenericClient,
    source: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    let mut counts = UpsertCounts::default();
    let mut ids = Vec::with_capacity(candidates.len());
    let mut restamp: Vec<i64> = Vec::new();
    let find = tx
        .prepare_cached(&format!(
            "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = $5)
             FROM proxies p WHERE p.scheme = $1 AND p.host = $2 AND p.port = $3 AND p.username = $4"
        ))
        .await?;
    // An entry whose scheme is to be detected is the same proxy as any row
    // at its address, whatever scheme detection gave it.
    let find_any = tx
        .prepare_cached(&format!(
            "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = $4)
             FROM proxies p WHERE p.host = $1 AND p.port = $2 AND p.username = $3
             ORDER BY p.scheme_detect, p.id LIMIT 1"
        ))
        .await?;
    let insert = tx
        .prepare_cached(
            "INSERT INTO proxies (scheme, host, port, username, password, scheme_detect,
                 country, country_source, hint_anonymity, hint_https,
                 first_seen, last_seen, next_check_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7,
                 CASE WHEN $7::text IS NULL THEN NULL ELSE 'source' END, $8, $9, $10, $10, $10)
             ON CONFLICT (scheme, host, port, username) DO NOTHING
             RETURNING id",
        )
        .await?;
    let update = tx.prepare_cached(UPDATE_KNOWN).await?;
    let link = tx
        .prepare_cached(
            "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
             VALUES ($1, $2, $3, $3, true)
             ON CONFLICT (source_id, proxy_id) DO UPDATE SET
                 listed = true, last_seen = greatest(proxy_sources.last_seen, excluded.last_seen)",
        )
        .await?;
    for c in candidates {
        let p = &c.proxy;
        let host = p.host.to_string();
        let port = i32::from(p.port);
        let scheme = p.scheme.as_str();
        let username = p.username();
        let password = p.auth.as_ref().map(|a| a.password.as_str());
        let country = c.hints.country.as_ref().map(|c| c.as_str());
        let anonymity = c.hints.anonymity.map(Anonymity::as_str);
        let (find_row, params): (_, Vec<&(dyn tokio_postgres::types::ToSql + Sync)>) = if c.detect {
            (&find_any, vec![&host, &port, &username, &source])
        } else {
            (&find, vec![&scheme, &host, &port, &username, &source])
        };
        let k = match tx.query_opt(find_row, &params).await? {
            Some(r) => known(&r, 0, c),
            None => match tx
                .query_opt(
                    &insert,
                    &[
                        &p.scheme.as_str(),
                        &host,
                        &port,
                        &p.username(),
                        &password,
                        &c.detect,
                        &country,
                        &anonymity,
                        &c.hints.https,
                        &now,
                    ],
                )
                .await?
            {
                Some(r) => {
                    let id: i64 = r.get(0);
                    counts.new += 1;
                    tx.execute(&link, &[&id, &source, &now]).await?;
                    ids.push(id);
                    counts.found += 1;
                    continue;
                }
                // Stored by another transaction since the lookup.
                None => match tx.query_opt(find_row, &params).await? {
                    Some(r) => known(&r, 0, c),
                    None => return Err(gone(p)),
                },
            },
        };
        if k.country_changes {
            restamp.push(k.id);
        }
        if k.changes {
            tx.execute(
                &update,
                &[
                    &k.id,
                    &password,
                    &c.detect,
                    &country,
                    &anonymity,
                    &c.hints.https,
                ],
            )
            .await?;
        }
        if k.listed != Some(true) {
            tx.execute(&link, &[&k.id, &source, &now]).await?;
        }
        ids.push(k.id);
        counts.found += 1;
    }
    restamp_countries(tx, restamp).await?;
    Ok((counts, ids))
}
