//! The pool's HTTP/1 client connections, for its fetches and the
//! gateway's plain forwards alike: one opened on a stream a lease dialed
//! (hyper's handshake, its connection task), kept idle per key for the
//! next request, taken again only once ready, and the one rule for a kept
//! connection the peer closed meanwhile (no one's fault: the request goes
//! again on a new one). Each caller builds its request and reads its
//! answer's body its own way: the fetch whole under a cap, the gateway as
//! it streams both ways.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::combinators::BoxBody;
use hyper::body::Body as HttpBody;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::sync::CancellationToken;

use super::Pool;
use crate::net::{IdleConns, IdleLimits, Reusable, Target};
use crate::proxy::{Proxy, Scheme};

/// The body of a request forwarded upstream (and of the answers the
/// gateway makes itself).
pub(crate) type Body = BoxBody<Bytes, hyper::Error>;

/// Where a kept connection leads: through which proxy (none for a direct
/// fetch), and to what when it serves one place only.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct ConnKey {
    proxy: Option<i64>,
    to: Option<String>,
}

impl ConnKey {
    /// A fetch's connection through `proxy` (or direct) to one origin
    /// (`scheme://host:port`; TLS to it is end to end).
    pub fn origin(proxy: Option<i64>, origin: String) -> ConnKey {
        ConnKey {
            proxy,
            to: Some(origin),
        }
    }

    /// A forward's connection to `target` through proxy `id`: an HTTP
    /// proxy takes absolute-form requests for any target, a SOCKS proxy's
    /// tunnel leads to one.
    pub fn forward(id: i64, proxy: &Proxy, target: &Target) -> ConnKey {
        let to = (proxy.scheme != Scheme::Http).then(|| target.to_string());
        ConnKey {
            proxy: Some(id),
            to,
        }
    }
}

/// One HTTP/1 connection: its sender, what it leads to, and `M`, what its
/// caller keeps with it.
pub(crate) struct Conn<B, M = ()> {
    key: ConnKey,
    pub sender: SendRequest<B>,
    /// It leads to an HTTP proxy (absolute-form requests).
    pub forward: bool,
    /// It is TLS end to end to the target.
    pub tls: bool,
    pub mark: M,
    /// Opened for this request, not taken from the idle ones.
    fresh: bool,
}

impl<B, M> Reusable for Conn<B, M> {
    // Not `is_ready`: a forward's connection is put back as its answer's
    // body ends, before hyper has marked it ready for the next request;
    // [`Http1::reuse`] waits for that.
    fn usable(&self) -> bool {
        !self.sender.is_closed()
    }
}

impl<B, M> Conn<B, M>
where
    B: HttpBody + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// A connection for requests to `key` on `stream` (a dialed stream,
    /// or TLS over one): `forward` when it leads to an HTTP proxy, `tls`
    /// when TLS is end to end. Its task ends once the sender is gone and
    /// the last answer's body read, when the peer closes, or when `until`
    /// is cancelled.
    pub async fn open<S>(
        key: ConnKey,
        stream: S,
        forward: bool,
        tls: bool,
        mark: M,
        until: Option<CancellationToken>,
    ) -> Result<Conn<B, M>, hyper::Error>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        // Errors reach the request through the sender.
        tokio::spawn(async move {
            match until {
                Some(token) => {
                    tokio::select! {
                        _ = conn => {}
                        _ = token.cancelled() => {}
                    }
                }
                None => {
                    let _ = conn.await;
                }
            }
        });
        Ok(Conn {
            key,
            sender,
            forward,
            tls,
            mark,
            fresh: true,
        })
    }
}

impl<B, M> Conn<B, M> {
    /// True when a request on this connection failed with `e` because the
    /// peer had closed it while it was kept: before the request left, or
    /// with the connection ending (FIN or reset) before any answer came.
    /// Proxies that serve one request per connection without saying so do
    /// this; the request goes again on a new connection and is blamed on
    /// no one.
    pub fn closed_when_reused(&self, e: &hyper::Error) -> bool {
        !self.fresh && closed(e)
    }
}

