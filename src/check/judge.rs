//! Judges: reading what a judge saw (proxywarden's own `/judge` JSON,
//! httpbin-style JSON, or `REMOTE_ADDR = …` pages), deciding whether an
//! answer is genuine, and classifying anonymity against our own address.

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};

use crate::config::JudgeConfig;
use crate::proxy::Anonymity;

/// The marker proxywarden's own `/judge` always returns.
pub const JUDGE_MARKER: &str = "proxywarden-judge";

/// The query parameter carrying the per-check nonce.
pub const NONCE_PARAM: &str = "pwcheck";

/// Headers that reveal a proxy in the path (lower case). `Client-IP`,
/// `X-Real-IP` and `Forwarded` carry the client's address on some proxies,
/// but their mere presence already tells the target a proxy is there.
const REVEALING: &[&str] = &[
    "via",
    "x-forwarded-for",
    "forwarded",
    "forwarded-for",
    "x-forwarded",
    "x-forwarded-host",
    "x-forwarded-server",
    "x-real-ip",
    "client-ip",
    "x-client-ip",
    "x-proxy-id",
    "proxy-connection",
    "proxy-agent",
    "x-bluecoat-via",
    "x-originating-ip",
    "x-remote-ip",
    "x-remote-addr",
    "true-client-ip",
    "cf-connecting-ip",
    "x-cluster-client-ip",
    "xroxy-connection",
    "x-proxy-connection",
];

/// What a judge reports about the request it received.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Echo {
    /// The address the request came from (the proxy's exit address).
    pub remote: Option<IpAddr>,
    /// Request headers as the judge saw them (names lower case).
    pub headers: Vec<(String, String)>,
}

impl Echo {
    /// Reads a judge's answer in any of the understood formats. Unknown
    /// formats yield an empty echo (no address, no headers).
    pub fn parse(body: &str) -> Echo {
        let trimmed = body.trim_start();
        if trimmed.starts_with('{')
            && let Ok(serde_json::Value::Object(obj)) = serde_json::from_str(trimmed)
        {
            return Echo::from_json(&obj);
        }
        Echo::from_env_lines(body)
    }

    fn from_json(obj: &serde_json::Map<String, serde_json::Value>) -> Echo {
        let mut echo = Echo::default();
        // proxywarden: "remote_addr": "ip:port"; httpbin: "origin": "a, b".
        if let Some(addr) = obj.get("remote_addr").and_then(|v| v.as_str()) {
            echo.remote = parse_addr(addr);
        } else if let Some(origin) = obj.get("origin").and_then(|v| v.as_str()) {
            // httpbin lists any forwarded-for chain before the real peer.
            echo.remote = origin.split(',').filter_map(parse_addr).next_back();
        }
        if let Some(serde_json::Value::Object(h)) = obj.get("headers") {
            for (name, value) in h {
                let name = name.to_ascii_lowercase();
                match value {
                    serde_json::Value::String(s) => echo.headers.push((name, s.clone())),
                    serde_json::Value::Array(vs) => {
                        for v in vs {
                            if let Some(s) = v.as_str() {
                                echo.headers.push((name.clone(), s.to_owned()));
                            }
                        }
                    }
                    other => echo.headers.push((name, other.to_string())),
                }
            }
        }
        echo
    }

    /// `REMOTE_ADDR = 1.2.3.4` and `HTTP_X_FORWARDED_FOR = …` lines, the
    /// format of azenv-style judges (often inside HTML `<pre>`).
    fn from_env_lines(body: &str) -> Echo {
        let mut echo = Echo::default();
        for line in body.lines() {
            let line = strip_tags(line);
            let Some((key, value)) = line.split_once(['=', ':']) else {
                continue;
            };
            let key = key.trim().to_ascii_uppercase();
            let value = value.trim();
            if key == "REMOTE_ADDR" {
                echo.remote = parse_addr(value);
            } else if let Some(h) = key.strip_prefix("HTTP_") {
                echo.headers
                    .push((h.replace('_', "-").to_ascii_lowercase(), value.to_owned()));
            }
        }
        echo
    }

    /// Every IP address that appears in the remote address or any header
    /// but `Host` (which names the judge, and a judge may be ourselves).
    fn addresses(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.remote.into_iter().chain(
            self.headers
                .iter()
                .filter(|(name, _)| name != "host")
                .flat_map(|(_, v)| ip_tokens(v).collect::<Vec<_>>()),
        )
    }
}

fn strip_tags(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_tag = false;
    for c in line.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}

/// `1.2.3.4`, `1.2.3.4:5678`, `[2001:db8::1]:80` or `2001:db8::1`.
fn parse_addr(s: &str) -> Option<IpAddr> {
    let s = s.trim().trim_matches('"');
    s.parse::<IpAddr>()
        .ok()
        .or_else(|| s.parse::<SocketAddr>().ok().map(|a| a.ip()))
}

/// IP addresses inside a header value such as `for="1.2.3.4:80", by=…`.
fn ip_tokens(v: &str) -> impl Iterator<Item = IpAddr> + '_ {
    v.split(|c: char| !(c.is_ascii_hexdigit() || c == '.' || c == ':' || c == '[' || c == ']'))
        .filter(|t| t.len() >= 3)
        .filter_map(parse_addr)
}

