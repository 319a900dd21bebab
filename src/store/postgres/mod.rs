//! The backend for several nodes: one PostgreSQL database reached through
//! a pool of connections (deadpool-postgres over tokio-postgres). Its own
//! SQL, and its own numbered migrations in `migrations/postgres/`, applied
//! under an advisory lock so that nodes starting together migrate once.
//! Every call is async I/O on the runtime: nothing here blocks a worker.
//! A file per topic of the store's surface, each an `impl Postgres`; a
//! crawl frontier has a connection of its own (`frontier`).

mod browse;
mod checks;
mod crawls;
pub(crate) mod frontier;
mod ingest;
mod listing;
mod nodes;
mod sites;

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::NoTls;
use tokio_postgres::error::SqlState;

use super::unwritable::{WriteFailure, WriteHealth, WriteTrouble};
use super::{DbError, StoreError};

/// Every migration, in order; the version after applying `MIGRATIONS[i]`
/// is `i + 1`. Never edit an applied migration: add a new file.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/postgres/0001_init.sql"),
    include_str!("../../../migrations/postgres/0002_check_leases.sql"),
    include_str!("../../../migrations/postgres/0003_nodes.sql"),
    include_str!("../../../migrations/postgres/0004_crawl_leases.sql"),
    include_str!("../../../migrations/postgres/0005_harvest_claim_leases.sql"),
    include_str!("../../../migrations/postgres/0006_links_without_foreign_keys.sql"),
    include_str!("../../../migrations/postgres/0007_links_by_source.sql"),
];

/// The schema version this binary writes.
pub(crate) const LATEST: i64 = MIGRATIONS.len() as i64;

/// The advisory lock nodes take to migrate one at a time (any number the
/// application keeps for itself: "pwmigrat" in ASCII).
const MIGRATE_LOCK: i64 = 0x7077_6d69_6772_6174;

/// Connections kept: the API's listings, a check round's writes and a
/// harvest at once, on a server that other nodes share.
const CONNECTIONS: usize = 8;

/// How long a node waits for a connection of its pool, or for the server
/// to answer a new one.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl From<tokio_postgres::Error> for DbError {
    fn from(e: tokio_postgres::Error) -> DbError {
        let failure = match e.code() {
            Some(c) => match *c {
                SqlState::DISK_FULL => Some(WriteFailure::DiskFull),
                SqlState::READ_ONLY_SQL_TRANSACTION => Some(WriteFailure::ReadOnly),
                SqlState::IO_ERROR => Some(WriteFailure::Io),
                // The server stops or restarts (its sessions are ended),
                // is still starting, or takes no more connections.
                SqlState::ADMIN_SHUTDOWN
                | SqlState::CRASH_SHUTDOWN
                | SqlState::CANNOT_CONNECT_NOW
                | SqlState::TOO_MANY_CONNECTIONS => Some(WriteFailure::Unreachable),
                _ if c.code().starts_with("08") => Some(WriteFailure::Unreachable),
                _ => None,
            },
            None => lost_connection(&e).then_some(WriteFailure::Unreachable),
        };
        let transient = e.code().is_some_and(|c| {
            *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE
        });
        // The server's own message and detail, or the driver's error with
        // its cause ("Connection refused"), not the driver's summary.
        let source: Box<dyn std::error::Error + Send + Sync> = match e.as_db_error() {
            Some(_) => describe(&e).into(),
            None if failure.is_some() => describe(&e).into(),
            None => Box::new(e),
        };
        DbError {
            failure,
            transient,
            source,
        }
    }
}

/// True for a driver error that says the server could not be reached or
/// the connection to it broke (refused, reset, closed, no answer in
/// time), rather than a fault in a statement or its rows. The driver
/// names its kinds only in words.
fn lost_connection(e: &tokio_postgres::Error) -> bool {
    let said = e.to_string();
    e.is_closed()
        || [
            "error connecting to server",
            "error communicating with the server",
            "timeout waiting for server",
        ]
        .iter()
        .any(|kind| said.starts_with(kind))
}

