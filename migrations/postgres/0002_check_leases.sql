-- Leases on due checks: the node checking a proxy holds it until
-- lease_until (unix ms), so that nodes sharing the database never check
-- one proxy twice in an interval; the verdict clears the lease, and a node
-- that dies loses its leases when they expire.
ALTER TABLE proxies ADD COLUMN lease_until BIGINT;
ALTER TABLE proxies ADD COLUMN lease_node TEXT;
