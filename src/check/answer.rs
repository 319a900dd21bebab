//! One GET over a check's stream: the request head written in one piece,
//! the answer's head parsed with httparse and its body read by its framing
//! (a length, chunks, or the end of the stream), at most 64 KiB. A check
//! needs no more of HTTP/1.1 than this; hyper's client connection cost each
//! check a task's worth of allocations and wake-ups besides.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::model::Reason;

/// Judge answers are small; anything longer is not a judge answer.
pub const MAX_BODY: usize = 64 * 1024;
/// A response head (or a chunk-size line) longer than this is not an HTTP
/// server's.
const MAX_HEAD: usize = 64 * 1024;
/// Headers per head, as many as hyper's client took; more is not an
/// answer.
const MAX_HEADERS: usize = 100;
/// Room made for each read: most judge answers fit in one (and a buffer
/// this small comes from the allocator's per-thread cache).
const READ_SIZE: usize = 1024;

/// A GET to send.
#[derive(Clone, Copy, Debug)]
pub struct Get<'a> {
    /// The request target: a path and query, or an absolute URL for a
    /// forward proxy.
    pub uri: &'a str,
    /// The Host header.
    pub host: &'a str,
    /// The User-Agent header.
    pub user_agent: &'a str,
    /// A Proxy-Authorization header, for a forward proxy with credentials.
    pub proxy_auth: Option<&'a str>,
}

impl Get<'_> {
    /// The request head, or [`Reason::ProtocolError`] for a part that would
    /// break it (each is checked where it comes from; a CR or LF here would
    /// still smuggle a header in, so it is refused again).
    fn head(&self) -> Result<Vec<u8>, Reason> {
        let uri_ok = !self.uri.is_empty() && self.uri.bytes().all(|b| b.is_ascii_graphic());
        let value_ok = |v: &str| v.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b));
        let values = [self.host, self.user_agent, self.proxy_auth.unwrap_or("")];
        if !uri_ok || !values.into_iter().all(value_ok) {
            return Err(Reason::ProtocolError);
        }
        let mut head = Vec::with_capacity(160 + self.uri.len() + self.user_agent.len());
        for part in [
            "GET ",
            self.uri,
            " HTTP/1.1\r\nHost: ",
            self.host,
            "\r\nUser-Agent: ",
            self.user_agent,
            "\r\nAccept: */*\r\nConnection: close\r\n",
        ] {
            head.extend_from_slice(part.as_bytes());
        }
        if let Some(auth) = self.proxy_auth {
            head.extend_from_slice(b"Proxy-Authorization: ");
            head.extend_from_slice(auth.as_bytes());
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        Ok(head)
    }
}

/// Sends `get` over `stream` and reads the answer: its status and body.
/// An answer that ends early is [`Reason::Reset`]; one that is not HTTP is
/// [`Reason::ProtocolError`]; a 407 is [`Reason::ProxyAuthRequired`]; a
/// body over 64 KiB is [`Reason::ContentMismatch`] (no judge says that
/// much); TLS failures on the way are [`Reason::TlsError`].
pub async fn exchange<S>(stream: &mut S, get: &Get<'_>) -> Result<(u16, Bytes), Reason>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let head = get.head()?;
    stream.write_all(&head).await.map_err(|e| io_reason(&e))?;
    stream.flush().await.map_err(|e| io_reason(&e))?;
    read_answer(stream).await
}

/// How an answer's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// No body (204, 304).
    Empty,
    /// Content-Length.
    Length(u64),
    /// Transfer-Encoding ending in chunked.
    Chunked,
    /// At the end of the stream.
    Close,
}

/// Reads an answer: the head (skipping informational ones) and the body.
async fn read_answer<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(u16, Bytes), Reason> {
    let mut buf = BytesMut::with_capacity(READ_SIZE);
    let (status, framing) = loop {
        if let Some((len, status, framing)) = parse_head(&buf)? {
            buf.advance(len);
            // 100 Continue and the like come before the answer itself.
            if (100..200).contains(&status) && status != 101 {
                continue;
            }
            break (status, framing);
        }
        if buf.len() >= MAX_HEAD {
            return Err(Reason::ProtocolError);
        }
        if !fill(stream, &mut buf).await? {
            return Err(Reason::Reset);
        }
    };
    if status == 407 {
        return Err(Reason::ProxyAuthRequired);
    }
    let body = match framing {
        Framing::Empty => Bytes::new(),
        Framing::Length(n) if n > MAX_BODY as u64 => return Err(Reason::ContentMismatch),
        Framing::Length(n) => {
            let n = n as usize;
            while buf.len() < n {
                if !fill(stream, &mut buf).await? {
                    return Err(Reason::Reset);
                }
            }
            buf.truncate(n);
            buf.freeze()
        }
        Framing::Close => {
            while fill(stream, &mut buf).await? {
                if buf.len() > MAX_BODY {
                    return Err(Reason::ContentMismatch);
                }
            }
            buf.freeze()
        }
        Framing::Chunked => dechunk(stream, buf).await?,
    };
    Ok((status, body))
}

