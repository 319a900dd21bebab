//! PostgreSQL: what sites taught about proxies, and the minute snapshots.

use deadpool_postgres::GenericClient;

use super::Postgres;
use crate::store::{SiteRecord, Snapshot, StoreError};

impl Postgres {
    pub(crate) async fn save_site_records(
        &self,
        records: Vec<SiteRecord>,
    ) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        let st = tx
            .prepare_cached(
                "INSERT INTO proxy_sites (site, proxy_id, worked, blocked, latency_ms,
                     last_worked_at, last_blocked_at, banned_until, updated_at)
                 SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9
                 WHERE EXISTS (SELECT 1 FROM proxies WHERE id = $2)
                 ON CONFLICT (site, proxy_id) DO UPDATE SET
                     worked = excluded.worked, blocked = excluded.blocked,
                     latency_ms = excluded.latency_ms, last_worked_at = excluded.last_worked_at,
                     last_blocked_at = excluded.last_blocked_at,
                     banned_until = excluded.banned_until, updated_at = excluded.updated_at",
            )
            .await?;
        for r in &records {
            tx.execute(
                &st,
                &[
                    &r.site,
                    &r.proxy_id,
                    &r.worked,
                    &r.blocked,
                    &r.latency_ms,
                    &r.last_worked_at,
                    &r.last_blocked_at,
                    &r.banned_until,
                    &r.updated_at,
                ],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn load_site_records(
        &self,
        since: i64,
        limit: usize,
    ) -> Result<Vec<SiteRecord>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT site, proxy_id, worked, blocked, latency_ms, last_worked_at,
                        last_blocked_at, banned_until, updated_at
                 FROM proxy_sites WHERE updated_at >= $1 ORDER BY updated_at DESC LIMIT $2",
                &[&since, &i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| SiteRecord {
                site: r.get(0),
                proxy_id: r.get(1),
                worked: r.get(2),
                blocked: r.get(3),
                latency_ms: r.get(4),
                last_worked_at: r.get(5),
                last_blocked_at: r.get(6),
                banned_until: r.get(7),
                updated_at: r.get(8),
            })
            .collect())
    }

    pub(crate) async fn record_snapshot(
        &self,
        snapshot: Snapshot,
        keep_since: i64,
    ) -> Result<(), StoreError> {
        let s = snapshot;
        let mut c = self.client().await?;
        let tx = c.transaction().await?;
        tx.execute(
            "INSERT INTO snapshots (at, servable, alive, dead, unknown, checks,
                 checks_alive, gateway_requests, gateway_failures)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (at) DO UPDATE SET servable = excluded.servable,
                 alive = excluded.alive, dead = excluded.dead, unknown = excluded.unknown,
                 checks = excluded.checks, checks_alive = excluded.checks_alive,
                 gateway_requests = excluded.gateway_requests,
                 gateway_failures = excluded.gateway_failures",
            &[
                &s.at,
                &s.servable,
                &s.alive,
                &s.dead,
                &s.unknown,
                &s.checks,
                &s.checks_alive,
                &s.gateway_requests,
                &s.gateway_failures,
            ],
        )
        .await?;
        tx.execute("DELETE FROM snapshots WHERE at < $1", &[&keep_since])
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub(crate) async fn snapshots(
        &self,
        since: i64,
        bucket_ms: i64,
    ) -> Result<Vec<Snapshot>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "SELECT (at / $2) * $2 AS b,
                        round(avg(servable))::bigint, round(avg(alive))::bigint,
                        round(avg(dead))::bigint, round(avg(unknown))::bigint,
                        round(avg(checks))::bigint, round(avg(checks_alive))::bigint,
                        round(avg(gateway_requests))::bigint, round(avg(gateway_failures))::bigint
                 FROM snapshots WHERE at >= $1 GROUP BY b ORDER BY b",
                &[&since, &bucket_ms.max(1)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| Snapshot {
                at: r.get(0),
                servable: r.get(1),
                alive: r.get(2),
                dead: r.get(3),
                unknown: r.get(4),
                checks: r.get(5),
                checks_alive: r.get(6),
                gateway_requests: r.get(7),
                gateway_failures: r.get(8),
            })
            .collect())
    }
}
