-- Crawl frontiers move into the main database, one per crawl: a daemon
-- job's by its id, the one crawl of a `crawl --state FILE` database as job
-- 0. Every URL the crawl has seen, with its depth, parent and state, and
-- the crawl's settings and output lengths (`crawl_meta`).
CREATE TABLE crawl_urls (
    -- Discovery order.
    id INTEGER PRIMARY KEY,
    job INTEGER NOT NULL,
    -- The normalised URL.
    url TEXT NOT NULL,
    -- Its host key (host[:port]): the politeness unit.
    host TEXT NOT NULL,
    depth INTEGER NOT NULL,
    parent TEXT,
    -- 0 queued, 2 done, 3 failed for good, 4 disallowed by robots.txt.
    state INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    UNIQUE (job, url)
);
CREATE INDEX crawl_urls_waiting ON crawl_urls(job, host, id) WHERE state = 0;
CREATE TABLE crawl_meta (
    job INTEGER NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (job, key)
) WITHOUT ROWID;
