//! SQLite: the crawl jobs' rows.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::Sqlite;
use std::time::Duration;

use crate::store::crawls::lease_ms;
use crate::store::{CancelAsk, CrawlJobRecord, StoreError, now_ms};

const COLUMNS: &str = "id, spec, state, created_at, started_at, finished_at, summary, error";

fn record(r: &Row<'_>) -> rusqlite::Result<CrawlJobRecord> {
    Ok(CrawlJobRecord {
        id: r.get(0)?,
        spec: r.get(1)?,
        state: r.get(2)?,
        created_at: r.get(3)?,
        started_at: r.get(4)?,
        finished_at: r.get(5)?,
        summary: r.get(6)?,
        error: r.get(7)?,
    })
}

fn by_id(c: &Connection, id: i64) -> rusqlite::Result<Option<CrawlJobRecord>> {
    c.query_row(
        &format!("SELECT {COLUMNS} FROM crawl_jobs WHERE id = ?1"),
        [id],
        record,
    )
    .optional()
}

/// Deletes job `id`'s frontier: its URLs, settings and hosts' turns.
fn drop_frontier(c: &Connection, id: i64) -> rusqlite::Result<()> {
    for table in ["crawl_urls", "crawl_meta", "crawl_hosts"] {
        c.prepare_cached(&format!("DELETE FROM {table} WHERE job = ?1"))?
            .execute([id])?;
    }
    Ok(())
}

/// The options a job listing leaves out: lists a client may make long
/// (up to the 1 MiB a job's body may hold), shown by the job's own view.
const LISTING_DROPS: &str =
    "'$.seeds', '$.include', '$.exclude', '$.strip_params', '$.select', '$.user_agent'";

impl Sqlite {
    pub(crate) async fn insert_crawl_job_bounded(
        &self,
        spec: String,
        max_queued: usize,
    ) -> Result<Option<CrawlJobRecord>, StoreError> {
        self.write(move |c| {
            let queued: i64 = c.query_row(
                "SELECT count(*) FROM crawl_jobs WHERE state = 'queued'",
                [],
                |r| r.get(0),
            )?;
            if queued as u64 >= max_queued as u64 {
                return Ok(None);
            }
            c.execute(
                "INSERT INTO crawl_jobs (spec, state, created_at) VALUES (?1, 'queued', ?2)",
                params![spec, now_ms()],
            )?;
            let id = c.last_insert_rowid();
            Ok(by_id(c, id)?)
        })
        .await
    }

    pub(crate) async fn insert_crawl_job(
        &self,
        spec: String,
    ) -> Result<CrawlJobRecord, StoreError> {
        self.write(move |c| {
            c.execute(
                "INSERT INTO crawl_jobs (spec, state, created_at) VALUES (?1, 'queued', ?2)",
                params![spec, now_ms()],
            )?;
            let id = c.last_insert_rowid();
            Ok(by_id(c, id)?.expect("the row just inserted"))
        })
        .await
    }

