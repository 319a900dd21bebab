-- Storing a new proxy touched more than it needs to. Two changes, each
-- keeping what the rows mean:
--
-- 1. The source links lose their foreign-key clauses. With foreign keys
--    enforced, every multi-row insert of new proxies and links searched
--    the links for each new proxy id (a parent row's insert can settle a
--    pending violation) and kept a statement journal in case it had to
--    undo itself. Only the harvest writes links, always to a proxy and a
--    source it has just found or written; what the clauses also did, drop
--    a proxy's or a source's links with it, the triggers below do.
-- 2. The index of change numbers leaves out rows never changed since they
--    were harvested (change number 0): nothing reads those by change
--    number (a new proxy is not served before its first check gives it
--    one), and a harvest of new proxies no longer writes the index.
--    Queries by change number name `changed_seq > 0` to use it.
--
-- The links table is rebuilt (SQLite's documented procedure; migrations
-- run with foreign keys off, so dropping the old table deletes nothing).
CREATE TABLE proxy_sources_new (
    proxy_id   INTEGER NOT NULL,
    source_id  INTEGER NOT NULL,
    first_seen INTEGER NOT NULL,
    last_seen  INTEGER NOT NULL,
    listed     INTEGER NOT NULL DEFAULT 0 CHECK (listed = 0 OR listed = 1),
    PRIMARY KEY (proxy_id, source_id)
) WITHOUT ROWID;
INSERT INTO proxy_sources_new (proxy_id, source_id, first_seen, last_seen, listed)
    SELECT proxy_id, source_id, first_seen, last_seen, listed FROM proxy_sources
    WHERE proxy_id IN (SELECT id FROM proxies) AND source_id IN (SELECT id FROM sources)
    ORDER BY proxy_id, source_id;
DROP TABLE proxy_sources;
ALTER TABLE proxy_sources_new RENAME TO proxy_sources;
CREATE INDEX proxy_sources_listed ON proxy_sources (source_id, listed);

CREATE TRIGGER proxies_delete_links AFTER DELETE ON proxies BEGIN
    DELETE FROM proxy_sources WHERE proxy_id = old.id;
END;
CREATE TRIGGER sources_delete_links AFTER DELETE ON sources BEGIN
    DELETE FROM proxy_sources WHERE source_id = old.id;
END;

DROP INDEX proxies_changed;
CREATE INDEX proxies_changed ON proxies (changed_seq) WHERE changed_seq > 0;
