//! The daemon in-process on 127.0.0.1:0 for integration tests: started on a
//! config built in the test's directory, asked over its API, stopped through
//! its shutdown token.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::TestConfig;

/// A running daemon; [`Daemon::stop`] ends it and waits for it to exit.
pub struct Daemon {
    /// Where the API (and so the judge) answers.
    pub addr: SocketAddr,
    /// A direct client for the API, with no token.
    pub http: reqwest::Client,
    /// The API token of the config, sent by [`Daemon::req`].
    token: Option<String>,
    shutdown: CancellationToken,
    task: JoinHandle<anyhow::Result<()>>,
}

impl Daemon {
    /// A daemon on `dir/daemon.db` checking over HTTP against its own
    /// `/judge` and harvesting `sources` (`[[sources]]` blocks); `tune`
    /// adjusts the config last.
    pub async fn start(
        dir: &Path,
        sources: &str,
        tune: impl FnOnce(TestConfig) -> TestConfig,
    ) -> Daemon {
        Daemon::launch(dir, sources, tune, None).await
    }

    /// As [`Daemon::start`], with the gateway on a listener of its own on
    /// 127.0.0.1:0 too; and where that listens.
    pub async fn start_with_gateway(
        dir: &Path,
        sources: &str,
        tune: impl FnOnce(TestConfig) -> TestConfig,
    ) -> (Daemon, SocketAddr) {
        let gateway = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_addr = gateway.local_addr().unwrap();
        let daemon = Daemon::launch(dir, sources, tune, Some(gateway)).await;
        (daemon, gateway_addr)
    }

    async fn launch(
        dir: &Path,
        sources: &str,
        tune: impl FnOnce(TestConfig) -> TestConfig,
        gateway: Option<TcpListener>,
    ) -> Daemon {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Without sources the built-in public ones would be used: tests
        // never reach the internet, so give them an empty local list.
        let empty;
        let sources = if sources.is_empty() {
            let path = dir.join("empty.txt");
            std::fs::write(&path, "").unwrap();
            empty = format!(
                "[[sources]]\nname = \"empty\"\nurl = \"{}\"\n",
                path.display()
            );
            empty.as_str()
        } else {
            sources
        };
        let config = TestConfig::new(dir)
            .db("daemon.db")
            .judges(&format!(
                "[{{ url = \"http://{addr}/judge\", marker = \"proxywarden-judge\" }}]"
            ))
            .set("check", "https", "false")
            .set("api", "listen", &format!("\"{addr}\""))
            .sources_toml(sources);
        let config = tune(config).build();
        let token = config.api.token.as_ref().map(|t| t.0.clone());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(proxywarden::daemon::run(
            config,
            listener,
            gateway,
            shutdown.clone(),
        ));
        Daemon {
            addr,
            http: client(Duration::from_secs(30)),
            token,
            shutdown,
            task,
        }
    }

    /// Waits (up to 30 s) until `/stats` says `n` proxies are servable.
    pub async fn until_servable(&self, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (_, stats) = self.json("/stats").await;
            if stats["servable"].as_u64() == Some(n) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "never {n} servable: {stats}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://addr{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A request to `path`, with the token when the config sets one.
    pub fn req(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, self.url(path));
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// `GET path`, with the token.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.req(reqwest::Method::GET, path).send().await.unwrap()
    }

    /// `GET path`, with the token: the status and the JSON body.
    pub async fn json(&self, path: &str) -> (u16, serde_json::Value) {
        status_json(self.get(path).await).await
    }

    /// Cancels the daemon and waits for it to exit cleanly; how long that
    /// took.
    pub async fn stop(self) -> Duration {
        let started = Instant::now();
        self.shutdown.cancel();
        super::within(self.task).await.unwrap().unwrap();
        started.elapsed()
    }
}

/// The status of `resp` and its body as JSON.
pub async fn status_json(resp: reqwest::Response) -> (u16, serde_json::Value) {
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap())
}

/// A direct client with the crate's TLS setup (no other provider is
/// compiled in), giving up on a request after `timeout`.
pub fn client(timeout: Duration) -> reqwest::Client {
    let tls =
        proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .no_proxy()
        // The API closes a connection quiet for api.header_timeout (10 s):
        // one kept longer could be reused just as the server closes it.
        .pool_idle_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .build()
        .unwrap()
}

/// A test client that sends everything through `proxy` (the gateway, as
/// clients use it), with the crate's TLS setup: no other crypto provider is
/// compiled in.
pub fn proxied_client(proxy: reqwest::Proxy) -> reqwest::Client {
    let tls = proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H1).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .proxy(proxy)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}
