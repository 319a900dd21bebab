//! Browsing the stored proxies a page at a time, for the operator's
//! table: a search over the address and the country, the listing filters,
//! one of a few fixed orders, and a keyset cursor, so that a page costs
//! the rows it reads however deep it is; with each proxy, what sites
//! taught about it. Both backends build their SQL from the clauses here.

use std::collections::HashMap;

use super::{ProxyFilter, ProxyRecord, SiteRecord, Store, StoreError, dispatch};
use crate::proxy::Country;

/// The most rows a page holds.
pub const MAX_BROWSE_LIMIT: usize = 500;

/// The longest search term, in characters.
pub const MAX_SEARCH: usize = 100;

/// Matches are counted up to this many; past it a page says "more than".
pub const MAX_COUNTED: i64 = 10_000;

/// Site records shown per proxy, most recently changed first (the rest
/// are only counted).
pub const SITES_SHOWN: usize = 5;

/// The orders a page may be in; ties go by id, and a proxy without the
/// sorted figure comes last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BrowseSort {
    /// By id: the order proxies were first stored.
    #[default]
    Id,
    /// Fastest last passed check first.
    Latency,
    /// Most recently checked first.
    LastChecked,
}

impl BrowseSort {
    /// Every order, by name.
    pub const ALL: [BrowseSort; 3] = [BrowseSort::Id, BrowseSort::Latency, BrowseSort::LastChecked];

    /// Its name in the API and in cursors.
    pub fn as_str(self) -> &'static str {
        match self {
            BrowseSort::Id => "id",
            BrowseSort::Latency => "latency",
            BrowseSort::LastChecked => "last_checked",
        }
    }

    /// The order by its name.
    pub fn parse(name: &str) -> Option<BrowseSort> {
        BrowseSort::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// The sorted column over `proxies p` and whether it runs downwards;
    /// `None` for the id alone.
    fn column(self) -> Option<(&'static str, bool)> {
        match self {
            BrowseSort::Id => None,
            BrowseSort::Latency => Some(("p.latency_ms", false)),
            BrowseSort::LastChecked => Some(("p.last_checked", true)),
        }
    }

    /// The sorted figure of `r`.
    fn key(self, r: &ProxyRecord) -> Option<i64> {
        match self {
            BrowseSort::Id => None,
            BrowseSort::Latency => r.latency_ms,
            BrowseSort::LastChecked => r.last_checked,
        }
    }
}

/// A place between two rows of an order: after (or before) the row with
/// this sorted figure and id. Written `sort.figure.id` (`-` for no
/// figure), so a cursor of another order is refused rather than
/// misread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cursor {
    /// The order it belongs to.
    pub sort: BrowseSort,
    /// The row's sorted figure (`None` for the id order, and for a row
    /// without the figure).
    pub key: Option<i64>,
    /// The row's id.
    pub id: i64,
}

impl std::fmt::Display for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.key {
            Some(k) => write!(f, "{}.{k}.{}", self.sort.as_str(), self.id),
            None => write!(f, "{}.-.{}", self.sort.as_str(), self.id),
        }
    }
}

impl Cursor {
    /// The cursor at row `r` of `sort`.
    pub fn at(sort: BrowseSort, r: &ProxyRecord) -> Cursor {
        Cursor {
            sort,
            key: sort.key(r),
            id: r.id,
        }
    }

    /// Reads a cursor this module wrote; `None` for anything else.
    pub fn parse(text: &str) -> Option<Cursor> {
        let mut parts = text.split('.');
        let (sort, key, id) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let sort = BrowseSort::parse(sort)?;
        let key = match key {
            "-" => None,
            k => Some(k.parse::<i64>().ok()?),
        };
        if sort == BrowseSort::Id && key.is_some() {
            return None;
        }
        Some(Cursor {
            sort,
            key,
            id: id.parse().ok()?,
        })
    }
}

/// A search term: a part of the address (`scheme://host:port`), or a
/// country code.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Search {
    /// Matched anywhere in the address, lowercase.
    pub address: String,
    /// The term read as a country code, when it is one.
    pub country: Option<Country>,
}

impl Search {
    /// The search for `term` (trimmed); `None` when it is empty.
    pub fn new(term: &str) -> Option<Search> {
        let term = term.trim();
        if term.is_empty() {
            return None;
        }
        Some(Search {
            address: term.to_lowercase(),
            country: (term.len() == 2).then(|| Country::parse(term)).flatten(),
        })
    }

    /// The `LIKE` pattern of the address part, with `\` escaping the
    /// pattern's own characters.
    fn pattern(&self) -> String {
        let mut p = String::with_capacity(self.address.len() + 2);
        p.push('%');
        for c in self.address.chars() {
            if matches!(c, '%' | '_' | '\\') {
                p.push('\\');
            }
            p.push(c);
        }
        p.push('%');
        p
    }
}

