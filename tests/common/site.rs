//! The one fake web site of the tests, a proxy list's source as much as a
//! crawl's target: pages from a handler, robots.txt, per-peer bans (a
//! captcha page for the addresses of chosen proxies), a per-peer rate limit
//! answering 429 with Retry-After, latency, optional TLS, keep-alive, and
//! answers that break on purpose (never sent, endless, cut short); it
//! records every request (path, peer, time, the last head per path) and
//! the most requests it served at once.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// One answer.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// How the answer goes out: whole, or broken on purpose.
    pub delivery: Delivery,
}

/// How a [`Reply`] goes out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Delivery {
    /// Head and body, whole.
    #[default]
    Whole,
    /// Never: the request is read and left unanswered, the connection
    /// held until the client gives up.
    Never,
    /// `200` with no length, then proxy-list lines forever.
    Endless,
    /// The head with the body's whole length, half the body, then the
    /// connection closes.
    Cut,
    /// The head with the body's whole length at once, then the body one
    /// byte a second: slow on purpose, never idle long enough for an idle
    /// timeout.
    Drip,
}

impl Reply {
    /// `200` with a body and no headers.
    pub fn ok(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            status: 200,
            headers: Vec::new(),
            body: body.into(),
            delivery: Delivery::Whole,
        }
    }

    /// `200` with `body` gzip-compressed and `Content-Encoding: gzip`.
    pub fn gzip(body: &[u8]) -> Reply {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(body).unwrap();
        Reply::ok(enc.finish().unwrap()).with("Content-Encoding", "gzip")
    }

    /// `200` with `body` brotli-compressed and `Content-Encoding: br`.
    pub fn brotli(body: &[u8]) -> Reply {
        let mut br = Vec::new();
        brotli::BrotliCompress(
            &mut &body[..],
            &mut br,
            &brotli::enc::BrotliEncoderParams::default(),
        )
        .unwrap();
        Reply::ok(br).with("Content-Encoding", "br")
    }

    /// No answer at all (see [`Delivery::Never`]).
    pub fn hang() -> Reply {
        Reply {
            delivery: Delivery::Never,
            ..Reply::ok("")
        }
    }

    /// An answer without end (see [`Delivery::Endless`]).
    pub fn endless() -> Reply {
        Reply {
            delivery: Delivery::Endless,
            ..Reply::ok("")
        }
    }

    /// `body` one byte a second (see [`Delivery::Drip`]).
    pub fn drip(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            delivery: Delivery::Drip,
            ..Reply::ok(body)
        }
    }

    /// `body` cut in half (see [`Delivery::Cut`]).
    pub fn cut(body: impl Into<Vec<u8>>) -> Reply {
        Reply {
            delivery: Delivery::Cut,
            ..Reply::ok(body)
        }
    }

    /// `200` with an HTML body.
    pub fn html(body: impl Into<String>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "text/html; charset=utf-8".into())],
            body: body.into().into_bytes(),
            delivery: Delivery::Whole,
        }
    }

    /// `200` with a plain-text body.
    pub fn text(body: impl Into<String>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.into().into_bytes(),
            delivery: Delivery::Whole,
        }
    }

    /// A bare status.
    pub fn status(status: u16) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: format!("status {status}").into_bytes(),
            delivery: Delivery::Whole,
        }
    }

    /// A redirect to `to`.
    pub fn redirect(status: u16, to: &str) -> Reply {
        Reply {
            status,
            headers: vec![("Location".into(), to.into())],
            body: b"moved".to_vec(),
            delivery: Delivery::Whole,
        }
    }

    /// Adds a header.
    pub fn with(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// The page a banned peer gets.
pub const CAPTCHA_PAGE: &str =
    "<html><head><title>Captcha</title></head><body>prove you are human</body></html>";

/// Answers a path (with its query) and the hit count of that path so far
/// (1 for the first request).
pub type Handler = Arc<dyn Fn(&str, usize) -> Reply + Send + Sync>;

/// A per-peer rate limit: more than `max` requests from one address in
/// `window` get 429 with `Retry-After: retry_after`.
#[derive(Clone, Copy, Debug)]
pub struct RateLimit {
    pub max: usize,
    pub window: Duration,
    pub retry_after: u64,
}

/// How the site behaves.
#[derive(Clone)]
pub struct SiteOpts {
    pub handler: Handler,
    /// `/robots.txt`; 404 when `None`.
    pub robots: Option<Reply>,
    /// Peers that get `ban_reply` instead of pages (robots.txt included).
    pub banned: Vec<IpAddr>,
    pub ban_reply: Reply,
    pub rate_limit: Option<RateLimit>,
    /// Added before every answer.
    pub latency: Duration,
    /// Serve TLS with a certificate for 127.0.0.1 from a CA written to
    /// this directory as `site-ca.pem`.
    pub tls_dir: Option<PathBuf>,
}

impl SiteOpts {
    /// A site answering every path with `handler`.
    pub fn new(handler: impl Fn(&str, usize) -> Reply + Send + Sync + 'static) -> SiteOpts {
        SiteOpts {
            handler: Arc::new(handler),
            robots: None,
            banned: Vec::new(),
            ban_reply: Reply::html(CAPTCHA_PAGE),
            rate_limit: None,
            latency: Duration::ZERO,
            tls_dir: None,
        }
    }

    /// A site serving `path` that answers its first `failures` requests
    /// with `503` and `Retry-After: retry_after` (seconds), then `then`;
    /// other paths are 404.
    pub fn flaky(path: &str, failures: usize, retry_after: u64, then: Reply) -> SiteOpts {
        let path = path.to_owned();
        SiteOpts::new(move |p, hit| match p {
            p if p != path => Reply::status(404),
            _ if hit <= failures => {
                Reply::status(503).with("Retry-After", &retry_after.to_string())
            }
            _ => then.clone(),
        })
    }

    /// A site of fixed routes; other paths are 404.
    pub fn routes(routes: Vec<(&str, Reply)>) -> SiteOpts {
        let map: HashMap<String, Reply> =
            routes.into_iter().map(|(p, r)| (p.to_owned(), r)).collect();
        SiteOpts::new(move |path, _| map.get(path).cloned().unwrap_or_else(|| Reply::status(404)))
    }
}

/// `n` pages, `/p/0` to `/p/{n-1}` (`/` is page 0), page i linking to pages
/// `i*fanout+1 ..= i*fanout+fanout` that exist: a tree that a breadth-first
/// crawl covers whole. Each page has a title and a price.
pub fn tree_page(path: &str, n: usize, fanout: usize) -> Reply {
    let i = match path {
        "/" => 0,
        p => match p.strip_prefix("/p/").and_then(|s| s.parse::<usize>().ok()) {
            Some(i) if i < n => i,
            _ => return Reply::status(404),
        },
    };
    let mut body = format!(
        "<html><head><title>Page {i}</title></head><body><h1>Page {i}</h1>\
         <span class=\"price\">{i}.99</span>"
    );
    for k in 1..=fanout {
        let child = i * fanout + k;
        if child < n {
            body.push_str(&format!("<a href=\"/p/{child}\">child {child}</a>"));
        }
    }
    body.push_str("</body></html>");
    Reply::html(body)
}

/// One request the site received.
#[derive(Clone, Debug)]
pub struct Hit {
    pub at: Instant,
    pub path: String,
    pub peer: IpAddr,
    pub user_agent: Option<String>,
}

#[derive(Default)]
struct Log {
    hits: Vec<Hit>,
    per_path: HashMap<String, usize>,
    /// Answers per path that carried the page itself: not a ban page, a
    /// 429 of the rate limit, or robots.txt.
    served_per_path: HashMap<String, usize>,
    in_flight: usize,
    max_in_flight: usize,
    /// Requests being answered per peer, and the most at once per peer.
    peer_in_flight: HashMap<IpAddr, usize>,
    max_peer_in_flight: usize,
    /// TCP connections accepted.
    connections: usize,
    /// Recent request times per peer, for the rate limit.
    recent: HashMap<IpAddr, Vec<Instant>>,
    /// The header fields of the last request for each path (the first
    /// [`MAX_HEADS`] paths).
    heads: HashMap<String, hyper::HeaderMap>,
}

/// Paths whose last request head a site keeps: a crawl of thousands of
/// pages keeps a fixed footprint.
const MAX_HEADS: usize = 1024;

/// A running site; dropping it stops it.
pub struct Site {
    pub addr: SocketAddr,
    tls: bool,
    ca_file: Option<PathBuf>,
    log: Arc<Mutex<Log>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Site {
    /// A site of `n` [`tree_page`]s with `fanout` links each, answering
    /// every request after `latency`.
    pub async fn tree(n: usize, fanout: usize, latency: Duration) -> Site {
        let mut opts = SiteOpts::new(move |p, _| tree_page(p, n, fanout));
        opts.latency = latency;
        Site::start(opts).await
    }

    /// A site of fixed routes (see [`SiteOpts::routes`]).
    pub async fn routes(routes: Vec<(&str, Reply)>) -> Site {
        Site::start(SiteOpts::routes(routes)).await
    }

    /// Binds 127.0.0.1:0 and serves.
    pub async fn start(opts: SiteOpts) -> Site {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log: Arc<Mutex<Log>> = Arc::default();
        let (acceptor, ca_file) = match &opts.tls_dir {
            Some(dir) => {
                let (acceptor, ca) = super::judges::tls_acceptor(dir, "site-ca.pem");
                (Some(acceptor), Some(ca))
            }
            None => (None, None),
        };
        let tls = acceptor.is_some();
        let opts = Arc::new(opts);
        let task = {
            let log = log.clone();
            tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        accepted = listener.accept() => {
                            let Ok((tcp, peer)) = accepted else { continue };
                            let _ = tcp.set_nodelay(true);
                            log.lock().unwrap().connections += 1;
                            let opts = opts.clone();
                            let log = log.clone();
                            let acceptor = acceptor.clone();
                            conns.spawn(async move {
                                let service = service_fn(move |req| {
                                    let opts = opts.clone();
                                    let log = log.clone();
                                    async move {
                                        Ok::<_, Infallible>(answer(&opts, &log, peer.ip(), req).await)
                                    }
                                });
                                let http = hyper::server::conn::http1::Builder::new();
                                match acceptor {
                                    Some(a) => {
                                        if let Ok(tls) = a.accept(tcp).await {
                                            let _ = http.serve_connection(TokioIo::new(tls), service).await;
                                        }
                                    }
                                    None => {
                                        let _ = http.serve_connection(TokioIo::new(tcp), service).await;
                                    }
                                }
                            });
                        }
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    }
                }
            })
        };
        Site {
            addr,
            tls,
            ca_file,
            log,
            task,
        }
    }

    /// `http(s)://127.0.0.1:port{path}`.
    pub fn url(&self, path: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{path}", self.addr)
    }

    /// The CA that signed a TLS site's certificate.
    pub fn ca_file(&self) -> &Path {
        self.ca_file.as_deref().expect("only TLS sites have a CA")
    }

    /// Requests for `path` (with its query) so far.
    pub fn hits(&self, path: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .per_path
            .get(path)
            .copied()
            .unwrap_or(0)
    }

    /// The value of request header `name` in the last request for `path`.
    pub fn last_header(&self, path: &str, name: &str) -> Option<String> {
        let log = self.log.lock().unwrap();
        let value = log.heads.get(path)?.get(name)?;
        Some(String::from_utf8_lossy(value.as_bytes()).into_owned())
    }

    /// Every request so far, in arrival order.
    pub fn log(&self) -> Vec<Hit> {
        self.log.lock().unwrap().hits.clone()
    }

    /// Requests per path.
    pub fn per_path(&self) -> HashMap<String, usize> {
        self.log.lock().unwrap().per_path.clone()
    }

    /// Answers per path that carried the page itself (a ban page or a
    /// rate-limit 429 is a request, not the page).
    pub fn served_per_path(&self) -> HashMap<String, usize> {
        self.log.lock().unwrap().served_per_path.clone()
    }

    /// TCP connections accepted so far (keep-alive reuses one).
    pub fn connections(&self) -> usize {
        self.log.lock().unwrap().connections
    }

    /// The most requests it was answering at once.
    pub fn max_in_flight(&self) -> usize {
        self.log.lock().unwrap().max_in_flight
    }

    /// The most requests from one peer address it was answering at once.
    pub fn max_in_flight_per_peer(&self) -> usize {
        self.log.lock().unwrap().max_peer_in_flight
    }
}

