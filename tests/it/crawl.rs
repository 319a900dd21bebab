//! The crawler against a loopback site and loopback proxies: every
//! reachable page once, through proxies only, robots.txt and Crawl-delay
//! obeyed, 429 + Retry-After slowing the host down, redirects kept in
//! scope, proxies dying or banned mid-crawl, extraction and bodies, and,
//! with the real binary, kill -9 and resume, Ctrl-C, and resuming a
//! crawl's failed pages.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::fakes::{
    Behavior, FakeHttpProxy, HttpProxyOpts, LIAR_PAGE, closed_port, http_proxy, ip,
};
use common::site::{CAPTCHA_PAGE, Politeness, Reply, Site, SiteOpts, tree_page};
use common::{AliveProxy, store_with_alive, within, working_proxies};
use proxywarden::crawl::{CrawlOptions, Progress, Select, Summary, crawl};
use proxywarden::health::{Feedback, load_index};
use proxywarden::pool::{NoProxy, Pool, PoolOptions, SharedOptions};
use tokio_util::sync::CancellationToken;

/// Limits short enough for failing proxies, long enough for a loaded
/// machine's loopback.
fn quick() -> PoolOptions {
    PoolOptions {
        connect_timeout: Duration::from_secs(2),
        first_byte_timeout: Duration::from_secs(3),
        total_timeout: Duration::from_secs(5),
        retry_backoff: Duration::from_millis(10),
        no_proxy: NoProxy::Wait(Duration::from_secs(5)),
        ..PoolOptions::default()
    }
}

async fn pool_of(dir: &Path, proxies: &[AliveProxy], opts: PoolOptions) -> Pool {
    let (store, _) = store_with_alive(&dir.join("p.db"), proxies).await;
    let index = load_index(&store).await.unwrap();
    Pool::new(Feedback::new(index, store), SharedOptions::default(), opts).unwrap()
}

fn options(dir: &Path, seed: &str) -> CrawlOptions {
    CrawlOptions {
        seeds: vec![seed.parse().unwrap()],
        output: Some(dir.join("pages.jsonl")),
        concurrency: 8,
        robots_retry: Duration::from_millis(100),
        grace: Duration::from_secs(5),
        ..CrawlOptions::default()
    }
}

async fn run(pool: &Pool, opts: CrawlOptions) -> Summary {
    crawl(
        pool,
        opts,
        CancellationToken::new(),
        Arc::new(Progress::default()),
    )
    .await
    .unwrap()
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `/p/{i}` paths the site was asked for, and how often.
fn page_hits(site: &Site) -> HashMap<String, usize> {
    site.per_path()
        .into_iter()
        .filter(|(p, _)| p != "/robots.txt")
        .collect()
}

/// A tree of `n` pages whose pages also carry links that must not make new
/// fetches: tracking and fragment variants, other schemes, another site.
fn noisy_tree(n: usize, fanout: usize, elsewhere: String) -> SiteOpts {
    SiteOpts::new(move |path, _| {
        let mut r = tree_page(path, n, fanout);
        if r.status == 200 {
            let extra = format!(
                "<a href=\"/p/1?utm_source=news#x\">a</a><a href=\"/p/1#top\">b</a>\
                 <a href=\"/p/2?ref=home\">c</a><a href=\"mailto:a@b.c\">m</a>\
                 <a href=\"javascript:void(0)\">j</a><a href=\"{elsewhere}\">out</a>"
            );
            let body = String::from_utf8(r.body)
                .unwrap()
                .replace("</body>", &format!("{extra}</body>"));
            r.body = body.into_bytes();
        }
        r
    })
}

#[tokio::test]
async fn every_reachable_page_is_fetched_once_through_proxies_only() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let other = Site::start(SiteOpts::new(|_, _| Reply::html("other site"))).await;
        let site = Site::start(noisy_tree(40, 3, other.url("/x"))).await;
        let (good, mut proxies) = working_proxies(2).await;
        let liar = FakeHttpProxy::start(HttpProxyOpts {
            behavior: Behavior::Liar,
            ..HttpProxyOpts::default()
        })
        .await;
        let dead = closed_port();
        proxies.push(AliveProxy::new(liar.url()));
        proxies.push(AliveProxy::new(format!("http://{dead}")));
        let pool = pool_of(dir.path(), &proxies, quick()).await;

        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;

        let hits = page_hits(&site);
        let mut expected: HashSet<String> = (1..40).map(|i| format!("/p/{i}")).collect();
        expected.insert("/".into());
        assert_eq!(hits.keys().cloned().collect::<HashSet<_>>(), expected);
        assert!(hits.values().all(|&n| n == 1), "fetched twice: {hits:?}");
        assert_eq!(site.hits("/robots.txt"), 1);
        assert!(other.log().is_empty(), "out of scope");
        let peers: HashSet<IpAddr> = site.log().iter().map(|h| h.peer).collect();
        assert!(
            peers.is_subset(&HashSet::from([ip(2), ip(3)])),
            "direct or liar: {peers:?}"
        );

        let out = lines(&dir.path().join("pages.jsonl"));
        assert_eq!(out.len(), 40);
        for l in &out {
            assert_eq!(l["status"], 200, "{l}");
            assert!(!l.to_string().contains(LIAR_PAGE));
            let via = l["proxy"].as_str().unwrap();
            assert!(good.iter().any(|g| g.url() == via), "{via}");
            assert_eq!(l["sha256"].as_str().unwrap().len(), 64);
            assert!(l["title"].as_str().unwrap().starts_with("Page "));
        }
        let root = out.iter().find(|l| l["depth"] == 0).unwrap();
        assert_eq!(root["url"], site.url("/"));
        assert_eq!(root["links"], 9, "3 children and 6 noisy links");
        let p4 = out.iter().find(|l| l["url"] == site.url("/p/4")).unwrap();
        assert_eq!(
            (p4["depth"].as_u64(), p4["parent"].as_str()),
            (Some(2), Some(site.url("/p/1").as_str()))
        );
        assert_eq!(
            (summary.ok(), summary.failed(), summary.pool.direct),
            (40, 0, 0)
        );
        assert!(
            summary.pool.proxies_failed >= 1,
            "the liar or the dead one was tried: {summary}"
        );
    })
    .await;
}

