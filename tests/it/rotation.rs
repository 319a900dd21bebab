//! Rotation as a gateway user sees it: requests to one site spread over
//! every usable upstream, under each strategy, one after another and many
//! at once; a site that bans some upstreams gets none of them once it has
//! said so, and the rest still rotate. Each upstream forwards from its own
//! 127.0.0.x address, so the site tells which one carried a request.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use common::fakes::ip;
use common::gateway::Gw;
use common::site::{Reply, Site, SiteOpts};
use common::{store_with_alive, within, working_proxies};
use proxywarden::health::{Feedback, load_index};
use proxywarden::pool::{Carrier, Pool, PoolOptions, SharedOptions, StrategyKind};
use tokio_util::sync::CancellationToken;

/// Upstreams in every test here.
const N: u8 = 40;

/// A gateway with `strategy` over a store of `alive` upstreams, and the
/// API on the same feedback path.
async fn gw(dir: &Path, alive: &[common::AliveProxy], strategy: &str) -> Gw {
    Gw::start_with(dir, alive, |c| {
        c.set("gateway", "strategy", &format!("{strategy:?}"))
            .set("gateway", "connect_timeout", "\"2s\"")
            .set("gateway", "timeout", "\"5s\"")
    })
    .await
}

/// `k` GETs of `url` through `client`, `concurrency` at a time; the
/// upstream id each answer names, in the order they came.
async fn fetch(client: &reqwest::Client, url: &str, k: usize, concurrency: usize) -> Vec<i64> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (client, url, next) = (client.clone(), url.to_owned(), next.clone());
        tasks.spawn(async move {
            let mut ids = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < k {
                let resp = client.get(&url).send().await.unwrap();
                assert_eq!(resp.status(), 200);
                let id: i64 = resp.headers()["x-proxywarden-proxy"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert_eq!(resp.text().await.unwrap(), "page");
                ids.push(id);
            }
            ids
        });
    }
    let mut all = Vec::new();
    while let Some(ids) = tasks.join_next().await {
        all.extend(ids.unwrap());
    }
    assert_eq!(all.len(), k);
    all
}

/// Distinct ids in `ids`, and the most requests one of them carried.
fn spread<T: std::hash::Hash + Eq>(ids: &[T]) -> (usize, usize) {
    let mut per: HashMap<&T, usize> = HashMap::new();
    for id in ids {
        *per.entry(id).or_default() += 1;
    }
    (per.len(), per.values().copied().max().unwrap_or(0))
}

/// What a strategy promises over `usable` upstreams for `k` requests:
/// round-robin and least-used take at least 0.9·min(k, usable) distinct
/// ones; random keeps every upstream within 3× its fair share, and
/// fastest-of-two (which favours good upstreams) within 4×, both using
/// three quarters of them at least.
fn assert_spread(strategy: &str, ids: &[i64], usable: usize, what: &str) {
    let k = ids.len();
    let (distinct, top) = spread(ids);
    let fair = k as f64 / usable as f64;
    match strategy {
        "round-robin" | "least-used" => {
            let floor = (0.9 * k.min(usable) as f64).ceil() as usize;
            assert!(
                distinct >= floor,
                "{strategy}, {what}: {distinct} distinct upstreams for {k} requests \
                 over {usable} (at least {floor} expected)"
            );
            assert!(
                top as f64 <= (fair.ceil() + 1.0),
                "{strategy}, {what}: one upstream carried {top} of {k}"
            );
        }
        _ => {
            let bound = if strategy == "random" { 3.0 } else { 4.0 };
            assert!(
                top as f64 <= bound * fair,
                "{strategy}, {what}: one upstream carried {top} of {k} ({bound}× fair is {})",
                bound * fair
            );
            // Most of them: with ten requests per upstream, three quarters
            // is missed once in far more than a billion runs.
            let most = (0.75 * usable as f64).ceil() as usize;
            assert!(
                distinct >= most,
                "{strategy}, {what}: {distinct} distinct upstreams for {k} requests over {usable}"
            );
        }
    }
}

/// Requests per check: ten per usable upstream for the random strategies
/// (their share bounds then fail once in far more than a billion runs);
/// for the rotating ones, fewer than there are upstreams, so that each
/// should be a new one.
fn requests(strategy: &str, usable: usize) -> usize {
    match strategy {
        "round-robin" | "least-used" => usable - usable / 10,
        _ => 10 * usable,
    }
}

