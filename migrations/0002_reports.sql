-- Client feedback through POST /proxies/{id}/report.
ALTER TABLE proxies ADD COLUMN reports_ok INTEGER NOT NULL DEFAULT 0;
ALTER TABLE proxies ADD COLUMN reports_failed INTEGER NOT NULL DEFAULT 0;