#[tokio::test]
async fn depth_and_page_limits_bound_the_crawl() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|p, _| tree_page(p, 100, 3))).await;
        let a = http_proxy(2).await;
        let pool = pool_of(dir.path(), &[AliveProxy::new(a.url())], quick()).await;
        let summary = run(
            &pool,
            CrawlOptions {
                max_depth: Some(2),
                ..options(dir.path(), &site.url("/"))
            },
        )
        .await;
        // Depth 0: "/", depth 1: 1..=3, depth 2: 4..=12.
        assert_eq!(summary.ok(), 13);
        assert_eq!(page_hits(&site).len(), 13);
        let sub = dir.path().join("limited");
        std::fs::create_dir(&sub).unwrap();
        let site2 = Site::start(SiteOpts::new(|p, _| tree_page(p, 100, 3))).await;
        let summary = run(
            &pool,
            CrawlOptions {
                max_pages: Some(7),
                ..options(&sub, &site2.url("/"))
            },
        )
        .await;
        assert_eq!(summary.ok(), 7);
        assert_eq!(page_hits(&site2).len(), 7);
        assert!(summary.queued > 0);
    })
    .await;
}

#[tokio::test]
async fn robots_txt_and_its_crawl_delay_are_obeyed() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::new(|p, _| tree_page(p, 13, 3));
        opts.robots = Some(Reply::text(
            "User-agent: *\nDisallow: /\n\nUser-agent: nicebot\nDisallow: /p/2\nCrawl-delay: 0.2\n",
        ));
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(3).await;
        let pool = pool_of(
            dir.path(),
            &alive,
            PoolOptions {
                user_agent: "nicebot/1.0".into(),
                ..quick()
            },
        )
        .await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        let hits = page_hits(&site);
        // /p/2 is disallowed, so its children 7, 8, 9 are never found.
        let expected: HashSet<String> = [
            "/", "/p/1", "/p/3", "/p/4", "/p/5", "/p/6", "/p/10", "/p/11", "/p/12",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(hits.keys().cloned().collect::<HashSet<_>>(), expected);
        assert_eq!(summary.disallowed, 1);
        // Request starts are spaced by the Crawl-delay, whichever proxy
        // carries them; arrivals at the site jitter by the proxy hop.
        let log = site.log();
        for w in log.windows(2) {
            let gap = w[1].at - w[0].at;
            assert!(
                gap >= Duration::from_millis(100),
                "{gap:?} between {} and {}",
                w[0].path,
                w[1].path
            );
        }
        let span = log.last().unwrap().at - log[0].at;
        let mean = span / (log.len() as u32 - 1);
        assert!(mean >= Duration::from_millis(195), "{mean:?}");
        assert!(
            log.iter()
                .all(|h| h.user_agent.as_deref() == Some("nicebot/1.0"))
        );
        let peers: HashSet<IpAddr> = log.iter().map(|h| h.peer).collect();
        assert!(peers.len() >= 2, "spread over proxies: {peers:?}");
    })
    .await;
}

#[tokio::test]
async fn an_unreachable_robots_txt_holds_the_host_then_fails_its_pages() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::new(|p, _| tree_page(p, 5, 2));
        opts.robots = Some(Reply::status(500));
        let site = Site::start(opts).await;
        let a = http_proxy(2).await;
        let pool = pool_of(
            dir.path(),
            &[AliveProxy::new(a.url())],
            PoolOptions {
                target_retries: 0,
                ..quick()
            },
        )
        .await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        assert!(
            page_hits(&site).is_empty(),
            "nothing fetched while robots.txt is unknown"
        );
        assert_eq!(site.hits("/robots.txt"), 3);
        assert_eq!(summary.failed_by_reason.get("robots_unavailable"), Some(&1));
        let failed = lines(&dir.path().join("failed.jsonl"));
        assert_eq!(failed.len(), 1);
        assert!(
            failed[0]["error"]
                .as_str()
                .unwrap()
                .starts_with("robots_unavailable")
        );
    })
    .await;
}

