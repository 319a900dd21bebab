//! The rotating fetch pool against loopback proxies of every kind and a
//! loopback site: selection and strategies, sticky sessions, in-flight caps,
//! fetching (plain, TLS, compressed, redirected), the classification of
//! every outcome and what it does to the proxy, the retry budgets and the
//! no-proxy policy. Each proxy forwards from its own 127.0.0.x address, so
//! the site tells which proxy carried a request.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::fakes::{
    Behavior, FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, LIAR_PAGE, SocksOpts,
    http_proxy, ip,
};
use common::site::{CAPTCHA_PAGE, Reply, Site, SiteOpts};
use common::{AliveProxy, ThreeCountries, store_with_alive, within, working_proxies};
use proxywarden::health::{Feedback, ProxyQuery, load_index};
use proxywarden::pool::{
    Carrier, FetchError, NoProxy, Pool, PoolOptions, Request, SharedOptions, StrategyKind,
};
use proxywarden::proxy::{Country, Scheme};
use proxywarden::store::{DueCursor, DueLane, Store};

async fn odd_proxy(behavior: Behavior) -> FakeHttpProxy {
    FakeHttpProxy::start(HttpProxyOpts {
        connect: true,
        behavior,
        ..HttpProxyOpts::default()
    })
    .await
}

/// A proxy misbehaving as `behavior` ahead of a working one from
/// 127.0.0.3 in a round-robin pool: the two proxies, the pool and their
/// ids.
async fn odd_then_good(
    dir: &std::path::Path,
    behavior: Behavior,
) -> (FakeHttpProxy, FakeHttpProxy, Pool, Vec<i64>) {
    let odd = odd_proxy(behavior).await;
    let good = http_proxy(3).await;
    let (pool, _, ids) = round_robin_pool(
        dir,
        &[AliveProxy::new(odd.url()), AliveProxy::new(good.url())],
    )
    .await;
    (odd, good, pool, ids)
}

/// Short limits so that failing proxies cost the tests little.
fn quick() -> PoolOptions {
    PoolOptions {
        connect_timeout: Duration::from_secs(1),
        first_byte_timeout: Duration::from_secs(1),
        total_timeout: Duration::from_secs(3),
        retry_backoff: Duration::from_millis(10),
        no_proxy: NoProxy::Wait(Duration::from_secs(2)),
        ..PoolOptions::default()
    }
}

/// A pool on a live index loaded from a store holding `proxies`.
async fn live_pool(
    dir: &std::path::Path,
    proxies: &[AliveProxy],
    opts: PoolOptions,
) -> (Pool, Store, Vec<i64>) {
    live_pool_sharing(dir, proxies, SharedOptions::default(), opts).await
}

/// [`live_pool`] with `shared` options of its own.
async fn live_pool_sharing(
    dir: &std::path::Path,
    proxies: &[AliveProxy],
    shared: SharedOptions,
    opts: PoolOptions,
) -> (Pool, Store, Vec<i64>) {
    let (store, ids) = store_with_alive(&dir.join("p.db"), proxies).await;
    let index = load_index(&store).await.unwrap();
    let pool = Pool::new(Feedback::new(index, store.clone()), shared, opts).unwrap();
    (pool, store, ids)
}

/// A round-robin pool with quick limits over `proxies`, taken in turn.
async fn round_robin_pool(
    dir: &std::path::Path,
    proxies: &[AliveProxy],
) -> (Pool, Store, Vec<i64>) {
    let opts = PoolOptions {
        strategy: StrategyKind::RoundRobin,
        ..quick()
    };
    live_pool(dir, proxies, opts).await
}

fn peers(site: &Site) -> Vec<IpAddr> {
    site.log().iter().map(|h| h.peer).collect()
}

fn count_by_peer(site: &Site) -> HashMap<IpAddr, usize> {
    let mut m = HashMap::new();
    for p in peers(site) {
        *m.entry(p).or_insert(0) += 1;
    }
    m
}

fn carrier_id(page: &proxywarden::pool::Page) -> i64 {
    match page.proxy() {
        Carrier::Proxy { id, .. } => *id,
        Carrier::Direct => panic!("went direct"),
    }
}

#[tokio::test]
async fn the_library_example_fetches_through_a_stored_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("<p>page a</p>"))])).await;
        let a = http_proxy(2).await;
        let b = http_proxy(3).await;
        let (store, _) = store_with_alive(
            &dir.path().join("p.db"),
            &[AliveProxy::new(a.url()), AliveProxy::new(b.url())],
        )
        .await;

        let pool =
            Pool::from_store(&store, SharedOptions::default(), PoolOptions::default()).unwrap();
        let page = pool.get(&site.url("/a")).await.unwrap();
        println!("{} via {}", page.status(), page.proxy());

        assert_eq!(page.status(), 200);
        assert_eq!(page.text(), "<p>page a</p>");
        let via = page.proxy().to_string();
        assert!(via == a.url() || via == b.url(), "{via}");
        assert_eq!(a.requests() + b.requests(), 1);
        // The site saw a proxy's address, never ours.
        assert!(
            [ip(2), ip(3)].contains(&peers(&site)[0]),
            "{:?}",
            peers(&site)
        );
    })
    .await;
}

