//! One HTTP/1.1 request through one proxy (or directly): a stream from the
//! dialer, TLS end to end for https targets, hyper's client connection,
//! separate connect, first-byte and total limits, a body cap, gzip and
//! brotli decoding, and idle connections kept per (proxy, origin) for the
//! next request to the same place.

use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;
use url::Url;

use crate::model::Reason;
use crate::net::{self, DialError, DialOptions, IdleLimits, hyper_reason, proxy_authorization};
use crate::proxy::{Proxy, Scheme};

use super::http1::{Body, Conn, ConnKey, Http1, keeps_alive};
use super::{Lease, Pacer};
use crate::lock;

/// Idle connections kept: two per (proxy, origin), 1024 in all, each for
/// at most 15 s (servers close theirs after a few seconds and a request on
/// a closing one fails).
const IDLE: IdleLimits = IdleLimits {
    per_key: 2,
    total: 1024,
    keep_for: Duration::from_secs(15),
};

/// Idle connections kept for the gateway's forwards: about the requests
/// one proxy carries at once under load per key, 1024 in all, each for at
/// most 10 s (proxies drop quiet connections after some seconds).
pub(crate) const FORWARDS: IdleLimits = IdleLimits {
    per_key: 32,
    total: 1024,
    keep_for: Duration::from_secs(10),
};

/// Limits of one request, and the user agent it is sent with (the
/// client's: one pool carries clients with their own).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits<'a> {
    pub connect: Duration,
    pub first_byte: Duration,
    pub total: Duration,
    pub max_body: usize,
    pub user_agent: &'a HeaderValue,
    /// Set once an answer's head arrived: a deadline that passes after it
    /// passes while the body comes, which is the site's slowness.
    pub headed: Option<&'a AtomicBool>,
}

/// An answer, its body decoded.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// An HTTP proxy fetched the URL itself (absolute-form).
    pub forward: bool,
    /// The answer came over TLS verified end to end.
    pub tls: bool,
}

/// Why a request got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The dial (to the proxy, its handshake, TLS to the target) failed:
    /// whose fault that is, [`super::dial_failed`] says.
    Dial(DialError),
    /// The proxy (or, direct, the network) failed once connected.
    Proxy(Reason),
    /// The target is not a host a request can go to.
    Unreached,
    /// The body (or its decoding) is larger than the cap.
    TooLarge,
    /// The body claims an encoding it does not have.
    BadEncoding,
    /// The answer's head came but its body did not arrive within the total
    /// deadline: the site drips it, and no proxy is to blame.
    SlowBody,
}

/// A fetch's connection, with the mark its request's bytes fire.
type FetchConn = Conn<Empty<Bytes>, SendMark>;

/// Sends requests; holds the TLS configuration and the idle connections,
/// the fetches' and the gateway's forwards'.
pub(crate) struct Client {
    tls: Arc<rustls::ClientConfig>,
    fetches: Http1<Empty<Bytes>, SendMark>,
    forwards: Http1<Body>,
}

impl Client {
    pub fn new(tls: Arc<rustls::ClientConfig>) -> Client {
        Client {
            tls,
            fetches: Http1::new(IDLE),
            forwards: Http1::new(FORWARDS),
        }
    }

    /// The connections the gateway's plain forwards go on.
    pub fn forwards(&self) -> &Http1<Body> {
        &self.forwards
    }

    /// GETs `url` through the leased proxy, or directly when `lease` is
    /// `None`, within `limits`. With a `pacer`,
    /// the site's turn is taken once the connection is up: a proxy that
    /// refuses or never answers its handshake costs the site no turn.
    /// The wait for the turn counts against no limit.
    pub async fn get(
        &self,
        lease: Option<&Lease>,
        url: &Url,
        limits: Limits<'_>,
        pacer: Option<&Arc<dyn Pacer>>,
    ) -> Result<Answer, Failure> {
        let proxy = lease.map(|l| l.proxy());
        let https = url.scheme() == "https";
        let host = url
            .host_str()
            .ok_or(Failure::Proxy(Reason::ProtocolError))?;
        let port = url
            .port_or_known_default()
            .ok_or(Failure::Proxy(Reason::ProtocolError))?;
        let target = net::Target::new(host, port).map_err(|_| Failure::Unreached)?;
        let key = ConnKey::origin(lease.map(Lease::id), origin(url));
        let t0 = Instant::now();
        let mut conn = match self.fetches.reuse(&key, limits.connect).await {
            Some(conn) => conn,
            None => tokio::time::timeout(
                limits.total,
                self.connect(lease, &key, &target, https, limits),
            )
            .await
            .map_err(|_| Failure::Proxy(Reason::Timeout))??,
        };
        let connecting = t0.elapsed();
        if let Some(p) = pacer {
            p.wait(url).await;
            // The turn counts from when the request's bytes leave, which a
            // busy connection task or a redial (below) may put off.
            conn.mark.arm(p.clone(), url.clone());
        }
        let left = limits.total.saturating_sub(connecting);
        let headed = AtomicBool::new(false);
        let limits = Limits {
            headed: Some(&headed),
            ..limits
        };
        let exchange = async {
            loop {
                match self.exchange(conn, url, &target, proxy, limits).await {
                    // A kept-alive connection the peer closed meanwhile: no
                    // one's fault, open a new one, once (the turn is still
                    // ours: the request got no answer).
                    Err(None) => {
                        conn = self.connect(lease, &key, &target, https, limits).await?;
                        if let Some(p) = pacer {
                            conn.mark.arm(p.clone(), url.clone());
                        }
                    }
                    Err(Some(f)) => return Err(f),
                    Ok(a) => return Ok(a),
                }
            }
        };
        match tokio::time::timeout(left, exchange).await {
            Ok(r) => r,
            Err(_) if headed.load(Ordering::Relaxed) => Err(Failure::SlowBody),
            Err(_) => Err(Failure::Proxy(Reason::Timeout)),
        }
    }