#[tokio::test]
async fn a_site_that_429s_slows_the_crawl_and_every_page_arrives() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::new(|p, _| tree_page(p, 12, 3));
        opts.rate_limit = Some(common::site::RateLimit {
            max: 3,
            window: Duration::from_secs(1),
            retry_after: 1,
        });
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(2).await;
        let pool = pool_of(
            dir.path(),
            &alive,
            PoolOptions {
                target_retries: 5,
                ..quick()
            },
        )
        .await;
        let summary = run(
            &pool,
            CrawlOptions {
                per_host_concurrency: 1,
                ..options(dir.path(), &site.url("/"))
            },
        )
        .await;
        assert_eq!((summary.ok(), summary.failed()), (12, 0), "{summary}");
        let out = lines(&dir.path().join("pages.jsonl"));
        assert!(out.iter().all(|l| l["status"] == 200));
        // After each 429 the host rests for its Retry-After, whichever
        // proxy would carry the next request.
        let log = site.log();
        let mut limited = 0;
        for (i, h) in log.iter().enumerate() {
            let was_429 = log[..i]
                .iter()
                .filter(|e| e.peer == h.peer && h.at - e.at < Duration::from_secs(1))
                .count()
                >= 3;
            if was_429 {
                limited += 1;
                if let Some(next) = log.get(i + 1) {
                    let gap = next.at - h.at;
                    assert!(gap >= Duration::from_millis(950), "{gap:?} after a 429");
                }
            }
        }
        assert!(limited > 0, "the site did rate-limit");
        assert!(summary.pool.target_retries > 0);
    })
    .await;
}

#[tokio::test]
async fn redirects_out_of_scope_are_not_followed() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let other = Site::start(SiteOpts::new(|_, _| Reply::html("elsewhere"))).await;
        let out_url = other.url("/landing");
        let site = Site::start(SiteOpts::new(move |p, _| match p.split('?').next().unwrap_or(p) {
            "/" => Reply::html(
                "<title>home</title><a href=\"/go-out\">o</a><a href=\"/go-in\">i</a><a href=\"/kept\">k</a>",
            ),
            "/go-out" => Reply::redirect(302, &out_url),
            "/go-in" => Reply::redirect(301, "/kept?utm_campaign=x"),
            "/kept" => Reply::html("<title>kept</title>"),
            _ => Reply::status(404),
        }))
        .await;
        let a = http_proxy(2).await;
        let pool = pool_of(dir.path(), &[AliveProxy::new(a.url())], quick()).await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        assert!(other.log().is_empty(), "never left the host");
        let kept = site.hits("/kept") + site.hits("/kept?utm_campaign=x");
        assert_eq!(kept, 1, "reached once, through the redirect or the link");
        let out = lines(&dir.path().join("pages.jsonl"));
        let go_out = out.iter().find(|l| l["url"] == site.url("/go-out")).unwrap();
        assert_eq!(go_out["status"], 302);
        assert!(go_out["error"].is_null());
        assert_eq!(summary.failed(), 0);
    })
    .await;
}

#[tokio::test]
async fn proxies_dying_or_banned_mid_crawl_cost_no_page() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::new(|p, _| tree_page(p, 60, 4));
        opts.banned = vec![ip(4)];
        opts.latency = Duration::from_millis(10);
        let site = Site::start(opts).await;
        let steady = http_proxy(2).await;
        let dying = http_proxy(3).await;
        let banned = http_proxy(4).await;
        let pool = pool_of(
            dir.path(),
            &[
                AliveProxy::new(steady.url()),
                AliveProxy::new(dying.url()),
                AliveProxy::new(banned.url()),
            ],
            quick(),
        )
        .await;
        let progress = Arc::new(Progress::default());
        let crawling = tokio::spawn({
            let pool = pool.clone();
            let opts = CrawlOptions {
                concurrency: 4,
                ..options(dir.path(), &site.url("/"))
            };
            let progress = progress.clone();
            async move {
                crawl(&pool, opts, CancellationToken::new(), progress)
                    .await
                    .unwrap()
            }
        });
        // Kill one proxy once a fifth of the site is done.
        let mut dying = Some(dying);
        while progress.done.load(Ordering::Relaxed) < 12 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        dying.take();
        let summary = crawling.await.unwrap();
        assert_eq!((summary.ok(), summary.failed()), (60, 0), "{summary}");
        let out = lines(&dir.path().join("pages.jsonl"));
        assert!(out.iter().all(|l| !l.to_string().contains(CAPTCHA_PAGE)));
        assert!(
            out.iter()
                .all(|l| l["title"].as_str().is_some_and(|t| t.starts_with("Page")))
        );
        assert!(
            out.iter().all(|l| l["proxy"] != banned.url()),
            "captcha proxy"
        );
        let site_key = format!("127.0.0.1:{}", site.addr.port());
        let bans = summary.pool.banned_by_site.get(&site_key).copied();
        assert!(bans.unwrap_or(0) <= 1, "{summary}");
        if site.log().iter().any(|h| h.peer == ip(4)) {
            assert_eq!(bans, Some(1), "the captcha banned the pair: {summary}");
        }
        assert!(page_hits(&site).values().all(|&n| n <= 2));
    })
    .await;
}

