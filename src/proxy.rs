//! Proxy identity and the small vocabulary every module shares: schemes,
//! anonymity levels, statuses and country codes, with their parsing from
//! the loose spellings that public lists use.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why a proxy, scheme, anonymity level or status did not parse. Messages
/// quote the input and say what was expected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not one of the scheme names.
    #[error("unknown scheme {0:?} (expected http, socks4 or socks5)")]
    UnknownScheme(String),
    /// Not one of the anonymity names.
    #[error("unknown anonymity {0:?} (expected transparent, anonymous or elite)")]
    UnknownAnonymity(String),
    /// Not one of the status names.
    #[error("unknown status {0:?} (expected alive, dead or unknown)")]
    UnknownStatus(String),
    /// A proxy URL without `scheme://`.
    #[error("{0:?} has no scheme (expected scheme://host:port)")]
    NoScheme(String),
    /// A proxy URL whose scheme is not a proxy scheme.
    #[error("{url:?} has unknown scheme {scheme:?}")]
    UrlScheme {
        /// The URL as given.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// `user:pass@` with an empty user.
    #[error("{0:?} has an empty username")]
    EmptyUsername(String),
    /// No `host:port` after the scheme.
    #[error("{0:?} is not scheme://host:port")]
    NotHostPort(String),
    /// A port that is not 1–65535.
    #[error("{0:?} has an invalid port")]
    BadPort(String),
    /// A host that is not a usable IP address.
    #[error("{0:?} has an invalid address")]
    BadAddress(String),
}

/// How a proxy is spoken to. `https` proxies in lists are plain HTTP proxies
/// that support CONNECT, so they map to [`Scheme::Http`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scheme {
    /// A plain HTTP forward proxy (may also tunnel with CONNECT).
    Http,
    /// SOCKS version 4 (and 4a).
    Socks4,
    /// SOCKS version 5.
    Socks5,
}

impl Scheme {
    /// Every scheme, in the order scheme detection tries them.
    pub const ALL: [Scheme; 3] = [Scheme::Http, Scheme::Socks5, Scheme::Socks4];

    /// The canonical lowercase name, as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Socks4 => "socks4",
            Scheme::Socks5 => "socks5",
        }
    }

    /// Maps a scheme or protocol word as lists spell it (`HTTPS`, `socks4a`,
    /// `socks5h`, `SOCKS5`, …) to a scheme. Returns `None` for anything else.
    pub fn from_loose(word: &str) -> Option<Scheme> {
        let w = word.trim();
        let eq = |s: &str| w.eq_ignore_ascii_case(s);
        if eq("http") || eq("https") {
            Some(Scheme::Http)
        } else if eq("socks4") || eq("socks4a") {
            Some(Scheme::Socks4)
        } else if eq("socks5") || eq("socks5h") || eq("socks") {
            Some(Scheme::Socks5)
        } else {
            None
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Scheme {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "http" => Ok(Scheme::Http),
            "socks4" => Ok(Scheme::Socks4),
            "socks5" => Ok(Scheme::Socks5),
            other => Err(ParseError::UnknownScheme(other.to_owned())),
        }
    }
}

/// How much a proxy reveals about its client, weakest first so that the
/// derived ordering reads as "at least this anonymous".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Anonymity {
    /// The client's own address reaches the target.
    Transparent,
    /// The address is hidden but the proxy announces itself.
    Anonymous,
    /// Neither the address nor the proxy is visible to the target.
    Elite,
}

impl Anonymity {
    /// The canonical lowercase name, as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Anonymity::Transparent => "transparent",
            Anonymity::Anonymous => "anonymous",
            Anonymity::Elite => "elite",
        }
    }

    /// Understands the words lists use: `elite proxy`, `High Anonymous`,
    /// `HIA`, `anm`, `noa`, `transparent`, `level1`, …
    pub fn from_loose(word: &str) -> Option<Anonymity> {
        let w = word.trim().to_ascii_lowercase();
        let w = w.as_str();
        if w.is_empty() {
            return None;
        }
        if w.contains("elite") || w.contains("high") || w == "hia" || w == "level1" || w == "l1" {
            Some(Anonymity::Elite)
        } else if w.contains("transparent")
            || w == "noa"
            || w == "none"
            || w == "low"
            || w == "level3"
            || w == "l3"
        {
            Some(Anonymity::Transparent)
        } else if w.contains("anonym") || w == "anm" || w == "medium" || w == "level2" || w == "l2"
        {
            Some(Anonymity::Anonymous)
        } else {
            None
        }
    }
}

impl fmt::Display for Anonymity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Anonymity {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "transparent" => Ok(Anonymity::Transparent),
            "anonymous" => Ok(Anonymity::Anonymous),
            "elite" => Ok(Anonymity::Elite),
            other => Err(ParseError::UnknownAnonymity(other.to_owned())),
        }
    }
}

/// What the last check said about a proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Never checked yet.
    Unknown,
    /// The last check passed.
    Alive,
    /// The last check failed.
    Dead,
}

