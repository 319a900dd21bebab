-- Several processes on one database. A failure in use is stamped on the
-- proxy (failed_in_use_at, unix ms) with a change number, so that every
-- process following the change sequence stops serving it until a check
-- newer than the failure passes. A scheduled harvest of a source is claimed
-- once per slot: the first process to insert (source, slot) runs it, the
-- others skip it.
ALTER TABLE proxies ADD COLUMN failed_in_use_at INTEGER;

CREATE TABLE harvest_claims (
    source     TEXT    NOT NULL,
    slot       INTEGER NOT NULL,
    node       TEXT    NOT NULL,
    claimed_at INTEGER NOT NULL,
    PRIMARY KEY (source, slot)
);
CREATE INDEX harvest_claims_claimed ON harvest_claims (claimed_at);
CREATE INDEX proxies_lease_node ON proxies (lease_node) WHERE lease_node IS NOT NULL;
