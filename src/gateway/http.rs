//! The HTTP side of the gateway: absolute-form requests forwarded through
//! a proxy per request (retried on another when one fails or the site
//! blocks it), and CONNECT tunnels through a proxy per connection. Headers
//! are cleaned both ways; nothing about the client or the gateway is added.

use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::controls::{ControlError, Controls, HEADER_PREFIX, basic_credentials};
use super::head::Guarded;
use super::metrics::{GatewayMetrics, Kind};
use super::slots::{ConnState, Slot};
use super::tunnel::{self, TunnelError};
use super::upload::{ClientFault, ReadAhead, Upload, UploadState, read_ahead};
use super::upstream::{Body, Kept, Key, keeps_alive};
use super::{Gateway, TokenCheck};
use crate::model::{Reason, UseVerdict};
use crate::net::{DialError, DialOptions, Target, hyper_reason, proxy_authorization};
use crate::pool::{Attempt, End, Lease, Rotated, Tried, Want, dial_failed};
use crate::proxy::Proxy;

/// Names the upstream proxy (by id) on every forwarded answer.
pub const PROXY_HEADER: &str = "x-proxywarden-proxy";

/// Answers of a small HTML page are read whole before they are passed on,
/// so that a captcha or captive-portal page can be told from content; the
/// same size the pool's classifier looks at.
const CLASSIFY_MAX: u64 = 16 * 1024;

