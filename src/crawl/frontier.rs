//! The crawl's state in its own SQLite file (WAL): every URL seen, its
//! depth, parent and state, and the crawl's settings and output offsets.
//! Finished pages are committed in small batches (what the crawler handled
//! in one turn of its loop, at most the pages in flight), so a crawl of
//! millions of URLs keeps only queue heads in memory and resumes after
//! `kill -9`: a page is marked done in the same commit that records the
//! output length including its line.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};

/// A URL's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UrlState {
    /// Waiting (or in flight: nothing marks a fetch as started, so a
    /// crash leaves it waiting and it is fetched again).
    Queued = 0,
    /// Fetched and written out.
    Done = 2,
    /// Failed for good (written out with its error).
    Failed = 3,
    /// Not fetched: robots.txt disallows it.
    Disallowed = 4,
}

/// A URL waiting in the frontier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// Row id: discovery order.
    pub id: i64,
    /// The normalised URL.
    pub url: String,
    /// Its host key (`host[:port]`): the politeness unit.
    pub host: String,
    /// Links from a seed.
    pub depth: u32,
    /// The page it was found on.
    pub parent: Option<String>,
}

/// A URL to add.
#[derive(Clone, Debug)]
pub struct NewUrl {
    /// The normalised URL.
    pub url: String,
    /// Its host key.
    pub host: String,
    /// Links from a seed.
    pub depth: u32,
    /// The page it was found on.
    pub parent: Option<String>,
}

/// Why the crawl state could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FrontierError {
    /// SQLite failed.
    #[error("crawl state {path}: {source}")]
    Sqlite {
        /// The state file.
        path: String,
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// The temporary state file could not be made.
    #[error("cannot create a temporary crawl state file: {0}")]
    Temp(std::io::Error),
}

/// The frontier and seen set.
pub struct Frontier {
    conn: Connection,
    path: String,
    /// A transaction is open: writes since the last [`Frontier::commit`].
    open: bool,
    /// Removes a temporary state file when the crawl ends.
    _temp: Option<tempfile::TempPath>,
}

