//! The daemon as an attacker meets it (issue 25): a web page driving the API
//! cross-site or reading it through DNS rebinding, hostile lists planting
//! private or the daemon's own addresses, floods of crawl jobs, bursts of
//! connections and the smaller holes. Loopback only: where a private address
//! must be refused, a test looks at what was stored or decided, and nothing
//! is ever let connect to one.

use crate::common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use proxywarden::api::{self, AppState};
use proxywarden::config::Config;
use proxywarden::harvest::harvest_all;
use proxywarden::store::{ProxyFilter, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use common::app::{request, serve, state};
use common::daemon::{Daemon, client, status_json};
use common::site::{Reply, Site};
use common::{TestConfig, store_with_alive, working_proxies};

/// One request through the router: its status, headers and JSON body.
async fn call(
    state: &AppState,
    req: Request<Body>,
) -> (StatusCode, header::HeaderMap, serde_json::Value) {
    let resp = api::router(state.clone()).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&body).unwrap_or_else(|e| {
        panic!(
            "{} {}: not JSON ({e})",
            parts.status,
            String::from_utf8_lossy(&body)
        )
    });
    (parts.status, parts.headers, json)
}

/// Everything a connection gets back until the server closes it.
async fn read_all(c: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("the server answers within 10 s")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

/// The JSON body of a raw HTTP/1.1 answer.
fn body_json(answer: &str) -> serde_json::Value {
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {answer:?}"))
}

/// The hosts and ports of every stored proxy.
async fn stored(store: &Store) -> Vec<String> {
    let mut all: Vec<String> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| SocketAddr::new(r.proxy.host, r.proxy.port).to_string())
        .collect();
    all.sort();
    all
}

/// A text list served at `/list.txt`.
async fn list_site(entries: &[String]) -> Site {
    Site::routes(vec![("/list.txt", Reply::ok(entries.join("\n")))]).await
}

/// A source at `/list.txt` redirecting (302) to `to`.
async fn redirecting_site(to: &str) -> Site {
    Site::routes(vec![("/list.txt", Reply::redirect(302, to))]).await
}

// Item 1: browser defences.