#[tokio::test]
async fn selected_fields_and_bodies_are_kept() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|p, _| tree_page(p, 4, 3))).await;
        let a = http_proxy(2).await;
        let pool = pool_of(dir.path(), &[AliveProxy::new(a.url())], quick()).await;
        let bodies = dir.path().join("bodies");
        std::fs::create_dir(&bodies).unwrap();
        run(
            &pool,
            CrawlOptions {
                selects: vec![
                    Select::parse("title=h1").unwrap(),
                    Select::parse("price=.price").unwrap(),
                ],
                bodies: Some(bodies.clone()),
                ..options(dir.path(), &site.url("/"))
            },
        )
        .await;
        let out = lines(&dir.path().join("pages.jsonl"));
        assert_eq!(out.len(), 4);
        let p3 = out.iter().find(|l| l["url"] == site.url("/p/3")).unwrap();
        assert_eq!(
            p3["fields"],
            serde_json::json!({"title": "Page 3", "price": "3.99"})
        );
        let body = std::fs::read(bodies.join(p3["sha256"].as_str().unwrap())).unwrap();
        assert_eq!(body, tree_page("/p/3", 4, 3).body);
        assert_eq!(p3["bytes"], body.len());
    })
    .await;
}

#[tokio::test]
async fn failed_pages_are_listed_and_retried_on_request() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let fixed = Arc::new(AtomicBool::new(false));
        let site = Site::start(SiteOpts::new({
            let fixed = fixed.clone();
            move |p, _| {
                if p == "/p/2" && !fixed.load(Ordering::Relaxed) {
                    Reply::status(500)
                } else {
                    tree_page(p, 10, 3)
                }
            }
        }))
        .await;
        let a = http_proxy(2).await;
        let pool = pool_of(
            dir.path(),
            &[AliveProxy::new(a.url())],
            PoolOptions {
                target_retries: 1,
                ..quick()
            },
        )
        .await;
        let state = dir.path().join("crawl.db");
        let first = run(
            &pool,
            CrawlOptions {
                state: Some(state.clone()),
                ..options(dir.path(), &site.url("/"))
            },
        )
        .await;
        assert_eq!((first.ok(), first.failed()), (6, 1), "{first}");
        let failed = lines(&dir.path().join("failed.jsonl"));
        assert_eq!(failed.len(), 1);
        assert_eq!(
            (failed[0]["url"].as_str(), failed[0]["status"].as_u64()),
            (Some(site.url("/p/2").as_str()), Some(500))
        );

        fixed.store(true, Ordering::Relaxed);
        let again = run(
            &pool,
            CrawlOptions {
                seeds: Vec::new(),
                state: Some(state.clone()),
                retry_failed: true,
                ..options(dir.path(), &site.url("/"))
            },
        )
        .await;
        // /p/2 and its children 7, 8, 9; nothing else again.
        assert_eq!((again.ok(), again.failed()), (4, 0), "{again}");
        let hits = page_hits(&site);
        assert_eq!(hits["/p/2"], 3, "two tries the first time, one now");
        assert!(
            hits.iter()
                .filter(|(p, _)| *p != "/p/2")
                .all(|(_, &n)| n == 1),
            "{hits:?}"
        );
        let out = lines(&dir.path().join("pages.jsonl"));
        assert_eq!(out.len(), 11, "10 pages and the failed line of /p/2");
    })
    .await;
}

/// Crawls the site of `row` with its politeness; what went wrong, if
/// anything.
async fn crawl_row(dir: &Path, alive: &[AliveProxy], row: Politeness) -> Result<(), String> {
    let site = row.site().await;
    let pool_opts = quick();
    let timeout = pool_opts.total_timeout;
    let pool = pool_of(dir, alive, pool_opts).await;
    let crawl_opts = CrawlOptions {
        ignore_robots: row.ignore_robots,
        delay: row.delay,
        per_host_concurrency: row.per_host,
        ..options(dir, &site.url("/"))
    };
    let bound = Politeness::HUNG;
    let Ok(summary) = tokio::time::timeout(bound, run(&pool, crawl_opts)).await else {
        return Err(format!(
            "still running after {bound:?} with {} requests made",
            site.log().len()
        ));
    };
    let ended = Instant::now();
    let pages = row.check(&site, ended, timeout)?;
    if summary.ok() != pages as u64 || summary.failed() != 0 {
        return Err(format!("summary: {summary}"));
    }
    Ok(())
}

// Two workers: sixteen crawls starting at once on one thread would delay
// their first requests by more than the spacing under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_politeness_combination_fetches_its_pages_and_ends_promptly() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxies, alive) = working_proxies(3).await;
        let rows = Politeness::table();
        let runs = rows.iter().enumerate().map(|(i, row)| {
            let sub = dir.path().join(i.to_string());
            std::fs::create_dir(&sub).unwrap();
            let alive = &alive;
            async move { (row, crawl_row(&sub, alive, *row).await) }
        });
        let failed: Vec<String> = futures::future::join_all(runs)
            .await
            .into_iter()
            .filter_map(|(row, r)| r.err().map(|e| format!("{row:?}: {e}")))
            .collect();
        assert!(
            failed.is_empty(),
            "{} of {} combinations failed:\n{}",
            failed.len(),
            rows.len(),
            failed.join("\n")
        );
    })
    .await;
}

