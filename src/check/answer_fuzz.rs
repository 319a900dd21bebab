//! The answer reader under random and mutated input, read in random
//! pieces: no panic, never more than [`MAX_BODY`] of body, and exactly the
//! status and body of every well-formed answer (by length, chunks or the
//! end of the stream, after any 100 Continue).

use std::pin::Pin;
use std::task::{Context, Poll};

use proptest::prelude::*;
use tokio::io::{AsyncRead, ReadBuf};

use super::*;

/// A stream that hands out `data` at most `step` bytes a read.
struct Trickle {
    data: Vec<u8>,
    pos: usize,
    step: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let n = self
            .step
            .min(buf.remaining())
            .min(self.data.len() - self.pos);
        let from = self.pos;
        buf.put_slice(&self.data[from..from + n]);
        self.pos += n;
        Poll::Ready(Ok(()))
    }
}

fn read(data: Vec<u8>, step: usize) -> Result<(u16, Bytes), Reason> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut stream = Trickle {
        data,
        pos: 0,
        step: step.max(1),
    };
    rt.block_on(read_answer(&mut stream))
}

#[derive(Clone, Debug)]
enum Frame {
    Length,
    Chunked(Vec<usize>),
    Close,
}

/// A well-formed answer with `status` and `body`, framed as `frame`.
fn answer(status: u16, body: &[u8], frame: &Frame, continue_first: bool) -> Vec<u8> {
    let mut out = Vec::new();
    if continue_first {
        out.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    out.extend_from_slice(format!("HTTP/1.1 {status} Whatever\r\nServer: judge\r\n").as_bytes());
    match frame {
        Frame::Length => {
            out.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
            out.extend_from_slice(body);
        }
        Frame::Chunked(cuts) => {
            out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
            let mut rest = body;
            for &cut in cuts {
                if rest.is_empty() {
                    break;
                }
                let n = (cut % rest.len()).max(1);
                out.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                out.extend_from_slice(&rest[..n]);
                out.extend_from_slice(b"\r\n");
                rest = &rest[n..];
            }
            if !rest.is_empty() {
                out.extend_from_slice(format!("{:X};ext=1\r\n", rest.len()).as_bytes());
                out.extend_from_slice(rest);
                out.extend_from_slice(b"\r\n");
            }
            out.extend_from_slice(b"0\r\n\r\n");
        }
        Frame::Close => {
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(body);
        }
    }
    out
}

fn frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        Just(Frame::Length),
        prop::collection::vec(1..600usize, 0..6).prop_map(Frame::Chunked),
        Just(Frame::Close),
    ]
}

fn status() -> impl Strategy<Value = u16> {
    (200u16..600).prop_filter("no body or not an answer", |s| ![204, 304, 407].contains(s))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn random_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..4096), step in 1..64usize) {
        if let Ok((_, body)) = read(data, step) {
            prop_assert!(body.len() <= MAX_BODY);
        }
    }

    #[test]
    fn well_formed_answers_read_exactly(
        status in status(),
        body in prop::collection::vec(any::<u8>(), 0..2000),
        frame in frame(),
        continue_first in any::<bool>(),
        step in 1..700usize,
    ) {
        let got = read(answer(status, &body, &frame, continue_first), step);
        prop_assert_eq!(got, Ok((status, Bytes::from(body))));
    }

    #[test]
    fn mutated_answers_never_panic(
        status in status(),
        body in prop::collection::vec(any::<u8>(), 0..600),
        frame in frame(),
        edits in prop::collection::vec((any::<usize>(), any::<u8>(), 0..3u8), 1..6),
        step in 1..64usize,
    ) {
        let mut data = answer(status, &body, &frame, false);
        for (at, byte, op) in edits {
            let at = at % (data.len() + 1);
            match op {
                0 => data.insert(at, byte),
                1 if at < data.len() => { data.remove(at); }
                _ => data.truncate(at),
            }
        }
        if let Ok((_, body)) = read(data, step) {
            prop_assert!(body.len() <= MAX_BODY);
        }
    }
}