#[tokio::test]
async fn a_web_page_cannot_post_to_the_api_cross_site() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let job = r#"{"seeds": ["http://127.0.0.1:9/"], "max_pages": 1}"#;
    let report = r#"{"ok": false, "reason": "timeout"}"#;
    // What a page can send anywhere without the browser asking first.
    for (path, body) in [("/crawls", job), ("/proxies/1/report", report)] {
        for ctype in [
            Some("text/plain"),
            Some("text/plain; charset=utf-8"),
            Some("application/x-www-form-urlencoded"),
            Some("multipart/form-data; boundary=x"),
            None,
        ] {
            let headers: Vec<(&str, &str)> =
                ctype.map(|c| ("content-type", c)).into_iter().collect();
            let (status, _, json) = call(&s, request("POST", path, &headers, body)).await;
            assert_eq!(
                status,
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "{path} {ctype:?}: {json}"
            );
            assert_eq!(json["error"]["code"], "unsupported_media_type");
            let message = json["error"]["message"].as_str().unwrap();
            assert!(message.contains("application/json"), "{message}");
        }
    }
    // Nothing was started.
    let (status, _, list) = call(&s, request("GET", "/crawls", &[], "")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["crawls"], serde_json::json!([]));

    // JSON said as such gets through (here to the handlers' own answers),
    // parameters and case as clients write them.
    let json_type = [("content-type", "Application/JSON; charset=utf-8")];
    let (status, _, json) =
        call(&s, request("POST", "/proxies/1/report", &json_type, report)).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    let (status, _, json) = call(
        &s,
        request("POST", "/crawls", &json_type, r#"{"seeds": []}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    // A DELETE carries no body and needs none.
    let (status, _, json) = call(&s, request("DELETE", "/crawls/7", &[], "")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
}

#[tokio::test]
async fn a_rebound_host_cannot_read_the_api_without_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let get = |path: &str, host: &str| request("GET", path, &[("host", host)], "");
    for path in ["/export", "/proxies", "/sources", "/crawls", "/stats"] {
        for host in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1.evil.example",
            "10.0.0.1",
        ] {
            let (status, _, json) = call(&s, get(path, host)).await;
            assert_eq!(
                status,
                StatusCode::MISDIRECTED_REQUEST,
                "{path} {host}: {json}"
            );
            assert_eq!(json["error"]["code"], "host_not_allowed");
            let message = json["error"]["message"].as_str().unwrap();
            assert!(message.contains("api.allowed_hosts"), "{message}");
        }
    }
    // This machine's own names, whatever the port.
    for host in [
        "localhost",
        "LOCALHOST:8080",
        "127.0.0.1:8080",
        "127.1.2.3",
        "[::1]:8080",
    ] {
        let (status, _, json) = call(&s, get("/proxies", host)).await;
        assert_eq!(status, StatusCode::OK, "{host}: {json}");
    }

    // A name of one's own, listed.
    let s = state(dir.path(), |c| {
        c.db("named.db")
            .set("api", "allowed_hosts", r#"["Proxies.LAN", "192.0.2.10"]"#)
    })
    .await;
    for host in ["proxies.lan", "proxies.lan:8080", "192.0.2.10:8080"] {
        let (status, _, json) = call(&s, get("/proxies", host)).await;
        assert_eq!(status, StatusCode::OK, "{host}: {json}");
    }
    let (status, _, _) = call(&s, get("/proxies", "evil.example")).await;
    assert_eq!(status, StatusCode::MISDIRECTED_REQUEST);

    // With a token the token decides, whatever the name.
    let s = state(dir.path(), |c| {
        c.db("token.db").set("api", "token", "\"sixteen-chars-xy\"")
    })
    .await;
    let req = request(
        "GET",
        "/export",
        &[
            ("host", "evil.example"),
            ("authorization", "Bearer sixteen-chars-xy"),
        ],
        "",
    );
    let resp = api::router(s.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // And a client like curl, on a real socket, still gets in.
    let s = state(dir.path(), |c| c.db("real.db")).await;
    let (addr, stop) = serve(s).await;
    let http = client(Duration::from_secs(10));
    let resp = http
        .get(format!("http://{addr}/export"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = http
        .post(format!("http://{addr}/proxies/1/report"))
        .header("content-type", "application/json")
        .body(r#"{"ok": false}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(
        resp.status(),
        404,
        "the guide's report example (docs/src/api.md) gets to the handler"
    );
    stop.cancel();
}

// Item 2: hostile lists.

#[tokio::test]
async fn a_hostile_list_cannot_plant_private_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let planted: Vec<String> = [
        "127.0.0.1:22",
        "10.0.0.1:80",
        "172.16.5.4:3128",
        "192.168.1.1:8080",
        "169.254.169.254:80",
        "100.100.100.200:80",
        "203.0.113.7:3128",
        "[::1]:8080",
        "[fe80::1]:3128",
        "[fd00::5]:1080",
        "[::ffff:127.0.0.1]:3128",
        "[::ffff:169.254.169.254]:80",
    ]
    .map(String::from)
    .to_vec();
    let public = ["8.8.8.8:3128", "[2606:4700::1111]:8080"].map(String::from);
    let mut entries = planted.clone();
    entries.extend(public.iter().cloned());
    let site = list_site(&entries).await;
    let only_private = Site::routes(vec![("/list.txt", Reply::ok(planted.join("\n")))]).await;
    let config = TestConfig::new(dir.path())
        .set("harvest", "allow_private_addresses", "false")
        .source("mixed", &site.url("/list.txt"), "")
        .source("lan", &only_private.url("/list.txt"), "")
        .build();
    assert!(!config.harvest.allow_private_addresses);
    let store = Store::open(&config.database.path).unwrap();
    let report = harvest_all(&config, &store).await.unwrap();

    // Only what is on the public internet was stored; nothing was checked.
    assert_eq!(
        stored(&store).await,
        ["8.8.8.8:3128", "[2606:4700::1111]:8080"]
    );
    let mixed = &report.sources[0];
    assert_eq!(
        (mixed.found, mixed.private),
        (2, planted.len()),
        "{mixed:?}"
    );
    assert!(mixed.error.is_none(), "{mixed:?}");
    // A list of nothing but private addresses says so.
    let lan = &report.sources[1];
    assert_eq!((lan.found, lan.private), (0, planted.len()), "{lan:?}");
    let error = lan.error.as_deref().unwrap();
    assert!(
        error.contains("private") && error.contains("harvest.allow_private_addresses"),
        "{error}"
    );
    // /sources counts them per source.
    let sources = store.list_sources().await.unwrap();
    let counted: Vec<(String, Option<i64>)> = sources
        .iter()
        .map(|s| (s.name.clone(), s.last_private))
        .collect();
    assert_eq!(
        counted,
        [
            ("lan".to_owned(), Some(planted.len() as i64)),
            ("mixed".to_owned(), Some(planted.len() as i64))
        ]
    );

    // A lab keeps them with the key.
    let lab = TestConfig::new(dir.path())
        .db("lab.db")
        .source("lan", &only_private.url("/list.txt"), "")
        .build();
    assert!(lab.harvest.allow_private_addresses);
    let store = Store::open(&lab.database.path).unwrap();
    let report = harvest_all(&lab, &store).await.unwrap();
    // All but [::1]:8080: loopback on the port api.listen names (by
    // default 127.0.0.1:8080) is the daemon's own API, whatever the key.
    assert_eq!(report.sources[0].private, 1);
    let kept = stored(&store).await;
    assert_eq!(kept.len(), planted.len() - 1);
    assert!(!kept.contains(&"[::1]:8080".to_owned()), "{kept:?}");
}

#[tokio::test]
async fn the_daemons_own_api_and_gateway_are_never_stored_even_in_a_lab() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let api_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gateway_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (api, gateway) = (
            api_listener.local_addr().unwrap(),
            gateway_listener.local_addr().unwrap(),
        );
        // A lab proxy on a closed loopback port: kept, as the key says.
        let list = [
            format!("{api}"),
            format!("http://{gateway}"),
            format!("socks5://{gateway}"),
            format!("[::1]:{}", gateway.port()),
            format!("[::ffff:127.0.0.1]:{}", api.port()),
            "127.0.0.1:9".to_owned(),
        ];
        let path = dir.path().join("list.txt");
        std::fs::write(&path, list.join("\n")).unwrap();
        // The config names port 0: what counts is what was bound.
        let config = TestConfig::new(dir.path())
            .db("daemon.db")
            .judges(&format!("[\"http://{api}/judge\"]"))
            .set("check", "https", "false")
            .set("api", "listen", "\"127.0.0.1:0\"")
            .set("gateway", "listen", "\"127.0.0.1:0\"")
            .source("lab", &path.display().to_string(), "")
            .build();
        assert!(config.harvest.allow_private_addresses);
        let stop = CancellationToken::new();
        let task = tokio::spawn(proxywarden::daemon::run(
            config,
            api_listener,
            Some(gateway_listener),
            stop.clone(),
        ));
        let http = client(Duration::from_secs(10));
        let deadline = Instant::now() + Duration::from_secs(20);
        let source = loop {
            let (_, sources) = status_json(
                http.get(format!("http://{api}/sources"))
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            if let Some(s) = sources
                .as_array()
                .and_then(|a| a.iter().find(|s| !s["last_fetch_at"].is_null()))
            {
                break s.clone();
            }
            assert!(Instant::now() < deadline, "never harvested: {sources}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(source["last_found"], 1, "{source}");
        assert_eq!(source["last_private"], 5, "{source}");
        let (_, all) = status_json(
            http.get(format!("http://{api}/proxies?status=all"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        let addrs: Vec<String> = all["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| format!("{}:{}", p["host"].as_str().unwrap(), p["port"]))
            .collect();
        assert_eq!(addrs, ["127.0.0.1:9"], "{all}");
        stop.cancel();
        task.await.unwrap().unwrap();
    })
    .await;
}

#[tokio::test]
async fn a_source_cannot_redirect_the_harvest_to_a_private_address() {
    let dir = tempfile::tempdir().unwrap();
    // The target is on loopback, where the test may go: a harvest that
    // followed a redirect would show here as a hit.
    let target = list_site(&["8.8.8.8:3128".to_owned()]).await;
    let by_address = redirecting_site(&target.url("/list.txt")).await;
    let by_name =
        redirecting_site(&format!("http://localhost:{}/list.txt", target.addr.port())).await;
    let sources = |c: TestConfig| {
        c.source("by-address", &by_address.url("/list.txt"), "")
            .source("by-name", &by_name.url("/list.txt"), "")
    };
    let config =
        sources(TestConfig::new(dir.path()).set("harvest", "allow_private_addresses", "false"))
            .build();
    let store = Store::open(&config.database.path).unwrap();
    let report = harvest_all(&config, &store).await.unwrap();
    for s in &report.sources {
        let error = s.error.as_deref().unwrap_or_else(|| panic!("{s:?}"));
        assert!(
            error.contains("refused")
                && error.contains("loopback")
                && error.contains("harvest.allow_private_addresses"),
            "{}: {error}",
            s.name
        );
        assert_eq!(s.http_status, Some(302), "{s:?}");
    }
    assert_eq!(
        target.hits("/list.txt"),
        0,
        "a refused redirect is never fetched"
    );
    assert!(stored(&store).await.is_empty());

    // With the key, a lab's redirects are followed.
    let lab = sources(TestConfig::new(dir.path()).db("lab.db")).build();
    let store = Store::open(&lab.database.path).unwrap();
    let report = harvest_all(&lab, &store).await.unwrap();
    assert!(
        report.sources.iter().all(|s| s.error.is_none()),
        "{report:?}"
    );
    assert_eq!(target.hits("/list.txt"), 2);
    assert_eq!(stored(&store).await, ["8.8.8.8:3128"]);
}

// Items 3 and 7, the gateway's own clients, are tested in tests/it/gateway.rs
// beside its other tests (its fake proxies and client helpers live there):
// `a_head_over_max_header_size_is_a_json_431_and_costs_no_proxy`,
// `a_request_every_proxy_fails_on_alike_is_not_charged_to_them`,
// `a_tunnel_every_proxy_fails_on_alike_is_not_charged_to_them`,
// `absolute_form_requests_carry_the_targets_host`,
// `port_zero_is_a_bad_target_and_never_reaches_a_proxy`,
// `a_control_given_twice_is_a_400_and_other_username_words_are_ignored`,
// `waiting_connections_make_room_oldest_first_and_busy_ones_never`,
// `one_address_cannot_take_every_slot` and
// `with_a_token_an_unauthenticated_connection_is_closed_at_the_header_timeout`;
// and the kept upstream connection found closed in
// `a_kept_upstream_connection_found_closed_is_retried_fresh_and_not_charged`.
//
// Item 6, what a site can do to the crawler and the pool, is tested in
// tests/it/crawl.rs beside the crawler's fake sites and proxies:
// `proxied_crawls_follow_redirects_as_direct_ones_do`,
// `a_robots_txt_that_never_answers_backs_the_site_off_and_blames_no_proxy`,
// `a_page_that_never_answers_backs_the_site_off_and_blames_no_proxy` and
// `a_page_nested_too_deep_is_parsed_up_to_the_cap_and_its_links_kept`.

// Item 4: crawl jobs bounded.

#[tokio::test]
async fn crawl_jobs_are_bounded_listed_in_pages_and_their_seeds_checked() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let slow = Site::tree(400, 4, Duration::from_millis(100)).await;
        let (_farm, alive) = working_proxies(2).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let daemon = Daemon::start(dir.path(), "", |c| {
            c.set("crawls", "max_running", "1")
                .set("crawls", "max_queued", "2")
        })
        .await;
        let post = |body: String| {
            daemon
                .req(reqwest::Method::POST, "/crawls")
                .header("content-type", "application/json")
                .body(body)
                .send()
        };
        let job = format!(
            r#"{{"seeds": ["{}"], "include": ["^http://"], "exclude": ["logout"],
                "select": {{"title": "title"}}, "max_pages": 300}}"#,
            slow.url("/")
        );
        let (status, first) = status_json(post(job.clone()).await.unwrap()).await;
        assert_eq!(status, 201, "{first}");
        let first_id = first["id"].as_i64().unwrap();
        let path = format!("/crawls/{first_id}");
        common::until("the first job running", Duration::from_secs(20), || async {
            daemon.json(&path).await.1["state"] == "running"
        })
        .await;
        // One runs; two may wait; the next is refused, naming the limit.
        for _ in 0..2 {
            let (status, queued) = status_json(post(job.clone()).await.unwrap()).await;
            assert_eq!(
                (status, queued["state"].as_str()),
                (201, Some("queued")),
                "{queued}"
            );
        }
        let resp = post(job.clone()).await.unwrap();
        assert_eq!(resp.status(), 429);
        assert!(resp.headers().contains_key("retry-after"));
        let (_, refused) = status_json(resp).await;
        assert_eq!(refused["error"]["code"], "too_many_requests");
        let message = refused["error"]["message"].as_str().unwrap();
        assert!(message.contains("crawls.max_queued (2)"), "{message}");

        // The list comes in pages, without seeds or patterns.
        let (status, page) = daemon.json("/crawls?limit=2").await;
        assert_eq!(status, 200, "{page}");
        let ids = |page: &serde_json::Value| -> Vec<i64> {
            page["crawls"]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["id"].as_i64().unwrap())
                .collect()
        };
        assert_eq!(ids(&page), [first_id + 2, first_id + 1]);
        assert_eq!(page["next"], first_id + 1);
        for j in page["crawls"].as_array().unwrap() {
            let options = j["options"].as_object().unwrap();
            for left_out in ["seeds", "include", "exclude", "select"] {
                assert!(!options.contains_key(left_out), "{left_out} in {j}");
            }
            assert_eq!(options["max_pages"], 300);
            assert_eq!(j["seeds_total"], 1);
        }
        let (_, rest) = daemon
            .json(&format!("/crawls?limit=2&after={}", first_id + 1))
            .await;
        assert_eq!(ids(&rest), [first_id]);
        assert!(rest["next"].is_null(), "{rest}");
        // A job's own view keeps its options whole.
        let (_, one) = daemon.json(&format!("/crawls/{first_id}")).await;
        assert_eq!(one["options"]["seeds"][0], slow.url("/"));
        for bad in ["limit=0", "limit=1001", "limit=x", "after=-1", "offset=3"] {
            let (status, json) = daemon.json(&format!("/crawls?{bad}")).await;
            assert_eq!(status, 400, "{bad}: {json}");
        }

        // Seeds whose host no DNS could carry: refused at once, briefly.
        let long = "a".repeat(100_000);
        let label = format!("{}.example", "b".repeat(64));
        for host in [long.as_str(), label.as_str()] {
            let body = format!(r#"{{"seeds": ["http://{host}/"]}}"#);
            let (status, json) = status_json(post(body).await.unwrap()).await;
            assert_eq!(status, 400, "{json}");
            let message = json["error"]["message"].as_str().unwrap();
            assert!(message.starts_with("seeds[0]: "), "{message}");
            assert!(message.len() < 300, "{} characters", message.len());
        }
        daemon.stop().await;

        // The CLI checks seeds the same way, before anything else.
        let cli = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .args(["crawl", &format!("http://{long}/")])
            .current_dir(dir.path())
            .env_remove("PROXYWARDEN_CONFIG")
            .output()
            .await
            .unwrap();
        assert_eq!(cli.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&cli.stderr);
        assert!(stderr.contains("at most 253"), "{stderr}");
        assert!(stderr.len() < 500, "{} bytes of error", stderr.len());
    })
    .await;
}

// Item 5: the smaller ones.

#[tokio::test]
async fn a_burst_of_new_connections_is_answered_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c.set("api", "max_connections", "4")).await;
    let (addr, stop) = serve(s).await;
    // Four clients have begun their requests: every slot is taken.
    let mut slow = Vec::new();
    for _ in 0..4 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        slow.push(c);
    }
    // A fifth, accepted after them (the listen queue is first in, first
    // out), is told to come back, not hung up on.
    let mut fifth = TcpStream::connect(addr).await.unwrap();
    fifth
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let answer = read_all(&mut fifth).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("\r\nretry-after: 1\r\n"),
        "{answer:?}"
    );
    let json = body_json(&answer);
    assert_eq!(json["error"]["code"], "busy");
    assert!(
        json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("api.max_connections (4)")
    );
    // None of the four lost its connection to make room.
    for mut c in slow {
        c.write_all(b"Connection: close\r\n\r\n").await.unwrap();
        let answer = read_all(&mut c).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    }

    // Clients that open connections and send nothing hold no slot for
    // long: /healthz gets in.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(addr).await.unwrap());
    }
    // Past their first second the quietest make room (until then a
    // newcomer is told to come back): /healthz gets in.
    common::until("/healthz gets in", Duration::from_secs(5), || async {
        // A refusal may come before the request is read: the connection
        // then ends without an answer the client can parse.
        match client(Duration::from_secs(5))
            .get(format!("http://{addr}/healthz"))
            .send()
            .await
        {
            Ok(resp) => {
                assert!(
                    [200, 503].contains(&resp.status().as_u16()),
                    "{}",
                    resp.status()
                );
                resp.status() == 200
            }
            Err(_) => false,
        }
    })
    .await;
    drop(silent);
    stop.cancel();
}

