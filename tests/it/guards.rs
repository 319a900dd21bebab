//! Browsers, guessing and tables: an API request another site's page made
//! is refused, `/sources` shows no credentials, a log-out ends its session
//! on the server, and a malformed body to the API is a 400.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use proxywarden::api::{self, AppState};
use proxywarden::daemon::Service;
use proxywarden::health::{Feedback, load_index};
use proxywarden::store::SourceRun;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use common::TestConfig;
use common::app::{request, serve, service, state};

const TOKEN: &str = "a-token-of-sixteen-or-more";

/// One request through the router: its status, headers and body.
async fn call(state: &AppState, req: Request<Body>) -> (StatusCode, header::HeaderMap, String) {
    let resp = api::router(state.clone()).oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn code(body: &str) -> String {
    let json: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    json["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn an_api_request_another_sites_page_made_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let host = ("host", "127.0.0.1:8080");
    // What an <img src> or a no-cors fetch from another site sends.
    for marks in [
        &[host, ("sec-fetch-site", "cross-site")][..],
        &[host, ("origin", "https://evil.example")][..],
        &[host, ("origin", "null")][..],
    ] {
        for path in ["/proxy?verify=true", "/stats", "/export"] {
            let (status, _, body) = call(&s, request("GET", path, marks, "")).await;
            assert_eq!(status, 403, "{path} {marks:?}: {body}");
            assert_eq!(code(&body), "cross_site", "{body}");
        }
    }
    // The API's own clients (and pages of its own origin) are answered.
    for marks in [
        &[host][..],
        &[host, ("sec-fetch-site", "same-origin")][..],
        &[host, ("origin", "http://127.0.0.1:8080")][..],
        &[host, ("sec-fetch-site", "none")][..],
    ] {
        let (status, _, body) = call(&s, request("GET", "/stats", marks, "")).await;
        assert_eq!(status, 200, "{marks:?}: {body}");
    }
    // /judge echoes anyone: proxies and other instances call it.
    let mut judge = request(
        "GET",
        "/judge",
        &[host, ("sec-fetch-site", "cross-site")],
        "",
    );
    let peer = SocketAddr::from(([127, 0, 0, 1], 40000));
    judge
        .extensions_mut()
        .insert(axum::extract::ConnectInfo(peer));
    let (status, _, body) = call(&s, judge).await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn sources_show_no_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let url = "http://alice:s3cret@lists.example/p.txt?api_key=k3y&page=2";
    s.store
        .record_source_run(
            SourceRun {
                name: "private".into(),
                url: url.into(),
                format: "text".into(),
                started_at: 1,
                http_status: Some(500),
                duration_ms: 1,
                error: Some(format!("fetching {url}: status 500")),
                private: 0,
            },
            Vec::<proxywarden::model::Candidate>::new(),
        )
        .await
        .unwrap();
    let (status, _, body) =
        call(&s, request("GET", "/sources", &[("host", "127.0.0.1")], "")).await;
    assert_eq!(status, 200, "{body}");
    for secret in ["alice", "s3cret", "k3y"] {
        assert!(!body.contains(secret), "{secret} shown: {body}");
    }
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let shown = json[0]["url"].as_str().unwrap();
    assert!(
        shown.contains("lists.example/p.txt") && shown.contains("page=2"),
        "{shown}"
    );
    assert!(
        json[0]["last_error"]
            .as_str()
            .unwrap()
            .contains("lists.example")
    );
}

#[tokio::test]
async fn a_log_out_ends_the_session_on_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| {
        c.set("api", "token", &format!("\"{TOKEN}\""))
    })
    .await;
    let own = [
        ("host", "127.0.0.1:8080"),
        ("origin", "http://127.0.0.1:8080"),
    ];
    let form = |path: &str, cookie: Option<&str>, body: &str| {
        let mut headers = own.to_vec();
        headers.push(("content-type", "application/x-www-form-urlencoded"));
        if let Some(c) = cookie {
            headers.push(("cookie", c));
        }
        request("POST", path, &headers, body)
    };
    let (status, headers, _) = call(
        &s,
        form("/dashboard/login", None, &format!("token={TOKEN}")),
    )
    .await;
    assert_eq!(status, 303);
    let set = headers["set-cookie"].to_str().unwrap();
    let cookie = set.split(';').next().unwrap().to_owned();
    let stats = |cookie: &str| request("GET", "/stats", &[own[0], ("cookie", cookie)], "");
    assert_eq!(call(&s, stats(&cookie)).await.0, 200);
    let (_, _, page) = call(&s, request("GET", "/", &[own[0], ("cookie", &cookie)], "")).await;
    let at = page.find(r#"name="csrf" value=""#).expect("a CSRF token") + 19;
    let csrf = &page[at..at + page[at..].find('"').unwrap()];
    let (status, _, _) = call(
        &s,
        form("/dashboard/logout", Some(&cookie), &format!("csrf={csrf}")),
    )
    .await;
    assert_eq!(status, 303);
    // The cookie a browser (or whoever copied it) kept is no session now.
    let (status, _, body) = call(&s, stats(&cookie)).await;
    assert_eq!(status, 401, "{body}");
}

#[tokio::test]
async fn a_crawl_job_with_a_malformed_chunked_body_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let s = state(dir.path(), |c| c).await;
    let (addr, stop) = serve(s).await;
    let head = "POST /crawls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
    for body in [
        &b"zz\r\nabc\r\n0\r\n\r\n"[..],
        &b"1000000000000000000\r\nabc\r\n0\r\n\r\n"[..],
    ] {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(head.as_bytes()).await.unwrap();
        let _ = c.write_all(body).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
        let answer = String::from_utf8_lossy(&out);
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer:?}");
        let json = answer.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(code(json), "bad_request", "{answer:?}");
    }
    stop.cancel();
}