/// Which page to read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Browse {
    /// Which proxies: the API sets status, countries and schemes.
    pub filter: ProxyFilter,
    /// The search, if any.
    pub search: Option<Search>,
    /// The order.
    pub sort: BrowseSort,
    /// Where the page starts: after this row, or when `before`, where it
    /// ends; the first page when `None`.
    pub from: Option<Cursor>,
    /// True when the page ends before `from` (the previous page).
    pub before: bool,
    /// Rows on the page (1 to [`MAX_BROWSE_LIMIT`]).
    pub limit: usize,
}

/// What the sites taught about one proxy: how many sites know it, how
/// many took it, how many ban or rest it now, and the latest records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SitesTaught {
    /// Sites with a record of it.
    pub sites: i64,
    /// Of those, sites where a use through it worked.
    pub worked: i64,
    /// Of those, sites that refused it at least once.
    pub blocked: i64,
    /// Of those, sites that ban or rest it now.
    pub banned_now: i64,
    /// The [`SITES_SHOWN`] most recently changed records.
    pub latest: Vec<SiteRecord>,
}

/// One page of the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BrowsePage {
    /// The rows, in the order asked for.
    pub proxies: Vec<ProxyRecord>,
    /// What sites taught about them, by id (none for a proxy no site
    /// knows).
    pub sites: HashMap<i64, SitesTaught>,
    /// The page after this one, when there are rows after it.
    pub next: Option<Cursor>,
    /// The page before this one, when there are rows before it.
    pub prev: Option<Cursor>,
    /// How many proxies match, counted up to [`MAX_COUNTED`].
    pub total: i64,
    /// True when more than [`MAX_COUNTED`] match.
    pub total_capped: bool,
}

/// Binds arguments for one backend: each returns the placeholder of the
/// value it took.
pub(super) trait Binder {
    fn int(&mut self, v: i64) -> String;
    fn text(&mut self, v: String) -> String;
}

/// The address as shown (`scheme://host:port`, an IPv6 host in brackets),
/// over `proxies p`, in SQL both backends read alike.
const ADDRESS: &str = "(p.scheme || '://' || CASE WHEN p.host LIKE '%:%' THEN '[' || p.host || ']' \
                       ELSE p.host END || ':' || p.port)";

impl Browse {
    /// The search's condition (`None` without a search).
    pub(super) fn search_sql(&self, b: &mut dyn Binder) -> Option<String> {
        let s = self.search.as_ref()?;
        let pattern = b.text(s.pattern());
        let mut sql = format!("({ADDRESS} LIKE {pattern} ESCAPE '\\'");
        if let Some(c) = s.country {
            let c = b.text(c.to_string());
            sql.push_str(&format!(" OR p.country = {c}"));
        }
        sql.push(')');
        Some(sql)
    }

    /// The condition that keeps the rows on the page's side of `from`
    /// (`None` on the first page), and the `ORDER BY` that reads the page
    /// from `from` outwards: backwards for the previous page, whose rows
    /// the caller turns round.
    pub(super) fn keyset_sql(&self, b: &mut dyn Binder) -> (Option<String>, String) {
        let reverse = self.from.is_some() && self.before;
        let order = match self.sort.column() {
            None if reverse => "p.id DESC".to_owned(),
            None => "p.id".to_owned(),
            Some((col, desc)) => {
                let dir = if desc != reverse { "DESC" } else { "ASC" };
                let nulls = if reverse { "DESC" } else { "ASC" };
                let id = if reverse { "DESC" } else { "ASC" };
                format!("({col} IS NULL) {nulls}, {col} {dir}, p.id {id}")
            }
        };
        let Some(from) = self.from else {
            return (None, order);
        };
        let id = b.int(from.id);
        let past_id = if self.before { "<" } else { ">" };
        let cond = match (self.sort.column(), from.key) {
            (None, _) => format!("p.id {past_id} {id}"),
            (Some((col, desc)), Some(key)) => {
                let key = b.int(key);
                // Further along the order: larger, or smaller when it runs
                // downwards; the other way for the page before.
                let further = if desc != self.before { "<" } else { ">" };
                let same = format!(
                    "{col} IS NOT NULL AND ({col} {further} {key} OR ({col} = {key} AND p.id {past_id} {id}))"
                );
                if self.before {
                    format!("({same})")
                } else {
                    format!("(({same}) OR {col} IS NULL)")
                }
            }
            (Some((col, _)), None) => {
                if self.before {
                    format!("({col} IS NOT NULL OR p.id < {id})")
                } else {
                    format!("({col} IS NULL AND p.id > {id})")
                }
            }
        };
        (Some(cond), order)
    }

    /// The probe for a row beyond `nearest` (the page's row nearest to
    /// `from`) on the other side from the page: whether there is a page
    /// that way.
    pub(super) fn probe_back(&self, nearest: &ProxyRecord) -> Browse {
        Browse {
            from: Some(Cursor::at(self.sort, nearest)),
            before: !self.before,
            limit: 1,
            ..self.clone()
        }
    }
}

