//! The SOCKS5 side of the gateway (RFC 1928, with RFC 1929 username and
//! password): CONNECT to a domain or an IP through a proxy the pool picks.
//! Written by hand: the protocol's server side is a few fixed messages, and
//! the SOCKS crates are clients.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::TokenCheck;
use super::controls::Controls;
use super::metrics::Kind;
use super::slots::{ConnState, Slot};
use super::tunnel::{self, TunnelError};
use crate::net::Target;

/// The first byte of every SOCKS5 greeting.
pub(super) const VERSION: u8 = 5;

const NO_AUTH: u8 = 0x00;
const USER_PASS: u8 = 0x02;
const NO_METHOD: u8 = 0xFF;

/// Reply codes (RFC 1928 §6).
const SUCCEEDED: u8 = 0x00;
const GENERAL_FAILURE: u8 = 0x01;
const NOT_ALLOWED: u8 = 0x02;
const HOST_UNREACHABLE: u8 = 0x04;
const COMMAND_NOT_SUPPORTED: u8 = 0x07;
const ADDRESS_NOT_SUPPORTED: u8 = 0x08;

/// How a handshake ended early, as counted.
struct Refused(&'static str);

/// Serves one SOCKS5 client (from `peer`): handshake (within the header
/// timeout), then a tunnel through a proxy, then the relay.
pub(super) async fn serve(
    gw: &Gateway,
    mut stream: TcpStream,
    peer: IpAddr,
    shutdown: &CancellationToken,
    slot: Arc<Slot>,
) {
    let metrics = gw.metrics();
    let s = gw.settings();
    let shake = tokio::time::timeout(
        s.header_timeout,
        handshake(gw, &mut stream, peer, &slot.conn),
    )
    .await;
    let (controls, target) = match shake {
        Ok(Ok(x)) => x,
        Ok(Err(Refused(result))) => {
            metrics.finished(Kind::Socks, result);
            return;
        }
        // Silent or slow past the header timeout.
        Err(_) => return,
    };
    slot.conn.busy();
    let started = Instant::now();
    match tunnel::open(gw, &controls, &target).await {
        Ok(opened) => {
            slot.conn.tunnel();
            if reply(&mut stream, SUCCEEDED).await.is_err() {
                return;
            }
            metrics.added(started.elapsed().saturating_sub(opened.dial));
            metrics.finished(Kind::Socks, "ok");
            tunnel::relay(gw, stream, opened.stream, s.idle_timeout, shutdown).await;
            drop(opened.lease);
        }
        Err(e) => {
            let (code, result) = match e {
                TunnelError::NoProxy(_) => (NOT_ALLOWED, "no_proxy"),
                TunnelError::Unreachable => (HOST_UNREACHABLE, "target_unreachable"),
                TunnelError::Failed(_) => (GENERAL_FAILURE, "upstream_failed"),
            };
            metrics.finished(Kind::Socks, result);
            let _ = reply(&mut stream, code).await;
        }
    }
}

/// Greeting, authentication and the request; the client's controls and
/// target, or why not (already answered).
async fn handshake(
    gw: &Gateway,
    stream: &mut TcpStream,
    peer: IpAddr,
    conn: &ConnState,
) -> Result<(Controls, Target), Refused> {
    let io = |_| Refused("bad_request");
    let token = gw.settings().token.as_ref();
    let mut head = [0u8; 2];
    stream.read_exact(&mut head).await.map_err(io)?;
    let mut methods = vec![0u8; head[1] as usize];
    stream.read_exact(&mut methods).await.map_err(io)?;
    // Username/password whenever offered: the username carries the
    // controls. Without a token, no authentication will do too.
    let method = if methods.contains(&USER_PASS) {
        USER_PASS
    } else if token.is_none() && methods.contains(&NO_AUTH) {
        NO_AUTH
    } else {
        NO_METHOD
    };
    stream.write_all(&[VERSION, method]).await.map_err(io)?;
    let mut controls = Controls::default();
    match method {
        NO_METHOD => return Err(Refused("denied")),
        USER_PASS => {
            let mut v = [0u8; 2];
            stream.read_exact(&mut v).await.map_err(io)?;
            let mut user = vec![0u8; v[1] as usize];
            stream.read_exact(&mut user).await.map_err(io)?;
            let mut plen = [0u8; 1];
            stream.read_exact(&mut plen).await.map_err(io)?;
            let mut pass = vec![0u8; plen[0] as usize];
            stream.read_exact(&mut pass).await.map_err(io)?;
            let pass = String::from_utf8_lossy(&pass);
            if gw.check_token(Some(peer), Some(&pass)) != TokenCheck::Admitted {
                let _ = stream.write_all(&[1, 1]).await;
                return Err(Refused("denied"));
            }
            conn.authenticated();
            // A username that is not controls fails the authentication:
            // SOCKS has no other way to say why.
            match Controls::from_username(&String::from_utf8_lossy(&user)) {
                Ok(c) => controls = c,
                Err(e) => {
                    tracing::debug!(error = %e, "bad controls in a SOCKS5 username");
                    let _ = stream.write_all(&[1, 1]).await;
                    return Err(Refused("bad_request"));
                }
            }
            stream.write_all(&[1, 0]).await.map_err(io)?;
        }
        _ => {}
    }
    let mut req = [0u8; 4];
    stream.read_exact(&mut req).await.map_err(io)?;
    if req[0] != VERSION {
        return Err(Refused("bad_request"));
    }
    let host = match req[3] {
        1 => {
            let mut a = [0u8; 4];
            stream.read_exact(&mut a).await.map_err(io)?;
            Ipv4Addr::from(a).to_string()
        }
        3 => {
            let mut len = [0u8; 1];
            stream.read_exact(&mut len).await.map_err(io)?;
            let mut name = vec![0u8; len[0] as usize];
            stream.read_exact(&mut name).await.map_err(io)?;
            String::from_utf8_lossy(&name).into_owned()
        }
        4 => {
            let mut a = [0u8; 16];
            stream.read_exact(&mut a).await.map_err(io)?;
            Ipv6Addr::from(a).to_string()
        }
        _ => {
            let _ = reply(stream, ADDRESS_NOT_SUPPORTED).await;
            return Err(Refused("bad_request"));
        }
    };
    let mut port = [0u8; 2];
    stream.read_exact(&mut port).await.map_err(io)?;
    if req[1] != 1 {
        // Only CONNECT: BIND and UDP ASSOCIATE would have the gateway
        // itself open ports.
        let _ = reply(stream, COMMAND_NOT_SUPPORTED).await;
        return Err(Refused("bad_request"));
    }
    // Port 0 too: no server listens there, and no proxy is to be blamed.
    let Ok(target) = super::http::target(&host, u16::from_be_bytes(port)) else {
        let _ = reply(stream, HOST_UNREACHABLE).await;
        return Err(Refused("bad_request"));
    };
    Ok((controls, target))
}

/// A reply with an empty IPv4 bound address: the address the upstream
/// bound is the upstream's business.
async fn reply(stream: &mut TcpStream, code: u8) -> std::io::Result<()> {
    stream
        .write_all(&[VERSION, code, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
}

/// Refuses a SOCKS4 client with its protocol's "request rejected".
pub(super) async fn refuse_v4(mut stream: TcpStream) {
    let _ = stream.write_all(&[0, 0x5B, 0, 0, 0, 0, 0, 0]).await;
}
