//! Serving the router over TCP with the limits a public port needs and
//! `axum::serve` does not set: a time limit on request heads, closing
//! connections that go quiet, and a cap on open connections that makes room
//! by closing the quietest idle one, so that silent or slow clients can
//! neither hold sockets for ever nor lock out `/healthz`. A connection just
//! opened is given time to send its request before it can be closed for
//! room; when nothing can make room, the new one is answered 503 with
//! `Retry-After` rather than dropped.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt;

use crate::config::ApiConfig;

/// The largest request head hyper buffers; larger heads are refused by
/// hyper itself (431, no body). The API's own, smaller limits answer in the
/// JSON envelope below this.
const MAX_HEAD: usize = 256 * 1024;

/// The most header fields hyper parses; more are refused by hyper itself
/// (431, no body). Above the API's own limit ([`super::MAX_HEADERS`]), so
/// that a request just over that is answered in the JSON envelope; hyper
/// then keeps the headers on the heap, a small cost per request.
const HYPER_MAX_HEADERS: usize = 512;

/// How long a new connection is safe from being closed to make room for
/// another: time to send its first request. A burst of clients larger than
/// `api.max_connections` would otherwise close each other's connections
/// before their requests were read; after it, a connection that has sent
/// no complete request is a slow or silent one, and may go.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// Over-limit connections being answered 503 at once; more are closed
/// without an answer.
const MAX_REFUSING: usize = 64;

/// How long an over-limit connection's request is read (and discarded)
/// after its 503, so that closing it does not reset the answer away.
const REFUSAL_LINGER: Duration = Duration::from_millis(500);

/// The connection limits, from `[api]`.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Time allowed for a request head (`api.header_timeout`).
    pub header_timeout: Duration,
    /// Quiet time after which a connection is closed (`api.idle_timeout`).
    pub idle_timeout: Duration,
    /// Open connections at most (`api.max_connections`).
    pub max_connections: usize,
}

impl From<&ApiConfig> for Limits {
    fn from(api: &ApiConfig) -> Limits {
        Limits {
            header_timeout: api.header_timeout,
            idle_timeout: api.idle_timeout,
            max_connections: api.max_connections,
        }
    }
}

/// What the server knows of one open connection.
struct Open {
    /// Requests of it being handled now (0 or 1 for HTTP/1).
    busy: Arc<AtomicUsize>,
    /// True until its first request's head has been read.
    fresh: Arc<AtomicBool>,
    /// When it was accepted, in milliseconds since the server started.
    opened: u64,
    /// When a byte last moved, in milliseconds since the server started.
    last: Arc<AtomicU64>,
    /// Closes it.
    close: CancellationToken,
}

/// The open connections, by id.
#[derive(Default)]
struct Registry {
    next: u64,
    open: HashMap<u64, Open>,
}

/// What a connection's task needs of its registry entry.
struct Handles {
    id: u64,
    busy: Arc<AtomicUsize>,
    fresh: Arc<AtomicBool>,
    last: Arc<AtomicU64>,
    close: CancellationToken,
}

impl Registry {
    /// Registers a new connection, first closing one to make room if the
    /// cap is reached: the quietest of those idle between requests, else
    /// the oldest of those that have sent no request within
    /// [`FIRST_REQUEST_GRACE`]. A request being handled, or a connection
    /// still in its grace, is never closed: `None` then, and the new one
    /// is refused.
    fn admit(&mut self, max: usize, now: u64) -> Option<Handles> {
        if self.open.len() >= max {
            let idle = |c: &Open| c.busy.load(Ordering::Relaxed) == 0;
            let fresh = |c: &Open| c.fresh.load(Ordering::Relaxed);
            let grace = FIRST_REQUEST_GRACE.as_millis() as u64;
            let between_requests = self
                .open
                .iter()
                .filter(|(_, c)| idle(c) && !fresh(c))
                .min_by_key(|(id, c)| (c.last.load(Ordering::Relaxed), **id))
                .map(|(id, _)| *id);
            let victim = between_requests.or_else(|| {
                self.open
                    .iter()
                    .filter(|(_, c)| idle(c) && fresh(c) && now.saturating_sub(c.opened) >= grace)
                    .min_by_key(|(id, c)| (c.opened, **id))
                    .map(|(id, _)| *id)
            })?;
            if let Some(c) = self.open.remove(&victim) {
                c.close.cancel();
            }
        }
        let id = self.next;
        self.next += 1;
        let open = Open {
            busy: Arc::default(),
            fresh: Arc::new(AtomicBool::new(true)),
            opened: now,
            last: Arc::new(AtomicU64::new(now)),
            close: CancellationToken::new(),
        };
        let handles = Handles {
            id,
            busy: open.busy.clone(),
            fresh: open.fresh.clone(),
            last: open.last.clone(),
            close: open.close.clone(),
        };
        self.open.insert(id, open);
        Some(handles)
    }
}