async fn answer(
    opts: &SiteOpts,
    log: &Mutex<Log>,
    peer: IpAddr,
    req: hyper::Request<hyper::body::Incoming>,
) -> hyper::Response<BoxBody<Bytes, std::io::Error>> {
    let path = req
        .uri()
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    let user_agent = req
        .headers()
        .get("user-agent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let now = Instant::now();
    let (hit, limited) = {
        let mut log = log.lock().unwrap();
        log.hits.push(Hit {
            at: now,
            path: path.clone(),
            peer,
            user_agent,
        });
        if log.heads.len() < MAX_HEADS || log.heads.contains_key(&path) {
            log.heads.insert(path.clone(), req.headers().clone());
        }
        let n = log.per_path.entry(path.clone()).or_insert(0);
        *n += 1;
        let hit = *n;
        log.in_flight += 1;
        log.max_in_flight = log.max_in_flight.max(log.in_flight);
        let mine = log.peer_in_flight.entry(peer).or_insert(0);
        *mine += 1;
        let mine = *mine;
        log.max_peer_in_flight = log.max_peer_in_flight.max(mine);
        let limited = opts.rate_limit.and_then(|rl| {
            let recent = log.recent.entry(peer).or_default();
            recent.retain(|t| now.duration_since(*t) < rl.window);
            recent.push(now);
            (recent.len() > rl.max).then_some(rl.retry_after)
        });
        (hit, limited)
    };
    if !opts.latency.is_zero() {
        tokio::time::sleep(opts.latency).await;
    }
    let reply = if opts.banned.contains(&peer) {
        opts.ban_reply.clone()
    } else if let Some(secs) = limited {
        Reply::status(429).with("Retry-After", &secs.to_string())
    } else if path == "/robots.txt" {
        opts.robots.clone().unwrap_or_else(|| Reply::status(404))
    } else {
        *log.lock()
            .unwrap()
            .served_per_path
            .entry(path.clone())
            .or_insert(0) += 1;
        (opts.handler)(&path, hit)
    };
    {
        let mut log = log.lock().unwrap();
        log.in_flight -= 1;
        if let Some(n) = log.peer_in_flight.get_mut(&peer) {
            *n -= 1;
        }
    }
    let mut resp = hyper::Response::builder().status(reply.status);
    for (k, v) in &reply.headers {
        resp = resp.header(k, v);
    }
    let body = match reply.delivery {
        Delivery::Whole => Full::new(Bytes::from(reply.body))
            .map_err(|never| match never {})
            .boxed(),
        Delivery::Never => std::future::pending().await,
        Delivery::Endless => {
            let lines = Bytes::from("10.0.0.1:8080\n".repeat(4096));
            let forever = futures::stream::repeat_with(move || Ok(Frame::data(lines.clone())));
            StreamBody::new(forever).boxed()
        }
        Delivery::Cut => {
            resp = resp.header("Content-Length", reply.body.len());
            let half = Bytes::from(reply.body[..reply.body.len() / 2].to_vec());
            let cut = futures::stream::iter([
                Ok(Frame::data(half)),
                Err(std::io::Error::other("cut short on purpose")),
            ]);
            StreamBody::new(cut).boxed()
        }
        Delivery::Drip => {
            resp = resp.header("Content-Length", reply.body.len());
            let bytes = reply.body;
            let drip = futures::stream::unfold(0usize, move |i| {
                let byte = bytes.get(i).copied();
                async move {
                    if i > 0 {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                    let byte = byte?;
                    Some((Ok(Frame::data(Bytes::copy_from_slice(&[byte]))), i + 1))
                }
            });
            StreamBody::new(drip).boxed()
        }
    };
    resp.body(body).unwrap()
}

/// One row of the crawl politeness table: robots.txt obeyed or not, the
/// crawl's own delay, robots.txt's Crawl-delay and the pages in flight per
/// host.
#[derive(Clone, Copy, Debug)]
pub struct Politeness {
    pub ignore_robots: bool,
    pub delay: Duration,
    pub crawl_delay: Option<Duration>,
    pub per_host: usize,
}

impl Politeness {
    /// Pages of each row's site.
    pub const PAGES: usize = 7;

    /// Every combination, zero delays included. The delays are long
    /// enough that a proxy hop running late on a loaded machine (up to
    /// 85 ms seen, running beside the other tests on 2 cores) stays well
    /// inside the half spacing [`Self::check`] allows.
    pub fn table() -> Vec<Politeness> {
        let mut rows = Vec::new();
        for ignore_robots in [false, true] {
            for delay in [Duration::ZERO, Duration::from_millis(250)] {
                for crawl_delay in [None, Some(Duration::from_millis(500))] {
                    for per_host in [1, 3] {
                        rows.push(Politeness {
                            ignore_robots,
                            delay,
                            crawl_delay,
                            per_host,
                        });
                    }
                }
            }
        }
        rows
    }

    /// The spacing of request starts a crawl owes the site.
    pub fn spacing(&self) -> Duration {
        match self.crawl_delay {
            Some(c) if !self.ignore_robots => c.max(self.delay),
            _ => self.delay,
        }
    }

    /// A crawl of a row's site still running this long is hung: far past
    /// its pages at their spacing (3.5 s at most) and a request timeout,
    /// however busy the machine. How fast a crawl goes is the crawl
    /// benchmark's to measure, not a test's.
    pub const HUNG: Duration = Duration::from_secs(45);

    /// A site of [`Self::PAGES`] tree pages whose robots.txt has the row's
    /// Crawl-delay and disallows `/p/5`, which only a crawl ignoring
    /// robots.txt fetches.
    pub async fn site(&self) -> Site {
        let mut robots = "User-agent: *\nDisallow: /p/5\n".to_owned();
        if let Some(c) = self.crawl_delay {
            robots.push_str(&format!("Crawl-delay: {}\n", c.as_secs_f64()));
        }
        let mut opts = SiteOpts::new(|p, _| tree_page(p, Self::PAGES, 2));
        opts.robots = Some(Reply::text(robots));
        Site::start(opts).await
    }

    /// What `site` saw of a crawl that `ended` then: each page it owed
    /// fetched once, robots.txt fetched once unless ignored, request
    /// starts spaced as owed (arrivals jitter by the proxy hop) and the
    /// end within `timeout` of the last request. The pages fetched, or
    /// what went wrong.
    pub fn check(&self, site: &Site, ended: Instant, timeout: Duration) -> Result<usize, String> {
        let mut want: HashSet<String> = (1..Self::PAGES).map(|i| format!("/p/{i}")).collect();
        want.insert("/".into());
        let robots_hits = site.hits("/robots.txt");
        let robots_want = if self.ignore_robots {
            0
        } else {
            want.remove("/p/5");
            1
        };
        if robots_hits != robots_want {
            return Err(format!("robots.txt fetched {robots_hits} times"));
        }
        let hits: HashMap<String, usize> = site
            .per_path()
            .into_iter()
            .filter(|(p, _)| p != "/robots.txt")
            .collect();
        if hits.keys().cloned().collect::<HashSet<_>>() != want || hits.values().any(|&n| n != 1) {
            return Err(format!(
                "pages fetched {hits:?}, wanted each of {want:?} once"
            ));
        }
        let log = site.log();
        let spacing = self.spacing();
        for w in log.windows(2) {
            let gap = w[1].at - w[0].at;
            if gap < spacing / 2 {
                return Err(format!("{gap:?} between {} and {}", w[0].path, w[1].path));
            }
        }
        let (first, last) = match (log.first(), log.last()) {
            (Some(f), Some(l)) => (f.at, l.at),
            _ => return Err("no request".into()),
        };
        let mean = (last - first) / (log.len() as u32 - 1);
        if mean < spacing.mul_f64(0.8) {
            return Err(format!("requests {mean:?} apart on average"));
        }
        let after = ended.saturating_duration_since(last);
        if after > timeout {
            return Err(format!(
                "ended {after:?} after its last request (request timeout {timeout:?})"
            ));
        }
        Ok(want.len())
    }
}
