-- The PostgreSQL schema, as the SQLite migrations up to 0015 leave theirs:
-- the same tables and columns, in PostgreSQL's types (booleans are
-- booleans; times stay unix milliseconds). Counts for `stats` are
-- aggregated when asked rather than kept by triggers.
CREATE TABLE meta (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    -- Every write of proxy state takes the next number (see change_seq).
    change_seq BIGINT  NOT NULL
);
INSERT INTO meta (id, change_seq) VALUES (1, 0);

CREATE TABLE proxies (
    id                   BIGSERIAL PRIMARY KEY,
    scheme               TEXT    NOT NULL CHECK (scheme IN ('http', 'socks4', 'socks5')),
    host                 TEXT    NOT NULL,
    port                 INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    -- '' when there is none, so that the UNIQUE identity below applies.
    username             TEXT    NOT NULL DEFAULT '',
    password             TEXT,
    -- True while the scheme is a placeholder for the checker to detect.
    scheme_detect        BOOLEAN NOT NULL DEFAULT false,
    status               TEXT    NOT NULL DEFAULT 'unknown'
                                 CHECK (status IN ('unknown', 'alive', 'dead')),
    last_checked         BIGINT,
    last_alive           BIGINT,
    latency_ms           BIGINT,
    anonymity            TEXT    CHECK (anonymity IN ('transparent', 'anonymous', 'elite')),
    https                BOOLEAN,
    https_checked_at     BIGINT,
    exit_ip              TEXT,
    country              TEXT,
    country_source       TEXT    CHECK (country_source IN ('source', 'geoip')),
    hint_anonymity       TEXT    CHECK (hint_anonymity IN ('transparent', 'anonymous', 'elite')),
    hint_https           BOOLEAN,
    first_seen           BIGINT  NOT NULL,
    last_seen            BIGINT  NOT NULL,
    checks_total         BIGINT  NOT NULL DEFAULT 0,
    checks_ok            BIGINT  NOT NULL DEFAULT 0,
    consecutive_failures BIGINT  NOT NULL DEFAULT 0,
    last_reason          TEXT,
    next_check_at        BIGINT  NOT NULL,
    reports_ok           BIGINT  NOT NULL DEFAULT 0,
    reports_failed       BIGINT  NOT NULL DEFAULT 0,
    changed_seq          BIGINT  NOT NULL DEFAULT 0,
    UNIQUE (scheme, host, port, username)
);
CREATE INDEX proxies_next_check ON proxies (next_check_at, id);
CREATE INDEX proxies_status ON proxies (status) WHERE status IN ('alive', 'dead');
CREATE INDEX proxies_changed ON proxies (changed_seq) WHERE changed_seq > 0;

CREATE TABLE sources (
    id               BIGSERIAL PRIMARY KEY,
    name             TEXT   NOT NULL UNIQUE,
    url              TEXT   NOT NULL,
    format           TEXT   NOT NULL,
    last_fetch_at    BIGINT,
    last_ok_at       BIGINT,
    last_http_status BIGINT,
    last_duration_ms BIGINT,
    last_found       BIGINT,
    last_new         BIGINT,
    last_error       TEXT,
    last_private     BIGINT,
    -- When the source's latest list (one that named proxies) was taken.
    listed_at        BIGINT,
    fetches_total    BIGINT NOT NULL DEFAULT 0,
    fetches_failed   BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE proxy_sources (
    proxy_id   BIGINT  NOT NULL REFERENCES proxies (id) ON DELETE CASCADE,
    source_id  BIGINT  NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    first_seen BIGINT  NOT NULL,
    last_seen  BIGINT  NOT NULL,
    -- Named by the source's latest list.
    listed     BOOLEAN NOT NULL DEFAULT false,
    PRIMARY KEY (source_id, proxy_id)
);
CREATE INDEX proxy_sources_proxy ON proxy_sources (proxy_id);

CREATE TABLE proxy_sites (
    site            TEXT   NOT NULL,
    proxy_id        BIGINT NOT NULL REFERENCES proxies (id) ON DELETE CASCADE,
    worked          BIGINT NOT NULL DEFAULT 0,
    blocked         BIGINT NOT NULL DEFAULT 0,
    latency_ms      BIGINT,
    last_worked_at  BIGINT,
    last_blocked_at BIGINT,
    banned_until    BIGINT,
    updated_at      BIGINT NOT NULL,
    PRIMARY KEY (site, proxy_id)
);
CREATE INDEX proxy_sites_proxy ON proxy_sites (proxy_id);
CREATE INDEX proxy_sites_updated ON proxy_sites (updated_at);

CREATE TABLE snapshots (
    at               BIGINT PRIMARY KEY,
    servable         BIGINT NOT NULL,
    alive            BIGINT NOT NULL,
    dead             BIGINT NOT NULL,
    unknown          BIGINT NOT NULL,
    checks           BIGINT NOT NULL,
    checks_alive     BIGINT NOT NULL,
    gateway_requests BIGINT NOT NULL,
    gateway_failures BIGINT NOT NULL
);

CREATE TABLE crawl_jobs (
    id          BIGSERIAL PRIMARY KEY,
    spec        TEXT   NOT NULL,
    state       TEXT   NOT NULL,
    created_at  BIGINT NOT NULL,
    started_at  BIGINT,
    finished_at BIGINT,
    summary     TEXT,
    error       TEXT
);
CREATE INDEX crawl_jobs_unended ON crawl_jobs (state) WHERE state IN ('queued', 'running');

CREATE TABLE crawl_urls (
    id       BIGSERIAL PRIMARY KEY,
    job      BIGINT  NOT NULL,
    url      TEXT    NOT NULL,
    host     TEXT    NOT NULL,
    depth    INTEGER NOT NULL,
    parent   TEXT,
    state    INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0,
    UNIQUE (job, url)
);
CREATE INDEX crawl_urls_waiting ON crawl_urls (job, host, id) WHERE state = 0;

CREATE TABLE crawl_meta (
    job   BIGINT NOT NULL,
    key   TEXT   NOT NULL,
    value TEXT   NOT NULL,
    PRIMARY KEY (job, key)
);