#[tokio::test]
async fn every_scheme_carries_plain_and_tls_targets_with_credentials() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let plain = Site::start(SiteOpts::routes(vec![("/p", Reply::html("plain page"))])).await;
        let mut tls_opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        tls_opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(tls_opts).await;
        let http = FakeHttpProxy::start(HttpProxyOpts {
            connect: true,
            auth: Some(("alice".into(), "pw1".into())),
            upstream_bind: Some(ip(2)),
            ..HttpProxyOpts::default()
        })
        .await;
        let socks4 = FakeSocks4::start(SocksOpts {
            auth: Some(("bob".into(), String::new())),
            upstream_bind: Some(ip(3)),
            ..SocksOpts::default()
        })
        .await;
        let socks5 = FakeSocks5::start(SocksOpts {
            auth: Some(("carol".into(), "pw3".into())),
            upstream_bind: Some(ip(4)),
            ..SocksOpts::default()
        })
        .await;
        let proxies = [
            AliveProxy::new(format!("http://alice:pw1@{}", http.addr())),
            AliveProxy::new(format!("socks4://bob@{}", socks4.addr())),
            AliveProxy::new(format!("socks5://carol:pw3@{}", socks5.addr())),
        ];
        let (store, _) = store_with_alive(&dir.path().join("p.db"), &proxies).await;
        for (scheme, bind) in [(Scheme::Http, 2), (Scheme::Socks4, 3), (Scheme::Socks5, 4)] {
            let opts = PoolOptions {
                query: ProxyQuery {
                    schemes: vec![scheme],
                    ..ProxyQuery::default()
                },
                ..quick()
            };
            let pool = Pool::new(
                Feedback::new(load_index(&store).await.unwrap(), store.clone()),
                SharedOptions {
                    extra_ca: Some(tls.ca_file().to_owned()),
                    ..SharedOptions::default()
                },
                opts,
            )
            .unwrap();
            let page = pool.get(&plain.url("/p")).await.unwrap();
            assert_eq!(
                (page.status().as_u16(), page.text().as_str()),
                (200, "plain page")
            );
            let page = pool.get(&tls.url("/s")).await.unwrap();
            assert_eq!(
                (page.status().as_u16(), page.text().as_str()),
                (200, "secret page")
            );
            assert_eq!(page.attempts(), 1, "{scheme}");
            assert_eq!(*peers(&plain).last().unwrap(), ip(bind), "{scheme}");
            assert_eq!(*peers(&tls).last().unwrap(), ip(bind), "{scheme}");
        }

        // Without the site's CA the certificate does not verify: no page,
        // whichever proxy tries.
        let pool = Pool::new(
            Feedback::new(load_index(&store).await.unwrap(), store.clone()),
            SharedOptions::default(),
            PoolOptions {
                rotations: 2,
                ..quick()
            },
        )
        .unwrap();
        let err = pool.get(&tls.url("/s")).await.unwrap_err();
        assert!(
            matches!(&err, FetchError::Exhausted { last, .. } if last == "tls_error"),
            "{err:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn filters_choose_which_proxies_carry_requests() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let three = ThreeCountries::start().await;
        let proxies = three.alive();
        let opts = PoolOptions {
            query: ProxyQuery {
                countries: vec![Country::parse("US").unwrap()],
                schemes: vec![Scheme::Socks5],
                ..ProxyQuery::default()
            },
            ..quick()
        };
        let (pool, _, _) = live_pool(dir.path(), &proxies, opts).await;
        for i in 0..6 {
            pool.get(&site.url(&format!("/{i}"))).await.unwrap();
        }
        assert_eq!(count_by_peer(&site), HashMap::from([(ip(4), 6)]));
    })
    .await;
}

