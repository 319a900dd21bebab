//! PostgreSQL: the crawl jobs' rows.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::Postgres;
use std::time::Duration;

use crate::store::crawls::lease_ms;
use crate::store::{CancelAsk, CrawlJobRecord, StoreError, now_ms};

const COLUMNS: &str = "id, spec, state, created_at, started_at, finished_at, summary, error";

fn record(r: &Row) -> CrawlJobRecord {
    CrawlJobRecord {
        id: r.get(0),
        spec: r.get(1),
        state: r.get(2),
        created_at: r.get(3),
        started_at: r.get(4),
        finished_at: r.get(5),
        summary: r.get(6),
        error: r.get(7),
    }
}

/// Deletes job `id`'s frontier: its URLs, settings and hosts' turns.
async fn drop_frontier(c: &impl GenericClient, id: i64) -> Result<(), StoreError> {
    for table in ["crawl_urls", "crawl_meta", "crawl_hosts"] {
        c.execute(&format!("DELETE FROM {table} WHERE job = $1"), &[&id])
            .await?;
    }
    Ok(())
}

/// The options a job listing leaves out: lists a client may make long,
/// shown by the job's own view.
const LISTING_DROPS: &str = "'{seeds,include,exclude,strip_params,select,user_agent}'::text[]";

async fn insert(c: &impl GenericClient, spec: &str) -> Result<CrawlJobRecord, StoreError> {
    let row = c
        .query_one(
            &format!(
                "INSERT INTO crawl_jobs (spec, state, created_at) VALUES ($1, 'queued', $2)
                 RETURNING {COLUMNS}"
            ),
            &[&spec, &now_ms()],
        )
        .await?;
    Ok(record(&row))
}

impl Postgres {
    async fn jobs(&self, sql: &str) -> Result<Vec<CrawlJobRecord>, StoreError> {
        let rows = self.client().await?.query(sql, &[]).await?;
        Ok(rows.iter().map(record).collect())
    }

    async fn update_job(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<(), StoreError> {
        self.client().await?.execute(sql, params).await?;
        Ok(())
    }

    /// Counted and inserted under a lock on the table's queued count, so
    /// submissions to several nodes at once cannot pass the limit together.
    pub(crate) async fn insert_crawl_job_bounded(
        &self,
        spec: String,
        max_queued: usize,
    ) -> Result<Option<CrawlJobRecord>, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.execute("LOCK TABLE crawl_jobs IN SHARE ROW EXCLUSIVE MODE", &[])
            .await?;
        let queued: i64 = tx
            .query_one(
                "SELECT count(*) FROM crawl_jobs WHERE state = 'queued'",
                &[],
            )
            .await?
            .get(0);
        if queued as u64 >= max_queued as u64 {
            return Ok(None);
        }
        let rec = insert(&tx, &spec).await?;
        tx.commit().await?;
        Ok(Some(rec))
    }

    pub(crate) async fn insert_crawl_job(
        &self,
        spec: String,
    ) -> Result<CrawlJobRecord, StoreError> {
        insert(&self.client().await?, &spec).await
    }

    pub(crate) async fn crawl_job_running(&self, id: i64) -> Result<(), StoreError> {
        self.update_job(
            "UPDATE crawl_jobs SET state = 'running', started_at = $2 WHERE id = $1",
            &[&id, &now_ms()],
        )
        .await
    }

