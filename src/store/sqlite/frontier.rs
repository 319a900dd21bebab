//! SQLite: crawl frontiers, each on a connection of its own owned by a
//! thread of its own. The crawl's task sends it calls over a channel and
//! awaits each reply through a oneshot, so a frontier never blocks an async
//! worker; calls run in the order sent, and a batch is one open transaction
//! on that connection, so what a turn of the crawl's loop wrote is seen by
//! its next reads and committed whole.
//!
//! A crawl that runs on a thread of its own, with its frontier in a
//! database of its own (no other writer to wait for), keeps the connection
//! on that thread instead ([`Sqlite::frontier_here`]): each call is a
//! plain function call, with no hand-over to another thread and back, but
//! for one that adds many URLs, which the blocking pool runs while the
//! crawl's thread goes on.

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{mpsc, oneshot};

use super::BUSY_TIMEOUT;
use super::Sqlite;
use crate::store::{NewUrl, Queued, StoreError, UrlState, now_ms};

/// Calls waiting for a frontier's thread; the crawl awaits each reply, so
/// only calls that need none (a page's end without links) ever queue.
const QUEUE: usize = 64;

/// On a connection owned by the crawl's thread, calls that add at most
/// this many URLs run there; larger ones on the blocking pool.
const ADD_HERE_MAX: usize = 64;

/// A call for the frontier's thread.
type Call = Box<dyn FnOnce(&mut Worker) + Send>;

/// One crawl's frontier: a handle to the thread that owns its connection,
/// or the connection itself.
pub(crate) struct Frontier {
    home: Home,
    /// A transaction is open on the thread (as of the last call).
    open: bool,
    path: std::path::PathBuf,
    job: i64,
}

/// Where a frontier's connection lives.
enum Home {
    /// On a thread of its own, reached over a channel.
    Thread {
        calls: mpsc::Sender<Call>,
        /// Ends when the thread has closed the connection.
        closed: oneshot::Receiver<()>,
    },
    /// On the caller's thread: calls block it while they run, but for
    /// large ones, which the blocking pool runs (the connection goes there
    /// and back; `None` while it is away, or after a call was dropped
    /// there).
    Here(Option<Box<Worker>>),
}

impl std::fmt::Debug for Frontier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontier")
            .field("path", &self.path)
            .field("job", &self.job)
            .finish()
    }
}

/// The frontier's connection, on its thread.
struct Worker {
    conn: Connection,
    job: i64,
    /// A transaction is open: writes since the last commit.
    open: bool,
    /// Pages are leased to this node for this long when handed out.
    lease: Option<(String, std::time::Duration)>,
    /// A call sent without waiting for its reply failed: the next call
    /// answers with this.
    failed: Option<StoreError>,
    /// Keeps the database (and its writer) open while the crawl runs.
    _db: Sqlite,
}

