//! The gateway in-process: `gateway::serve` on 127.0.0.1:0 over a store
//! holding given proxies as alive, with the daemon's one shared pool, and
//! the API over the same store and feedback path.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::http::Request;
use http_body_util::BodyExt;
use proxywarden::api::{self, AppState};
use proxywarden::config::Config;
use proxywarden::daemon::Service;
use proxywarden::gateway::{self, Gateway};
use proxywarden::health::{Feedback, load_index};
use proxywarden::pool::Pool;
use proxywarden::store::Store;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::{AliveProxy, TestConfig, store_with_alive};

/// A gateway on 127.0.0.1:0 over a store holding `proxies` as alive;
/// stopped when dropped.
pub struct Gw {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The gateway (its metrics, its pool).
    pub gateway: Gateway,
    /// The feedback path its pool reports to.
    pub feedback: Feedback,
    /// The stored proxies' ids, in the order given.
    pub ids: Vec<i64>,
    store: Store,
    config: Arc<Config>,
    /// The API's state, made at its first use by [`Gw::api`].
    api: OnceLock<AppState>,
    shutdown: CancellationToken,
}

impl Drop for Gw {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Gw {
    /// With short upstream timeouts (1 s to connect, 3 s in all).
    pub async fn start(dir: &Path, proxies: &[AliveProxy]) -> Gw {
        Gw::start_with(dir, proxies, |c| c).await
    }

    /// [`Gw::start`] with its config changed by `tune`.
    pub async fn start_with(
        dir: &Path,
        proxies: &[AliveProxy],
        tune: impl FnOnce(TestConfig) -> TestConfig,
    ) -> Gw {
        let (store, ids) = store_with_alive(&dir.join("gw.db"), proxies).await;
        let feedback = Feedback::new(load_index(&store).await.unwrap(), store.clone());
        let config = tune(
            TestConfig::new(dir)
                .db("gw.db")
                .set("gateway", "connect_timeout", "\"1s\"")
                .set("gateway", "timeout", "\"3s\""),
        )
        .build();
        let pool = Pool::shared(feedback.clone(), &config.pool).unwrap();
        let gateway = Gateway::new(&pool, &config.gateway, config.api.max_age).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        tokio::spawn(gateway::serve(listener, gateway.clone(), shutdown.clone()));
        Gw {
            addr,
            gateway,
            feedback,
            ids,
            store,
            config: Arc::new(config),
            api: OnceLock::new(),
            shutdown,
        }
    }

    /// The API's answer to `GET path` (which must be a 200), as text: an
    /// API over the same store and feedback path as the gateway.
    pub async fn api(&self, path: &str) -> String {
        let state = self
            .api
            .get_or_init(|| {
                Service::new(
                    self.store.clone(),
                    self.feedback.clone(),
                    self.config.clone(),
                )
                .api()
            })
            .clone();
        let mut req = Request::get(path)
            .header("host", "127.0.0.1")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut()
            .insert(axum::extract::ConnectInfo(SocketAddr::from((
                [127, 0, 0, 1],
                1,
            ))));
        let resp = api::router(state).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    /// `http://` and its address.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A reqwest client using the gateway as its proxy for everything,
    /// with `auth` as the proxy's user name and password.
    pub fn client(&self, auth: Option<(&str, &str)>) -> reqwest::Client {
        let mut proxy = reqwest::Proxy::all(self.url()).unwrap();
        if let Some((u, p)) = auth {
            proxy = proxy.basic_auth(u, p);
        }
        super::daemon::proxied_client(proxy)
    }

    /// Asserts that no proxy was charged: each still served, none resting,
    /// no upstream failure counted.
    pub fn none_charged(&self) {
        let stats = self.gateway.metrics().snapshot();
        assert!(stats.upstream_failures.is_empty(), "{stats:?}");
        for id in &self.ids {
            assert!(
                self.feedback.index().get(*id).is_some(),
                "proxy {id} was taken out"
            );
            assert!(!self.gateway.pool().is_cooling(*id), "proxy {id} rests");
        }
    }
}
