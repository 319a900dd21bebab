//! Plain requests through the gateway: an absolute-form request forwarded
//! through a proxy per attempt (on a kept-alive upstream connection when
//! one is idle), retried on another when one fails or the site blocks it,
//! its answer classified and passed back with its bytes counted.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::time::Instant;

use super::Gateway;
use super::controls::Controls;
use super::http::{client_fault, error, no_proxy, target, upstream_failed};
use super::metrics::{GatewayMetrics, Kind};
use super::rewrite::clean;
use super::tunnel;
use super::upload::{ClientFault, ReadAhead, Upload, UploadState, read_ahead};
use crate::model::{Reason, UseVerdict};
use crate::net::{DialError, DialOptions, Target, hyper_reason, proxy_authorization};
use crate::pool::Body;
use crate::pool::{
    Attempt, Conn, ConnKey, End, Lease, Rotated, Tried, Want, dial_failed, keeps_alive,
};
use crate::proxy::Proxy;

/// Names the upstream proxy (by id) on every forwarded answer.
pub const PROXY_HEADER: &str = "x-proxywarden-proxy";

/// Answers of a small HTML page are read whole before they are passed on,
/// so that a captcha or captive-portal page can be told from content; the
/// same size the pool's classifier looks at.
const CLASSIFY_MAX: u64 = 16 * 1024;

/// Why one attempt of a plain request got no answer.
enum Failure {
    /// The dial failed: whose fault that is, [`dial_failed`] says.
    Dial(DialError),
    /// The proxy failed before the request went: the proxy's fault.
    Proxy(Reason),
    /// The proxy failed once the request went: its fault, or the
    /// request's (one too large or odd for proxies closes or times out on
    /// every one of them alike).
    Sent(Reason),
}

/// Forwards an absolute-form request through a proxy per attempt.
pub(super) async fn plain(
    gw: Gateway,
    req: Request<Incoming>,
    controls: Controls,
) -> Response<Body> {
    let started = Instant::now();
    let metrics = gw.metrics();
    let s = gw.settings();
    let (mut parts, body) = req.into_parts();
    let host = parts.uri.host().unwrap_or_default().to_owned();
    let port = parts.uri.port_u16().unwrap_or(80);
    let target = match target(&host, port) {
        Ok(t) => t,
        Err(e) => {
            metrics.finished(Kind::Plain, "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_target", &e);
        }
    };
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    clean(&mut parts.headers);
    // The target's authority, whatever Host the client sent (RFC 9112
    // §3.2.2): the site must see the host the request is for.
    let authority = match parts.uri.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.clone(),
    };
    match HeaderValue::from_str(&authority) {
        Ok(v) => {
            parts.headers.insert(header::HOST, v);
        }
        Err(_) => {
            metrics.finished(Kind::Plain, "bad_request");
            return error(
                StatusCode::BAD_REQUEST,
                "bad_target",
                "the URL's host is not valid",
            );
        }
    }
    // A body small enough to send again is held; a larger one goes once.
    // What the client gets wrong in it is answered before a proxy is
    // chosen when it can be, and never charged to one.
    let deadline = started + s.timeout;
    let read = read_ahead(
        body,
        s.retry_body_max,
        s.header_timeout,
        deadline,
        gw.inner.metrics.clone(),
    );
    let (held, once) = match read.await {
        ReadAhead::Held(b) => (Some(b), None),
        ReadAhead::Streamed(upload, state) => (None, Some((upload, state))),
        ReadAhead::Fault(fault) => {
            metrics.finished(Kind::Plain, "bad_request");
            return client_fault(fault);
        }
    };
    let query = controls.query(&s.base);
    let site = tunnel::site(&target, 80);
    let want = Want {
        query: &query,
        session: controls.session.as_deref(),
        site: &site,
        https: false,
    };
    let mut forward = Forward {
        gw: &gw,
        target: &target,
        parts: &parts,
        path: &path,
        held,
        once,
        upload: None,
    };
    let rot = tunnel::rotation(&gw);
    let Rotated { end, attempts } = gw.pool().rotate(&want, &rot, &mut forward).await;
    drop(forward);
    let (resp, outcome) = finish(&gw, end, attempts, &target, &controls, started);
    metrics.finished(Kind::Plain, outcome);
    resp
}

