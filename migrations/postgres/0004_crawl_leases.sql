-- Crawl jobs across nodes. A job is leased by the node crawling it until
-- lease_until (unix ms), renewed by its heartbeat; another node takes it
-- over once the lease has ended. A cancel asked on a node that does not
-- run it is left in cancel_requested for the one that does. Pages are
-- leased like due checks while a node holds them; the end of a page clears
-- its lease. crawl_hosts is a job's politeness per target host: the next
-- time a request may start there (unix ms), advanced atomically by every
-- request, so that a Crawl-delay holds whichever node sends.
ALTER TABLE crawl_jobs ADD COLUMN lease_node TEXT;
ALTER TABLE crawl_jobs ADD COLUMN lease_until BIGINT;
ALTER TABLE crawl_jobs ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE crawl_urls ADD COLUMN lease_node TEXT;
ALTER TABLE crawl_urls ADD COLUMN lease_until BIGINT;
CREATE INDEX crawl_urls_leased ON crawl_urls (job, lease_node) WHERE lease_node IS NOT NULL;
CREATE TABLE crawl_hosts (
    job     BIGINT NOT NULL,
    host    TEXT   NOT NULL,
    next_at BIGINT NOT NULL,
    PRIMARY KEY (job, host)
);