/// Sends `bytes` from the local address `from` (a 127.0.0.x) to `addr` and
/// reads the answer until the server closes the connection.
async fn raw_from(from: &str, addr: SocketAddr, bytes: &[u8]) -> String {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut c = socket.connect(addr).await.unwrap();
    let _ = c.write_all(bytes).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(answer: &str) -> u16 {
    answer.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn wrong_tokens_are_limited_per_address_for_the_api_the_login_and_the_gateway_alike() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let gw_token = "gateway-token-of-sixteen";
    let mut service = service(dir.path(), |c| {
        c.set("api", "token", &format!("\"{TOKEN}\"")).set(
            "gateway",
            "token",
            &format!("\"{gw_token}\""),
        )
    })
    .await;
    let gateway = service.gateway().unwrap();
    let s = service.api();
    let gw_listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw_addr = gw_listener.local_addr().unwrap();
    let gw_stop = CancellationToken::new();
    tokio::spawn(proxywarden::gateway::serve(
        gw_listener,
        gateway,
        gw_stop.clone(),
    ));
    let (addr, stop) = serve(s).await;
    let api = |token: &str| {
        format!(
            "GET /stats HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
        )
        .into_bytes()
    };
    let login = |token: &str| {
        let body = format!("token={token}");
        format!(
            "POST /dashboard/login HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: http://127.0.0.1\r\n\
             Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    };
    let proxied = |password: &str| {
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("user:{password}"));
        format!(
            "GET http://127.0.0.1:9/ HTTP/1.1\r\nHost: 127.0.0.1:9\r\nProxy-Authorization: Basic {auth}\r\n\
             Connection: close\r\n\r\n"
        )
        .into_bytes()
    };
    // A guesser at 127.0.0.2: wrong bearer tokens until it is refused.
    let mut refused_after = None;
    for n in 1..=20 {
        let answer = raw_from("127.0.0.2", addr, &api("guess")).await;
        match status_of(&answer) {
            401 => {}
            429 => {
                assert!(
                    answer.to_ascii_lowercase().contains("retry-after"),
                    "{answer}"
                );
                refused_after = Some(n);
                break;
            }
            s => panic!("{s}: {answer}"),
        }
    }
    assert_eq!(refused_after, Some(11), "ten wrong tokens, then refused");
    // Refused everywhere, right token or not, for the rest of its minute.
    assert_eq!(
        status_of(&raw_from("127.0.0.2", addr, &api(TOKEN)).await),
        429
    );
    assert_eq!(
        status_of(&raw_from("127.0.0.2", addr, &login(TOKEN)).await),
        429
    );
    assert_eq!(
        status_of(&raw_from("127.0.0.2", gw_addr, &proxied(gw_token)).await),
        429
    );
    // Its neighbour in the same /24 is not locked out with the right token.
    assert_eq!(
        status_of(&raw_from("127.0.0.3", addr, &api(TOKEN)).await),
        200
    );
    assert_eq!(
        status_of(&raw_from("127.0.0.3", addr, &login(TOKEN)).await),
        303
    );
    // Guessing the gateway's password counts for the API too.
    for _ in 0..10 {
        let answer = raw_from("127.0.0.4", gw_addr, &proxied("guess")).await;
        assert_eq!(status_of(&answer), 407, "{answer}");
    }
    assert_eq!(
        status_of(&raw_from("127.0.0.4", addr, &api(TOKEN)).await),
        429
    );
    // Wrong logins count the same way.
    for _ in 0..10 {
        assert_eq!(
            status_of(&raw_from("127.0.0.5", addr, &login("guess")).await),
            401
        );
    }
    assert_eq!(
        status_of(&raw_from("127.0.0.5", addr, &login(TOKEN)).await),
        429
    );
    stop.cancel();
    gw_stop.cancel();
}

#[tokio::test]
async fn every_connection_of_a_burst_past_the_cap_gets_its_503() {
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
    // Far more than the 64 answered with a linger, all sent before any
    // reads its answer.
    let mut burst = Vec::new();
    for _ in 0..150 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        burst.push(c);
    }
    let mut answers = Vec::new();
    for mut c in burst {
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out)).await;
        answers.push(String::from_utf8_lossy(&out).into_owned());
    }
    let refused = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 503") && a.contains("\"busy\""))
        .count();
    let empty = answers.iter().filter(|a| a.is_empty()).count();
    assert_eq!(refused, answers.len(), "{empty} empty replies");
    drop(slow);
    stop.cancel();
}