#[tokio::test]
async fn round_robin_and_least_used_spread_requests_evenly() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let (_fakes, proxies) = working_proxies(3).await;
        for (i, strategy) in [StrategyKind::RoundRobin, StrategyKind::LeastUsed]
            .into_iter()
            .enumerate()
        {
            let sub = dir.path().join(i.to_string());
            std::fs::create_dir(&sub).unwrap();
            let (pool, _, _) = live_pool(
                &sub,
                &proxies,
                PoolOptions {
                    strategy,
                    ..quick()
                },
            )
            .await;
            let before = count_by_peer(&site);
            for n in 0..9 {
                pool.get(&site.url(&format!("/{n}"))).await.unwrap();
            }
            let after = count_by_peer(&site);
            for last in [2, 3, 4] {
                let used = after.get(&ip(last)).copied().unwrap_or(0)
                    - before.get(&ip(last)).copied().unwrap_or(0);
                assert_eq!(used, 3, "{strategy:?}: {after:?}");
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_proxy_at_its_in_flight_cap_is_not_handed_out() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = SiteOpts::new(|_, _| Reply::html("slow"));
        opts.latency = Duration::from_millis(200);
        let site = Site::start(opts).await;
        let (_proxies, alive) = working_proxies(2).await;
        let (pool, _, _) = live_pool_sharing(
            dir.path(),
            &alive,
            SharedOptions {
                max_in_flight: 1,
                ..SharedOptions::default()
            },
            PoolOptions {
                no_proxy: NoProxy::Wait(Duration::from_secs(10)),
                ..quick()
            },
        )
        .await;
        let started = Instant::now();
        let gets: Vec<_> = (0..6)
            .map(|i| {
                let pool = pool.clone();
                let url = site.url(&format!("/{i}"));
                tokio::spawn(async move { pool.get(&url).await })
            })
            .collect();
        for g in gets {
            assert_eq!(g.await.unwrap().unwrap().status(), 200);
        }
        // Two proxies, one request each at a time: never more than two at
        // the site, so six take three rounds.
        assert_eq!(site.max_in_flight(), 2);
        assert!(started.elapsed() >= Duration::from_millis(600));
        assert_eq!(count_by_peer(&site).len(), 2);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_dies_mid_run_is_cooled_down_and_dropped() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let a = http_proxy(2).await;
        let b = http_proxy(3).await;
        let (pool, store, ids) = round_robin_pool(
            dir.path(),
            &[AliveProxy::new(a.url()), AliveProxy::new(b.url())],
        )
        .await;
        for n in 0..4 {
            pool.get(&site.url(&format!("/{n}"))).await.unwrap();
        }
        assert_eq!(count_by_peer(&site).get(&ip(2)), Some(&2));
        drop(a);
        for n in 4..14 {
            let page = pool.get(&site.url(&format!("/{n}"))).await.unwrap();
            assert_eq!(carrier_id(&page), ids[1]);
        }
        assert_eq!(count_by_peer(&site).get(&ip(3)), Some(&12));
        assert!(pool.is_cooling(ids[0]));
        assert!(pool.index().get(ids[0]).is_none(), "left the index at once");
        let stats = pool.stats();
        assert_eq!(
            (stats.proxy_failures, stats.rotations, stats.pages),
            (1, 1, 14)
        );
        // The failure reached the store: the checker will look at it now.
        let due = store
            .count_due(proxywarden::store::now_ms(), false)
            .await
            .unwrap();
        assert_eq!(due, 1);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_banned_by_one_site_still_serves_another() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut strict = SiteOpts::new(|_, _| Reply::html("<title>shop</title>item"));
        strict.banned = vec![ip(2)];
        let strict = Site::start(strict).await;
        let lenient = Site::start(SiteOpts::new(|_, _| Reply::html("news"))).await;
        let (_proxies, alive) = working_proxies(2).await;
        let (pool, _, ids) = round_robin_pool(dir.path(), &alive).await;
        for n in 0..5 {
            let page = pool.get(&strict.url(&format!("/{n}"))).await.unwrap();
            assert_ne!(page.text(), CAPTCHA_PAGE);
            assert_eq!(carrier_id(&page), ids[1]);
        }
        // One captcha, then never asked again.
        assert_eq!(count_by_peer(&strict).get(&ip(2)), Some(&1));
        let site = format!("127.0.0.1:{}", strict.addr.port());
        assert!(pool.feedback().is_banned(ids[0], &site));
        assert!(!pool.is_cooling(ids[0]), "the proxy itself is fine");
        assert_eq!(pool.stats().banned_by_site.get(&site), Some(&1));
        for n in 0..4 {
            pool.get(&lenient.url(&format!("/{n}"))).await.unwrap();
        }
        assert_eq!(count_by_peer(&lenient).get(&ip(2)), Some(&2));
    })
    .await;
}