    pub(crate) async fn crawl_job_ended(
        &self,
        id: i64,
        state: &'static str,
        summary: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.execute(
            "UPDATE crawl_jobs SET state = $2, finished_at = $3, summary = $4, error = $5,
                    lease_node = NULL, lease_until = NULL, cancel_requested = false
             WHERE id = $1",
            &[&id, &state, &now_ms(), &summary, &error],
        )
        .await?;
        drop_frontier(&tx, id).await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn purge_crawl_jobs(
        &self,
        keep: usize,
        ended_before: i64,
    ) -> Result<Vec<i64>, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let rows = tx
            .query(
                "SELECT id FROM crawl_jobs WHERE state NOT IN ('queued', 'running')
                   AND (coalesce(finished_at, created_at) < $2 OR id NOT IN (
                        SELECT id FROM crawl_jobs WHERE state NOT IN ('queued', 'running')
                        ORDER BY id DESC LIMIT $1))
                 ORDER BY id LIMIT 1000",
                &[&(keep as i64), &ended_before],
            )
            .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        for id in &ids {
            drop_frontier(&tx, *id).await?;
            tx.execute("DELETE FROM crawl_jobs WHERE id = $1", &[id])
                .await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    pub(crate) async fn crawl_job_paused(
        &self,
        id: i64,
        summary: String,
    ) -> Result<(), StoreError> {
        self.update_job(
            "UPDATE crawl_jobs SET summary = $2 WHERE id = $1",
            &[&id, &summary],
        )
        .await
    }

    pub(crate) async fn crawl_job(&self, id: i64) -> Result<Option<CrawlJobRecord>, StoreError> {
        let row = self
            .client()
            .await?
            .query_opt(
                &format!("SELECT {COLUMNS} FROM crawl_jobs WHERE id = $1"),
                &[&id],
            )
            .await?;
        Ok(row.as_ref().map(record))
    }

    pub(crate) async fn crawl_jobs(&self, limit: usize) -> Result<Vec<CrawlJobRecord>, StoreError> {
        self.jobs(&format!(
            "SELECT {COLUMNS} FROM crawl_jobs ORDER BY id DESC LIMIT {}",
            limit as i64
        ))
        .await
    }

    pub(crate) async fn crawl_job_listing(
        &self,
        limit: usize,
        before: Option<i64>,
    ) -> Result<Vec<(CrawlJobRecord, i64)>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                &format!(
                    "SELECT id, (spec::jsonb - {LISTING_DROPS})::text, state, created_at,
                            started_at, finished_at, summary, error,
                            coalesce(jsonb_array_length(
                                CASE jsonb_typeof(spec::jsonb -> 'seeds')
                                    WHEN 'array' THEN spec::jsonb -> 'seeds' END), 0)::bigint
                     FROM crawl_jobs WHERE id < $2 ORDER BY id DESC LIMIT $1"
                ),
                &[&(limit as i64), &before.unwrap_or(i64::MAX)],
            )
            .await?;
        Ok(rows.iter().map(|r| (record(r), r.get(8))).collect())
    }

    pub(crate) async fn unended_crawl_jobs(&self) -> Result<Vec<CrawlJobRecord>, StoreError> {
        self.jobs(&format!(
            "SELECT {COLUMNS} FROM crawl_jobs WHERE state IN ('queued', 'running') ORDER BY id"
        ))
        .await
    }

    /// `FOR UPDATE SKIP LOCKED`: nodes leasing at once skip each other's
    /// rows rather than wait for them or take them twice.
    pub(crate) async fn lease_crawl_jobs(
        &self,
        node: String,
        now: i64,
        ttl: Duration,
        limit: usize,
    ) -> Result<Vec<CrawlJobRecord>, StoreError> {
        let until = now.saturating_add(lease_ms(ttl));
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let rows = tx
            .query(
                &format!(
                    "UPDATE crawl_jobs SET lease_node = $1, lease_until = $2 WHERE id IN (
                         SELECT id FROM crawl_jobs WHERE state IN ('queued', 'running')
                           AND (lease_until IS NULL OR lease_until <= $3)
                         ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
                     RETURNING {COLUMNS}"
                ),
                &[&node, &until, &now, &(limit as i64)],
            )
            .await?;
        let mut jobs: Vec<CrawlJobRecord> = rows.iter().map(record).collect();
        jobs.sort_by_key(|j| j.id);
        // The job's lease decides: pages the node that held it before
        // still holds are free for the new one.
        let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
        tx.execute(
            "UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
             WHERE job = ANY($1) AND lease_node IS NOT NULL AND lease_node != $2",
            &[&ids, &node],
        )
        .await?;
        tx.commit().await?;
        Ok(jobs)
    }