#[tokio::test]
async fn a_crawl_ends_with_its_last_page_though_many_links_need_no_request() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // Every page links to twenty tag pages robots.txt disallows: most
        // of what the crawl learns needs no request.
        let mut opts = SiteOpts::new(|p, _| {
            let mut r = tree_page(p, 30, 3);
            if r.status == 200 {
                let tags: String = (0..20)
                    .map(|k| format!("<a href=\"/tag{p}/{k}\">t</a>"))
                    .collect();
                let body = String::from_utf8(r.body).unwrap();
                r.body = body
                    .replace("</body>", &format!("{tags}</body>"))
                    .into_bytes();
            }
            r
        });
        opts.robots = Some(Reply::text("User-agent: *\nDisallow: /tag\n"));
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(3).await;
        let pool_opts = quick();
        let timeout = pool_opts.total_timeout;
        let pool = pool_of(dir.path(), &alive, pool_opts).await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        let ended = Instant::now();
        assert_eq!((summary.ok(), summary.failed()), (30, 0), "{summary}");
        assert_eq!(summary.disallowed, 600, "{summary}");
        assert!(page_hits(&site).keys().all(|p| !p.starts_with("/tag")));
        let last = site.log().last().unwrap().at;
        assert!(
            ended - last <= timeout,
            "ended {:?} after its last request (request timeout {timeout:?})",
            ended - last
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// The binary

/// A config whose database holds the given proxies, and the path to it.
async fn binary_setup(dir: &Path, proxies: &[AliveProxy]) -> PathBuf {
    store_with_alive(&dir.join("test.db"), proxies).await;
    common::write_config(dir, &common::config_toml(dir, ""))
}

fn crawl_cmd(config: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"));
    cmd.arg("-c").arg(config).arg("crawl").args(args);
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Waits until `path` has at least `n` lines.
async fn wait_lines(path: &Path, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let have = std::fs::read_to_string(path).map_or(0, |s| s.lines().count());
        if have >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {have} lines in {}",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The URLs of the output lines a crawl's state records as committed, and
/// how many lines follow them.
fn committed_lines(state: &Path, out: &Path) -> (HashSet<String>, usize) {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY;
    let len: Option<String> = rusqlite::Connection::open_with_flags(state, flags)
        .ok()
        .and_then(|c| {
            c.query_row(
                "SELECT value FROM crawl_meta WHERE key = 'output_len'",
                [],
                |r| r.get(0),
            )
            .ok()
        });
    let len: usize = len.map_or(0, |l| l.parse().unwrap());
    let text = std::fs::read(out).unwrap_or_default();
    let (done, after) = text.split_at(len);
    fn lines(bytes: &[u8]) -> Vec<&[u8]> {
        bytes
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .collect()
    }
    let committed = lines(done)
        .into_iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            v["url"].as_str().unwrap().to_owned()
        })
        .collect();
    // A line after the commit may still be on its way, torn.
    (committed, lines(after).len())
}

fn urls_once(out: &[serde_json::Value]) -> HashSet<String> {
    let mut seen = HashSet::new();
    for l in out {
        let u = l["url"].as_str().unwrap().to_owned();
        assert!(seen.insert(u.clone()), "{u} written twice");
    }
    seen
}

#[tokio::test]
async fn a_killed_crawl_resumes_without_fetching_pages_again() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(80, 3, Duration::from_millis(30)).await;
        let (_proxies, alive) = working_proxies(2).await;
        let config = binary_setup(dir.path(), &alive).await;
        let out = dir.path().join("pages.jsonl");
        let state = dir.path().join("crawl.db");
        let url = site.url("/");
        let args = [
            url.as_str(),
            "--state",
            state.to_str().unwrap(),
            "--output",
            out.to_str().unwrap(),
            "--concurrency",
            "4",
        ];
        let mut first = crawl_cmd(&config, &args).spawn().unwrap();
        // Killed once ten pages are committed, whatever was written since.
        let deadline = Instant::now() + Duration::from_secs(30);
        while committed_lines(&state, &out).0.len() < 10 {
            assert!(Instant::now() < deadline, "ten pages never committed");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        first.start_kill().unwrap();
        let status = first.wait().await.unwrap();
        assert!(!status.success());
        // Pages whose lines the crawl committed before the kill are done for
        // good; lines written after the last commit are cut on resume and
        // their pages fetched again, like the pages in flight.
        let (committed, uncommitted) = committed_lines(&state, &out);
        assert!(committed.len() >= 10, "{committed:?}");

        let second = crawl_cmd(&config, &args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&second.stderr);
        assert!(second.status.success(), "{stderr}");
        assert!(
            stderr.starts_with("crawl finished"),
            "only the summary when piped: {stderr}"
        );
        let pages = lines(&out);
        let urls = urls_once(&pages);
        assert_eq!(urls.len(), 80);
        let hits = page_hits(&site);
        let twice: Vec<&String> = hits
            .iter()
            .filter(|(_, n)| **n > 1)
            .map(|(p, _)| p)
            .collect();
        // Only pages in flight at the kill (at most the concurrency) or
        // written after the last commit again, and none twice more.
        assert!(twice.len() <= 4 + uncommitted, "{twice:?}");
        assert!(hits.values().all(|&n| n <= 2));
        let root = site.url("/");
        let again: Vec<&&String> = twice
            .iter()
            .filter(|p| committed.contains(&format!("{}{}", root.trim_end_matches('/'), p)))
            .collect();
        assert!(
            again.is_empty(),
            "committed before the kill yet fetched again: {again:?}"
        );
    })
    .await;
}