#[tokio::test]
async fn a_429_with_retry_after_is_waited_out_on_another_proxy() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|path, hit| match (path, hit) {
            ("/limited", 1) => Reply::status(429).with("Retry-After", "1"),
            ("/forever", _) => Reply::status(429).with("Retry-After", "3600"),
            _ => Reply::html("finally"),
        }))
        .await;
        let (_proxies, alive) = working_proxies(2).await;
        let (pool, _, _) = live_pool(dir.path(), &alive, quick()).await;
        let page = pool.get(&site.url("/limited")).await.unwrap();
        assert_eq!((page.status().as_u16(), page.attempts()), (200, 2));
        let log = site.log();
        assert_eq!(log.len(), 2);
        let gap = log[1].at - log[0].at;
        assert!(
            gap >= Duration::from_secs(1),
            "Retry-After honoured: {gap:?}"
        );
        assert_ne!(log[0].peer, log[1].peer, "the limited pair rests");
        assert_eq!(pool.stats().target_retries, 1);

        let started = Instant::now();
        let err = pool.get(&site.url("/forever")).await.unwrap_err();
        assert_eq!(
            err,
            FetchError::RetryAfterTooLong(Duration::from_secs(3600))
        );
        // One request, no retry, and no wait for the hour asked.
        assert_eq!(site.hits("/forever"), 1);
        assert!(started.elapsed() < PoolOptions::default().max_retry_after);
    })
    .await;
}

#[tokio::test]
async fn a_captive_portal_is_never_returned_as_content() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("<p>the real page</p>"))).await;
        let (liar, _good, pool, ids) = odd_then_good(dir.path(), Behavior::Liar).await;
        for n in 0..4 {
            let page = pool.get(&site.url(&format!("/{n}"))).await.unwrap();
            assert_eq!(page.text(), "<p>the real page</p>");
            assert_eq!(carrier_id(&page), ids[1]);
        }
        assert_eq!(liar.requests(), 1, "asked once, then cooled down");
        assert!(pool.is_cooling(ids[0]));

        // With only the liar left there is no page at all, not the portal.
        let dir2 = tempfile::tempdir().unwrap();
        let (pool, _, _) = live_pool(
            dir2.path(),
            &[AliveProxy::new(liar.url())],
            PoolOptions {
                no_proxy: NoProxy::Fail,
                ..quick()
            },
        )
        .await;
        let err = pool.get(&site.url("/x")).await.unwrap_err();
        assert!(
            matches!(
                err,
                FetchError::NoProxy { .. } | FetchError::Exhausted { .. }
            ),
            "{err:?}"
        );
        assert!(!LIAR_PAGE.is_empty());
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_accepts_and_never_answers_costs_seconds() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let hang = odd_proxy(Behavior::Hang).await;
        let good = http_proxy(3).await;
        // The silent proxy is given up at the first-byte timeout (1 s), the
        // whole request having an hour: a pool that waited for anything but
        // the first byte would run past `within`'s minute.
        let (pool, _, ids) = live_pool(
            dir.path(),
            &[AliveProxy::new(hang.url()), AliveProxy::new(good.url())],
            PoolOptions {
                strategy: StrategyKind::RoundRobin,
                total_timeout: Duration::from_secs(3600),
                ..quick()
            },
        )
        .await;
        let started = Instant::now();
        let page = pool.get(&site.url("/")).await.unwrap();
        let took = started.elapsed();
        assert_eq!(carrier_id(&page), ids[1]);
        assert_eq!(page.attempts(), 2);
        assert!(took >= Duration::from_secs(1), "{took:?}");
        assert!(pool.is_cooling(ids[0]));
        // Defaults are seconds too.
        let d = PoolOptions::default();
        assert!(d.first_byte_timeout <= Duration::from_secs(10));
        assert!(d.total_timeout <= Duration::from_secs(30));
    })
    .await;
}

#[tokio::test]
async fn target_errors_are_not_the_proxys_fault() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![
            ("/ok", Reply::html("ok")),
            ("/boom", Reply::status(500)),
        ]))
        .await;
        let a = http_proxy(2).await;
        let (pool, _, ids) = live_pool(
            dir.path(),
            &[AliveProxy::new(a.url())],
            PoolOptions {
                target_retries: 2,
                ..quick()
            },
        )
        .await;
        let page = pool.get(&site.url("/missing")).await.unwrap();
        assert_eq!((page.status().as_u16(), page.attempts()), (404, 1));
        let page = pool.get(&site.url("/boom")).await.unwrap();
        assert_eq!((page.status().as_u16(), page.attempts()), (500, 3));
        assert_eq!(site.hits("/boom"), 3);
        assert!(!pool.is_cooling(ids[0]));
        assert!(pool.index().get(ids[0]).is_some());
        assert_eq!(pool.get(&site.url("/ok")).await.unwrap().status(), 200);
        let stats = pool.stats();
        assert_eq!((stats.proxy_failures, stats.target_retries), (0, 2));
    })
    .await;
}