#[tokio::test]
async fn a_user_agent_that_would_break_headers_is_a_named_config_error() {
    for (ua, named) in [
        ("proxywarden/0.1\r\nX-Evil: 1", "carriage return"),
        ("proxywarden/0.1\nX-Evil: 1", "line feed"),
        ("proxywarden\u{0}", "NUL"),
        ("proxy\u{7}warden", "control character"),
        ("  ", "blank"),
    ] {
        let toml = format!("[harvest]\nuser_agent = {}\n", toml::Value::from(ua));
        let err = Config::from_toml(&toml, "t.toml").unwrap_err();
        let problems: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(
            problems[0].starts_with("harvest.user_agent: ") && problems[0].contains(named),
            "{ua:?}: {problems:?}"
        );
    }
    assert!(Config::from_toml("[harvest]\nuser_agent = \"Mozilla/5.0 (X11)\"\n", "t").is_ok());

    // `config check` says so, and fails.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("proxywarden.toml"),
        "[harvest]\nuser_agent = \"a\\r\\nb\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(["config", "check"])
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("harvest.user_agent"), "{stderr}");
}

#[tokio::test]
async fn serve_refuses_to_start_on_a_file_that_is_not_a_geoip_database() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("GeoLite2-Country.mmdb");
    std::fs::write(&fake, "this is not a MaxMind database\n".repeat(100)).unwrap();
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    std::fs::write(
        dir.path().join("proxywarden.toml"),
        format!(
            "[check]\njudges = [\"http://127.0.0.1:9/judge\"]\n\
             [geoip]\ndatabase = \"{}\"\n\
             [api]\nlisten = \"127.0.0.1:0\"\n\
             [gateway]\nlisten = \"127.0.0.1:0\"\n\
             [[sources]]\nname = \"empty\"\nurl = \"{}\"\n",
            fake.display(),
            empty.display()
        ),
    )
    .unwrap();
    for args in [&["config", "check"][..], &["serve"][..]] {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .args(args)
            .current_dir(dir.path())
            .env_remove("PROXYWARDEN_CONFIG")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        let Ok(status) = status else {
            child.kill().await.unwrap();
            panic!("{args:?} started on an invalid GeoIP database");
        };
        assert_eq!(status.unwrap().code(), Some(2), "{args:?}");
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .await
            .unwrap();
        assert!(
            stderr.contains("geoip.database") && stderr.contains("not a MaxMind"),
            "{args:?}: {stderr}"
        );
    }
}

