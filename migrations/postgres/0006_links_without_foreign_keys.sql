-- A link's foreign keys cost a check of the proxy and of the source, each
-- locking that row, for every link written: half of a harvest's time on
-- lists of 100,000. Links go with their proxy or source through triggers
-- instead, one statement per delete, as on SQLite.
ALTER TABLE proxy_sources DROP CONSTRAINT proxy_sources_proxy_id_fkey;
ALTER TABLE proxy_sources DROP CONSTRAINT proxy_sources_source_id_fkey;

CREATE FUNCTION proxywarden_delete_proxy_links() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM proxy_sources WHERE proxy_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;
CREATE TRIGGER proxies_delete_links AFTER DELETE ON proxies
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION proxywarden_delete_proxy_links();

CREATE FUNCTION proxywarden_delete_source_links() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM proxy_sources WHERE source_id IN (SELECT id FROM gone);
    RETURN NULL;
END
$$;
CREATE TRIGGER sources_delete_links AFTER DELETE ON sources
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT
    EXECUTE FUNCTION proxywarden_delete_source_links();