#[tokio::test]
async fn without_a_proxy_the_caller_chooses_wait_fail_or_direct() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let (pool, store, _) = live_pool(
            dir.path(),
            &[],
            PoolOptions {
                no_proxy: NoProxy::Fail,
                ..quick()
            },
        )
        .await;
        let err = pool.get(&site.url("/")).await.unwrap_err();
        assert!(matches!(err, FetchError::NoProxy { .. }), "{err:?}");

        let waiting = Pool::new(
            pool.feedback().clone(),
            SharedOptions::default(),
            PoolOptions {
                no_proxy: NoProxy::Wait(Duration::from_millis(300)),
                ..quick()
            },
        )
        .unwrap();
        let started = Instant::now();
        let err = waiting.get(&site.url("/")).await.unwrap_err();
        assert!(matches!(err, FetchError::NoProxy { .. }), "{err:?}");
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(site.log().is_empty(), "nothing went direct");

        // A proxy coming alive while a request waits is used.
        let a = http_proxy(2).await;
        let patient = Pool::new(
            pool.feedback().clone(),
            SharedOptions::default(),
            PoolOptions {
                no_proxy: NoProxy::Wait(Duration::from_secs(10)),
                ..quick()
            },
        )
        .unwrap();
        let url = site.url("/late");
        let get = tokio::spawn({
            let patient = patient.clone();
            async move { patient.get(&url).await }
        });
        common::until("the request is made", Duration::from_secs(5), || async {
            patient.stats().requests == 1
        })
        .await;
        assert!(!get.is_finished(), "it waits for a proxy");
        let (other, _) =
            store_with_alive(&dir.path().join("q.db"), &[AliveProxy::new(a.url())]).await;
        let records = other.list_proxies(Default::default()).await.unwrap();
        pool.feedback().apply(records);
        assert_eq!(get.await.unwrap().unwrap().status(), 200);
        assert_eq!(peers(&site), [ip(2)]);
        drop(store);

        // Direct only when asked.
        let (empty, _, _) = {
            let d = dir.path().join("direct");
            std::fs::create_dir(&d).unwrap();
            live_pool(
                &d,
                &[],
                PoolOptions {
                    no_proxy: NoProxy::Direct,
                    ..quick()
                },
            )
            .await
        };
        let page = empty.get(&site.url("/direct")).await.unwrap();
        assert_eq!(page.proxy(), &Carrier::Direct);
        assert_eq!(*peers(&site).last().unwrap(), ip(1));
        assert_eq!(empty.stats().direct, 1);
    })
    .await;
}

#[tokio::test]
async fn sticky_sessions_keep_their_proxy_until_it_fails_or_wears_out() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let (_fakes, proxies) = working_proxies(3).await;
        let (pool, _, _) = live_pool(
            dir.path(),
            &proxies,
            PoolOptions {
                session_uses: 4,
                ..quick()
            },
        )
        .await;
        let get = |path: &str| {
            let req = Request::new(site.url(path).parse().unwrap())
                .unwrap()
                .session("user-1");
            let pool = pool.clone();
            async move { carrier_id(&pool.fetch(req).await.unwrap()) }
        };
        let first = get("/1").await;
        for n in 2..=4 {
            assert_eq!(get(&format!("/{n}")).await, first);
        }
        // Worn out after four uses: a new binding, which sticks in turn.
        let second = get("/5").await;
        assert_eq!(get("/6").await, second);
        let _ = pool
            .feedback()
            .report(
                second,
                proxywarden::model::UseVerdict::ProxyFailed(None),
                None,
            )
            .await;
        // Its proxy failed (hidden from the index): the session moves on.
        let third = get("/7").await;
        assert_ne!(third, second);
        assert_eq!(get("/8").await, third);
    })
    .await;
}

