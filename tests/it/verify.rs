//! `verify=true` is a use of the shared pool: each candidate is leased, so a
//! proxy at its in-flight cap is not checked or handed out by it, and a
//! candidate that fails its fresh check is charged as a failure in use.

use crate::common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use proxywarden::api::{self, AppState};
use proxywarden::check::{CheckOptions, Checker};
use proxywarden::config::Config;
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, ProxyQuery, load_index};
use proxywarden::pool::{NoProxy, PoolOptions};
use tokio::net::TcpListener;
use tower::ServiceExt;

use common::{AliveProxy, TestConfig};

/// The service over a store of `alive` proxies, checking against `judge`
/// with a cap of one request at a time per proxy; the checker is ready.
async fn service(dir: &std::path::Path, alive: &[AliveProxy], judge: &str) -> (Service, Vec<i64>) {
    let (store, ids) = common::store_with_alive(&dir.join("verify.db"), alive).await;
    let config: Config = TestConfig::new(dir)
        .db("verify.db")
        .judges(&format!("[\"{judge}\"]"))
        .set("pool", "max_per_proxy", "1")
        .build();
    let checker = Checker::prepare(&config, &CheckOptions::from_config(&config.check), None)
        .await
        .unwrap();
    let feedback = Feedback::new(load_index(&store).await.unwrap(), store.clone());
    let service = Service::new(store, feedback, Arc::new(config));
    service.checker.set(Arc::new(checker));
    (service, ids)
}

/// Status and JSON body of `GET path`.
async fn get(state: &AppState, path: &str) -> (u16, serde_json::Value) {
    let req = Request::get(path).body(Body::empty()).unwrap();
    let resp = api::router(state.clone()).oneshot(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_never_hands_out_a_proxy_at_its_cap() {
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let busy = common::fakes::http_proxy(2).await;
    let free = common::fakes::http_proxy(3).await;
    // The busy one is much the faster, so a pick that ignored the cap would
    // take it about three times in four.
    let alive = [
        AliveProxy {
            latency_ms: 1,
            ..AliveProxy::new(busy.url())
        },
        AliveProxy {
            latency_ms: 5_000,
            ..AliveProxy::new(free.url())
        },
    ];
    let (service, ids) = service(dir.path(), &alive, &judge.url()).await;
    let (busy_id, free_id) = (ids[0], ids[1]);

    // A fetch through the busy proxy from a site that never answers holds
    // its one slot.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let holder = service
        .pool
        .client(PoolOptions {
            query: ProxyQuery {
                exclude_ids: HashSet::from([free_id]),
                ..ProxyQuery::default()
            },
            no_proxy: NoProxy::Fail,
            first_byte_timeout: Duration::from_secs(120),
            total_timeout: Duration::from_secs(120),
            ..PoolOptions::default()
        })
        .unwrap();
    let hold = tokio::spawn(async move { holder.get(&format!("http://{silent_addr}/")).await });
    let pool = service.pool.clone();
    // The lease is taken before the request reaches the proxy: wait for
    // both, so that the holder's own request is not counted as a check.
    common::until(
        "the busy proxy carries a request",
        Duration::from_secs(30),
        || {
            let pool = pool.clone();
            let arrived = busy.requests() >= 1;
            async move { arrived && pool.in_flight(busy_id) == 1 }
        },
    )
    .await;
    let busy_requests = busy.requests();

    let state = service.api();
    for _ in 0..20 {
        let (status, p) = get(&state, "/proxy?verify=true").await;
        assert_eq!(status, 200, "{p}");
        assert_eq!(p["url"], free.url(), "handed out a proxy at its cap");
    }
    assert_eq!(
        busy.requests(),
        busy_requests,
        "the proxy at its cap was checked"
    );
    hold.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_verification_is_charged_as_a_failure_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let closed = common::fakes::closed_port();
    let alive = [AliveProxy::new(format!("http://{}", closed.addr()))];
    let (service, ids) = service(dir.path(), &alive, &judge.url()).await;
    let state = service.api();

    let (status, e) = get(&state, "/proxy?verify=true").await;
    assert_eq!(status, 404, "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("the 1 tried failed"), "{message}");
    // Charged through the pool as a failed use is: it rests there, and it
    // has left the index.
    assert!(service.pool.is_cooling(ids[0]), "not resting in the pool");
    assert_eq!(get(&state, "/proxy").await.0, 404, "still served");
}
