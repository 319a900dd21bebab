-- A row a minute of what the pool looked like and what went through it, for
-- the dashboard's 24 h and 7 day charts. The daemon deletes rows older than
-- its retention as it writes new ones, so the table stays small (about
-- 11,500 rows for 8 days).
CREATE TABLE snapshots (
    -- The minute (unix ms, a multiple of 60,000).
    at INTEGER PRIMARY KEY,
    -- Proxies servable then (alive and fresh), and stored by status.
    servable INTEGER NOT NULL,
    alive INTEGER NOT NULL,
    dead INTEGER NOT NULL,
    unknown INTEGER NOT NULL,
    -- Checks committed during the minute before, and of those alive.
    checks INTEGER NOT NULL,
    checks_alive INTEGER NOT NULL,
    -- Gateway requests and tunnels answered, and upstream failures, during
    -- the minute before.
    gateway_requests INTEGER NOT NULL,
    gateway_failures INTEGER NOT NULL
);