/// Sends `signal` to a crawl once it wrote a few pages: the pages in flight
/// finish and are written, the summary is printed, the exit status is 130,
/// and `resume` (the arguments of a second run) picks up from there.
async fn stop_and_resume(signal: &str, resume_with_the_same_line: bool) {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::tree(120, 4, Duration::from_millis(50)).await;
    let a = http_proxy(2).await;
    let config = binary_setup(dir.path(), &[AliveProxy::new(a.url())]).await;
    let out = dir.path().join("pages.jsonl");
    let state = dir.path().join("crawl.db");
    let url = site.url("/");
    let args = [
        url.as_str(),
        "--state",
        state.to_str().unwrap(),
        "-o",
        out.to_str().unwrap(),
    ];
    let child = crawl_cmd(&config, &args).spawn().unwrap();
    wait_lines(&out, 5).await;
    let pid = child.id().unwrap().to_string();
    let kill = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .unwrap();
    assert!(kill.success());
    let done = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(done.status.code(), Some(130), "{signal}: {stderr}");
    assert!(stderr.contains("crawl interrupted"), "{signal}: {stderr}");
    let pages = lines(&out);
    let fetched: usize = page_hits(&site).values().sum();
    // Everything started was finished and written.
    assert_eq!(pages.len(), fetched, "{stderr}");
    assert!(pages.len() < 120);

    let state_only = ["--state", state.to_str().unwrap()];
    let again: &[&str] = if resume_with_the_same_line {
        &args
    } else {
        &state_only
    };
    let rest = crawl_cmd(&config, again).output().await.unwrap();
    assert!(
        rest.status.success(),
        "{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    assert_eq!(urls_once(&lines(&out)).len(), 120);
    assert!(page_hits(&site).values().all(|&n| n == 1));
}

#[tokio::test]
async fn ctrl_c_finishes_the_pages_in_flight_and_exits_130() {
    within(stop_and_resume("-INT", false)).await;
}

#[tokio::test]
async fn sigterm_stops_a_crawl_as_ctrl_c_does_and_the_same_line_resumes_it() {
    within(stop_and_resume("-TERM", true)).await;
}

#[tokio::test]
async fn a_terminal_shows_a_progress_line_and_a_pipe_only_the_summary() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(30, 3, Duration::from_millis(60)).await;
        let a = http_proxy(2).await;
        let config = binary_setup(dir.path(), &[AliveProxy::new(a.url())]).await;
        let url = site.url("/");
        let out = dir.path().join("tty.jsonl");
        // `script` (util-linux) runs the crawl on a pseudo-terminal and
        // copies what the terminal showed to its stdout.
        let line = format!(
            "'{}' -c '{}' crawl '{url}' --per-host-concurrency 1 -o '{}'",
            env!("CARGO_BIN_EXE_proxywarden"),
            config.display(),
            out.display()
        );
        let tty = tokio::process::Command::new("script")
            .args(["-qfec", &line, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .await
            .expect("script (util-linux) runs");
        let shown = String::from_utf8_lossy(&tty.stdout);
        assert!(tty.status.success(), "{shown}");
        assert_eq!(lines(&out).len(), 30);
        let redraw = "\r\x1b[2K";
        let progress: Vec<&str> = shown
            .split(redraw)
            .filter(|l| l.contains(" in flight, "))
            .collect();
        assert!(
            !progress.is_empty(),
            "no progress line on a terminal: {shown:?}"
        );
        assert!(
            progress
                .iter()
                .all(|l| l.contains(" pages (") && l.contains("pages/s; proxies ")),
            "{progress:?}"
        );
        // The line is cleared before the summary.
        let summary = shown.rfind("crawl finished").expect("the summary");
        assert!(shown[..summary].ends_with(redraw), "{shown:?}");

        // Piped: the summary alone.
        let out = dir.path().join("piped.jsonl");
        let piped = crawl_cmd(&config, &[url.as_str(), "-o", out.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&piped.stderr);
        assert!(piped.status.success(), "{stderr}");
        assert!(stderr.starts_with("crawl finished"), "{stderr:?}");
        assert!(
            !stderr.contains(" in flight") && !stderr.contains('\x1b'),
            "{stderr:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn a_crawl_whose_filters_match_no_proxy_ends_saying_so() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(10, 3, Duration::ZERO).await;
        let a = http_proxy(2).await;
        let config = binary_setup(dir.path(), &[AliveProxy::new(a.url())]).await;
        let url = site.url("/");
        let out = dir.path().join("pages.jsonl");
        // `fail` is given an hour to wait, which it must not take: it ends
        // within the 20 s below. `wait` ends once its 2 s are out.
        for (policy, wait) in [("fail", "1h"), ("wait", "2s")] {
            let started = Instant::now();
            let args = [
                url.as_str(),
                "--country",
                "XX",
                "--on-no-proxy",
                policy,
                "--no-proxy-wait",
                wait,
                "-v",
                "-o",
                out.to_str().unwrap(),
            ];
            let done =
                tokio::time::timeout(Duration::from_secs(20), crawl_cmd(&config, &args).output())
                    .await
                    .unwrap_or_else(|_| panic!("--on-no-proxy {policy}: still crawling after 20 s"))
                    .unwrap();
            let took = started.elapsed();
            let stderr = String::from_utf8_lossy(&done.stderr);
            assert!(!done.status.success(), "{policy}: {stderr}");
            if policy == "wait" {
                assert!(
                    took >= Duration::from_secs(2),
                    "{policy}: ended after {took:?}, before its wait: {stderr}"
                );
            }
            assert!(
                stderr.contains("no proxy matches"),
                "{policy}: says why: {stderr}"
            );
            assert!(!stderr.contains("robots.txt"), "{policy}: {stderr}");
        }
        assert!(site.log().is_empty(), "nothing fetched directly");
    })
    .await;
}

// ---------------------------------------------------------------------------
// What a site can do to the crawler

#[tokio::test]
async fn a_page_nested_too_deep_is_parsed_up_to_the_cap_and_its_links_kept() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // 100,000 nested elements (500 KB): unbounded, a parse of minutes.
        let deep = format!(
            "<html><head><title>Deep</title></head><body><a href=\"/before\">b</a>{}\
             <a href=\"/after\">a</a></body></html>",
            "<div>".repeat(100_000)
        );
        let site = Site::start(SiteOpts::routes(vec![
            ("/", Reply::html(deep)),
            ("/before", Reply::html("<title>Before</title>")),
            ("/after", Reply::html("<title>After</title>")),
        ]))
        .await;
        let (_proxies, alive) = working_proxies(1).await;
        let pool = pool_of(dir.path(), &alive, quick()).await;
        // The cap is seen in what the parse kept and said, not in a time:
        // an unbounded parse would also run past `within`'s minute.
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        assert_eq!((summary.ok(), summary.failed()), (2, 0), "{summary}");
        assert_eq!(site.hits("/before"), 1, "a link read before the cap");
        assert_eq!(site.hits("/after"), 0, "a link past the cap");
        let out = lines(&dir.path().join("pages.jsonl"));
        let root = out.iter().find(|l| l["url"] == site.url("/")).unwrap();
        assert_eq!(root["title"], "Deep");
        assert_eq!(root["links"], 1);
        assert_eq!(
            root["parse_stopped"],
            "nested deeper than 1024 elements: links and fields read up to there"
        );
        let before = out
            .iter()
            .find(|l| l["url"] == site.url("/before"))
            .unwrap();
        assert_eq!(before["parse_stopped"], serde_json::Value::Null);
    })
    .await;
}