    /// One request on `conn`; `Err(None)` when a reused connection turned
    /// out closed before the request left.
    async fn exchange(
        &self,
        mut conn: FetchConn,
        url: &Url,
        target: &net::Target,
        proxy: Option<&Proxy>,
        limits: Limits<'_>,
    ) -> Result<Answer, Option<Failure>> {
        let req = self.request(url, target, conn.forward, proxy, limits.user_agent)?;
        let sent = tokio::time::timeout(limits.first_byte, conn.sender.send_request(req)).await;
        // Unfired (the request never left): the turn stays as granted.
        conn.mark.disarm();
        let resp = match sent {
            Err(_) => return Err(Some(Failure::Proxy(Reason::Timeout))),
            Ok(Err(e)) if conn.closed_when_reused(&e) => return Err(None),
            Ok(Err(e)) => return Err(Some(Failure::Proxy(hyper_reason(&e)))),
            Ok(Ok(resp)) => resp,
        };
        if let Some(headed) = limits.headed {
            headed.store(true, Ordering::Relaxed);
        }
        let (parts, body) = resp.into_parts();
        let raw = Limited::new(body, limits.max_body)
            .collect()
            .await
            .map_err(|e| match e.downcast_ref::<hyper::Error>() {
                Some(h) => Failure::Proxy(hyper_reason(h)),
                None => Failure::TooLarge,
            })?
            .to_bytes();
        let (forward, tls) = (conn.forward, conn.tls);
        if keeps_alive(&parts) {
            self.fetches.put(conn);
        }
        let body = decode(&parts.headers, raw, limits.max_body)?;
        Ok(Answer {
            status: parts.status,
            headers: parts.headers,
            body,
            forward,
            tls,
        })
    }

    /// A new connection ready for requests: dialed, TLS for https targets.
    async fn connect(
        &self,
        lease: Option<&Lease>,
        key: &ConnKey,
        target: &net::Target,
        https: bool,
        limits: Limits<'_>,
    ) -> Result<FetchConn, Failure> {
        let opts = DialOptions {
            connect_timeout: limits.connect,
            handshake_timeout: limits.first_byte,
            forward: !https,
        };
        let dialed = match lease {
            Some(l) => l.dial(target, &opts).await,
            None => net::dial(None, target, &opts).await,
        }
        .map_err(Failure::Dial)?;
        let mark = SendMark::default();
        let stream = Marked {
            inner: dialed.stream,
            mark: mark.clone(),
        };
        if https {
            let name = match target.host() {
                net::Host::Domain(d) => d.clone(),
                net::Host::Ip(ip) => ip.to_string(),
            };
            let tls = tokio::time::timeout(
                limits.first_byte,
                net::tls::connect(&self.tls, &name, stream),
            )
            .await
            .map_err(|_| Failure::Dial(DialError::tls(Reason::Timeout)))?
            .map_err(|r| Failure::Dial(DialError::tls(r)))?;
            Conn::open(key.clone(), tls, false, true, mark, None).await
        } else {
            Conn::open(key.clone(), stream, dialed.forward, false, mark, None).await
        }
        .map_err(|e| Failure::Proxy(hyper_reason(&e)))
    }

    fn request(
        &self,
        url: &Url,
        target: &net::Target,
        forward: bool,
        proxy: Option<&Proxy>,
        user_agent: &HeaderValue,
    ) -> Result<http::Request<Empty<Bytes>>, Failure> {
        let mut path = url.path().to_owned();
        if let Some(q) = url.query() {
            path.push('?');
            path.push_str(q);
        }
        let uri = if forward {
            format!("http://{target}{path}")
        } else {
            path
        };
        let host = match url.port() {
            Some(p) => format!("{}:{p}", url.host_str().unwrap_or_default()),
            None => url.host_str().unwrap_or_default().to_owned(),
        };
        let mut req = http::Request::get(uri)
            .header(header::HOST, host)
            .header(header::USER_AGENT, user_agent.clone())
            .header(
                header::ACCEPT,
                "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
            )
            .header(header::ACCEPT_ENCODING, "gzip, br");
        if forward && let Some(auth) = proxy.and_then(proxy_authorization) {
            req = req.header(header::PROXY_AUTHORIZATION, auth);
        }
        req.body(Empty::new())
            .map_err(|_| Failure::Proxy(Reason::ProtocolError))
    }

