//! Crawl jobs in the daemon (`/crawls`): started on the live pool, listed,
//! streamed, cancelled, capped, continued after a restart, and refused with
//! a 400 naming the bad option.

use crate::common;

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use common::daemon::{Daemon, status_json};
use common::site::{Politeness, Site};
use common::{store_with_alive, working_proxies};

/// A daemon on `dir/daemon.db` with one crawl job at a time, guarded by
/// `token` when there is one.
async fn start(dir: &Path, token: Option<&str>) -> Daemon {
    Daemon::start(dir, "", |c| {
        let c = c
            .set("crawls", "max_running", "1")
            .set("crawls", "max_pages", "500");
        match token {
            Some(t) => c.set("api", "token", &format!("\"{t}\"")),
            None => c,
        }
    })
    .await
}

/// `POST /crawls` with `body`: the status and the JSON answer.
async fn post(daemon: &Daemon, body: &str) -> (u16, serde_json::Value) {
    let resp = daemon
        .req(reqwest::Method::POST, "/crawls")
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    status_json(resp).await
}

/// The job's view once `done` holds of it (30 s at most).
async fn wait_job(
    daemon: &Daemon,
    id: i64,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, job) = daemon.json(&format!("/crawls/{id}")).await;
        assert_eq!(status, 200, "{job}");
        if done(&job) {
            return job;
        }
        assert!(Instant::now() < deadline, "job {id} never {what}: {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The page lines after the first `after`, and `X-Crawl-Lines`.
async fn page_lines(daemon: &Daemon, id: i64, after: u64) -> (Vec<serde_json::Value>, u64) {
    let resp = daemon
        .get(&format!("/crawls/{id}/pages?after={after}"))
        .await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "application/x-ndjson"
    );
    let total = resp.headers()["x-crawl-lines"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    let text = resp.text().await.unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (lines, total)
}

#[tokio::test]
async fn crawl_jobs_run_stream_cancel_and_continue_after_a_restart() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(40, 3, Duration::from_millis(60)).await;
        let slow = Site::tree(400, 4, Duration::from_millis(100)).await;
        let (_farm, alive) = working_proxies(2).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);

        let daemon = start(dir.path(), None).await;
        let (status, first) = post(
            &daemon,
            &format!(
                r#"{{"seeds": ["{}"], "per_host_concurrency": 1, "select": {{"title": "title"}}}}"#,
                site.url("/")
            ),
        )
        .await;
        assert_eq!(status, 201, "{first}");
        let id = first["id"].as_i64().unwrap();
        assert_eq!(first["options"]["per_host_concurrency"], 1);
        // One job at a time: the second waits.
        let (status, second) = post(
            &daemon,
            &format!(r#"{{"seeds": ["{}"], "max_pages": 300}}"#, slow.url("/")),
        )
        .await;
        assert_eq!(status, 201, "{second}");
        let id2 = second["id"].as_i64().unwrap();
        assert_eq!(second["state"], "queued");
        let (_, list) = daemon.json("/crawls").await;
        let ids: Vec<i64> = list["crawls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_i64().unwrap())
            .collect();
        assert_eq!(ids, [id2, id], "newest first");

        // Some pages in, the daemon stops; the job is not over.
        wait_job(&daemon, id, "made progress", |j| {
            j["state"] == "running" && j["progress"]["pages"].as_u64().unwrap() >= 5
        })
        .await;
        let (before, _) = page_lines(&daemon, id, 0).await;
        assert!(!before.is_empty());
        daemon.stop().await;
        assert!(site.log().len() < 40, "stopped before the end");

        // A new daemon on the same database continues it.
        let daemon = start(dir.path(), None).await;
        let job = wait_job(&daemon, id, "finished", |j| j["state"] == "finished").await;
        assert_eq!(job["summary"]["pages_ok"], 40, "{job}");
        assert_eq!(job["progress"]["pages"], 40, "{job}");
        let (pages, total) = page_lines(&daemon, id, 0).await;
        assert_eq!(total, 40);
        let urls: HashSet<&str> = pages.iter().map(|p| p["url"].as_str().unwrap()).collect();
        assert_eq!(urls.len(), 40, "every page once");
        assert!(
            pages
                .iter()
                .all(|p| p["status"] == 200 && p["proxy"].is_string())
        );
        assert!(pages.iter().any(|p| p["fields"]["title"].is_string()));
        // Pages written before the stop are not fetched again; only the
        // one in flight (per-host concurrency 1) may be.
        let twice: Vec<(String, usize)> = site
            .per_path()
            .into_iter()
            .filter(|(p, n)| p != "/robots.txt" && *n > 1)
            .collect();
        assert!(twice.len() <= 1, "{twice:?}");
        // Resumable: after N gives the rest.
        let (rest, total) = page_lines(&daemon, id, 30).await;
        assert_eq!((rest.len(), total), (10, 40));
        assert_eq!(rest, pages[30..]);

        // The second job runs now; cancelling it ends it for good.
        wait_job(&daemon, id2, "started", |j| {
            j["progress"]["pages"].as_u64().unwrap() >= 2
        })
        .await;
        let (status, cancelled) = status_json(
            daemon
                .req(reqwest::Method::DELETE, &format!("/crawls/{id2}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 200, "{cancelled}");
        assert_eq!(cancelled["state"], "cancelled", "{cancelled}");
        let fetched = slow.log().len();
        assert!(fetched < 300, "{fetched}");
        let (written, _) = page_lines(&daemon, id2, 0).await;
        assert!(!written.is_empty());
        daemon.stop().await;
        let daemon = start(dir.path(), None).await;
        // Jobs run one at a time, in turn: one posted after the restart
        // has run to its end once any job the daemon took up again has.
        let (status, witness) = post(
            &daemon,
            &format!(r#"{{"seeds": ["{}"], "max_pages": 1}}"#, site.url("/")),
        )
        .await;
        assert_eq!(status, 201, "{witness}");
        let witness = witness["id"].as_i64().unwrap();
        wait_job(&daemon, witness, "finished", |j| j["state"] == "finished").await;
        let (_, job) = daemon.json(&format!("/crawls/{id2}")).await;
        assert_eq!(job["state"], "cancelled");
        assert_eq!(slow.log().len(), fetched, "a cancelled job stays stopped");
        // Cancelling a job that has ended is a conflict that says so.
        let (status, err) = status_json(
            daemon
                .req(reqwest::Method::DELETE, &format!("/crawls/{witness}"))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (409, Some("conflict"))
        );
        let message = err["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("had already ended (finished)"),
            "{message}"
        );

        let (status, err) = daemon.json("/crawls/99").await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (404, Some("not_found"))
        );
        let (status, err) = daemon.json("/crawls/x/pages").await;
        assert_eq!(
            (status, err["error"]["code"].as_str()),
            (400, Some("bad_request"))
        );
        daemon.stop().await;
    })
    .await;
}

#[tokio::test]
async fn bad_crawl_options_get_a_400_naming_the_field_and_the_token_guards_crawls() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let token = "a-long-enough-test-token";
        let daemon = start(dir.path(), Some(token)).await;
        for (body, field) in [
            (r#"{"seeds": []}"#, "seeds"),
            (
                r#"{"seeds": ["http://127.0.0.1:9/", "mailto:x@y"]}"#,
                "seeds[1]",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "max_pages": 501}"#,
                "max_pages",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "max_depth": -1}"#,
                "max_depth",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "scope": "planet"}"#,
                "scope",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "exclude": ["[a"]}"#,
                "exclude[0]",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "delay": "fast"}"#,
                "delay",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "anonymity": "ghost"}"#,
                "anonymity",
            ),
            (
                r#"{"seeds": ["http://127.0.0.1:9/"], "colour": "red"}"#,
                "colour",
            ),
            ("not json", "body"),
        ] {
            let (status, err) = post(&daemon, body).await;
            assert_eq!(status, 400, "{body}: {err}");
            assert_eq!(err["error"]["code"], "bad_request", "{body}");
            let message = err["error"]["message"].as_str().unwrap();
            assert!(message.contains(field), "{body}: {message}");
        }
        let (_, list) = daemon.json("/crawls").await;
        assert_eq!(list["crawls"], serde_json::json!([]), "nothing was started");

        let anonymous = daemon
            .http
            .post(daemon.url("/crawls"))
            .body(r#"{"seeds": ["http://127.0.0.1:9/"]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(anonymous.status(), 401);
        let anonymous = daemon.http.get(daemon.url("/crawls")).send().await.unwrap();
        assert_eq!(anonymous.status(), 401);
        daemon.stop().await;
    })
    .await;
}

