//! Handler logic that needs no network, through `Router::oneshot`: every
//! bad parameter is a 400 naming itself, and an empty pool, unknown routes
//! and wrong methods are JSON errors.

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use proxywarden::api::{AppState, router};
use proxywarden::health::{Feedback, HealthIndex};
use proxywarden::store::Store;
use tower::ServiceExt;

/// A router over an empty store, with `api_lines` in `[api]`.
fn app(dir: &std::path::Path, api_lines: &str) -> axum::Router {
    let config = common::TestConfig::new(dir).lines("api", api_lines).build();
    let store = Store::open(&config.database.path).unwrap();
    let feedback = Feedback::new(HealthIndex::new(), store.clone());
    router(AppState::new(store, feedback, Arc::new(config)))
}

/// Sends `req` and returns the status and the body as JSON.
async fn call(app: &axum::Router, req: Request<Body>) -> (StatusCode, serde_json::Value) {
    let resp = common::within(app.clone().oneshot(req)).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&body)));
    (status, json)
}

fn get(uri: &str) -> Request<Body> {
    Request::get(uri).body(Body::empty()).unwrap()
}

#[tokio::test]
async fn bad_parameters_name_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path(), "");
    for (q, needle) in [
        ("/proxy?country=USA", "country"),
        ("/proxy?scheme=ftp", "scheme"),
        ("/proxy?anonymity=high", "anonymity"),
        ("/proxy?max_latency_ms=fast", "max_latency_ms"),
        ("/proxy?max_age=soon", "max_age"),
        ("/proxy?https=maybe", "https"),
        ("/proxy?colour=red", "colour"),
        ("/proxy?format=xml", "format"),
        ("/proxy?country=US&country=DE", "country"),
        ("/proxies?limit=5000", "limit"),
        ("/proxies?status=sleeping", "status"),
        ("/proxies?sort=random", "sort"),
        ("/export?format=xml", "format"),
        ("/export?exclude=nowhere", "exclude"),
    ] {
        let (status, e) = call(&app, get(q)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{q}");
        assert_eq!(e["error"]["code"], "bad_request", "{q}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(needle),
            "{q}: {e}"
        );
    }
}

#[tokio::test]
async fn an_empty_pool_and_unknown_routes_are_json_404s() {
    let dir = tempfile::tempdir().unwrap();
    let app = app(dir.path(), "");
    let (status, e) = call(&app, get("/proxy")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["code"], "not_found");
    let (status, e) = call(&app, get("/no/such/route")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(e["error"]["code"], "not_found");
    let (status, e) = call(&app, Request::delete("/proxy").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(e["error"]["code"], "method_not_allowed");
    let (status, listing) = call(&app, get("/proxies?status=all")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listing["total"], 0);
}