#[tokio::test]
async fn filters_of_separators_alone_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    for query in [
        "/proxy?country=,",
        "/proxy?country=%2C%20%2C",
        "/proxies?scheme=,,",
        "/export?country=,&format=json",
        "/export?exclude=,",
    ] {
        let (status, _, json) = call(&s, request("GET", query, &[], "")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {json}");
        let message = json["error"]["message"].as_str().unwrap();
        assert!(message.contains("only separators"), "{query}: {message}");
    }
    // An empty value still means "not given".
    let (status, _, json) = call(&s, request("GET", "/proxies?country=", &[], "")).await;
    assert_eq!(status, StatusCode::OK, "{json}");
}

#[tokio::test]
async fn too_many_headers_are_answered_in_the_json_envelope() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let (addr, stop) = serve(s).await;
    let mut head = String::from("GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    for i in 0..120 {
        head.push_str(&format!("X-Filler-{i}: {i}\r\n"));
    }
    head.push_str("\r\n");
    let mut c = TcpStream::connect(addr).await.unwrap();
    c.write_all(head.as_bytes()).await.unwrap();
    let answer = read_all(&mut c).await;
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer:?}");
    assert_eq!(body_json(&answer)["error"]["code"], "headers_too_large");
    stop.cancel();
}

#[tokio::test]
async fn the_cli_leaves_its_data_in_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    // Public addresses, stored and never contacted (nothing is checked).
    let site = list_site(&["8.8.8.8:3128".to_owned(), "1.1.1.1:80".to_owned()]).await;
    TestConfig::new(dir.path())
        .source("list", &site.url("/list.txt"), "")
        .write();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .arg("harvest")
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let wal = dir.path().join("test.db-wal");
    assert!(
        std::fs::metadata(&wal).map_or(0, |m| m.len()) == 0,
        "the write-ahead log still holds data"
    );
    // The database file alone, copied as a backup would be, has it all.
    let backup = tempfile::tempdir().unwrap();
    let copy = backup.path().join("copy.db");
    std::fs::copy(dir.path().join("test.db"), &copy).unwrap();
    let store = Store::open_read_only(&copy).unwrap();
    assert_eq!(store.stats().await.unwrap().total, 2);
}