/// Serves HTTP on one client connection until it closes, goes quiet past
/// the header timeout, or the gateway stops. Request heads are held to
/// `gateway.max_header_size` by [`Guarded`].
pub(super) async fn serve(
    gw: &Gateway,
    stream: TcpStream,
    shutdown: &CancellationToken,
    slot: Arc<Slot>,
    tasks: &TaskTracker,
) {
    let s = gw.settings();
    let peer = stream.peer_addr().ok().map(|a| a.ip());
    let io = Guarded::new(stream, slot.conn.clone(), gw.metrics(), s.max_header_size);
    let (gw2, stop, tasks) = (gw.clone(), shutdown.clone(), tasks.clone());
    let service = hyper::service::service_fn(move |req| {
        let (gw, stop, slot, tasks) = (gw2.clone(), stop.clone(), slot.clone(), tasks.clone());
        slot.conn.busy();
        async move {
            let conn = slot.conn.clone();
            let resp = handle(gw, req, peer, stop, slot, tasks).await;
            Ok::<_, Infallible>(resp.map(|body| Answering { body, conn }.boxed()))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(s.header_timeout)
        .max_buf_size(s.max_header_size)
        // The backstop for heads the guard did not count (pipelined).
        .max_header_size(s.max_header_size)
        .serve_connection(TokioIo::new(io), service)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        result = conn.as_mut() => {
            // A head hyper could not parse got its 400 (or 431, 414) from
            // hyper, before any proxy was chosen.
            if let Err(e) = result
                && (e.is_parse() || e.is_parse_too_large())
            {
                tracing::debug!(error = %e, "malformed gateway request head");
                gw.metrics().finished(Kind::Plain, "bad_request");
            }
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// An answer's body on its way to the client; once it is sent (and
/// dropped) the connection waits for its next head.
struct Answering {
    body: Body,
    conn: Arc<ConnState>,
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.conn.waiting();
    }
}

impl HttpBody for Answering {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

async fn handle(
    gw: Gateway,
    mut req: Request<Incoming>,
    peer: Option<IpAddr>,
    shutdown: CancellationToken,
    slot: Arc<Slot>,
    tasks: TaskTracker,
) -> Response<Body> {
    let kind = if req.method() == Method::CONNECT {
        Kind::Connect
    } else {
        Kind::Plain
    };
    let metrics = gw.metrics();
    let credentials = req
        .headers()
        .get(header::PROXY_AUTHORIZATION)
        .and_then(|v| basic_credentials(v.as_bytes()));
    let (user, pass) = match &credentials {
        Some((u, p)) => (u.as_str(), Some(p.as_str())),
        None => ("", None),
    };
    let check = gw.check_token(peer, pass);
    if let TokenCheck::Locked(wait) = check {
        metrics.finished(kind, "denied");
        let mut resp = error(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            &format!(
                "too many wrong tokens from this address (more than {} a minute); try again in {} s",
                crate::auth::FAILURES_PER_MINUTE,
                wait.as_secs() + 1
            ),
        );
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(wait.as_secs() + 1));
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    if check == TokenCheck::Refused {
        metrics.finished(kind, "denied");
        let mut resp = error(
            StatusCode::PROXY_AUTHENTICATION_REQUIRED,
            "auth_required",
            "this gateway needs its token as the proxy password (http://user:TOKEN@host:port, or country-de:TOKEN@ with controls)",
        );
        resp.headers_mut().insert(
            header::PROXY_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"proxywarden\""),
        );
        // A client without the token does not keep its connection: it
        // asks again on a new one, which has the header timeout to do so.
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return resp;
    }
    slot.conn.authenticated();
    let controls = match controls(user, req.headers(), kind == Kind::Plain) {
        Ok(c) => c,
        Err(e) => {
            metrics.finished(kind, "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_control", &e.to_string());
        }
    };
    if kind == Kind::Connect {
        return connect(gw, &mut req, controls, shutdown, slot, tasks).await;
    }
    match req.uri().scheme_str() {
        Some("http") if req.uri().host().is_some() => plain(gw, req, controls).await,
        Some("https") => {
            metrics.finished(kind, "bad_request");
            error(
                StatusCode::BAD_REQUEST,
                "use_connect",
                "https URLs go through CONNECT (the gateway never sees inside TLS); use the gateway as an HTTPS proxy",
            )
        }
        _ => {
            metrics.finished(kind, "bad_request");
            error(
                StatusCode::BAD_REQUEST,
                "not_a_proxy_request",
                "this is proxywarden's gateway, a forward proxy: send absolute-form requests (http://host/path) or CONNECT, e.g. curl -x http://127.0.0.1:8081 http://example.com/",
            )
        }
    }
}

/// The controls of a request: from the proxy username, then (plain HTTP
/// only) from `X-Proxywarden-*` headers, which win.
fn controls(user: &str, headers: &HeaderMap, plain: bool) -> Result<Controls, ControlError> {
    let mut c = Controls::from_username(user)?;
    if plain {
        let mut seen = Vec::new();
        for (name, value) in headers {
            if let Some(key) = name.as_str().strip_prefix(HEADER_PREFIX) {
                if seen.contains(&key) {
                    return Err(ControlError::Twice(name.as_str().to_owned()));
                }
                seen.push(key);
                let value = value.to_str().map_err(|_| ControlError::Value {
                    key: "header",
                    value: name.as_str().to_owned(),
                    expected: "a value in plain ASCII".to_owned(),
                })?;
                c.set(key, value)?;
            }
        }
    }
    Ok(c)
}

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
async fn plain(gw: Gateway, req: Request<Incoming>, controls: Controls) -> Response<Body> {
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
                gw.inner.upstreams.forget(lease.id());
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
                        gw.inner.upstreams.forget(lease.id());
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
    let key = Key::new(lease.id(), proxy, target);
    if let Some(bytes) = held.filter(|_| idempotent(&parts.method)) {
        while let Some(mut kept) = gw.inner.upstreams.take(&key) {
            // Ready at once unless the proxy closed it meanwhile.
            match tokio::time::timeout(s.connect_timeout, kept.sender.ready()).await {
                Ok(Ok(())) => {}
                _ => continue,
            }
            let again = Full::new(bytes.clone()).map_err(|n| match n {}).boxed();
            let req = request(proxy, target, parts, path, again, kept.forward)?;
            match kept.sender.send_request(req).await {
                Ok(resp) => {
                    let (rparts, rbody) = resp.into_parts();
                    return Ok((rparts, rbody, kept));
                }
                // Closed by the proxy as the request went: no one's
                // fault; a new connection carries it.
                Err(_) => break,
            }
        }
    }
    let opts = DialOptions {
        connect_timeout: s.connect_timeout,
        handshake_timeout: s.timeout,
        forward: true,
    };
    let dialed = lease.dial(target, &opts).await.map_err(Failure::Dial)?;
    let forward = dialed.forward;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(dialed.stream))
        .await
        .map_err(|e| Failure::Proxy(hyper_reason(&e)))?;
    // Ends once the sender is gone (the connection was not kept, or left
    // the idle set) and the answer's body is read, or at the client's
    // fault in the body it carries.
    let faulted = upload.map(UploadState::faulted_token);
    tokio::spawn(async move {
        match faulted {
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
    let req = request(proxy, target, parts, path, body, forward)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| Failure::Sent(hyper_reason(&e)))?;
    let (rparts, rbody) = resp.into_parts();
    Ok((
        rparts,
        rbody,
        Kept {
            key,
            sender,
            forward,
        },
    ))
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
                gw.inner.upstreams.put(kept);
            }
            Full::new(b).map_err(|n| match n {}).boxed()
        }
        // The lease (the proxy's in-flight slot) lives as long as the body.
        Answered::Stream(s) => Counted::received(s, gw.clone(), lease, kept).boxed(),
    };
    Response::from_parts(parts, body)
}

/// Opens a tunnel for CONNECT, answers 200 once it is up and relays the
/// upgraded connection in a task of its own.
async fn connect(
    gw: Gateway,
    req: &mut Request<Incoming>,
    controls: Controls,
    shutdown: CancellationToken,
    slot: Arc<Slot>,
    tasks: TaskTracker,
) -> Response<Body> {
    let started = Instant::now();
    let metrics = gw.metrics();
    let target = match req.uri().authority() {
        Some(a) => match a.port_u16() {
            Some(port) => target(a.host(), port),
            None => Err(format!("CONNECT needs host:port, not {a:?}")),
        },
        None => Err("CONNECT needs host:port".to_owned()),
    };
    let target = match target {
        Ok(t) => t,
        Err(e) => {
            metrics.finished(Kind::Connect, "bad_request");
            return error(StatusCode::BAD_REQUEST, "bad_target", &e);
        }
    };
    match tunnel::open(&gw, &controls, &target).await {
        Ok(opened) => {
            slot.conn.tunnel();
            metrics.added(started.elapsed().saturating_sub(opened.dial));
            metrics.finished(Kind::Connect, "ok");
            let upgrade = hyper::upgrade::on(req);
            let idle = gw.settings().idle_timeout;
            tasks.spawn(async move {
                if let Ok(client) = upgrade.await {
                    tunnel::relay(&gw, TokioIo::new(client), opened.stream, idle, &shutdown).await;
                }
                drop(opened.lease);
                drop(slot);
            });
            Response::new(Full::new(Bytes::new()).map_err(|n| match n {}).boxed())
        }
        Err(TunnelError::NoProxy(why)) => {
            metrics.finished(Kind::Connect, "no_proxy");
            no_proxy(&controls, Some(&why))
        }
        Err(TunnelError::Unreachable) => {
            metrics.finished(Kind::Connect, "target_unreachable");
            error(
                StatusCode::BAD_GATEWAY,
                "target_unreachable",
                &format!("proxies say {target} cannot be reached"),
            )
        }
        Err(TunnelError::Failed(reason)) => {
            metrics.finished(Kind::Connect, "upstream_failed");
            upstream_failed(reason, 0)
        }
    }
}

/// A client's target: a valid host and a port other than 0 (no server
/// listens there; a proxy would fail on it and be blamed).
pub(super) fn target(host: &str, port: u16) -> Result<Target, String> {
    if port == 0 {
        return Err(format!(
            "port 0 of {host} cannot be reached; name a port from 1 to 65535"
        ));
    }
    Target::new(host, port).map_err(|e| e.to_string())
}

/// Removes hop-by-hop headers (those `Connection` names too), every
/// `Proxy-*` header and the gateway's own controls.
fn clean(headers: &mut HeaderMap) {
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

/// The header that repeats an error's code and message: clients show the
/// head of a failed CONNECT (`curl -v`) but never its body.
pub const ERROR_HEADER: &str = "x-proxywarden-error";

/// A JSON error in the API's envelope, its code and message repeated in
/// [`ERROR_HEADER`].
fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({ "error": { "code": code, "message": message } }).to_string();
    let mut resp = Response::new(Full::new(Bytes::from(body)).map_err(|n| match n {}).boxed());
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Ok(value) = HeaderValue::from_str(&header_text(&format!("{code}: {message}"))) {
        resp.headers_mut().insert(ERROR_HEADER, value);
    }
    resp
}

/// `text` as a header value: printable ASCII (anything else, a name from
/// the request included, becomes `?`), at most 512 bytes.
fn header_text(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c == ' ' || c.is_ascii_graphic() {
                c
            } else {
                '?'
            }
        })
        .take(512)
        .collect()
}