/// The head at the start of `buf`: its length, status and framing; `None`
/// while incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(usize, u16, Framing)>, Reason> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let len = match resp.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Reason::ProtocolError),
    };
    let status = resp.code.ok_or(Reason::ProtocolError)?;
    if (100..200).contains(&status) || status == 204 || status == 304 {
        return Ok(Some((len, status, Framing::Empty)));
    }
    let mut chunked = None;
    let mut length = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            // The last coding decides: chunked frames the body, anything
            // else runs to the end of the stream.
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") {
            for part in h.value.split(|b| *b == b',') {
                let n = content_length(part.trim_ascii()).ok_or(Reason::ProtocolError)?;
                if length.is_some_and(|l| l != n) {
                    return Err(Reason::ProtocolError);
                }
                length = Some(n);
            }
        }
    }
    let framing = match (chunked, length) {
        (Some(true), _) => Framing::Chunked,
        (Some(false), _) | (None, None) => Framing::Close,
        (None, Some(n)) => Framing::Length(n),
    };
    Ok(Some((len, status, framing)))
}

/// A Content-Length value: digits only.
fn content_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Decodes a chunked body, `buf` holding what was read of it so far.
async fn dechunk<S: AsyncRead + Unpin>(stream: &mut S, mut buf: BytesMut) -> Result<Bytes, Reason> {
    let mut body = BytesMut::new();
    loop {
        let (used, size) = loop {
            match httparse::parse_chunk_size(&buf) {
                Ok(httparse::Status::Complete(found)) => break found,
                Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD => {
                    return Err(Reason::ProtocolError);
                }
                Ok(httparse::Status::Partial) => {
                    if !fill(stream, &mut buf).await? {
                        return Err(Reason::Reset);
                    }
                }
                Err(_) => return Err(Reason::ProtocolError),
            }
        };
        buf.advance(used);
        // The last chunk: the body is whole (trailers are not read).
        if size == 0 {
            return Ok(body.freeze());
        }
        if size > (MAX_BODY - body.len()) as u64 {
            return Err(Reason::ContentMismatch);
        }
        let size = size as usize;
        while buf.len() < size + 2 {
            if !fill(stream, &mut buf).await? {
                return Err(Reason::Reset);
            }
        }
        if &buf[size..size + 2] != b"\r\n" {
            return Err(Reason::ProtocolError);
        }
        body.extend_from_slice(&buf[..size]);
        buf.advance(size + 2);
    }
}

/// Reads more of `stream` into `buf`; false at the end of the stream.
async fn fill<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Result<bool, Reason> {
    buf.reserve(READ_SIZE);
    match stream.read_buf(buf).await {
        Ok(0) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(io_reason(&e)),
    }
}

