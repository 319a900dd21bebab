-- Crawl jobs across nodes. A job is leased by the node crawling it until
-- lease_until (unix ms), renewed by its heartbeat; another node takes it
-- over once the lease has ended. A cancel asked on a node that does not
-- run it is left in cancel_requested for the one that does. Pages are
-- leased like due checks while a node holds them; the end of a page clears
-- its lease. crawl_hosts is a job's politeness per target host: the next
-- time a request may start there (unix ms), advanced atomically by every
-- request, so that a Crawl-delay holds whichever node sends.
ALTER TABLE crawl_jobs ADD COLUMN lease_node TEXT;
ALTER TABLE crawl_jobs ADD COLUMN lease_until INTEGER;
ALTER TABLE crawl_jobs ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0;
ALTER TABLE crawl_urls ADD COLUMN lease_node TEXT;
ALTER TABLE crawl_urls ADD COLUMN lease_until INTEGER;
CREATE INDEX crawl_urls_leased ON crawl_urls(job, lease_node) WHERE lease_node IS NOT NULL;
CREATE TABLE crawl_hosts (
    job INTEGER NOT NULL,
    host TEXT NOT NULL,
    next_at INTEGER NOT NULL,
    PRIMARY KEY (job, host)
) WITHOUT ROWID;
