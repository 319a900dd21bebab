//! `cargo bench --bench api`: GET /proxy with 100,000 proxies in the health
//! index, under a keep-alive load generator on loopback, next to the same
//! server's /healthz in the same run (the ceiling on this machine, where
//! client and server share the cores). Prints requests per second and
//! p50/p99 latency per case, and the ratios to /healthz.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use proxywarden::api;
use proxywarden::config::Config;
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, HealthIndex};
use proxywarden::proxy::{Anonymity, Country, Proxy, Scheme, Status};
use proxywarden::store::{ProxyRecord, Store, now_ms};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const PROXIES: usize = 100_000;
const CONNECTIONS: usize = 32;
const WARMUP: Duration = Duration::from_millis(500);
const MEASURE: Duration = Duration::from_secs(3);

const COUNTRIES: [&str; 20] = [
    "US", "DE", "FR", "GB", "NL", "BR", "IN", "CN", "RU", "JP", "KR", "ID", "TR", "IT", "ES", "PL",
    "UA", "VN", "TH", "MX",
];

fn records(now: i64) -> Vec<ProxyRecord> {
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    (0..PROXIES)
        .map(|i| {
            let r = next();
            let scheme =
                [Scheme::Http, Scheme::Http, Scheme::Socks4, Scheme::Socks5][(r % 4) as usize];
            let anonymity = [
                Anonymity::Transparent,
                Anonymity::Anonymous,
                Anonymity::Elite,
            ][(r >> 8) as usize % 3];
            ProxyRecord {
                id: i as i64 + 1,
                proxy: Proxy {
                    scheme,
                    host: std::net::Ipv4Addr::from(0x0b00_0000 + i as u32).into(),
                    port: 1000 + (r >> 16) as u16 % 60000,
                    auth: None,
                },
                scheme_detect: false,
                status: Status::Alive,
                country: Country::parse(COUNTRIES[(r >> 24) as usize % COUNTRIES.len()]),
                country_source: Some("source".into()),
                anonymity: Some(anonymity),
                https: Some(r >> 40 & 1 == 1),
                latency_ms: Some(50 + (r >> 32) as i64 % 3000),
                exit_ip: None,
                last_checked: Some(now),
                last_alive: Some(now),
                first_seen: now,
                last_seen: now,
                reason: None,
                hint_anonymity: None,
                hint_https: None,
                checks_total: 10,
                checks_ok: 5 + (r >> 48) as i64 % 6,
                consecutive_failures: 0,
                next_check_at: now + 600_000,
                sources: vec!["bench".into()],
                failed_in_use_at: None,
            }
        })
        .collect()
}

struct Figures {
    rps: f64,
    p50: Duration,
    p99: Duration,
    errors: usize,
}

/// One keep-alive connection sending `path` until `until`; returns the
/// latencies of requests that started after `from`, and non-2xx/404 count.
async fn client(
    addr: SocketAddr,
    path: &'static str,
    from: Instant,
    until: Instant,
) -> (Vec<Duration>, usize) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    tcp.set_nodelay(true).ok();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut lat = Vec::new();
    let mut errors = 0;
    while Instant::now() < until {
        let req = http::Request::get(path)
            .header(http::header::HOST, "bench")
            .body(Empty::<Bytes>::new())
            .expect("request");
        let start = Instant::now();
        match sender.send_request(req).await {
            Ok(resp) => {
                let ok = resp.status().is_success();
                let _ = resp.into_body().collect().await;
                if !ok {
                    errors += 1;
                }
            }
            Err(_) => {
                errors += 1;
                break;
            }
        }
        if start >= from {
            lat.push(start.elapsed());
        }
    }
    (lat, errors)
}

async fn measure(addr: SocketAddr, path: &'static str) -> Figures {
    let from = Instant::now() + WARMUP;
    let until = from + MEASURE;
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| tokio::spawn(client(addr, path, from, until)))
        .collect();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await.expect("client task");
        all.extend(lat);
        errors += e;
    }
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    Figures {
        rps: all.len() as f64 / MEASURE.as_secs_f64(),
        p50: pct(0.50),
        p99: pct(0.99),
        errors,
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::from_toml(
            &format!(
                "[database]\npath = \"{}\"\n[[sources]]\nname = \"none\"\nurl = \"/dev/null\"\n",
                dir.path().join("bench.db").display()
            ),
            "bench",
        )
        .expect("config");
        let store = Store::open(&config.database.path).expect("store");
        let index = HealthIndex::from_records(records(now_ms()));
        let feedback = Feedback::new(index.clone(), store.clone());
        let state = Service::new(store, feedback, Arc::new(config)).api();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stop = CancellationToken::new();
        let server = tokio::spawn(api::serve(listener, state, stop.clone()));

        println!(
            "GET /proxy with {} proxies indexed; {CONNECTIONS} keep-alive connections, {:.1}s per case, 2 worker threads shared by client and server",
            index.len(),
            MEASURE.as_secs_f64()
        );
        let cases: [(&str, &'static str); 4] = [
            ("healthz (ceiling)", "/healthz"),
            ("proxy, no filter", "/proxy"),
            ("proxy, country+scheme+anonymity", "/proxy?country=US,DE&scheme=socks5&anonymity=elite"),
            ("proxy, text+https+latency", "/proxy?format=text&https=true&max_latency_ms=800"),
        ];
        let mut ceiling = None;
        println!("{:<34} {:>10} {:>9} {:>9} {:>12} {:>11}", "case", "req/s", "p50", "p99", "vs healthz", "p99 ratio");
        for (name, path) in cases {
            let f = measure(addr, path).await;
            let (base_rps, base_p99) = *ceiling.get_or_insert((f.rps, f.p99));
            println!(
                "{name:<34} {:>10.0} {:>8.2?} {:>8.2?} {:>11.2}x {:>10.2}x{}",
                f.rps,
                f.p50,
                f.p99,
                f.rps / base_rps,
                f.p99.as_secs_f64() / base_p99.as_secs_f64(),
                if f.errors > 0 { format!("  ({} errors)", f.errors) } else { String::new() }
            );
        }
        println!("targets: /proxy >= 20,000 req/s, >= 0.5x healthz throughput, p99 <= 2x healthz p99");
        stop.cancel();
        let _ = server.await;
    });
}
