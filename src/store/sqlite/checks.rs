//! SQLite: due proxies by lane and page, check verdicts with re-check
//! scheduling, the change sequence, and the purge.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

use super::Sqlite;
use super::rows::{bump_change_seq, proxies_by_ids};
use crate::model::RecheckPolicy;
use crate::proxy::Scheme;
use crate::store::checks::{DueColumns, change_page};
use crate::store::{CheckRecord, DueCursor, DueLane, DueProxy, ProxyRecord, Recorded, StoreError};

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Sqlite {
    pub(crate) async fn count_due(&self, now: i64, all: bool) -> Result<i64, StoreError> {
        self.read(move |c| {
            let sql = if all {
                "SELECT count(*) FROM proxies"
            } else {
                "SELECT count(*) FROM proxies WHERE next_check_at <= ?1"
            };
            let mut stmt = c.prepare_cached(sql)?;
            let count = if all {
                stmt.query_row([], |r| r.get(0))?
            } else {
                stmt.query_row([now], |r| r.get(0))?
            };
            Ok(count)
        })
        .await
    }

    pub(crate) async fn next_due_at(&self, now: i64) -> Result<Option<i64>, StoreError> {
        self.read(move |c| {
            Ok(c.prepare_cached(
                "SELECT next_check_at FROM proxies
                 WHERE lease_until IS NULL OR lease_until <= ?1
                 ORDER BY next_check_at LIMIT 1",
            )?
            .query_row([now], |r| r.get(0))
            .optional()?)
        })
        .await
    }

    pub(crate) async fn due_page(
        &self,
        now: i64,
        all: bool,
        lane: DueLane,
        after: DueCursor,
        limit: usize,
    ) -> Result<Vec<DueProxy>, StoreError> {
        self.read(move |c| due_page(c, now, all, lane, after, limit))
            .await
    }

    pub(crate) async fn record_checks(
        &self,
        batch: Vec<CheckRecord>,
        policy: RecheckPolicy,
    ) -> Result<Recorded, StoreError> {
        self.write_weighted(batch.len(), move |tx| {
            let ids = record_checks(tx, &batch, policy)?;
            let seq = tx.query_row("SELECT change_seq FROM meta", [], |r| r.get(0))?;
            Ok(Recorded {
                records: proxies_by_ids(tx, &ids)?,
                seq,
            })
        })
        .await
    }

    pub(crate) async fn change_seq(&self) -> Result<i64, StoreError> {
        self.read(|c| Ok(c.query_row("SELECT change_seq FROM meta", [], |r| r.get(0))?))
            .await
    }

    pub(crate) async fn changed_since(
        &self,
        after: i64,
        limit: usize,
        known: Vec<i64>,
    ) -> Result<(Vec<ProxyRecord>, i64, bool), StoreError> {
        self.read(move |c| {
            let ids: Vec<(i64, i64)> = c
                .prepare_cached(
                    "SELECT id, changed_seq FROM proxies WHERE changed_seq > ?1 AND changed_seq > 0
                     ORDER BY changed_seq LIMIT ?2",
                )?
                .query_map(params![after, limit as i64], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<Result<_, _>>()?;
            let (ids, mark, full) = change_page(ids, after, limit, &known);
            Ok((proxies_by_ids(c, &ids)?, mark, full))
        })
        .await
    }

    async fn update_each(
        &self,
        sql: &'static str,
        ids: Vec<i64>,
        at: i64,
    ) -> Result<(), StoreError> {
        let weight = ids.len();
        self.write_weighted(weight, move |tx| {
            let mut stmt = tx.prepare_cached(sql)?;
            for id in ids {
                stmt.execute(params![id, at])?;
            }
            Ok(())
        })
        .await
    }

    /// One node: the writer takes leases one batch at a time.
    pub(crate) async fn lease_due(
        &self,
        node: String,
        now: i64,
        lane: DueLane,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueProxy>, StoreError> {
        let until = now.saturating_add(ms(lease));
        self.write_weighted(limit, move |tx| {
            let mut stmt = tx.prepare_cached(&format!(
                "UPDATE proxies SET lease_until = ?2, lease_node = ?3 WHERE id IN (
                     SELECT id FROM proxies INDEXED BY proxies_next_check
                     WHERE next_check_at <= ?1 AND (lease_until IS NULL OR lease_until <= ?1)
                         AND {}
                     ORDER BY next_check_at, id LIMIT ?4)
                 RETURNING id, scheme, host, port, username, password, scheme_detect,
                     status = 'alive', https_checked_at, next_check_at",
                lane.condition()
            ))?;
            let rows = stmt.query_map(params![now, until, node, limit as i64], due_columns)?;
            let mut out = Vec::new();
            for row in rows {
                out.extend(DueProxy::from_columns(row?));
            }
            out.sort_by_key(|d| (d.next_check_at, d.id));
            Ok(out)
        })
        .await
    }

    pub(crate) async fn defer_checks(&self, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        self.update_each(
            "UPDATE proxies SET next_check_at = ?2, lease_until = NULL, lease_node = NULL
             WHERE id = ?1",
            ids,
            at,
        )
        .await
    }

    pub(crate) async fn request_https_recheck(
        &self,
        ids: Vec<i64>,
        now: i64,
    ) -> Result<(), StoreError> {
        self.update_each(
            "UPDATE proxies SET https_checked_at = NULL,
                 next_check_at = min(next_check_at, ?2) WHERE id = ?1",
            ids,
            now,
        )
        .await
    }

    pub(crate) async fn pull_checks_in(&self, due: Vec<(i64, i64)>) -> Result<(), StoreError> {
        self.write_weighted(due.len(), move |tx| {
            let mut stmt = tx.prepare_cached(
                "UPDATE proxies SET next_check_at = min(next_check_at, ?2) WHERE id = ?1",
            )?;
            for (id, at) in due {
                stmt.execute(params![id, at])?;
            }
            Ok(())
        })
        .await
    }

    pub(crate) async fn mark_due_many(&self, ids: Vec<i64>, now: i64) -> Result<(), StoreError> {
        self.update_each(
            "UPDATE proxies SET next_check_at = min(next_check_at, ?2) WHERE id = ?1",
            ids,
            now,
        )
        .await
    }

    pub(crate) async fn record_report(
        &self,
        id: i64,
        ok: bool,
        now: i64,
    ) -> Result<bool, StoreError> {
        self.write(move |c| {
            // Cached statements: every page a pool or crawl fetches lands here.
            let changed = if ok {
                c.prepare_cached("UPDATE proxies SET reports_ok = reports_ok + 1 WHERE id = ?1")?
                    .execute([id])?
            } else {
                // A new change number, so that every process following the
                // sequence stops serving it too.
                bump_change_seq(c)?;
                c.prepare_cached(
                    "UPDATE proxies SET reports_failed = reports_failed + 1,
                         next_check_at = min(next_check_at, ?2),
                         failed_in_use_at = max(coalesce(failed_in_use_at, 0), ?2),
                         changed_seq = (SELECT change_seq FROM meta) WHERE id = ?1",
                )?
                .execute(params![id, now])?
            };
            Ok(changed > 0)
        })
        .await
    }

    pub(crate) async fn record_worked(&self, uses: Vec<(i64, u64, i64)>) -> Result<(), StoreError> {
        if uses.is_empty() {
            return Ok(());
        }
        self.write_weighted(uses.len(), move |c| {
            // A use that worked is a sighting of the proxy alive, as a
            // passed check is: `last_alive` is what freshness bounds read.
            let mut stmt = c.prepare_cached(
                "UPDATE proxies SET reports_ok = reports_ok + ?2,
                     last_alive = max(coalesce(last_alive, 0), ?3) WHERE id = ?1",
            )?;
            for (id, n, at) in uses {
                stmt.execute(params![id, i64::try_from(n).unwrap_or(i64::MAX), at])?;
            }
            Ok(())
        })
        .await
    }

    pub(crate) async fn purge(&self, now: i64, after: Duration) -> Result<usize, StoreError> {
        let cutoff = now.saturating_sub(ms(after));
        // In bounded transactions: a purge of many proxies never holds the
        // write lock for as long as another process waits for it.
        let mut purged = 0;
        loop {
            let n = self
                .write_weighted(PURGE_BATCH, move |c| {
                    Ok(c.execute(PURGE, params![cutoff, PURGE_BATCH as i64])?)
                })
                .await?;
            purged += n;
            if n < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }
}

/// Proxies deleted per transaction of a purge.
const PURGE_BATCH: usize = 5_000;

/// Deletes up to `?2` of the proxies dead since before `?1` that no source
/// has listed since.
pub(super) const PURGE: &str = "DELETE FROM proxies WHERE id IN (
     SELECT id FROM proxies WHERE status = 'dead'
         AND coalesce(last_alive, first_seen) < ?1 AND last_seen < ?1
         AND NOT EXISTS (SELECT 1 FROM sources s CROSS JOIN proxy_sources ps
                           ON ps.source_id = s.id AND ps.proxy_id = proxies.id
                         WHERE ps.listed = 1 AND s.listed_at >= ?1)
     LIMIT ?2)";

fn due_page(
    conn: &Connection,
    now: i64,
    all: bool,
    lane: DueLane,
    after: DueCursor,
    limit: usize,
) -> Result<Vec<DueProxy>, StoreError> {
    // Named, since without statistics SQLite would rather scan every alive
    // row through the status index and sort them.
    let (index, range, order) = if all {
        ("", "id > ?3", "id")
    } else {
        (
            "INDEXED BY proxies_next_check",
            "next_check_at <= ?1 AND (next_check_at, id) > (?2, ?3)",
            "next_check_at, id",
        )
    };
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT id, scheme, host, port, username, password, scheme_detect, status = 'alive',
                https_checked_at, next_check_at
             FROM proxies {index} WHERE {range} AND {}
             ORDER BY {order} LIMIT ?4",
        lane.condition()
    ))?;
    let rows = stmt.query_map(params![now, after.at, after.id, limit as i64], due_columns)?;
    let mut out = Vec::new();
    for row in rows {
        out.extend(DueProxy::from_columns(row?));
    }
    Ok(out)
}

