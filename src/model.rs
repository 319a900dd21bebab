//! The shared vocabulary of the layers above: what a source says about a
//! proxy (candidates and their hints), what a check found (outcomes and the
//! closed set of failure reasons), how a use of a proxy ended (the use
//! verdict), when proxies are checked again, and how proxies are picked. Plain data: no I/O and no knowledge of any layer.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use serde::Serialize;

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

/// A list of candidates kept compactly: an IPv4 candidate without
/// credentials (nearly every entry of a public list) takes 16 bytes instead
/// of a full [`Candidate`]'s ~80, so a source listing millions of proxies
/// fits in a small machine's memory. Other candidates are kept whole.
#[derive(Clone, Debug, Default)]
pub struct CandidateList {
    packed: Vec<Packed>,
    /// Every other candidate, with its position in the whole list.
    other: Vec<(usize, Candidate)>,
}

/// An IPv4 candidate without credentials.
#[derive(Clone, Copy, Debug)]
struct Packed {
    /// [`CandidateList::packed_key`] of its identity.
    key: u64,
    detect: bool,
    hints: Hints,
}

impl CandidateList {
    /// An empty list.
    pub fn new() -> CandidateList {
        CandidateList::default()
    }

    /// The identity of an IPv4 candidate without credentials as one
    /// number (scheme, address and port), `None` for any other candidate.
    pub fn packed_key(c: &Candidate) -> Option<u64> {
        match c.proxy.host {
            IpAddr::V4(v4) if c.proxy.auth.is_none() => {
                let scheme: u64 = match c.proxy.scheme {
                    Scheme::Http => 1,
                    Scheme::Socks4 => 2,
                    Scheme::Socks5 => 3,
                };
                Some(scheme << 48 | u64::from(u32::from(v4)) << 16 | u64::from(c.proxy.port))
            }
            _ => None,
        }
    }

    /// Appends a candidate (duplicates are the caller's concern).
    pub fn push(&mut self, c: Candidate) {
        match CandidateList::packed_key(&c) {
            Some(key) => self.packed.push(Packed {
                key,
                detect: c.detect,
                hints: c.hints,
            }),
            None => self.other.push((self.len(), c)),
        }
    }

    /// How many candidates the list holds.
    pub fn len(&self) -> usize {
        self.packed.len() + self.other.len()
    }

    /// True when the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Orders the list by identity as text: scheme name, then the address
    /// as it is written (`10.0.0.1` before `9.0.0.1`), then port and user
    /// name. That is the order of an index over those texts (the store's),
    /// so writing a list in this order walks such an index from one end to
    /// the other instead of jumping about in it.
    pub fn sort_by_identity_text(&mut self) {
        self.packed.sort_unstable_by_key(|p| text_order(p.key));
        self.other.sort_by_cached_key(|(_, c)| {
            (
                c.proxy.scheme,
                c.proxy.host.to_string(),
                c.proxy.port,
                c.proxy.username().to_owned(),
            )
        });
        let first = self.packed.len();
        for (i, (pos, _)) in self.other.iter_mut().enumerate() {
            *pos = first + i;
        }
    }

    /// The candidates in list order.
    pub fn iter(&self) -> impl Iterator<Item = Candidate> + '_ {
        let mut packed = self.packed.iter();
        let mut other = self.other.iter().peekable();
        (0..self.len()).filter_map(move |i| match other.peek() {
            Some((pos, _)) if *pos == i => other.next().map(|(_, c)| c.clone()),
            _ => packed.next().map(|p| p.unpack()),
        })
    }

    /// The candidates in list order, as full values.
    pub fn to_vec(&self) -> Vec<Candidate> {
        self.iter().collect()
    }
}

impl From<Vec<Candidate>> for CandidateList {
    fn from(v: Vec<Candidate>) -> CandidateList {
        let mut list = CandidateList::new();
        for c in v {
            list.push(c);
        }
        list
    }
}

impl Packed {
    fn unpack(&self) -> Candidate {
        let scheme = match self.key >> 48 {
            1 => Scheme::Http,
            2 => Scheme::Socks4,
            _ => Scheme::Socks5,
        };
        Candidate {
            proxy: Proxy {
                scheme,
                host: IpAddr::V4(std::net::Ipv4Addr::from((self.key >> 16) as u32)),
                port: self.key as u16,
                auth: None,
            },
            detect: self.detect,
            hints: self.hints,
        }
    }
}

