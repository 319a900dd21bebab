-- Source links keyed by source first, with no other index. The index of
-- links by source and listed flag cost every new proxy a second b-tree
-- insert (about a tenth of storing one); keyed by (source, proxy), the
-- table itself serves what that index did: a source's links in proxy
-- order (unlisting those a new list leaves out, counting a source's
-- proxies), and the link of a given proxy and source. A proxy's links are
-- found by one lookup per source (sources are few), as the queries that
-- need them write: `source_id IN (SELECT id FROM sources) AND proxy_id = ?`
-- or `sources s CROSS JOIN proxy_sources ps` (which keeps that order).
--
-- The triggers that delete links name the table, so they go first and
-- come back after the rebuild (SQLite's documented procedure; migrations
-- run with foreign keys off).
DROP TRIGGER proxies_delete_links;
DROP TRIGGER sources_delete_links;
CREATE TABLE proxy_sources_new (
    proxy_id   INTEGER NOT NULL,
    source_id  INTEGER NOT NULL,
    first_seen INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    listed     INTEGER NOT NULL DEFAULT 0 CHECK (listed = 0 OR listed = 1),
    PRIMARY KEY (source_id, proxy_id)
) WITHOUT ROWID;
INSERT INTO proxy_sources_new (proxy_id, source_id, first_seen, last_seen, listed)
    SELECT proxy_id, source_id, first_seen, last_seen, listed FROM proxy_sources
    ORDER BY source_id, proxy_id;
DROP TABLE proxy_sources;
ALTER TABLE proxy_sources_new RENAME TO proxy_sources;

CREATE TRIGGER proxies_delete_links AFTER DELETE ON proxies BEGIN
    DELETE FROM proxy_sources WHERE source_id IN (SELECT id FROM sources) AND proxy_id = old.id;
END;
CREATE TRIGGER sources_delete_links AFTER DELETE ON sources BEGIN
    DELETE FROM proxy_sources WHERE source_id = old.id;
END;
