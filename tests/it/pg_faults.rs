//! `serve` on a PostgreSQL server that fails under it, on a real server
//! the test starts and stops: restarted (`pg_ctl restart`), gone for a
//! while, refusing new connections. The daemon keeps serving from memory,
//! says `degraded` (component `store`, with the cause) while the server
//! cannot be reached, backs its writes off as on a full disk, reconnects
//! by itself and loses nothing committed before the fault. Outages are
//! seconds long: the test polls for each state.

use crate::common;

use std::time::Duration;

use common::daemon::Daemon;
use common::fakes::FakeHttpProxy;
use common::postgres::PgServer;

async fn pg() -> PgServer {
    tokio::task::spawn_blocking(PgServer::start).await.unwrap()
}

/// Runs a blocking `pg_ctl` action off the runtime, so the daemon in this
/// process goes on meanwhile.
async fn on_server(server: &std::sync::Arc<PgServer>, action: fn(&PgServer)) {
    let server = server.clone();
    tokio::task::spawn_blocking(move || action(&server))
        .await
        .unwrap();
}

/// One number `sql` reads from the database at `url`, on a connection of
/// its own (an earlier one may have died with the server).
async fn number(url: &str, sql: &str) -> i64 {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.query_one(sql, &[]).await.unwrap().get(0)
}

/// A daemon on the database at `url` harvesting three working proxies,
/// once it serves all three (each checked and its verdict committed).
async fn serving(dir: &std::path::Path, url: &str) -> (Daemon, Vec<FakeHttpProxy>, Vec<String>) {
    let (farm, alive) = common::working_proxies(3).await;
    let urls: Vec<String> = alive.iter().map(|a| a.url.clone()).collect();
    let list = dir.join("list.txt");
    std::fs::write(&list, urls.join("\n")).unwrap();
    let sources = format!(
        "[[sources]]\nname = \"list\"\nurl = \"{}\"\n",
        list.display()
    );
    let url = url.to_owned();
    let d = Daemon::start(dir, &sources, move |c| {
        c.set("database", "url", &format!("\"{url}\""))
            .set("gateway", "enabled", "false")
    })
    .await;
    d.until_servable(3).await;
    (d, farm, urls)
}

/// `/healthz`'s status and its first reason's component and message.
async fn health(d: &Daemon) -> (String, String, String) {
    let (_, h) = d.json("/healthz").await;
    let reason = &h["reasons"][0];
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    (
        text(&h["status"]),
        text(&reason["component"]),
        text(&reason["message"]),
    )
}

