//! Connections out to the network: the shared rustls client configurations
//! that fetching sources and checking proxies both use.

pub mod tls;
