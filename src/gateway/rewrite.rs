//! Header rewrite for what the gateway passes on, both ways: hop-by-hop
//! headers, every `Proxy-*` header and the gateway's own controls go;
//! nothing about the client or the gateway is added.

use http::header::{self, HeaderMap, HeaderName};

use super::controls::HEADER_PREFIX;

/// Removes hop-by-hop headers (those `Connection` names too), every
/// `Proxy-*` header and the gateway's own controls.
pub(super) fn clean(headers: &mut HeaderMap) {
    // Most heads carry none of these: one pass over the names decides,
    // before a lookup (and hash) per name removed.
    let hop = |n: &HeaderName| {
        [
            header::CONNECTION,
            header::TE,
            header::TRAILER,
            header::TRANSFER_ENCODING,
            header::UPGRADE,
        ]
        .contains(n)
            || n.as_str() == "keep-alive"
            || n.as_str().starts_with("proxy-")
            || n.as_str().starts_with(HEADER_PREFIX)
    };
    if !headers.keys().any(hop) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        HeaderName::from_static("keep-alive"),
    ] {
        headers.remove(name);
    }
    let own: Vec<HeaderName> = headers
        .keys()
        .filter(|n| n.as_str().starts_with("proxy-") || n.as_str().starts_with(HEADER_PREFIX))
        .cloned()
        .collect();
    for name in own {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_proxy_and_control_headers_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eDp5"),
            ("proxy-connection", "keep-alive"),
            ("x-proxywarden-country", "de"),
            ("te", "trailers"),
            ("upgrade", "websocket"),
            ("accept", "*/*"),
            ("cookie", "a=b"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        clean(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["accept", "cookie"]);
    }
}