/// Puts a page together from the rows read past `from` (one more than the
/// limit when there are more) and whether there are rows on the other
/// side: rows read backwards are turned round.
pub(super) fn assemble(
    browse: &Browse,
    mut rows: Vec<ProxyRecord>,
    other_side: bool,
    sites: HashMap<i64, SitesTaught>,
    counted: i64,
) -> BrowsePage {
    let more = rows.len() > browse.limit;
    rows.truncate(browse.limit);
    let backwards = browse.from.is_some() && browse.before;
    if backwards {
        rows.reverse();
    }
    let (more_after, more_before) = if backwards {
        (other_side, more)
    } else {
        (more, other_side)
    };
    let sort = browse.sort;
    BrowsePage {
        next: rows
            .last()
            .filter(|_| more_after)
            .map(|r| Cursor::at(sort, r)),
        prev: rows
            .first()
            .filter(|_| more_before)
            .map(|r| Cursor::at(sort, r)),
        sites,
        proxies: rows,
        total: counted.min(MAX_COUNTED),
        total_capped: counted > MAX_COUNTED,
    }
}

/// Groups site records (each proxy's most recent first, with the counts
/// of its sites beside each) by proxy.
pub(super) fn group_sites(rows: Vec<(SiteRecord, [i64; 4])>) -> HashMap<i64, SitesTaught> {
    let mut out: HashMap<i64, SitesTaught> = HashMap::new();
    for (r, [sites, worked, blocked, banned_now]) in rows {
        let t = out.entry(r.proxy_id).or_insert_with(|| SitesTaught {
            sites,
            worked,
            blocked,
            banned_now,
            latest: Vec::new(),
        });
        if t.latest.len() < SITES_SHOWN {
            t.latest.push(r);
        }
    }
    out
}

/// The site records of these proxies, at most [`SITES_SHOWN`] each and
/// the counts of each one's sites, as one statement over `proxy_sites`
/// whose `WHERE` the backend gives (the page's ids); `?now` stands for
/// the time bans are judged at.
pub(super) fn sites_sql(ids_clause: &str, now: &str) -> String {
    format!(
        "SELECT site, proxy_id, worked, blocked, latency_ms, last_worked_at, last_blocked_at,
                banned_until, updated_at, n, n_worked, n_blocked, n_banned FROM (
           SELECT s.*,
                  row_number() OVER (PARTITION BY proxy_id ORDER BY updated_at DESC, site) AS rn,
                  count(*) OVER (PARTITION BY proxy_id) AS n,
                  sum(CASE WHEN worked > 0 THEN 1 ELSE 0 END) OVER (PARTITION BY proxy_id) AS n_worked,
                  sum(CASE WHEN blocked > 0 THEN 1 ELSE 0 END) OVER (PARTITION BY proxy_id) AS n_blocked,
                  sum(CASE WHEN banned_until > {now} THEN 1 ELSE 0 END)
                      OVER (PARTITION BY proxy_id) AS n_banned
           FROM proxy_sites s WHERE {ids_clause}) t
         WHERE rn <= {SITES_SHOWN} ORDER BY proxy_id, rn"
    )
}

impl Store {
    /// One page of the stored proxies (see [`Browse`]), with what sites
    /// taught about each: only the page's rows (and a count of the
    /// matches up to [`MAX_COUNTED`]) are read, however many are stored.
    pub async fn browse(&self, browse: Browse) -> Result<BrowsePage, StoreError> {
        let browse = Browse {
            limit: browse.limit.clamp(1, MAX_BROWSE_LIMIT),
            ..browse
        };
        dispatch!(self.browse(browse))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_and_foreign_text_is_no_cursor() {
        for c in [
            Cursor {
                sort: BrowseSort::Id,
                key: None,
                id: 7,
            },
            Cursor {
                sort: BrowseSort::Latency,
                key: Some(-3),
                id: 1,
            },
            Cursor {
                sort: BrowseSort::LastChecked,
                key: None,
                id: i64::MAX,
            },
        ] {
            assert_eq!(Cursor::parse(&c.to_string()), Some(c));
        }
        for bad in [
            "",
            "id",
            "id.-",
            "id.5.6",
            "speed.1.2",
            "latency.x.2",
            "latency.1.2.3",
            "latency.1.",
        ] {
            assert_eq!(Cursor::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_search_escapes_like_patterns_and_reads_country_codes() {
        let s = Search::new(" 10_0%\\ ").unwrap();
        assert_eq!(s.pattern(), "%10\\_0\\%\\\\%");
        assert_eq!(s.country, None);
        assert_eq!(Search::new("de").unwrap().country, Country::parse("DE"));
        assert_eq!(Search::new("  "), None);
    }
}