/// The `503` an over-limit connection gets.
fn refusal(max: usize) -> String {
    let body = serde_json::json!({"error": {
        "code": "busy",
        "message": format!(
            "the API has its api.max_connections ({max}) connections open, each serving a \
             request or just opened; try again in a second"
        ),
    }})
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         retry-after: 1\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Answers an over-limit connection `503` with `Retry-After` and closes
/// it: its request is read for a moment and discarded, so that the close
/// does not reset the answer before the client has read it.
async fn refuse(mut stream: TcpStream, max: usize) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let answered = async {
        stream.write_all(refusal(max).as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 4096];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_LINGER, answered).await;
}

/// Answers an over-limit connection `503` beyond those being answered
/// with a linger: without waiting, what its client sent so far is read
/// and the answer written into the socket's buffer (a fresh socket's
/// buffer takes it whole), then the sending side is closed. Only a client
/// still sending after that can miss it.
fn refuse_at_once(stream: TcpStream, max: usize) {
    let mut sink = [0u8; 4096];
    while matches!(stream.try_read(&mut sink), Ok(n) if n > 0) {}
    let _ = stream.try_write(refusal(max).as_bytes());
    if let Ok(std) = stream.into_std() {
        let _ = std.shutdown(std::net::Shutdown::Write);
        while matches!(std::io::Read::read(&mut &std, &mut sink), Ok(n) if n > 0) {}
    }
}

/// Serves `app` on `listener` with `limits` until `shutdown` is cancelled,
/// then lets requests in flight finish and returns once every connection
/// has closed.
pub async fn run(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    shutdown: CancellationToken,
) -> io::Result<()> {
    let started = Instant::now();
    let registry: Arc<Mutex<Registry>> = Arc::default();
    let tasks = TaskTracker::new();
    let refusing = Arc::new(tokio::sync::Semaphore::new(MAX_REFUSING));
    loop {
        let Some((stream, peer)) = crate::net::accept(&listener, &shutdown, "an API").await else {
            break;
        };
        let now = started.elapsed().as_millis() as u64;
        let admitted = registry
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .admit(limits.max_connections, now);
        let Some(Handles {
            id,
            busy,
            fresh,
            last,
            close,
        }) = admitted
        else {
            tracing::debug!(%peer, "every API connection is busy; refusing one");
            if let Ok(permit) = refusing.clone().try_acquire_owned() {
                let max = limits.max_connections;
                tasks.spawn(async move {
                    refuse(stream, max).await;
                    drop(permit);
                });
            } else {
                refuse_at_once(stream, limits.max_connections);
            }
            continue;
        };
        let conn = Connection {
            app: app.clone(),
            peer,
            limits,
            started,
            busy,
            fresh,
            last,
            close,
            shutdown: shutdown.clone(),
        };
        let registry = registry.clone();
        tasks.spawn(async move {
            conn.serve(stream).await;
            registry
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .open
                .remove(&id);
        });
    }
    tasks.close();
    tasks.wait().await;
    Ok(())
}

/// One accepted connection and what it needs.
struct Connection {
    app: Router,
    peer: SocketAddr,
    limits: Limits,
    started: Instant,
    busy: Arc<AtomicUsize>,
    fresh: Arc<AtomicBool>,
    last: Arc<AtomicU64>,
    close: CancellationToken,
    shutdown: CancellationToken,
}

impl Connection {
    async fn serve(self, stream: TcpStream) {
        let io = TokioIo::new(Watched {
            inner: stream,
            started: self.started,
            last: self.last.clone(),
        });
        let (app, peer, busy) = (self.app.clone(), self.peer, self.busy.clone());
        let fresh = self.fresh.clone();
        let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(peer));
            let busy = Busy::start(busy.clone());
            fresh.store(false, Ordering::Relaxed);
            let app = app.clone();
            async move {
                let resp = app.oneshot(req).await;
                drop(busy);
                resp
            }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout)
            .max_buf_size(MAX_HEAD)
            .max_headers(HYPER_MAX_HEADERS)
            .serve_connection(io, service);
        tokio::pin!(conn);
        let idle = self.limits.idle_timeout;
        let mut watch = tokio::time::interval((idle / 4).max(Duration::from_millis(10)));
        watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut draining = false;
        loop {
            tokio::select! {
                result = conn.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!(peer = %self.peer, error = %e, "API connection ended");
                    }
                    return;
                }
                // Closed to make room for a new connection.
                _ = self.close.cancelled() => return,
                _ = self.shutdown.cancelled(), if !draining => {
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                }
                _ = watch.tick() => {
                    let now = self.started.elapsed().as_millis() as u64;
                    let quiet = now.saturating_sub(self.last.load(Ordering::Relaxed));
                    if self.busy.load(Ordering::Relaxed) == 0 && quiet >= idle.as_millis() as u64 {
                        tracing::debug!(peer = %self.peer, "closing a quiet API connection");
                        return;
                    }
                }
            }
        }
    }
}

/// Counts a request as being handled until dropped.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn start(count: Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::Relaxed);
        Busy(count)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream that notes when a byte last moved either way.
struct Watched {
    inner: TcpStream,
    started: Instant,
    last: Arc<AtomicU64>,
}

impl Watched {
    fn moved(&self) {
        self.last
            .store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.moved();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.moved();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
