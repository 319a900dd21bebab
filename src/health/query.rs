//! What a client asks of the proxies it is served: the filters shared by
//! the API, exports, the pool and the gateway.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use crate::proxy::{Anonymity, Country, Scheme, Status};
use crate::store::{ProxyFilter, ProxyRecord};

/// Filters on servable proxies. Empty lists mean "any".
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProxyQuery {
    /// Any of these countries (empty: any).
    pub countries: Vec<Country>,
    /// Any of these schemes (empty: any).
    pub schemes: Vec<Scheme>,
    /// At least this anonymous.
    pub min_anonymity: Option<Anonymity>,
    /// Only proxies that tunnel HTTPS.
    pub https: bool,
    /// Only proxies at most this slow.
    pub max_latency_ms: Option<i64>,
    /// Only proxies whose last passed check is at most this old.
    pub max_age: Option<Duration>,
    /// Proxy ids to leave out.
    pub exclude_ids: HashSet<i64>,
    /// Proxy addresses to leave out.
    pub exclude_addrs: HashSet<SocketAddr>,
}

impl ProxyQuery {
    /// True when `r` is alive, fresh enough at `now` (unix ms) and
    /// satisfies every other filter.
    pub fn matches(&self, r: &ProxyRecord, now: i64) -> bool {
        self.matches_proven(r, r.last_alive, now)
    }

    /// [`matches`](Self::matches) for an indexed proxy, whose uses that
    /// worked count as passed checks for the freshness bound.
    pub fn matches_entry(&self, e: &super::Entry, now: i64) -> bool {
        self.matches_proven(e, e.proven_at(), now)
    }

    /// The filters, with `proven` (unix ms) as when `r` last proved to work.
    fn matches_proven(&self, r: &ProxyRecord, proven: Option<i64>, now: i64) -> bool {
        if r.status != Status::Alive {
            return false;
        }
        if let Some(age) = self.max_age {
            let fresh_since = now - i64::try_from(age.as_millis()).unwrap_or(i64::MAX);
            if proven.is_none_or(|t| t < fresh_since) {
                return false;
            }
        }
        self.matches_fields(r)
    }

    /// The same filters for a store listing of proxies of `status` (any
    /// when `None`) at `now` (unix ms).
    pub fn to_filter(&self, status: Option<Status>, now: i64) -> ProxyFilter {
        ProxyFilter {
            status,
            countries: self.countries.clone(),
            schemes: self.schemes.clone(),
            min_anonymity: self.min_anonymity,
            https: self.https,
            max_latency_ms: self.max_latency_ms,
            alive_since: self
                .max_age
                .map(|age| now - i64::try_from(age.as_millis()).unwrap_or(i64::MAX)),
            exclude_ids: self.exclude_ids.iter().copied().collect(),
            exclude_addrs: self.exclude_addrs.iter().copied().collect(),
        }
    }

    /// The filters that do not depend on status or time.
    pub fn matches_fields(&self, r: &ProxyRecord) -> bool {
        if !self.schemes.is_empty() && !self.schemes.contains(&r.proxy.scheme) {
            return false;
        }
        if !self.countries.is_empty() && !r.country.is_some_and(|c| self.countries.contains(&c)) {
            return false;
        }
        if let Some(min) = self.min_anonymity
            && r.anonymity.is_none_or(|a| a < min)
        {
            return false;
        }
        if self.https && r.https != Some(true) {
            return false;
        }
        if let Some(max) = self.max_latency_ms
            && r.latency_ms.is_none_or(|l| l > max)
        {
            return false;
        }
        if self.exclude_ids.contains(&r.id)
            || self
                .exclude_addrs
                .contains(&SocketAddr::new(r.proxy.host, r.proxy.port))
        {
            return false;
        }
        true
    }
}
