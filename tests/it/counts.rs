//! The counts `/stats`, `/sources` and the dashboard show, as a big store
//! serves them (from the latest count in memory, counted again in the
//! background after each harvest, check round and purge): once a count
//! follows the rounds ended, what is shown equals a full count of the
//! store, after any mix of overlapping harvests, verdicts and purges, on
//! SQLite and on PostgreSQL; until then the answer is the last count,
//! whole, with its time.

use crate::common;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use proptest::prelude::*;
use proxywarden::api::{self, AppState};
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, load_index};
use proxywarden::model::{Candidate, Hints, Outcome, Reason, SourceScheme};
use proxywarden::proxy::{Anonymity, Country, Scheme};
use proxywarden::store::{CheckRecord, ProxyFilter, SourceRun, Store};
use serde_json::{Value, json};
use tower::ServiceExt;

/// The API over `store`, counting as it does for a big store: never per
/// answer.
async fn big_store_api(store: &Store, dir: &std::path::Path) -> AppState {
    let config = common::TestConfig::new(dir).db("unused.db").build();
    let index = load_index(store).await.unwrap();
    Service::new(
        store.clone(),
        Feedback::new(index, store.clone()),
        Arc::new(config),
    )
    .api()
    .counting_live_below(Duration::ZERO)
}

async fn get(state: &AppState, path: &str) -> (StatusCode, axum::http::HeaderMap, Value) {
    let resp = api::router(state.clone())
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        serde_json::from_slice(&body).unwrap(),
    )
}

/// Waits until the latest count follows every round ended (it is counted
/// in the background).
async fn counted(state: &AppState) {
    for _ in 0..2_000 {
        if state.counted.current() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the store was not counted again after the last round");
}

/// What `/stats` and `/sources` would show, counted proxy by proxy from
/// the full listing.
async fn full_count(store: &Store) -> (Value, Value) {
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let mut by: BTreeMap<&str, BTreeMap<String, i64>> = BTreeMap::new();
    for k in [
        "by_status",
        "by_scheme",
        "by_country",
        "by_anonymity",
        "by_reason",
    ] {
        by.insert(k, BTreeMap::new());
    }
    for s in ["unknown", "alive", "dead"] {
        by.get_mut("by_status").unwrap().insert(s.into(), 0);
    }
    let mut sources: BTreeMap<String, (i64, i64, i64)> = BTreeMap::new();
    for r in &all {
        let status = r.status.as_str();
        *by.get_mut("by_status")
            .unwrap()
            .entry(status.into())
            .or_default() += 1;
        *by.get_mut("by_scheme")
            .unwrap()
            .entry(r.proxy.scheme.as_str().into())
            .or_default() += 1;
        let country = r.country.map_or("unknown".into(), |c| c.to_string());
        *by.get_mut("by_country")
            .unwrap()
            .entry(country)
            .or_default() += 1;
        if let (Some(a), "alive") = (r.anonymity, status) {
            *by.get_mut("by_anonymity")
                .unwrap()
                .entry(a.as_str().into())
                .or_default() += 1;
        }
        if let (Some(reason), "dead") = (&r.reason, status) {
            *by.get_mut("by_reason")
                .unwrap()
                .entry(reason.clone())
                .or_default() += 1;
        }
        for s in &r.sources {
            let e = sources.entry(s.clone()).or_default();
            e.0 += 1;
            e.1 += i64::from(status == "alive");
            e.2 += i64::from(r.sources.len() == 1);
        }
    }
    let mut stats = json!({ "total": all.len() });
    for (k, v) in by {
        stats[k] = json!(v);
    }
    let names: Vec<String> = store
        .list_sources()
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    let sources: Vec<Value> = names
        .iter()
        .map(|n| {
            let (proxies, alive, unique) = sources.get(n).copied().unwrap_or_default();
            json!({ "name": n, "proxies": proxies, "alive": alive, "unique": unique })
        })
        .collect();
    (stats, json!(sources))
}

/// The proxies of each (status, scheme) `/metrics` shows.
async fn metrics_shown(state: &AppState) -> BTreeMap<(String, String), i64> {
    let resp = api::router(state.clone())
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(text.to_vec()).unwrap();
    let mut shown = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("proxywarden_proxies{status=\"") else {
            continue;
        };
        let (status, rest) = rest.split_once("\",scheme=\"").unwrap();
        let (scheme, n) = rest.split_once("\"} ").unwrap();
        shown.insert((status.to_owned(), scheme.to_owned()), n.parse().unwrap());
    }
    shown
}