/// A 3-hop redirect chain on an HTTP/1.1 keep-alive site.
fn redirect_chain() -> SiteOpts {
    SiteOpts::routes(vec![
        ("/r/0", Reply::redirect(302, "/r/1")),
        ("/r/1", Reply::redirect(302, "/r/2")),
        ("/r/2", Reply::redirect(302, "/r/3")),
        ("/r/3", Reply::html("<title>End</title>")),
    ])
}

#[tokio::test]
async fn proxied_crawls_follow_redirects_as_direct_ones_do() {
    within(async {
        // Direct: the chain is followed to its end in one attempt.
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(redirect_chain()).await;
        let direct = pool_of(
            dir.path(),
            &[],
            PoolOptions {
                no_proxy: NoProxy::Direct,
                ..quick()
            },
        )
        .await;
        run(&direct, options(dir.path(), &site.url("/r/0"))).await;
        let want = lines(&dir.path().join("pages.jsonl"));
        assert_eq!(want.len(), 1);
        assert_eq!(
            (
                &want[0]["final_url"],
                &want[0]["status"],
                &want[0]["attempts"]
            ),
            (&site.url("/r/3").into(), &200.into(), &1.into())
        );

        // Through proxies that relay the site's keep-alive answers and hang
        // up after each request: the same, every time, and no proxy blamed.
        for round in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let site = Site::start(redirect_chain()).await;
            let mut fakes = Vec::new();
            let mut alive = Vec::new();
            for _ in 0..3 {
                let p = FakeHttpProxy::start(HttpProxyOpts {
                    keep_alive: true,
                    close_after: Some(1),
                    ..HttpProxyOpts::default()
                })
                .await;
                alive.push(AliveProxy::new(p.url()));
                fakes.push(p);
            }
            let pool = pool_of(dir.path(), &alive, quick()).await;
            let summary = run(&pool, options(dir.path(), &site.url("/r/0"))).await;
            let got = lines(&dir.path().join("pages.jsonl"));
            assert_eq!(got.len(), 1, "round {round}: {got:?}");
            assert_eq!(
                (&got[0]["final_url"], &got[0]["status"], &got[0]["attempts"]),
                (
                    &site.url("/r/3").into(),
                    &want[0]["status"],
                    &want[0]["attempts"]
                ),
                "round {round}: {}",
                got[0]
            );
            for hop in ["/r/0", "/r/1", "/r/2", "/r/3"] {
                assert_eq!(
                    site.hits(hop),
                    1,
                    "round {round}: {hop} {:?}",
                    site.per_path()
                );
            }
            assert_eq!(summary.pool.proxies_failed, 0, "round {round}: {summary}");
        }
    })
    .await;
}

/// How many proxies the pool would serve for `site` now.
fn servable_for(pool: &Pool, site: &Site) -> usize {
    let now = proxywarden::store::now_ms();
    let site_key = site.addr.to_string();
    pool.feedback()
        .select(&Default::default(), Some(&site_key), now)
        .len()
}

/// Short enough that a silent site costs little test time.
fn impatient() -> PoolOptions {
    PoolOptions {
        first_byte_timeout: Duration::from_millis(400),
        total_timeout: Duration::from_millis(800),
        ..quick()
    }
}

