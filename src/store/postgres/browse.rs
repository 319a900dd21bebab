//! PostgreSQL: a page of the operator's table, with what sites taught
//! about its proxies.

use deadpool_postgres::GenericClient;

use super::Postgres;
use super::listing::{Args, PROXY_COLUMNS, filter_sql, proxy_from_row, refs};
use crate::store::browse::{Binder, assemble, group_sites, sites_sql};
use crate::store::{Browse, BrowsePage, MAX_COUNTED, ProxyRecord, SiteRecord, StoreError, now_ms};

/// How long the server may spend on one page's statements: past the
/// API's own deadline for a page, so the API answers first and the server
/// stops working for a client that left.
const STATEMENT_TIMEOUT: &str = "SET LOCAL statement_timeout = '15s'";

/// Arguments numbered `$1`, `$2`, … after the filter's own.
struct Bind(Args);

impl Binder for Bind {
    fn int(&mut self, v: i64) -> String {
        self.0.push(Box::new(v));
        format!("${}::bigint", self.0.len())
    }
    fn text(&mut self, v: String) -> String {
        self.0.push(Box::new(v));
        format!("${}::text", self.0.len())
    }
}

/// The filter's and the search's conditions, and their arguments.
fn matching(browse: &Browse) -> (String, Bind) {
    let (mut clause, args) = filter_sql(&browse.filter);
    let mut args = Bind(args);
    if let Some(search) = browse.search_sql(&mut args) {
        clause.push_str(&format!(" AND {search}"));
    }
    (clause, args)
}

/// The rows of `browse` past its cursor, one more than its limit.
async fn rows(c: &impl GenericClient, browse: &Browse) -> Result<Vec<ProxyRecord>, StoreError> {
    let (mut clause, mut args) = matching(browse);
    let (keyset, order) = browse.keyset_sql(&mut args);
    if let Some(k) = keyset {
        clause.push_str(&format!(" AND {k}"));
    }
    let limit = args.int(browse.limit as i64 + 1);
    let rows = c
        .query(
            // The page's ids first, then their columns: the sources'
            // subqueries in the columns run for the page's rows only.
            &format!(
                "SELECT {PROXY_COLUMNS} FROM (SELECT p.id FROM proxies p WHERE {clause}
                                                ORDER BY {order} LIMIT {limit}) page
                 JOIN proxies p ON p.id = page.id ORDER BY {order}"
            ),
            &refs(&args.0),
        )
        .await?;
    rows.iter().map(proxy_from_row).collect()
}

impl Postgres {
    pub(crate) async fn browse(&self, browse: Browse) -> Result<BrowsePage, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.batch_execute(STATEMENT_TIMEOUT).await?;
        let rows = rows(&tx, &browse).await?;
        let other_side = match (browse.from, rows.first()) {
            (Some(_), Some(nearest)) => !self::rows(&tx, &browse.probe_back(nearest))
                .await?
                .is_empty(),
            _ => false,
        };
        let (clause, mut args) = matching(&browse);
        let cap = args.int(MAX_COUNTED + 1);
        let counted: i64 = tx
            .query_one(
                &format!(
                    "SELECT count(*) FROM (SELECT 1 FROM proxies p WHERE {clause} LIMIT {cap}) m"
                ),
                &refs(&args.0),
            )
            .await?
            .get(0);
        let ids: Vec<i64> = rows.iter().take(browse.limit).map(|r| r.id).collect();
        let sites = if ids.is_empty() {
            Default::default()
        } else {
            let found = tx
                .query(
                    &sites_sql("proxy_id = ANY($1::bigint[])", "$2::bigint"),
                    &[&ids, &now_ms()],
                )
                .await?;
            group_sites(
                found
                    .iter()
                    .map(|r| {
                        (
                            SiteRecord {
                                site: r.get(0),
                                proxy_id: r.get(1),
                                worked: r.get(2),
                                blocked: r.get(3),
                                latency_ms: r.get(4),
                                last_worked_at: r.get(5),
                                last_blocked_at: r.get(6),
                                banned_until: r.get(7),
                                updated_at: r.get(8),
                            },
                            [r.get(9), r.get(10), r.get(11), r.get(12)],
                        )
                    })
                    .collect(),
            )
        };
        tx.commit().await?;
        Ok(assemble(&browse, rows, other_side, sites, counted))
    }
}