/// `proxywarden args…` in `dir`: its exit status and its stderr.
async fn run_crawl(dir: &Path, args: &[&str]) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim_end().to_owned();
    (out.status.code(), stderr)
}

/// The crawl command's flags and a job's JSON are read by one validator: a
/// bad value gets the same words from both, naming the flag or the field.
#[tokio::test]
async fn the_crawl_command_and_a_job_refuse_a_bad_option_in_the_same_words() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let daemon = start(dir.path(), None).await;
        let seed = "http://127.0.0.1:9/";
        for (json, field, flags) in [
            (
                r#""concurrency": 5000"#,
                "concurrency",
                vec!["--concurrency", "5000"],
            ),
            (
                r#""per_host_concurrency": 0"#,
                "per_host_concurrency",
                vec!["--per-host-concurrency", "0"],
            ),
            (r#""delay": "2h""#, "delay", vec!["--delay", "2h"]),
            (r#""delay": "soon""#, "delay", vec!["--delay", "soon"]),
            (
                r#""no_proxy_wait": "2h""#,
                "no_proxy_wait",
                vec!["--no-proxy-wait", "2h"],
            ),
            (r#""scope": "planet""#, "scope", vec!["--scope", "planet"]),
            (r#""include": ["("]"#, "include[0]", vec!["--include", "("]),
            (
                r#""select": {"t": "p["}"#,
                "select.t",
                vec!["--select", "t=p["],
            ),
            (r#""max_pages": 0"#, "max_pages", vec!["--max-pages", "0"]),
            (
                r#""user_agent": " ""#,
                "user_agent",
                vec!["--user-agent", " "],
            ),
        ] {
            let body = format!(r#"{{"seeds": ["{seed}"], {json}}}"#);
            let (status, err) = post(&daemon, &body).await;
            assert_eq!(status, 400, "{body}: {err}");
            let message = err["error"]["message"].as_str().unwrap();
            let words = message
                .strip_prefix(&format!("{field}: "))
                .unwrap_or_else(|| panic!("{body}: {message}"));

            let flag = if field.starts_with("select.") {
                "--select t"
            } else {
                flags[0]
            };
            let mut args = vec!["crawl", seed];
            args.extend(&flags);
            let (code, stderr) = run_crawl(dir.path(), &args).await;
            assert_eq!(code, Some(2), "{args:?}: {stderr}");
            assert_eq!(stderr, format!("error: {flag}: {words}"), "{args:?}");
        }
        // A bad seed: the field is the URL on the command line.
        let (_, err) = post(&daemon, r#"{"seeds": ["mailto:x@y"]}"#).await;
        let message = err["error"]["message"].as_str().unwrap();
        let words = message.strip_prefix("seeds[0]: ").unwrap();
        let (_, stderr) = run_crawl(dir.path(), &["crawl", "mailto:x@y"]).await;
        assert_eq!(stderr, format!("error: URL: {words}"));
        daemon.stop().await;
    })
    .await;
}

/// How long a finished job may take to say so after its last request:
/// well inside the daemon's request timeout, with room for a loaded
/// machine.
const END_SLACK: Duration = Duration::from_secs(5);

// Two workers: sixteen jobs starting at once on one thread would delay
// their first requests by more than the spacing under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_politeness_combination_of_a_job_fetches_its_pages_and_ends_promptly() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_farm, alive) = working_proxies(3).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let rows = Politeness::table();
        let daemon = Daemon::start(dir.path(), "", |c| {
            c.set("crawls", "max_running", &rows.len().to_string())
        })
        .await;
        let mut jobs = Vec::new();
        for row in &rows {
            let site = row.site().await;
            let spec = serde_json::json!({
                "seeds": [site.url("/")],
                "ignore_robots": row.ignore_robots,
                "delay": format!("{}ms", row.delay.as_millis()),
                "per_host_concurrency": row.per_host,
            });
            let (status, job) = post(&daemon, &spec.to_string()).await;
            assert_eq!(status, 201, "{job}");
            jobs.push((row, site, job["id"].as_i64().unwrap(), None));
        }
        // When each job was first seen finished, polling every 50 ms.
        let deadline = Instant::now() + Politeness::HUNG;
        while jobs.iter().any(|j| j.3.is_none()) && Instant::now() < deadline {
            let (_, list) = daemon.json("/crawls").await;
            let now = Instant::now();
            for job in &mut jobs {
                let seen = list["crawls"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|j| j["id"] == job.2)
                    .cloned()
                    .unwrap();
                if job.3.is_none() && seen["state"] != "running" && seen["state"] != "queued" {
                    job.3 = Some((now, seen));
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut failed = Vec::new();
        for (row, site, id, end) in &jobs {
            let Some((ended, job)) = end else {
                failed.push(format!(
                    "{row:?}: job {id} still running with {} requests made",
                    site.log().len()
                ));
                continue;
            };
            let checked = row.check(site, *ended, END_SLACK).and_then(|pages| {
                let ok = job["state"] == "finished"
                    && job["summary"]["pages_ok"] == pages
                    && job["summary"]["pages_failed"] == 0;
                if ok {
                    Ok(())
                } else {
                    Err(format!("job {job}"))
                }
            });
            if let Err(e) = checked {
                failed.push(format!("{row:?}: {e}"));
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {} combinations failed:\n{}",
            failed.len(),
            rows.len(),
            failed.join("\n")
        );
        daemon.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_job_whose_filters_match_no_proxy_fails_saying_so() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(10, 3, Duration::ZERO).await;
        let (_farm, alive) = working_proxies(1).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let daemon = Daemon::start(dir.path(), "", |c| c.set("crawls", "max_running", "2")).await;
        let wait = Duration::from_secs(1);
        // Its first request is robots.txt, or a page when robots.txt is
        // ignored.
        let started = Instant::now();
        let mut ids = Vec::new();
        for ignore_robots in [false, true] {
            let spec = serde_json::json!({
                "seeds": [site.url("/")],
                "country": ["XX"],
                "no_proxy_wait": "1s",
                "ignore_robots": ignore_robots,
            });
            let (status, job) = post(&daemon, &spec.to_string()).await;
            assert_eq!(status, 201, "{job}");
            ids.push(job["id"].as_i64().unwrap());
        }
        // Each ends after its own second's wait: not at once, and not at
        // the pool's default minute, which `wait_job`'s 30 s would not see.
        for id in ids {
            let job = wait_job(&daemon, id, "ended", |j| {
                j["state"] != "running" && j["state"] != "queued"
            })
            .await;
            let took = started.elapsed();
            assert!(took >= wait, "ended after {took:?}: {job}");
            assert_eq!(job["state"], "failed", "{job}");
            let error = job["error"].as_str().unwrap_or_default();
            assert!(error.contains("no proxy matches"), "{job}");
        }
        assert!(site.log().is_empty(), "nothing fetched directly");
        daemon.stop().await;
    })
    .await;
}

/// A page of `n` new same-host links (`/farm/{path}/{i}`): every page of
/// the site is one, as in a calendar or a faceted search.
fn link_farm(n: usize) -> common::site::SiteOpts {
    common::site::SiteOpts::new(move |path, _| {
        let base = path.trim_end_matches('/');
        let links: String = (0..n)
            .map(|i| format!("<a href=\"{base}/{i}\">{i}</a>"))
            .collect();
        common::site::Reply::html(format!("<title>farm</title>{links}"))
    })
}

/// URLs of job `job` in the daemon's database.
fn frontier_rows(db: &Path, job: i64) -> i64 {
    let c = rusqlite::Connection::open(db).unwrap();
    c.query_row(
        "SELECT count(*) FROM crawl_urls WHERE job = ?1",
        [job],
        |r| r.get(0),
    )
    .unwrap()
}

/// A job on a link farm keeps 1,000 new links a page and at most 10 URLs
/// per page it may fetch, counting the rest; its frontier is deleted when
/// it ends, and when it is cancelled while it runs.
#[tokio::test]
async fn a_jobs_frontier_is_bounded_counted_and_deleted_when_it_ends() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(link_farm(3_000)).await;
        let mut slow_opts = link_farm(3_000);
        slow_opts.latency = Duration::from_millis(300);
        let slow = Site::start(slow_opts).await;
        let (_farm, alive) = working_proxies(2).await;
        let db = dir.path().join("daemon.db");
        let (store, _) = store_with_alive(&db, &alive).await;
        drop(store);
        let daemon = start(dir.path(), None).await;
        let (status, job) = post(
            &daemon,
            &format!(r#"{{"seeds": ["{}"], "max_pages": 5}}"#, site.url("/")),
        )
        .await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_i64().unwrap();
        let job = wait_job(&daemon, id, "finished", |j| j["state"] == "finished").await;
        let summary = &job["summary"];
        assert_eq!(summary["pages_ok"], 5, "{job}");
        // The seed and 49 links: 10 per page it may fetch.
        assert_eq!(summary["discovered"], 50, "{job}");
        assert_eq!(summary["links_cut"], 5 * 2_000, "{job}");
        assert_eq!(summary["frontier_full"], 951 + 4 * 1_000, "{job}");
        assert_eq!(frontier_rows(&db, id), 0, "an ended job keeps no frontier");

        let (status, job) = post(
            &daemon,
            &format!(r#"{{"seeds": ["{}"], "max_pages": 100}}"#, slow.url("/")),
        )
        .await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_i64().unwrap();
        wait_job(&daemon, id, "made progress", |j| {
            j["progress"]["pages"].as_u64().unwrap_or(0) >= 2
        })
        .await;
        assert!(frontier_rows(&db, id) > 0);
        let resp = daemon
            .req(reqwest::Method::DELETE, &format!("/crawls/{id}"))
            .send()
            .await
            .unwrap();
        let (status, job) = status_json(resp).await;
        assert_eq!(
            (status, job["state"].as_str()),
            (200, Some("cancelled")),
            "{job}"
        );
        assert_eq!(
            frontier_rows(&db, id),
            0,
            "a cancelled job keeps no frontier"
        );
        daemon.stop().await;
    })
    .await;
}

/// Ended jobs past `crawls.keep_ended` are deleted with their pages.
#[tokio::test]
async fn ended_jobs_past_their_keeping_are_deleted_with_their_pages() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let site = Site::tree(3, 2, Duration::ZERO).await;
        let (_farm, alive) = working_proxies(1).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let daemon = Daemon::start(dir.path(), "", |c| {
            c.set("crawls", "max_running", "1")
                .set("crawls", "keep_ended", "1")
        })
        .await;
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (status, job) =
                post(&daemon, &format!(r#"{{"seeds": ["{}"]}}"#, site.url("/"))).await;
            assert_eq!(status, 201, "{job}");
            let id = job["id"].as_i64().unwrap();
            wait_job(&daemon, id, "finished", |j| j["state"] == "finished").await;
            ids.push(id);
        }
        let pages = dir.path().join("daemon.db.crawls").join(ids[0].to_string());
        // Purged at start and once a minute: the daemon restarts to purge now.
        daemon.stop().await;
        let daemon = Daemon::start(dir.path(), "", |c| c.set("crawls", "keep_ended", "1")).await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while daemon.json(&format!("/crawls/{}", ids[0])).await.0 != 404 {
            assert!(Instant::now() < deadline, "the older job is kept");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Its row goes first, then its pages' folder.
        while pages.exists() {
            assert!(Instant::now() < deadline, "{} is kept", pages.display());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(daemon.json(&format!("/crawls/{}", ids[1])).await.0, 200);
        daemon.stop().await;
    })
    .await;
}

/// A page with a 2 MiB title and a 2 MiB field writes a line of a few KiB:
/// titles and fields keep 4 KiB, so `/crawls/{id}/pages` never serves (or
/// a reader holds) a line the size of a page.
#[tokio::test]
async fn a_page_of_a_huge_title_writes_a_small_line() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let big = "word ".repeat(400_000);
        let page = format!("<title>{big}</title><h1>{big}</h1>");
        let site = Site::routes(vec![("/", common::site::Reply::html(page))]).await;
        let (_farm, alive) = working_proxies(1).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let daemon = start(dir.path(), None).await;
        let (status, job) = post(
            &daemon,
            &format!(
                r#"{{"seeds": ["{}"], "select": {{"h": "h1"}}}}"#,
                site.url("/")
            ),
        )
        .await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_i64().unwrap();
        wait_job(&daemon, id, "finished", |j| j["state"] == "finished").await;
        let text = daemon
            .get(&format!("/crawls/{id}/pages"))
            .await
            .text()
            .await
            .unwrap();
        assert_eq!(text.lines().count(), 1);
        assert!(text.len() < 12 * 1024, "a line of {} bytes", text.len());
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        let title = line["title"].as_str().unwrap();
        assert!(
            title.starts_with("word word") && title.len() <= 4096,
            "{}",
            title.len()
        );
        assert!(line["fields"]["h"].as_str().unwrap().len() <= 4096);
        daemon.stop().await;
    })
    .await;
}

/// A flat page over the node cap and a page with a tag of 400,000
/// attributes are read up to there, and their lines say why.
#[tokio::test]
async fn a_page_over_a_parse_cap_says_so_in_its_line() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let flat = format!(
            "<title>flat</title><a href=\"/crowded\">c</a>{}",
            "<br>".repeat(300_000)
        );
        let attrs: String = (0..400_000).map(|i| format!(" a{i}")).collect();
        let crowded = format!("<title>crowded</title><div{attrs}>x</div>");
        let site = Site::routes(vec![
            ("/", common::site::Reply::html(flat)),
            ("/crowded", common::site::Reply::html(crowded)),
        ])
        .await;
        let (_farm, alive) = working_proxies(1).await;
        let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &alive).await;
        drop(store);
        let daemon = start(dir.path(), None).await;
        let (status, job) = post(&daemon, &format!(r#"{{"seeds": ["{}"]}}"#, site.url("/"))).await;
        assert_eq!(status, 201, "{job}");
        let id = job["id"].as_i64().unwrap();
        wait_job(&daemon, id, "finished", |j| j["state"] == "finished").await;
        let (lines, _) = page_lines(&daemon, id, 0).await;
        let stopped = |title: &str| {
            lines
                .iter()
                .find(|l| l["title"] == title)
                .map(|l| l["parse_stopped"].clone())
                .unwrap_or_else(|| panic!("no page titled {title}: {lines:?}"))
        };
        assert_eq!(
            stopped("flat"),
            "more than 200000 nodes: links and fields read up to there"
        );
        assert_eq!(
            stopped("crowded"),
            "more than 200000 attributes, or a tag with more than 1000: links and fields read up to there"
        );
        daemon.stop().await;
    })
    .await;
}
