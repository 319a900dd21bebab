//! What the integration tests (and the benches) share: loopback servers
//! (the fake site, proxies of every kind, judges), the daemon in-process,
//! configs and stores to start from.

#![allow(dead_code)]

pub mod app;
pub mod backend;
pub mod binary;
pub mod config;
pub mod daemon;
pub mod fakes;
pub mod gateway;
pub mod judges;
pub mod node;
pub mod postgres;
pub mod site;
pub mod tmpfs;

pub use config::TestConfig;

use std::path::Path;

/// A config with fast timeouts (see [`TestConfig::new`]) and `sources`
/// (TOML `[[sources]]` blocks) appended.
pub fn config_toml(dir: &Path, sources: &str) -> String {
    TestConfig::new(dir).sources_toml(sources).toml()
}

/// Writes `toml` to `dir/proxywarden.toml` and returns the path.
pub fn write_config(dir: &Path, toml: &str) -> std::path::PathBuf {
    let p = dir.join("proxywarden.toml");
    std::fs::write(&p, toml).unwrap();
    p
}

/// The ids of every stored proxy.
pub async fn ids_of(store: &proxywarden::store::Store) -> Vec<i64> {
    store
        .list_proxies(proxywarden::store::ProxyFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect()
}

/// A passed check of proxy `id` at `at` (unix ms), as the checker records it.
pub fn alive_at(id: i64, at: i64) -> proxywarden::store::CheckRecord {
    proxywarden::store::CheckRecord {
        id,
        checked_at: at,
        outcome: proxywarden::model::Outcome {
            failure: None,
            latency: Some(std::time::Duration::from_millis(5)),
            anonymity: None,
            https: None,
            exit_ip: None,
            country: None,
            detected: None,
        },
    }
}

/// A failed check of proxy `id` at `at` (unix ms): the proxy refused.
pub fn refused_at(id: i64, at: i64) -> proxywarden::store::CheckRecord {
    proxywarden::store::CheckRecord {
        id,
        checked_at: at,
        outcome: proxywarden::model::Outcome::dead(proxywarden::model::Reason::Refused),
    }
}

/// A text source's run named `name` from `url` that started at
/// `started_at` (unix ms) and went through at once, without an HTTP status.
pub fn source_run(name: &str, url: &str, started_at: i64) -> proxywarden::store::SourceRun {
    proxywarden::store::SourceRun {
        name: name.into(),
        url: url.into(),
        format: "text".into(),
        started_at,
        http_status: None,
        duration_ms: 0,
        error: None,
        private: 0,
    }
}

/// CPU seconds (user and system) process `pid` has used so far, from
/// /proc (in clock ticks of 10 ms); 0 once it is gone.
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which may hold spaces: utime and
    // stime are the 14th and 15th of the line.
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse().ok())
        .collect();
    f.iter().sum::<u64>() as f64 / 100.0
}