/// Waits until `/healthz` is degraded by the store with a message holding
/// every one of `words`; that message.
async fn until_degraded(d: &Daemon, words: &[&str], within: Duration) -> String {
    let deadline = std::time::Instant::now() + within;
    loop {
        let (status, component, message) = health(d).await;
        if status == "degraded" && component == "store" && words.iter().all(|w| message.contains(w))
        {
            return message;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "/healthz never degraded by the store with {words:?}; last: {status} {component} {message}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /proxy` hands out one of `urls`.
async fn serves_one_of(d: &Daemon, urls: &[String]) {
    let (status, one) = d.json("/proxy").await;
    assert_eq!(status, 200, "{one}");
    assert!(
        urls.contains(&one["url"].as_str().unwrap_or_default().to_owned()),
        "{one}"
    );
}

/// A client's report that the `nth` proxy failed reaches the database:
/// the daemon writes there again.
async fn writes_again(d: &Daemon, url: &str, nth: i64) {
    let id = number(
        url,
        &format!("SELECT id FROM proxies ORDER BY id OFFSET {nth} LIMIT 1"),
    )
    .await;
    common::until(
        "a report after the fault is written to the database",
        Duration::from_secs(30),
        || async {
            let _ = d
                .http
                .post(d.url(&format!("/proxies/{id}/report")))
                .header("content-type", "application/json")
                .body(r#"{"ok": false}"#)
                .send()
                .await;
            number(
                url,
                &format!(
                    "SELECT count(*) FROM proxies WHERE id = {id} AND failed_in_use_at IS NOT NULL"
                ),
            )
            .await
                == 1
        },
    )
    .await;
}

const ALIVE: &str = "SELECT count(*) FROM proxies WHERE status = 'alive'";

/// `pg_ctl restart`, then the server stopped for seconds: the daemon
/// serves from memory throughout, says the store is unreachable and why,
/// tries less and less often while it is (1 s, 2 s, 4 s…), is healthy
/// again on its own once the server is back, writes there again, and the
/// verdicts committed before are all still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rides_out_a_postgres_restart_and_an_outage() {
    let dir = tempfile::tempdir().unwrap();
    let server = std::sync::Arc::new(pg().await);
    let url = server.url();
    let (d, _farm, urls) = serving(dir.path(), &url).await;
    assert_eq!(number(&url, ALIVE).await, 3);
    assert_eq!(health(&d).await.0, "ok");

    // A restart ends every session the daemon's pool holds.
    on_server(&server, PgServer::restart).await;
    serves_one_of(&d, &urls).await;
    writes_again(&d, &url, 0).await;
    common::until(
        "healthy after the restart",
        Duration::from_secs(30),
        || async { health(&d).await.0 == "ok" },
    )
    .await;
    assert_eq!(number(&url, ALIVE).await, 3);

    // Gone for a while.
    on_server(&server, PgServer::stop).await;
    let message = until_degraded(
        &d,
        &[
            "cannot write the database (server unreachable)",
            "Connection refused",
        ],
        Duration::from_secs(30),
    )
    .await;
    eprintln!("while the server is away: {message}");
    serves_one_of(&d, &urls).await;
    // The pause between tries doubles as on a full disk.
    until_degraded(&d, &["tried again every 4s"], Duration::from_secs(30)).await;
    serves_one_of(&d, &urls).await;

    on_server(&server, PgServer::start_again).await;
    common::until(
        "healthy once the server is back",
        Duration::from_secs(30),
        || async { health(&d).await.0 == "ok" },
    )
    .await;
    // Nothing committed before the fault is lost, and writes land again.
    assert_eq!(number(&url, ALIVE).await, 3);
    writes_again(&d, &url, 1).await;
    let metrics = d.get("/metrics").await.text().await.unwrap();
    assert!(
        metrics.contains("proxywarden_store_write_failures_total{kind=\"unreachable\"}"),
        "{metrics}"
    );
    d.stop().await;
}

/// A server at its connection limit (here: the daemon's role may open
/// none, its sessions ended): the daemon serves from memory and says why
/// it is degraded; once connections are taken again it is healthy and
/// writes again, with every verdict of before still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_rides_out_a_postgres_that_refuses_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let admin_url = server.url();
    let (admin, conn) = tokio_postgres::connect(&admin_url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // A role that is no superuser, whom connection limits bind, owning its
    // database.
    for sql in ["CREATE ROLE pw LOGIN", "CREATE DATABASE pw OWNER pw"] {
        admin.batch_execute(sql).await.unwrap();
    }
    let url = server.url_as("pw", "pw");
    let as_admin = server.url_as("postgres", "pw");
    let (d, _farm, urls) = serving(dir.path(), &url).await;
    assert_eq!(number(&as_admin, ALIVE).await, 3);

    admin
        .batch_execute(
            "ALTER ROLE pw CONNECTION LIMIT 0;
             SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'pw'",
        )
        .await
        .unwrap();
    let message = until_degraded(
        &d,
        &[
            "cannot write the database (server unreachable)",
            "too many connections",
        ],
        Duration::from_secs(30),
    )
    .await;
    eprintln!("while the server refuses connections: {message}");
    serves_one_of(&d, &urls).await;

    admin
        .batch_execute("ALTER ROLE pw CONNECTION LIMIT -1")
        .await
        .unwrap();
    common::until(
        "healthy once the server takes connections",
        Duration::from_secs(30),
        || async { health(&d).await.0 == "ok" },
    )
    .await;
    assert_eq!(number(&as_admin, ALIVE).await, 3);
    writes_again(&d, &as_admin, 0).await;
    d.stop().await;
}

/// Pages of the crawl tests' site.
const SITE_PAGES: usize = 40;

/// Posts a crawl job of the `site` (one request at a time) to `d`; its id.
async fn crawl_job(d: &Daemon, site: &common::site::Site) -> i64 {
    let resp = d
        .http
        .post(d.url("/crawls"))
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"seeds": ["{}"], "per_host_concurrency": 1}}"#,
            site.url("/")
        ))
        .send()
        .await
        .unwrap();
    let (status, job) = common::daemon::status_json(resp).await;
    assert_eq!(status, 201, "{job}");
    let id = job["id"].as_i64().unwrap();
    common::until("the job crawls", Duration::from_secs(30), || async {
        let (_, j) = d.json(&format!("/crawls/{id}")).await;
        j["progress"]["pages"].as_u64().unwrap_or(0) >= 5
    })
    .await;
    id
}

