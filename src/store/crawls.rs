//! The daemon's crawl jobs: one row per job with its options, state,
//! times and summary. The job's frontier is in `frontier`, keyed by the
//! job's id; its pages are in the job's own files, and of its options the
//! store only knows the JSON it is handed.

use super::{Store, StoreError, dispatch};

/// A crawl job as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrawlJobRecord {
    /// Row id: the job's id in the API.
    pub id: i64,
    /// Its options, as JSON.
    pub spec: String,
    /// `queued`, `running`, `finished`, `cancelled` or `failed`.
    pub state: String,
    /// When it was asked for (unix ms).
    pub created_at: i64,
    /// When it (last) started running.
    pub started_at: Option<i64>,
    /// When it ended.
    pub finished_at: Option<i64>,
    /// The summary as JSON, once it ended.
    pub summary: Option<String>,
    /// Why it failed.
    pub error: Option<String>,
}

impl Store {
    /// Records a new job, queued, unless `max_queued` jobs are queued
    /// already (`Ok(None)` then); returns it. Counted and inserted in one
    /// transaction, so concurrent submissions cannot pass the limit
    /// together.
    pub async fn insert_crawl_job_bounded(
        &self,
        spec: String,
        max_queued: usize,
    ) -> Result<Option<CrawlJobRecord>, StoreError> {
        dispatch!(self.insert_crawl_job_bounded(spec, max_queued))
    }

    /// Records a new job, queued; returns it.
    pub async fn insert_crawl_job(&self, spec: String) -> Result<CrawlJobRecord, StoreError> {
        dispatch!(self.insert_crawl_job(spec))
    }

    /// Marks job `id` running (now).
    pub async fn crawl_job_running(&self, id: i64) -> Result<(), StoreError> {
        dispatch!(self.crawl_job_running(id))
    }

    /// Marks job `id` ended in `state` (`finished`, `cancelled`, `failed`)
    /// with its summary or error.
    pub async fn crawl_job_ended(
        &self,
        id: i64,
        state: &'static str,
        summary: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        dispatch!(self.crawl_job_ended(id, state, summary, error))
    }

    /// Keeps the summary of the part of job `id` that ran before a
    /// shutdown, for the summary of the whole once it ends.
    pub async fn crawl_job_paused(&self, id: i64, summary: String) -> Result<(), StoreError> {
        dispatch!(self.crawl_job_paused(id, summary))
    }

    /// Job `id`, if there is one.
    pub async fn crawl_job(&self, id: i64) -> Result<Option<CrawlJobRecord>, StoreError> {
        dispatch!(self.crawl_job(id))
    }

    /// Every job, newest first, at most `limit`.
    pub async fn crawl_jobs(&self, limit: usize) -> Result<Vec<CrawlJobRecord>, StoreError> {
        dispatch!(self.crawl_jobs(limit))
    }

    /// A page of jobs for a listing, newest first: at most `limit` of those
    /// older than job `before` (all, when `None`). Each record's `spec` is
    /// its options without the lists a client may make long (seeds,
    /// patterns, selectors), and the number of seeds comes alongside, so a
    /// listing stays small however large the jobs' bodies were.
    pub async fn crawl_job_listing(
        &self,
        limit: usize,
        before: Option<i64>,
    ) -> Result<Vec<(CrawlJobRecord, i64)>, StoreError> {
        dispatch!(self.crawl_job_listing(limit, before))
    }

    /// Jobs that had not ended (queued or running), oldest first: what a
    /// restarted daemon continues.
    pub async fn unended_crawl_jobs(&self) -> Result<Vec<CrawlJobRecord>, StoreError> {
        dispatch!(self.unended_crawl_jobs())
    }
}