#[tokio::test]
async fn bodies_are_decoded_capped_and_redirects_stay_in_scope() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let text = "compressed ".repeat(200);
        let other = Site::start(SiteOpts::new(|_, _| Reply::html("elsewhere"))).await;
        let site = Site::start(SiteOpts::routes(vec![
            ("/gz", Reply::gzip(text.as_bytes())),
            ("/br", Reply::brotli(text.as_bytes())),
            ("/big", Reply::html("x".repeat(200_000))),
            ("/r1", Reply::redirect(301, "/r2")),
            ("/r2", Reply::redirect(302, "/final")),
            ("/final", Reply::html("landed")),
            ("/away", Reply::redirect(302, &other.url("/"))),
        ]))
        .await;
        let (_proxies, alive) = working_proxies(2).await;
        let (pool, _, _) = live_pool(
            dir.path(),
            &alive,
            PoolOptions {
                max_body: 100_000,
                ..quick()
            },
        )
        .await;
        assert_eq!(pool.get(&site.url("/gz")).await.unwrap().text(), text);
        assert_eq!(pool.get(&site.url("/br")).await.unwrap().text(), text);
        let err = pool.get(&site.url("/big")).await.unwrap_err();
        assert!(
            matches!(err, FetchError::TooLarge { limit: 100_000, .. }),
            "{err:?}"
        );

        let before = site.log().len();
        let page = pool.get(&site.url("/r1")).await.unwrap();
        assert_eq!(page.text(), "landed");
        assert_eq!(page.final_url().as_str(), site.url("/final"));
        let hops: HashSet<IpAddr> = site.log()[before..].iter().map(|h| h.peer).collect();
        assert_eq!(hops.len(), 1, "every hop through the same proxy");

        let page = pool.get(&site.url("/away")).await.unwrap();
        assert_eq!(page.status(), 302, "another host is out of scope");
        assert!(other.log().is_empty());
        let anywhere: proxywarden::pool::RedirectRule = Arc::new(|_, _| true);
        let req = Request::new(site.url("/away").parse().unwrap())
            .unwrap()
            .follow(anywhere);
        assert_eq!(pool.fetch(req).await.unwrap().text(), "elsewhere");
    })
    .await;
}

#[tokio::test]
async fn a_pool_from_the_store_follows_it() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let a = http_proxy(2).await;
        let path = dir.path().join("p.db");
        let (store, _) = store_with_alive(&path, &[]).await;
        let pool = Pool::from_store(
            &store,
            SharedOptions {
                refresh_every: Duration::from_millis(50),
                ..SharedOptions::default()
            },
            PoolOptions {
                no_proxy: NoProxy::Wait(Duration::from_secs(10)),
                ..quick()
            },
        )
        .unwrap();
        let get = tokio::spawn({
            let pool = pool.clone();
            let url = site.url("/");
            async move { pool.get(&url).await }
        });
        common::until("the request is made", Duration::from_secs(5), || async {
            pool.stats().requests == 1
        })
        .await;
        assert!(!get.is_finished(), "it waits for a proxy");
        // A checker (the daemon, say) finds a proxy alive in the same store.
        let (_, ids) = store_with_alive(&path, &[AliveProxy::new(a.url())]).await;
        let page = get.await.unwrap().unwrap();
        assert_eq!(carrier_id(&page), ids[0]);

        // …and later dead: the pool stops using it.
        let policy = proxywarden::model::RecheckPolicy {
            alive: Duration::from_secs(600),
            alive_jitter: Duration::from_secs(150),
            dead: Duration::from_secs(900),
            dead_max: Duration::from_secs(86_400),
        };
        let dead = common::refused_at(ids[0], proxywarden::store::now_ms());
        store.record_checks(vec![dead], policy).await.unwrap();
        common::until("the refresh", Duration::from_secs(5), || async {
            pool.index().get(ids[0]).is_none()
        })
        .await;
        let hits = a.requests();
        let strict = Pool::new(
            pool.feedback().clone(),
            SharedOptions::default(),
            PoolOptions {
                no_proxy: NoProxy::Fail,
                ..quick()
            },
        )
        .unwrap();
        assert!(matches!(
            strict.get(&site.url("/again")).await,
            Err(FetchError::NoProxy { .. })
        ));
        assert_eq!(a.requests(), hits);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_failed_in_use_is_not_put_back_by_the_next_refresh() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let dead = common::fakes::closed_port();
        let path = dir.path().join("p.db");
        // The store says it is alive: a CLI check found it so a while ago.
        let (store, ids) =
            store_with_alive(&path, &[AliveProxy::new(format!("http://{}", dead.addr()))]).await;
        let pool = Pool::from_store(
            &store,
            SharedOptions {
                refresh_every: Duration::from_millis(20),
                ..SharedOptions::default()
            },
            PoolOptions {
                rotations: 0,
                ..quick()
            },
        )
        .unwrap();
        let failed = pool.get(&site.url("/")).await;
        assert!(
            matches!(failed, Err(FetchError::Exhausted { .. })),
            "{failed:?}"
        );
        assert!(pool.index().get(ids[0]).is_none(), "out at once");
        // A proxy found alive after the failure shows a refresh came since.
        let b = http_proxy(3).await;
        let (_, later) = store_with_alive(&path, &[AliveProxy::new(b.url())]).await;
        common::until("the refresh", Duration::from_secs(10), || async {
            pool.index().get(later[0]).is_some()
        })
        .await;
        assert!(
            pool.index().get(ids[0]).is_none(),
            "the refresh put back a proxy that failed in use"
        );
    })
    .await;
}