    /// Drops the idle connections through proxy `id` (it failed), the
    /// fetches' and the forwards'.
    pub fn forget(&self, id: i64) {
        self.fetches.forget(id);
        self.forwards.forget(id);
    }
}

/// When a paced request's first bytes leave its connection: armed once the
/// site's turn is granted, fired by the connection's next write, which
/// tells the pacer (see [`Pacer::sent`]). The turn is granted just before
/// the request is handed to the connection, but the bytes go only when its
/// task runs, or after a redial when a kept connection turns out closed.
#[derive(Clone, Default)]
struct SendMark(Arc<Mutex<Option<Armed>>>);

/// Whom a [`SendMark`] tells, of which request.
type Armed = (Arc<dyn Pacer>, Url);

impl SendMark {
    fn arm(&self, pacer: Arc<dyn Pacer>, url: Url) {
        *lock(&self.0) = Some((pacer, url));
    }

    fn disarm(&self) {
        lock(&self.0).take();
    }

    fn fire(&self) {
        // Taken out first: the pacer is never called under this lock.
        let armed = lock(&self.0).take();
        if let Some((pacer, url)) = armed {
            pacer.sent(&url);
        }
    }
}

/// A stream whose writes fire its [`SendMark`].
struct Marked<S> {
    inner: S,
    mark: SendMark,
}

impl<S: AsyncRead + Unpin> AsyncRead for Marked<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Marked<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.mark.fire();
        }
        r
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            this.mark.fire();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// `scheme://host:port` of `url`.
fn origin(url: &Url) -> String {
    format!(
        "{}://{}:{}",
        url.scheme(),
        url.host_str().unwrap_or_default(),
        url.port_or_known_default().unwrap_or(0)
    )
}

/// The body with its `Content-Encoding` (gzip, deflate, br) undone, at
/// most `max` bytes decoded.
pub(crate) fn decode(headers: &HeaderMap, raw: Bytes, max: usize) -> Result<Bytes, Failure> {
    let Some(enc) = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    else {
        return Ok(raw);
    };
    let enc = enc.trim().to_ascii_lowercase();
    let reader: Box<dyn Read + '_> = match enc.as_str() {
        "" | "identity" => return Ok(raw),
        "gzip" | "x-gzip" => Box::new(flate2::read::MultiGzDecoder::new(&raw[..])),
        "deflate" => Box::new(flate2::read::ZlibDecoder::new(&raw[..])),
        "br" => Box::new(brotli::Decompressor::new(&raw[..], 4096)),
        // An encoding we did not ask for: hand over the bytes as they came.
        _ => return Ok(raw),
    };
    let mut out = Vec::with_capacity(raw.len() * 3);
    reader
        .take(max as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| Failure::BadEncoding)?;
    if out.len() > max {
        return Err(Failure::TooLarge);
    }
    Ok(out.into())
}

/// True when `proxy` can carry a request to a target of this scheme: HTTP
/// proxies need CONNECT for https and are refused only when a check found
/// it missing.
pub(crate) fn can_carry(proxy: &Proxy, https_supported: Option<bool>, https: bool) -> bool {
    !(https && proxy.scheme == Scheme::Http && https_supported == Some(false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn headers(enc: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_ENCODING, enc.parse().unwrap());
        h
    }

    #[test]
    fn bodies_are_decoded_within_the_cap() {
        let text = b"hello hello hello hello hello".repeat(100);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&text).unwrap();
        let gz = Bytes::from(gz.finish().unwrap());
        assert_eq!(
            decode(&headers("gzip"), gz.clone(), 10_000).unwrap(),
            text.as_slice()
        );
        // A small compressed body that inflates past the cap is refused.
        assert_eq!(decode(&headers("gzip"), gz, 100), Err(Failure::TooLarge));
        let mut br = Vec::new();
        brotli::BrotliCompress(
            &mut text.as_slice(),
            &mut br,
            &brotli::enc::BrotliEncoderParams::default(),
        )
        .unwrap();
        assert_eq!(
            decode(&headers("br"), br.into(), 10_000).unwrap(),
            text.as_slice()
        );
        assert_eq!(
            decode(&headers("gzip"), Bytes::from_static(b"not gzip"), 100),
            Err(Failure::BadEncoding)
        );
        assert_eq!(
            decode(&HeaderMap::new(), Bytes::from_static(b"plain"), 100).unwrap(),
            &b"plain"[..]
        );
    }
}