/// Held by the tests that start farms of thousands of listeners: in one
/// test process they share one open-file limit, and two at once would
/// exhaust it.
pub static THOUSANDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Polls `done` (every 20 ms) until it holds, failing the test with `what`
/// after `within`: the wait for something a user would see happen.
pub async fn until<F, Fut>(what: &str, within: std::time::Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + within;
    while !done().await {
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {within:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A port on 127.0.0.1 free a moment ago, for a process started with it in
/// its config (a listener cannot be handed to another process).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Awaits `f`, failing the test after 60 s instead of hanging it.
pub async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(std::time::Duration::from_secs(60), f)
        .await
        .expect("timed out after 60 s")
}

/// One proxy to put in a test store as alive: its URL (credentials
/// included), the country to record and whether it tunnels HTTPS.
pub struct AliveProxy {
    pub url: String,
    pub country: Option<&'static str>,
    pub https: Option<bool>,
    pub latency_ms: u64,
}

impl AliveProxy {
    /// An alive proxy with no country, CONNECT support unknown.
    pub fn new(url: impl Into<String>) -> AliveProxy {
        AliveProxy {
            url: url.into(),
            country: None,
            https: None,
            latency_ms: 50,
        }
    }
}

/// `n` working HTTP proxies (CONNECT allowed) forwarding from 127.0.0.2
/// up, and the same as alive proxies for a store, in that order.
pub async fn working_proxies(n: u8) -> (Vec<fakes::FakeHttpProxy>, Vec<AliveProxy>) {
    let mut proxies = Vec::new();
    for last in 2..2 + n {
        proxies.push(fakes::http_proxy(last).await);
    }
    let alive = proxies.iter().map(|p| AliveProxy::new(p.url())).collect();
    (proxies, alive)
}

/// Three working proxies in two countries, each forwarding from its own
/// address: HTTP in DE (127.0.0.2), HTTP in US (.3) and SOCKS5 in US (.4).
pub struct ThreeCountries {
    pub de: fakes::FakeHttpProxy,
    pub us: fakes::FakeHttpProxy,
    pub us5: fakes::FakeSocks5,
}

impl ThreeCountries {
    /// Starts the three.
    pub async fn start() -> ThreeCountries {
        ThreeCountries {
            de: fakes::http_proxy(2).await,
            us: fakes::http_proxy(3).await,
            us5: fakes::FakeSocks5::start(fakes::SocksOpts {
                upstream_bind: Some(fakes::ip(4)),
                ..fakes::SocksOpts::default()
            })
            .await,
        }
    }

    /// The three, in that order, as a store should hold them: alive, with
    /// their countries.
    pub fn alive(&self) -> [AliveProxy; 3] {
        let located = |url: String, country| AliveProxy {
            country: Some(country),
            ..AliveProxy::new(url)
        };
        [
            located(self.de.url(), "DE"),
            located(self.us.url(), "US"),
            located(self.us5.url(), "US"),
        ]
    }
}

/// Opens a store at `path` holding `proxies`, each passed by a check just
/// now (as the checker records it); their ids, in the same order.
pub async fn store_with_alive(
    path: &Path,
    proxies: &[AliveProxy],
) -> (proxywarden::store::Store, Vec<i64>) {
    let store = proxywarden::store::Store::open(path).unwrap();
    let ids = put_alive(&store, proxies).await;
    (store, ids)
}

/// Records `proxies` in `store`, each passed by a check just now (as the
/// checker records it); their ids, in the same order.
pub async fn put_alive(store: &proxywarden::store::Store, proxies: &[AliveProxy]) -> Vec<i64> {
    use proxywarden::model::{Candidate, Hints, Outcome, RecheckPolicy, SourceScheme};
    use proxywarden::proxy::{Country, Proxy};
    use proxywarden::store::{CheckRecord, ProxyFilter, now_ms};
    let parsed: Vec<Proxy> = proxies
        .iter()
        .map(|p| Proxy::parse_url(&p.url).unwrap())
        .collect();
    let candidates: Vec<Candidate> = parsed
        .iter()
        .zip(proxies)
        .map(|(p, a)| {
            Candidate::new(
                p.host,
                p.port,
                p.auth.clone(),
                Some(p.scheme),
                SourceScheme::Detect,
                Hints {
                    country: a.country.and_then(Country::parse),
                    ..Hints::default()
                },
            )
        })
        .collect();
    let run = source_run("test", "file:test", now_ms());
    store.record_source_run(run, candidates).await.unwrap();
    let stored = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let ids: Vec<i64> = parsed
        .iter()
        .map(|p| {
            stored
                .iter()
                .find(|r| {
                    r.proxy.host == p.host && r.proxy.port == p.port && r.proxy.scheme == p.scheme
                })
                .expect("stored")
                .id
        })
        .collect();
    let now = now_ms();
    let checks = ids
        .iter()
        .zip(proxies)
        .map(|(id, a)| CheckRecord {
            id: *id,
            checked_at: now,
            outcome: Outcome {
                failure: None,
                latency: Some(std::time::Duration::from_millis(a.latency_ms)),
                anonymity: Some(proxywarden::proxy::Anonymity::Elite),
                https: a.https,
                exit_ip: None,
                country: None,
                detected: None,
            },
        })
        .collect();
    let policy = RecheckPolicy {
        alive: std::time::Duration::from_secs(600),
        alive_jitter: std::time::Duration::from_secs(150),
        dead: std::time::Duration::from_secs(900),
        dead_max: std::time::Duration::from_secs(86_400),
    };
    store.record_checks(checks, policy).await.unwrap();
    ids
}
