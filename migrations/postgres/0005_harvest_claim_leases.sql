-- A harvest claim is held while its node harvests: lease_until (unix ms) is
-- renewed by the node's heartbeat and cleared (NULL) when the harvest ends.
-- A claim whose lease ended before its harvest did belongs to a node that
-- died: another node takes it over and harvests the source. Claims made
-- before this migration are finished harvests.
ALTER TABLE harvest_claims ADD COLUMN lease_until BIGINT;
CREATE INDEX harvest_claims_open ON harvest_claims (lease_until) WHERE lease_until IS NOT NULL;
