//! Connections out to the network: the dialer, which opens a stream to
//! host:port directly or through any proxy (HTTP forward or CONNECT,
//! SOCKS4/4a, SOCKS5/5h), TLS over such a stream, and the shared rustls
//! client configurations; idle connections kept for reuse; the servers'
//! accept loop; and the response headers every client acts on
//! (`Retry-After`).

mod accept;
mod dial;
mod headers;
mod idle;
pub mod tls;

pub use accept::accept;
pub use dial::{
    DialError, DialOptions, DialStage, Dialed, Host, InvalidHost, Target, dial, hyper_reason,
    io_reason, proxy_authorization,
};
pub use headers::retry_after;
pub use idle::{IdleConns, IdleLimits, Reusable};
