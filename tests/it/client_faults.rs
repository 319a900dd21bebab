//! What a gateway client gets wrong is the client's: request bodies with
//! broken chunked framing, and bodies that stall halfway, are answered to
//! that client and never charged to the upstream proxies, so a flood of
//! them leaves every proxy serving the clients that behave.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::gateway::Gw;
use common::{within, working_proxies};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A site that reads every request body to its end before it answers
/// (`read N`), as servers behind a form or an upload do.
async fn reading_site() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let n = match req.into_body().collect().await {
                            Ok(b) => b.to_bytes().len(),
                            Err(_) => 0,
                        };
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(format!(
                            "read {n}"
                        )))))
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// A chunked POST head for `url` asking the gateway to close after.
fn chunked_head(url: &str) -> Vec<u8> {
    format!(
        "POST {url} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

/// Request bodies whose chunked framing is broken, as sent on the wire.
fn malformed_bodies() -> Vec<(&'static str, Vec<u8>)> {
    let chunk_then_garbage = |size: usize| {
        let mut b = format!("{size:x}\r\n").into_bytes();
        b.extend(std::iter::repeat_n(b'a', size));
        b.extend_from_slice(b"\r\nzz\r\nabc\r\n0\r\n\r\n");
        b
    };
    let mut extension = b"5;".to_vec();
    extension.extend(std::iter::repeat_n(b'e', 100 * 1024));
    extension.extend_from_slice(b"\r\nhello\r\n0\r\n\r\n");
    vec![
        ("not hex", b"zz\r\nabc\r\n0\r\n\r\n".to_vec()),
        (
            "19 hex digits",
            b"1000000000000000000\r\nabc\r\n0\r\n\r\n".to_vec(),
        ),
        ("100 KB extension", extension),
        ("64 KiB chunk then garbage", chunk_then_garbage(64 * 1024)),
        // Over gateway.retry_body_max: streamed through a proxy before the
        // garbage comes.
        ("256 KiB chunk then garbage", chunk_then_garbage(256 * 1024)),
    ]
}

/// Sends `bytes` on a new connection and reads the answer until the
/// gateway closes the connection: the status line's code and the whole.
async fn raw(addr: SocketAddr, bytes: &[u8]) -> (u16, String) {
    let mut c = TcpStream::connect(addr).await.unwrap();
    // The gateway may answer (and close) before it has read everything.
    let _ = c.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out).await;
    let answer = String::from_utf8_lossy(&out).into_owned();
    let status = answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, answer)
}

fn error_code(answer: &str) -> String {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer:?}"));
    json["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn each_malformed_chunked_body_is_a_400_and_costs_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = reading_site().await;
        let (proxies, alive) = working_proxies(3).await;
        let gw = Gw::start(dir.path(), &alive).await;
        let url = format!("http://{site}/form");
        for (name, body) in malformed_bodies() {
            let mut req = chunked_head(&url);
            req.extend_from_slice(&body);
            let (status, answer) = raw(gw.addr, &req).await;
            assert_eq!(status, 400, "{name}: {answer:?}");
            assert_eq!(error_code(&answer), "bad_body", "{name}");
        }
        // Only the one over retry_body_max reached a proxy at all.
        let carried: usize = proxies.iter().map(|p| p.requests()).sum();
        assert!(carried <= 1, "{carried}");
        gw.none_charged();
        let stats = gw.gateway.metrics().snapshot();
        assert_eq!(stats.requests.get("bad_request"), Some(&5), "{stats:?}");
        // A well-framed chunked body (now held and retryable) goes through.
        let mut req = chunked_head(&url);
        req.extend_from_slice(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
        let (status, answer) = raw(gw.addr, &req).await;
        assert_eq!(status, 200, "{answer:?}");
        assert!(answer.ends_with("read 11"), "{answer:?}");
    })
    .await;
}

#[tokio::test]
async fn a_flood_of_malformed_bodies_leaves_every_proxy_to_the_clients_that_behave() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = reading_site().await;
        let (_proxies, alive) = working_proxies(20).await;
        let gw = Gw::start(dir.path(), &alive).await;
        let url = format!("http://{site}/form");
        let done = Arc::new(AtomicBool::new(false));
        let bodies = Arc::new(malformed_bodies());
        let mut attackers = Vec::new();
        for _ in 0..8 {
            let (done, bodies, url, addr) = (done.clone(), bodies.clone(), url.clone(), gw.addr);
            attackers.push(tokio::spawn(async move {
                let mut sent = 0usize;
                let mut refused = 0usize;
                // Every kind at least once, then on until the good client
                // is through.
                while sent < bodies.len() || !done.load(Ordering::Relaxed) {
                    let (_, body) = &bodies[sent % bodies.len()];
                    let mut req = chunked_head(&url);
                    req.extend_from_slice(body);
                    let (status, _) = raw(addr, &req).await;
                    sent += 1;
                    refused += usize::from(status == 400);
                }
                (sent, refused)
            }));
        }
        let proxy = reqwest::Proxy::all(format!("http://{}", gw.addr)).unwrap();
        let client = common::daemon::proxied_client(proxy);
        let mut ok = 0;
        let total = 100;
        for i in 0..total {
            let resp = client
                .post(&url)
                .body(format!("field={i}"))
                .send()
                .await
                .unwrap();
            if resp.status() == 200 {
                ok += 1;
            }
        }
        done.store(true, Ordering::Relaxed);
        let mut sent = 0;
        let mut refused = 0;
        for a in attackers {
            let (s, r) = a.await.unwrap();
            sent += s;
            refused += r;
        }
        assert!(ok * 100 >= total * 99, "{ok} of {total} went through");
        assert_eq!(refused, sent, "every malformed request is a 400");
        gw.none_charged();
    })
    .await;
}

#[tokio::test]
async fn a_body_that_stalls_halfway_is_a_408_and_costs_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = reading_site().await;
        let (proxies, alive) = working_proxies(2).await;
        let gw = Gw::start_with(dir.path(), &alive, |c| {
            c.set("gateway", "header_timeout", "\"1s\"")
        })
        .await;
        let url = format!("http://{site}/upload");
        // Over retry_body_max by its length: streamed through a proxy from
        // the start. Chunked and small: read ahead. Chunked and large:
        // read ahead, then streamed.
        let mut by_length =
            format!("POST {url} HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n")
                .into_bytes();
        by_length.extend(std::iter::repeat_n(b'a', 100 * 1024));
        let mut small = chunked_head(&url);
        small.extend_from_slice(b"a\r\n0123456789\r\n");
        let mut large = chunked_head(&url);
        large.extend_from_slice(format!("{:x}\r\n", 100 * 1024).as_bytes());
        large.extend(std::iter::repeat_n(b'a', 100 * 1024));
        large.extend_from_slice(b"\r\n20000\r\nabc");
        for (name, req) in [("by length", by_length), ("small", small), ("large", large)] {
            let mut c = TcpStream::connect(gw.addr).await.unwrap();
            c.write_all(&req).await.unwrap();
            // ...and nothing more: the client stalls, its connection open.
            let mut out = Vec::new();
            let _ = c.read_to_end(&mut out).await;
            let answer = String::from_utf8_lossy(&out);
            assert!(answer.starts_with("HTTP/1.1 408"), "{name}: {answer:?}");
            assert_eq!(error_code(&answer), "body_timeout", "{name}");
        }
        let carried: usize = proxies.iter().map(|p| p.requests()).sum();
        assert_eq!(carried, 2, "the two streamed bodies went to a proxy each");
        gw.none_charged();
    })
    .await;
}
