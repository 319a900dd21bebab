-- The proxies table again, with each CHECK that lists values written as
-- comparisons. SQLite checks `x IN ('a', 'b')` by building a temporary
-- b-tree for the list on every row written: with nine of them, that was
-- most of the cost of storing a new proxy. `x = 'a' OR x = 'b'` accepts
-- and refuses exactly the same values (NULL included) at next to no cost.
-- A CHECK cannot be altered in place, so the table is rebuilt (SQLite's
-- documented procedure; the migration runs with foreign keys off so that
-- dropping the old table leaves the links to its rows alone).
CREATE TABLE proxies_new (
    id                   INTEGER PRIMARY KEY,
    scheme               TEXT    NOT NULL
                                 CHECK (scheme = 'http' OR scheme = 'socks4' OR scheme = 'socks5'),
    host                 TEXT    NOT NULL,
    port                 INTEGER NOT NULL CHECK (port BETWEEN 1 AND 65535),
    -- '' when there is none, so that the UNIQUE identity below applies.
    username             TEXT    NOT NULL DEFAULT '',
    password             TEXT,
    -- 1 while the scheme is a placeholder for the checker to detect.
    scheme_detect        INTEGER NOT NULL DEFAULT 0
                                 CHECK (scheme_detect = 0 OR scheme_detect = 1),
    status               TEXT    NOT NULL DEFAULT 'unknown'
                                 CHECK (status = 'unknown' OR status = 'alive' OR status = 'dead'),
    last_checked         INTEGER,
    last_alive           INTEGER,
    latency_ms           INTEGER,
    anonymity            TEXT    CHECK (anonymity = 'transparent' OR anonymity = 'anonymous'
                                        OR anonymity = 'elite'),
    https                INTEGER CHECK (https = 0 OR https = 1),
    exit_ip              TEXT,
    country              TEXT,
    country_source       TEXT    CHECK (country_source = 'source' OR country_source = 'geoip'),
    hint_anonymity       TEXT    CHECK (hint_anonymity = 'transparent'
                                        OR hint_anonymity = 'anonymous'
                                        OR hint_anonymity = 'elite'),
    hint_https           INTEGER CHECK (hint_https = 0 OR hint_https = 1),
    first_seen           INTEGER NOT NULL,
    last_seen            INTEGER NOT NULL,
    checks_total         INTEGER NOT NULL DEFAULT 0,
    checks_ok            INTEGER NOT NULL DEFAULT 0,
    consecutive_failures INTEGER NOT NULL DEFAULT 0,
    last_reason          TEXT,
    next_check_at        INTEGER NOT NULL,
    reports_ok           INTEGER NOT NULL DEFAULT 0,
    reports_failed       INTEGER NOT NULL DEFAULT 0,
    changed_seq          INTEGER NOT NULL DEFAULT 0,
    https_checked_at     INTEGER,
    UNIQUE (scheme, host, port, username)
);
INSERT INTO proxies_new (id, scheme, host, port, username, password, scheme_detect, status,
        last_checked, last_alive, latency_ms, anonymity, https, exit_ip, country,
        country_source, hint_anonymity, hint_https, first_seen, last_seen, checks_total,
        checks_ok, consecutive_failures, last_reason, next_check_at, reports_ok,
        reports_failed, changed_seq, https_checked_at)
    SELECT id, scheme, host, port, username, password, scheme_detect, status,
        last_checked, last_alive, latency_ms, anonymity, https, exit_ip, country,
        country_source, hint_anonymity, hint_https, first_seen, last_seen, checks_total,
        checks_ok, consecutive_failures, last_reason, next_check_at, reports_ok,
        reports_failed, changed_seq, https_checked_at
    FROM proxies ORDER BY id;
DROP TABLE proxies;
ALTER TABLE proxies_new RENAME TO proxies;
CREATE INDEX proxies_next_check ON proxies (next_check_at);
CREATE INDEX proxies_status ON proxies (status);
CREATE INDEX proxies_changed ON proxies (changed_seq);