#[tokio::test]
async fn a_page_refused_to_every_proxy_is_the_sites_answer() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![
            ("/private", Reply::status(403)),
            ("/ok", Reply::html("ok")),
        ]))
        .await;
        let (_fakes, proxies) = working_proxies(4).await;
        let (pool, _, _) = live_pool(dir.path(), &proxies, quick()).await;
        let page = pool.get(&site.url("/private")).await.unwrap();
        // Three proxies refused alike: not a ban of them, the page's answer.
        assert_eq!((page.status().as_u16(), page.attempts()), (403, 3));
        assert_eq!(site.hits("/private"), 3);
        assert_eq!(pool.get(&site.url("/ok")).await.unwrap().status(), 200);
        assert_eq!(pool.stats().proxy_failures, 0);
    })
    .await;
}

#[tokio::test]
async fn a_connection_is_kept_alive_per_proxy_and_target() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let a = Site::start(SiteOpts::new(|_, _| Reply::html("a"))).await;
        let b = Site::start(SiteOpts::new(|_, _| Reply::html("b"))).await;
        let mut tls_opts = SiteOpts::new(|_, _| Reply::html("s"));
        tls_opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(tls_opts).await;
        let socks5 = FakeSocks5::start(SocksOpts {
            upstream_bind: Some(ip(2)),
            ..SocksOpts::default()
        })
        .await;
        let http = http_proxy(3).await;
        let proxies = [AliveProxy::new(socks5.url()), AliveProxy::new(http.url())];
        let (store, _) = store_with_alive(&dir.path().join("p.db"), &proxies).await;
        let index = load_index(&store).await.unwrap();
        let socks_pool = Pool::new(
            Feedback::new(index.clone(), store.clone()),
            SharedOptions::default(),
            PoolOptions {
                query: ProxyQuery {
                    schemes: vec![Scheme::Socks5],
                    ..ProxyQuery::default()
                },
                ..quick()
            },
        )
        .unwrap();
        for i in 0..3 {
            let page = socks_pool.get(&a.url(&format!("/{i}"))).await.unwrap();
            assert_eq!(page.text(), "a");
        }
        // Three pages of one site through one proxy: one connection.
        assert_eq!(socks5.requests(), 1, "connections to the proxy");
        assert_eq!(a.connections(), 1, "connections reaching the site");
        assert_eq!(a.log().len(), 3);
        // Another site through the same proxy needs its own connection,
        // which is then kept as well.
        socks_pool.get(&b.url("/x")).await.unwrap();
        socks_pool.get(&b.url("/y")).await.unwrap();
        assert_eq!(socks5.requests(), 2);
        assert_eq!(b.connections(), 1);
        socks_pool.get(&a.url("/again")).await.unwrap();
        assert_eq!(socks5.requests(), 2, "the first connection is still kept");

        // A TLS tunnel through an HTTP proxy is kept too: one CONNECT.
        let http_pool = Pool::new(
            Feedback::new(index, store.clone()),
            SharedOptions {
                extra_ca: Some(tls.ca_file().to_owned()),
                ..SharedOptions::default()
            },
            PoolOptions {
                query: ProxyQuery {
                    schemes: vec![Scheme::Http],
                    ..ProxyQuery::default()
                },
                ..quick()
            },
        )
        .unwrap();
        for i in 0..3 {
            let page = http_pool.get(&tls.url(&format!("/{i}"))).await.unwrap();
            assert_eq!(page.text(), "s");
        }
        assert_eq!(http.requests(), 1, "one CONNECT for three pages");
        assert_eq!(tls.connections(), 1);
    })
    .await;
}

/// Counts the turns requests took at the site, and the times their bytes
/// left.
#[derive(Default)]
struct CountingPacer {
    turns: std::sync::atomic::AtomicUsize,
    sent: std::sync::atomic::AtomicUsize,
}

impl CountingPacer {
    fn turns(&self) -> usize {
        self.turns.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn sent(&self) -> usize {
        self.sent.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl proxywarden::pool::Pacer for CountingPacer {
    fn wait<'a>(
        &'a self,
        _url: &'a url::Url,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'a>> {
        self.turns.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async {})
    }

    fn answered(&self, _: &url::Url, _: Option<http::StatusCode>, _: Option<Duration>) {}

    fn sent(&self, _: &url::Url) {
        self.sent.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test]
async fn the_pacer_hears_when_a_request_leaves_again_on_a_new_connection() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        // Keeps a connection after one answer, then hangs up on the next
        // request: each reuse is found closed and the request goes again on
        // a new connection, after its turn at the site was granted.
        let proxy = FakeHttpProxy::start(HttpProxyOpts {
            keep_alive: true,
            close_after: Some(1),
            ..HttpProxyOpts::default()
        })
        .await;
        let (pool, _, _) = round_robin_pool(dir.path(), &[AliveProxy::new(proxy.url())]).await;
        let pacer = Arc::new(CountingPacer::default());
        for i in 0..3 {
            let req = Request::new(site.url(&format!("/{i}")).parse().unwrap())
                .unwrap()
                .pacer(pacer.clone());
            let page = pool.fetch(req).await.unwrap();
            assert_eq!((page.text(), page.attempts()), ("ok".to_owned(), 1));
        }
        assert_eq!(site.log().len(), 3);
        assert_eq!(pacer.turns(), 3, "one turn a request");
        // The first went once; the others on a kept connection found
        // closed, then again on a new one: the pacer counts the delay to
        // the next request from that last send.
        assert_eq!(pacer.sent(), 5);
    })
    .await;
}

