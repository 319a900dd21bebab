//! PostgreSQL: a source run written in bounded transactions (known
//! proxies updated only where something changed, new ones inserted), the
//! links the list left out unlisted, and the source's row.

use deadpool_postgres::GenericClient;

use super::Postgres;
use super::checks::bump_change_seq;
use crate::model::{Candidate, CandidateList};
use crate::proxy::Anonymity;
use crate::store::{DbError, SourceRun, StoreError, UpsertCounts};

/// Candidates written per transaction: a bounded time holding row locks
/// other nodes' harvests and checks may wait for.
const SOURCE_CHUNK: usize = 2_000;

/// Columns read to decide whether a known proxy's row changes, then the
/// link's `listed` for source `$5` (`$4` without a scheme).
const FOUND_COLUMNS: &str = "p.id, p.password, p.scheme_detect, p.country, p.country_source, \
    p.hint_anonymity, p.hint_https";

const UPDATE_KNOWN: &str = "UPDATE proxies SET
        password = coalesce($2, password),
        scheme_detect = scheme_detect AND $3,
        country = CASE WHEN country_source = 'geoip' OR $4::text IS NULL THEN country ELSE $4 END,
        country_source = CASE WHEN country_source = 'geoip' OR $4::text IS NULL
                         THEN country_source ELSE 'source' END,
        hint_anonymity = coalesce($5, hint_anonymity),
        hint_https = coalesce($6, hint_https),
        changed_seq = CASE WHEN $7 THEN (SELECT change_seq FROM meta) ELSE changed_seq END
    WHERE id = $1";

const LINK_SOURCE: &str =
    "INSERT INTO proxy_sources (proxy_id, source_id, first_seen, last_seen, listed)
     VALUES ($1, $2, $3, $3, true)
     ON CONFLICT (source_id, proxy_id) DO UPDATE SET
         listed = true, last_seen = greatest(proxy_sources.last_seen, excluded.last_seen)";

impl Postgres {
    pub(crate) async fn record_source_run_into(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
        counts: &mut UpsertCounts,
    ) -> Result<(), StoreError> {
        let list: CandidateList = candidates.into();
        let mut c = self.client().await?;
        let row = c
            .query_one(
                "INSERT INTO sources (name, url, format) VALUES ($1, $2, $3)
                 ON CONFLICT (name) DO UPDATE SET url = excluded.url, format = excluded.format
                 RETURNING id, listed_at",
                &[&run.name, &run.url, &run.format],
            )
            .await?;
        let (source, listed_before): (i64, Option<i64>) = (row.get(0), row.get(1));
        let now = run.started_at;
        let mut seen: Vec<i64> = Vec::with_capacity(list.len());
        let all: Vec<Candidate> = list.iter().collect();
        for chunk in all.chunks(SOURCE_CHUNK) {
            let tx = c.transaction().await?;
            let (written, ids) = upsert(&tx, source, now, chunk).await?;
            tx.commit().await?;
            counts.found += written.found;
            counts.new += written.new;
            seen.extend(ids);
        }
        // A run that stored nothing (a failed fetch) leaves the last list
        // standing; before the first list there is nothing to unlist.
        if let (true, Some(listed_before)) = (counts.found > 0, listed_before) {
            c.execute(
                "WITH gone AS (
                     UPDATE proxy_sources SET listed = false,
                         last_seen = greatest(last_seen, $3)
                     WHERE source_id = $1 AND listed AND NOT (proxy_id = ANY($2))
                     RETURNING proxy_id)
                 UPDATE proxies SET last_seen = greatest(last_seen, $3)
                 WHERE id IN (SELECT proxy_id FROM gone)",
                &[&source, &seen, &listed_before],
            )
            .await?;
        }
        let failed = i64::from(run.error.is_some());
        c.execute(
            "UPDATE sources SET
                 last_fetch_at = $2,
                 last_ok_at = CASE WHEN $7::text IS NULL THEN $2 ELSE last_ok_at END,
                 last_http_status = $3,
                 last_duration_ms = $4,
                 last_found = $5,
                 last_new = $6,
                 last_error = $7,
                 listed_at = CASE WHEN $5::bigint > 0 THEN $8 ELSE listed_at END,
                 last_private = $9,
                 fetches_total = fetches_total + 1,
                 fetches_failed = fetches_failed + $10
             WHERE id = $1",
            &[
                &source,
                &(run.started_at + run.duration_ms),
                &run.http_status.map(i64::from),
                &run.duration_ms,
                &(counts.found as i64),
                &(counts.new as i64),
                &run.error,
                &run.started_at,
                &(run.private as i64),
                &failed,
            ],
        )
        .await?;
        Ok(())
    }
}

