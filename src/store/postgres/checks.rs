//! PostgreSQL: due proxies by lane and page, check verdicts with re-check
//! scheduling, and the change sequence.

use std::time::Duration;

use deadpool_postgres::GenericClient;

use super::Postgres;
use super::ingest::LINKS_LOCK;
use super::listing::proxies_by_ids;
use crate::model::RecheckPolicy;
use crate::proxy::{Proxy, Scheme};
use crate::store::checks::change_page;
use crate::store::{CheckRecord, DueCursor, DueLane, DueProxy, ProxyRecord, Recorded, StoreError};

/// A due row (the columns `DueProxy::from_columns` takes) as a proxy.
fn due_proxy(r: &tokio_postgres::Row) -> Option<DueProxy> {
    DueProxy::from_columns((
        r.get(0),
        r.get(1),
        r.get(2),
        i64::from(r.get::<_, i32>(3)),
        r.get(4),
        r.get(5),
        r.get(6),
        r.get(7),
        r.get(8),
        r.get(9),
    ))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Starts a new change number for the rows this transaction writes.
pub(super) async fn bump_change_seq(tx: &impl GenericClient) -> Result<(), StoreError> {
    tx.execute("UPDATE meta SET change_seq = change_seq + 1", &[])
        .await?;
    Ok(())
}

impl Postgres {
    pub(crate) async fn count_due(&self, now: i64, all: bool) -> Result<i64, StoreError> {
        let c = self.client().await?;
        let row = if all {
            c.query_one("SELECT count(*) FROM proxies", &[]).await?
        } else {
            c.query_one(
                "SELECT count(*) FROM proxies WHERE next_check_at <= $1",
                &[&now],
            )
            .await?
        };
        Ok(row.get(0))
    }

    pub(crate) async fn next_due_at(&self, now: i64) -> Result<Option<i64>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                "SELECT next_check_at FROM proxies
                 WHERE lease_until IS NULL OR lease_until <= $1
                 ORDER BY next_check_at LIMIT 1",
                &[&now],
            )
            .await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub(crate) async fn due_page(
        &self,
        now: i64,
        all: bool,
        lane: DueLane,
        after: DueCursor,
        limit: usize,
    ) -> Result<Vec<DueProxy>, StoreError> {
        let (range, order) = if all {
            (
                "id > $3 AND $1::bigint IS NOT NULL AND $2::bigint IS NOT NULL",
                "id",
            )
        } else {
            (
                "next_check_at <= $1 AND (next_check_at, id) > ($2, $3)",
                "next_check_at, id",
            )
        };
        let sql = format!(
            "SELECT id, scheme, host, port, username, password, scheme_detect, status = 'alive',
                    https_checked_at, next_check_at
             FROM proxies WHERE {range} AND {}
             ORDER BY {order} LIMIT $4",
            lane.condition()
        );
        let c = self.client().await?;
        let st = c.prepare_cached(&sql).await?;
        let rows = c
            .query(&st, &[&now, &after.at, &after.id, &(limit as i64)])
            .await?;
        Ok(rows.iter().filter_map(due_proxy).collect())
    }

    /// Takes the rows it leases with `FOR UPDATE SKIP LOCKED`: a row
    /// another node is leasing at this moment is left to it, not waited
    /// for, and the lease is written in the same statement.
    pub(crate) async fn lease_due(
        &self,
        node: String,
        now: i64,
        lane: DueLane,
        limit: usize,
        lease: Duration,
    ) -> Result<Vec<DueProxy>, StoreError> {
        let until = now.saturating_add(ms(lease));
        let sql = format!(
            "UPDATE proxies SET lease_until = $2, lease_node = $3 WHERE id IN (
                 SELECT id FROM proxies
                 WHERE next_check_at <= $1 AND (lease_until IS NULL OR lease_until <= $1)
                     AND {}
                 ORDER BY next_check_at, id LIMIT $4
                 FOR UPDATE SKIP LOCKED)
             RETURNING id, scheme, host, port, username, password, scheme_detect,
                 status = 'alive', https_checked_at, next_check_at",
            lane.condition()
        );
        let c = self.client().await?;
        let st = c.prepare_cached(&sql).await?;
        let rows = c
            .query(&st, &[&now, &until, &node, &(limit as i64)])
            .await?;
        let mut out: Vec<DueProxy> = rows.iter().filter_map(due_proxy).collect();
        out.sort_by_key(|d| (d.next_check_at, d.id));
        Ok(out)
    }

    pub(crate) async fn record_checks(
        &self,
        batch: Vec<CheckRecord>,
        policy: RecheckPolicy,
    ) -> Result<Recorded, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        if batch.iter().any(|r| r.outcome.detected.is_some()) {
            // A detected scheme may merge a row into another and delete
            // it: alone against the harvests' link writes, as a purge (see
            // `LINKS_LOCK`), and before any row is locked, as a chunk
            // takes it.
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LINKS_LOCK])
                .await?;
        }
        let alive = tx
            .prepare_cached(
                "UPDATE proxies SET status = 'alive', last_checked = $2::bigint, last_alive = $2,
                     latency_ms = $3, anonymity = $4, https = coalesce($5, https),
                     https_checked_at = CASE WHEN $5::boolean IS NULL THEN https_checked_at ELSE $2 END,
                     exit_ip = $6,
                     country = coalesce($7, country),
                     country_source = CASE WHEN $7::text IS NULL THEN country_source ELSE 'geoip' END,
                     last_reason = NULL, checks_total = checks_total + 1,
                     checks_ok = checks_ok + 1, consecutive_failures = 0,
                     next_check_at = $2 + $8::bigint - floor(random() * ($9::bigint + 1))::bigint,
                     lease_until = NULL, lease_node = NULL
                 WHERE id = $1",
            )
            .await?;
        // The shift uses the failures before this one: 1×, 2×, 4×, …
        let dead = tx
            .prepare_cached(
                "UPDATE proxies SET status = 'dead', last_checked = $2::bigint, last_reason = $3,
                     checks_total = checks_total + 1,
                     consecutive_failures = consecutive_failures + 1,
                     next_check_at = $2 + least($4::bigint << least(consecutive_failures, 40)::integer, $5::bigint),
                     lease_until = NULL, lease_node = NULL
                 WHERE id = $1",
            )
            .await?;
        let mut ids = Vec::with_capacity(batch.len());
        for rec in &batch {
            let o = &rec.outcome;
            let mut id = rec.id;
            if let Some(scheme) = o.detected {
                id = settle_scheme(&tx, id, scheme).await?;
            }
            ids.push(id);
            match o.failure {
                None => {
                    let exit_ip = o.exit_ip.map(|ip| ip.to_string());
                    let country = o.country.map(|c| c.as_str().to_owned());
                    tx.execute(
                        &alive,
                        &[
                            &id,
                            &rec.checked_at,
                            &o.latency.map(ms),
                            &o.anonymity.map(|a| a.as_str()),
                            &o.https,
                            &exit_ip,
                            &country,
                            &ms(policy.alive),
                            &ms(policy.alive_jitter.min(policy.alive)),
                        ],
                    )
                    .await?;
                }
                Some(reason) => {
                    tx.execute(
                        &dead,
                        &[
                            &id,
                            &rec.checked_at,
                            &reason.as_str(),
                            &ms(policy.dead),
                            &ms(policy.dead_max),
                        ],
                    )
                    .await?;
                }
            }
        }
        // The change number is taken last, once every row is written: the
        // lock on it (held until commit, see `daemon::sync`) is held for
        // the stamp alone, not the whole batch, and every writer takes
        // rows first and the counter last, so two never wait on each other
        // in opposite orders.
        bump_change_seq(&tx).await?;
        let seq: i64 = tx
            .query_one(
                "WITH stamped AS (
                     UPDATE proxies SET changed_seq = (SELECT change_seq FROM meta)
                     WHERE id = ANY($1) RETURNING 1)
                 SELECT change_seq FROM meta",
                &[&ids],
            )
            .await?
            .get(0);
        let records = proxies_by_ids(&tx, &ids).await?;
        tx.commit().await?;
        Ok(Recorded { records, seq })
    }

    pub(crate) async fn change_seq(&self) -> Result<i64, StoreError> {
        let row = self
            .client()
            .await?
            .query_one("SELECT change_seq FROM meta", &[])
            .await?;
        Ok(row.get(0))
    }

    pub(crate) async fn changed_since(
        &self,
        after: i64,
        limit: usize,
        known: Vec<i64>,
    ) -> Result<(Vec<ProxyRecord>, i64, bool), StoreError> {
        let c = self.client().await?;
        let ids: Vec<(i64, i64)> = c
            .query(
                "SELECT id, changed_seq FROM proxies WHERE changed_seq > $1 AND changed_seq > 0
                 ORDER BY changed_seq LIMIT $2",
                &[&after, &(limit as i64)],
            )
            .await?
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        let (ids, mark, full) = change_page(ids, after, limit, &known);
        Ok((proxies_by_ids(&c, &ids).await?, mark, full))
    }

    /// Runs `sql` (with `$1` the ids and `$2` the time) once for all `ids`.
    async fn update_all(&self, sql: &str, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        self.client().await?.execute(sql, &[&ids, &at]).await?;
        Ok(())
    }

    pub(crate) async fn defer_checks(&self, ids: Vec<i64>, at: i64) -> Result<(), StoreError> {
        self.update_all(
            "UPDATE proxies SET next_check_at = $2, lease_until = NULL, lease_node = NULL
             WHERE id = ANY($1)",
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
        self.update_all(
            "UPDATE proxies SET https_checked_at = NULL, next_check_at = least(next_check_at, $2)
             WHERE id = ANY($1)",
            ids,
            now,
        )
        .await
    }

    pub(crate) async fn pull_checks_in(&self, due: Vec<(i64, i64)>) -> Result<(), StoreError> {
        let (ids, ats): (Vec<i64>, Vec<i64>) = due.into_iter().unzip();
        self.client()
            .await?
            .execute(
                "UPDATE proxies p SET next_check_at = least(p.next_check_at, d.at)
                 FROM unnest($1::bigint[], $2::bigint[]) d(id, at) WHERE p.id = d.id",
                &[&ids, &ats],
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn mark_due_many(&self, ids: Vec<i64>, now: i64) -> Result<(), StoreError> {
        self.update_all(
            "UPDATE proxies SET next_check_at = least(next_check_at, $2) WHERE id = ANY($1)",
            ids,
            now,
        )
        .await
    }
}

/// Gives a detected proxy its real scheme. If a row with that identity
/// already exists, the placeholder row is merged into it (its source links
/// move over) and the existing row's id is returned.
async fn settle_scheme(
    tx: &impl GenericClient,
    id: i64,
    scheme: Scheme,
) -> Result<i64, StoreError> {
    let other: Option<i64> = tx
        .query_opt(
            "SELECT o.id FROM proxies o JOIN proxies p
                 ON o.host = p.host AND o.port = p.port AND o.username = p.username
             WHERE p.id = $1 AND o.scheme = $2 AND o.id <> p.id",
            &[&id, &scheme.as_str()],
        )
        .await?
        .map(|r| r.get(0));
    let Some(other) = other else {
        tx.execute(
            "UPDATE proxies SET scheme = $2, scheme_detect = false,
                 changed_seq = (SELECT change_seq FROM meta) WHERE id = $1",
            &[&id, &scheme.as_str()],
        )
        .await?;
        return Ok(id);
    };
    tx.execute(
        "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
         SELECT $2, source_id, first_seen, last_seen, listed FROM proxy_sources
         WHERE source_id = ANY (ARRAY(SELECT id FROM sources)) AND proxy_id = $1
         ON CONFLICT (source_id, proxy_id) DO UPDATE SET
             first_seen = least(proxy_sources.first_seen, excluded.first_seen),
             last_seen = greatest(proxy_sources.last_seen, excluded.last_seen),
             listed = proxy_sources.listed OR excluded.listed",
        &[&id, &other],
    )
    .await?;
    tx.execute("DELETE FROM proxies WHERE id = $1", &[&id])
        .await?;
    Ok(other)
}

impl Postgres {
    pub(crate) async fn record_report(
        &self,
        id: i64,
        ok: bool,
        now: i64,
    ) -> Result<bool, StoreError> {
        let mut c = self.client().await?;
        if ok {
            let changed = c
                .execute(
                    "UPDATE proxies SET reports_ok = reports_ok + 1 WHERE id = $1",
                    &[&id],
                )
                .await?;
            return Ok(changed > 0);
        }
        // A new change number, so that every node stops serving it: the
        // trigger on meta wakes them when this commits.
        let tx = c.transaction().await?;
        let changed = tx
            .execute(
                "UPDATE proxies SET reports_failed = reports_failed + 1,
                     next_check_at = least(next_check_at, $2),
                     failed_in_use_at = greatest(coalesce(failed_in_use_at, 0), $2)
                 WHERE id = $1",
                &[&id, &now],
            )
            .await?;
        if changed > 0 {
            // Rows first, the change number last (see `record_checks`).
            bump_change_seq(&tx).await?;
            tx.execute(
                "UPDATE proxies SET changed_seq = (SELECT change_seq FROM meta) WHERE id = $1",
                &[&id],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(changed > 0)
    }

    /// A use that worked is a sighting of the proxy alive, as a passed
    /// check is: `last_alive` is what freshness bounds read.
    pub(crate) async fn record_worked(&self, uses: Vec<(i64, u64, i64)>) -> Result<(), StoreError> {
        if uses.is_empty() {
            return Ok(());
        }
        let ids: Vec<i64> = uses.iter().map(|u| u.0).collect();
        let ns: Vec<i64> = uses
            .iter()
            .map(|u| i64::try_from(u.1).unwrap_or(i64::MAX))
            .collect();
        let ats: Vec<i64> = uses.iter().map(|u| u.2).collect();
        self.client()
            .await?
            .execute(
                "UPDATE proxies p SET reports_ok = p.reports_ok + u.n,
                     last_alive = greatest(coalesce(p.last_alive, 0), u.at)
                 FROM (SELECT id, sum(n)::bigint AS n, max(at) AS at
                       FROM unnest($1::bigint[], $2::bigint[], $3::bigint[]) x(id, n, at)
                       GROUP BY id) u
                 WHERE p.id = u.id",
                &[&ids, &ns, &ats],
            )
            .await?;
        Ok(())
    }

    /// Deletes the proxies dead since before `now - after` that no source
    /// has listed since, in bounded transactions.
    pub(crate) async fn purge(&self, now: i64, after: Duration) -> Result<usize, StoreError> {
        let cutoff = now.saturating_sub(ms(after));
        let mut c = self.client().await?;
        let mut purged = 0;
        loop {
            // Alone against the harvests' link writes (see `LINKS_LOCK`):
            // a chunk that found one of these proxies commits its links
            // first (the delete's trigger then sees them) or runs after
            // (and finds the proxy gone).
            let tx = c.transaction().await?;
            tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LINKS_LOCK])
                .await?;
            let n = tx
                .execute(
                    "DELETE FROM proxies WHERE id IN (
                         SELECT id FROM proxies WHERE status = 'dead'
                             AND coalesce(last_alive, first_seen) < $1 AND last_seen < $1
                             AND NOT EXISTS (SELECT 1 FROM sources s JOIN proxy_sources ps
                                               ON ps.source_id = s.id AND ps.proxy_id = proxies.id
                                             WHERE ps.listed AND s.listed_at >= $1)
                         LIMIT $2)",
                    &[&cutoff, &(PURGE_BATCH as i64)],
                )
                .await? as usize;
            tx.commit().await?;
            purged += n;
            if n < PURGE_BATCH {
                return Ok(purged);
            }
        }
    }

    pub(crate) async fn proxy_ids(
        &self,
        proxies: Vec<Proxy>,
    ) -> Result<Vec<Option<i64>>, StoreError> {
        let c = self.client().await?;
        let find = c
            .prepare_cached(
                "SELECT id FROM proxies
                 WHERE scheme = $1 AND host = $2 AND port = $3 AND username = $4",
            )
            .await?;
        let mut ids = Vec::with_capacity(proxies.len());
        for p in &proxies {
            let row = c
                .query_opt(
                    &find,
                    &[
                        &p.scheme.as_str(),
                        &p.host.to_string(),
                        &i32::from(p.port),
                        &p.username(),
                    ],
                )
                .await?;
            ids.push(row.map(|r| r.get(0)));
        }
        Ok(ids)
    }
}

/// Proxies deleted per transaction of a purge.
const PURGE_BATCH: usize = 5_000;