#[tokio::test]
async fn a_dead_proxy_costs_the_site_no_turn() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let dead: Vec<_> = (0..3).map(|_| common::fakes::closed_port()).collect();
        let alive = http_proxy(2).await;
        let mut proxies: Vec<AliveProxy> = dead
            .iter()
            .map(|d| AliveProxy::new(format!("http://{}", d.addr())))
            .collect();
        proxies.push(AliveProxy::new(alive.url()));
        let (pool, _, _) = round_robin_pool(dir.path(), &proxies).await;
        let pacer = Arc::new(CountingPacer::default());
        let req = Request::new(site.url("/a").parse().unwrap())
            .unwrap()
            .pacer(pacer.clone());
        let page = pool.fetch(req).await.unwrap();
        assert_eq!(page.text(), "ok");
        assert_eq!(page.attempts(), 4, "three dead proxies tried first");
        // Only the request that reached the site took a turn there.
        assert_eq!(pacer.turns(), 1);
        assert_eq!(site.log().len(), 1);
    })
    .await;
}

#[tokio::test]
async fn one_sites_requests_are_spread_over_proxies() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let (_farm, proxies) = working_proxies(6).await;
        // The default strategy favours the fastest: without spreading, the
        // same few would carry most requests back to back.
        let (pool, _, _) = live_pool(dir.path(), &proxies, quick()).await;
        for i in 0..30 {
            pool.get(&site.url(&format!("/{i}"))).await.unwrap();
        }
        let peers = peers(&site);
        assert_eq!(peers.len(), 30);
        // No proxy carries two of any five requests in a row to the site.
        for w in peers.windows(5) {
            let distinct: HashSet<&IpAddr> = w.iter().collect();
            assert_eq!(distinct.len(), 5, "{w:?}");
        }
        // Another site may use a proxy the first one just had.
        let other = Site::start(SiteOpts::new(|_, _| Reply::html("ok"))).await;
        let page = pool.get(&other.url("/")).await.unwrap();
        assert_eq!(page.text(), "ok");
    })
    .await;
}

/// An https fetch whose CONNECT tunnel breaks in use has the proxy's HTTPS
/// support tested again at its next check, which is made due now: a proxy
/// that stopped tunnelling is not offered for https targets for hours.
#[tokio::test]
async fn a_broken_tunnel_asks_for_an_https_retest() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut tls_opts = SiteOpts::routes(vec![("/s", Reply::html("secret page"))]);
        tls_opts.tls_dir = Some(dir.path().to_owned());
        let tls = Site::start(tls_opts).await;
        let proxy = odd_proxy(Behavior::ResetTunnels).await;
        let mut alive = AliveProxy::new(proxy.url());
        alive.https = Some(true);
        let (pool, store, ids) = live_pool_sharing(
            dir.path(),
            &[alive],
            SharedOptions {
                extra_ca: Some(tls.ca_file().to_owned()),
                ..SharedOptions::default()
            },
            PoolOptions {
                rotations: 0,
                ..quick()
            },
        )
        .await;
        let alive_due = |at| {
            let store = store.clone();
            async move {
                store
                    .due_page(at, true, DueLane::Alive, DueCursor::START, 10)
                    .await
                    .unwrap()
            }
        };
        let before = alive_due(proxywarden::store::now_ms()).await;
        assert!(before[0].https_checked_at.is_some(), "{before:?}");

        let err = pool.get(&tls.url("/s")).await.unwrap_err();
        assert!(matches!(err, FetchError::Exhausted { .. }), "{err:?}");

        let after = alive_due(proxywarden::store::now_ms()).await;
        assert_eq!(after[0].id, ids[0]);
        assert_eq!(after[0].https_checked_at, None, "https re-test not asked");
        let due = store
            .count_due(proxywarden::store::now_ms(), false)
            .await
            .unwrap();
        assert_eq!(due, 1, "not made due");
    })
    .await;
}