impl Status {
    /// The canonical lowercase name, as stored and printed.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Alive => "alive",
            Status::Dead => "dead",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "unknown" => Ok(Status::Unknown),
            "alive" => Ok(Status::Alive),
            "dead" => Ok(Status::Dead),
            other => Err(ParseError::UnknownStatus(other.to_owned())),
        }
    }
}

/// An ISO 3166-1 alpha-2 country code, always upper case.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Country([u8; 2]);

impl Country {
    /// Accepts exactly two ASCII letters (any case, surrounding blanks
    /// ignored). Anything else, such as `Unknown` or `-`, is `None`.
    pub fn parse(s: &str) -> Option<Country> {
        let b = s.trim().as_bytes();
        if b.len() == 2 && b[0].is_ascii_alphabetic() && b[1].is_ascii_alphabetic() {
            Some(Country([
                b[0].to_ascii_uppercase(),
                b[1].to_ascii_uppercase(),
            ]))
        } else {
            None
        }
    }

    /// The two upper-case letters.
    pub fn as_str(&self) -> &str {
        // Both bytes are ASCII letters by construction.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }
}

impl fmt::Debug for Country {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Country({})", self.as_str())
    }
}

impl fmt::Display for Country {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Country {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// A proxy's identity: (scheme, host, port, username), plus the password
/// that goes with the username. Hosts are IP addresses: public lists publish
/// addresses, and an address is what a check connects to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Proxy {
    /// How to speak to the proxy.
    pub scheme: Scheme,
    /// The proxy's address.
    pub host: IpAddr,
    /// The proxy's port, never 0.
    pub port: u16,
    /// Credentials from the source, used when checking and serving.
    pub auth: Option<Credentials>,
}

/// A username and password for a proxy.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// The username, never empty.
    pub username: String,
    /// The password, possibly empty.
    pub password: String,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Proxy {
    /// The username, or `""` when there is none (the stored identity uses
    /// the empty string so that SQLite's UNIQUE constraint applies).
    pub fn username(&self) -> &str {
        self.auth.as_ref().map_or("", |a| a.username.as_str())
    }

    /// `host:port`, with IPv6 hosts in brackets.
    pub fn host_port(&self) -> String {
        match self.host {
            IpAddr::V4(ip) => format!("{ip}:{}", self.port),
            IpAddr::V6(ip) => format!("[{ip}]:{}", self.port),
        }
    }

    /// Parses `scheme://[user:pass@]host:port` (scheme required; `https`,
    /// `socks4a` and `socks5h` accepted as their base schemes).
    pub fn parse_url(s: &str) -> Result<Proxy, ParseError> {
        let s = s.trim();
        let (scheme_word, rest) = s
            .split_once("://")
            .ok_or_else(|| ParseError::NoScheme(s.to_owned()))?;
        let scheme = Scheme::from_loose(scheme_word).ok_or_else(|| ParseError::UrlScheme {
            url: s.to_owned(),
            scheme: scheme_word.to_owned(),
        })?;
        let rest = rest.trim_end_matches('/');
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((creds, hp)) => {
                let (u, p) = creds.split_once(':').unwrap_or((creds, ""));
                if u.is_empty() {
                    return Err(ParseError::EmptyUsername(s.to_owned()));
                }
                (
                    Some(Credentials {
                        username: percent_decode(u),
                        password: percent_decode(p),
                    }),
                    hp,
                )
            }
            None => (None, rest),
        };
        let (host, port) =
            split_host_port(hostport).ok_or_else(|| ParseError::NotHostPort(s.to_owned()))?;
        let port = parse_port(port).ok_or_else(|| ParseError::BadPort(s.to_owned()))?;
        let host = parse_host(host).ok_or_else(|| ParseError::BadAddress(s.to_owned()))?;
        Ok(Proxy {
            scheme,
            host,
            port,
            auth,
        })
    }
}

/// `scheme://[user:pass@]host:port`, the form exports and `/proxy?format=text`
/// hand out. Credentials are percent-encoded where needed.
impl fmt::Display for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if let Some(a) = &self.auth {
            write!(
                f,
                "{}:{}@",
                percent_encode(&a.username),
                percent_encode(&a.password)
            )?;
        }
        f.write_str(&self.host_port())
    }
}

/// Splits `host:port` or `[v6]:port`.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        Some((h, p))
    } else {
        s.rsplit_once(':')
    }
}

/// Parses a host the way lists write it: dotted IPv4 (leading zeros read as
/// decimal) or IPv6. Rejects addresses no proxy can have (unspecified,
/// broadcast, multicast).
pub fn parse_host(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    let ip = if s.contains(':') {
        IpAddr::V6(s.parse().ok()?)
    } else {
        IpAddr::V4(parse_ipv4_lenient(s.as_bytes())?.into())
    };
    usable_ip(ip).then_some(ip)
}

/// True for addresses a proxy could listen on.
pub fn usable_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !(v4.is_unspecified() || v4.is_broadcast() || v4.is_multicast()),
        IpAddr::V6(v6) => !(v6.is_unspecified() || v6.is_multicast()),
    }
}

