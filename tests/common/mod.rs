//! Loopback servers for integration tests: a fake source site that serves
//! lists and misbehaves on request, plus helpers to build configs.

#![allow(dead_code)]

pub mod backend;
pub mod binary;
pub mod config;
pub mod daemon;
pub mod fakes;
pub mod judges;
pub mod postgres;
pub mod site;
pub mod tmpfs;

pub use config::TestConfig;

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the fake site answers one path.
#[derive(Clone, Debug)]
pub enum Behavior {
    /// A complete response.
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// The body gzip-compressed, with `Content-Encoding: gzip`.
    Gzip(Vec<u8>),
    /// The body brotli-compressed, with `Content-Encoding: br`.
    Brotli(Vec<u8>),
    /// A 302 to another path.
    Redirect(String),
    /// 200 with no length, then bytes forever.
    Endless,
    /// Accepts the request and never answers.
    Hang,
    /// Answers `503` with `Retry-After` for the first `failures` hits,
    /// then behaves like `then`.
    Flaky {
        failures: usize,
        retry_after: u64,
        then: Box<Behavior>,
    },
    /// Writes the head and half of the body, then closes.
    Truncated(Vec<u8>),
}

impl Behavior {
    /// `200 OK` with a body.
    pub fn ok(body: impl Into<Vec<u8>>) -> Behavior {
        Behavior::Respond {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// A bare status with a short body.
    pub fn status(status: u16) -> Behavior {
        Behavior::Respond {
            status,
            headers: Vec::new(),
            body: format!("status {status}").into_bytes(),
        }
    }
}

/// A fake source site on 127.0.0.1. Dropping it stops the server.
pub struct FakeSite {
    pub addr: SocketAddr,
    hits: Arc<Mutex<HashMap<String, usize>>>,
    heads: Arc<Mutex<HashMap<String, String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeSite {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeSite {
    /// Serves `routes` (path with query → behaviour); other paths are 404.
    pub async fn start(routes: Vec<(&str, Behavior)>) -> FakeSite {
        let routes: Arc<HashMap<String, Behavior>> =
            Arc::new(routes.into_iter().map(|(p, b)| (p.to_owned(), b)).collect());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let heads: Arc<Mutex<HashMap<String, String>>> = Arc::default();
        let task = {
            let hits = hits.clone();
            let heads = heads.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        continue;
                    };
                    let routes = routes.clone();
                    let hits = hits.clone();
                    let heads = heads.clone();
                    tokio::spawn(async move {
                        let _ = serve_conn(stream, &routes, &hits, &heads).await;
                    });
                }
            })
        };
        FakeSite {
            addr,
            hits,
            heads,
            task,
        }
    }

    /// `http://127.0.0.1:port{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many requests reached `path`.
    pub fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }

    /// The value of request header `name` (case-insensitive) in the last
    /// request for `path`.
    pub fn last_header(&self, path: &str, name: &str) -> Option<String> {
        let heads = self.heads.lock().unwrap();
        heads.get(path)?.lines().skip(1).find_map(|line| {
            let (n, v) = line.split_once(':')?;
            n.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    }
}

async fn serve_conn(
    mut stream: TcpStream,
    routes: &HashMap<String, Behavior>,
    hits: &Mutex<HashMap<String, usize>>,
    heads: &Mutex<HashMap<String, String>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf);
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let hit = {
        let mut h = hits.lock().unwrap();
        let n = h.entry(path.clone()).or_insert(0);
        *n += 1;
        *n
    };
    heads
        .lock()
        .unwrap()
        .insert(path.clone(), head.into_owned());
    let behavior = routes
        .get(&path)
        .cloned()
        .unwrap_or_else(|| Behavior::status(404));
    respond(&mut stream, behavior, hit).await
}

async fn respond(stream: &mut TcpStream, behavior: Behavior, hit: usize) -> std::io::Result<()> {
    let mut b = behavior;
    // Resolve flaky behaviours for this hit.
    while let Behavior::Flaky {
        failures,
        retry_after,
        then,
    } = b
    {
        if hit <= failures {
            b = Behavior::Respond {
                status: 503,
                headers: vec![("Retry-After".into(), retry_after.to_string())],
                body: b"try later".to_vec(),
            };
        } else {
            b = *then;
        }
    }
    match b {
        Behavior::Respond {
            status,
            headers,
            body,
        } => write_response(stream, status, &headers, &body).await,
        Behavior::Gzip(body) => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(&body)?;
            let gz = enc.finish()?;
            write_response(
                stream,
                200,
                &[("Content-Encoding".into(), "gzip".into())],
                &gz,
            )
            .await
        }
        Behavior::Brotli(body) => {
            let mut br = Vec::new();
            brotli::BrotliCompress(
                &mut body.as_slice(),
                &mut br,
                &brotli::enc::BrotliEncoderParams::default(),
            )?;
            write_response(
                stream,
                200,
                &[("Content-Encoding".into(), "br".into())],
                &br,
            )
            .await
        }
        Behavior::Redirect(to) => {
            write_response(stream, 302, &[("Location".into(), to)], b"moved").await
        }
        Behavior::Endless => {
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n",
                )
                .await?;
            let line = b"10.0.0.1:8080\n".repeat(4096);
            loop {
                stream.write_all(&line).await?;
            }
        }
        Behavior::Hang => {
            // Keep the connection open without answering until the client
            // gives up (the read returns when it closes).
            let mut sink = [0u8; 1024];
            while stream.read(&mut sink).await? > 0 {}
            Ok(())
        }
        Behavior::Truncated(body) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            stream.write_all(head.as_bytes()).await?;
            stream.write_all(&body[..body.len() / 2]).await?;
            stream.shutdown().await
        }
        Behavior::Flaky { .. } => unreachable!("resolved above"),
    }
}

async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) -> std::io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    stream.shutdown().await
}

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
    use proxywarden::model::{Candidate, Hints, Outcome, RecheckPolicy, SourceScheme};
    use proxywarden::proxy::{Country, Proxy};
    use proxywarden::store::{CheckRecord, ProxyFilter, Store, now_ms};
    let store = Store::open(path).unwrap();
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
    (store, ids)
}
