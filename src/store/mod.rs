//! The SQLite store: the durable record of proxies, sources and which source
//! lists which proxy. All database access goes through [`Store`]'s async
//! methods; callers never see a connection. One writer thread commits
//! batched writes while read-only connections serve listings.

mod checks;
mod crawls;
mod migrate;
mod queries;
mod writer;

pub use checks::{CheckRecord, DueCursor, DueLane, DueProxy};
pub use crawls::CrawlJobRecord;
pub use queries::{
    Page, ProxyFilter, ProxyRecord, ProxySort, SourceRecord, SourceRun, Stats, UpsertCounts,
};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::{Semaphore, mpsc};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database file could not be opened or configured.
    #[error("cannot open database {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        source: rusqlite::Error,
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
        /// What SQLite said.
        source: rusqlite::Error,
    },
    /// Any other SQLite error.
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// The transaction holding a write failed to commit; the write did not
    /// happen.
    #[error("database commit failed: {0}")]
    Commit(String),
    /// The writer thread could not be started.
    #[error("cannot start the database writer: {0}")]
    Thread(std::io::Error),
    /// The store's writer has stopped.
    #[error("the database writer has stopped")]
    Closed,
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
    writer: mpsc::Sender<Box<dyn writer::Job>>,
    /// Idle read connections. The pool crates of the field pin an older
    /// rusqlite (and so a second bundled SQLite), so this is a Vec behind a
    /// mutex with a semaphore counting what is free.
    readers: Mutex<Vec<Connection>>,
    read_permits: Semaphore,
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

/// How long a connection waits for a lock another process holds.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl Store {
    /// Opens (creating if needed) the database, switches it to WAL, applies
    /// pending migrations and starts the writer. Refuses a database from a
    /// newer version.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
            && !dir.exists()
        {
            return Err(StoreError::Open {
                path: path.to_path_buf(),
                source: rusqlite::Error::InvalidPath(dir.to_path_buf()),
            });
        }
        let mut conn = Connection::open(path).map_err(open_err)?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
        // WAL lets readers (stats, export) run while the writer commits.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "database is not in WAL mode");
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
            .map_err(open_err)?;
        migrate::apply(&mut conn, path)?;
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let r = Connection::open_with_flags(
                path,
                OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            )
            .map_err(open_err)?;
            r.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
            readers.push(r);
        }
        let writer = writer::start(conn, path.to_path_buf())?;
        Ok(Store {
            inner: Arc::new(Shared {
                path: path.to_path_buf(),
                writer,
                readers: Mutex::new(readers),
                read_permits: Semaphore::new(READERS),
            }),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// The schema version of the open database.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        self.read(|c| Ok(c.query_row("PRAGMA user_version", [], |r| r.get(0))?))
            .await
    }

    /// Runs `f` on a read-only connection on tokio's blocking pool.
    pub(crate) async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let _permit = self
            .inner
            .read_permits
            .acquire()
            .await
            .map_err(|_| StoreError::Closed)?;
        let shared = self.inner.clone();
        let joined = tokio::task::spawn_blocking(move || {
            let conn = lock(&shared.readers)
                .pop()
                .expect("a permit guarantees an idle reader");
            let result = f(&conn);
            lock(&shared.readers).push(conn);
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
        let (job, done) = writer::Call::job(weight, f);
        self.inner
            .writer
            .send(job)
            .await
            .map_err(|_| StoreError::Closed)?;
        done.await.map_err(|_| StoreError::Closed)?
    }
}

/// A poisoned lock only means a panic elsewhere; the connections are sound.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
