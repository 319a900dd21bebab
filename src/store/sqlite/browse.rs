//! SQLite: a page of the operator's table, with what sites taught about
//! its proxies.

use rusqlite::Connection;
use rusqlite::types::Value;

use super::Sqlite;
use super::rows::{PROXY_COLUMNS, proxy_from_row};
use crate::store::browse::{Binder, assemble, group_sites, sites_sql};
use crate::store::{Browse, BrowsePage, MAX_COUNTED, ProxyRecord, SiteRecord, StoreError, now_ms};

/// Arguments numbered `?1`, `?2`, … after the filter's own.
struct Args(Vec<Value>);

impl Binder for Args {
    fn int(&mut self, v: i64) -> String {
        self.0.push(Value::Integer(v));
        format!("?{}", self.0.len())
    }
    fn text(&mut self, v: String) -> String {
        self.0.push(Value::Text(v));
        format!("?{}", self.0.len())
    }
}

impl Sqlite {
    pub(crate) async fn browse(&self, browse: Browse) -> Result<BrowsePage, StoreError> {
        self.read(move |c| page(c, &browse)).await
    }
}

/// The filter's and the search's conditions, and their arguments.
fn matching(browse: &Browse) -> (String, Args) {
    let (mut clause, args) = browse.filter.sql();
    let mut args = Args(args);
    if let Some(search) = browse.search_sql(&mut args) {
        clause.push_str(&format!(" AND {search}"));
    }
    (clause, args)
}

/// The rows of `browse` past its cursor, one more than its limit.
fn rows(c: &Connection, browse: &Browse) -> Result<Vec<ProxyRecord>, StoreError> {
    let (mut clause, mut args) = matching(browse);
    let (keyset, order) = browse.keyset_sql(&mut args);
    if let Some(k) = keyset {
        clause.push_str(&format!(" AND {k}"));
    }
    let limit = args.int(browse.limit as i64 + 1);
    // The page's ids first, then their columns: the sources' subqueries
    // in the columns run for the page's rows only, not for every row an
    // order scans.
    let mut stmt = c.prepare(&format!(
        "SELECT {PROXY_COLUMNS} FROM (SELECT p.id FROM proxies p WHERE {clause}
                                        ORDER BY {order} LIMIT {limit}) page
         JOIN proxies p ON p.id = page.id ORDER BY {order}"
    ))?;
    let rows = stmt.query_map(rusqlite::params_from_iter(args.0), proxy_from_row)?;
    Ok(rows.collect::<Result<Vec<_>, _>>()?)
}

fn page(c: &Connection, browse: &Browse) -> Result<BrowsePage, StoreError> {
    let rows = rows(c, browse)?;
    let other_side = match (browse.from, rows.first()) {
        (Some(_), Some(nearest)) => !self::rows(c, &browse.probe_back(nearest))?.is_empty(),
        _ => false,
    };
    let (clause, mut args) = matching(browse);
    let cap = args.int(MAX_COUNTED + 1);
    let counted: i64 = c.query_row(
        &format!("SELECT count(*) FROM (SELECT 1 FROM proxies p WHERE {clause} LIMIT {cap})"),
        rusqlite::params_from_iter(args.0),
        |r| r.get(0),
    )?;
    let ids: Vec<i64> = rows.iter().take(browse.limit).map(|r| r.id).collect();
    let sites = if ids.is_empty() {
        Default::default()
    } else {
        let list = serde_json::to_string(&ids).unwrap_or_else(|_| "[]".into());
        let mut stmt = c.prepare_cached(&sites_sql(
            "proxy_id IN (SELECT value FROM json_each(?1))",
            "?2",
        ))?;
        let found = stmt.query_map(rusqlite::params![list, now_ms()], |r| {
            Ok((
                SiteRecord {
                    site: r.get(0)?,
                    proxy_id: r.get(1)?,
                    worked: r.get(2)?,
                    blocked: r.get(3)?,
                    latency_ms: r.get(4)?,
                    last_worked_at: r.get(5)?,
                    last_blocked_at: r.get(6)?,
                    banned_until: r.get(7)?,
                    updated_at: r.get(8)?,
                },
                [r.get(9)?, r.get(10)?, r.get(11)?, r.get(12)?],
            ))
        })?;
        group_sites(found.collect::<Result<Vec<_>, _>>()?)
    };
    Ok(assemble(browse, rows, other_side, sites, counted))
}
