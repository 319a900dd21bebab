-- Source links keyed by source first, with no other index, as on SQLite.
-- The index of links by proxy cost every link written a second b-tree
-- insert beside the primary key's: a third of a first harvest's writes.
-- Keyed by (source, proxy), the primary key serves a source's links and
-- the link of a given proxy and source; a proxy's links are found by one
-- probe per source (sources are few), as the statements that need them
-- write (`source_id = ANY (ARRAY(SELECT id FROM sources)) AND proxy_id =
-- ...`), and counts over many links are hash joins.
DROP INDEX proxy_sources_proxy;

CREATE OR REPLACE FUNCTION proxywarden_delete_proxy_links() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM proxy_sources
    WHERE source_id = ANY (ARRAY(SELECT id FROM sources))
        AND proxy_id = ANY (ARRAY(SELECT id FROM gone));
    RETURN NULL;
END
$$;
