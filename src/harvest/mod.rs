//! Harvesting: fetch every configured source with limits, parse what it
//! publishes (plain text, HTML table or JSON) into de-duplicated candidates,
//! and hand them to the store in one transaction per source.

pub mod addresses;
mod annotations;
pub mod countries;
pub mod fetch;
pub mod gzip;
pub mod html;
pub mod json;
pub mod pattern;
pub mod text;

mod run;

pub use addresses::AddressPolicy;
pub use run::{
    HarvestError, HarvestReport, Progress, SourceReport, harvest_all, harvest_all_reporting,
    harvest_all_with,
};

use std::collections::HashSet;
use std::net::IpAddr;
use std::sync::Arc;

use crate::model::{Candidate, CandidateList, Hints, SourceScheme};
use crate::proxy::{Country, Scheme, usable_ip};

/// Reads an HTTPS-support flag as lists write it: `yes`/`no`, `true`/`false`,
/// `+`/`-`, `1`/`0` (any case, blanks ignored). Anything else is `None`, so
/// an unknown spelling leaves the hint unset rather than claiming `false`.
pub fn parse_https_word(s: &str) -> Option<bool> {
    let w = s.trim();
    let eq = |x: &str| w.eq_ignore_ascii_case(x);
    if eq("yes") || eq("y") || eq("true") || eq("+") || eq("1") {
        Some(true)
    } else if eq("no") || eq("n") || eq("false") || eq("-") || eq("0") {
        Some(false)
    } else {
        None
    }
}

/// A country hint as lists write it: two letters, except the codes lists use
/// for "unknown" (`ZZ`, `XX`). `--`, blanks and names are `None` as well, so
/// a hint that means "we do not know" is never stored as a country.
pub fn country_hint(s: &str) -> Option<Country> {
    Country::parse(s).filter(|c| !matches!(c.as_str(), "ZZ" | "XX"))
}

/// The candidates of one source: de-duplicated by identity and bounded by
/// `max_per_source`, so that a hostile source cannot grow memory without
/// limit. Parsers push into it and stop when it is full.
#[derive(Debug)]
pub struct Candidates {
    /// Kept compactly: a list of millions of entries stays small.
    items: CandidateList,
    /// Identities of IPv4 candidates without credentials (nearly all of
    /// them), packed into a `u64`. On multi-megabyte lists this set, not the
    /// scanning, bounds parser throughput: packed keys make its table a
    /// sixth of the size of one holding `(Scheme, IpAddr, u16, String)`, and
    /// foldhash (randomly seeded per set, so a source cannot choose
    /// colliding entries) costs a fraction of SipHash.
    packed: HashSet<u64, foldhash::fast::RandomState>,
    /// Every other identity: IPv6 hosts and candidates with a username.
    other: HashSet<(Scheme, IpAddr, u16, String)>,
    limit: usize,
    truncated: bool,
    /// Which addresses are kept; `None` keeps every one (parser tests,
    /// lists given by hand).
    policy: Option<Arc<AddressPolicy>>,
    /// Entries dropped for their address: by `policy`, and those no proxy
    /// can listen on.
    private: usize,
    /// Of `private`, the entries no proxy can listen on (`0.0.0.0`,
    /// broadcast, multicast), dropped whatever the policy.
    unusable: usize,
}

impl Candidates {
    /// An empty set that accepts at most `limit` distinct candidates.
    pub fn new(limit: usize) -> Candidates {
        Candidates {
            items: CandidateList::new(),
            packed: HashSet::with_hasher(foldhash::fast::RandomState::default()),
            other: HashSet::new(),
            limit,
            truncated: false,
            policy: None,
            private: 0,
            unusable: 0,
        }
    }

    /// An empty set that accepts at most `limit` distinct candidates whose
    /// address `policy` keeps; the others are counted (see
    /// [`Candidates::private`]) and take no room.
    pub fn with_policy(limit: usize, policy: Arc<AddressPolicy>) -> Candidates {
        Candidates {
            policy: Some(policy),
            ..Candidates::new(limit)
        }
    }

    /// Entries dropped because of their address: private, the daemon's
    /// own, or one no proxy can listen on (each entry as often as the
    /// source lists it).
    pub fn private(&self) -> usize {
        self.private
    }

    /// Of [`Candidates::private`], the entries on an address no proxy can
    /// listen on (`0.0.0.0`, `255.255.255.255`, multicast), which no key
    /// keeps.
    pub fn unusable(&self) -> usize {
        self.unusable
    }

    /// Adds a candidate unless it is a duplicate. Returns `false` once the
    /// limit is reached (the candidate is dropped and the set marked
    /// truncated), telling the parser to stop.
    pub fn push(&mut self, c: Candidate) -> bool {
        if !usable_ip(c.proxy.host) {
            self.private += 1;
            self.unusable += 1;
            return true;
        }
        if let Some(policy) = &self.policy
            && policy.refuses(c.proxy.host, c.proxy.port).is_some()
        {
            self.private += 1;
            return true;
        }
        let packed = CandidateList::packed_key(&c);
        let p = &c.proxy;
        // One probe per candidate in the common case: check for a
        // duplicate separately only once the set is full.
        if self.items.len() >= self.limit {
            let seen = match packed {
                Some(k) => self.packed.contains(&k),
                None => self
                    .other
                    .contains(&(p.scheme, p.host, p.port, p.username().to_owned())),
            };
            if !seen {
                self.truncated = true;
            }
            return seen;
        }
        let fresh = match packed {
            Some(k) => self.packed.insert(k),
            None => self
                .other
                .insert((p.scheme, p.host, p.port, p.username().to_owned())),
        };
        if fresh {
            self.items.push(c);
        }
        true
    }

