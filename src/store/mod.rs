//! The SQLite store: the durable record of proxies, sources and which source
//! lists which proxy, what sites taught about proxies, and crawl jobs. All
//! database access goes through [`Store`]'s async methods; callers never
//! see a connection. One writer thread commits batched writes while
//! read-only connections serve listings. A file per job: `ingest` (source
//! runs), `checks` (due proxies, verdicts, purge), `listing` (filtered
//! reads, counts), `rows` (records and their decoding), `sites`, `crawls`,
//! `frontier` (crawl frontiers, worked from a crawl's own thread).

mod checks;
mod crawls;
mod frontier;
mod ingest;
mod listing;
mod lookup;
mod migrate;
mod rows;
mod sites;
mod snapshots;
mod unwritable;
mod writer;

pub use checks::{CheckRecord, DueCursor, DueLane, DueProxy, Recorded};
pub use crawls::CrawlJobRecord;
pub use frontier::{Frontier, NewUrl, Queued, UrlState};
pub use ingest::{SourceRun, UpsertCounts};
pub use listing::{Page, ProxyFilter, ProxySort};
pub use rows::{Presence, ProxyRecord, SourceRecord, Stats};
pub use sites::SiteRecord;
pub use snapshots::Snapshot;
pub use unwritable::{RETRY_FIRST, RETRY_MAX, WriteFailure, WriteTrouble};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::lock;
use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Semaphore, mpsc};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or configured.
    #[error("cannot open database {path}: {reason}")]
    Open {
        /// The file.
        path: PathBuf,
        /// Why, in words (not a source error, so that it is printed once).
        reason: String,
    },
    /// A read-only command found no database to read.
    #[error(
        "there is no database at {path} yet: run `proxywarden harvest` (or `serve`) first, \
         or point database.path at the right file"
    )]
    Missing {
        /// The file.
        path: PathBuf,
    },
    /// The file is not a proxywarden database.
    #[error(
        "{path} is not a proxywarden database ({what}); it is left untouched: \
         point database.path at another file"
    )]
    Foreign {
        /// The file.
        path: PathBuf,
        /// What it holds instead.
        what: String,
    },
    /// The database was written by an older proxywarden and a read-only
    /// command cannot upgrade it.
    #[error(
        "database {path} has schema version {found}, older than this proxywarden's {supported}; \
         run `proxywarden serve` or `proxywarden harvest` once to upgrade it"
    )]
    TooOld {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The version this binary reads.
        supported: i64,
    },
    /// The database was written by a newer proxywarden.
    #[error(
        "database {path} has schema version {found}, but this proxywarden only knows up to {supported}; \
         upgrade proxywarden or point database.path at another file"
    )]
    TooNew {
        /// The file.
        path: PathBuf,
        /// Its schema version.
        found: i64,
        /// The newest version this binary knows.
        supported: i64,
    },
    /// A migration failed to apply.
    #[error("cannot migrate database {path} to version {version}: {source}")]
    Migrate {
        /// The file.
        path: PathBuf,
        /// The migration that failed.
        version: i64,
        /// What the database said.
        source: DbError,
    },
    /// Any other error the database reported.
    #[error("database error: {0}")]
    Database(DbError),
    /// The transaction holding a write failed to commit; the write did not
    /// happen.
    #[error("database commit failed: {0}")]
    Commit(String),
    /// The disk refused the write (full, read-only, failing), or writes are
    /// paused after it did (see [`Store::write_trouble`]); the write did
    /// not happen.
    #[error("cannot write the database ({kind}): {reason}")]
    Unwritable {
        /// Why.
        kind: WriteFailure,
        /// What SQLite said.
        reason: String,
    },
    /// The writer thread could not be started.
    #[error("cannot start the database writer: {0}")]
    Thread(std::io::Error),
    /// The store's writer has stopped.
    #[error("the database writer has stopped")]
    Closed,
    /// A write on a store opened read-only.
    #[error("the database is open read-only")]
    ReadOnly,
    /// The caller stopped waiting before the query ran.
    #[error("the database query was given up")]
    Cancelled,
}

impl StoreError {
    /// The kind of disk failure behind this error, if the disk refused a
    /// write: callers back off from such errors rather than retry at once.
    pub fn write_failure(&self) -> Option<WriteFailure> {
        match self {
            StoreError::Unwritable { kind, .. } => Some(*kind),
            StoreError::Database(e) | StoreError::Migrate { source: e, .. } => e.failure,
            _ => None,
        }
    }

    /// `Unwritable` for a database error the disk caused; others as they
    /// are.
    fn classified(self) -> StoreError {
        match self {
            StoreError::Database(DbError {
                failure: Some(kind),
                source,
            }) => StoreError::Unwritable {
                kind,
                reason: source.to_string(),
            },
            other => other,
        }
    }
}

