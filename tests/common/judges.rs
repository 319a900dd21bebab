//! The one judge of the tests, on loopback: proxywarden's own `/judge` over
//! plain HTTP and over TLS (with a CA made for the test), turned faulty on
//! request, answering at every path for the fakes' self-tests, or
//! httpbin-style with a reported origin that can be mapped (to give a
//! loopback exit address a country in the GeoIP test database). It counts
//! the requests it answers.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::ConnectInfo;
use axum::extract::connect_info::MockConnectInfo;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use serde::Deserialize;
use tokio::net::TcpListener;

/// How a judge made with [`Judge::turning`] misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `200 OK` with random text instead of the echo.
    RandomContent,
    /// Accepts the request and never answers.
    Stall,
    /// Random text for three requests in ten, genuine answers otherwise.
    GarbageSometimes,
    /// The genuine answer's head at once, then its body one byte a second.
    Drip,
}

/// A server task stopped on drop.
pub struct Judge {
    pub addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    ca_file: Option<PathBuf>,
    tls: bool,
    path: &'static str,
    /// Requests that reached the router.
    count: Arc<AtomicUsize>,
}

/// What a judge answered, parsed from its body: proxywarden's judge answer
/// as a test reads it.
#[derive(Clone, Debug, Deserialize)]
pub struct JudgeEcho {
    /// The peer of the judge's socket (the proxy's outgoing address).
    pub remote_addr: SocketAddr,
    /// The request target as received (origin-form through a proxy).
    pub url: String,
    /// Header fields by name; repeated fields joined with ", ".
    pub headers: BTreeMap<String, String>,
}

impl JudgeEcho {
    /// Parses a judge body; `None` if it is not one (a liar's page, say).
    pub fn parse(body: &str) -> Option<JudgeEcho> {
        serde_json::from_str(body).ok()
    }

    /// A header's value, name matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

impl Drop for Judge {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Judge {
    /// proxywarden's `/judge` on plain HTTP.
    pub async fn plain() -> Judge {
        Judge::serve(proxywarden::api::judge::router(), "/judge").await
    }

    /// Serves `app`, a router answering `/judge`, on plain HTTP.
    pub async fn plain_with(app: axum::Router) -> Judge {
        Judge::serve(app, "/judge").await
    }

    /// proxywarden's `/judge` on plain HTTP at `addr`: one that went away
    /// (was dropped) coming back where it was.
    pub async fn plain_at(addr: SocketAddr) -> Judge {
        Judge::serve_on(listen_on(addr), proxywarden::api::judge::router(), "/judge").await
    }

    /// proxywarden's judge answer at every path, with the request target
    /// as it arrived (a proxy that failed to rewrite an absolute-form
    /// target shows): for the fakes' self-tests, which ask through a proxy
    /// for any path.
    pub async fn echo() -> Judge {
        let app = axum::Router::new().fallback(
            |info: ConnectInfo<SocketAddr>, m: Method, u: Uri, h: HeaderMap| async move {
                let mut answer = proxywarden::api::judge::judge(info, m, u.clone(), h).await;
                answer.0.url = u.to_string();
                answer
            },
        );
        Judge::serve(app, "/judge").await
    }

    /// Serves `app` on plain HTTP with the peer address available.
    async fn serve(app: axum::Router, path: &'static str) -> Judge {
        Judge::serve_on(listen(), app, path).await
    }

    async fn serve_on(listener: TcpListener, app: axum::Router, path: &'static str) -> Judge {
        let addr = listener.local_addr().unwrap();
        let (count, app) = counted(app);
        let task = tokio::spawn(async move {
            let _ = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await;
        });
        Judge {
            addr,
            task,
            ca_file: None,
            tls: false,
            path,
            count,
        }
    }

    /// proxywarden's `/judge` over TLS, with a certificate for 127.0.0.1
    /// signed by a CA written to `dir/ca.pem`.
    pub async fn tls(dir: &Path) -> Judge {
        Judge::tls_with(dir, proxywarden::api::judge::router()).await
    }

    /// [`Judge::tls`] speaking TLS 1.3 only, as some servers do.
    pub async fn tls13_only(dir: &Path) -> Judge {
        let versions: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];
        let (acceptor, ca_file) = tls_acceptor_with(dir, "ca.pem", versions);
        Judge::serve_tls(acceptor, ca_file, proxywarden::api::judge::router())
    }