/// What the checker knows about itself: the addresses judges see when it
/// connects directly, and the headers a direct request already arrives
/// with (a judge behind a CDN adds its own `X-Forwarded-For`, which must not
/// count against every proxy).
#[derive(Clone, Debug, Default)]
pub struct OwnIdentity {
    /// Our public addresses.
    pub ips: HashSet<IpAddr>,
    /// Revealing headers present even without a proxy (lower case).
    pub baseline_headers: HashSet<String>,
}

impl OwnIdentity {
    /// Adds what one judge saw of a direct request.
    pub fn learn(&mut self, echo: &Echo) {
        if let Some(ip) = echo.remote {
            self.ips.insert(ip);
        }
        for (name, _) in &echo.headers {
            self.baseline_headers.insert(name.clone());
        }
    }

    /// Anonymity of a request that arrived at the judge as `echo`.
    pub fn classify(&self, echo: &Echo) -> Anonymity {
        if echo.addresses().any(|ip| self.ips.contains(&ip)) {
            return Anonymity::Transparent;
        }
        let reveals = echo.headers.iter().any(|(name, _)| {
            REVEALING.contains(&name.as_str()) && !self.baseline_headers.contains(name)
        });
        if reveals {
            Anonymity::Anonymous
        } else {
            Anonymity::Elite
        }
    }
}

/// True when `body` is a genuine answer from `judge` to the check carrying
/// `nonce`: the judge's echo of the URL contains the nonce and, if one is
/// configured, its marker is present. Cached pages, ad injection and captive
/// portals fail this.
pub fn genuine(judge: &JudgeConfig, body: &str, nonce: &str) -> bool {
    (!judge.echo || body.contains(nonce))
        && judge.marker.as_deref().is_none_or(|m| body.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> OwnIdentity {
        let mut o = OwnIdentity::default();
        o.learn(&Echo {
            remote: Some("203.0.113.7".parse().unwrap()),
            headers: vec![("host".into(), "judge".into())],
        });
        o
    }

    #[test]
    fn proxywarden_format() {
        let e = Echo::parse(
            r#"{"marker":"proxywarden-judge","remote_addr":"198.51.100.2:4455","url":"/judge?pwcheck=1",
                "headers":{"Host":"j","Via":"1.1 squid"}}"#,
        );
        assert_eq!(e.remote, Some("198.51.100.2".parse().unwrap()));
        assert!(e.headers.contains(&("via".into(), "1.1 squid".into())));
        assert_eq!(own().classify(&e), Anonymity::Anonymous);
    }

    #[test]
    fn httpbin_format() {
        let e = Echo::parse(
            r#"{"args":{"pwcheck":"x"},"headers":{"Host":"httpbin.org","X-Forwarded-For":"203.0.113.7"},
                "origin":"203.0.113.7, 198.51.100.9","url":"http://httpbin.org/get?pwcheck=x"}"#,
        );
        assert_eq!(e.remote, Some("198.51.100.9".parse().unwrap()));
        assert_eq!(own().classify(&e), Anonymity::Transparent);
        let elite = Echo::parse(r#"{"headers":{"Host":"h"},"origin":"198.51.100.9"}"#);
        assert_eq!(own().classify(&elite), Anonymity::Elite);
    }

    #[test]
    fn azenv_format() {
        let body = "<html><pre>\nREMOTE_ADDR = 198.51.100.3\nREMOTE_PORT = 5555\n\
                    HTTP_HOST = azenv.net\nHTTP_X_FORWARDED_FOR = 203.0.113.7\n\
                    REQUEST_URI = /?pwcheck=n1\n</pre></html>";
        let e = Echo::parse(body);
        assert_eq!(e.remote, Some("198.51.100.3".parse().unwrap()));
        assert!(e.headers.iter().any(|(n, _)| n == "x-forwarded-for"));
        assert_eq!(own().classify(&e), Anonymity::Transparent);
    }

    #[test]
    fn own_address_in_forwarded_syntax_is_transparent() {
        let e = Echo {
            remote: Some("198.51.100.3".parse().unwrap()),
            headers: vec![(
                "forwarded".into(),
                "for=\"203.0.113.7:1234\";proto=http".into(),
            )],
        };
        assert_eq!(own().classify(&e), Anonymity::Transparent);
        let near_miss = Echo {
            remote: Some("198.51.100.3".parse().unwrap()),
            headers: vec![("x-note".into(), "203.0.113.70".into())],
        };
        assert_eq!(own().classify(&near_miss), Anonymity::Elite);
    }

    #[test]
    fn baseline_headers_do_not_count() {
        let mut o = own();
        o.learn(&Echo {
            remote: None,
            headers: vec![("x-forwarded-for".into(), "10.0.0.1".into())],
        });
        let e = Echo {
            remote: Some("198.51.100.3".parse().unwrap()),
            headers: vec![("x-forwarded-for".into(), "10.0.0.9".into())],
        };
        assert_eq!(o.classify(&e), Anonymity::Elite);
    }

    #[test]
    fn genuine_needs_nonce_and_marker() {
        let judge = JudgeConfig {
            url: "http://j/".parse().unwrap(),
            marker: Some(JUDGE_MARKER.into()),
            echo: true,
        };
        assert!(genuine(&judge, "proxywarden-judge pwcheck=abc", "abc"));
        assert!(!genuine(&judge, "proxywarden-judge pwcheck=old", "abc"));
        assert!(!genuine(&judge, "<html>login</html> abc", "abc"));
        let static_page = JudgeConfig {
            url: "http://j/".parse().unwrap(),
            marker: Some("OK-123".into()),
            echo: false,
        };
        assert!(genuine(&static_page, "OK-123", "abc"));
    }
}