/// What went wrong, in one line: the server's message with its detail and
/// hint (which PostgreSQL sends as lines of their own), or the driver's
/// error with its causes ("error connecting to server: Connection refused").
pub(super) fn describe(e: &tokio_postgres::Error) -> String {
    let one_line = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    match e.as_db_error() {
        Some(db) => {
            let mut text = format!("{}: {}", db.severity(), one_line(db.message()));
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" (detail: {})", one_line(detail)));
            }
            if let Some(hint) = db.hint() {
                text.push_str(&format!(" (hint: {})", one_line(hint)));
            }
            text
        }
        None => {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(e);
            while let Some(c) = cause {
                let more = c.to_string();
                if !text.contains(&more) {
                    text.push_str(&format!(": {more}"));
                }
                cause = c.source();
            }
            one_line(&text)
        }
    }
}

/// A pool's failure to hand out a connection, in one line with its cause.
fn describe_pool(e: &deadpool_postgres::PoolError) -> String {
    match e {
        deadpool_postgres::PoolError::Backend(e) => describe(e),
        deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait) => format!(
            "every connection to the server stayed busy for {}s",
            CONNECT_TIMEOUT.as_secs()
        ),
        deadpool_postgres::PoolError::Timeout(_) => format!(
            "the server did not answer within {}s",
            CONNECT_TIMEOUT.as_secs()
        ),
        other => other.to_string(),
    }
}

/// The PostgreSQL code's `?`: its driver's errors become [`DbError`]s.
#[doc(hidden)]
impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> StoreError {
        StoreError::Database(e.into())
    }
}

#[doc(hidden)]
impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> StoreError {
        match e {
            deadpool_postgres::PoolError::Backend(e) => e.into(),
            other => StoreError::Database(DbError {
                // No new connection within the time: the server is away
                // (a pool merely busy is not).
                failure: matches!(
                    other,
                    deadpool_postgres::PoolError::Timeout(
                        deadpool_postgres::TimeoutType::Create
                            | deadpool_postgres::TimeoutType::Recycle
                    )
                )
                .then_some(WriteFailure::Unreachable),
                transient: false,
                source: describe_pool(&other).into(),
            }),
        }
    }
}

/// A failure to reach the database at `shown`, as [`StoreError::Open`].
fn open_err(shown: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: shown.to_path_buf(),
        reason: e.to_string(),
    }
}

