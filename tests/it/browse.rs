//! `GET /proxies/browse`, the operator's table of stored proxies, through
//! the API's router on both backends: its pages, in every order and both
//! ways, hold every matching proxy exactly once; the search and the
//! filters keep what they name; what sites taught comes with each proxy;
//! the ceilings and bad input are 400s naming the parameter; and random
//! input never gets a 500 nor an inconsistent page.

use crate::common;
use crate::on_both_backends;

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Request, StatusCode};
use common::backend::TestDb;
use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::test_runner::{Config as RunConfig, TestRunner};
use proxywarden::api::{self, AppState};
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, load_index};
use proxywarden::model::{Candidate, Hints, Outcome, RecheckPolicy, SourceScheme};
use proxywarden::proxy::{Country, Scheme};
use proxywarden::store::{CheckRecord, ProxyFilter, SiteRecord, Store, now_ms};
use tower::ServiceExt;

/// Proxies the paging tests store: more than a few pages of 7.
const N: usize = 61;

const COUNTRIES: [Option<&str>; 4] = [Some("DE"), Some("US"), Some("FR"), None];
const SCHEMES: [Scheme; 3] = [Scheme::Http, Scheme::Socks4, Scheme::Socks5];

/// What the seeded store holds of proxy `i`.
struct Seeded {
    id: i64,
    address: String,
    country: Option<&'static str>,
    scheme: &'static str,
    status: &'static str,
}

/// Stores `n` proxies: schemes and countries in turn, one in five dead,
/// one in five never checked, the rest alive with latencies and check
/// times that tie often (so the orders' tie-breaks are exercised). Proxy
/// 2 has site records: one site took it, one bans it now.
async fn seed(store: &Store, n: usize) -> Vec<Seeded> {
    let host = |i: usize| IpAddr::V4(Ipv4Addr::new(10, 1, (i / 200) as u8, (i % 200 + 1) as u8));
    let port = |i: usize| 8000 + (i % 7) as u16;
    let candidates: Vec<Candidate> = (0..n)
        .map(|i| {
            Candidate::new(
                host(i),
                port(i),
                None,
                Some(SCHEMES[i % 3]),
                SourceScheme::Detect,
                Hints {
                    country: COUNTRIES[i % 4].and_then(Country::parse),
                    ..Hints::default()
                },
            )
        })
        .collect();
    let base = now_ms() - 60_000;
    store
        .record_source_run(common::source_run("seed", "file:seed", base), candidates)
        .await
        .unwrap();
    let stored = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let id_of = |i: usize| {
        stored
            .iter()
            .find(|r| r.proxy.host == host(i) && r.proxy.port == port(i))
            .unwrap()
            .id
    };
    let mut checks = Vec::new();
    let mut seeded = Vec::new();
    for i in 0..n {
        let id = id_of(i);
        let at = base + (i % 11) as i64 * 1000;
        let status = match i % 5 {
            0 => {
                checks.push(common::refused_at(id, at));
                "dead"
            }
            1 => "unknown",
            _ => {
                checks.push(CheckRecord {
                    id,
                    checked_at: at,
                    outcome: Outcome {
                        latency: Some(Duration::from_millis((i % 13) as u64 * 10 + 1)),
                        ..common::alive_at(id, at).outcome
                    },
                });
                "alive"
            }
        };
        seeded.push(Seeded {
            id,
            address: format!(
                "{}://{}",
                SCHEMES[i % 3].as_str(),
                SocketAddr::new(host(i), port(i))
            ),
            country: COUNTRIES[i % 4],
            scheme: SCHEMES[i % 3].as_str(),
            status,
        });
    }
    let policy = RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::from_secs(150),
        dead: Duration::from_secs(900),
        dead_max: Duration::from_secs(86_400),
    };
    store.record_checks(checks, policy).await.unwrap();
    let now = now_ms();
    let site = |site: &str, worked, blocked, banned_until| SiteRecord {
        site: site.into(),
        proxy_id: seeded[2].id,
        worked,
        blocked,
        latency_ms: (worked > 0).then_some(80),
        last_worked_at: (worked > 0).then_some(now - 5_000),
        last_blocked_at: (blocked > 0).then_some(now - 1_000),
        banned_until,
        updated_at: now - blocked * 1000,
    };
    store
        .save_site_records(vec![
            site("shop.example", 3, 0, None),
            site("bank.example", 0, 2, Some(now + 3_600_000)),
        ])
        .await
        .unwrap();
    seeded
}

async fn state_on(store: Store, dir: &std::path::Path) -> AppState {
    let config = common::TestConfig::new(dir).build();
    let index = load_index(&store).await.unwrap();
    Service::new(store.clone(), Feedback::new(index, store), Arc::new(config)).api()
}

