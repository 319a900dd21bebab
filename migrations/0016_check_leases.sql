-- Leases on due checks: the node checking a proxy holds it until
-- lease_until (unix ms), so that nodes sharing a database never check one
-- proxy twice in an interval; the verdict clears the lease, and a node
-- that dies loses its leases when they expire. A single node leases too
-- (or reads due pages without leasing, as before).
ALTER TABLE proxies ADD COLUMN lease_until INTEGER;
ALTER TABLE proxies ADD COLUMN lease_node TEXT;