/// What the database said when a statement failed, whichever backend
/// runs it: callers see its words and whether the disk refused a write
/// ([`StoreError::write_failure`]), never a driver's error type.
#[derive(Debug)]
pub struct DbError {
    /// Set when the disk refused the write.
    failure: Option<WriteFailure>,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl DbError {
    /// An error the store itself found in what the database returned.
    fn unexpected(what: String) -> DbError {
        DbError {
            failure: None,
            source: what.into(),
        }
    }
}

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> DbError {
        DbError {
            failure: WriteFailure::of(&e),
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

/// A cheap, cloneable handle to the database: one writer thread fed by a
/// bounded channel (see [`writer`]) and a few read-only connections, so a
/// long harvest transaction never blocks listings, stats or exports. Every
/// method that may block runs off the async runtime here, in [`Store::read`]
/// and [`Store::write`], never at the call sites.
#[derive(Clone)]
pub struct Store {
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

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.inner.path)
            .finish()
    }
}

/// The schema version this binary writes (the number of migrations).
pub const SCHEMA_VERSION: i64 = migrate::LATEST;

/// Read-only connections kept open: enough for the API's concurrent
/// listings on a small machine; more requests wait for a free one.
const READERS: usize = 4;

/// The writer's page cache, in KiB.
const WRITER_CACHE_KIB: i64 = 16 * 1024;

/// How long a connection waits for a lock another process holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl Store {
    /// Opens (creating if needed) the database, switches it to WAL, applies
    /// pending migrations and starts the writer. Refuses a database from a
    /// newer version and a file that belongs to another application; says
    /// plainly when the directory is missing or not writable.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
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
        Ok(Store::with(path, Some(writer), readers, health))
    }

    /// Opens an existing database for reading only (`stats`, `export`):
    /// nothing is created, migrated or written, and a read-only file (or
    /// one in a read-only directory) is read as it is.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
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
                Ok(Store::with(path, None, readers, Arc::default()))
            }
        }
    }

    fn with(
        path: &Path,
        writer: Option<mpsc::Sender<Box<dyn writer::Job>>>,
        readers: Vec<Connection>,
        health: Arc<unwritable::WriteHealth>,
    ) -> Store {
        Store {
            inner: Arc::new(Shared {
                path: path.to_path_buf(),
                writer,
                read_permits: Arc::new(Semaphore::new(readers.len())),
                readers: Mutex::new(readers),
                health,
            }),
        }
    }

    /// Whether the disk is refusing writes now: since when, why, and when
    /// they are tried again. While it is, writes are refused at once
    /// ([`StoreError::Unwritable`]) until the pause after the last failure
    /// ([`RETRY_FIRST`] doubling up to [`RETRY_MAX`]) is over; the first
    /// write that works ends it.
    pub fn write_trouble(&self) -> Option<WriteTrouble> {
        self.inner.health.trouble()
    }

    /// Transactions the disk refused since the store was opened, by kind.
    pub fn write_failures(&self) -> Vec<(WriteFailure, u64)> {
        self.inner.health.failures()
    }

    /// Every change of [`Store::write_trouble`] from now on: a failure, a
    /// further one, the end.
    pub fn watch_writes(&self) -> tokio::sync::watch::Receiver<Option<WriteTrouble>> {
        self.inner.health.subscribe()
    }

    /// Waits until writes work again (at once when they do). Something
    /// must try them: see [`Store::probe_writes`].
    pub async fn writable(&self) {
        let mut changes = self.watch_writes();
        // The sender lives as long as the store.
        let _ = changes.wait_for(Option::is_none).await;
    }

    /// Tries a write that changes nothing but still goes to the disk (the
    /// schema version, set to what it is), so that writes that work again
    /// are noticed although nothing else writes.
    pub async fn probe_writes(&self) -> Result<(), StoreError> {
        self.write(|c| {
            let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0))?;
            c.pragma_update(None, "user_version", version)?;
            Ok(())
        })
        .await
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Copies the write-ahead log into the database file and empties it,
    /// so that the file alone holds every commit: a command that exits
    /// leaves a database one can copy as it is. Waits briefly for other
    /// processes' readers; true when the whole log was copied (another
    /// process reading, a running daemon say, may keep part of it, which
    /// that process copies later). A store opened read-only does nothing.
    pub async fn checkpoint(&self) -> Result<bool, StoreError> {
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
        match joined {
            Ok(r) => Ok(r?),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }

    /// The schema version of the open database.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
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
        let shared = self.inner.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let result = if lock(&handle).is_some() {
                f(&conn)
            } else {
                Err(StoreError::Cancelled)
            };
            // Disarmed before the connection can serve anyone else.
            lock(&handle).take();
            lock(&shared.readers).push(conn);
            drop(permit);
            result
        })
        .await;
        match joined {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
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

/// Interrupts a read whose caller stopped waiting (see [`Store::read`]).
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

/// Milliseconds since the Unix epoch, the unit of every stored time.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// A stored time as RFC 3339 (UTC, millisecond precision).
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default()
}