/// The answer for the client of a plain request that ended so, and the
/// outcome counted.
fn finish(
    gw: &Gateway,
    end: End<Reply, ClientFault>,
    attempts: u32,
    target: &Target,
    controls: &Controls,
    started: Instant,
) -> (Response<Body>, &'static str) {
    let metrics = gw.metrics();
    match end {
        End::Answer(a) | End::Refused(a, _) => {
            let outcome = match a.verdict {
                UseVerdict::Blocked(_) => "blocked",
                _ => "ok",
            };
            metrics.added(started.elapsed().saturating_sub(a.latency));
            let (rparts, rbody, kept) = a.answer;
            let lease = a.lease.expect("the gateway never goes direct");
            (respond(gw, rparts, rbody, lease, kept), outcome)
        }
        End::NoProxy {
            last: Some(last), ..
        } => {
            // The last proxy's failure (or the site's refusal) is the
            // answer: there is no other proxy to try.
            let (resp, _) = finish(gw, *last, attempts, target, controls, started);
            (resp, "upstream_failed")
        }
        End::NoProxy { error, last: None } => (
            no_proxy(controls, Some(&tunnel::no_proxy_why(&error))),
            "no_proxy",
        ),
        End::Failed(reason) => (
            upstream_failed(reason, attempts as usize),
            "upstream_failed",
        ),
        End::Unreachable => (
            error(
                StatusCode::BAD_GATEWAY,
                "target_unreachable",
                &format!("proxies say {target} cannot be reached"),
            ),
            "upstream_failed",
        ),
        End::Alike { proxies, reason } => {
            tracing::debug!(%target, proxies, %reason, "proxies failed alike on one request; none charged");
            let cause = if reason == Reason::Timeout {
                "the site is the likely cause (slow or silent)"
            } else {
                "the request itself is the likely cause (too large or malformed for them)"
            };
            let message = format!(
                "{proxies} proxies failed alike ({reason}) on this request, so {cause}; none of \
                 them was charged"
            );
            (
                error(StatusCode::BAD_GATEWAY, "upstream_failed", &message),
                "upstream_failed",
            )
        }
        // Rate limits move on at once in the gateway: no wait is asked.
        End::RetryAfterTooLong(_) => (
            upstream_failed(Reason::BadStatus, attempts as usize),
            "upstream_failed",
        ),
        End::Stopped(fault) => (client_fault(fault), "bad_request"),
    }
}

/// A plain request, sent through one proxy at a time.
struct Forward<'a> {
    gw: &'a Gateway,
    target: &'a Target,
    parts: &'a Parts,
    path: &'a str,
    /// The body, held to be sent again.
    held: Option<Bytes>,
    /// A body too large to hold: it goes with the first attempt only,
    /// watched for the client's faults.
    once: Option<(Upload, Arc<UploadState>)>,
    /// The watch on a body that went.
    upload: Option<Arc<UploadState>>,
}

/// The site's answer to a plain request: its head, its body, and the
/// connection it came on when that may carry another request.
type Reply = (http::response::Parts, Answered, Option<Kept>);

/// The upstream connection an answer came on, kept once its body is read.
type Kept = Conn<Body>;