    /// True when no more candidates are accepted.
    pub fn is_full(&self) -> bool {
        self.items.len() >= self.limit
    }

    /// How many distinct candidates were kept.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when nothing was kept.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// True when entries were dropped because of the limit.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The kept candidates, in the order they were found.
    pub fn items(&self) -> Vec<Candidate> {
        self.items.to_vec()
    }

    /// Consumes the set, returning the kept candidates in the order they
    /// were found.
    pub fn into_vec(self) -> Vec<Candidate> {
        self.items.to_vec()
    }

    /// Consumes the set, returning the kept candidates in their compact
    /// form (the de-duplication tables are freed).
    pub fn into_list(self) -> CandidateList {
        self.items
    }
}

/// The schemes a protocol cell or field names (`HTTP, SOCKS5`, `Socks4`, `HTTPS`),
/// each once, and whether it said HTTPS.
fn protocol_words(cell: &str) -> (Vec<Scheme>, bool) {
    let mut schemes = Vec::new();
    let mut https = false;
    for w in cell
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        if let Some(s) = Scheme::from_loose(w) {
            https |= w.eq_ignore_ascii_case("https");
            if !schemes.contains(&s) {
                schemes.push(s);
            }
        }
    }
    (schemes, https)
}

/// One candidate per scheme the source named; none named means the entry's
/// own scheme or the source default.
fn push_schemes(
    token: text::Token,
    schemes: &[Scheme],
    default: SourceScheme,
    hints: Hints,
    out: &mut Candidates,
) -> bool {
    if schemes.is_empty() {
        return out.push(token.into_candidate(default, hints));
    }
    for &scheme in schemes {
        let t = text::Token {
            scheme: Some(scheme),
            auth: token.auth.clone(),
            ..token
        };
        if !out.push(t.into_candidate(default, hints)) {
            return false;
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Credentials;
    use std::net::{IpAddr, Ipv4Addr};

    fn cand(scheme: Scheme, ip: [u8; 4], port: u16, user: Option<&str>) -> Candidate {
        let auth = user.map(|u| Credentials {
            username: u.to_owned(),
            password: String::new(),
        });
        Candidate::new(
            IpAddr::V4(Ipv4Addr::from(ip)),
            port,
            auth,
            Some(scheme),
            SourceScheme::Detect,
            Hints::default(),
        )
    }

    #[test]
    fn candidates_dedup_by_identity() {
        let mut out = Candidates::new(10);
        assert!(out.push(cand(Scheme::Http, [1, 2, 3, 4], 80, None)));
        assert!(out.push(cand(Scheme::Http, [1, 2, 3, 4], 80, None)));
        assert!(out.push(cand(Scheme::Socks5, [1, 2, 3, 4], 80, None)));
        assert!(out.push(cand(Scheme::Http, [1, 2, 3, 4], 81, None)));
        assert!(out.push(cand(Scheme::Http, [1, 2, 3, 4], 80, Some("u"))));
        assert!(out.push(cand(Scheme::Http, [1, 2, 3, 4], 80, Some("u"))));
        let v6 = Candidate::new(
            "2001:db8::1".parse().unwrap(),
            80,
            None,
            None,
            SourceScheme::Detect,
            Hints::default(),
        );
        assert!(out.push(v6.clone()));
        assert!(out.push(v6));
        assert_eq!(out.len(), 5);
        assert!(!out.truncated());
    }

    #[test]
    fn candidates_stop_at_the_limit_but_accept_duplicates() {
        let mut out = Candidates::new(2);
        assert!(out.push(cand(Scheme::Http, [1, 1, 1, 1], 80, None)));
        assert!(out.push(cand(Scheme::Http, [1, 1, 1, 1], 80, Some("u"))));
        assert!(out.is_full());
        assert!(out.push(cand(Scheme::Http, [1, 1, 1, 1], 80, None)));
        assert!(out.push(cand(Scheme::Http, [1, 1, 1, 1], 80, Some("u"))));
        assert!(!out.truncated());
        assert!(!out.push(cand(Scheme::Http, [2, 2, 2, 2], 80, None)));
        assert!(out.truncated());
        assert_eq!(out.len(), 2);
    }

    #[test]
    fn country_hints_that_mean_unknown_are_none() {
        assert_eq!(country_hint(" de "), Country::parse("DE"));
        for unknown in ["ZZ", "zz", "XX", "xx", "--", "", "  ", "Unknown", "?"] {
            assert_eq!(country_hint(unknown), None, "{unknown:?}");
        }
    }

    #[test]
    fn https_words() {
        for w in ["yes", "YES", " true ", "+", "1", "y"] {
            assert_eq!(parse_https_word(w), Some(true), "{w}");
        }
        for w in ["no", "False", "-", "0", "n"] {
            assert_eq!(parse_https_word(w), Some(false), "{w}");
        }
        for w in ["", "?", "maybe", "2"] {
            assert_eq!(parse_https_word(w), None, "{w}");
        }
    }

    #[test]
    fn protocol_lists() {
        assert_eq!(
            protocol_words("HTTP, SOCKS5"),
            (vec![Scheme::Http, Scheme::Socks5], false)
        );
        assert_eq!(protocol_words("http/https"), (vec![Scheme::Http], true));
        assert_eq!(
            protocol_words("socks4a socks4"),
            (vec![Scheme::Socks4], false)
        );
        assert_eq!(protocol_words("unknown"), (vec![], false));
    }
}