/// Where each octet's decimal text falls among all 256 such texts
/// ("0" < "1" < "10" < "100" < … < "99"). Dotted addresses compare as text
/// octet by octet (a `.` or the end sorts before any digit), so replacing
/// each octet by its rank gives a number that sorts as the text does.
const OCTET_TEXT_RANK: [u8; 256] = {
    const fn digits(n: usize) -> ([u8; 3], usize) {
        if n >= 100 {
            (
                [
                    b'0' + (n / 100) as u8,
                    b'0' + (n / 10 % 10) as u8,
                    b'0' + (n % 10) as u8,
                ],
                3,
            )
        } else if n >= 10 {
            ([b'0' + (n / 10) as u8, b'0' + (n % 10) as u8, 0], 2)
        } else {
            ([b'0' + n as u8, 0, 0], 1)
        }
    }
    const fn less(a: usize, b: usize) -> bool {
        let (da, la) = digits(a);
        let (db, lb) = digits(b);
        let mut i = 0;
        while i < la && i < lb {
            if da[i] != db[i] {
                return da[i] < db[i];
            }
            i += 1;
        }
        la < lb
    }
    let mut rank = [0u8; 256];
    let mut a = 0;
    while a < 256 {
        let mut below = 0;
        let mut b = 0;
        while b < 256 {
            if less(b, a) {
                below += 1;
            }
            b += 1;
        }
        rank[a] = below as u8;
        a += 1;
    }
    rank
};

/// A packed key reordered so that its number order is its text order.
fn text_order(key: u64) -> u64 {
    let ip = (key >> 16) as u32;
    let ranked = ip.to_be_bytes().map(|o| OCTET_TEXT_RANK[usize::from(o)]);
    key & !(0xffff_ffff << 16) | u64::from(u32::from_be_bytes(ranked)) << 16
}

/// Why a check failed: a closed set, stored and counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The proxy's port refused the connection.
    Refused,
    /// No connection within the connect timeout.
    ConnectTimeout,
    /// Connected, but no complete answer within the total timeout.
    Timeout,
    /// The connection was reset or closed mid-exchange.
    Reset,
    /// The proxy wants credentials we do not have (407).
    ProxyAuthRequired,
    /// A non-2xx answer (or a SOCKS failure reply).
    BadStatus,
    /// A 2xx answer that is not the judge's (ads, portals, caches).
    ContentMismatch,
    /// Not HTTP or SOCKS as spoken.
    ProtocolError,
    /// The TLS handshake through the tunnel failed.
    TlsError,
    /// No route to the proxy (network or host unreachable).
    Unreachable,
}

impl Reason {
    /// Every reason, for counters and metrics.
    pub const ALL: [Reason; 10] = [
        Reason::Refused,
        Reason::ConnectTimeout,
        Reason::Timeout,
        Reason::Reset,
        Reason::ProxyAuthRequired,
        Reason::BadStatus,
        Reason::ContentMismatch,
        Reason::ProtocolError,
        Reason::TlsError,
        Reason::Unreachable,
    ];

    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Refused => "refused",
            Reason::ConnectTimeout => "connect_timeout",
            Reason::Timeout => "timeout",
            Reason::Reset => "reset",
            Reason::ProxyAuthRequired => "proxy_auth_required",
            Reason::BadStatus => "bad_status",
            Reason::ContentMismatch => "content_mismatch",
            Reason::ProtocolError => "protocol_error",
            Reason::TlsError => "tls_error",
            Reason::Unreachable => "unreachable",
        }
    }

    /// True when the proxy could not even be reached: trying other
    /// schemes or a CONNECT on the same address is pointless.
    pub fn unreachable(self) -> bool {
        matches!(
            self,
            Reason::Refused | Reason::ConnectTimeout | Reason::Unreachable
        )
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one check found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// `None` when alive, else why not.
    pub failure: Option<Reason>,
    /// Latency of the passing request.
    pub latency: Option<Duration>,
    /// How anonymous the proxy is (alive only).
    pub anonymity: Option<Anonymity>,
    /// Whether HTTPS through the proxy works (`None` when not tested).
    pub https: Option<bool>,
    /// The address the judge saw.
    pub exit_ip: Option<IpAddr>,
    /// GeoIP country of the exit address (or the proxy's own address).
    pub country: Option<Country>,
    /// The scheme found by detection, for `detect` entries.
    pub detected: Option<Scheme>,
}

impl Outcome {
    /// A failed check: only the reason is known.
    pub fn dead(reason: Reason) -> Outcome {
        Outcome {
            failure: Some(reason),
            latency: None,
            anonymity: None,
            https: None,
            exit_ip: None,
            country: None,
            detected: None,
        }
    }

