//! The shared vocabulary of the layers above: what a source says about a
//! proxy (candidates and their hints), what a check or a use of a proxy
//! found (outcomes and the closed set of failure reasons), and when proxies
//! are checked again. Plain data: no I/O and no knowledge of any layer.

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

/// When proxies are checked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecheckPolicy {
    /// After a pass.
    pub alive: Duration,
    /// After the first failure; doubles with each consecutive failure.
    pub dead: Duration,
    /// The longest wait after failures.
    pub dead_max: Duration,
}