    pub(crate) async fn crawl_job_running(&self, id: i64) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "UPDATE crawl_jobs SET state = 'running', started_at = ?2 WHERE id = ?1",
                params![id, now_ms()],
            )?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn crawl_job_ended(
        &self,
        id: i64,
        state: &'static str,
        summary: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "UPDATE crawl_jobs SET state = ?2, finished_at = ?3, summary = ?4, error = ?5,
                        lease_node = NULL, lease_until = NULL, cancel_requested = 0
                 WHERE id = ?1",
                params![id, state, now_ms(), summary, error],
            )?;
            drop_frontier(c, id)?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn purge_crawl_jobs(
        &self,
        keep: usize,
        ended_before: i64,
    ) -> Result<Vec<i64>, StoreError> {
        self.write(move |c| {
            let ids: Vec<i64> = c
                .prepare_cached(
                    "SELECT id FROM crawl_jobs WHERE state NOT IN ('queued', 'running')
                       AND (coalesce(finished_at, created_at) < ?2 OR id NOT IN (
                            SELECT id FROM crawl_jobs WHERE state NOT IN ('queued', 'running')
                            ORDER BY id DESC LIMIT ?1))
                     ORDER BY id LIMIT 1000",
                )?
                .query_map(params![keep as i64, ended_before], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            for id in &ids {
                drop_frontier(c, *id)?;
                c.execute("DELETE FROM crawl_jobs WHERE id = ?1", [id])?;
            }
            Ok(ids)
        })
        .await
    }

    pub(crate) async fn crawl_job_paused(
        &self,
        id: i64,
        summary: String,
    ) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "UPDATE crawl_jobs SET summary = ?2 WHERE id = ?1",
                params![id, summary],
            )?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn crawl_job(&self, id: i64) -> Result<Option<CrawlJobRecord>, StoreError> {
        self.read(move |c| Ok(by_id(c, id)?)).await
    }

    pub(crate) async fn crawl_jobs(&self, limit: usize) -> Result<Vec<CrawlJobRecord>, StoreError> {
        self.read(move |c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM crawl_jobs ORDER BY id DESC LIMIT ?1"
            ))?;
            let rows = st.query_map([limit as i64], record)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn crawl_job_listing(
        &self,
        limit: usize,
        before: Option<i64>,
    ) -> Result<Vec<(CrawlJobRecord, i64)>, StoreError> {
        self.read(move |c| {
            let mut st = c.prepare_cached(&format!(
                "SELECT id, json_remove(spec, {LISTING_DROPS}), state, created_at, started_at,
                        finished_at, summary, error, coalesce(json_array_length(spec, '$.seeds'), 0)
                 FROM crawl_jobs WHERE id < ?2 ORDER BY id DESC LIMIT ?1"
            ))?;
            let rows = st.query_map(params![limit as i64, before.unwrap_or(i64::MAX)], |r| {
                Ok((record(r)?, r.get(8)?))
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn unended_crawl_jobs(&self) -> Result<Vec<CrawlJobRecord>, StoreError> {
        self.read(move |c| {
            let mut st = c.prepare(&format!(
                "SELECT {COLUMNS} FROM crawl_jobs WHERE state IN ('queued', 'running') ORDER BY id"
            ))?;
            let rows = st.query_map([], record)?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub(crate) async fn lease_crawl_jobs(
        &self,
        node: String,
        now: i64,
        ttl: Duration,
        limit: usize,
    ) -> Result<Vec<CrawlJobRecord>, StoreError> {
        let until = now.saturating_add(lease_ms(ttl));
        self.write(move |c| {
            let mut st = c.prepare_cached(&format!(
                "UPDATE crawl_jobs SET lease_node = ?1, lease_until = ?2 WHERE id IN (
                     SELECT id FROM crawl_jobs WHERE state IN ('queued', 'running')
                       AND (lease_until IS NULL OR lease_until <= ?3)
                     ORDER BY id LIMIT ?4)
                 RETURNING {COLUMNS}"
            ))?;
            let mut jobs = st
                .query_map(params![node, until, now, limit as i64], record)?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            jobs.sort_by_key(|j| j.id);
            // The job's lease decides: pages the node that held it before
            // still holds are free for the new one.
            let mut free = c.prepare_cached(
                "UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
                 WHERE job = ?1 AND lease_node IS NOT NULL AND lease_node != ?2",
            )?;
            for j in &jobs {
                free.execute(params![j.id, node])?;
            }
            Ok(jobs)
        })
        .await
    }

    pub(crate) async fn renew_crawl_job(
        &self,
        id: i64,
        node: String,
        now: i64,
        ttl: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let until = now.saturating_add(lease_ms(ttl));
        self.write(move |c| {
            let cancel: Option<bool> = c
                .query_row(
                    "UPDATE crawl_jobs SET lease_until = ?3
                     WHERE id = ?1 AND lease_node = ?2 AND state IN ('queued', 'running')
                     RETURNING cancel_requested != 0",
                    params![id, node, until],
                    |r| r.get(0),
                )
                .optional()?;
            if cancel.is_some() {
                c.execute(
                    "UPDATE crawl_urls SET lease_until = ?3
                     WHERE job = ?1 AND lease_node = ?2 AND state = 0",
                    params![id, node, until],
                )?;
            }
            Ok(cancel)
        })
        .await
    }

    pub(crate) async fn release_crawl_job(&self, id: i64, node: String) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute(
                "UPDATE crawl_jobs SET lease_node = NULL, lease_until = NULL
                 WHERE id = ?1 AND lease_node = ?2",
                params![id, node],
            )?;
            c.execute(
                "UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
                 WHERE job = ?1 AND lease_node = ?2",
                params![id, node],
            )?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn cancel_crawl_job(
        &self,
        id: i64,
        now: i64,
    ) -> Result<CancelAsk, StoreError> {
        self.write(move |c| {
            let ended = c.execute(
                "UPDATE crawl_jobs SET state = 'cancelled', finished_at = ?2,
                        lease_node = NULL, lease_until = NULL
                 WHERE id = ?1 AND state IN ('queued', 'running')
                   AND (lease_until IS NULL OR lease_until <= ?2)",
                params![id, now],
            )?;
            if ended > 0 {
                drop_frontier(c, id)?;
                return Ok(CancelAsk::Ended);
            }
            let asked = c.execute(
                "UPDATE crawl_jobs SET cancel_requested = 1
                 WHERE id = ?1 AND state IN ('queued', 'running')",
                params![id],
            )?;
            Ok(if asked > 0 {
                CancelAsk::Asked
            } else {
                CancelAsk::NotRunning
            })
        })
        .await
    }

    pub(crate) async fn clear_crawl_leases(&self) -> Result<(), StoreError> {
        self.write(move |c| {
            c.execute_batch(
                "UPDATE crawl_jobs SET lease_node = NULL, lease_until = NULL
                 WHERE lease_node IS NOT NULL;
                 UPDATE crawl_urls SET lease_node = NULL, lease_until = NULL
                 WHERE lease_node IS NOT NULL;",
            )?;
            Ok(())
        })
        .await
    }

    pub(crate) async fn release_crawl_leases(&self, node: String) -> Result<(), StoreError> {
        self.write(move |c| {
            for table in ["crawl_jobs", "crawl_urls"] {
                c.prepare_cached(&format!(
                    "UPDATE {table} SET lease_node = NULL, lease_until = NULL
                     WHERE lease_node = ?1"
                ))?
                .execute([&node])?;
            }
            Ok(())
        })
        .await
    }

    pub(crate) async fn take_crawl_turn(
        &self,
        job: i64,
        host: String,
        now: i64,
        delay: Duration,
    ) -> Result<i64, StoreError> {
        let delay = lease_ms(delay);
        self.write(move |c| {
            Ok(c.query_row(
                "INSERT INTO crawl_hosts (job, host, next_at) VALUES (?1, ?2, ?3 + ?4)
                 ON CONFLICT (job, host) DO UPDATE SET next_at = max(next_at, ?3) + ?4
                 RETURNING next_at - ?4",
                params![job, host, now, delay],
                |r| r.get(0),
            )?)
        })
        .await
    }
}