/// The proxies of each (status, scheme), counted from the full listing,
/// every pair named.
async fn full_count_by_status_scheme(store: &Store) -> BTreeMap<(String, String), i64> {
    let mut by = BTreeMap::new();
    for status in ["unknown", "alive", "dead"] {
        for scheme in ["http", "socks4", "socks5"] {
            by.insert((status.to_owned(), scheme.to_owned()), 0);
        }
    }
    for r in store.list_proxies(ProxyFilter::default()).await.unwrap() {
        let key = (
            r.status.as_str().to_owned(),
            r.proxy.scheme.as_str().to_owned(),
        );
        *by.get_mut(&key).unwrap() += 1;
    }
    by
}

/// The counts of a `/stats` answer and of a `/sources` answer, in
/// [`full_count`]'s shape.
fn shown(stats: &Value, sources: &Value) -> (Value, Value) {
    let mut counts = json!({ "total": stats["total"] });
    for k in [
        "by_status",
        "by_scheme",
        "by_country",
        "by_anonymity",
        "by_reason",
    ] {
        counts[k] = stats[k].clone();
    }
    let sources = sources
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            json!({ "name": s["name"], "proxies": s["proxies"], "alive": s["alive"],
                    "unique": s["unique"] })
        })
        .collect();
    (counts, Value::Array(sources))
}

#[derive(Clone, Debug)]
enum Op {
    /// A source's list: addresses (few, so that lists overlap and repeat)
    /// and schemes (0 http, 1 socks4, 2 socks5, 3 to detect).
    Harvest { source: u8, list: Vec<(u8, u8)> },
    /// Verdicts on stored proxies picked by their place in identity order.
    Verdicts { picks: Vec<(u8, bool, Option<u8>)> },
    /// Purges the proxies dead for longer than this many steps.
    Purge { steps: u8 },
    /// A round ends: the counts are taken again and compared.
    RoundEnds,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, proptest::collection::vec((0u8..24, 0u8..4), 0..16))
            .prop_map(|(source, list)| Op::Harvest { source, list }),
        4 => proptest::collection::vec((any::<u8>(), any::<bool>(), proptest::option::of(0u8..3)), 1..8)
            .prop_map(|picks| Op::Verdicts { picks }),
        1 => (0u8..6).prop_map(|steps| Op::Purge { steps }),
        2 => Just(Op::RoundEnds),
    ]
}

const COUNTRIES: [&str; 3] = ["DE", "US", "BR"];
const LEVELS: [Anonymity; 3] = [
    Anonymity::Transparent,
    Anonymity::Anonymous,
    Anonymity::Elite,
];

/// The step's time: steps are a minute apart.
fn at(step: usize) -> i64 {
    1_000_000_000 + step as i64 * 60_000
}

async fn apply(store: &Store, op: &Op, step: usize) {
    let mut known: Vec<(String, i64)> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.proxy.to_string(), r.id))
        .collect();
    known.sort();
    match op {
        Op::Harvest { source, list } => {
            let run = SourceRun {
                name: format!("source{source}"),
                url: format!("https://lists.invalid/{source}"),
                format: "text".into(),
                started_at: at(step),
                http_status: Some(200),
                duration_ms: 7,
                error: None,
                private: 0,
            };
            let list: Vec<Candidate> = list
                .iter()
                .map(|&(addr, scheme)| {
                    let default = match scheme {
                        0 => SourceScheme::Fixed(Scheme::Http),
                        1 => SourceScheme::Fixed(Scheme::Socks4),
                        2 => SourceScheme::Fixed(Scheme::Socks5),
                        _ => SourceScheme::Detect,
                    };
                    Candidate::new(
                        IpAddr::V4(Ipv4Addr::new(11, 0, 0, addr)),
                        8000 + u16::from(addr % 3),
                        None,
                        None,
                        default,
                        Hints::default(),
                    )
                })
                .collect();
            store.record_source_run(run, list).await.unwrap();
        }
        Op::Verdicts { picks } => {
            let mut batch = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            for &(p, alive, country) in picks {
                if known.is_empty() {
                    break;
                }
                let id = known[usize::from(p) % known.len()].1;
                if !seen.insert(id) {
                    continue;
                }
                let outcome = if alive {
                    Outcome {
                        failure: None,
                        latency: Some(Duration::from_millis(40)),
                        anonymity: Some(LEVELS[usize::from(p % 3)]),
                        https: Some(p % 2 == 0),
                        exit_ip: None,
                        country: country.and_then(|c| Country::parse(COUNTRIES[usize::from(c)])),
                        detected: None,
                    }
                } else {
                    Outcome::dead([Reason::Refused, Reason::Timeout][usize::from(p % 2)])
                };
                batch.push(CheckRecord {
                    id,
                    checked_at: at(step),
                    outcome,
                });
            }
            if !batch.is_empty() {
                let policy = proxywarden::model::RecheckPolicy {
                    alive: Duration::from_secs(600),
                    alive_jitter: Duration::ZERO,
                    dead: Duration::from_secs(60),
                    dead_max: Duration::from_secs(3600),
                };
                store.record_checks(batch, policy).await.unwrap();
            }
        }
        Op::Purge { steps } => {
            store
                .purge(at(step), Duration::from_secs(60 * u64::from(*steps)))
                .await
                .unwrap();
        }
        Op::RoundEnds => {}
    }
}

