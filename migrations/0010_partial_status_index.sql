-- The status index leaves out proxies not checked yet. Nothing looks
-- proxies up as `unknown` by index: a listing of unknown proxies reads the
-- table (they are most of it when any are), while alive and dead ones are
-- few among many and looked up often. A harvest's new proxies, all
-- unknown, no longer write the index. A query naming `status = 'alive'`
-- or `status = 'dead'` (a bound value too) uses it as before.
DROP INDEX proxies_status;
CREATE INDEX proxies_status ON proxies (status) WHERE status = 'alive' OR status = 'dead';
