//! The store: the durable record of proxies, sources and which source
//! lists which proxy, what sites taught about proxies, crawl jobs and
//! their frontiers, behind one surface whatever the backend. All database
//! access goes through [`Store`]'s methods; callers never see a
//! connection. A file per topic holds its types and its part of the
//! surface: `ingest` (source runs), `checks` (due proxies, verdicts,
//! purge), `listing` (filtered reads, counts), `browse` (the operator's
//! table: searched, keyset-paged), `rows` (the records handed
//! out), `sites`, `snapshots`, `crawls`, `frontier` (crawl frontiers,
//! worked from a crawl's own thread). Each backend (`sqlite`, the
//! embedded default; `postgres`, for several nodes) has its own SQL and
//! migrations behind that surface.
//!
//! The surface, which both backends keep alike (`tests/it/differential.rs`
//! runs the same random work on both and compares what a user sees):
//! - source runs: [`Store::record_source_run`], whole whatever other
//!   sources or nodes write at the same time;
//! - checks: due pages and leases ([`Store::lease_due`],
//!   [`Store::release_leases`]), verdicts ([`Store::record_checks`]),
//!   reports and uses, the change sequence nodes follow, purge;
//! - reads: listings and pages, [`Store::stats`], sources, presence;
//! - site records, snapshots, crawl jobs and their frontiers;
//! - nodes: harvest claims, change notices, write health
//!   ([`Store::write_trouble`]).
//!
//! Each backend implements every method of this surface under the same
//! name in its file of the same topic (`sqlite/ingest.rs`,
//! `postgres/ingest.rs`, …), and the `dispatch` macro routes to it; what is not
//! SQL (whether a candidate changes a row, say) lives in the topic's file
//! here, shared by both.

mod browse;
mod checks;
mod crawls;
mod frontier;
mod ingest;
mod listing;
mod lookup;
mod nodes;
mod postgres;
mod rows;
mod sites;
mod snapshots;
mod sqlite;
mod unwritable;

pub use browse::{
    Browse, BrowsePage, BrowseSort, Cursor, MAX_BROWSE_LIMIT, MAX_COUNTED, MAX_SEARCH, SITES_SHOWN,
    Search, SitesTaught,
};
pub use checks::{CheckRecord, DueCursor, DueLane, DueProxy, Recorded};
pub use crawls::{CancelAsk, CrawlJobRecord};
pub use frontier::{Frontier, NewUrl, Queued, UrlState};
pub use ingest::{SourceRun, UpsertCounts};
pub use listing::{Page, ProxyFilter, ProxySort};
pub use nodes::ChangeNotices;
pub use rows::{Presence, ProxyRecord, SourceRecord, Stats};
pub use sites::SiteRecord;
pub use snapshots::Snapshot;
pub use unwritable::{RETRY_FIRST, RETRY_MAX, WriteFailure, WriteTrouble};

use std::path::{Path, PathBuf};