/// The pool of connections to `url` (not yet connected), its
/// configuration and the URL as shown; `read_only` makes every
/// transaction of its connections read-only.
fn pool(url: &str, read_only: bool) -> Result<(Pool, tokio_postgres::Config, PathBuf), StoreError> {
    let shown = PathBuf::from(crate::config::redact_password(url));
    let mut config = tokio_postgres::Config::from_str(url).map_err(|e| open_err(&shown, e))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    config.application_name("proxywarden");
    // Compiling a plan just in time costs up to a second for a statement
    // the planner deems big (a count over every proxy, as a harvest's
    // summary makes), far more than it saves on the store's statements.
    let mut ours = "-c jit=off".to_owned();
    if read_only {
        ours.push_str(" -c default_transaction_read_only=on");
    }
    let options = match config.get_options() {
        Some(o) => format!("{o} {ours}"),
        None => ours,
    };
    config.options(&options);
    let manager = Manager::from_config(
        config.clone(),
        NoTls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(CONNECTIONS)
        .wait_timeout(Some(CONNECT_TIMEOUT))
        .create_timeout(Some(CONNECT_TIMEOUT))
        .runtime(deadpool_postgres::Runtime::Tokio1)
        .build()
        .map_err(|e| open_err(&shown, e))?;
    Ok((pool, config, shown))
}

/// See [`crate::store::Store::reach`].
pub(crate) async fn reach(url: &str) -> Result<(), StoreError> {
    let (_, config, shown) = pool(url, true)?;
    let user = config.get_user().unwrap_or("(the system user)").to_owned();
    let database = config.get_dbname().unwrap_or(&user).to_owned();
    let at = config
        .get_hosts()
        .iter()
        .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
        .map(|(h, p)| match h {
            tokio_postgres::config::Host::Tcp(h) => format!("{h}:{p}"),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect::<Vec<_>>()
        .join(", ");
    let plain = |e: tokio_postgres::Error| -> String {
        match e.code() {
            Some(c) if *c == SqlState::INVALID_CATALOG_NAME => format!(
                "the server at {at} has no database {database:?}: create it (CREATE DATABASE) or \
                 name another in the URL"
            ),
            Some(c)
                if *c == SqlState::INVALID_PASSWORD
                    || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION =>
            {
                format!(
                    "the server at {at} refused the login of user {user:?}: {}",
                    describe(&e)
                )
            }
            Some(_) => describe(&e),
            None => format!(
                "cannot reach the PostgreSQL server at {at}: {}",
                describe(&e)
            ),
        }
    };
    let (client, connection) = config
        .connect(NoTls)
        .await
        .map_err(|e| open_err(&shown, plain(e)))?;
    let driver = tokio::spawn(connection);
    let answered = client.simple_query("SELECT 1").await;
    drop(client);
    let _ = driver.await;
    answered.map_err(|e| open_err(&shown, plain(e)))?;
    Ok(())
}

/// A cheap, cloneable handle to one PostgreSQL database.
#[derive(Clone)]
pub(crate) struct Postgres {
    inner: Arc<Shared>,
}

struct Shared {
    pool: Pool,
    /// The URL without its password: what logs and errors show.
    shown: PathBuf,
    /// Whether writes work (what the daemon's write monitor reads).
    health: WriteHealth,
    /// How to connect: the connection that LISTENs for changes and each
    /// crawl frontier's are their own.
    config: tokio_postgres::Config,
    /// Woken at every change number another connection commits, once
    /// something asked for notices.
    notices: std::sync::OnceLock<Arc<tokio::sync::Notify>>,
}

impl Postgres {
    /// Connects to the database at `url` (a `postgres://` URL), applies
    /// pending migrations and keeps a pool of connections.
    pub(crate) async fn connect(url: &str) -> Result<Postgres, StoreError> {
        let (pool, config, shown) = pool(url, false)?;
        let mut client = pool
            .get()
            .await
            .map_err(|e| open_err(&shown, describe_pool(&e)))?;
        migrate(&mut client, &shown).await?;
        drop(client);
        Ok(Postgres::of(pool, shown, config))
    }

    /// Connects for reading only (`stats`, `export`): every transaction
    /// of its connections is read-only, and a database that holds no
    /// proxywarden schema, or an older or newer one, is refused, not
    /// migrated.
    pub(crate) async fn connect_read_only(url: &str) -> Result<Postgres, StoreError> {
        let (pool, config, shown) = pool(url, true)?;
        let client = pool
            .get()
            .await
            .map_err(|e| open_err(&shown, describe_pool(&e)))?;
        let read = async || -> Result<Option<i64>, tokio_postgres::Error> {
            let exists: bool = client
                .query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[])
                .await?
                .get(0);
            if !exists {
                return Ok(None);
            }
            let row = client
                .query_one(
                    "SELECT coalesce(max(version), 0) FROM schema_migrations",
                    &[],
                )
                .await?;
            Ok(Some(row.get(0)))
        };
        let version = read().await.map_err(|e| open_err(&shown, describe(&e)))?;
        drop(client);
        match version {
            None | Some(0) => Err(StoreError::Empty { url: shown }),
            Some(found) if found > LATEST => Err(StoreError::TooNew {
                path: shown,
                setting: "database.url",
                found,
                supported: LATEST,
            }),
            Some(found) if found < LATEST => Err(StoreError::TooOld {
                path: shown,
                found,
                supported: LATEST,
            }),
            Some(_) => Ok(Postgres::of(pool, shown, config)),
        }
    }

    fn of(pool: Pool, shown: PathBuf, config: tokio_postgres::Config) -> Postgres {
        Postgres {
            inner: Arc::new(Shared {
                pool,
                shown,
                health: WriteHealth::default(),
                config,
                notices: std::sync::OnceLock::new(),
            }),
        }
    }

    /// A connection of the pool. While the server was found unreachable
    /// and the pause after that runs, none is asked for: the call fails
    /// at once, as a write does on a full disk, instead of every caller
    /// waiting on a connection that cannot come.
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        if let Some(t) = self.inner.health.trouble()
            && t.kind == WriteFailure::Unreachable
            && !t.retry_in().is_zero()
        {
            return Err(StoreError::Unwritable {
                kind: t.kind,
                reason: t.reason,
            });
        }
        Ok(self.inner.pool.get().await?)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.inner.shown
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
        self.client()
            .await?
            .execute("UPDATE meta SET change_seq = change_seq", &[])
            .await?;
        self.inner.health.wrote();
        Ok(())
    }

    /// Passes `r` on, noting in the write health a write the server
    /// refused for want of room or because it turned read-only, and a
    /// server that cannot be reached, as the SQLite writer notes its own: the daemon then says it is degraded
    /// and backs off. A trial write ([`Postgres::probe_writes`]) that
    /// works ends the trouble.
    pub(crate) fn observed<T>(&self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        // A call refused during the pause (`Unwritable`) is no new try.
        if let Err(e) = &r
            && let Some(kind) = e.write_failure()
            && !matches!(e, StoreError::Unwritable { .. })
        {
            tracing::debug!(database = %self.inner.shown.display(), %kind, error = %e, "the database refused a write");
            let reason = match e {
                StoreError::Database(d) | StoreError::Migrate { source: d, .. } => d.to_string(),
                other => other.to_string(),
            };
            self.inner.health.failed(kind, reason);
        }
        r
    }

    /// The server keeps its own log: there is nothing to copy.
    pub(crate) async fn checkpoint(&self) -> Result<bool, StoreError> {
        Ok(true)
    }

    pub(crate) async fn schema_version(&self) -> Result<i64, StoreError> {
        let row = self
            .client()
            .await?
            .query_one("SELECT max(version) FROM schema_migrations", &[])
            .await?;
        Ok(row.get::<_, Option<i64>>(0).unwrap_or(0))
    }
}

/// Brings the database up to [`LATEST`] in one transaction, holding an
/// advisory lock so that a node starting beside another waits for its
/// migration instead of racing it. Refuses a database from a newer
/// version and one that holds another application's `proxies` table.
async fn migrate(client: &mut deadpool_postgres::Object, shown: &Path) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATE_LOCK])
        .await?;
    let tables: Vec<String> = tx
        .query(
            "SELECT table_name::text FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name IN ('proxies', 'schema_migrations')",
            &[],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    if tables.iter().any(|t| t == "proxies") && !tables.iter().any(|t| t == "schema_migrations") {
        return Err(StoreError::Foreign {
            path: shown.to_path_buf(),
            what: "it holds a proxies table that is not proxywarden's".into(),
        });
    }
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations (
             version BIGINT PRIMARY KEY,
             applied_at BIGINT NOT NULL
         )",
    )
    .await?;
    let current: i64 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM schema_migrations",
            &[],
        )
        .await?
        .get(0);
    if current > LATEST {
        return Err(StoreError::TooNew {
            path: shown.to_path_buf(),
            setting: "database.url",
            found: current,
            supported: LATEST,
        });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        let migrate_err = |e: tokio_postgres::Error| StoreError::Migrate {
            path: shown.to_path_buf(),
            version,
            source: e.into(),
        };
        tx.batch_execute(sql).await.map_err(migrate_err)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)",
            &[&version, &super::now_ms()],
        )
        .await
        .map_err(migrate_err)?;
        tracing::debug!(database = %shown.display(), version, "applied database migration");
    }
    tx.commit().await?;
    Ok(())
}
