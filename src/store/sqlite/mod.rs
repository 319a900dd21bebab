//! The embedded backend: one SQLite file in WAL mode. One writer thread
//! commits batched writes (see [`writer`]) while a few read-only
//! connections serve listings; migrations are numbered files in
//! `migrations/`. A file per topic of the store's surface, each an
//! `impl Sqlite` with that topic's SQL.

mod browse;
mod checks;
mod crawls;
pub(crate) mod frontier;
mod ingest;
mod listing;
mod lookup;
pub(crate) mod migrate;
mod nodes;
mod rows;
mod sites;
mod snapshots;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Semaphore, mpsc};

use super::unwritable::{self, WriteFailure, WriteTrouble};
use super::{DbError, SCHEMA_VERSION, StoreError};
use crate::lock;

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> DbError {
        DbError {
            failure: WriteFailure::of(&e),
            transient: false,
            source: Box::new(e),
        }
    }
}

/// The SQLite code's `?`: its driver's errors become [`DbError`]s.
#[doc(hidden)]
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> StoreError {
        StoreError::Database(e.into())
    }
}

/// A cheap, cloneable handle to one SQLite database: one writer thread fed
/// by a bounded channel (see [`writer`]) and a few read-only connections,
/// so a long harvest transaction never blocks listings, stats or exports.
/// Every method that may block runs off the async runtime here, in
/// [`Sqlite::read`] and [`Sqlite::write`], never at the call sites.
#[derive(Clone)]
pub(crate) struct Sqlite {
    inner: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    /// `None` on a store opened read-only.
    writer: Option<mpsc::Sender<Box<dyn writer::Job>>>,
    /// Idle read connections. The pool crates of the field pin an older
    /// rusqlite (and so a second bundled SQLite), so this is a Vec behind a
    /// mutex with a semaphore counting what is free.
    readers: Mutex<Vec<Connection>>,
    read_permits: Arc<Semaphore>,
    /// Whether writes work, kept by the writer.
    health: Arc<unwritable::WriteHealth>,
}

/// Read-only connections kept open: enough for the API's concurrent
/// listings on a small machine; more requests wait for a free one.
const READERS: usize = 4;