    /// True when the proxy passed.
    pub fn alive(&self) -> bool {
        self.failure.is_none()
    }
}

/// How one use of a proxy ended: the one verdict the pool, the crawler,
/// the gateway, `verify=true` and a client's report all give, and the
/// feedback path acts on. What a layer needs besides (the page, the URL,
/// a `Retry-After`, the latency) travels beside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UseVerdict {
    /// It carried the request (or opened the tunnel).
    Worked,
    /// The proxy itself failed (refused, timed out, 407, a portal page, a
    /// bad tunnel…), with the reason when it is known: it stops being
    /// served at once and is checked again soon.
    ProxyFailed(Option<Reason>),
    /// The target site refused this proxy: only the (proxy, site) pair
    /// cools down, by the kind of refusal.
    Blocked(Block),
    /// The target failed on its own (a 5xx it sends itself): not the
    /// proxy's fault.
    TargetError,
    /// The proxy works but would not or could not reach the target (a
    /// refused CONNECT, a SOCKS failure reply): the target's fault once
    /// other proxies agree, no one's before.
    Unreached,
}

/// How a site refused a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block {
    /// A rate limit (429, or 503 without a ban page): a busy address, not
    /// a refusal; the pair rests for the `Retry-After`.
    RateLimited,
    /// A bare refusal (403): maybe the page's, maybe the proxy's; the pair
    /// rests a while.
    Refused,
    /// A captcha or ban page: the pair is banned.
    Banned,
}

impl UseVerdict {
    /// The proxy failed for `reason`.
    pub fn failed(reason: Reason) -> UseVerdict {
        UseVerdict::ProxyFailed(Some(reason))
    }
}

/// When proxies are checked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecheckPolicy {
    /// After a pass, less a random part of [`alive_jitter`](Self::alive_jitter).
    pub alive: Duration,
    /// The most a pass's next check comes before `alive`: proxies checked
    /// together drift apart, so checks do not come in waves.
    pub alive_jitter: Duration,
    /// After the first failure; doubles with each consecutive failure.
    pub dead: Duration,
    /// The longest wait after failures.
    pub dead_max: Duration,
}

/// How a proxy is picked for a request, by the pool and everything built on
/// it (the gateway's `strategy`, a crawl's `--strategy`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyKind {
    /// Every usable proxy in turn, by id.
    RoundRobin,
    /// Any usable proxy, uniformly.
    Random,
    /// The usable proxy with the fewest requests in flight, then the
    /// fewest uses.
    LeastUsed,
    /// Two usable proxies drawn at random (independently, so the same one
    /// may come twice), the better of them: one that worked at the site
    /// beats one that did not, then recent success and latency decide.
    /// Load spreads over every usable proxy while good ones are favoured.
    #[default]
    FastestOfTwo,
}

impl StrategyKind {
    /// Every strategy, in the order help texts name them.
    pub const ALL: [StrategyKind; 4] = [
        StrategyKind::RoundRobin,
        StrategyKind::Random,
        StrategyKind::LeastUsed,
        StrategyKind::FastestOfTwo,
    ];

    /// The spelling configs, the API and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            StrategyKind::RoundRobin => "round-robin",
            StrategyKind::Random => "random",
            StrategyKind::LeastUsed => "least-used",
            StrategyKind::FastestOfTwo => "fastest-of-two",
        }
    }
}

impl std::str::FromStr for StrategyKind {
    type Err = String;

    fn from_str(s: &str) -> Result<StrategyKind, String> {
        by_name(&StrategyKind::ALL, StrategyKind::as_str, s)
    }
}

/// Which hosts a crawl may leave its seeds for.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum ScopeKind {
    /// The seeds' hosts (and ports) only.
    #[default]
    SameHost,
    /// The seeds' registrable domains (`shop.example.co.uk` and
    /// `www.example.co.uk` are one site), by the public suffix list.
    SameSite,
    /// Any http(s) URL.
    Any,
}

impl ScopeKind {
    /// Every scope, narrowest first.
    pub const ALL: [ScopeKind; 3] = [ScopeKind::SameHost, ScopeKind::SameSite, ScopeKind::Any];

    /// The spelling the API and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeKind::SameHost => "same-host",
            ScopeKind::SameSite => "same-site",
            ScopeKind::Any => "any",
        }
    }
}

impl std::str::FromStr for ScopeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<ScopeKind, String> {
        by_name(&ScopeKind::ALL, ScopeKind::as_str, s)
    }
}

