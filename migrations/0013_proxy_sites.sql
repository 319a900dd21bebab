-- What each site taught about each proxy that reached it (the gateway,
-- crawl jobs and client reports): uses that worked there and their
-- latency, blocks, and a ban or rest still running. Kept so that a
-- restart does not send a proxy back to a site that banned it, nor forget
-- which proxies a site takes. Keyed by site first: a request asks about
-- one site.
CREATE TABLE proxy_sites (
    site           TEXT    NOT NULL,
    proxy_id       INTEGER NOT NULL REFERENCES proxies (id) ON DELETE CASCADE,
    worked         INTEGER NOT NULL DEFAULT 0,
    blocked        INTEGER NOT NULL DEFAULT 0,
    latency_ms     INTEGER,
    last_worked_at INTEGER,
    last_blocked_at INTEGER,
    banned_until   INTEGER,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (site, proxy_id)
) WITHOUT ROWID;

-- For the cascade from proxies and for loading the most recent rows.
CREATE INDEX proxy_sites_proxy ON proxy_sites (proxy_id);
CREATE INDEX proxy_sites_updated ON proxy_sites (updated_at);