impl std::fmt::Debug for Frontier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontier")
            .field("path", &self.path)
            .finish()
    }
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS urls (
    id INTEGER PRIMARY KEY,
    url TEXT NOT NULL UNIQUE,
    host TEXT NOT NULL,
    depth INTEGER NOT NULL,
    parent TEXT,
    state INTEGER NOT NULL DEFAULT 0,
    attempts INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS urls_waiting ON urls(host, id) WHERE state = 0;
";

impl Frontier {
    /// Opens (creating) the state at `path`, or a temporary file that is
    /// removed when the frontier is dropped.
    pub fn open(path: Option<&Path>) -> Result<Frontier, FrontierError> {
        let (path, temp) = match path {
            Some(p) => (p.to_path_buf(), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("proxywarden-crawl-")
                    .suffix(".db")
                    .tempfile()
                    .map_err(FrontierError::Temp)?
                    .into_temp_path();
                (t.to_path_buf(), Some(t))
            }
        };
        let shown = path.display().to_string();
        let err = |source| FrontierError::Sqlite {
            path: shown.clone(),
            source,
        };
        let conn = Connection::open(&path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))
            .map_err(err)?;
        // A small page cache: the frontier lives on disk, not in memory.
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA cache_size = -8000;")
            .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(Frontier {
            conn,
            path: shown,
            open: false,
            _temp: temp,
        })
    }

    fn err(&self, source: rusqlite::Error) -> FrontierError {
        FrontierError::Sqlite {
            path: self.path.clone(),
            source,
        }
    }

    /// A stored setting.
    pub fn meta(&self, key: &str) -> Result<Option<String>, FrontierError> {
        self.conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| self.err(e))
    }

    /// Stores a setting (in the open batch, if there is one).
    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<(), FrontierError> {
        self.conn
            .execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )
            .map(|_| ())
            .map_err(|e| self.err(e))
    }

    /// Opens the batch's transaction unless one is open.
    fn begin(&mut self) -> Result<(), FrontierError> {
        if !self.open {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|e| self.err(e))?;
            self.open = true;
        }
        Ok(())
    }

    /// Commits what was written since the last commit, with `meta` (the
    /// output lengths that include the lines of the pages it finishes).
    pub fn commit(&mut self, meta: &[(&str, String)]) -> Result<(), FrontierError> {
        if !self.open {
            return Ok(());
        }
        let run = |conn: &Connection| -> rusqlite::Result<()> {
            let mut st = conn.prepare_cached(
                "INSERT INTO meta (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            )?;
            for (k, v) in meta {
                st.execute(params![k, v])?;
            }
            conn.execute_batch("COMMIT")
        };
        let r = run(&self.conn);
        self.open = false;
        if r.is_err() {
            let _ = self.conn.execute_batch("ROLLBACK");
        }
        r.map_err(|e| self.err(e))
    }

    /// True while writes wait for [`Frontier::commit`].
    pub fn dirty(&self) -> bool {
        self.open
    }

    /// Adds `urls` not seen before and commits; returns those it added.
    pub fn add(&mut self, urls: &[NewUrl]) -> Result<Vec<Queued>, FrontierError> {
        self.begin()?;
        let added = insert(&self.conn, urls).map_err(|e| self.err(e))?;
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
    ) -> Result<Vec<Queued>, FrontierError> {
        self.begin()?;
        let run = |conn: &Connection| -> rusqlite::Result<Vec<Queued>> {
            conn.prepare_cached(
                "UPDATE urls SET state = ?2, attempts = attempts + ?3 WHERE id = ?1",
            )?
            .execute(params![id, state as i64, attempts])?;
            insert(conn, links)
        };
        run(&self.conn).map_err(|e| self.err(e))
    }

    /// Marks a URL done without fetching it (it was reached through a
    /// redirect), if it is still waiting.
    pub fn mark_seen_done(
        &mut self,
        url: &str,
        host: &str,
        depth: u32,
    ) -> Result<(), FrontierError> {
        self.begin()?;
        let r = self
            .conn
            .prepare_cached(
                "INSERT INTO urls (url, host, depth, state) VALUES (?1, ?2, ?3, 2)
                 ON CONFLICT (url) DO UPDATE SET state = 2 WHERE state = 0",
            )
            .and_then(|mut st| st.execute(params![url, host, depth]))
            .map(|_| ());
        r.map_err(|e| self.err(e))
    }

    /// Up to `limit` hosts with waiting URLs named after `after`, by name.
    pub fn hosts_with_work_after(
        &self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<String>, FrontierError> {
        let run = || -> rusqlite::Result<Vec<String>> {
            let mut st = self.conn.prepare_cached(
                "SELECT DISTINCT host FROM urls WHERE state = 0 AND host > ?1
                 ORDER BY host LIMIT ?2",
            )?;
            st.query_map(params![after, limit as i64], |r| r.get(0))?
                .collect()
        };
        run().map_err(|e| self.err(e))
    }

    /// Up to `limit` waiting URLs of `host` after row `after`, in
    /// discovery order.
    pub fn waiting(
        &self,
        host: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Queued>, FrontierError> {
        let run = || -> rusqlite::Result<Vec<Queued>> {
            let mut st = self.conn.prepare_cached(
                "SELECT id, url, host, depth, parent FROM urls
                 WHERE host = ?1 AND state = 0 AND id > ?2 ORDER BY id LIMIT ?3",
            )?;
            st.query_map(params![host, after, limit as i64], |r| {
                Ok(Queued {
                    id: r.get(0)?,
                    url: r.get(1)?,
                    host: r.get(2)?,
                    depth: r.get(3)?,
                    parent: r.get(4)?,
                })
            })?
            .collect()
        };
        run().map_err(|e| self.err(e))
    }

    /// URLs in `state`.
    pub fn count(&self, state: UrlState) -> Result<u64, FrontierError> {
        self.conn
            .query_row(
                "SELECT count(*) FROM urls WHERE state = ?1",
                [state as i64],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as u64)
            .map_err(|e| self.err(e))
    }

    /// Every URL the crawl knows.
    pub fn total(&self) -> Result<u64, FrontierError> {
        self.conn
            .query_row("SELECT count(*) FROM urls", [], |r| r.get::<_, i64>(0))
            .map(|n| n as u64)
            .map_err(|e| self.err(e))
    }

    /// Puts the pages that failed for good back in the queue; how many.
    pub fn requeue_failed(&mut self) -> Result<usize, FrontierError> {
        self.commit(&[])?;
        self.conn
            .execute(
                "UPDATE urls SET state = 0 WHERE state = ?1",
                [UrlState::Failed as i64],
            )
            .map_err(|e| self.err(e))
    }
}

fn insert(conn: &Connection, urls: &[NewUrl]) -> rusqlite::Result<Vec<Queued>> {
    let mut added = Vec::new();
    let mut st = conn.prepare_cached(
        "INSERT INTO urls (url, host, depth, parent) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (url) DO NOTHING",
    )?;
    for u in urls {
        if st.execute(params![u.url, u.host, u.depth, u.parent])? > 0 {
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

    fn new(url: &str, depth: u32) -> NewUrl {
        NewUrl {
            url: url.into(),
            host: "h".into(),
            depth,
            parent: None,
        }
    }

    #[test]
    fn urls_are_added_once_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let mut f = Frontier::open(Some(&path)).unwrap();
        let added = f
            .add(&[new("http://h/a", 0), new("http://h/b", 0)])
            .unwrap();
        assert_eq!(added.len(), 2);
        assert!(f.add(&[new("http://h/a", 1)]).unwrap().is_empty());
        let more = f
            .finish(added[0].id, UrlState::Done, 2, &[new("http://h/c", 1)])
            .unwrap();
        assert_eq!(more[0].url, "http://h/c");
        f.commit(&[("out_len", "10".into())]).unwrap();
        // A batch never committed (a crash) is not kept.
        f.finish(added[1].id, UrlState::Done, 1, &[new("http://h/d", 1)])
            .unwrap();
        assert!(f.dirty());
        drop(f);

        let mut f = Frontier::open(Some(&path)).unwrap();
        assert_eq!(f.meta("out_len").unwrap().as_deref(), Some("10"));
        assert_eq!(f.hosts_with_work_after("", 10).unwrap(), ["h"]);
        assert!(f.hosts_with_work_after("h", 10).unwrap().is_empty());
        let waiting: Vec<String> = f
            .waiting("h", 0, 10)
            .unwrap()
            .into_iter()
            .map(|q| q.url)
            .collect();
        assert_eq!(waiting, ["http://h/b", "http://h/c"]);
        assert_eq!(f.count(UrlState::Done).unwrap(), 1);
        let b = f.waiting("h", 0, 1).unwrap().remove(0);
        f.finish(b.id, UrlState::Failed, 1, &[]).unwrap();
        assert_eq!(f.requeue_failed().unwrap(), 1);
        f.mark_seen_done("http://h/c", "h", 1).unwrap();
        assert_eq!(f.waiting("h", 0, 10).unwrap().len(), 1);
        assert_eq!(f.total().unwrap(), 3);
    }

    #[test]
    fn a_temporary_frontier_removes_its_file() {
        let f = Frontier::open(None).unwrap();
        let path = std::path::PathBuf::from(&f.path);
        assert!(path.exists());
        drop(f);
        assert!(!path.exists());
    }
}