/// The one of `all` that `name` spells `s`; else "expected a, b or c,
/// found \"s\"".
fn by_name<K: Copy>(all: &[K], name: fn(K) -> &'static str, s: &str) -> Result<K, String> {
    if let Some(k) = all.iter().copied().find(|k| name(*k) == s) {
        return Ok(k);
    }
    let names: Vec<&str> = all.iter().map(|k| name(*k)).collect();
    let list = match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => (*last).to_owned(),
        None => String::new(),
    };
    Err(format!("expected {list}, found {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `scheme://[user:pass@]host:port`, any address (the list does not
    /// judge which addresses are worth storing).
    fn cand(s: &str) -> Candidate {
        let (scheme, rest) = s.split_once("://").unwrap();
        let (auth, addr) = match rest.split_once('@') {
            Some((a, addr)) => {
                let (u, p) = a.split_once(':').unwrap();
                let auth = Credentials {
                    username: u.into(),
                    password: p.into(),
                };
                (Some(auth), addr)
            }
            None => (None, rest),
        };
        let addr: std::net::SocketAddr = addr.parse().unwrap();
        Candidate::new(
            addr.ip(),
            addr.port(),
            auth,
            Some(scheme.parse().unwrap()),
            SourceScheme::Detect,
            Hints::default(),
        )
    }

    #[test]
    fn a_list_gives_back_what_was_pushed_in_order() {
        let mut items = vec![
            cand("http://1.2.3.4:80"),
            cand("socks5://[2001:db8::1]:1080"),
            cand("socks4://10.0.0.1:1080"),
            cand("http://u:p@1.2.3.4:80"),
            cand("socks5://255.255.255.255:65535"),
        ];
        items[0].detect = true;
        items[2].hints.country = Country::parse("DE");
        items[2].hints.anonymity = Some(Anonymity::Elite);
        items[4].hints.https = Some(false);
        assert!(
            items[3].proxy.auth
                == Some(Credentials {
                    username: "u".into(),
                    password: "p".into()
                })
        );
        let list = CandidateList::from(items.clone());
        assert_eq!(list.len(), 5);
        assert_eq!(list.to_vec(), items);
    }

    #[test]
    fn identity_text_order_is_the_order_of_the_texts() {
        let mut rng_state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng_state ^= rng_state << 13;
            rng_state ^= rng_state >> 7;
            rng_state ^= rng_state << 17;
            rng_state
        };
        let schemes = ["http", "socks4", "socks5"];
        let mut items: Vec<Candidate> = (0..2_000)
            .map(|_| {
                let r = next();
                // Small octets too, where "9" and "10" and "100" meet.
                let octet =
                    |shift: u32| (r >> shift) as u8 % if r >> 60 & 1 == 0 { 12 } else { 255 };
                let ip = format!("{}.{}.{}.{}", octet(0), octet(8), octet(16), octet(24));
                cand(&format!(
                    "{}://{ip}:{}",
                    schemes[(r >> 32) as usize % 3],
                    (r >> 40) as u16 % 3 + 1
                ))
            })
            .collect();
        items.push(cand("http://[2001:db8::1]:8080"));
        items.push(cand("http://a:b@1.1.1.1:8080"));
        let mut list = CandidateList::from(items.clone());
        list.sort_by_identity_text();
        let key = |c: &Candidate| {
            (
                c.proxy.scheme.as_str().to_owned(),
                c.proxy.host.to_string(),
                c.proxy.port,
            )
        };
        let got: Vec<_> = list
            .iter()
            .filter(|c| c.proxy.auth.is_none() && c.proxy.host.is_ipv4())
            .map(|c| key(&c))
            .collect();
        let mut want: Vec<_> = items
            .iter()
            .filter(|c| c.proxy.auth.is_none() && c.proxy.host.is_ipv4())
            .map(key)
            .collect();
        want.sort();
        assert_eq!(got, want);
        assert_eq!(list.len(), items.len());
    }

    #[test]
    fn kinds_read_back_as_written_and_name_the_choices() {
        for k in StrategyKind::ALL {
            assert_eq!(k.as_str().parse::<StrategyKind>(), Ok(k));
        }
        for k in ScopeKind::ALL {
            assert_eq!(k.as_str().parse::<ScopeKind>(), Ok(k));
        }
        assert_eq!(
            "fastest".parse::<StrategyKind>(),
            Err(
                "expected round-robin, random, least-used or fastest-of-two, found \"fastest\""
                    .into()
            )
        );
        assert_eq!(
            "site".parse::<ScopeKind>(),
            Err("expected same-host, same-site or any, found \"site\"".into())
        );
    }
}