#[tokio::test]
async fn verify_work_is_capped_per_minute() {
    use proxywarden::check::{CheckOptions, Checker};
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let (_proxies, alive) = common::working_proxies(2).await;
    let (store, _ids) = common::store_with_alive(&dir.path().join("v.db"), &alive).await;
    let config = TestConfig::new(dir.path())
        .judges(&format!("[\"{}\"]", judge.url()))
        .set("api", "verify_per_minute", "3")
        .build();
    let checker = Checker::prepare(&config, &CheckOptions::from_config(&config.check), None)
        .await
        .unwrap();
    let service = Service::new(
        store.clone(),
        Feedback::new(load_index(&store).await.unwrap(), store),
        Arc::new(config),
    );
    service.checker.set(Arc::new(checker));
    let s = service.api();
    let before = judge.requests();
    let mut statuses = Vec::new();
    for _ in 0..10 {
        let req = request("GET", "/proxy?verify=true", &[("host", "127.0.0.1")], "");
        let (status, headers, body) = call(&s, req).await;
        if status == 429 {
            assert!(headers.contains_key("retry-after"), "{body}");
            assert_eq!(code(&body), "too_many_requests");
        }
        statuses.push(status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    assert_eq!(
        judge.requests() - before,
        3,
        "judge requests made by verify=true"
    );
}
