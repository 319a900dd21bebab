//! Kept-alive upstream connections, whatever drives them: a close by the
//! proxy while one sat idle costs neither the client nor the proxy, and an
//! answer a client reads slowly still comes whole, its connection kept for
//! the next request.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{kept_alive_proxy, none_charged, proxy_id};
use crate::common::gateway::Gw;
use crate::common::site::{Reply, Site};
use crate::common::{self, AliveProxy, within};

/// A proxy that answers every request itself (`200`, `ok`, kept alive by
/// HTTP/1.1) and then half-closes the connection: it sends no more, yet
/// still reads (and counts) whatever request comes on it after.
struct HalfClosing {
    addr: std::net::SocketAddr,
    /// Request heads read, on any connection.
    requests: Arc<AtomicUsize>,
    /// Connections accepted.
    connections: Arc<AtomicUsize>,
    /// Connections it has stopped sending on.
    closed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HalfClosing {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HalfClosing {
    async fn start() -> HalfClosing {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicUsize::new(0));
        let (r, c, d) = (requests.clone(), connections.clone(), closed.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                c.fetch_add(1, Ordering::SeqCst);
                let (r, d) = (r.clone(), d.clone());
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    r.fetch_add(1, Ordering::SeqCst);
                    let answer = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok";
                    if s.write_all(answer).await.is_err() || s.shutdown().await.is_err() {
                        return;
                    }
                    d.fetch_add(1, Ordering::SeqCst);
                    // Whatever comes now is a request sent on a connection
                    // that can no longer answer it.
                    if let Ok(n) = s.read(&mut buf).await
                        && n > 0
                    {
                        r.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        HalfClosing {
            addr,
            requests,
            connections,
            closed,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

#[tokio::test]
async fn a_kept_connection_the_proxy_closed_while_idle_costs_the_client_and_the_proxy_nothing() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::routes(vec![("/a", Reply::text("unused"))]).await;
        let proxy = HalfClosing::start().await;
        let gw = Gw::start_with(dir.path(), &[AliveProxy::new(proxy.url())], |c| {
            c.set("gateway", "retries", "0")
        })
        .await;
        let client = gw.client(None);
        for i in 1..=3 {
            let resp = client.get(site.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.unwrap(), "ok");
            // The proxy has stopped sending on the connection the answer
            // came on before the next request is asked for.
            common::until("the proxy closes", Duration::from_secs(10), || {
                let closed = proxy.closed.load(Ordering::SeqCst);
                async move { closed == i }
            })
            .await;
        }
        // Each answer came on a new connection. A request may still have
        // been sent on a closed one when the gateway had not yet read the
        // close (nothing orders the two): it went again on a new connection,
        // unseen by the client and charged to no one.
        assert_eq!(proxy.connections.load(Ordering::SeqCst), 3);
        let requests = proxy.requests.load(Ordering::SeqCst);
        assert!((3..=5).contains(&requests), "{requests} requests");
        none_charged(&gw);
    })
    .await;
}

/// Sends a plain GET for `url` through the gateway on `s` and reads the
/// answer's head; its `Content-Length`.
async fn get_head(s: &mut TcpStream, url: &str) -> (String, usize) {
    let host = url.trim_start_matches("http://").split('/').next().unwrap();
    s.write_all(format!("GET {url} HTTP/1.1\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().unwrap())
        })
        .expect("a length");
    (head, length)
}

#[tokio::test]
async fn a_large_answer_read_slowly_comes_whole_and_its_connection_is_kept() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // More than the socket buffers between the gateway and the proxy
        // hold, so that the proxy waits on the gateway, and the gateway on
        // the client.
        let big: Vec<u8> = (0..8 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
        let site = Site::routes(vec![
            ("/big", Reply::ok(big.clone())),
            ("/a", Reply::text("ok")),
        ])
        .await;
        let proxy = kept_alive_proxy(2).await;
        let gw = Gw::start(dir.path(), &[AliveProxy::new(proxy.url())]).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        let (head, length) = get_head(&mut s, &site.url("/big")).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert_eq!(length, big.len());
        // A slow reader: a few kilobytes at a time, letting everything else
        // run in between.
        let mut body = Vec::with_capacity(length);
        let mut buf = [0u8; 4096];
        while body.len() < length {
            let n = s
                .read(&mut buf[..(length - body.len()).min(4096)])
                .await
                .unwrap();
            assert!(n > 0, "the answer ended after {} bytes", body.len());
            body.extend_from_slice(&buf[..n]);
            tokio::task::yield_now().await;
        }
        assert!(body == big, "the body changed on the way");
        // The next request (another client) goes on the same upstream
        // connection.
        let resp = gw.client(None).get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(proxy_id(&resp), gw.ids[0]);
        assert_eq!(resp.text().await.unwrap(), "ok");
        assert_eq!(proxy.requests(), 2);
        assert_eq!(proxy.connections(), 1);
        none_charged(&gw);
    })
    .await;
}