/// The reason for an I/O error on a check's stream: resets and timeouts
/// as the dialer maps them, a TLS failure as such, anything else a
/// protocol error.
fn io_reason(e: &std::io::Error) -> Reason {
    if let Some(r) = crate::net::io_reason(e) {
        return r;
    }
    let tls = e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>());
    if tls {
        Reason::TlsError
    } else {
        Reason::ProtocolError
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer read from `bytes`, as a stream that ends after them.
    fn read(bytes: &[u8]) -> Result<(u16, Bytes), Reason> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut stream = bytes;
        rt.block_on(read_answer(&mut stream))
    }

    fn get() -> Get<'static> {
        Get {
            uri: "/judge?n=1",
            host: "judge.example:80",
            user_agent: "proxywarden/0.1",
            proxy_auth: None,
        }
    }

    #[test]
    fn the_head_is_one_get_with_its_headers() {
        let head = String::from_utf8(get().head().unwrap()).unwrap();
        assert_eq!(
            head,
            "GET /judge?n=1 HTTP/1.1\r\nHost: judge.example:80\r\nUser-Agent: proxywarden/0.1\r\n\
             Accept: */*\r\nConnection: close\r\n\r\n"
        );
        let with_auth = Get {
            proxy_auth: Some("Basic YTpi"),
            ..get()
        };
        let head = String::from_utf8(with_auth.head().unwrap()).unwrap();
        assert!(head.ends_with("Connection: close\r\nProxy-Authorization: Basic YTpi\r\n\r\n"));
    }

    #[test]
    fn a_part_that_would_break_the_head_is_refused() {
        for bad in [
            Get {
                uri: "/a b",
                ..get()
            },
            Get { uri: "", ..get() },
            Get {
                host: "a\r\nX-Injected: 1",
                ..get()
            },
            Get {
                user_agent: "ua\n",
                ..get()
            },
            Get {
                proxy_auth: Some("Basic\0"),
                ..get()
            },
        ] {
            assert_eq!(bad.head(), Err(Reason::ProtocolError), "{bad:?}");
        }
    }

    #[test]
    fn bodies_are_read_by_length_chunks_or_close() {
        let sized = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello and more";
        assert_eq!(read(sized), Ok((200, Bytes::from_static(b"hello"))));
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                        3;ext=1\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n";
        assert_eq!(read(chunked), Ok((200, Bytes::from_static(b"hello"))));
        let closed = b"HTTP/1.0 200 OK\r\n\r\nhello";
        assert_eq!(read(closed), Ok((200, Bytes::from_static(b"hello"))));
        let empty = b"HTTP/1.1 204 No Content\r\nContent-Length: 9\r\n\r\n";
        assert_eq!(read(empty), Ok((204, Bytes::new())));
        let continued =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Busy\r\nContent-Length: 2\r\n\r\nno";
        assert_eq!(read(continued), Ok((503, Bytes::from_static(b"no"))));
        let agreeing = b"HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok";
        assert_eq!(read(agreeing), Ok((200, Bytes::from_static(b"ok"))));
    }

    #[test]
    fn answers_that_end_early_are_resets() {
        for cut in [
            &b""[..],
            b"HTTP/1.1 200 OK\r\nContent-Le",
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
        ] {
            assert_eq!(
                read(cut),
                Err(Reason::Reset),
                "{:?}",
                String::from_utf8_lossy(cut)
            );
        }
    }

    #[test]
    fn what_is_not_http_is_a_protocol_error() {
        for bad in [
            &b"SSH-2.0-OpenSSH_8.9\r\n"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokX\r\n0\r\n\r\n",
        ] {
            assert_eq!(
                read(bad),
                Err(Reason::ProtocolError),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut many = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            many.extend_from_slice(format!("X-{i}: 1\r\n").as_bytes());
        }
        many.extend_from_slice(b"\r\n");
        assert_eq!(read(&many), Err(Reason::ProtocolError));
        let endless = [b"HTTP/1.1 200 OK\r\nX: ".as_slice(), &[b'a'; MAX_HEAD]].concat();
        assert_eq!(read(&endless), Err(Reason::ProtocolError));
    }

    #[test]
    fn a_body_over_64_kib_is_not_a_judge_answer() {
        let big = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_BODY + 1
        );
        assert_eq!(read(big.as_bytes()), Err(Reason::ContentMismatch));
        let at_limit = [
            format!("HTTP/1.1 200 OK\r\nContent-Length: {MAX_BODY}\r\n\r\n").as_bytes(),
            &[b'a'; MAX_BODY],
        ]
        .concat();
        assert_eq!(read(&at_limit).map(|(_, b)| b.len()), Ok(MAX_BODY));
        let closed = [b"HTTP/1.0 200 OK\r\n\r\n".as_slice(), &[b'a'; MAX_BODY + 1]].concat();
        assert_eq!(read(&closed), Err(Reason::ContentMismatch));
        let chunk = format!("{:x}\r\n", MAX_BODY + 1);
        let chunked = [
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".as_slice(),
            chunk.as_bytes(),
        ]
        .concat();
        assert_eq!(read(&chunked), Err(Reason::ContentMismatch));
    }

    #[test]
    fn a_407_asks_for_credentials() {
        let auth = b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(read(auth), Err(Reason::ProxyAuthRequired));
    }
}

#[cfg(test)]
#[path = "answer_fuzz.rs"]
mod fuzz;
