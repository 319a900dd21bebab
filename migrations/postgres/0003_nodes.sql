-- Several nodes on one database. A failure in use is stamped on the proxy
-- (failed_in_use_at, unix ms) with a change number, so that every node
-- following the change sequence stops serving it until a check newer than
-- the failure passes. A scheduled harvest of a source is claimed once per
-- slot: the first node to insert (source, slot) runs it, the others skip it.
ALTER TABLE proxies ADD COLUMN failed_in_use_at BIGINT;

CREATE TABLE harvest_claims (
    source     TEXT   NOT NULL,
    slot       BIGINT NOT NULL,
    node       TEXT   NOT NULL,
    claimed_at BIGINT NOT NULL,
    PRIMARY KEY (source, slot)
);
CREATE INDEX harvest_claims_claimed ON harvest_claims (claimed_at);
CREATE INDEX proxies_lease_node ON proxies (lease_node) WHERE lease_node IS NOT NULL;

-- Every new change number wakes the nodes that follow the sequence: NOTIFY
-- is delivered when the writing transaction commits (never before, so a
-- woken reader sees the rows), and notices of one transaction fold into one.
CREATE FUNCTION proxywarden_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('proxywarden_changes', NEW.change_seq::text);
    RETURN NULL;
END
$$;
CREATE TRIGGER meta_changed AFTER UPDATE OF change_seq ON meta
    FOR EACH ROW WHEN (NEW.change_seq <> OLD.change_seq)
    EXECUTE FUNCTION proxywarden_changed();
