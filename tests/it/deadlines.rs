//! Time ceilings: a fetch through the pool has a total deadline, and a site
//! that drips its answer (head at once, then a byte at a time) is the
//! site's slowness: the fetch ends at its deadline with `site_timeout`, and
//! the proxy that carried it is not charged.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{store_with_alive, within, working_proxies};
use proxywarden::health::{Feedback, load_index};
use proxywarden::pool::{FetchError, NoProxy, Pool, PoolOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// A site that answers every request with a head at once and then one
/// byte of its 100,000-byte body every 100 ms.
async fn dripping_site() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let head =
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n";
                if s.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                loop {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if s.write_all(b"x").await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_dripping_page_ends_at_the_deadline_and_charges_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = dripping_site().await;
        let (_proxies, alive) = working_proxies(1).await;
        let (store, ids) = store_with_alive(&dir.path().join("d.db"), &alive).await;
        let feedback = Feedback::new(load_index(&store).await.unwrap(), store);
        let pool = Pool::new(
            feedback.clone(),
            PoolOptions {
                connect_timeout: Duration::from_secs(1),
                first_byte_timeout: Duration::from_secs(1),
                total_timeout: Duration::from_secs(2),
                no_proxy: NoProxy::Fail,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let started = Instant::now();
        let result = pool.get(&format!("http://{site}/robots.txt")).await;
        let took = started.elapsed();
        assert!(
            matches!(result, Err(FetchError::SiteTimeout { .. })),
            "{result:?}"
        );
        // The deadline holds (with room for a loaded machine), not the
        // 10,000 s the drip would take.
        assert!(took < Duration::from_secs(15), "{took:?}");
        assert!(!pool.is_cooling(ids[0]), "the proxy was charged");
        assert!(
            feedback.index().get(ids[0]).is_some(),
            "the proxy was taken out"
        );
    })
    .await;
}
