//! SQLite: what sites taught about proxies.

use rusqlite::{Connection, Row, params};

use super::Sqlite;
use crate::store::{SiteRecord, StoreError};

const COLUMNS: &str = "site, proxy_id, worked, blocked, latency_ms, last_worked_at, \
                       last_blocked_at, banned_until, updated_at";

fn record(r: &Row<'_>) -> rusqlite::Result<SiteRecord> {
    Ok(SiteRecord {
        site: r.get(0)?,
        proxy_id: r.get(1)?,
        worked: r.get(2)?,
        blocked: r.get(3)?,
        latency_ms: r.get(4)?,
        last_worked_at: r.get(5)?,
        last_blocked_at: r.get(6)?,
        banned_until: r.get(7)?,
        updated_at: r.get(8)?,
    })
}

impl Sqlite {
    pub(crate) async fn save_site_records(
        &self,
        records: Vec<SiteRecord>,
    ) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        self.write_weighted(records.len(), move |tx| save(tx, &records))
            .await
    }

    pub(crate) async fn load_site_records(
        &self,
        since: i64,
        limit: usize,
    ) -> Result<Vec<SiteRecord>, StoreError> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!(
                "SELECT {COLUMNS} FROM proxy_sites WHERE updated_at >= ?1
                 ORDER BY updated_at DESC LIMIT ?2"
            ))?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let rows = stmt.query_map(params![since, limit], record)?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }
}

fn save(tx: &Connection, records: &[SiteRecord]) -> Result<(), StoreError> {
    let mut stmt = tx.prepare_cached(&format!(
        "INSERT INTO proxy_sites ({COLUMNS})
         SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9 WHERE EXISTS (SELECT 1 FROM proxies WHERE id = ?2)
         ON CONFLICT (site, proxy_id) DO UPDATE SET
             worked = excluded.worked, blocked = excluded.blocked,
             latency_ms = excluded.latency_ms, last_worked_at = excluded.last_worked_at,
             last_blocked_at = excluded.last_blocked_at, banned_until = excluded.banned_until,
             updated_at = excluded.updated_at"
    ))?;
    for r in records {
        stmt.execute(params![
            r.site,
            r.proxy_id,
            r.worked,
            r.blocked,
            r.latency_ms,
            r.last_worked_at,
            r.last_blocked_at,
            r.banned_until,
            r.updated_at,
        ])?;
    }
    Ok(())
}
