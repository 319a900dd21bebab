//! Numbered schema migrations, embedded in the binary and applied in order
//! at start-up. `PRAGMA user_version` records how many have been applied.

use std::path::Path;

use rusqlite::Connection;

use super::StoreError;

/// Every migration, in order; the version after applying `MIGRATIONS[i]` is
/// `i + 1`. Never edit an applied migration: add a new file.
const MIGRATIONS: &[&str] = &[
    include_str!("../../../migrations/0001_init.sql"),
    include_str!("../../../migrations/0002_reports.sql"),
    include_str!("../../../migrations/0003_change_seq.sql"),
    include_str!("../../../migrations/0004_https_checked.sql"),
    include_str!("../../../migrations/0005_crawl_jobs.sql"),
    include_str!("../../../migrations/0006_listed.sql"),
    include_str!("../../../migrations/0007_check_comparisons.sql"),
    include_str!("../../../migrations/0008_proxy_counts.sql"),
    include_str!("../../../migrations/0009_lean_new_rows.sql"),
    include_str!("../../../migrations/0010_partial_status_index.sql"),
    include_str!("../../../migrations/0011_links_by_source.sql"),
    include_str!("../../../migrations/0012_source_private.sql"),
    include_str!("../../../migrations/0013_proxy_sites.sql"),
    include_str!("../../../migrations/0014_snapshots.sql"),
    include_str!("../../../migrations/0015_crawl_frontier.sql"),
    include_str!("../../../migrations/0016_check_leases.sql"),
    include_str!("../../../migrations/0017_nodes.sql"),
    include_str!("../../../migrations/0018_crawl_leases.sql"),
    include_str!("../../../migrations/0019_harvest_claim_leases.sql"),
];

/// Every table the migrations create: a database holding any other is
/// another application's.
pub const TABLES: &[&str] = &[
    "crawl_hosts",
    "crawl_jobs",
    "crawl_meta",
    "crawl_urls",
    "harvest_claims",
    "meta",
    "proxies",
    "proxy_counts",
    "proxy_sites",
    "proxy_sources",
    "snapshots",
    "sources",
];

/// The schema version this binary writes.
pub const LATEST: i64 = MIGRATIONS.len() as i64;

/// Brings the database up to [`LATEST`], one transaction per migration.
pub fn apply(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > LATEST {
        return Err(StoreError::TooNew {
            path: path.to_path_buf(),
            setting: "database.path",
            found: current,
            supported: LATEST,
        });
    }
    // A migration that rebuilds a table drops the old one: with foreign
    // keys on, that would delete every row referring to it. They are off
    // while migrating (the pragma has no effect inside a transaction) and
    // each migration checks, before it commits, that every reference
    // still finds its row.
    let foreign_keys: bool = conn.query_row("PRAGMA foreign_keys", [], |r| r.get(0))?;
    conn.pragma_update(None, "foreign_keys", false)?;
    let result = apply_from(conn, path, current);
    conn.pragma_update(None, "foreign_keys", foreign_keys)?;
    result
}

fn apply_from(conn: &mut Connection, path: &Path, current: i64) -> Result<(), StoreError> {
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = i as i64 + 1;
        let migrate_err = |source: rusqlite::Error| StoreError::Migrate {
            path: path.to_path_buf(),
            version,
            source: source.into(),
        };
        let tx = conn.transaction().map_err(migrate_err)?;
        tx.execute_batch(sql).map_err(migrate_err)?;
        let dangling: i64 = tx
            .query_row("SELECT count(*) FROM pragma_foreign_key_check", [], |r| {
                r.get(0)
            })
            .map_err(migrate_err)?;
        if dangling > 0 {
            return Err(migrate_err(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
                Some(format!(
                    "{dangling} rows would refer to rows that do not exist"
                )),
            )));
        }
        tx.pragma_update(None, "user_version", version)
            .map_err(migrate_err)?;
        tx.commit().map_err(migrate_err)?;
        tracing::debug!(path = %path.display(), version, "applied database migration");
    }
    Ok(())
}