/// The URLs of job `id`'s output, a line each.
async fn output(d: &Daemon, id: i64) -> Vec<String> {
    let resp = d.get(&format!("/crawls/{id}/pages")).await;
    assert_eq!(resp.status(), 200);
    resp.text()
        .await
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["url"].as_str().unwrap_or_default().to_owned()
        })
        .collect()
}

/// Waits for job `id` to end (an API answer of 503 meanwhile is the
/// store's outage), then checks what its user sees: finished, every page
/// of the site fetched, counted and in the output once, the pages of
/// `before` among them.
async fn ends_whole(d: &Daemon, site: &common::site::Site, id: i64, before: &[String]) {
    let view = format!("/crawls/{id}");
    let job = {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let (status, j) = d.json(&view).await;
            assert!(status == 200 || status == 503, "{status} {j}");
            if status == 200 && j["state"] != "running" && j["state"] != "queued" {
                break j;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the job never ended: {j}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    assert_eq!(job["state"], "finished", "{job}");
    assert_eq!(job["summary"]["pages_ok"], SITE_PAGES, "{job}");
    assert_eq!(job["progress"]["pages"], SITE_PAGES, "{job}");
    let pages = output(d, id).await;
    let distinct: std::collections::HashSet<&String> = pages.iter().collect();
    assert_eq!(
        (pages.len(), distinct.len()),
        (SITE_PAGES, SITE_PAGES),
        "every page once: {pages:?}"
    );
    let lost: Vec<&String> = before.iter().filter(|p| !distinct.contains(p)).collect();
    assert!(
        lost.is_empty(),
        "pages written before the fault lost: {lost:?}"
    );
    let fetched = site
        .per_path()
        .into_keys()
        .filter(|p| p != "/robots.txt")
        .count();
    assert_eq!(fetched, SITE_PAGES, "{:?}", site.per_path());
}

/// A crawl job runs against a loopback site when the server stops for
/// seconds: the daemon says the store is degraded meanwhile, the job is
/// not lost and goes on once the server is back, no page written before
/// the fault is lost, and at the end its summary and its output hold every
/// page of the site once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_job_rides_out_a_postgres_outage() {
    let dir = tempfile::tempdir().unwrap();
    let server = std::sync::Arc::new(pg().await);
    let url = server.url();
    let (d, _farm, _urls) = serving(dir.path(), &url).await;
    let site = common::site::Site::tree(SITE_PAGES, 3, Duration::from_millis(100)).await;
    let id = crawl_job(&d, &site).await;
    let before = output(&d, id).await;

    on_server(&server, PgServer::stop).await;
    assert!(
        before.len() < SITE_PAGES,
        "the crawl ended before the fault"
    );
    until_degraded(
        &d,
        &["cannot write the database (server unreachable)"],
        Duration::from_secs(30),
    )
    .await;
    // Seconds away: the daemon tries again after 1 s, then 2 s.
    until_degraded(&d, &["tried again every 2s"], Duration::from_secs(30)).await;
    on_server(&server, PgServer::start_again).await;

    ends_whole(&d, &site, id, &before).await;
    assert_eq!(health(&d).await.0, "ok");
    d.stop().await;
}

/// The server ends the session a crawl job's frontier runs on (as a
/// restart, a cut network or an operator's `pg_terminate_backend` does)
/// while the rest of the store works on: the job is not failed, it goes
/// on from its last commit on a new session and ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crawl_job_goes_on_when_the_server_ends_its_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = pg().await;
    let url = server.url();
    let (d, _farm, _urls) = serving(dir.path(), &url).await;
    let site = common::site::Site::tree(SITE_PAGES, 3, Duration::from_millis(100)).await;
    let id = crawl_job(&d, &site).await;
    let before = output(&d, id).await;
    assert!(
        before.len() < SITE_PAGES,
        "the crawl ended before the fault"
    );

    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let ended: i64 = admin
        .query_one(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                                   WHERE application_name = $1) t",
            &[&format!("proxywarden crawl {id}")],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(ended, 1, "the crawl's session");

    ends_whole(&d, &site, id, &before).await;
    d.stop().await;
}