/// Runs `ops` on `store`, ending a round after each purge and where the
/// sequence says (as the daemon does after harvests, check rounds and
/// purges), and after the last step: each time, once counted again, what
/// `/stats`, `/sources` and `/metrics` show is the full count.
async fn run_case(store: Store, ops: &[Op]) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let state = big_store_api(&store, dir.path()).await;
    for (i, op) in ops.iter().enumerate() {
        apply(&store, op, i).await;
        if i + 1 < ops.len() && !matches!(op, Op::RoundEnds | Op::Purge { .. }) {
            continue;
        }
        state.rounds.purged();
        // The answer that finds the count stale starts the next one.
        let (status, ..) = get(&state, "/stats").await;
        prop_assert_eq!(status, StatusCode::OK);
        counted(&state).await;
        let (_, _, stats) = get(&state, "/stats").await;
        let (_, headers, sources) = get(&state, "/sources").await;
        prop_assert_eq!(
            headers["x-counted-at"].to_str().unwrap(),
            stats["counted_at"].as_str().unwrap()
        );
        prop_assert_eq!(
            shown(&stats, &sources),
            full_count(&store).await,
            "step {}",
            i
        );
        // `/metrics` shows the same count, and so does the store's own
        // count by status and scheme (the minute snapshot's).
        let by_pair = full_count_by_status_scheme(&store).await;
        prop_assert_eq!(&metrics_shown(&state).await, &by_pair, "step {}", i);
        let stored: BTreeMap<_, _> = store
            .count_by_status_scheme()
            .await
            .unwrap()
            .into_iter()
            .map(|(status, scheme, n)| ((status, scheme), n))
            .collect();
        prop_assert_eq!(&stored, &by_pair, "step {}", i);
    }
    Ok(())
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn sqlite_counts_shown_equal_a_full_count_after_any_harvests_verdicts_and_purges() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = Store::open(&dir.path().join("counts.db")).unwrap();
            run_case(store, &ops).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn postgres_counts_shown_equal_a_full_count_after_any_harvests_verdicts_and_purges() {
    let server = common::postgres::PgServer::start();
    let cases = AtomicU32::new(0);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 12,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 1..40), |ops| {
        runtime().block_on(async {
            let store = server
                .fresh_store(&format!("counts{}", cases.fetch_add(1, Ordering::Relaxed)))
                .await;
            run_case(store, &ops).await
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// A big store's answers come from the latest count, whole, with its
/// time, while the store changes; the count follows once a round ends.
#[tokio::test]
async fn a_big_stores_counts_come_from_memory_and_follow_the_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("counts.db")).unwrap();
    apply(
        &store,
        &Op::Harvest {
            source: 0,
            list: vec![(1, 0), (2, 0)],
        },
        0,
    )
    .await;
    let state = big_store_api(&store, dir.path()).await;
    let (_, _, first) = get(&state, "/stats").await;
    assert_eq!(first["total"], 2);

    // More proxies, with no round ended: the answer is still the count
    // taken before, and says when that was.
    apply(
        &store,
        &Op::Harvest {
            source: 1,
            list: vec![(3, 1), (1, 0)],
        },
        1,
    )
    .await;
    let (_, _, stale) = get(&state, "/stats").await;
    assert_eq!(stale["total"], 2, "{stale}");
    assert_eq!(stale["counted_at"], first["counted_at"]);
    let (_, _, sources) = get(&state, "/sources").await;
    assert_eq!(sources.as_array().unwrap().len(), 1, "{sources}");

    // The harvest ends as a round: the store is counted again.
    state.rounds.purged();
    get(&state, "/stats").await;
    counted(&state).await;
    let (_, _, now) = get(&state, "/stats").await;
    assert_eq!(now["total"], 3, "{now}");
    let (_, _, sources) = get(&state, "/sources").await;
    assert_eq!(
        shown(&now, &sources),
        full_count(&store).await,
        "{now} {sources}"
    );
    assert_eq!(sources[0]["unique"], 1, "{sources}");
    assert_eq!(sources[1]["unique"], 1, "{sources}");
}