/// The answer for a client whose request body was at fault.
fn client_fault(fault: ClientFault) -> Response<Body> {
    let mut resp = match fault {
        ClientFault::Malformed => error(
            StatusCode::BAD_REQUEST,
            "bad_body",
            "the request body is malformed (its chunked framing or length is broken); no proxy was tried or charged",
        ),
        ClientFault::Stalled => error(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            "the request body stopped arriving (gateway.header_timeout between its bytes, gateway.timeout in all); no proxy was charged",
        ),
    };
    // What is left of the body is not worth reading.
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

fn no_proxy(controls: &Controls, why: Option<&str>) -> Response<Body> {
    let wanted = if *controls == Controls::default() {
        String::new()
    } else {
        format!(" ({})", describe(controls))
    };
    let why = why.map(|w| format!(" ({w})")).unwrap_or_default();
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "no_proxy",
        &format!(
            "no working proxy can take this request{wanted} right now{why}; the gateway never connects directly"
        ),
    )
}

fn upstream_failed(reason: Reason, tried: usize) -> Response<Body> {
    let tried = if tried > 0 {
        format!(" after trying {tried} proxies")
    } else {
        String::new()
    };
    error(
        StatusCode::BAD_GATEWAY,
        "upstream_failed",
        &format!("the upstream proxy failed ({reason}){tried}"),
    )
}

/// The filters asked for, as the username would spell them.
fn describe(c: &Controls) -> String {
    let mut parts = Vec::new();
    if !c.countries.is_empty() {
        let list: Vec<&str> = c.countries.iter().map(|c| c.as_str()).collect();
        parts.push(format!("country {}", list.join(",")));
    }
    if !c.schemes.is_empty() {
        let list: Vec<&str> = c.schemes.iter().map(|s| s.as_str()).collect();
        parts.push(format!("scheme {}", list.join(",")));
    }
    if let Some(a) = c.min_anonymity {
        parts.push(format!("anonymity {a}"));
    }
    if let Some(ms) = c.max_latency_ms {
        parts.push(format!("latency ≤ {ms} ms"));
    }
    if let Some(s) = &c.session {
        parts.push(format!("session {s}"));
    }
    parts.join(", ")
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
            gw.inner.upstreams.put(kept);
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

#[cfg(test)]
mod tests {
    use super::*;

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
