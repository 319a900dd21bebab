//! Connections out to the network: the dialer, which opens a stream to
//! host:port directly or through any proxy (HTTP forward or CONNECT,
//! SOCKS4/4a, SOCKS5/5h), TLS over such a stream, and the shared rustls
//! client configurations; the servers' accept loop; and the response
//! headers every client acts on (`Retry-After`).

mod accept;
mod dial;
mod headers;
pub mod tls;

pub use accept::accept;
pub use dial::{
    DialOptions, Dialed, Host, InvalidHost, Target, dial, hyper_reason, io_reason,
    proxy_authorization,
};
pub use headers::retry_after;
