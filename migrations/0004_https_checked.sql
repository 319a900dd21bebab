-- When HTTPS (CONNECT + TLS) was last tested through the proxy: the test
-- runs on its own, slower cadence (check.https_recheck), not on every check.
ALTER TABLE proxies ADD COLUMN https_checked_at INTEGER;
-- Before this column the test ran on every passing check, so a known flag
-- was last tested when the proxy last passed.
UPDATE proxies SET https_checked_at = last_alive WHERE https IS NOT NULL;