impl Attempt for Forward<'_> {
    type Answer = Reply;
    /// The client's body was at fault: no proxy is charged.
    type Stop = ClientFault;

    async fn attempt(&mut self, lease: Option<&Lease>) -> Result<Tried<Reply>, ClientFault> {
        let gw = self.gw;
        let last = self.held.is_none();
        let (lease, body): (&Lease, Body) = match (lease, &self.held, self.once.take()) {
            (Some(lease), Some(b), _) => {
                (lease, Full::new(b.clone()).map_err(|n| match n {}).boxed())
            }
            (Some(lease), None, Some((upload, state))) => {
                self.upload = Some(state);
                (lease, upload.boxed())
            }
            // Neither happens: the gateway never goes direct, and a body
            // sent once ends the request with its attempt.
            _ => return Ok(Tried::ended(UseVerdict::failed(Reason::ProtocolError))),
        };
        let sending = tokio::time::timeout(
            gw.settings().timeout,
            send(
                gw,
                lease,
                self.target,
                self.parts,
                self.path,
                body,
                self.held.as_ref(),
                self.upload.as_deref(),
            ),
        );
        let sent = match &self.upload {
            // The client's fault ends the attempt at once, whatever the
            // upstream was doing with the body.
            Some(state) => tokio::select! {
                sent = sending => match (sent, state.fault()) {
                    (Ok(Err(_)), Some(f)) => return Err(f),
                    (Ok(sent), _) => sent,
                    (Err(_), _) => match state.timed_out() {
                        Some(f) => return Err(f),
                        None => Err(Failure::Sent(Reason::Timeout)),
                    },
                },
                fault = state.faulted() => return Err(fault),
            },
            None => sending.await.unwrap_or(Err(Failure::Sent(Reason::Timeout))),
        };
        let tried = match sent {
            Err(Failure::Dial(e)) => dial_failed(e, true),
            Err(Failure::Proxy(reason)) => Tried::ended(UseVerdict::failed(reason)),
            Err(Failure::Sent(reason)) => {
                gw.pool().forwards().forget(lease.id());
                Tried::failed_after_sending(reason)
            }
            Ok((rparts, rbody, kept)) => {
                let forward = kept.forward;
                let kept = keeps_alive(&rparts).then_some(kept);
                let ((verdict, wait), rbody) = classify(gw, &rparts, rbody, forward).await;
                match verdict {
                    // A login wall or a portal is the proxy's, whatever
                    // was asked.
                    UseVerdict::ProxyFailed(Some(
                        Reason::ProxyAuthRequired | Reason::ContentMismatch,
                    )) => Tried::ended(verdict),
                    // A proxy's own 502/504, or its answer cut short.
                    UseVerdict::ProxyFailed(reason) => {
                        gw.pool().forwards().forget(lease.id());
                        Tried::failed_after_sending(reason.unwrap_or(Reason::ProtocolError))
                    }
                    _ => Tried::answered(verdict, (rparts, rbody, kept), wait),
                }
            }
        };
        Ok(Tried { last, ..tried })
    }

    async fn learnt(&mut self, lease: &Lease, verdict: UseVerdict) {
        tunnel::charged(self.gw, lease, verdict);
    }

    fn moved_on(&mut self) {
        self.gw.inner.metrics.retried();
    }
}

/// An answer's head and body, and the connection it came on.
type Answer = (http::response::Parts, Incoming, Kept);

/// Methods a request may be sent again with, if a kept connection turns
/// out closed as it goes (RFC 9110 §9.2.2).
fn idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

/// One attempt through the lease's proxy: on a kept-alive connection to it
/// when one is idle and the request can be sent again (`held`: its body,
/// kept), else on a new connection (to the proxy itself for HTTP proxies,
/// which get the absolute form; a tunnel to the target for SOCKS
/// proxies); the request, the answer's head. `upload` watches a body that
/// streams from the client, whose fault ends the upstream connection.
// Each argument is one part of the request as the attempt holds it; a
// struct gathering them would only be unpacked here.
#[allow(clippy::too_many_arguments)]
async fn send(
    gw: &Gateway,
    lease: &Lease,
    target: &Target,
    parts: &Parts,
    path: &str,
    body: Body,
    held: Option<&Bytes>,
    upload: Option<&UploadState>,
) -> Result<Answer, Failure> {
    let s = gw.settings();
    let proxy = lease.proxy();
    let key = ConnKey::forward(lease.id(), proxy, target);
    let forwards = gw.pool().forwards();
    if let Some(bytes) = held.filter(|_| idempotent(&parts.method))
        && let Some(mut kept) = forwards.reuse(&key, s.connect_timeout).await
    {
        let again = Full::new(bytes.clone()).map_err(|n| match n {}).boxed();
        let req = request(proxy, target, parts, path, again, kept.forward)?;
        match kept.sender.send_request(req).await {
            Ok(resp) => {
                let (rparts, rbody) = resp.into_parts();
                return Ok((rparts, rbody, kept));
            }
            // Closed by the proxy as the request went: no one's
            // fault; a new connection carries it.
            Err(e) if kept.closed_when_reused(&e) => {}
            Err(e) => return Err(Failure::Sent(hyper_reason(&e))),
        }
    }
    let opts = DialOptions {
        connect_timeout: s.connect_timeout,
        handshake_timeout: s.timeout,
        forward: true,
    };
    let dialed = lease.dial(target, &opts).await.map_err(Failure::Dial)?;
    // Its task ends once the sender is gone (the connection was not kept,
    // or left the idle set) and the answer's body is read, or at the
    // client's fault in the body it carries.
    let faulted = upload.map(UploadState::faulted_token);
    let mut conn = Conn::open(key, dialed.stream, dialed.forward, false, (), faulted)
        .await
        .map_err(|e| Failure::Proxy(hyper_reason(&e)))?;
    let req = request(proxy, target, parts, path, body, conn.forward)?;
    let resp = conn
        .sender
        .send_request(req)
        .await
        .map_err(|e| Failure::Sent(hyper_reason(&e)))?;
    let (rparts, rbody) = resp.into_parts();
    Ok((rparts, rbody, conn))
}