/// A site that bans nobody and limits nothing: every strategy spreads
/// its requests over every upstream, one at a time and eight at once, and
/// `/stats`, `/metrics` and the dashboard say so.
async fn spreads_on_an_open_site(strategy: &str) {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/p", Reply::text("page"))])).await;
        let (_proxies, alive) = working_proxies(N).await;
        let gw = gw(dir.path(), &alive, strategy).await;
        let client = gw.client(None);
        let usable = N as usize;

        let k = requests(strategy, usable);
        let seq = fetch(&client, &site.url("/p"), k, 1).await;
        assert_spread(strategy, &seq, usable, "sequential");
        let peers: Vec<IpAddr> = site.log().iter().map(|h| h.peer).collect();
        assert_eq!(
            spread(&peers).0,
            spread(&seq).0,
            "the site saw as many addresses as the gateway named upstreams"
        );

        let conc = fetch(&client, &site.url("/p"), k, 8).await;
        assert_spread(strategy, &conc, usable, "8 at once");

        // The operator's view: the site, how many carried it, the top share.
        let all: Vec<i64> = seq.iter().chain(&conc).copied().collect();
        let (distinct, top) = spread(&all);
        let host = format!("127.0.0.1:{}", site.addr.port());
        let rotation = gw.feedback.rotation();
        let mine = rotation.iter().find(|s| s.site == host).expect("tracked");
        assert_eq!(mine.uses, all.len() as u64);
        assert_eq!(mine.proxies, distinct as u64);
        assert!((mine.top_share - top as f64 / all.len() as f64).abs() < 1e-9);

        let stats: serde_json::Value = serde_json::from_str(&gw.api("/stats").await).unwrap();
        let row = &stats["rotation"][0];
        assert_eq!(row["site"], host.as_str());
        assert_eq!(row["proxies"], distinct as u64);
        let metrics = gw.api("/metrics").await;
        let line = format!("proxywarden_site_proxies{{site=\"{host}\"}} {distinct}");
        assert!(metrics.contains(&line), "no {line:?} in /metrics");
        assert!(metrics.contains(&format!("proxywarden_site_top_share{{site=\"{host}\"}}")));
        let page = gw.api("/").await;
        assert!(
            page.contains("Rotation by site"),
            "the dashboard shows no rotation"
        );
        assert!(page.contains(&host));
    })
    .await;
}

#[tokio::test]
async fn round_robin_spreads_over_every_upstream() {
    spreads_on_an_open_site("round-robin").await;
}

#[tokio::test]
async fn least_used_spreads_over_every_upstream() {
    spreads_on_an_open_site("least-used").await;
}

#[tokio::test]
async fn random_spreads_uniformly_over_every_upstream() {
    spreads_on_an_open_site("random").await;
}

#[tokio::test]
async fn fastest_of_two_spreads_over_every_upstream() {
    spreads_on_an_open_site("fastest-of-two").await;
}

/// A site that bans 30% of the upstreams (a captcha page for their
/// addresses): once each has met it, none of them is sent there again,
/// and the others still rotate.
async fn skips_banned_and_spreads_over_the_rest(strategy: &str) {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let banned: HashSet<IpAddr> = (0..N).filter(|i| i % 10 < 3).map(|i| ip(2 + i)).collect();
        let mut opts = SiteOpts::routes(vec![("/p", Reply::text("page"))]);
        opts.banned = banned.iter().copied().collect();
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(N).await;
        let gw = gw(dir.path(), &alive, strategy).await;
        let client = gw.client(None);
        let usable = N as usize - banned.len();

        // Learning: until the site has banned every banned upstream once.
        // Fastest-of-two favours what worked there, so it may take long to
        // try the last few: it learns for a bounded number of requests and
        // is then held to what it met.
        let mut learning = 0;
        let met = loop {
            let met: HashSet<IpAddr> = site.log().iter().map(|h| h.peer).collect();
            if banned.is_subset(&met) || (strategy == "fastest-of-two" && learning >= 400) {
                break met;
            }
            assert!(
                learning < 2_000,
                "the banned upstreams were never all tried"
            );
            // Blocked answers are retried elsewhere; the answer is not the
            // point here.
            let _ = client.get(site.url("/p")).send().await.unwrap();
            learning += 1;
        };
        let unmet = banned.difference(&met).count();

        for concurrency in [1, 8] {
            let before = site.log().len();
            let k = requests(strategy, usable);
            let ids = fetch(&client, &site.url("/p"), k, concurrency).await;
            let peers: Vec<IpAddr> = site.log()[before..].iter().map(|h| h.peer).collect();
            let again = peers
                .iter()
                .filter(|p| banned.contains(p) && met.contains(p))
                .count();
            assert_eq!(
                again, 0,
                "{strategy}: upstreams the site banned were sent to it again"
            );
            let first = peers.iter().filter(|p| banned.contains(p)).count();
            assert!(
                first <= unmet,
                "{strategy}: a banned upstream met the site twice"
            );
            assert_eq!(peers.len(), k + first, "one attempt per request");
            assert_spread(
                strategy,
                &ids,
                usable,
                &format!("{concurrency} at once, 30% banned"),
            );
        }
    })
    .await;
}

#[tokio::test]
async fn round_robin_skips_what_a_site_banned_and_rotates_over_the_rest() {
    skips_banned_and_spreads_over_the_rest("round-robin").await;
}

#[tokio::test]
async fn least_used_skips_what_a_site_banned_and_rotates_over_the_rest() {
    skips_banned_and_spreads_over_the_rest("least-used").await;
}

#[tokio::test]
async fn random_skips_what_a_site_banned_and_rotates_over_the_rest() {
    skips_banned_and_spreads_over_the_rest("random").await;
}

#[tokio::test]
async fn fastest_of_two_skips_what_a_site_banned_and_rotates_over_the_rest() {
    skips_banned_and_spreads_over_the_rest("fastest-of-two").await;
}

