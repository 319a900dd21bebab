-- Proxies counted by what /stats and /metrics show, kept exact inside
-- every transaction that writes proxies, by whichever process writes: the
-- API reads these few rows instead of scanning the proxies table per
-- request. '' stands for NULL so that the key is unique. Updates and
-- deletes keep the counts by the triggers below; a harvest, the only
-- writer that adds proxies, adds its new ones to the counts once per
-- transaction (a trigger per row made harvests over twice as slow).
CREATE TABLE proxy_counts (
    status    TEXT    NOT NULL,
    scheme    TEXT    NOT NULL,
    country   TEXT    NOT NULL,
    anonymity TEXT    NOT NULL,
    reason    TEXT    NOT NULL,
    n         INTEGER NOT NULL,
    PRIMARY KEY (status, scheme, country, anonymity, reason)
) WITHOUT ROWID;

INSERT INTO proxy_counts (status, scheme, country, anonymity, reason, n)
SELECT status, scheme, coalesce(country, ''), coalesce(anonymity, ''),
       coalesce(last_reason, ''), count(*)
FROM proxies GROUP BY 1, 2, 3, 4, 5;

CREATE TRIGGER proxy_counts_delete AFTER DELETE ON proxies BEGIN
    UPDATE proxy_counts SET n = n - 1
    WHERE status = old.status AND scheme = old.scheme AND country = coalesce(old.country, '')
      AND anonymity = coalesce(old.anonymity, '') AND reason = coalesce(old.last_reason, '');
END;

CREATE TRIGGER proxy_counts_update
AFTER UPDATE OF status, scheme, country, anonymity, last_reason ON proxies
WHEN old.status IS NOT new.status OR old.scheme IS NOT new.scheme
  OR old.country IS NOT new.country OR old.anonymity IS NOT new.anonymity
  OR old.last_reason IS NOT new.last_reason
BEGIN
    UPDATE proxy_counts SET n = n - 1
    WHERE status = old.status AND scheme = old.scheme AND country = coalesce(old.country, '')
      AND anonymity = coalesce(old.anonymity, '') AND reason = coalesce(old.last_reason, '');
    INSERT INTO proxy_counts (status, scheme, country, anonymity, reason, n)
    VALUES (new.status, new.scheme, coalesce(new.country, ''), coalesce(new.anonymity, ''),
            coalesce(new.last_reason, ''), 1)
    ON CONFLICT (status, scheme, country, anonymity, reason) DO UPDATE SET n = n + 1;
END;