use crate::config::DatabaseConfig;
use postgres::Postgres;
use sqlite::Sqlite;

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
    /// A read-only command found a PostgreSQL database with no
    /// proxywarden schema in it.
    #[error(
        "the database {url} holds no proxywarden data yet: run `proxywarden harvest` (or `serve`) \
         first, or point database.url at the right database"
    )]
    Empty {
        /// The database's URL, without its password.
        url: PathBuf,
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
         upgrade proxywarden or point {setting} at another database"
    )]
    TooNew {
        /// The file, or the server's address.
        path: PathBuf,
        /// The setting that names it: `database.path` or `database.url`.
        setting: &'static str,
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
    /// The backend does not do this yet.
    #[error("{0} is not available on PostgreSQL yet")]
    Unsupported(&'static str),
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

    /// True for an error of a transaction the server gave up for another's
    /// sake (a deadlock, a serialization failure): running it again may
    /// commit.
    pub(crate) fn transient(&self) -> bool {
        matches!(self, StoreError::Database(e) if e.transient)
    }

    /// `Unwritable` for a database error the disk caused; others as they
    /// are.
    fn classified(self) -> StoreError {
        match self {
            StoreError::Database(DbError {
                failure: Some(kind),
                source,
                ..
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
    /// Set when the server gave the transaction up for another's sake (a
    /// deadlock, a serialization failure): run again, it may well commit.
    transient: bool,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl DbError {
    /// An error the store itself found in what the database returned.
    fn unexpected(what: String) -> DbError {
        DbError {
            failure: None,
            transient: false,
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

/// The schema version this binary writes (the number of migrations).
pub const SCHEMA_VERSION: i64 = sqlite::migrate::LATEST;

/// The schema version this binary writes on PostgreSQL, whose migrations
/// are numbered on their own.
pub const POSTGRES_SCHEMA_VERSION: i64 = postgres::LATEST;

/// A cheap, cloneable handle to the database, whichever backend holds it.
/// Every method that may block runs off the async runtime inside the
/// backend, never at the call sites.
#[derive(Clone, Debug)]
pub struct Store {
    backend: Backend,
}

/// The database behind a [`Store`].
#[derive(Clone)]
enum Backend {
    /// One SQLite file: the embedded default.
    Sqlite(Sqlite),
    /// A PostgreSQL database that several nodes may share.
    Postgres(Postgres),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Sqlite(db) => f.debug_struct("Sqlite").field("path", &db.path()).finish(),
            Backend::Postgres(db) => f.debug_struct("Postgres").field("url", &db.path()).finish(),
        }
    }
}

/// Calls the method of the same name on the store's backend, awaiting it
/// unless told `sync`.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match &$self.backend {
            $crate::store::Backend::Sqlite(db) => db.$method($($arg),*).await,
            $crate::store::Backend::Postgres(db) => db.observed(db.$method($($arg),*).await),
        }
    };
    ($self:ident . $method:ident ( $($arg:expr),* ), sync) => {
        match &$self.backend {
            $crate::store::Backend::Sqlite(db) => db.$method($($arg),*),
            $crate::store::Backend::Postgres(db) => db.$method($($arg),*),
        }
    };
}
pub(crate) use dispatch;

impl Store {
    /// Opens (creating if needed) the database, switches it to WAL, applies
    /// pending migrations and starts the writer. Refuses a database from a
    /// newer version and a file that belongs to another application; says
    /// plainly when the directory is missing or not writable.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Sqlite(Sqlite::open(path)?),
        })
    }

    /// Opens an existing database for reading only (`stats`, `export`):
    /// nothing is created, migrated or written, and a read-only file (or
    /// one in a read-only directory) is read as it is.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Sqlite(Sqlite::open_read_only(path)?),
        })
    }

    /// Opens the store `config` names: the PostgreSQL database when
    /// `database.url` is one, else the SQLite file (see [`Store::open`]).
    pub async fn open_configured(config: &DatabaseConfig) -> Result<Store, StoreError> {
        match &config.postgres {
            Some(url) => Store::connect(url.as_str()).await,
            None => Store::open(&config.path),
        }
    }

    /// [`Store::open_configured`] for commands that only read: a SQLite
    /// file is opened read-only (see [`Store::open_read_only`]), and a
    /// PostgreSQL database is read as it is, never created or migrated
    /// (see [`Store::connect_read_only`]).
    pub async fn open_configured_read_only(config: &DatabaseConfig) -> Result<Store, StoreError> {
        match &config.postgres {
            Some(url) => Store::connect_read_only(url.as_str()).await,
            None => Store::open_read_only(&config.path),
        }
    }

    /// Connects to the PostgreSQL database at `url` (`postgres://…`),
    /// applying pending migrations (one node at a time when several start
    /// together).
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Postgres(Postgres::connect(url).await?),
        })
    }

    /// Connects to the PostgreSQL database at `url` once and leaves it
    /// untouched: `Ok` when it takes the login; else why not in plain
    /// words (the server cannot be reached, it has no such database, it
    /// refused the login).
    pub async fn reach(url: &str) -> Result<(), StoreError> {
        postgres::reach(url).await
    }

    /// Connects to the PostgreSQL database at `url` for reading only: its
    /// transactions are read-only, and a database without proxywarden's
    /// schema at this binary's version is refused
    /// ([`StoreError::Empty`], [`StoreError::TooOld`],
    /// [`StoreError::TooNew`]), never migrated.
    pub async fn connect_read_only(url: &str) -> Result<Store, StoreError> {
        Ok(Store {
            backend: Backend::Postgres(Postgres::connect_read_only(url).await?),
        })
    }

    /// Whether the disk is refusing writes now: since when, why, and when
    /// they are tried again. While it is, writes are refused at once
    /// ([`StoreError::Unwritable`]) until the pause after the last failure
    /// ([`RETRY_FIRST`] doubling up to [`RETRY_MAX`]) is over; the first
    /// write that works ends it.
    pub fn write_trouble(&self) -> Option<WriteTrouble> {
        dispatch!(self.write_trouble(), sync)
    }

    /// Transactions the disk refused since the store was opened, by kind.
    pub fn write_failures(&self) -> Vec<(WriteFailure, u64)> {
        dispatch!(self.write_failures(), sync)
    }

    /// Every change of [`Store::write_trouble`] from now on: a failure, a
    /// further one, the end.
    pub fn watch_writes(&self) -> tokio::sync::watch::Receiver<Option<WriteTrouble>> {
        dispatch!(self.watch_writes(), sync)
    }

    /// Waits until writes work again (at once when they do). Something
    /// must try them: see [`Store::probe_writes`].
    pub async fn writable(&self) {
        let mut changes = self.watch_writes();
        // The sender lives as long as the store.
        let _ = changes.wait_for(Option::is_none).await;
    }

    /// Tries a write that changes nothing but still goes to the disk, so
    /// that writes that work again are noticed although nothing else
    /// writes.
    pub async fn probe_writes(&self) -> Result<(), StoreError> {
        dispatch!(self.probe_writes())
    }

    /// The database file; for PostgreSQL, its URL without the password.
    pub fn path(&self) -> &Path {
        dispatch!(self.path(), sync)
    }

    /// Copies the write-ahead log into the database file and empties it,
    /// so that the file alone holds every commit: a command that exits
    /// leaves a database one can copy as it is. Waits briefly for other
    /// processes' readers; true when the whole log was copied (another
    /// process reading, a running daemon say, may keep part of it, which
    /// that process copies later). A store opened read-only does nothing.
    pub async fn checkpoint(&self) -> Result<bool, StoreError> {
        dispatch!(self.checkpoint())
    }

    /// The schema version of the open database.
    pub async fn schema_version(&self) -> Result<i64, StoreError> {
        dispatch!(self.schema_version())
    }

    /// The SQLite backend, for unit tests that look at rows no method of
    /// the surface shows.
    #[cfg(test)]
    pub(crate) fn sqlite(&self) -> &Sqlite {
        match &self.backend {
            Backend::Sqlite(db) => db,
            Backend::Postgres(_) => panic!("a unit test of SQLite rows on PostgreSQL"),
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
