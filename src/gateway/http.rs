//! The HTTP side of the gateway: a client connection served, its requests
//! authenticated and sent on (absolute-form requests to [`super::forward`],
//! CONNECT to a tunnel through a proxy per connection), and the errors the
//! gateway answers with itself.

use std::convert::Infallible;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::controls::{Controls, basic_credentials, describe};
use super::forward;
use super::head::Guarded;
use super::metrics::Kind;
use super::slots::{ConnState, Slot};
use super::tunnel::{self, TunnelError};
use super::upload::ClientFault;
use super::{Gateway, TokenCheck};
use crate::model::Reason;
use crate::net::Target;
use crate::pool::Body;

/// Serves HTTP on one client connection (from `peer`) until it closes,
/// goes quiet past the header timeout, or the gateway stops. Request heads
/// are held to `gateway.max_header_size` by [`Guarded`].
pub(super) async fn serve(
    gw: &Gateway,
    stream: TcpStream,
    peer: IpAddr,
    shutdown: &CancellationToken,
    slot: Arc<Slot>,
    tasks: &TaskTracker,
) {
    let s = gw.settings();
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
    peer: IpAddr,
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
    let check = gw.check_token(Some(peer), pass);
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
    let controls = match Controls::of_request(user, req.headers(), kind == Kind::Plain) {
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
        Some("http") if req.uri().host().is_some() => forward::plain(gw, req, controls).await,
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

/// The header that repeats an error's code and message: clients show the
/// head of a failed CONNECT (`curl -v`) but never its body.
pub const ERROR_HEADER: &str = "x-proxywarden-error";

/// A JSON error in the API's envelope, its code and message repeated in
/// [`ERROR_HEADER`].
pub(super) fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
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
pub(super) fn client_fault(fault: ClientFault) -> Response<Body> {
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

pub(super) fn no_proxy(controls: &Controls, why: Option<&str>) -> Response<Body> {
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

pub(super) fn upstream_failed(reason: Reason, tried: usize) -> Response<Body> {
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
