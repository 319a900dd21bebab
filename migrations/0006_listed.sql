-- A re-harvest of an unchanged list writes nothing per proxy. A source's
-- latest list is marked on its links (listed = 1) and the time of that list
-- is kept once, on the source (listed_at): a listed link was last seen at
-- its source's listed_at. When a later list leaves a proxy out, its link is
-- unlisted and its last_seen (and the proxy's) set to the source's previous
-- listed_at. Links written before this migration are unlisted, with the
-- last_seen they had.
ALTER TABLE sources ADD COLUMN listed_at INTEGER;
ALTER TABLE proxy_sources ADD COLUMN listed INTEGER NOT NULL DEFAULT 0 CHECK (listed IN (0, 1));
-- Replaces the index on source_id alone: finding a source's listed links
-- (to unlist those a new list leaves out) reads this index only.
DROP INDEX proxy_sources_source;
CREATE INDEX proxy_sources_listed ON proxy_sources (source_id, listed);
