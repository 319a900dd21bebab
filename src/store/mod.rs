//! The SQLite store: the durable record of proxies, sources and which source
//! lists which proxy. All database access goes through [`Store`]; callers
//! never see a connection. Writes come in batches, one transaction each.

mod checks;
mod migrate;
mod queries;

pub use checks::{CheckRecord, DueLane, DueProxy};
pub use queries::{ProxyFilter, ProxyRecord, SourceRecord, SourceRun, Stats, UpsertCounts};

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;

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
}

/// A cheap, cloneable handle to the database. SQLite has one writer at a
/// time anyway, so a single connection behind a mutex is both simple and as
/// fast as the file allows; callers on the async runtime use
/// `spawn_blocking` (see [`Store::run`]).
#[derive(Clone)]
pub struct Store {
    conn: Arc<Mutex<Connection>>,
    path: Arc<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

impl Store {
    /// Opens (creating if needed) the database, switches it to WAL and
    /// applies pending migrations. Refuses a database from a newer version.
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
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        // WAL lets readers (stats, export) run while a writer commits.
        let mode: String = conn
            .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
            .map_err(open_err)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path = %path.display(), mode, "database is not in WAL mode");
        }
        conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
            .map_err(open_err)?;
        migrate::apply(&mut conn, path)?;
        Ok(Store {
            conn: Arc::new(Mutex::new(conn)),
            path: Arc::new(path.to_path_buf()),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The schema version of the open database.
    pub fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .lock()
            .query_row("PRAGMA user_version", [], |r| r.get(0))?)
    }

    fn lock(&self) -> MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves the connection usable
        // (SQLite rolls back an unfinished transaction), so poisoning is
        // not a reason to stop serving.
        self.conn.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs a blocking store call on tokio's blocking pool.
    pub async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Store) -> Result<T, StoreError> + Send + 'static,
    {
        let store = self.clone();
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
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