    pub(crate) async fn renew_crawl_job(
        &self,
        id: i64,
        node: String,
        now: i64,
        ttl: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let until = now.saturating_add(lease_ms(ttl));
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let cancel: Option<bool> = tx
            .query_opt(
                "UPDATE crawl_jobs SET lease_until = $3
                 WHERE id = $1 AND lease_node = $2 AND state IN ('queued', 'running')
                 RETURNING cancel_requested",
                &[&id, &node, &until],
            )
            .await?
            .map(|r| r.get(0));
        if cancel.is_some() {
            tx.execute(
                "UPDATE crawl_urls SET lease_until = $3
                 WHERE job = $1 AND lease_node = $2 AND state = 0",
                &[&id, &node, &until],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(cancel)
    }

    pub(crate) async fn release_crawl_job(&self, id: i64, node: String) -> Result<(), StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.execute(
            "UPDATE crawl_jobs SET lease_node = NULL, lease_until = NULL
             WHERE id = $1 AND lease_node = $2",
            &[&id, &node],
        )
        .await?;
        tx.execute(
            "UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
             WHERE job = $1 AND lease_node = $2",
            &[&id, &node],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn cancel_crawl_job(
        &self,
        id: i64,
        now: i64,
    ) -> Result<CancelAsk, StoreError> {
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let ended = tx
            .execute(
                "UPDATE crawl_jobs SET state = 'cancelled', finished_at = $2,
                        lease_node = NULL, lease_until = NULL
                 WHERE id = $1 AND state IN ('queued', 'running')
                   AND (lease_until IS NULL OR lease_until <= $2)",
                &[&id, &now],
            )
            .await?;
        if ended > 0 {
            drop_frontier(&tx, id).await?;
            tx.commit().await?;
            return Ok(CancelAsk::Ended);
        }
        tx.commit().await?;
        let asked = c
            .execute(
                "UPDATE crawl_jobs SET cancel_requested = true
                 WHERE id = $1 AND state IN ('queued', 'running')",
                &[&id],
            )
            .await?;
        Ok(if asked > 0 {
            CancelAsk::Asked
        } else {
            CancelAsk::NotRunning
        })
    }

    pub(crate) async fn clear_crawl_leases(&self) -> Result<(), StoreError> {
        self.client()
            .await?
            .batch_execute(
                "UPDATE crawl_jobs SET lease_node = NULL, lease_until = NULL
                 WHERE lease_node IS NOT NULL;
                 UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
                 WHERE lease_node IS NOT NULL;",
            )
            .await?;
        Ok(())
    }

    pub(crate) async fn release_crawl_leases(&self, node: String) -> Result<(), StoreError> {
        let c = self.client().await?;
        for table in ["crawl_jobs", "crawl_urls"] {
            c.execute(
                &format!(
                    "UPDATE {table} SET lease_node = NULL, lease_until = NULL
                     WHERE lease_node = $1"
                ),
                &[&node],
            )
            .await?;
        }
        Ok(())
    }

    /// One statement: the row's lock orders nodes taking turns at once.
    pub(crate) async fn take_crawl_turn(
        &self,
        job: i64,
        host: String,
        now: i64,
        delay: Duration,
    ) -> Result<i64, StoreError> {
        let delay = lease_ms(delay);
        let row = self
            .client()
            .await?
            .query_one(
                "INSERT INTO crawl_hosts (job, host, next_at) VALUES ($1, $2, $3::bigint + $4::bigint)
                 ON CONFLICT (job, host)
                 DO UPDATE SET next_at = greatest(crawl_hosts.next_at, $3::bigint) + $4::bigint
                 RETURNING next_at - $4::bigint",
                &[&job, &host, &now, &delay],
            )
            .await?;
        Ok(row.get(0))
    }
}