/// Dotted-quad IPv4 with 1–3 decimal digits per octet, each at most 255.
/// Unlike `Ipv4Addr::from_str` it accepts leading zeros (`001.002.003.004`),
/// which some lists pad with, reading them as decimal.
pub fn parse_ipv4_lenient(b: &[u8]) -> Option<[u8; 4]> {
    let mut out = [0u8; 4];
    let mut part = 0usize;
    let mut digits = 0usize;
    let mut value: u32 = 0;
    for &c in b {
        match c {
            b'0'..=b'9' => {
                digits += 1;
                if digits > 3 {
                    return None;
                }
                value = value * 10 + u32::from(c - b'0');
            }
            b'.' => {
                if digits == 0 || part == 3 || value > 255 {
                    return None;
                }
                out[part] = value as u8;
                part += 1;
                digits = 0;
                value = 0;
            }
            _ => return None,
        }
    }
    if part != 3 || digits == 0 || value > 255 {
        return None;
    }
    out[3] = value as u8;
    Some(out)
}

/// A decimal port from 1 to 65535 (at most five digits, no sign).
pub fn parse_port(s: &str) -> Option<u16> {
    let s = s.trim();
    if s.is_empty() || s.len() > 5 || !s.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    match s.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Some(p as u16),
        _ => None,
    }
}

/// Decodes `%XX` escapes in credentials; invalid escapes are kept as they
/// are, and bytes that are not UTF-8 become U+FFFD.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// What `user:pass@host` keeps as it is: RFC 3986's unreserved characters.
const CREDENTIAL_KEEP: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Encodes the characters that would break `user:pass@host` apart.
fn percent_encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, CREDENTIAL_KEEP).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_lenient() {
        assert_eq!(parse_ipv4_lenient(b"1.2.3.4"), Some([1, 2, 3, 4]));
        assert_eq!(parse_ipv4_lenient(b"010.002.003.004"), Some([10, 2, 3, 4]));
        assert_eq!(parse_ipv4_lenient(b"999.1.1.1"), None);
        assert_eq!(parse_ipv4_lenient(b"1.2.3"), None);
        assert_eq!(parse_ipv4_lenient(b"1.2.3.4.5"), None);
        assert_eq!(parse_ipv4_lenient(b"1..3.4"), None);
        assert_eq!(parse_ipv4_lenient(b"1.2.3.4."), None);
        assert_eq!(parse_ipv4_lenient(b"1.2.3.0004"), None);
    }

    #[test]
    fn ports() {
        assert_eq!(parse_port("80"), Some(80));
        assert_eq!(parse_port("65535"), Some(65535));
        assert_eq!(parse_port("0"), None);
        assert_eq!(parse_port("65536"), None);
        assert_eq!(parse_port("+80"), None);
        assert_eq!(parse_port("123456"), None);
    }

    #[test]
    fn unusable_hosts_are_rejected() {
        assert_eq!(parse_host("0.0.0.0"), None);
        assert_eq!(parse_host("255.255.255.255"), None);
        assert_eq!(parse_host("224.0.0.1"), None);
        assert!(parse_host("127.0.0.1").is_some());
        assert!(parse_host("2001:db8::1").is_some());
    }

    #[test]
    fn url_round_trip() {
        let p = Proxy::parse_url("socks5h://us%40er:p%3Ass@[2001:db8::1]:1080").unwrap();
        assert_eq!(p.scheme, Scheme::Socks5);
        assert_eq!(p.port, 1080);
        let a = p.auth.as_ref().unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("us@er", "p:ss")
        );
        assert_eq!(p.to_string(), "socks5://us%40er:p%3Ass@[2001:db8::1]:1080");
        assert_eq!(Proxy::parse_url(&p.to_string()).unwrap(), p);
        assert!(Proxy::parse_url("1.2.3.4:80").is_err());
        assert!(Proxy::parse_url("ftp://1.2.3.4:80").is_err());
        assert!(Proxy::parse_url("http://1.2.3.4:0").is_err());
    }

    #[test]
    fn loose_words() {
        assert_eq!(Scheme::from_loose("HTTPS"), Some(Scheme::Http));
        assert_eq!(Scheme::from_loose("socks4a"), Some(Scheme::Socks4));
        assert_eq!(Scheme::from_loose("SOCKS5"), Some(Scheme::Socks5));
        assert_eq!(Scheme::from_loose("ftp"), None);
        assert_eq!(Anonymity::from_loose("elite proxy"), Some(Anonymity::Elite));
        assert_eq!(
            Anonymity::from_loose("High Anonymous"),
            Some(Anonymity::Elite)
        );
        assert_eq!(
            Anonymity::from_loose("anonymous"),
            Some(Anonymity::Anonymous)
        );
        assert_eq!(Anonymity::from_loose("NOA"), Some(Anonymity::Transparent));
        assert_eq!(Anonymity::from_loose("?"), None);
        assert_eq!(Country::parse(" us ").unwrap().as_str(), "US");
        assert_eq!(Country::parse("Unknown"), None);
        assert_eq!(Country::parse("-"), None);
    }
}
