//! The daemon's crawl jobs: one row per job with its options, state,
//! times and summary. The job's frontier is in `frontier`, keyed by the
//! job's id; its pages are in the job's own files, and of its options the
//! store only knows the JSON it is handed.

use std::time::Duration;

use super::{Store, StoreError, dispatch};

/// What a cancel asked of a job found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelAsk {
    /// No node held it: it is `cancelled` now.
    Ended,
    /// A node holds it: that node is asked to stop it (its heartbeat reads
    /// the request) and records its end.
    Asked,
    /// It had ended already, or there is no such job.
    NotRunning,
}

/// Milliseconds of `d`, for lease arithmetic on stored times.
pub(crate) fn lease_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

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
    /// with its summary or error; whoever held its lease lets it go. Its
    /// frontier (URLs, settings, hosts' turns) is deleted with it: an ended
    /// job is never crawled again.
    pub async fn crawl_job_ended(
        &self,
        id: i64,
        state: &'static str,
        summary: Option<String>,
        error: Option<String>,
    ) -> Result<(), StoreError> {
        dispatch!(self.crawl_job_ended(id, state, summary, error))
    }

    /// Deletes the ended jobs (finished, cancelled, failed) beyond the
    /// newest `keep` and those that ended before `ended_before` (unix ms),
    /// with whatever is left of their frontiers, at most 1,000 a call;
    /// returns their ids, for their files to go too.
    pub async fn purge_crawl_jobs(
        &self,
        keep: usize,
        ended_before: i64,
    ) -> Result<Vec<i64>, StoreError> {
        dispatch!(self.purge_crawl_jobs(keep, ended_before))
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

    /// Whether several nodes may share this database (PostgreSQL): crawl
    /// jobs then lease their pages and pace their hosts through it. A
    /// SQLite file is one node's.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, super::Backend::Postgres(_))
    }

    /// Leases to node `node`, until `now + ttl`, up to `limit` jobs that have
    /// not ended and that no node holds (or whose holder's lease ended),
    /// oldest first; returns them. Nodes asking at once get different jobs.
    /// The pages of a job taken over that its last holder still leases are
    /// let go: the job's lease decides who crawls it.
    pub async fn lease_crawl_jobs(
        &self,
        node: &str,
        now: i64,
        ttl: Duration,
        limit: usize,
    ) -> Result<Vec<CrawlJobRecord>, StoreError> {
        let node = node.to_owned();
        dispatch!(self.lease_crawl_jobs(node, now, ttl, limit))
    }

    /// Renews node `node`'s lease on job `id` and on the pages of it the
    /// node holds, until `now + ttl`: whether a cancel was asked, or `None`
    /// when the node no longer holds the job (its lease ended and another
    /// node took it, or the job ended).
    pub async fn renew_crawl_job(
        &self,
        id: i64,
        node: &str,
        now: i64,
        ttl: Duration,
    ) -> Result<Option<bool>, StoreError> {
        let node = node.to_owned();
        dispatch!(self.renew_crawl_job(id, node, now, ttl))
    }

    /// Lets go of node `node`'s lease on job `id` and its pages, so that
    /// another node may continue it at once.
    pub async fn release_crawl_job(&self, id: i64, node: &str) -> Result<(), StoreError> {
        let node = node.to_owned();
        dispatch!(self.release_crawl_job(id, node))
    }

    /// Cancels job `id` from any node: ends it at once when no node holds
    /// it (its frontier deleted, as [`Store::crawl_job_ended`] does), else
    /// asks its holder to.
    pub async fn cancel_crawl_job(&self, id: i64, now: i64) -> Result<CancelAsk, StoreError> {
        dispatch!(self.cancel_crawl_job(id, now))
    }

    /// Clears every crawl job's and page's lease: a node alone on its
    /// database takes back at start what its previous run held.
    pub async fn clear_crawl_leases(&self) -> Result<(), StoreError> {
        dispatch!(self.clear_crawl_leases())
    }

    /// Clears the crawl job and page leases `node` holds: a node restarted
    /// under the same `node.id` takes its jobs back at once, since no
    /// process crawls them any more, rather than after the leases end.
    pub async fn release_crawl_leases(&self, node: String) -> Result<(), StoreError> {
        dispatch!(self.release_crawl_leases(node))
    }

    /// Takes job `job`'s next turn at host `host`: the turn starts at the
    /// later of `now` and the host's next allowed time, which moves on to
    /// that start plus `delay`, in one atomic step, so that nodes taking
    /// turns at once get turns `delay` apart. Returns the turn's start.
    pub async fn take_crawl_turn(
        &self,
        job: i64,
        host: &str,
        now: i64,
        delay: Duration,
    ) -> Result<i64, StoreError> {
        let host = host.to_owned();
        dispatch!(self.take_crawl_turn(job, host, now, delay))
    }
}