    /// Serves `app`, a router answering `/judge`, over TLS as [`Judge::tls`]
    /// does.
    pub async fn tls_with(dir: &Path, app: axum::Router) -> Judge {
        let (acceptor, ca_file) = tls_acceptor(dir, "ca.pem");
        Judge::serve_tls(acceptor, ca_file, app)
    }

    fn serve_tls(
        acceptor: tokio_rustls::TlsAcceptor,
        ca_file: PathBuf,
        app: axum::Router,
    ) -> Judge {
        let (count, app) = counted(app);
        let listener = listen();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, peer)) = listener.accept().await else {
                    continue;
                };
                let acceptor = acceptor.clone();
                let app = app.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let app = app.clone().layer(MockConnectInfo(peer));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), TowerToHyperService::new(app))
                        .await;
                });
            }
        });
        Judge {
            addr,
            task,
            ca_file: Some(ca_file),
            tls: true,
            path: "/judge",
            count,
        }
    }

    /// proxywarden's `/judge` that answers its first request, the checker's
    /// direct one, and then `429 Too Many Requests` to everything, as a busy
    /// public judge does. `asked` counts the requests.
    pub fn rate_limited(asked: Arc<AtomicUsize>) -> axum::Router {
        axum::Router::new().route(
            "/judge",
            get(
                move |info: ConnectInfo<SocketAddr>, m: Method, u: Uri, h: HeaderMap| {
                    let n = asked.fetch_add(1, Ordering::Relaxed);
                    async move {
                        if n == 0 {
                            proxywarden::api::judge::judge(info, m, u, h)
                                .await
                                .into_response()
                        } else {
                            (StatusCode::TOO_MANY_REQUESTS, "slow down").into_response()
                        }
                    }
                },
            ),
        )
    }

    /// proxywarden's `/judge` that answers its first `after` requests
    /// genuinely and then has `fault`. `faulted` counts the requests that
    /// met the fault and came through a proxy (from any address but
    /// 127.0.0.1, the checker's own), proof that checks ran into it.
    pub fn turning(after: usize, fault: Fault, faulted: Arc<AtomicUsize>) -> axum::Router {
        let asked = Arc::new(AtomicUsize::new(0));
        axum::Router::new().route(
            "/judge",
            get(
                move |info: ConnectInfo<SocketAddr>, m: Method, u: Uri, h: HeaderMap| {
                    let n = asked.fetch_add(1, Ordering::Relaxed);
                    let faulty = n >= after
                        && match fault {
                            Fault::RandomContent | Fault::Stall | Fault::Drip => true,
                            Fault::GarbageSometimes => matches!((n - after) % 10, 2 | 5 | 8),
                        };
                    // Proxies in tests forward from other 127.x addresses.
                    if faulty && info.0.ip() != IpAddr::from([127, 0, 0, 1]) {
                        faulted.fetch_add(1, Ordering::Relaxed);
                    }
                    async move {
                        if !faulty {
                            return proxywarden::api::judge::judge(info, m, u, h)
                                .await
                                .into_response();
                        }
                        match fault {
                            Fault::Stall => std::future::pending().await,
                            Fault::Drip => {
                                let genuine = proxywarden::api::judge::judge(info, m, u, h)
                                    .await
                                    .into_response();
                                drip(genuine).await
                            }
                            Fault::RandomContent | Fault::GarbageSometimes => {
                                format!("{:032x}", rand::random::<u128>()).into_response()
                            }
                        }
                    }
                },
            ),
        )
    }

    /// proxywarden's `/judge` that answers the checker's own direct
    /// requests (from 127.0.0.1), all but the first, `delay` late, and
    /// requests through proxies at once: a judge far from the checker.
    pub fn slow_to_checker(delay: std::time::Duration) -> axum::Router {
        let asked = Arc::new(AtomicUsize::new(0));
        axum::Router::new().route(
            "/judge",
            get(
                move |info: ConnectInfo<SocketAddr>, m: Method, u: Uri, h: HeaderMap| {
                    let direct = info.0.ip() == IpAddr::from([127, 0, 0, 1]);
                    let late = direct && asked.fetch_add(1, Ordering::Relaxed) > 0;
                    async move {
                        if late {
                            tokio::time::sleep(delay).await;
                        }
                        proxywarden::api::judge::judge(info, m, u, h)
                            .await
                            .into_response()
                    }
                },
            ),
        )
    }

    /// An httpbin-style judge (`/get`): `{"args", "headers", "origin",
    /// "url"}`, where `origin` is the peer address passed through `map`.
    pub async fn httpbin(map: HashMap<IpAddr, IpAddr>) -> Judge {
        let map = Arc::new(map);
        let handler =
            move |ConnectInfo(peer): ConnectInfo<SocketAddr>, uri: Uri, headers: HeaderMap| {
                let map = map.clone();
                async move {
                    let origin = map.get(&peer.ip()).copied().unwrap_or(peer.ip());
                    let headers: serde_json::Map<String, serde_json::Value> = headers
                        .iter()
                        .map(|(k, v)| {
                            (
                                k.as_str().to_owned(),
                                String::from_utf8_lossy(v.as_bytes()).into_owned().into(),
                            )
                        })
                        .collect();
                    axum::Json(serde_json::json!({
                        "args": {},
                        "headers": headers,
                        "origin": origin.to_string(),
                        "url": format!("http://httpbin.test{uri}"),
                    }))
                }
            };
        Judge::serve(axum::Router::new().route("/get", get(handler)), "/get").await
    }

    /// The judge URL (`/judge`, or `/get` for the httpbin one).
    pub fn url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{}", self.addr, self.path)
    }

    /// `http://addr{path}`: any path, for a judge made with [`Judge::echo`].
    pub fn at(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many requests it has answered (or is answering).
    pub fn requests(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// The CA file for a TLS judge.
    pub fn ca_file(&self) -> &Path {
        self.ca_file.as_deref().expect("only TLS judges have a CA")
    }
}

/// `app` counting the requests it gets, and the count.
fn counted(app: axum::Router) -> (Arc<AtomicUsize>, axum::Router) {
    let count = Arc::new(AtomicUsize::new(0));
    let counter = count.clone();
    let app = app.layer(tower::util::MapRequestLayer::new(
        move |req: axum::extract::Request| {
            counter.fetch_add(1, Ordering::SeqCst);
            req
        },
    ));
    (count, app)
}

/// A listener on 127.0.0.1:0 with a deep accept queue. Every check's
/// connection ends at the judge, thousands at once in scale tests, while
/// tokio's `bind` queues 1,024: past that the kernel drops SYNs, and the
/// client's retry a second later looks like a slow proxy.
fn listen() -> TcpListener {
    listen_on(SocketAddr::from(([127, 0, 0, 1], 0)))
}

/// [`listen`] on a given address: a judge back on the port it left.
fn listen_on(addr: SocketAddr) -> TcpListener {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_reuseaddr(true).unwrap();
    socket.bind(addr).unwrap();
    socket.listen(8192).unwrap()
}

/// A TLS acceptor with a new certificate for 127.0.0.1, and the file
/// `dir/ca_name` holding the CA that signed it.
pub fn tls_acceptor(dir: &Path, ca_name: &str) -> (tokio_rustls::TlsAcceptor, PathBuf) {
    tls_acceptor_with(dir, ca_name, rustls::DEFAULT_VERSIONS)
}

/// [`tls_acceptor`] speaking only `versions`.
pub fn tls_acceptor_with(
    dir: &Path,
    ca_name: &str,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> (tokio_rustls::TlsAcceptor, PathBuf) {
    let (ca_pem, cert, key) = make_certs();
    let ca_file = dir.join(ca_name);
    std::fs::write(&ca_file, ca_pem).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(config)), ca_file)
}

/// A test CA (PEM) and a certificate for 127.0.0.1 it signed, with its key.
pub fn make_certs() -> (
    String,
    rustls_pki_types::CertificateDer<'static>,
    rustls_pki_types::PrivateKeyDer<'static>,
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "proxywarden test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_params = CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    (
        ca_cert.pem(),
        leaf.der().clone(),
        rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
}

/// `answer` with its head at once and its body one byte a second.
async fn drip(answer: axum::response::Response) -> axum::response::Response {
    let (mut parts, body) = answer.into_parts();
    let bytes = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    parts
        .headers
        .insert(axum::http::header::CONTENT_LENGTH, bytes.len().into());
    let bytes = bytes.to_vec();
    let slow = futures::stream::unfold(0usize, move |i| {
        let byte = bytes.get(i).copied();
        async move {
            if i > 0 {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
            let byte = byte?;
            Some((
                Ok::<_, std::io::Error>(bytes::Bytes::copy_from_slice(&[byte])),
                i + 1,
            ))
        }
    });
    axum::response::Response::from_parts(parts, axum::body::Body::from_stream(slow))
}