/// The writer's page cache, in KiB.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// How long a connection waits for a lock another process holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl Sqlite {
    /// Opens (creating if needed) the database, switches it to WAL, applies
    /// pending migrations and starts the writer. Refuses a database from a
    /// newer version and a file that belongs to another application; says
    /// plainly when the directory is missing or not writable.
    pub(crate) fn open(path: &Path) -> Result<Sqlite, StoreError> {
        let open_err = |e: rusqlite::Error| StoreError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        writable(path)?;
        let mut conn = Connection::open(path).map_err(|e| not_sqlite(path, e))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        // Before anything is written: a file of another application stays
        // as it was.
        schema_of(&conn, path)?;
        // WAL lets readers (stats, export) run while the writer commits.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "database is not in WAL mode");
        }
        // Statement journals (a multi-row insert keeps one, to undo
        // itself alone) in memory rather than in temporary files.
        conn.execute_batch(
            "PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON; PRAGMA temp_store = MEMORY;",
        )
        .map_err(open_err)?;
        // The writer's page cache (SQLite's default is 2 MiB): a harvest
        // walks the identity index and the table in order, and a larger
        // cache keeps the pages a chunk shares with the next one.
        conn.pragma_update(None, "cache_size", -WRITER_CACHE_KIB)
            .map_err(open_err)?;
        migrate::apply(&mut conn, path)?;
        let readers = open_readers(path, None)?;
        let health = Arc::new(unwritable::WriteHealth::default());
        let writer = writer::start(conn, path.to_path_buf(), health.clone())?;
        Ok(Sqlite::with(path, Some(writer), readers, health))
    }

    /// Opens an existing database for reading only (`stats`, `export`):
    /// nothing is created, migrated or written, and a read-only file (or
    /// one in a read-only directory) is read as it is.
    pub(crate) fn open_read_only(path: &Path) -> Result<Sqlite, StoreError> {
        if !path.exists() {
            return Err(StoreError::Missing {
                path: path.to_path_buf(),
            });
        }
        let mut immutable = None;
        let first = match read_connection(path, None) {
            Ok(c) => match schema_of(&c, path) {
                Err(StoreError::Open { .. }) => None,
                Err(e) => return Err(e),
                Ok(version) => Some((c, version)),
            },
            Err(_) => None,
        };
        let version = match first {
            Some((_, version)) => version,
            None => {
                // SQLite reads a WAL database only where it may create the
                // shared-memory file beside it; where it may not, the file
                // is read as it stands (nobody here can change it anyway).
                let uri = immutable_uri(path)?;
                let c = read_connection(path, Some(&uri))?;
                let version = schema_of(&c, path)?;
                immutable = Some(uri);
                version
            }
        };
        match version {
            None => Err(StoreError::Missing {
                path: path.to_path_buf(),
            }),
            Some(found) if found < SCHEMA_VERSION => Err(StoreError::TooOld {
                path: path.to_path_buf(),
                found,
                supported: SCHEMA_VERSION,
            }),
            Some(_) => {
                let readers = open_readers(path, immutable.as_deref())?;
                Ok(Sqlite::with(path, None, readers, Arc::default()))
            }
        }
    }

    fn with(
        path: &Path,
        writer: Option<mpsc::Sender<Box<dyn writer::Job>>>,
        readers: Vec<Connection>,
        health: Arc<unwritable::WriteHealth>,
    ) -> Sqlite {
        Sqlite {
            inner: Arc::new(Shared {
                path: path.to_path_buf(),
                writer,
                read_permits: Arc::new(Semaphore::new(readers.len())),
                readers: Mutex::new(readers),
                health,
            }),
        }
    }

    pub(crate) fn write_trouble(&self) -> Option<WriteTrouble> {
        self.inner.health.trouble()
    }

    pub(crate) fn write_failures(&self) -> Vec<(WriteFailure, u64)> {
        self.inner.health.failures()
    }

    pub(crate) fn watch_writes(&self) -> tokio::sync::watch::Receiver<Option<WriteTrouble>> {
        self.inner.health.subscribe()
    }

    pub(crate) async fn probe_writes(&self) -> Result<(), StoreError> {
        self.write(|c| {
            let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            c.pragma_update(None, "user_version", version)?;
            Ok(())
        })
        .await
    }

    pub(crate) fn path(&self) -> &Path {
        &self.inner.path
    }

    pub(crate) async fn checkpoint(&self) -> Result<bool, StoreError> {
        if self.inner.writer.is_none() {
            return Ok(false);
        }
        let path = self.inner.path.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let conn = Connection::open(&path)?;
            conn.busy_timeout(Duration::from_secs(1))?;
            let busy: i64 = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))?;
            Ok::<bool, rusqlite::Error>(busy == 0)
        })
        .await;
        Ok(joined_blocking(joined)??)
    }

    pub(crate) async fn schema_version(&self) -> Result<i64, StoreError> {
        self.read(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))
            .await
    }

    /// Runs `f` on a read-only connection on tokio's blocking pool. A
    /// caller that stops waiting (a request that timed out, a shutdown)
    /// interrupts its query, so abandoned reads never pile up; the
    /// connection and its permit return only when `f` is over.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let permit = self
            .inner
            .read_permits
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| StoreError::Closed)?;
        let conn = lock(&self.inner.readers)
            .pop()
            .expect("a permit guarantees an idle reader");
        let guard = InterruptOnDrop(Arc::new(Mutex::new(Some(conn.get_interrupt_handle()))));
        let handle = guard.0.clone();
        let lent = Lent {
            conn: Some(conn),
            shared: self.inner.clone(),
            _permit: permit,
        };
        let joined = tokio::task::spawn_blocking(move || {
            let result = if lock(&handle).is_some() {
                f(lent.conn())
            } else {
                Err(StoreError::Cancelled)
            };
            // Disarmed before the connection can serve anyone else.
            lock(&handle).take();
            drop(lent);
            result
        })
        .await;
        joined_blocking(joined)?
    }

    /// Runs `f` on the writer's connection, inside a transaction it may
    /// share with other jobs, and returns once that transaction committed.
    pub(crate) async fn write<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.write_weighted(1, f).await
    }

    /// [`Store::write`] for a job writing about `weight` rows, so that the
    /// writer keeps each transaction small.
    pub(crate) async fn write_weighted<T, F>(&self, weight: usize, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        self.submit_weighted(weight, f).await?.await
    }

    /// Queues [`Store::write_weighted`]'s job and returns, without waiting
    /// for it to be written; the future returned then waits. A caller with
    /// a run of jobs queues the next while the writer writes this one.
    pub(crate) async fn submit_weighted<T, F>(
        &self,
        weight: usize,
        f: F,
    ) -> Result<impl Future<Output = Result<T, StoreError>> + use<T, F>, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let Some(writer) = &self.inner.writer else {
            return Err(StoreError::ReadOnly);
        };
        self.inner.health.gate()?;
        let (job, done) = writer::Call::job(weight, f);
        writer.send(job).await.map_err(|_| StoreError::Closed)?;
        Ok(async move { done.await.map_err(|_| StoreError::Closed)? })
    }
}

/// A reader connection out of the pool, with the permit that let it out:
/// dropped (its read over, or its blocking task dropped unrun because the
/// runtime is shutting down), it puts the connection back before the
/// permit goes, so a permit always finds an idle reader.
struct Lent {
    conn: Option<Connection>,
    shared: Arc<Shared>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

impl Lent {
    fn conn(&self) -> &Connection {
        self.conn.as_ref().expect("held until dropped")
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            lock(&self.shared.readers).push(conn);
        }
    }
}

/// A blocking task's outcome: its panic goes on up; a task the runtime
/// dropped unrun (it is shutting down) is a closed store, not a panic.
pub(super) fn joined_blocking<T>(
    joined: Result<T, tokio::task::JoinError>,
) -> Result<T, StoreError> {
    match joined {
        Ok(r) => Ok(r),
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => Err(StoreError::Closed),
    }
}