/// Idle connections, bounded per key and in all.
pub(crate) struct Http1<B, M = ()> {
    idle: IdleConns<ConnKey, Conn<B, M>>,
}

impl<B, M> Http1<B, M>
where
    B: HttpBody + Send + 'static,
{
    pub fn new(limits: IdleLimits) -> Http1<B, M> {
        Http1 {
            idle: IdleConns::new(limits),
        }
    }

    /// The newest idle connection for `key` that is ready for a request
    /// within `wait` (at once unless the peer closed it meanwhile); those
    /// that are not are let go.
    pub async fn reuse(&self, key: &ConnKey, wait: Duration) -> Option<Conn<B, M>> {
        while let Some(mut conn) = self.idle.take(key) {
            // Mostly ready already: no timer then.
            if conn.sender.is_ready()
                || matches!(
                    tokio::time::timeout(wait, conn.sender.ready()).await,
                    Ok(Ok(()))
                )
            {
                conn.fresh = false;
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to the same place, room allowing.
    pub fn put(&self, conn: Conn<B, M>) {
        self.idle.put(conn.key.clone(), conn);
    }

    /// Closes the idle connections through proxy `id` (it failed).
    pub fn forget(&self, id: i64) {
        self.idle.forget(|k| k.proxy == Some(id));
    }

    /// Idle connections kept now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.idle.len()
    }
}

impl Pool {
    /// The connections the gateway's plain forwards go on.
    pub(crate) fn forwards(&self) -> &Http1<Body> {
        self.inner.shared.client.forwards()
    }
}

/// True when an answer leaves its connection open for another request.
pub(crate) fn keeps_alive(parts: &http::response::Parts) -> bool {
    parts.version == http::Version::HTTP_11
        && !parts.headers.get_all(header::CONNECTION).iter().any(|v| {
            v.to_str()
                .is_ok_and(|s| s.to_ascii_lowercase().contains("close"))
        })
}

/// True when `e` says the peer closed the connection before an answer.
fn closed(e: &hyper::Error) -> bool {
    if e.is_closed() || e.is_canceled() || e.is_incomplete_message() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            );
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_proxies_share_a_key_across_targets_socks_ones_do_not() {
        let http = Proxy::parse_url("http://127.0.0.1:8080").unwrap();
        let socks = Proxy::parse_url("socks5://127.0.0.1:1080").unwrap();
        let a = Target::new("a.example", 80).unwrap();
        let b = Target::new("b.example", 80).unwrap();
        let key = ConnKey::forward;
        assert_eq!(key(1, &http, &a), key(1, &http, &b));
        assert_ne!(key(1, &http, &a), key(2, &http, &a));
        assert_ne!(key(1, &socks, &a), key(1, &socks, &b));
        let origin = |o: &str| ConnKey::origin(Some(1), o.to_owned());
        assert_ne!(
            origin("http://a.example:80"),
            origin("https://a.example:443")
        );
        assert_eq!(Http1::<Body>::new(crate::pool::fetch::FORWARDS).len(), 0);
    }

    #[test]
    fn answers_that_close_or_speak_http_1_0_are_not_kept() {
        let head = |version, connection: Option<&str>| {
            let mut b = http::Response::builder().version(version);
            if let Some(c) = connection {
                b = b.header(header::CONNECTION, c);
            }
            b.body(()).unwrap().into_parts().0
        };
        assert!(keeps_alive(&head(http::Version::HTTP_11, None)));
        assert!(keeps_alive(&head(
            http::Version::HTTP_11,
            Some("keep-alive")
        )));
        assert!(!keeps_alive(&head(http::Version::HTTP_11, Some("Close"))));
        assert!(!keeps_alive(&head(http::Version::HTTP_10, None)));
    }
}
