//! A client's request body on its way to an upstream: read ahead (whole
//! when small enough to send again), then streamed, watched for the
//! client's own faults — framing it got wrong, or a body that stalls — so
//! that they are answered to the client and never charged to a proxy.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use super::metrics::GatewayMetrics;

/// What the client did wrong with its body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ClientFault {
    /// Its framing (chunk sizes, extensions, the length) is broken.
    Malformed,
    /// It stopped sending before the end, or sent too slowly to finish in
    /// time.
    Stalled,
}

/// A body as read ahead before any proxy is chosen.
pub(super) enum ReadAhead {
    /// Read to its end: small enough to send again on another proxy.
    Held(Bytes),
    /// Too large to hold: what was read and the rest, to go once.
    Streamed(Upload, Arc<UploadState>),
    /// The client got it wrong before any proxy was involved.
    Fault(ClientFault),
}

/// Reads `body` ahead up to `max` bytes: each frame within `idle` of the
/// one before and all of it by `deadline`. A body of a known length over
/// `max` is not read ahead.
pub(super) async fn read_ahead(
    mut body: Incoming,
    max: usize,
    idle: Duration,
    deadline: Instant,
    metrics: Arc<GatewayMetrics>,
) -> ReadAhead {
    if body.is_end_stream() {
        return ReadAhead::Held(Bytes::new());
    }
    let mut read = BytesMut::new();
    if body.size_hint().lower() <= max as u64 {
        loop {
            let next = tokio::time::timeout_at(deadline.min(Instant::now() + idle), body.frame());
            match next.await {
                Err(_) => return ReadAhead::Fault(ClientFault::Stalled),
                Ok(Some(Err(_))) => return ReadAhead::Fault(ClientFault::Malformed),
                // Trailers are not passed on (nor announced: `TE` goes).
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        read.extend_from_slice(&data);
                    }
                }
                Ok(None) => break,
            }
            if body.is_end_stream() {
                break;
            }
            if read.len() > max {
                let state = Arc::new(UploadState::default());
                let upload = Upload::new(Some(read.freeze()), body, metrics, &state, idle);
                return ReadAhead::Streamed(upload, state);
            }
        }
        metrics.sent(read.len() as u64);
        return ReadAhead::Held(read.freeze());
    }
    let state = Arc::new(UploadState::default());
    ReadAhead::Streamed(Upload::new(None, body, metrics, &state, idle), state)
}

/// What an [`Upload`] saw of its client, for the attempt carrying it.
#[derive(Debug, Default)]
pub(super) struct UploadState {
    /// 0: none yet; else a [`ClientFault`] (1 malformed, 2 stalled).
    fault: AtomicU8,
    /// The body was read to its end.
    ended: AtomicBool,
    /// The last poll waited on the client (not on the upstream).
    waiting: AtomicBool,
    /// Cancelled at the client's fault: the attempt and the upstream
    /// connection carrying the body stop.
    faulted: CancellationToken,
}

impl UploadState {
    /// The client's fault, if it made one.
    pub(super) fn fault(&self) -> Option<ClientFault> {
        match self.fault.load(Ordering::Acquire) {
            1 => Some(ClientFault::Malformed),
            2 => Some(ClientFault::Stalled),
            _ => None,
        }
    }

    /// Resolves once the client made a fault.
    pub(super) async fn faulted(&self) -> ClientFault {
        self.faulted.cancelled().await;
        self.fault().unwrap_or(ClientFault::Stalled)
    }

    /// Whose a timeout of the attempt carrying the body is: the client's
    /// when its body was still being waited for (too slow to finish in
    /// time), and then the body stops.
    pub(super) fn timed_out(&self) -> Option<ClientFault> {
        if !self.ended.load(Ordering::Acquire) && self.waiting.load(Ordering::Acquire) {
            self.set(ClientFault::Stalled);
        }
        self.fault()
    }

    /// Cancelled at the client's fault.
    pub(super) fn faulted_token(&self) -> CancellationToken {
        self.faulted.clone()
    }

    fn set(&self, fault: ClientFault) {
        let code = match fault {
            ClientFault::Malformed => 1,
            ClientFault::Stalled => 2,
        };
        let _ = self
            .fault
            .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
        self.faulted.cancel();
    }
}

/// A client's body streamed to an upstream, its bytes counted as sent. A
/// frame the client does not send within `idle` of the one before marks
/// the body stalled; it is then never ended, and the attempt gives up.
pub(super) struct Upload {
    prefix: Option<Bytes>,
    inner: Incoming,
    metrics: Arc<GatewayMetrics>,
    state: Arc<UploadState>,
    idle: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl Upload {
    fn new(
        prefix: Option<Bytes>,
        inner: Incoming,
        metrics: Arc<GatewayMetrics>,
        state: &Arc<UploadState>,
        idle: Duration,
    ) -> Upload {
        Upload {
            prefix,
            inner,
            metrics,
            state: state.clone(),
            idle,
            timer: None,
        }
    }
}

impl HttpBody for Upload {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take() {
            this.metrics.sent(prefix.len() as u64);
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        if this.state.fault().is_some() {
            // Its connection is being dropped (`faulted`).
            return Poll::Pending;
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.timer = None;
                this.state.waiting.store(false, Ordering::Release);
                if let Some(data) = frame.data_ref() {
                    this.metrics.sent(data.len() as u64);
                }
                if this.inner.is_end_stream() {
                    this.state.ended.store(true, Ordering::Release);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                this.state.set(ClientFault::Malformed);
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.state.ended.store(true, Ordering::Release);
                Poll::Ready(None)
            }
            Poll::Pending => {
                this.state.waiting.store(true, Ordering::Release);
                let idle = this.idle;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
                if timer.as_mut().poll(cx).is_ready() {
                    this.state.set(ClientFault::Stalled);
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let hint = self.inner.size_hint();
        let Some(prefix) = &self.prefix else {
            return hint;
        };
        let n = prefix.len() as u64;
        let mut out = SizeHint::new();
        out.set_lower(hint.lower() + n);
        if let Some(upper) = hint.upper() {
            out.set_upper(upper + n);
        }
        out
    }
}
