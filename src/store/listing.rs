//! What the store lists: proxies by filter (whole or paged), sources, and
//! the counts for `stats`.

use std::net::SocketAddr;

use super::{Presence, ProxyRecord, SourceRecord, Stats, Store, StoreError, dispatch};
use crate::proxy::{Anonymity, Country, Scheme, Status};

/// Which proxies a listing returns. Empty lists and `None` mean "any".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyFilter {
    /// `None` for every status.
    pub status: Option<Status>,
    /// Any of these countries.
    pub countries: Vec<Country>,
    /// Any of these schemes.
    pub schemes: Vec<Scheme>,
    /// At least this anonymous.
    pub min_anonymity: Option<Anonymity>,
    /// Only proxies that passed the HTTPS test.
    pub https: bool,
    /// Only proxies whose last passed check took at most this long.
    pub max_latency_ms: Option<i64>,
    /// Only proxies that last passed a check at or after this time (unix ms).
    pub alive_since: Option<i64>,
    /// Leave these ids out.
    pub exclude_ids: Vec<i64>,
    /// Leave these addresses out.
    pub exclude_addrs: Vec<SocketAddr>,
}

/// The order of a listing page; ties go by id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProxySort {
    /// By id.
    #[default]
    Id,
    /// Fastest last passed check first; never passed last.
    Latency,
    /// Most recently checked first; never checked last.
    LastChecked,
    /// Highest share of passed checks first.
    Uptime,
}

/// One page of a listing.
#[derive(Clone, Debug, PartialEq)]
pub struct Page {
    /// How many proxies match in all.
    pub total: i64,
    /// The proxies of this page.
    pub proxies: Vec<ProxyRecord>,
}

impl ProxyFilter {
    /// The anonymity levels `min_anonymity` lets through, as stored (none
    /// when it is not set): both backends' `WHERE` clauses list them.
    pub(super) fn anonymity_levels(&self) -> Vec<String> {
        let Some(min) = self.min_anonymity else {
            return Vec::new();
        };
        [
            Anonymity::Transparent,
            Anonymity::Anonymous,
            Anonymity::Elite,
        ]
        .into_iter()
        .filter(|a| *a >= min)
        .map(|a| a.as_str().to_owned())
        .collect()
    }
}

impl Store {
    /// Proxies matching `filter`, ordered by id.
    pub async fn list_proxies(&self, filter: ProxyFilter) -> Result<Vec<ProxyRecord>, StoreError> {
        dispatch!(self.list_proxies(filter))
    }

    /// Up to `limit` proxies matching `filter` whose id is above `after`,
    /// ordered by id: a listing read a page at a time (each page from the
    /// id index, whatever the size of the table), so that an export of
    /// every stored proxy never holds them all.
    pub async fn list_proxies_after(
        &self,
        filter: ProxyFilter,
        after: i64,
        limit: usize,
    ) -> Result<Vec<ProxyRecord>, StoreError> {
        dispatch!(self.list_proxies_after(filter, after, limit))
    }

    /// One page of the proxies matching `filter`, in `sort` order: only the
    /// page is read, whatever the size of the table.
    pub async fn list_page(
        &self,
        filter: ProxyFilter,
        sort: ProxySort,
        limit: usize,
        offset: usize,
    ) -> Result<Page, StoreError> {
        dispatch!(self.list_page(filter, sort, limit, offset))
    }

    /// The proxies with these ids (missing ids are skipped).
    pub async fn proxies_by_ids(&self, ids: Vec<i64>) -> Result<Vec<ProxyRecord>, StoreError> {
        dispatch!(self.proxies_by_ids(ids))
    }

    /// Proxy counts per (status, scheme), every combination included, from
    /// the counts every write keeps (no table scan).
    pub async fn count_by_status_scheme(&self) -> Result<Vec<(String, String, i64)>, StoreError> {
        dispatch!(self.count_by_status_scheme())
    }

    /// Whether any proxy is stored and any was checked, from index seeks
    /// (no count): it answers every `/proxy` while nothing is servable,
    /// whatever the number of proxies.
    pub async fn presence(&self) -> Result<Presence, StoreError> {
        dispatch!(self.presence())
    }

    /// Every source's record with its proxy counts, by name.
    pub async fn list_sources(&self) -> Result<Vec<SourceRecord>, StoreError> {
        dispatch!(self.list_sources())
    }

    /// Every source's record by name, without its proxy counts (zero): the
    /// last harvests a start-up needs, from the sources alone, without the
    /// pass over every link that counting takes (a million at scale).
    pub async fn source_runs(&self) -> Result<Vec<SourceRecord>, StoreError> {
        dispatch!(self.source_runs())
    }

    /// How many distinct proxies were listed at or after `since` (unix ms).
    pub async fn count_seen_since(&self, since: i64) -> Result<i64, StoreError> {
        dispatch!(self.count_seen_since(since))
    }

    /// Counts by status, scheme, country, failure reason and source.
    pub async fn stats(&self) -> Result<Stats, StoreError> {
        dispatch!(self.stats())
    }

    /// The counts of [`Store::stats`] without the sources: a read of a few
    /// rows kept up to date by every write, cheap enough for each API
    /// request whatever the number of proxies.
    pub async fn counts(&self) -> Result<Stats, StoreError> {
        dispatch!(self.counts())
    }
}