#[tokio::test]
async fn a_robots_txt_that_never_answers_backs_the_site_off_and_blames_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::routes(vec![("/", Reply::html("<a href=\"/a\">a</a>"))]);
        opts.robots = Some(Reply::hang());
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(6).await;
        let pool = pool_of(dir.path(), &alive, impatient()).await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        // Three tries of two proxies each, not a rotation through all.
        assert_eq!(site.hits("/robots.txt"), 6, "{summary}");
        assert_eq!(site.hits("/"), 0);
        assert_eq!(summary.failed_by_reason.get("robots_unavailable"), Some(&1));
        assert_eq!(summary.pool.proxies_failed, 0, "{summary}");
        assert_eq!(summary.pool.proxy_failures, 0, "{summary}");
        assert_eq!(
            servable_for(&pool, &site),
            6,
            "every proxy still served, for the site too"
        );
    })
    .await;
}

#[tokio::test]
async fn a_page_that_never_answers_backs_the_site_off_and_blames_no_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::routes(vec![
            (
                "/",
                Reply::html("<a href=\"/a\">a</a><a href=\"/slow\">s</a>"),
            ),
            ("/a", Reply::html("<title>A</title>")),
            ("/slow", Reply::hang()),
        ])
        .await;
        let (_proxies, alive) = working_proxies(6).await;
        let pool = pool_of(dir.path(), &alive, impatient()).await;
        let summary = run(&pool, options(dir.path(), &site.url("/"))).await;
        assert_eq!((site.hits("/"), site.hits("/a")), (1, 1));
        // Two proxies a try, three tries with the site backed off between.
        assert_eq!(site.hits("/slow"), 6, "{summary}");
        assert_eq!(summary.ok(), 2, "{summary}");
        assert_eq!(summary.failed_by_reason.get("site_timeout"), Some(&1));
        let failed = lines(&dir.path().join("failed.jsonl"));
        assert_eq!(failed.len(), 1);
        assert_eq!(failed[0]["url"], site.url("/slow"));
        assert!(
            failed[0]["error"]
                .as_str()
                .unwrap()
                .starts_with("site_timeout: no answer in time through 2 proxies"),
            "{}",
            failed[0]
        );
        assert_eq!(summary.pool.proxies_failed, 0, "{summary}");
        assert_eq!(
            servable_for(&pool, &site),
            6,
            "every proxy still served, for the site too"
        );
    })
    .await;
}

#[tokio::test]
async fn a_crawl_of_more_hosts_than_it_holds_takes_them_in_turn_and_misses_none() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // Six sites (hosts), each a tree of 4 pages; the first links to
        // the others' roots.
        let mut sites = Vec::new();
        for _ in 0..5 {
            sites.push(Site::tree(4, 2, Duration::ZERO).await);
        }
        let links: String = sites
            .iter()
            .map(|s| format!("<a href=\"{}\">x</a>", s.url("/")))
            .collect();
        let hub = Site::start(SiteOpts::new(move |p, _| {
            let mut r = tree_page(p, 4, 2);
            if p == "/" {
                let body = String::from_utf8(r.body)
                    .unwrap()
                    .replace("</body>", &format!("{links}</body>"));
                r.body = body.into_bytes();
            }
            r
        }))
        .await;
        let (_proxies, alive) = working_proxies(2).await;
        let pool = pool_of(dir.path(), &alive, quick()).await;
        let summary = run(
            &pool,
            CrawlOptions {
                scope: proxywarden::crawl::ScopeKind::Any,
                max_hosts: 2,
                ..options(dir.path(), &hub.url("/"))
            },
        )
        .await;
        assert_eq!((summary.ok(), summary.failed()), (24, 0), "{summary}");
        for s in sites.iter().chain([&hub]) {
            let hits = page_hits(s);
            assert_eq!(hits.len(), 4, "{hits:?}");
            assert!(hits.values().all(|&n| n == 1), "{hits:?}");
            assert_eq!(s.hits("/robots.txt"), 1);
        }
        assert_eq!(urls_once(&lines(&dir.path().join("pages.jsonl"))).len(), 24);
    })
    .await;
}

/// `crawl --max-pages 6` on a site whose every page links 3,000 new URLs
/// keeps 60 URLs in its state, not 18,000, and says how many it left out.
#[tokio::test]
async fn a_crawl_with_a_page_limit_bounds_its_frontier_and_says_so() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(common::site::SiteOpts::new(|path, _| {
            let base = path.trim_end_matches('/');
            let links: String = (0..3_000)
                .map(|i| format!("<a href=\"{base}/{i}\">{i}</a>"))
                .collect();
            Reply::html(links)
        }))
        .await;
        let (_proxies, alive) = working_proxies(2).await;
        let config = binary_setup(dir.path(), &alive).await;
        let state = dir.path().join("crawl.db");
        let out = dir.path().join("pages.jsonl");
        let url = site.url("/");
        let args = [
            url.as_str(),
            "--max-pages",
            "6",
            "--state",
            state.to_str().unwrap(),
            "-o",
            out.to_str().unwrap(),
        ];
        let done = crawl_cmd(&config, &args).output().await.unwrap();
        let stderr = String::from_utf8_lossy(&done.stderr);
        assert!(done.status.success(), "{stderr}");
        assert_eq!(lines(&out).len(), 6);
        let c = rusqlite::Connection::open(&state).unwrap();
        let rows: i64 = c
            .query_row("SELECT count(*) FROM crawl_urls", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 60);
        assert!(
            stderr.contains(&format!(
                "links not kept: {} with the frontier full, 0 past the links kept per page",
                6 * 3_000 - 59
            )),
            "{stderr}"
        );
    })
    .await;
}