/// The request for the upstream: absolute-form for an HTTP proxy (with
/// its credentials), origin-form through a tunnel.
fn request(
    proxy: &Proxy,
    target: &Target,
    parts: &Parts,
    path: &str,
    body: Body,
    forward: bool,
) -> Result<Request<Body>, Failure> {
    let uri = if forward {
        format!("http://{target}{path}")
    } else {
        path.to_owned()
    };
    let mut req = Request::builder()
        .method(parts.method.clone())
        .uri(uri)
        .body(body)
        .map_err(|_| Failure::Proxy(Reason::ProtocolError))?;
    *req.headers_mut() = parts.headers.clone();
    if forward
        && let Some(auth) = proxy_authorization(proxy).and_then(|a| HeaderValue::from_str(&a).ok())
    {
        req.headers_mut().insert(header::PROXY_AUTHORIZATION, auth);
    }
    Ok(req)
}

/// An answer's body: as it streams, or read whole (small HTML pages, to
/// tell captcha and portal pages by their content).
enum Answered {
    Stream(Incoming),
    Whole(Bytes),
}

/// What the answer means for the proxy, by the pool's classifier.
async fn classify(
    gw: &Gateway,
    parts: &http::response::Parts,
    body: Incoming,
    forward: bool,
) -> ((UseVerdict, Option<Duration>), Answered) {
    let classifier = &gw.pool().options().classifier;
    let html = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.to_ascii_lowercase().contains("html"));
    let small = body.size_hint().upper().is_some_and(|n| n <= CLASSIFY_MAX);
    if html && small {
        match body.collect().await {
            Ok(b) => {
                let b = b.to_bytes();
                let class = classifier.classify(parts.status, &parts.headers, &b, forward, false);
                return (class, Answered::Whole(b));
            }
            Err(e) => {
                return (
                    (UseVerdict::failed(hyper_reason(&e)), None),
                    Answered::Whole(Bytes::new()),
                );
            }
        }
    }
    let class = classifier.classify(parts.status, &parts.headers, &[], forward, false);
    (class, Answered::Stream(body))
}

/// The answer for the client: hop-by-hop headers gone, the proxy named.
/// The connection it came on (`kept`) is kept for the next request once
/// the body has been read to its end.
fn respond(
    gw: &Gateway,
    mut parts: http::response::Parts,
    body: Answered,
    lease: Lease,
    kept: Option<Kept>,
) -> Response<Body> {
    let metrics = &gw.inner.metrics;
    clean(&mut parts.headers);
    parts
        .headers
        .insert(PROXY_HEADER, HeaderValue::from(lease.id()));
    let body = match body {
        Answered::Whole(b) => {
            metrics.received(b.len() as u64);
            if let Some(kept) = kept {
                gw.pool().forwards().put(kept);
            }
            Full::new(b).map_err(|n| match n {}).boxed()
        }
        // The lease (the proxy's in-flight slot) lives as long as the body.
        Answered::Stream(s) => Counted::received(s, gw.clone(), lease, kept).boxed(),
    };
    Response::from_parts(parts, body)
}

/// A body passed through while its bytes are counted; holds the lease
/// of the proxy carrying it until it is dropped.
struct Counted {
    inner: Incoming,
    metrics: Arc<GatewayMetrics>,
    received: bool,
    _lease: Option<Lease>,
    /// The upstream connection the body comes on, kept by the gateway once
    /// the body ends.
    kept: Option<(Gateway, Kept)>,
}

impl Counted {
    fn received(inner: Incoming, gw: Gateway, lease: Lease, kept: Option<Kept>) -> Counted {
        let mut body = Counted {
            inner,
            metrics: gw.inner.metrics.clone(),
            received: true,
            _lease: Some(lease),
            kept: kept.map(|k| (gw, k)),
        };
        // An empty body (HEAD, 204, 304) is never polled.
        if body.inner.is_end_stream() {
            body.ended();
        }
        body
    }

    /// The body was read to its end: its connection may carry another
    /// request.
    fn ended(&mut self) {
        if let Some((gw, kept)) = self.kept.take() {
            gw.pool().forwards().put(kept);
        }
    }
}

impl HttpBody for Counted {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let r = Pin::new(&mut this.inner).poll_frame(cx);
        match &r {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if this.received {
                        this.metrics.received(n);
                    } else {
                        this.metrics.sent(n);
                    }
                }
                if this.inner.is_end_stream() {
                    this.ended();
                }
            }
            Poll::Ready(None) => this.ended(),
            _ => {}
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