/// Writes one chunk of a source's candidates, linked to the source; the
/// counts and the row id of every candidate.
async fn upsert(
    tx: &impl GenericClient,
    source: i64,
    now: i64,
    candidates: &[Candidate],
) -> Result<(UpsertCounts, Vec<i64>), StoreError> {
    let mut counts = UpsertCounts::default();
    let mut ids = Vec::with_capacity(candidates.len());
    // The rows whose country changes (a country from the source changes
    // what filters select): stamped with a new change number once every
    // row is written, rows first and the counter last as every writer
    // does (see `checks::record_checks`).
    let mut restamp: Vec<i64> = Vec::new();
    let find = tx
        .prepare_cached(&format!(
            "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = $5)
             FROM proxies p WHERE p.scheme = $1 AND p.host = $2 AND p.port = $3 AND p.username = $4"
        ))
        .await?;
    // An entry whose scheme is to be detected is the same proxy as any row
    // at its address, whatever scheme detection gave it.
    let find_any = tx
        .prepare_cached(&format!(
            "SELECT {FOUND_COLUMNS},
                (SELECT listed FROM proxy_sources WHERE proxy_id = p.id AND source_id = $4)
             FROM proxies p WHERE p.host = $1 AND p.port = $2 AND p.username = $3
             ORDER BY p.scheme_detect, p.id LIMIT 1"
        ))
        .await?;
    let insert = tx
        .prepare_cached(
            "INSERT INTO proxies (scheme, host, port, username, password, scheme_detect,
                 country, country_source, hint_anonymity, hint_https,
                 first_seen, last_seen, next_check_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7,
                 CASE WHEN $7::text IS NULL THEN NULL ELSE 'source' END, $8, $9, $10, $10, $10)
             RETURNING id",
        )
        .await?;
    let update = tx.prepare_cached(UPDATE_KNOWN).await?;
    let link = tx.prepare_cached(LINK_SOURCE).await?;
    for c in candidates {
        let p = &c.proxy;
        if p.port == 0 {
            return Err(StoreError::Database(DbError::unexpected(format!(
                "{p}: port 0 is not a proxy's port"
            ))));
        }
        let host = p.host.to_string();
        let port = i32::from(p.port);
        let password = p.auth.as_ref().map(|a| a.password.as_str());
        let country = c.hints.country.as_ref().map(|c| c.as_str());
        let anonymity = c.hints.anonymity.map(Anonymity::as_str);
        let known = if c.detect {
            tx.query_opt(&find_any, &[&host, &port, &p.username(), &source])
                .await?
        } else {
            tx.query_opt(
                &find,
                &[&p.scheme.as_str(), &host, &port, &p.username(), &source],
            )
            .await?
        };
        let (id, listed) = match known {
            Some(r) => {
                let id: i64 = r.get(0);
                let stored_password: Option<&str> = r.get(1);
                let detect: bool = r.get(2);
                let stored_country: Option<&str> = r.get(3);
                let country_source: Option<&str> = r.get(4);
                let hint_anonymity: Option<&str> = r.get(5);
                let hint_https: Option<bool> = r.get(6);
                let listed: Option<bool> = r.get(7);
                // The update's rules: a GeoIP country is what the exit
                // address really is, and a source's claim never overrides it.
                let country_changes = country_source != Some("geoip")
                    && country.is_some()
                    && stored_country != country;
                let changes = country_changes
                    || (password.is_some() && stored_password != password)
                    || (detect && !c.detect)
                    || (country.is_some()
                        && country_source != Some("geoip")
                        && country_source != Some("source"))
                    || (anonymity.is_some() && hint_anonymity != anonymity)
                    || (c.hints.https.is_some() && hint_https != c.hints.https);
                if country_changes {
                    restamp.push(id);
                }
                if changes {
                    tx.execute(
                        &update,
                        &[
                            &id,
                            &password,
                            &c.detect,
                            &country,
                            &anonymity,
                            &c.hints.https,
                            &country_changes,
                        ],
                    )
                    .await?;
                }
                (id, listed == Some(true))
            }
            None => {
                let id: i64 = tx
                    .query_one(
                        &insert,
                        &[
                            &p.scheme.as_str(),
                            &host,
                            &port,
                            &p.username(),
                            &password,
                            &c.detect,
                            &country,
                            &anonymity,
                            &c.hints.https,
                            &now,
                        ],
                    )
                    .await?
                    .get(0);
                counts.new += 1;
                (id, false)
            }
        };
        if !listed {
            tx.execute(&link, &[&id, &source, &now]).await?;
        }
        ids.push(id);
        counts.found += 1;
    }
    if !restamp.is_empty() {
        bump_change_seq(tx).await?;
        tx.execute(
            "UPDATE proxies SET changed_seq = (SELECT change_seq FROM meta) WHERE id = ANY($1)",
            &[&restamp],
        )
        .await?;
    }
    Ok((counts, ids))
}
