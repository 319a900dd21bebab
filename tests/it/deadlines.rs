//! Time ceilings: every fetch has a total deadline — a page or robots.txt
//! through the pool, a harvested list — and a site that drips its answer
//! (head at once, then a byte at a time) is the site's slowness: the fetch
//! ends at its deadline (`site_timeout` through the pool), and the proxy
//! that carried it is not charged. (A judge dripping its answers is in
//! `check.rs`, with the other faulty judges.)

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::site::{Reply, Site, SiteOpts};
use common::{TestConfig, store_with_alive, within, working_proxies};
use proxywarden::crawl::{CrawlOptions, Progress, crawl};
use proxywarden::harvest::harvest_all;
use proxywarden::health::{Feedback, load_index};
use proxywarden::pool::{FetchError, NoProxy, Pool, PoolOptions, SharedOptions};
use proxywarden::store::{ProxyFilter, Store};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

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
            SharedOptions::default(),
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

#[tokio::test]
async fn a_robots_txt_that_drips_ends_at_the_deadline_and_charges_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::routes(vec![
            ("/", Reply::html("<a href=\"/a\">a</a>")),
            ("/a", Reply::html("<title>A</title>")),
        ]);
        // 100,000 bytes at a byte a second: 28 hours to read.
        let rules = format!("User-agent: *\nAllow: /\n#{}\n", "x".repeat(100_000));
        opts.robots = Some(Reply::drip(rules));
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(4).await;
        let (store, ids) = store_with_alive(&dir.path().join("d.db"), &alive).await;
        let feedback = Feedback::new(load_index(&store).await.unwrap(), store);
        let pool = Pool::new(
            feedback.clone(),
            SharedOptions::default(),
            PoolOptions {
                connect_timeout: Duration::from_secs(1),
                first_byte_timeout: Duration::from_secs(1),
                total_timeout: Duration::from_secs(2),
                retry_backoff: Duration::from_millis(10),
                no_proxy: NoProxy::Fail,
                ..PoolOptions::default()
            },
        )
        .unwrap();
        let started = Instant::now();
        let summary = crawl(
            &pool,
            CrawlOptions {
                seeds: vec![site.url("/").parse().unwrap()],
                output: Some(dir.path().join("pages.jsonl")),
                robots_retry: Duration::from_millis(100),
                grace: Duration::from_secs(5),
                ..CrawlOptions::default()
            },
            CancellationToken::new(),
            Arc::new(Progress::default()),
        )
        .await
        .unwrap();
        let took = started.elapsed();
        // Three tries of 2 s each, not hours (with room for a loaded
        // machine): the head came at once, so each try's slowness is the
        // site's and moves to no other proxy. The host's pages fail for
        // want of its rules.
        assert!(took < Duration::from_secs(40), "{took:?}");
        assert_eq!(site.hits("/robots.txt"), 3, "{summary}");
        assert_eq!(site.hits("/"), 0);
        assert_eq!(summary.failed_by_reason.get("robots_unavailable"), Some(&1));
        assert_eq!(summary.pool.proxy_failures, 0, "{summary}");
        for id in ids {
            assert!(!pool.is_cooling(id), "proxy {id} was charged");
            assert!(feedback.index().get(id).is_some(), "proxy {id} taken out");
        }
    })
    .await;
}

#[tokio::test]
async fn a_list_that_drips_a_byte_a_second_fails_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let slow_list = "8.8.8.9:8080\n".repeat(8_000);
    let site = Site::routes(vec![
        ("/drip.txt", Reply::drip(slow_list)),
        ("/list.txt", Reply::ok("8.8.8.2:8080\n")),
    ])
    .await;
    let sources = format!(
        "[[sources]]\nname = \"drip\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"list\"\nurl = \"{}\"\n",
        site.url("/drip.txt"),
        site.url("/list.txt")
    );
    // harvest.timeout 2 s, one retry.
    let config = TestConfig::new(dir.path()).sources_toml(&sources).build();
    let store = Store::open(&config.database.path).unwrap();
    let started = Instant::now();
    let report = tokio::time::timeout(Duration::from_secs(60), harvest_all(&config, &store))
        .await
        .expect("the harvest waited on a dripping list for 60 s")
        .unwrap();
    let took = started.elapsed();
    // Two tries of 2 s each, not the 100,000 s the drip would take (with
    // room for a loaded machine).
    assert!(took < Duration::from_secs(20), "{took:?}");
    assert!(site.hits("/drip.txt") <= 2, "{}", site.hits("/drip.txt"));
    let drip = report.sources.iter().find(|s| s.name == "drip").unwrap();
    let error = drip.error.as_deref().unwrap_or_default();
    assert!(error.contains("timed out"), "{error:?}");
    assert_eq!(drip.found, 0);
    let list = report.sources.iter().find(|s| s.name == "list").unwrap();
    assert!(list.worked(), "{list:?}");
    let stored: Vec<_> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.proxy.host.to_string())
        .collect();
    assert_eq!(stored, ["8.8.8.2"]);
}
