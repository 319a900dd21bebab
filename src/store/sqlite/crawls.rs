//! SQLite: the crawl jobs' rows.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::Sqlite;
use crate::store::{CrawlJobRecord, StoreError, now_ms};

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
                "UPDATE crawl_jobs SET state = ?2, finished_at = ?3, summary = ?4, error = ?5
                 WHERE id = ?1",
                params![id, state, now_ms(), summary, error],
            )?;
            Ok(())
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
}