impl Sqlite {
    pub(crate) async fn frontier(&self, job: i64) -> Result<crate::store::Frontier, StoreError> {
        if self.inner.writer.is_none() {
            return Err(StoreError::ReadOnly);
        }
        let path = self.path().to_path_buf();
        let db = self.clone();
        let (calls, mut rx) = mpsc::channel::<Call>(QUEUE);
        let (ready_tx, ready) = oneshot::channel();
        let (closed_tx, closed) = oneshot::channel();
        let opened = path.clone();
        std::thread::Builder::new()
            .name("proxywarden-crawl-frontier".into())
            .spawn(move || {
                let mut worker = match Worker::open(&opened, job, db) {
                    Ok(w) => {
                        let _ = ready_tx.send(Ok(()));
                        w
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Some(call) = rx.blocking_recv() {
                    call(&mut worker);
                }
                // An open batch is rolled back with the connection: as
                // after kill -9.
                drop(worker);
                drop(closed_tx);
            })
            .map_err(StoreError::Thread)?;
        ready.await.map_err(|_| StoreError::Closed)??;
        Ok(Frontier {
            home: Home::Thread { calls, closed },
            open: false,
            path,
            job,
        }
        .into())
    }
}

impl Sqlite {
    /// Job `job`'s frontier on a connection owned by the calling thread:
    /// a call blocks it while SQLite works (and while it waits for another
    /// writer, up to the busy timeout), but for one adding more than
    /// [`ADD_HERE_MAX`] URLs. For a crawl on a thread of its own whose
    /// database no one else writes.
    pub(crate) fn frontier_here(&self, job: i64) -> Result<crate::store::Frontier, StoreError> {
        if self.inner.writer.is_none() {
            return Err(StoreError::ReadOnly);
        }
        let path = self.path().to_path_buf();
        let worker = Worker::open(&path, job, self.clone())?;
        Ok(Frontier {
            home: Home::Here(Some(Box::new(worker))),
            open: false,
            path,
            job,
        }
        .into())
    }
}

impl Worker {
    /// Runs call `f`, unless a call sent without waiting failed: that
    /// failure is this call's answer.
    fn run<T>(
        &mut self,
        f: impl FnOnce(&mut Worker) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        match self.failed.take() {
            Some(e) => Err(e),
            None => f(self),
        }
    }

    fn open(path: &std::path::Path, job: i64, db: Sqlite) -> Result<Worker, StoreError> {
        let conn = Connection::open(path).map_err(|e| StoreError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
        conn.busy_timeout(BUSY_TIMEOUT)?;
        // A small page cache: the frontier lives on disk, not in memory. A
        // log grown by a crawl's batches is cut back to 64 MiB once it is
        // copied into the database, not kept at its largest.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA cache_size = -8000;
             PRAGMA journal_size_limit = 67108864;",
        )?;
        Ok(Worker {
            conn,
            job,
            open: false,
            lease: None,
            failed: None,
            _db: db,
        })
    }
}

impl Frontier {
    /// Runs `f` on the frontier's thread and waits for its result.
    async fn call<T: Send + 'static>(
        &mut self,
        f: impl FnOnce(&mut Worker) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let calls = match &mut self.home {
            Home::Here(w) => {
                let w = w.as_mut().ok_or(StoreError::Closed)?;
                let r = w.run(f);
                self.open = w.open;
                return r;
            }
            Home::Thread { calls, .. } => calls,
        };
        let (tx, rx) = oneshot::channel();
        let call: Call = Box::new(move |w: &mut Worker| {
            let r = w.run(f);
            let _ = tx.send((r, w.open));
        });
        calls.send(call).await.map_err(|_| StoreError::Closed)?;
        let (r, open) = rx.await.map_err(|_| StoreError::Closed)?;
        self.open = open;
        r
    }

    /// [`Frontier::call`] for a call that adds `urls` URLs: when the
    /// connection is the caller's and they are many, the blocking pool runs
    /// it, so that the crawl's thread goes on with its other pages (as it
    /// does while the frontier's own thread works).
    async fn call_adding<T: Send + 'static>(
        &mut self,
        urls: usize,
        f: impl FnOnce(&mut Worker) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let slot = match &mut self.home {
            Home::Here(slot) if urls > ADD_HERE_MAX => slot,
            _ => return self.call(f).await,
        };
        let mut w = slot.take().ok_or(StoreError::Closed)?;
        let (w, r) = tokio::task::spawn_blocking(move || {
            let r = w.run(f);
            (w, r)
        })
        .await
        .map_err(|_| StoreError::Cancelled)?;
        self.open = w.open;
        *slot = Some(w);
        r
    }

    /// Sends `f` to the frontier's thread without waiting for it: a
    /// failure is the answer to the next call.
    async fn send(
        &mut self,
        f: impl FnOnce(&mut Worker) -> Result<(), StoreError> + Send + 'static,
    ) -> Result<(), StoreError> {
        let run = move |w: &mut Worker| {
            if w.failed.is_none()
                && let Err(e) = f(w)
            {
                w.failed = Some(e);
            }
        };
        match &mut self.home {
            Home::Here(w) => {
                run(w.as_mut().ok_or(StoreError::Closed)?);
                Ok(())
            }
            Home::Thread { calls, .. } => calls
                .send(Box::new(run))
                .await
                .map_err(|_| StoreError::Closed),
        }
    }

    pub(crate) async fn lease_pages(&mut self, node: &str, ttl: std::time::Duration) {
        let node = node.to_owned();
        let _ = self
            .send(move |w| {
                w.lease = Some((node, ttl));
                Ok(())
            })
            .await;
    }

    pub async fn meta(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        let key = key.to_owned();
        self.call(move |w| w.meta(&key)).await
    }

