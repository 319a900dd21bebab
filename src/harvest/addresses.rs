//! Which addresses a public list may name. A list is hostile: one naming
//! `127.0.0.1:22`, a LAN host or the cloud metadata address would make the
//! daemon connect there, and one naming the daemon's own gateway would make
//! it serve (and use) itself. Such candidates are dropped unless
//! `harvest.allow_private_addresses` is set; the daemon's own addresses are
//! dropped whatever the key.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::config::Config;

/// Why an address is not on the public internet, or `None` when it is.
/// Covers loopback, private (RFC 1918, unique local, shared CGNAT space),
/// link-local, unspecified, multicast, broadcast, reserved, benchmarking and
/// documentation ranges, for IPv4 and IPv6; an IPv6 address embedding an
/// IPv4 one (mapped, compatible, NAT64, 6to4) is judged by that address.
pub fn special_kind(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => special_v4(v4),
        IpAddr::V6(v6) => special_v6(v6),
    }
}

fn special_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        // Shared address space (RFC 6598): carrier NAT, and some clouds'
        // internal services (a metadata address among them).
        (100, 64..=127, _) => "private",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn special_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    let s = ip.segments();
    // Forms that carry an IPv4 address are judged by it: ::ffff:a.b.c.d
    // (mapped), ::a.b.c.d (compatible), 64:ff9b::a.b.c.d (NAT64).
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    if s[..5] == [0; 5] && (s[5] == 0xffff || s[5] == 0) {
        return special_v4(embedded(s[6], s[7]));
    }
    if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return special_v4(embedded(s[6], s[7]));
    }
    // 6to4 (2002:AABB:CCDD::/48) routes to the IPv4 address AABBCCDD.
    if s[0] == 0x2002 {
        return special_v4(embedded(s[1], s[2]));
    }
    Some(match s[0] {
        x if x & 0xfe00 == 0xfc00 => "private",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        // Site-local: deprecated, still private where it is used.
        x if x & 0xffc0 == 0xfec0 => "private",
        x if x & 0xff00 == 0xff00 => "multicast",
        0x2001 if s[1] == 0x0db8 => "documentation",
        x if x & 0xfff0 == 0x3ff0 => "documentation",
        0x0100 if s[1..4] == [0, 0, 0] => "reserved",
        _ => return None,
    })
}

/// What a harvest keeps: public addresses, and private ones too when the
/// config allows them; never the daemon's own API or gateway.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// `harvest.allow_private_addresses`.
    pub allow_private: bool,
    /// The daemon's own listening addresses (API, gateway).
    pub own: Vec<SocketAddr>,
}

impl AddressPolicy {
    /// The policy of `config`: its key, and its API and gateway addresses
    /// as configured (the daemon passes the ones it actually bound).
    pub fn from_config(config: &Config) -> AddressPolicy {
        let mut own = vec![config.api.listen];
        if config.gateway.enabled {
            own.push(config.gateway.listen);
        }
        AddressPolicy {
            allow_private: config.harvest.allow_private_addresses,
            own,
        }
    }

    /// True when `ip:port` is one of the daemon's own listening addresses:
    /// the address itself, or, for a wildcard listener, any address of this
    /// host that is not public (the public one cannot be known here) on
    /// that port.
    pub fn is_own(&self, ip: IpAddr, port: u16) -> bool {
        let ip = ip.to_canonical();
        self.own.iter().any(|own| {
            own.port() == port
                && (own.ip().to_canonical() == ip
                    || ip.is_loopback()
                    || ip.is_unspecified()
                    || (own.ip().is_unspecified() && special_kind(ip).is_some()))
        })
    }

    /// Why `ip:port` is refused (`"the daemon's own address"`, `"loopback"`,
    /// `"private"`, …), or `None` when it is kept.
    pub fn refuses(&self, ip: IpAddr, port: u16) -> Option<&'static str> {
        if self.is_own(ip, port) {
            return Some("the daemon's own address");
        }
        if self.allow_private {
            return None;
        }
        special_kind(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(s: &str) -> Option<&'static str> {
        special_kind(s.parse().unwrap())
    }

    #[test]
    fn special_ranges_of_both_families() {
        for (ip, k) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("0.0.0.0", "unspecified"),
            ("10.0.0.1", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.100.100.200", "private"),
            ("169.254.169.254", "link-local"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.7", "documentation"),
            ("203.0.113.7", "documentation"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fd00::1", "private"),
            ("fe80::1", "link-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:10.1.2.3", "private"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a00:1", "private"),
            ("2002:7f00:1::", "loopback"),
        ] {
            assert_eq!(kind(ip), Some(k), "{ip}");
        }
        for public in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(kind(public), None, "{public}");
        }
    }

    #[test]
    fn own_addresses_are_refused_whatever_the_key() {
        let policy = AddressPolicy {
            allow_private: true,
            own: vec![
                "127.0.0.1:8080".parse().unwrap(),
                "0.0.0.0:8081".parse().unwrap(),
            ],
        };
        let refused = |s: &str| {
            let a: SocketAddr = s.parse().unwrap();
            policy.refuses(a.ip(), a.port())
        };
        assert!(refused("127.0.0.1:8080").is_some());
        assert!(refused("127.0.0.2:8080").is_some());
        assert!(refused("[::1]:8080").is_some());
        assert!(refused("[::ffff:127.0.0.1]:8080").is_some());
        assert!(refused("10.0.0.5:8081").is_some(), "a wildcard listener");
        assert_eq!(refused("127.0.0.1:8082"), None, "allowed: a lab proxy");
        assert_eq!(refused("10.0.0.5:8080"), None);
        let strict = AddressPolicy {
            allow_private: false,
            ..policy
        };
        assert_eq!(
            strict.refuses("10.0.0.5".parse().unwrap(), 80),
            Some("private")
        );
        assert_eq!(strict.refuses("8.8.8.8".parse().unwrap(), 80), None);
    }
}