/// Status and JSON body of a GET through the router, as a local client.
async fn get(state: &AppState, uri: &str) -> (StatusCode, serde_json::Value) {
    let mut req = Request::get(uri)
        .header("host", "127.0.0.1")
        .body(Body::empty())
        .unwrap();
    let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
    req.extensions_mut().insert(ConnectInfo(peer));
    let resp = api::router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{uri}: {status} not JSON ({e}): {}",
            String::from_utf8_lossy(&body)
        )
    });
    (status, json)
}

fn ids(page: &serde_json::Value) -> Vec<i64> {
    page["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

/// Every page of `query` from the first, following `next`; each page's
/// `prev` leads back to the page before. The ids in order.
async fn walk(state: &AppState, query: &str) -> Vec<i64> {
    let mut seen = Vec::new();
    let mut pages: Vec<Vec<i64>> = Vec::new();
    let mut uri = format!("/proxies/browse?{query}");
    loop {
        let (status, page) = get(state, &uri).await;
        assert_eq!(status, 200, "{uri}: {page}");
        let got = ids(&page);
        if let Some(before) = pages.last() {
            // Back from this page is the page before.
            let prev = page["prev"]
                .as_str()
                .unwrap_or_else(|| panic!("{uri}: no prev: {page}"));
            let (_, back) = get(state, &format!("/proxies/browse?{query}&before={prev}")).await;
            assert_eq!(&ids(&back), before, "{uri}: prev");
        } else {
            assert!(page["prev"].is_null(), "the first page has a prev: {page}");
        }
        seen.extend(&got);
        pages.push(got);
        assert!(pages.len() <= 100, "{query}: no end");
        match page["next"].as_str() {
            Some(next) => uri = format!("/proxies/browse?{query}&after={next}"),
            None => break,
        }
    }
    seen
}

async fn pages_hold_every_proxy_once_in_every_order_both_ways(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let seeded = seed(&db.store, N).await;
    let state = state_on(db.store.clone(), dir.path()).await;
    let all: BTreeSet<i64> = seeded.iter().map(|s| s.id).collect();
    for sort in ["id", "latency", "last_checked"] {
        let seen = walk(&state, &format!("sort={sort}&limit=7")).await;
        assert_eq!(seen.len(), N, "{sort}: {seen:?}");
        assert_eq!(seen.iter().copied().collect::<BTreeSet<_>>(), all, "{sort}");
        // In the order asked for, as a full listing sorts.
        let (_, one) = get(&state, &format!("/proxies/browse?sort={sort}&limit=500")).await;
        assert_eq!(ids(&one), seen, "{sort}: pages and one page differ");
        let rows = one["proxies"].as_array().unwrap();
        let key = |r: &serde_json::Value| match sort {
            "latency" => r["latency_ms"].as_i64().map_or(i64::MAX, |l| l),
            "last_checked" => r["last_checked"].as_str().map_or(i64::MAX, |t| {
                -chrono::DateTime::parse_from_rfc3339(t)
                    .unwrap()
                    .timestamp_millis()
            }),
            _ => 0,
        };
        for w in rows.windows(2) {
            let (a, b) = (
                (key(&w[0]), w[0]["id"].as_i64()),
                (key(&w[1]), w[1]["id"].as_i64()),
            );
            assert!(a < b, "{sort}: {} before {}", w[0], w[1]);
        }
        assert_eq!(one["total"], N as i64);
        assert_eq!(one["total_capped"], false);
    }
    // Filtered pages too.
    let seen = walk(&state, "status=alive&sort=latency&limit=4").await;
    let alive: BTreeSet<i64> = seeded
        .iter()
        .filter(|s| s.status == "alive")
        .map(|s| s.id)
        .collect();
    assert_eq!(seen.len(), alive.len());
    assert_eq!(seen.into_iter().collect::<BTreeSet<_>>(), alive);
}

async fn search_and_filters_keep_what_they_name(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    let seeded = seed(&db.store, N).await;
    let state = state_on(db.store.clone(), dir.path()).await;
    let listed = |page: &serde_json::Value| ids(page).into_iter().collect::<BTreeSet<_>>();
    let expect = |f: &dyn Fn(&Seeded) -> bool| -> BTreeSet<i64> {
        seeded.iter().filter(|s| f(s)).map(|s| s.id).collect()
    };
    let cases: Vec<(&str, BTreeSet<i64>)> = vec![
        ("q=de", expect(&|s| s.country == Some("DE"))),
        (
            "q=DE&status=alive",
            expect(&|s| s.country == Some("DE") && s.status == "alive"),
        ),
        ("q=:8003", expect(&|s| s.address.ends_with(":8003"))),
        (
            "q=socks5://10.1.0.1",
            expect(&|s| s.address.contains("socks5://10.1.0.1")),
        ),
        ("q=10.1.0.4:", expect(&|s| s.address.contains("10.1.0.4:"))),
        ("q=%25", BTreeSet::new()),
        ("q=_", BTreeSet::new()),
        ("scheme=socks4", expect(&|s| s.scheme == "socks4")),
        (
            "scheme=http,socks5&country=US",
            expect(&|s| s.scheme != "socks4" && s.country == Some("US")),
        ),
        ("status=dead", expect(&|s| s.status == "dead")),
        ("status=unknown", expect(&|s| s.status == "unknown")),
        (
            "status=all&country=fr",
            expect(&|s| s.country == Some("FR")),
        ),
    ];
    for (query, want) in cases {
        assert!(
            !want.is_empty() || query.starts_with("q=%25") || query == "q=_",
            "{query}"
        );
        let (status, page) = get(&state, &format!("/proxies/browse?{query}&limit=500")).await;
        assert_eq!(status, 200, "{query}: {page}");
        assert_eq!(listed(&page), want, "{query}");
        assert_eq!(page["total"], want.len() as i64, "{query}");
    }
    // A row says what the table shows, and what sites taught.
    let (_, page) = get(
        &state,
        &format!(
            "/proxies/browse?q={}",
            seeded[2].address.replace("://", "%3A%2F%2F")
        ),
    )
    .await;
    let row = page["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] == seeded[2].id)
        .unwrap_or_else(|| panic!("{page}"))
        .clone();
    assert_eq!(row["address"], seeded[2].address.as_str());
    assert_eq!(row["scheme"], "socks5");
    assert_eq!(row["country"], "FR");
    assert_eq!(row["status"], "alive");
    assert_eq!(row["latency_ms"], 21);
    assert!(row["last_checked"].is_string(), "{row}");
    let sites = &row["sites"];
    assert_eq!(sites["known"], 2, "{row}");
    assert_eq!(sites["worked"], 1, "{row}");
    assert_eq!(sites["blocked"], 1, "{row}");
    assert_eq!(sites["banned_now"], 1, "{row}");
    let latest: HashMap<&str, &serde_json::Value> = sites["latest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["site"].as_str().unwrap(), s))
        .collect();
    assert_eq!(latest["shop.example"]["worked"], 3, "{row}");
    assert!(latest["shop.example"]["banned_until"].is_null(), "{row}");
    assert!(latest["bank.example"]["banned_until"].is_string(), "{row}");
    // A proxy no site knows says so.
    let other = page["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["id"] != seeded[2].id);
    if let Some(o) = other {
        assert_eq!(o["sites"]["known"], 0, "{o}");
    }
}

async fn ceilings_and_bad_input_are_400s_naming_the_parameter(db: TestDb) {
    let dir = tempfile::tempdir().unwrap();
    seed(&db.store, 12).await;
    let state = state_on(db.store.clone(), dir.path()).await;
    let (_, first) = get(&state, "/proxies/browse?sort=latency&limit=5").await;
    let cursor = first["next"].as_str().unwrap().to_owned();
    let long = "1".repeat(101);
    for (query, names) in [
        ("limit=501".to_owned(), "limit"),
        ("limit=0".to_owned(), "limit"),
        ("limit=1000000000000000000000".to_owned(), "limit"),
        ("limit=ten".to_owned(), "limit"),
        (format!("q={long}"), "q"),
        ("sort=address".to_owned(), "sort"),
        ("status=gone".to_owned(), "status"),
        ("scheme=ftp".to_owned(), "scheme"),
        ("country=Germany".to_owned(), "country"),
        ("after=42".to_owned(), "after"),
        ("before=latency.x.1".to_owned(), "before"),
        (format!("after={cursor}"), "after"),
        (
            format!("sort=latency&after={cursor}&before={cursor}"),
            "before",
        ),
        ("offset=10".to_owned(), "offset"),
        ("q=a&q=b".to_owned(), "q"),
    ] {
        let (status, body) = get(&state, &format!("/proxies/browse?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{query}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(names), "{query}: {message}");
    }
    // The ceiling itself is a page; the default is 50.
    let (status, page) = get(&state, "/proxies/browse?limit=500").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["limit"], 500);
    let (_, page) = get(&state, "/proxies/browse").await;
    assert_eq!(page["limit"], 50);
    assert_eq!(page["sort"], "id");
}

on_both_backends!(
    pages_hold_every_proxy_once_in_every_order_both_ways,
    search_and_filters_keep_what_they_name,
    ceilings_and_bad_input_are_400s_naming_the_parameter,
);

/// Random searches, filters, orders, sizes and cursors (real ones, mangled
/// ones and made-up ones): never a 500; a 200 is a page no larger than
/// asked whose rows all match, and following its `next` gives rows after
/// it, none seen before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_queries_never_get_a_500_and_their_pages_are_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("browse.db")).unwrap();
    let seeded = seed(&store, 40).await;
    let state = state_on(store, dir.path()).await;
    let rt = tokio::runtime::Handle::current();
    let term = prop_oneof![
        Just(String::new()),
        "[a-z]{2}",
        "[0-9.:]{1,8}",
        "[ -~]{0,12}",
        ".{0,8}",
        Just("x".repeat(120)),
    ];
    let choice = |items: &'static [&'static str]| prop::sample::select(items);
    let input = (
        term,
        choice(&["", "all", "alive", "dead", "unknown", "zombie"]),
        choice(&["", "http", "socks4,socks5", "gopher"]),
        choice(&["", "DE", "us,fr", "XX1"]),
        choice(&["", "id", "latency", "last_checked", "speed"]),
        prop_oneof![
            Just(String::new()),
            (0i64..600).prop_map(|n| n.to_string()),
            "[a-z0-9-]{1,5}"
        ],
        prop_oneof![
            Just(String::new()),
            "(id|latency|last_checked)\\.(-|[0-9]{1,4}|-?[0-9]{1,20})\\.[0-9]{1,20}",
            "[ -~]{0,20}",
        ],
        any::<bool>(),
    );
    tokio::task::spawn_blocking(move || {
        let by_id: HashMap<i64, &Seeded> = seeded.iter().map(|s| (s.id, s)).collect();
        let mut runner = TestRunner::new(RunConfig::with_cases(300));
        runner
            .run(
                &input,
                |(q, status, scheme, country, sort, limit, cursor, back)| {
                    let mut query = url::form_urlencoded::Serializer::new(String::new());
                    for (k, v) in [
                        ("q", &q),
                        ("status", &status.to_owned()),
                        ("scheme", &scheme.to_owned()),
                        ("country", &country.to_owned()),
                        ("sort", &sort.to_owned()),
                        ("limit", &limit),
                    ] {
                        if !v.is_empty() {
                            query.append_pair(k, v);
                        }
                    }
                    if !cursor.is_empty() {
                        query.append_pair(if back { "before" } else { "after" }, &cursor);
                    }
                    let query = query.finish();
                    let uri = format!("/proxies/browse?{query}");
                    let (code, page) = rt.block_on(get(&state, &uri));
                    prop_assert!(code == 200 || code == 400, "{uri}: {code} {page}");
                    if code == 400 {
                        prop_assert!(page["error"]["message"].is_string(), "{uri}: {page}");
                        return Ok(());
                    }
                    let rows = ids(&page);
                    let limit = page["limit"].as_u64().unwrap() as usize;
                    prop_assert!(rows.len() <= limit, "{uri}");
                    prop_assert!(
                        rows.len() as i64 <= page["total"].as_i64().unwrap(),
                        "{uri}: {page}"
                    );
                    let wanted_status = match status {
                        "alive" | "dead" | "unknown" => Some(status),
                        _ => None,
                    };
                    for id in &rows {
                        let s = by_id[id];
                        if let Some(w) = wanted_status {
                            prop_assert_eq!(s.status, w, "{}", uri);
                        }
                        let term = q.trim().to_lowercase();
                        if !term.is_empty() {
                            let country = s.country.map(str::to_lowercase);
                            prop_assert!(
                                s.address.contains(&term)
                                    || country.as_deref() == Some(term.as_str()),
                                "{}: {} matched",
                                uri,
                                s.address
                            );
                        }
                    }
                    if let Some(next) = page["next"].as_str() {
                        let uri = format!(
                            "/proxies/browse?{}",
                            query
                                .split('&')
                                .filter(|p| !p.starts_with("after=") && !p.starts_with("before="))
                                .chain([format!("after={next}").as_str()])
                                .collect::<Vec<_>>()
                                .join("&")
                        );
                        let (code, after) = rt.block_on(get(&state, &uri));
                        prop_assert_eq!(code, 200, "{}: {}", uri, after);
                        for id in ids(&after) {
                            prop_assert!(!rows.contains(&id), "{}: {} again", uri, id);
                        }
                    }
                    Ok(())
                },
            )
            .unwrap();
    })
    .await
    .unwrap();
}