    pub async fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        let (key, value) = (key.to_owned(), value.to_owned());
        self.call(move |w| w.set_meta(&key, &value)).await
    }

    pub async fn commit(&mut self, meta: &[(&str, String)]) -> Result<(), StoreError> {
        if !self.open {
            return Ok(());
        }
        let meta: Vec<(String, String)> = meta
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        self.call(move |w| w.commit(&meta)).await
    }

    pub fn dirty(&self) -> bool {
        self.open
    }

    pub async fn add(&mut self, urls: &[NewUrl]) -> Result<Vec<Queued>, StoreError> {
        let urls = urls.to_vec();
        self.call_adding(urls.len(), move |w| w.add(&urls)).await
    }

    /// A page's end without links is sent without waiting for it: nothing
    /// comes back, and a failure is the answer to the next call (at the
    /// latest the batch's commit).
    pub async fn finish(
        &mut self,
        id: i64,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<Vec<Queued>, StoreError> {
        if links.is_empty() {
            self.send(move |w| w.finish(id, state, attempts, &[]).map(drop))
                .await?;
            self.open = true;
            return Ok(Vec::new());
        }
        let links = links.to_vec();
        self.call_adding(links.len(), move |w| w.finish(id, state, attempts, &links))
            .await
    }

    pub async fn mark_seen_done(
        &mut self,
        url: &str,
        host: &str,
        depth: u32,
    ) -> Result<(), StoreError> {
        let (url, host) = (url.to_owned(), host.to_owned());
        self.call(move |w| w.mark_seen_done(&url, &host, depth))
            .await
    }

    pub async fn hosts_with_work_after(
        &mut self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let after = after.to_owned();
        self.call(move |w| w.hosts_with_work_after(&after, limit))
            .await
    }

    pub async fn waiting(
        &mut self,
        host: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Queued>, StoreError> {
        let host = host.to_owned();
        self.call(move |w| w.waiting(&host, after, limit)).await
    }

    pub async fn count(&mut self, state: UrlState) -> Result<u64, StoreError> {
        self.call(move |w| w.count(state)).await
    }

    pub async fn held_elsewhere(&mut self) -> Result<Option<i64>, StoreError> {
        self.call(|w| w.held_elsewhere()).await
    }

    pub async fn total(&mut self) -> Result<u64, StoreError> {
        self.call(|w| w.total()).await
    }

    pub async fn requeue_failed(&mut self) -> Result<usize, StoreError> {
        self.call(|w| w.requeue_failed()).await
    }

    /// Ends the thread and waits until it has closed the connection (or
    /// closes the connection here).
    pub async fn close(self) {
        match self.home {
            Home::Thread { calls, closed } => {
                drop(calls);
                let _ = closed.await;
            }
            Home::Here(worker) => drop(worker),
        }
    }
}

const SET_META: &str = "INSERT INTO crawl_meta (job, key, value) VALUES (?1, ?2, ?3)
     ON CONFLICT (job, key) DO UPDATE SET value = excluded.value";

impl Worker {
    /// The lease's node and its end from now, or NULLs.
    fn lease_now(&self) -> (Option<&str>, Option<i64>) {
        match &self.lease {
            Some((node, ttl)) => (
                Some(node),
                Some(now_ms().saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX))),
            ),
            None => (None, None),
        }
    }

    /// A stored setting.
    pub fn meta(&self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .conn
            .query_row(
                "SELECT value FROM crawl_meta WHERE job = ?1 AND key = ?2",
                params![self.job, key],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Stores a setting (in the open batch, if there is one).
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        self.conn
            .prepare_cached(SET_META)?
            .execute(params![self.job, key, value])?;
        Ok(())
    }

    /// Opens the batch's transaction unless one is open.
    fn begin(&mut self) -> Result<(), StoreError> {
        if !self.open {
            self.conn.execute_batch("BEGIN IMMEDIATE")?;
            self.open = true;
        }
        Ok(())
    }

    /// Commits what was written since the last commit, with `meta` (the
    /// output lengths that include the lines of the pages it finishes).
    pub fn commit(&mut self, meta: &[(String, String)]) -> Result<(), StoreError> {
        if !self.open {
            return Ok(());
        }
        let run = |conn: &Connection, job: i64| -> rusqlite::Result<()> {
            let mut st = conn.prepare_cached(SET_META)?;
            for (k, v) in meta {
                st.execute(params![job, k, v])?;
            }
            conn.execute_batch("COMMIT")
        };
        let r = run(&self.conn, self.job);
        self.open = false;
        if r.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        Ok(r?)
    }

    /// Adds `urls` not seen before and commits; returns those it added.
    pub fn add(&mut self, urls: &[NewUrl]) -> Result<Vec<Queued>, StoreError> {
        self.begin()?;
        let added = insert(&self.conn, self.job, urls, self.lease_now())?;
        self.commit(&[])?;
        Ok(added)
    }

    /// Records page `id`'s end (its state and attempts) and adds the URLs
    /// it linked to, in the open batch: nothing is durable before
    /// [`Frontier::commit`], which also stores the output lengths.
    pub fn finish(
        &mut self,
        id: i64,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<Vec<Queued>, StoreError> {
        self.begin()?;
        self.conn
            .prepare_cached(
                "UPDATE crawl_urls SET state = ?2, attempts = attempts + ?3,
                        lease_node = NULL, lease_until = NULL
                 WHERE id = ?1",
            )?
            .execute(params![id, state as i64, attempts])?;
        Ok(insert(&self.conn, self.job, links, self.lease_now())?)
    }

    /// Marks a URL done without fetching it (it was reached through a
    /// redirect), if it is still waiting.
    pub fn mark_seen_done(&mut self, url: &str, host: &str, depth: u32) -> Result<(), StoreError> {
        self.begin()?;
        self.conn
            .prepare_cached(
                "INSERT INTO crawl_urls (job, url, host, depth, state) VALUES (?1, ?2, ?3, ?4, 2)
                 ON CONFLICT (job, url) DO UPDATE
                 SET state = 2, lease_node = NULL, lease_until = NULL WHERE state = 0",
            )?
            .execute(params![self.job, url, host, depth])?;
        Ok(())
    }

    /// Up to `limit` hosts with waiting URLs named after `after`, by name.
    pub fn hosts_with_work_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let (node, _) = self.lease_now();
        let mut st = self.conn.prepare_cached(
            "SELECT DISTINCT host FROM crawl_urls WHERE job = ?1 AND state = 0 AND host > ?2
               AND (?4 IS NULL OR lease_node IS NULL OR lease_node = ?4 OR lease_until <= ?5)
             ORDER BY host LIMIT ?3",
        )?;
        let hosts = st
            .query_map(
                params![self.job, after, limit as i64, node, now_ms()],
                |r| r.get(0),
            )?
            .collect::<rusqlite::Result<_>>()?;
        Ok(hosts)
    }

    /// Up to `limit` waiting URLs of `host` after row `after`, in
    /// discovery order.
    pub fn waiting(
        &mut self,
        host: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Queued>, StoreError> {
        let row = |r: &rusqlite::Row<'_>| {
            Ok(Queued {
                id: r.get(0)?,
                url: r.get(1)?,
                host: r.get(2)?,
                depth: r.get(3)?,
                parent: r.get(4)?,
            })
        };
        let (node, until) = self.lease_now();
        let Some(node) = node else {
            let mut st = self.conn.prepare_cached(
                "SELECT id, url, host, depth, parent FROM crawl_urls
                 WHERE job = ?1 AND host = ?2 AND state = 0 AND id > ?3 ORDER BY id LIMIT ?4",
            )?;
            let rows = st
                .query_map(params![self.job, host, after, limit as i64], row)?
                .collect::<rusqlite::Result<_>>()?;
            return Ok(rows);
        };
        let node = node.to_owned();
        self.begin()?;
        let mut st = self.conn.prepare_cached(
            "UPDATE crawl_urls SET lease_node = ?5, lease_until = ?6 WHERE id IN (
                 SELECT id FROM crawl_urls
                 WHERE job = ?1 AND host = ?2 AND state = 0 AND id > ?3
                   AND (lease_node IS NULL OR lease_node = ?5 OR lease_until <= ?7)
                 ORDER BY id LIMIT ?4)
             RETURNING id, url, host, depth, parent",
        )?;
        let mut rows: Vec<Queued> = st
            .query_map(
                params![self.job, host, after, limit as i64, node, until, now_ms()],
                row,
            )?
            .collect::<rusqlite::Result<_>>()?;
        rows.sort_by_key(|q| q.id);
        Ok(rows)
    }

    /// URLs in `state`.
    pub fn count(&self, state: UrlState) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM crawl_urls WHERE job = ?1 AND state = ?2",
            params![self.job, state as i64],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// See [`crate::store::Frontier::held_elsewhere`].
    pub fn held_elsewhere(&self) -> Result<Option<i64>, StoreError> {
        let Some((node, _)) = &self.lease else {
            return Ok(None);
        };
        let at: Option<i64> = self.conn.query_row(
            "SELECT min(lease_until) FROM crawl_urls
             WHERE job = ?1 AND state = 0 AND lease_node IS NOT NULL
               AND lease_node <> ?2 AND lease_until > ?3",
            params![self.job, node, now_ms()],
            |r| r.get(0),
        )?;
        Ok(at)
    }

    /// Every URL the crawl knows.
    pub fn total(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row(
            "SELECT count(*) FROM crawl_urls WHERE job = ?1",
            [self.job],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Puts the pages that failed for good back in the queue; how many.
    pub fn requeue_failed(&mut self) -> Result<usize, StoreError> {
        self.commit(&[])?;
        Ok(self.conn.execute(
            "UPDATE crawl_urls SET state = 0, lease_node = NULL, lease_until = NULL
             WHERE job = ?1 AND state = ?2",
            params![self.job, UrlState::Failed as i64],
        )?)
    }
}

/// Adds the URLs not seen before, leased to `lease` (node, until) when it
/// is set.
fn insert(
    conn: &Connection,
    job: i64,
    urls: &[NewUrl],
    lease: (Option<&str>, Option<i64>),
) -> rusqlite::Result<Vec<Queued>> {
    let mut added = Vec::new();
    if lease.0.is_none() {
        let mut st = conn.prepare_cached(
            "INSERT INTO crawl_urls (job, url, host, depth, parent) VALUES (?1, ?2, ?3, ?4, ?5)
             ON CONFLICT (job, url) DO NOTHING",
        )?;
        for u in urls {
            if st.execute(params![job, u.url, u.host, u.depth, u.parent])? > 0 {
                added.push(Queued {
                    id: conn.last_insert_rowid(),
                    url: u.url.clone(),
                    host: u.host.clone(),
                    depth: u.depth,
                    parent: u.parent.clone(),
                });
            }
        }
        return Ok(added);
    }
    let mut st = conn.prepare_cached(
        "INSERT INTO crawl_urls (job, url, host, depth, parent, lease_node, lease_until)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (job, url) DO NOTHING",
    )?;
    for u in urls {
        if st.execute(params![
            job, u.url, u.host, u.depth, u.parent, lease.0, lease.1
        ])? > 0
        {
            added.push(Queued {
                id: conn.last_insert_rowid(),
                url: u.url.clone(),
                host: u.host.clone(),
                depth: u.depth,
                parent: u.parent.clone(),
            });
        }
    }
    Ok(added)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn new(url: &str, depth: u32) -> NewUrl {
        NewUrl {
            url: url.into(),
            host: "h".into(),
            depth,
            parent: None,
        }
    }

    #[tokio::test]
    async fn urls_are_added_once_per_job_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let store = Store::open(&path).unwrap();
        let mut f = store.frontier(1).await.unwrap();
        let added = f
            .add(&[new("http://h/a", 0), new("http://h/b", 0)])
            .await
            .unwrap();
        assert_eq!(added.len(), 2);
        assert!(f.add(&[new("http://h/a", 1)]).await.unwrap().is_empty());
        let more = f
            .finish(added[0].id, UrlState::Done, 2, &[new("http://h/c", 1)])
            .await
            .unwrap();
        assert_eq!(more[0].url, "http://h/c");
        f.commit(&[("out_len", "10".into())]).await.unwrap();
        // A batch never committed (a crash) is not kept.
        f.finish(added[1].id, UrlState::Done, 1, &[new("http://h/d", 1)])
            .await
            .unwrap();
        assert!(f.dirty());
        drop(f);
        // Another job's frontier is its own.
        let mut other = store.frontier(2).await.unwrap();
        assert_eq!(other.add(&[new("http://h/a", 0)]).await.unwrap().len(), 1);
        assert_eq!(other.meta("out_len").await.unwrap(), None);
        drop((other, store));

        let store = Store::open(&path).unwrap();
        let mut f = store.frontier(1).await.unwrap();
        assert_eq!(f.meta("out_len").await.unwrap().as_deref(), Some("10"));
        assert_eq!(f.hosts_with_work_after("", 10).await.unwrap(), ["h"]);
        assert!(f.hosts_with_work_after("h", 10).await.unwrap().is_empty());
        let waiting: Vec<String> = f
            .waiting("h", 0, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|q| q.url)
            .collect();
        assert_eq!(waiting, ["http://h/b", "http://h/c"]);
        assert_eq!(f.count(UrlState::Done).await.unwrap(), 1);
        let b = f.waiting("h", 0, 1).await.unwrap().remove(0);
        f.finish(b.id, UrlState::Failed, 1, &[]).await.unwrap();
        assert_eq!(f.requeue_failed().await.unwrap(), 1);
        f.mark_seen_done("http://h/c", "h", 1).await.unwrap();
        assert_eq!(f.waiting("h", 0, 10).await.unwrap().len(), 1);
        assert_eq!(f.total().await.unwrap(), 3);
    }
}
