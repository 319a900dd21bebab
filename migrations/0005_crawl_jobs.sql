-- Crawl jobs run by the daemon (POST /crawls). The frontier and the pages of
-- each job live in its own files beside the database; this row is what a
-- restarted daemon reads to continue the jobs that had not ended.
CREATE TABLE crawl_jobs (
    id INTEGER PRIMARY KEY,
    -- The job's options as validated JSON.
    spec TEXT NOT NULL,
    -- queued | running | finished | cancelled | failed
    state TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    started_at INTEGER,
    finished_at INTEGER,
    -- The end-of-crawl summary as JSON, once it ended.
    summary TEXT,
    -- Why it failed, when it did.
    error TEXT
);
CREATE INDEX crawl_jobs_unended ON crawl_jobs(state) WHERE state IN ('queued', 'running');
