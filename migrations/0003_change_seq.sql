-- Which rows changed since a reader last looked: every transaction that
-- changes what serving depends on bumps meta.change_seq and stamps the rows
-- it writes. Writers are serialised by SQLite's write lock, so the numbers
-- follow commit order across processes: a daemon catches up with verdicts a
-- `proxywarden check` beside it wrote by reading the rows above its mark.
CREATE TABLE meta (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    change_seq INTEGER NOT NULL
);
INSERT INTO meta (id, change_seq) VALUES (1, 0);

ALTER TABLE proxies ADD COLUMN changed_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX proxies_changed ON proxies (changed_seq);