/// The pool as a library (`Pool::from_store`, as `proxywarden crawl`
/// builds it): one site's requests in a row go through a new proxy each
/// under round-robin and least-used.
#[tokio::test]
async fn the_pool_as_a_library_rotates_over_every_proxy() {
    within(async {
        let site = Site::start(SiteOpts::routes(vec![("/p", Reply::text("page"))])).await;
        let (_proxies, alive) = working_proxies(N).await;
        for strategy in [StrategyKind::RoundRobin, StrategyKind::LeastUsed] {
            let dir = tempfile::tempdir().unwrap();
            let (store, _) = store_with_alive(&dir.path().join("lib.db"), &alive).await;
            let opts = PoolOptions {
                strategy,
                ..PoolOptions::default()
            };
            let pool = Pool::from_store(&store, SharedOptions::default(), opts).unwrap();
            let mut ids = Vec::new();
            for _ in 0..requests(strategy.as_str(), N as usize) {
                let page = pool.get(&site.url("/p")).await.unwrap();
                match page.proxy() {
                    Carrier::Proxy { id, .. } => ids.push(*id),
                    Carrier::Direct => panic!("went direct"),
                }
            }
            assert_spread(strategy.as_str(), &ids, N as usize, "the library");
        }
    })
    .await;
}

/// `/proxy` answers the better of two matches drawn independently: every
/// match is answered, the slowest of three about 1 time in 9 and the
/// fastest about 5 in 9; with `site=`, one that worked there wins its draws.
#[tokio::test]
async fn proxy_answers_the_better_of_two_independent_draws() {
    let dir = tempfile::tempdir().unwrap();
    let alive: Vec<common::AliveProxy> = [100, 500, 2_000]
        .into_iter()
        .enumerate()
        .map(|(i, ms)| common::AliveProxy {
            latency_ms: ms,
            ..common::AliveProxy::new(format!("http://127.0.0.{}:3128", i + 2))
        })
        .collect();
    let gw = gw(dir.path(), &alive, "round-robin").await;
    let answered = |path: &'static str| {
        let gw = &gw;
        async move {
            let mut counts: HashMap<String, u32> = HashMap::new();
            for _ in 0..900 {
                let url = gw.api(path).await;
                *counts.entry(url.trim().to_owned()).or_default() += 1;
            }
            counts
        }
    };
    let counts = answered("/proxy?format=text").await;
    let (fast, slow) = ("http://127.0.0.2:3128", "http://127.0.0.4:3128");
    assert_eq!(counts.len(), 3, "{counts:?}");
    // 100 and 500 expected, a standard deviation of 9.4 and 15.
    assert!((50..=150).contains(&counts[slow]), "{counts:?}");
    assert!(counts[fast] > 400, "{counts:?}");

    // The slowest worked at the site: it wins every draw it is in there
    // (5 in 9), and still only 1 in 9 elsewhere.
    let slow_id = gw
        .feedback
        .index()
        .ids()
        .into_iter()
        .find(|id| gw.feedback.index().get(*id).unwrap().latency_ms == Some(2_000))
        .unwrap();
    gw.feedback
        .worked_at(slow_id, "shop.test", std::time::Duration::from_millis(30));
    let counts = answered("/proxy?format=text&site=shop.test").await;
    assert!(counts[slow] > 400, "{counts:?}");
    assert_eq!(counts.len(), 3, "the others are still answered: {counts:?}");
}

/// A crawl through the pool spreads one site's pages over the proxies as
/// the gateway does: 36 pages under round-robin, 36 proxies.
#[tokio::test]
async fn a_crawl_spreads_one_sites_pages_over_every_proxy() {
    use proxywarden::crawl::{CrawlOptions, Progress, crawl};
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let pages = 36;
        let site = Site::start(SiteOpts::new(move |p, _| {
            common::site::tree_page(p, pages, 3)
        }))
        .await;
        let (_proxies, alive) = working_proxies(N).await;
        let (store, _) = store_with_alive(&dir.path().join("c.db"), &alive).await;
        let feedback = Feedback::new(load_index(&store).await.unwrap(), store);
        let opts = PoolOptions {
            strategy: StrategyKind::RoundRobin,
            ..PoolOptions::default()
        };
        let pool = Pool::new(feedback, SharedOptions::default(), opts).unwrap();
        let summary = crawl(
            &pool,
            CrawlOptions {
                seeds: vec![site.url("/").parse().unwrap()],
                output: Some(dir.path().join("pages.jsonl")),
                ..CrawlOptions::default()
            },
            CancellationToken::new(),
            Arc::new(Progress::default()),
        )
        .await
        .unwrap();
        assert_eq!(summary.ok(), pages as u64);
        let peers: Vec<IpAddr> = site
            .log()
            .iter()
            .filter(|h| h.path != "/robots.txt")
            .map(|h| h.peer)
            .collect();
        assert_eq!(peers.len(), pages);
        let (distinct, _) = spread(&peers);
        assert!(
            distinct >= pages * 9 / 10,
            "{distinct} proxies carried {pages} pages"
        );
    })
    .await;
}
