//! `[gateway]`: the local rotating forward proxy's address, token, retry
//! budget, timeouts and connection limits.

use std::net::SocketAddr;
use std::time::Duration;

use super::api::{Secret, guard_public, token};
use super::section::Section;
use crate::model::StrategyKind;

/// `[gateway]`
#[derive(Clone, Debug, PartialEq)]
pub struct GatewayConfig {
    /// Run the gateway with `serve`.
    pub enabled: bool,
    /// Listen address (HTTP proxy and SOCKS5 on the same port).
    pub listen: SocketAddr,
    /// The password clients must give (Proxy-Authorization Basic or SOCKS5
    /// username/password), if any.
    pub token: Option<Secret>,
    /// How a proxy is chosen for a request or tunnel.
    pub strategy: StrategyKind,
    /// Other proxies a failed request or tunnel set-up moves on to.
    pub retries: u32,
    /// Request bodies up to this size are kept so the request can be
    /// retried; larger ones are streamed once.
    pub retry_body_max: usize,
    /// TCP connect to an upstream proxy.
    pub connect_timeout: Duration,
    /// From the connection to the upstream answer's head (handshake
    /// included).
    pub timeout: Duration,
    /// Time a client has to send a request head (or SOCKS greeting), and
    /// the longest a kept-alive connection may wait for its next request.
    pub header_timeout: Duration,
    /// A tunnel on which nothing moves this long is closed.
    pub idle_timeout: Duration,
    /// Open client connections at most; more are refused.
    pub max_connections: usize,
    /// Open client connections from one address at most.
    pub max_connections_per_ip: usize,
    /// The largest request head accepted.
    pub max_header_size: usize,
    /// How long a request or tunnel waits, in line, for a proxy while
    /// every matching one is at `max_per_proxy`.
    pub queue_wait: Duration,
    /// A sticky session keeps its proxy this long at most.
    pub session_ttl: Duration,
}

/// Validates `[gateway]`.
pub(super) fn read(g: &mut Section) -> Option<GatewayConfig> {
    let enabled = g.boolean("enabled");
    let listen = g.parsed::<SocketAddr>("listen", "an address like \"127.0.0.1:8081\"");
    let token = token(g);
    let strategy = g
        .string("strategy")
        .and_then(|s| match s.parse::<StrategyKind>() {
            Ok(kind) => Some(kind),
            Err(e) => {
                g.problem("strategy", &e);
                None
            }
        });
    let retries = g.int("retries", 0, 20);
    let retry_body_max = g.size("retry_body_max", 0, 16 * 1024 * 1024);
    let connect_timeout = g.duration("connect_timeout");
    let timeout = g.duration("timeout");
    let header_timeout = g.duration("header_timeout");
    let idle_timeout = g.duration("idle_timeout");
    let max_connections = g.int("max_connections", 1, 1_000_000);
    let max_connections_per_ip = g.int("max_connections_per_ip", 1, 1_000_000);
    // hyper needs at least 8 KiB to buffer a head.
    let max_header_size = g.size("max_header_size", 8 * 1024, 1024 * 1024);
    // Moved: one cap holds for the gateway and crawl jobs together.
    if g.take("max_per_proxy").is_some() {
        g.problem(
            "max_per_proxy",
            "has moved to pool.max_per_proxy, which caps the gateway and crawl jobs together: \
             write it under [pool]",
        );
    }
    let queue_wait = g.duration("queue_wait");
    let session_ttl = g.duration("session_ttl");
    guard_public(g, "gateway", listen, &token);
    // The ranges were checked, so the casts below cannot truncate.
    Some(GatewayConfig {
        enabled: enabled?,
        listen: listen?,
        token,
        strategy: strategy?,
        retries: retries? as u32,
        retry_body_max: retry_body_max? as usize,
        connect_timeout: connect_timeout?,
        timeout: timeout?,
        header_timeout: header_timeout?,
        idle_timeout: idle_timeout?,
        max_connections: max_connections? as usize,
        max_connections_per_ip: max_connections_per_ip? as usize,
        max_header_size: max_header_size? as usize,
        queue_wait: queue_wait?,
        session_ttl: session_ttl?,
    })
}
