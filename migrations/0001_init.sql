-- Proxies, sources and which source lists which proxy.
-- Times are unix milliseconds (UTC).

CREATE TABLE proxies (
    id                   INTEGER PRIMARY KEY,
    scheme               TEXT    NOT NULL CHECK (scheme IN ('http', 'socks4', 'socks5')),
    host                 TEXT    NOT NULL,
    port                 INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    -- '' when there is none, so that the UNIQUE identity below applies.
    username             TEXT    NOT NULL DEFAULT '',
    password             TEXT,
    -- 1 while the scheme is a placeholder for the checker to detect.
    scheme_detect        INTEGER NOT NULL DEFAULT 0 CHECK (scheme_detect IN (0, 1)),
    status               TEXT    NOT NULL DEFAULT 'unknown'
                                 CHECK (status IN ('unknown', 'alive', 'dead')),
    last_checked         INTEGER,
    last_alive           INTEGER,
    latency_ms           INTEGER,
    anonymity            TEXT    CHECK (anonymity IN ('transparent', 'anonymous', 'elite')),
    https                INTEGER CHECK (https IN (0, 1)),
    exit_ip              TEXT,
    country              TEXT,
    country_source       TEXT    CHECK (country_source IN ('source', 'geoip')),
    hint_anonymity       TEXT    CHECK (hint_anonymity IN ('transparent', 'anonymous', 'elite')),
    hint_https           INTEGER CHECK (hint_https IN (0, 1)),
    first_seen           INTEGER NOT NULL,
    last_seen            INTEGER NOT NULL,
    checks_total         INTEGER NOT NULL DEFAULT 0,
    checks_ok            INTEGER NOT NULL DEFAULT 0,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_reason          TEXT,
    next_check_at        INTEGER NOT NULL,
    UNIQUE (scheme, host, port, username)
);

CREATE INDEX proxies_next_check ON proxies (next_check_at);
CREATE INDEX proxies_status ON proxies (status);

CREATE TABLE sources (
    id               INTEGER PRIMARY KEY,
    name             TEXT    NOT NULL UNIQUE,
    url              TEXT    NOT NULL,
    format           TEXT    NOT NULL,
    last_fetch_at    INTEGER,
    last_ok_at       INTEGER,
    last_http_status INTEGER,
    last_duration_ms INTEGER,
    last_found       INTEGER,
    last_new         INTEGER,
    last_error       TEXT,
    fetches_total    INTEGER NOT NULL DEFAULT 0,
    fetches_failed   INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE proxy_sources (
    proxy_id   INTEGER NOT NULL REFERENCES proxies (id) ON DELETE CASCADE,
    source_id  INTEGER NOT NULL REFERENCES sources (id) ON DELETE CASCADE,
    first_seen INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    PRIMARY KEY (proxy_id, source_id)
) WITHOUT ROWID;

CREATE INDEX proxy_sources_source ON proxy_sources (source_id);