/// Interrupts a read whose caller stopped waiting (see [`Sqlite::read`]).
struct InterruptOnDrop(Arc<Mutex<Option<rusqlite::InterruptHandle>>>);

impl Drop for InterruptOnDrop {
    fn drop(&mut self) {
        if let Some(h) = lock(&self.0).take() {
            h.interrupt();
        }
    }
}

/// Says plainly why `path` cannot be written, before SQLite says
/// `unable to open database file` (error code 14): a missing directory, a
/// file or directory this user may not write (SQLite creates `-wal` and
/// `-shm` files beside the database).
fn writable(path: &Path) -> Result<(), StoreError> {
    let fail = |reason: String| StoreError::Open {
        path: path.to_path_buf(),
        reason,
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(fail(format!(
            "directory does not exist: {} (create it, or set database.path)",
            dir.display()
        )));
    }
    let denied = |what: String, e: &std::io::Error| {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            fail(format!("permission denied: {what}"))
        } else {
            fail(format!("{what}: {e}"))
        }
    };
    if path.exists()
        && let Err(e) = std::fs::OpenOptions::new().write(true).open(path)
    {
        return Err(denied("this user may not write the file".to_string(), &e));
    }
    if let Err(e) = tempfile::Builder::new()
        .prefix(".proxywarden-probe")
        .tempfile_in(dir)
    {
        return Err(denied(
            format!(
                "this user may not create files in {} (SQLite keeps -wal and -shm files beside the database)",
                dir.display()
            ),
            &e,
        ));
    }
    Ok(())
}

/// An open error, saying so when the file is not SQLite at all.
fn not_sqlite(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::Foreign {
            path: path.to_path_buf(),
            what: "not a SQLite file".into(),
        },
        _ => StoreError::Open {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    }
}

/// The schema version of the database on `conn`: `None` for an empty
/// file. Refuses a newer version and a file holding tables that are not
/// proxywarden's.
fn schema_of(conn: &Connection, path: &Path) -> Result<Option<i64>, StoreError> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .map_err(|e| not_sqlite(path, e))?;
    let tables: Vec<String> = conn
        .prepare(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'
             ORDER BY name",
        )
        .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
        .map_err(|e| not_sqlite(path, e))?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            setting: "database.path",
            found: version,
            supported: SCHEMA_VERSION,
        });
    }
    if version == 0 && tables.is_empty() {
        return Ok(None);
    }
    let foreign: Vec<&str> = tables
        .iter()
        .map(String::as_str)
        .filter(|t| !migrate::TABLES.contains(t))
        .collect();
    if version == 0 || !foreign.is_empty() || !tables.iter().any(|t| t == "proxies") {
        let shown: Vec<&str> = if foreign.is_empty() {
            tables.iter().map(String::as_str).collect()
        } else {
            foreign
        };
        return Err(StoreError::Foreign {
            path: path.to_path_buf(),
            what: format!(
                "it holds tables that are not proxywarden's: {}",
                shown.join(", ")
            ),
        });
    }
    Ok(Some(version))
}

/// A read-only connection to `path`, or to `uri` when given.
fn read_connection(path: &Path, uri: Option<&str>) -> Result<Connection, StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn = match uri {
        Some(uri) => Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI),
        None => Connection::open_with_flags(path, flags),
    }
    .map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    Ok(conn)
}

fn open_readers(path: &Path, uri: Option<&str>) -> Result<Vec<Connection>, StoreError> {
    (0..READERS).map(|_| read_connection(path, uri)).collect()
}

/// `path` as an SQLite URI opening it read-only and immutable.
fn immutable_uri(path: &Path) -> Result<String, StoreError> {
    let fail = |reason: String| StoreError::Open {
        path: path.to_path_buf(),
        reason,
    };
    let abs = std::path::absolute(path).map_err(|e| fail(e.to_string()))?;
    let url = url::Url::from_file_path(&abs)
        .map_err(|()| fail("the path cannot be written as a URI".into()))?;
    Ok(format!("{url}?mode=ro&immutable=1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime shut down takes no more blocking tasks: a read asked of
    /// it then is a closed store to its caller (not a panic), and its
    /// connection goes back, so the store still serves every reader at
    /// once from the next runtime.
    #[test]
    fn a_read_the_runtime_cannot_run_gives_its_connection_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = Sqlite::open(&dir.path().join("p.db")).unwrap();

        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let handle = rt.handle().clone();
        rt.shutdown_background();
        let refused = handle.block_on(store.read(|_| Ok(())));
        assert!(matches!(refused, Err(StoreError::Closed)), "{refused:?}");

        let next = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(READERS)
            .build()
            .unwrap();
        next.block_on(async {
            let barrier = Arc::new(std::sync::Barrier::new(READERS));
            let reads = (0..READERS).map(|_| {
                let store = store.clone();
                let barrier = barrier.clone();
                tokio::spawn(async move {
                    store
                        .read(move |c| {
                            barrier.wait();
                            Ok(c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0))?)
                        })
                        .await
                })
            });
            for read in futures::future::join_all(reads).await {
                assert_eq!(read.unwrap().unwrap(), 1);
            }
        });
    }
}
