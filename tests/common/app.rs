//! The API in-process over a fresh store: its state for `Router::oneshot`
//! calls, `api::serve` on 127.0.0.1:0, and requests to send it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::Request;
use proxywarden::api::{self, AppState};
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, load_index};
use proxywarden::store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::TestConfig;

/// The service over an empty store in `dir`, its config tuned by `tune`.
pub async fn service(dir: &Path, tune: impl FnOnce(TestConfig) -> TestConfig) -> Service {
    let config = tune(TestConfig::new(dir).db("app.db")).build();
    let store = Store::open(&config.database.path).unwrap();
    let index = load_index(&store).await.unwrap();
    Service::new(store.clone(), Feedback::new(index, store), Arc::new(config))
}

/// The API's state over an empty store in `dir`, its config tuned by `tune`.
pub async fn state(dir: &Path, tune: impl FnOnce(TestConfig) -> TestConfig) -> AppState {
    service(dir, tune).await.api()
}

/// `api::serve` on 127.0.0.1:0 over `state`: its address and its stop.
pub async fn serve(state: AppState) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(api::serve(listener, state, stop.clone()));
    (addr, stop)
}

/// `method path` with `headers` and `body`.
pub fn request(method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Request<Body> {
    let mut req = Request::builder().method(method).uri(path);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    req.body(Body::from(body.to_owned())).unwrap()
}
