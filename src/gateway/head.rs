//! `gateway.max_header_size`, held exactly: the client's stream as hyper
//! reads it, with each request head counted from its first byte to the
//! empty line that ends it. A head that would pass the limit is answered
//! `431` in the JSON envelope here, before hyper has parsed it, so no
//! upstream is ever chosen for it and no proxy can be blamed for it.
//! hyper's own limit, set to the same size, is the backstop for heads a
//! client pipelined behind another (already buffered); those get hyper's
//! bodiless `431`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

use super::metrics::{GatewayMetrics, Kind};
use super::slots::ConnState;

/// How long the rest of an oversized head is read (and discarded) after
/// the `431`, so that closing the connection does not reset the answer
/// away before the client has read it.
const LINGER: Duration = Duration::from_millis(500);

/// How much of an oversized head is discarded at most while lingering.
const LINGER_BYTES: usize = 4 * 1024 * 1024;

/// Where the count of the current head stands.
#[derive(Debug, Default)]
struct Count {
    /// Which head (see [`ConnState::head`]).
    head: u64,
    /// Bytes of it so far.
    bytes: usize,
    /// Bytes in the current line, CR left out.
    line: usize,
    /// A byte other than CR or LF was seen: empty lines before a request
    /// line do not end a head.
    started: bool,
    /// The empty line was seen: the head is complete.
    ended: bool,
}

impl Count {
    /// Counts `data` as the next bytes of the head; false when the head
    /// has passed `max` bytes without ending (or reached it with more to
    /// come, which hyper would refuse).
    fn feed(&mut self, data: &[u8], max: usize) -> bool {
        for &b in data {
            if self.ended {
                return true;
            }
            self.bytes += 1;
            match b {
                b'\n' if self.started && self.line == 0 => self.ended = true,
                b'\n' => self.line = 0,
                b'\r' => {}
                _ => {
                    self.line += 1;
                    self.started = true;
                }
            }
            if !self.ended && self.bytes >= max {
                return false;
            }
        }
        true
    }
}

/// An oversized head being answered.
struct Refusal {
    answer: Vec<u8>,
    written: usize,
    shut: bool,
    drained: usize,
    linger: Pin<Box<Sleep>>,
}

/// A client stream whose request heads are held to a size.
pub(super) struct Guarded<S> {
    inner: S,
    conn: Arc<ConnState>,
    metrics: Arc<GatewayMetrics>,
    max: usize,
    count: Count,
    refusal: Option<Refusal>,
}

impl<S> Guarded<S> {
    /// `inner`, its heads held to `max` bytes while `conn` waits for one.
    pub fn new(
        inner: S,
        conn: Arc<ConnState>,
        metrics: Arc<GatewayMetrics>,
        max: usize,
    ) -> Guarded<S> {
        Guarded {
            inner,
            conn,
            metrics,
            max,
            count: Count::default(),
            refusal: None,
        }
    }
}

/// The `431` in the API's envelope.
fn answer(max: usize) -> Vec<u8> {
    let body = serde_json::json!({"error": {
        "code": "headers_too_large",
        "message": format!(
            "the request head is larger than gateway.max_header_size ({max} bytes); \
             send fewer or shorter headers"
        ),
    }})
    .to_string();
    let mut out = format!(
        "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body.as_bytes());
    out
}

impl<S: AsyncRead + AsyncWrite + Unpin> Guarded<S> {
    /// Writes the `431`, closes the sending side, reads what the client
    /// still sends for a moment, then ends the connection with an error.
    fn poll_refuse(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = self.refusal.as_mut().expect("refusing");
        while r.written < r.answer.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &r.answer[r.written..])) {
                Ok(0) | Err(_) => return Poll::Ready(Err(too_large())),
                Ok(n) => r.written += n,
            }
        }
        if !r.shut {
            if ready!(Pin::new(&mut self.inner).poll_shutdown(cx)).is_err() {
                return Poll::Ready(Err(too_large()));
            }
            r.shut = true;
        }
        let mut scratch = [0u8; 4096];
        while r.drained < LINGER_BYTES {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => r.drained += buf.filled().len(),
                Poll::Ready(_) => break,
                Poll::Pending => {
                    if r.linger.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    break;
                }
            }
        }
        Poll::Ready(Err(too_large()))
    }
}

fn too_large() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "request head too large")
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.refusal.is_some() {
            return this.poll_refuse(cx);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if !this.conn.is_waiting() {
            return Poll::Ready(Ok(()));
        }
        let head = this.conn.head();
        if this.count.head != head {
            this.count = Count {
                head,
                ..Count::default()
            };
        }
        if this.count.feed(&buf.filled()[before..], this.max) {
            return Poll::Ready(Ok(()));
        }
        // hyper never sees the head: nothing is parsed, nothing chosen.
        buf.set_filled(before);
        this.metrics.finished(Kind::Plain, "too_large");
        tracing::debug!(max = this.max, "gateway request head too large");
        this.refusal = Some(Refusal {
            answer: answer(this.max),
            written: 0,
            shut: false,
            drained: 0,
            linger: Box::pin(tokio::time::sleep(LINGER)),
        });
        this.poll_refuse(cx)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fits(head: &[u8], max: usize, pieces: usize) -> bool {
        let mut c = Count::default();
        head.chunks(head.len().div_ceil(pieces))
            .all(|piece| c.feed(piece, max))
    }

    #[test]
    fn a_head_is_counted_to_its_empty_line_across_reads() {
        let head = b"GET http://a.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n";
        for pieces in [1, 2, 7, head.len()] {
            assert!(fits(head, head.len(), pieces), "{pieces}");
            assert!(!fits(head, head.len() - 1, pieces), "{pieces}");
        }
        // What follows the head (a body) is not counted.
        let mut with_body = head.to_vec();
        with_body.extend_from_slice(&[b'x'; 1000]);
        assert!(fits(&with_body, head.len(), 3));
        // Bare LF line ends, and empty lines before the request line.
        assert!(fits(b"\r\nGET / HTTP/1.1\nHost: a\n\n", 26, 1));
        // An unfinished head under the limit may go on.
        assert!(fits(b"GET / HTTP/1.1\r\nHost: a\r\n", 1000, 1));
    }
}
