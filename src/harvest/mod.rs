//! Harvesting: fetch every configured source with limits, parse what it
//! publishes (plain text, HTML table or JSON) into de-duplicated candidates,
//! and hand them to the store in one transaction per source.

pub mod fetch;
pub mod html;
pub mod json;
pub mod text;

mod run;

pub use run::{HarvestError, HarvestReport, SourceReport, harvest_all};

use std::collections::HashSet;
use std::net::IpAddr;

use crate::proxy::{Anonymity, Country, Credentials, Proxy, Scheme};

/// What a source says about entries that carry no scheme of their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceScheme {
    /// Every entry without a scheme is this scheme.
    Fixed(Scheme),
    /// The checker finds the scheme (http, then socks5, then socks4).
    Detect,
}

impl SourceScheme {
    /// Parses the config spelling: `http`, `socks4`, `socks5` or `detect`.
    pub fn parse(s: &str) -> Option<SourceScheme> {
        match s {
            "http" => Some(SourceScheme::Fixed(Scheme::Http)),
            "socks4" => Some(SourceScheme::Fixed(Scheme::Socks4)),
            "socks5" => Some(SourceScheme::Fixed(Scheme::Socks5)),
            "detect" => Some(SourceScheme::Detect),
            _ => None,
        }
    }
}

/// What a source told us about a proxy besides its address. Stored as the
/// source's hints; the checker's own findings take precedence when it has
/// them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Hints {
    /// The country the source claims.
    pub country: Option<Country>,
    /// The anonymity level the source claims.
    pub anonymity: Option<Anonymity>,
    /// Whether the source claims HTTPS (CONNECT) support.
    pub https: Option<bool>,
}

/// One proxy found in a source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The proxy's identity. For `detect` entries the scheme is `http`
    /// until the checker finds the real one.
    pub proxy: Proxy,
    /// True when the scheme is a placeholder for the checker to detect.
    pub detect: bool,
    /// What the source said about it.
    pub hints: Hints,
}

impl Candidate {
    /// Builds a candidate from parsed parts. `explicit` is the scheme the
    /// entry itself carried, if any; otherwise the source's default applies.
    pub fn new(
        host: IpAddr,
        port: u16,
        auth: Option<Credentials>,
        explicit: Option<Scheme>,
        default: SourceScheme,
        hints: Hints,
    ) -> Candidate {
        let (scheme, detect) = match (explicit, default) {
            (Some(s), _) => (s, false),
            (None, SourceScheme::Fixed(s)) => (s, false),
            (None, SourceScheme::Detect) => (Scheme::Http, true),
        };
        Candidate {
            proxy: Proxy {
                scheme,
                host,
                port,
                auth,
            },
            detect,
            hints,
        }
    }
}

/// The candidates of one source: de-duplicated by identity and bounded by
/// `max_per_source`, so that a hostile source cannot grow memory without
/// limit. Parsers push into it and stop when it is full.
#[derive(Debug)]
pub struct Candidates {
    items: Vec<Candidate>,
    seen: HashSet<(Scheme, IpAddr, u16, String)>,
    limit: usize,
    truncated: bool,
}

impl Candidates {
    /// An empty set that accepts at most `limit` distinct candidates.
    pub fn new(limit: usize) -> Candidates {
        Candidates {
            items: Vec::new(),
            seen: HashSet::new(),
            limit,
            truncated: false,
        }
    }

    /// Adds a candidate unless it is a duplicate. Returns `false` once the
    /// limit is reached (the candidate is dropped and the set marked
    /// truncated), telling the parser to stop.
    pub fn push(&mut self, c: Candidate) -> bool {
        let key = (
            c.proxy.scheme,
            c.proxy.host,
            c.proxy.port,
            c.proxy.username().to_owned(),
        );
        if self.seen.contains(&key) {
            return true;
        }
        if self.items.len() >= self.limit {
            self.truncated = true;
            return false;
        }
        self.seen.insert(key);
        self.items.push(c);
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
    pub fn items(&self) -> &[Candidate] {
        &self.items
    }

    /// Consumes the set, returning the kept candidates.
    pub fn into_vec(self) -> Vec<Candidate> {
        self.items
    }
}