/// A due row's columns, as [`DueProxy::from_columns`] takes them.
fn due_columns(r: &rusqlite::Row) -> rusqlite::Result<DueColumns> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
    ))
}

/// Writes the batch; returns the ids the results landed on.
fn record_checks(
    tx: &Connection,
    batch: &[CheckRecord],
    policy: RecheckPolicy,
) -> Result<Vec<i64>, StoreError> {
    bump_change_seq(tx)?;
    let mut ids = Vec::with_capacity(batch.len());
    {
        let mut alive = tx.prepare_cached(
            "UPDATE proxies SET status = 'alive', last_checked = ?2, last_alive = ?2,
                     latency_ms = ?3, anonymity = ?4, https = coalesce(?5, https),
                     https_checked_at = CASE WHEN ?5 IS NULL THEN https_checked_at ELSE ?2 END,
                     exit_ip = ?6,
                     country = coalesce(?7, country),
                     country_source = CASE WHEN ?7 IS NULL THEN country_source ELSE 'geoip' END,
                     last_reason = NULL, checks_total = checks_total + 1,
                     checks_ok = checks_ok + 1, consecutive_failures = 0,
                     next_check_at = ?2 + ?8 - abs(random() % (?9 + 1)),
                     lease_until = NULL, lease_node = NULL,
                     changed_seq = (SELECT change_seq FROM meta)
                 WHERE id = ?1",
        )?;
        // The shift uses the failures before this one: 1×, 2×, 4×, …
        let mut dead = tx.prepare_cached(
            "UPDATE proxies SET status = 'dead', last_checked = ?2, last_reason = ?3,
                     checks_total = checks_total + 1,
                     consecutive_failures = consecutive_failures + 1,
                     next_check_at = ?2 + min(?4 << min(consecutive_failures, 40), ?5),
                     lease_until = NULL, lease_node = NULL,
                     changed_seq = (SELECT change_seq FROM meta)
                 WHERE id = ?1",
        )?;
        for rec in batch {
            let o = &rec.outcome;
            let mut id = rec.id;
            if let Some(scheme) = o.detected {
                id = settle_scheme(tx, id, scheme)?;
            }
            ids.push(id);
            match o.failure {
                None => {
                    alive.execute(params![
                        id,
                        rec.checked_at,
                        o.latency.map(ms),
                        o.anonymity.map(|a| a.as_str()),
                        o.https,
                        o.exit_ip.map(|ip| ip.to_string()),
                        o.country.map(|c| c.as_str().to_owned()),
                        ms(policy.alive),
                        ms(policy.alive_jitter.min(policy.alive)),
                    ])?;
                }
                Some(reason) => {
                    dead.execute(params![
                        id,
                        rec.checked_at,
                        reason.as_str(),
                        ms(policy.dead),
                        ms(policy.dead_max),
                    ])?;
                }
            }
        }
    }
    Ok(ids)
}

/// Gives a detected proxy its real scheme. If a row with that identity
/// already exists, the placeholder row is merged into it (its source links
/// move over) and the existing row's id is returned.
fn settle_scheme(tx: &Connection, id: i64, scheme: Scheme) -> Result<i64, StoreError> {
    let changed = tx.execute(
        "UPDATE OR IGNORE proxies SET scheme = ?2, scheme_detect = 0,
             changed_seq = (SELECT change_seq FROM meta) WHERE id = ?1",
        params![id, scheme.as_str()],
    )?;
    if changed > 0 {
        return Ok(id);
    }
    let other: Option<i64> = tx
        .query_row(
            "SELECT o.id FROM proxies o JOIN proxies p
                 ON o.host = p.host AND o.port = p.port AND o.username = p.username
             WHERE p.id = ?1 AND o.scheme = ?2",
            params![id, scheme.as_str()],
            |r| r.get(0),
        )
        .optional()?;
    let Some(other) = other else {
        return Ok(id);
    };
    tx.execute(
        "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
         SELECT ?2, source_id, first_seen, last_seen, listed FROM proxy_sources
         WHERE source_id IN (SELECT id FROM sources) AND proxy_id = ?1
         ON CONFLICT (proxy_id, source_id) DO UPDATE SET
             first_seen = min(first_seen, excluded.first_seen),
             last_seen = max(last_seen, excluded.last_seen),
             listed = max(listed, excluded.listed)",
        params![id, other],
    )?;
    tx.execute("DELETE FROM proxies WHERE id = ?1", [id])?;
    Ok(other)
}
