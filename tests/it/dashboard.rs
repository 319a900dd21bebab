//! The dashboard at `/` in a real headless Chromium (Debian's `chromium`
//! and `chromium-driver`, driven over WebDriver) with JavaScript switched
//! off: it renders, its figures equal `/stats`, its cancel button cancels a
//! crawl job, the login form lets the right token in and refuses a wrong
//! one. A screenshot goes to `target/dashboard/` for people to look at.
//! The cross-site guards of its forms are tested with a plain client.

use crate::common;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::daemon::{Daemon, status_json};
use common::fakes::closed_port;
use common::site::Site;
use common::{AliveProxy, ThreeCountries, store_with_alive};
use fantoccini::{Client, ClientBuilder, Locator};

const TOKEN: &str = "dashboard-test-token-0123456789";

/// A chromedriver process and a Chromium session on it, its profile in a
/// folder of its own; when dropped the driver is killed, Chromium follows
/// it out, and the profile folder is removed.
struct Browser {
    client: Client,
    driver: Child,
    profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
        // Chromium quits once its driver is gone; its folder is removed
        // after it has (the folder is removed when `profile` drops).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let left = processes_using(self.profile.path());
            if left.is_empty() {
                break;
            }
            if Instant::now() > deadline {
                for pid in left {
                    let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The processes whose command line names `dir` (the Chromium processes of
/// one profile).
fn processes_using(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(needle.as_str())
                .then_some(pid)
        })
        .collect()
}

fn which(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

impl Browser {
    /// Starts chromedriver on a free loopback port, waits for it to say it
    /// listens, and opens a headless Chromium with JavaScript off.
    async fn start() -> Browser {
        Browser::start_with(1280, false).await
    }

    /// A Chromium `width` px wide, its page script on when `script` (the
    /// page has none; WebDriver's own scripts need it to measure).
    async fn start_with(width: u32, script: bool) -> Browser {
        let driver_bin = which(&["chromedriver"]).expect(
            "chromedriver is not installed: apt-get install chromium chromium-driver (.ci/run does)",
        );
        let chromium = which(&["chromium", "chromium-browser"])
            .expect("chromium is not installed: apt-get install chromium (.ci/run does)");
        // Chromium's profile, cache and temporary files in a folder this
        // browser owns: left to chromedriver, each run would leave new
        // folders in /tmp, never removed since the driver is killed.
        let profile = tempfile::Builder::new()
            .prefix("proxywarden-chromium-")
            .tempdir()
            .unwrap();
        let port = common::free_port();
        let mut driver = Command::new(driver_bin)
            .arg(format!("--port={port}"))
            // Chromium's own temporary folders (its singleton socket and
            // scoped folders) go there too.
            .env("TMPDIR", profile.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = driver.stdout.take().unwrap();
        // Ready once it says so; its later lines are drained so it never
        // blocks on a full pipe.
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            let mut ready = Some(ready_tx);
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.contains("started successfully")
                    && let Some(tx) = ready.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(20), ready_rx)
            .await
            .expect("chromedriver did not start within 20 s")
            .expect("chromedriver exited before it started");
        let caps = serde_json::json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-background-networking", format!("--window-size={width},2400"),
                    format!("--user-data-dir={}", profile.path().display()),
                    format!("--disk-cache-dir={}", profile.path().join("cache").display()),
                ],
                // The page must work without script.
                "prefs": { "profile.managed_default_content_settings.javascript": if script { 1 } else { 2 } },
            },
        });
        let mut caps = caps;
        if script {
            // A window is never narrower than about 500 px: a phone's
            // width needs the device emulation.
            caps["goog:chromeOptions"]["mobileEmulation"] = serde_json::json!(
                { "deviceMetrics": { "width": width, "height": 2400, "pixelRatio": 1 } });
        }
        let serde_json::Value::Object(caps) = caps else {
            unreachable!()
        };
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .expect("cannot open a Chromium session");
        Browser {
            client,
            driver,
            profile,
        }
    }

    /// The visible text of the first element matching `css`.
    async fn text(&self, css: &str) -> String {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
            .text()
            .await
            .unwrap()
    }

    /// Clicks the first element matching `css` (a submit button) and waits
    /// until the browser has left the page for the answer: until the old
    /// page's root is gone from the DOM (WebDriver's click returns as the
    /// post starts, not when the answer has loaded).
    async fn submit(&self, css: &str) {
        let old = self.client.find(Locator::Css("html")).await.unwrap();
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css} on the page: {e}"))
            .click()
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while old.attr("lang").await.is_ok() {
            assert!(Instant::now() < deadline, "clicking {css} led nowhere");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// How many elements match `css`.
    async fn count(&self, css: &str) -> usize {
        self.client.find_all(Locator::Css(css)).await.unwrap().len()
    }

    /// Every `data-stat` figure on the page: its key and the number shown.
    async fn figures(&self) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        for e in self
            .client
            .find_all(Locator::Css("[data-stat]"))
            .await
            .unwrap()
        {
            let key = e.attr("data-stat").await.unwrap().unwrap();
            let text = e.text().await.unwrap();
            let n = text
                .trim()
                .replace(',', "")
                .parse()
                .unwrap_or_else(|_| panic!("figure {key} is not a number: {text:?}"));
            out.push((key, n));
        }
        out
    }

    /// Saves a screenshot as `target/dashboard/{name}.png`.
    async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.unwrap();
        assert!(png.starts_with(b"\x89PNG"), "not a PNG");
        let dir = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
            .join("dashboard");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        path
    }
}

/// The value at a `data-stat` key (`by_status.alive`) in `/stats`.
fn stat(stats: &serde_json::Value, key: &str) -> Option<i64> {
    key.split('.').fold(stats, |v, k| &v[k]).as_i64()
}

/// The stable part of `/stats`: what the page must show the same. The last
/// check round is part of it: the page shows its counts, and a round that
/// ends between two reads must make them read again.
fn stable(stats: &serde_json::Value) -> serde_json::Value {
    let mut s = stats.clone();
    for k in [
        "last_harvest",
        "degraded",
        "store",
        "gateway",
        "rotation",
        "counted_at",
        "counted_age_ms",
    ] {
        s.as_object_mut().unwrap().remove(k);
    }
    s
}

/// Three alive proxies in two countries and one dead one, in a store at
/// `dir/daemon.db`; the proxies must outlive the daemon.
async fn pool(dir: &Path) -> (ThreeCountries, i64) {
    let three = ThreeCountries::start().await;
    let closed = closed_port();
    let mut proxies: Vec<AliveProxy> = three.alive().into_iter().collect();
    proxies.push(AliveProxy::new(format!("http://{}", closed.addr())));
    let (store, ids) = store_with_alive(&dir.join("daemon.db"), &proxies).await;
    let dead = ids[3];
    // What sites taught about the first: the proxy table shows it.
    let now = proxywarden::store::now_ms();
    let taught = |site: &str, worked, blocked, banned_until| proxywarden::store::SiteRecord {
        site: site.into(),
        proxy_id: ids[0],
        worked,
        blocked,
        latency_ms: Some(120),
        last_worked_at: Some(now - 60_000),
        last_blocked_at: (blocked > 0).then_some(now - 30_000),
        banned_until,
        updated_at: now - 1_000,
    };
    store
        .save_site_records(vec![
            taught("shop.example", 12, 0, None),
            taught(
                "a-rather-long-host-name-of-a-site.example.com:8443",
                0,
                3,
                Some(now + 3_600_000),
            ),
        ])
        .await
        .unwrap();
    let policy = proxywarden::model::RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::from_secs(150),
        dead: Duration::from_secs(900),
        dead_max: Duration::from_secs(86_400),
    };
    store
        .record_checks(
            vec![common::refused_at(dead, proxywarden::store::now_ms())],
            policy,
        )
        .await
        .unwrap();
    drop(store);
    (three, dead)
}

/// Starts a crawl job on a slow site, so it is still running when
/// cancelled; its id.
async fn slow_job(daemon: &Daemon, site: &Site) -> i64 {
    let resp = daemon
        .req(reqwest::Method::POST, "/crawls")
        .header("content-type", "application/json")
        .body(format!(
            r#"{{"seeds": ["{}"], "per_host_concurrency": 1}}"#,
            site.url("/")
        ))
        .send()
        .await
        .unwrap();
    let (status, job) = status_json(resp).await;
    assert_eq!(status, 201, "{job}");
    job["id"].as_i64().unwrap()
}

#[tokio::test]
async fn the_dashboard_renders_without_script_shows_what_stats_says_and_cancels_a_job() {
    let dir = tempfile::tempdir().unwrap();
    let (_three, _dead) = pool(dir.path()).await;
    let slow = Site::tree(400, 4, Duration::from_millis(200)).await;
    let (daemon, _gateway) = Daemon::start_with_gateway(dir.path(), "", |c| c).await;
    let browser = common::within(Browser::start()).await;
    let b = &browser;
    common::within(async {
        let job = slow_job(&daemon, &slow).await;

        // The history charts show the snapshot taken at start.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            b.client.goto(&daemon.url("/")).await.unwrap();
            let points =
                b.count("#history svg polyline").await + b.count("#history svg circle").await;
            if points > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "no snapshot in the history charts"
            );
        }

        // What the page shows equals what /stats says at the same moment:
        // read /stats before and after the page until nothing moved between.
        let deadline = Instant::now() + Duration::from_secs(30);
        let (stats, figures) = loop {
            let (_, before) = daemon.json("/stats").await;
            b.client.goto(&daemon.url("/")).await.unwrap();
            let figures = b.figures().await;
            let (_, after) = daemon.json("/stats").await;
            if stable(&before) == stable(&after) {
                break (after, figures);
            }
            assert!(Instant::now() < deadline, "/stats never held still");
        };
        assert_eq!(b.client.title().await.unwrap(), "proxywarden");
        for key in ["servable", "total", "by_status.alive", "by_status.dead"] {
            assert!(
                figures.iter().any(|(k, _)| k == key),
                "the page shows no {key}: {figures:?}"
            );
        }
        for (key, shown) in &figures {
            assert_eq!(
                Some(*shown),
                stat(&stats, key),
                "the page shows {key} = {shown}, /stats says {}",
                stats
            );
        }
        // Every country, scheme and failure reason /stats lists is shown.
        for map in ["by_country", "by_scheme", "by_reason", "by_status"] {
            for (k, n) in stats[map].as_object().unwrap() {
                if n.as_i64().unwrap() > 0 {
                    let key = format!("{map}.{k}");
                    assert!(
                        figures.iter().any(|(f, _)| *f == key),
                        "the page leaves out {key}"
                    );
                }
            }
        }
        assert_eq!(stat(&stats, "servable"), Some(3), "{stats}");
        assert_eq!(stat(&stats, "by_status.dead"), Some(1), "{stats}");
        assert_eq!(stat(&stats, "by_reason.refused"), Some(1), "{stats}");
        // Charts are inline SVG, each with a title; nothing is fetched.
        assert!(b.count("svg.chart").await >= 6);
        assert!(
            figures.iter().any(|(k, _)| k == "gateway.connections"),
            "{figures:?}"
        );
        let source = b.client.source().await.unwrap();
        assert!(source.contains("<title>Servable and alive proxies, last 24 hours</title>"));
        assert!(!source.contains("<script"), "the page has a script");
        assert!(source.contains(r#"http-equiv="refresh""#));
        for section in [
            "#pool", "#history", "#latency", "#checks", "#sources", "#judges", "#gateway",
        ] {
            assert_eq!(b.count(section).await, 1, "no {section} section");
        }
        let judges = b.text("#judges").await;
        assert!(
            judges.contains(&format!("http://{}/judge", daemon.addr)),
            "{judges}"
        );

        // The job is listed with its cancel button; pressing it cancels it.
        let row = format!("tr[data-crawl=\"{job}\"]");
        let state = b.text(&format!("{row} td.state")).await;
        assert!(
            state == "running" || state == "queued",
            "job {job} shows {state:?}"
        );
        b.screenshot("dashboard").await;
        b.submit(&format!("{row} button")).await;
        let url = b.client.current_url().await.unwrap();
        assert_eq!(url.path(), "/", "{url}");
        assert_eq!(b.text(&format!("{row} td.state")).await, "cancelled");
        assert_eq!(b.count(&format!("{row} button")).await, 0);
        let (_, view) = daemon.json(&format!("/crawls/{job}")).await;
        assert_eq!(view["state"], "cancelled", "{view}");
    })
    .await;
    drop(browser);
    daemon.stop().await;
}

#[tokio::test]
async fn with_a_token_the_browser_logs_in_once_and_a_wrong_token_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_three, _dead) = pool(dir.path()).await;
    let daemon = Daemon::start(dir.path(), "", |c| {
        c.set("api", "token", &format!("\"{TOKEN}\""))
    })
    .await;
    let browser = common::within(Browser::start()).await;
    let b = &browser;
    common::within(async {
        // Nothing but the login form.
        b.client.goto(&daemon.url("/")).await.unwrap();
        assert_eq!(b.count("input#token").await, 1);
        assert!(b.figures().await.is_empty(), "figures shown before login");
        assert_eq!(b.count("#pool").await, 0);
        b.screenshot("login").await;

        // A wrong token: refused, still the form, no cookie.
        let field = b.client.find(Locator::Css("input#token")).await.unwrap();
        field.send_keys("not-the-token").await.unwrap();
        b.submit("button[type=submit]").await;
        assert!(b.text("#login-error").await.contains("Wrong token"));
        assert_eq!(b.count("#pool").await, 0);
        assert!(b.client.get_all_cookies().await.unwrap().is_empty());

        // The right one: the dashboard, and an HttpOnly, SameSite=Strict
        // cookie that keeps the browser in.
        let field = b.client.find(Locator::Css("input#token")).await.unwrap();
        field.send_keys(TOKEN).await.unwrap();
        b.submit("button[type=submit]").await;
        assert_eq!(b.count("#pool").await, 1, "no dashboard after login");
        let (_, stats) = daemon.json("/stats").await;
        assert_eq!(
            b.text("[data-stat=servable]").await,
            stats["servable"].to_string()
        );
        let cookie = b
            .client
            .get_named_cookie("proxywarden_session")
            .await
            .unwrap();
        assert_eq!(cookie.http_only(), Some(true));
        assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
        b.client.goto(&daemon.url("/")).await.unwrap();
        assert_eq!(b.count("#pool").await, 1, "the login did not last");
        // The session reads the API too (the page links /stats).
        b.client.goto(&daemon.url("/stats")).await.unwrap();
        assert!(b.client.source().await.unwrap().contains("\"servable\""));

        // Logging out ends it.
        b.client.goto(&daemon.url("/")).await.unwrap();
        b.submit("form[action=\"/dashboard/logout\"] button").await;
        assert_eq!(b.count("input#token").await, 1);
        assert_eq!(b.count("#pool").await, 0);
    })
    .await;
    drop(browser);
    daemon.stop().await;
}

/// The CSRF token in a dashboard page.
fn csrf_of(html: &str) -> String {
    let at = html
        .find(r#"name="csrf" value=""#)
        .expect("a form with a CSRF token")
        + 19;
    html[at..at + html[at..].find('"').unwrap()].to_owned()
}

/// `POST path` with a form body and `headers`.
async fn post_form(
    daemon: &Daemon,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = daemon
        .http
        .post(daemon.url(path))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn dashboard_forms_refuse_cross_site_posts() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_three, _) = pool(dir.path()).await;
        let slow = Site::tree(400, 4, Duration::from_millis(200)).await;
        let daemon = Daemon::start(dir.path(), "", |c| c).await;
        let job = slow_job(&daemon, &slow).await;
        let page = daemon.get("/").await;
        assert_eq!(page.status(), 200);
        let headers = page.headers().clone();
        assert_eq!(headers["content-type"], "text/html; charset=utf-8");
        assert!(
            headers["content-security-policy"]
                .to_str()
                .unwrap()
                .contains("frame-ancestors 'none'")
        );
        assert_eq!(headers["x-frame-options"], "DENY");
        let csrf = csrf_of(&page.text().await.unwrap());
        let own = format!("http://{}", daemon.addr);
        let cancel = format!("/dashboard/crawls/{job}/cancel");

        // From another site, without the token, with another's: refused,
        // and the job runs on.
        for (body, headers, why) in [
            (
                format!("csrf={csrf}"),
                vec![("origin", "http://evil.example")],
                "another origin",
            ),
            (
                format!("csrf={csrf}"),
                vec![("origin", "null")],
                "an opaque origin",
            ),
            (
                format!("csrf={csrf}"),
                vec![("sec-fetch-site", "cross-site")],
                "another site",
            ),
            (
                String::new(),
                vec![("origin", own.as_str())],
                "no CSRF token",
            ),
            (
                "csrf=0123abcd".into(),
                vec![("origin", own.as_str())],
                "a wrong CSRF token",
            ),
        ] {
            let resp = post_form(&daemon, &cancel, &body, &headers).await;
            assert_eq!(resp.status(), 403, "a post with {why} was let through");
            assert!(resp.text().await.unwrap().contains("id=\"refused\""));
        }
        let (_, view) = daemon.json(&format!("/crawls/{job}")).await;
        assert_ne!(view["state"], "cancelled", "{view}");
        // A foreign Host (DNS rebinding) cannot even read the page.
        let resp = daemon
            .http
            .get(daemon.url("/"))
            .header("host", "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 421);
        // The JSON API still takes no form bodies.
        let resp = post_form(&daemon, "/crawls", "seeds=x", &[]).await;
        assert_eq!(resp.status(), 415);

        // From the page itself: cancelled, back to the list.
        let resp = post_form(
            &daemon,
            &cancel,
            &format!("csrf={csrf}"),
            &[("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
        )
        .await;
        assert_eq!(resp.status(), 200, "after the redirect to the dashboard");
        let (_, view) = daemon.json(&format!("/crawls/{job}")).await;
        assert_eq!(view["state"], "cancelled", "{view}");
        daemon.stop().await;
    })
    .await;
}

#[tokio::test]
async fn a_session_cookie_reads_but_does_not_write_the_json_api() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::start(dir.path(), "", |c| {
            c.set("api", "token", &format!("\"{TOKEN}\""))
        })
        .await;
        let own = format!("http://{}", daemon.addr);
        let tls =
            proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H1).unwrap();
        let no_redirects = reqwest::Client::builder()
            .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .unwrap();
        let login = |token: &str, origin: &str| {
            no_redirects
                .post(daemon.url("/dashboard/login"))
                .header("content-type", "application/x-www-form-urlencoded")
                .header("origin", origin.to_owned())
                .body(format!("token={token}"))
                .send()
        };
        // A login posted from another site is refused (login CSRF).
        assert_eq!(
            login(TOKEN, "http://evil.example").await.unwrap().status(),
            403
        );
        let wrong = login("wrong", &own).await.unwrap();
        assert_eq!(wrong.status(), 401);
        assert!(wrong.headers().get("set-cookie").is_none());
        let right = login(TOKEN, &own).await.unwrap();
        assert_eq!(right.status(), 303);
        let set = right.headers()["set-cookie"].to_str().unwrap().to_owned();
        assert!(
            set.contains("HttpOnly") && set.contains("SameSite=Strict"),
            "{set}"
        );
        let cookie = set.split(';').next().unwrap().to_owned();

        let with_cookie = |method: reqwest::Method, path: &str| {
            no_redirects
                .request(method, daemon.url(path))
                .header("cookie", cookie.clone())
        };
        assert_eq!(
            with_cookie(reqwest::Method::GET, "/stats")
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
        let resp = with_cookie(reqwest::Method::POST, "/crawls")
            .header("content-type", "application/json")
            .body(r#"{"seeds": ["http://127.0.0.1:9/"]}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401, "a cookie started a crawl job");
        // A forged or altered cookie is no session.
        let forged = format!("{}0", cookie);
        let resp = no_redirects
            .get(daemon.url("/stats"))
            .header("cookie", forged)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 401);
        let page = no_redirects
            .get(daemon.url("/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(page.contains("name=\"token\"") && !page.contains("data-stat"));

        // Guessing is bounded: a few wrong tries a minute per network, then 429.
        let mut limited = None;
        for _ in 0..12 {
            let resp = login("guess", &own).await.unwrap();
            if resp.status() == 429 {
                limited = Some(resp);
                break;
            }
            assert_eq!(resp.status(), 401);
        }
        let limited = limited.expect("a dozen wrong logins in a row were all answered");
        assert!(limited.headers().contains_key("retry-after"));
        daemon.stop().await;
    })
    .await;
}

/// What breaks the layout at the window's width, measured in the page:
/// the document wider than the viewport, an element sticking out of it
/// (outside a box that scrolls), a table header cell out of sight, text
/// drawn under 11 px (SVG text at its scaled size).
const LAYOUT_FAULTS: &str = r#"
const vw = document.documentElement.clientWidth;
const faults = [];
if (document.documentElement.scrollWidth > vw) {
  faults.push(`page scrollWidth ${document.documentElement.scrollWidth} > viewport ${vw}`);
}
const scrolls = (e) => { for (let p = e.parentElement; p; p = p.parentElement) {
  const o = getComputedStyle(p).overflowX; if (o === 'auto' || o === 'scroll') return true; }
  return false; };
const name = (e) => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
  ' "' + (e.textContent || '').trim().slice(0, 40) + '"';
for (const e of document.body.querySelectorAll('*')) {
  const r = e.getBoundingClientRect();
  if (r.width === 0 && r.height === 0) continue;
  if ((r.right > vw + 0.5 || r.left < -0.5) && !scrolls(e)) {
    faults.push(`${name(e)} spans ${r.left.toFixed(0)}..${r.right.toFixed(0)}`);
  }
  const text = [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
  if (text) {
    let px = parseFloat(getComputedStyle(e).fontSize);
    const svg = e.closest('svg');
    if (svg && svg.viewBox && svg.viewBox.baseVal && svg.viewBox.baseVal.width) {
      px *= svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    }
    if (px < 10.95) faults.push(`${name(e)} drawn at ${px.toFixed(1)} px`);
  }
}
for (const th of document.querySelectorAll('th')) {
  const r = th.getBoundingClientRect();
  if ((r.right > vw + 0.5 || r.left < -0.5) && !scrolls(th)) {
    faults.push(`header ${name(th)} out of sight at ${r.left.toFixed(0)}..${r.right.toFixed(0)}`);
  }
}
return faults;
"#;

#[tokio::test]
async fn the_dashboard_fits_375_1024_and_1400_px_with_readable_text_and_every_column_in_sight() {
    let dir = tempfile::tempdir().unwrap();
    let (_three, _dead) = pool(dir.path()).await;
    // Judges whose URLs are long, as private judges behind a path and a
    // query often are: their rows must not push the table's columns away.
    let judge = common::judges::Judge::echo().await;
    let long: Vec<String> = ["a", "b"]
        .iter()
        .map(|k| {
            format!(
                "http://{}/judge/{k}/behind-a-rather-long-path-of-a-private-deployment/\
                 and-another-segment?token-free-query=answer-with-every-header&x={k}",
                judge.addr
            )
        })
        .collect();
    let judges = long
        .iter()
        .map(|u| format!("{{ url = \"{u}\", marker = \"proxywarden-judge\" }}"))
        .collect::<Vec<_>>()
        .join(", ");
    let (daemon, _gateway) =
        Daemon::start_with_gateway(dir.path(), "", |c| c.judges(&format!("[{judges}]"))).await;
    // Judges asked.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stats) = daemon.json("/stats").await;
        if stats["last_check"].is_object() {
            break;
        }
        assert!(Instant::now() < deadline, "no check round: {stats}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for width in [375u32, 1024, 1400] {
        let browser = common::within(Browser::start_with(width, true)).await;
        let b = &browser;
        common::within(async {
            b.client.goto(&daemon.url("/")).await.unwrap();
            assert_eq!(b.count("#judges").await, 1);
            // The proxy table, every stored proxy on its first page, with
            // what sites taught, is measured with the rest.
            assert_eq!(b.count("#proxy-table tr[data-proxy]").await, 4);
            assert_eq!(b.count("#proxy-table th").await, 8);
            let taught = b.text("#proxy-table").await;
            assert!(taught.contains("shop.example"), "{taught}");
            assert!(taught.contains("banned by 1 now"), "{taught}");
            let shown = b.text("#judges").await;
            for url in &long {
                assert!(shown.contains(url.as_str()), "{url} is not in {shown}");
            }
            let vw = b
                .client
                .execute("return document.documentElement.clientWidth;", vec![])
                .await
                .unwrap();
            let vw = vw.as_u64().unwrap();
            assert!(
                vw <= u64::from(width) && vw + 20 >= u64::from(width),
                "the viewport is {vw} px wide, not {width}"
            );
            let shot = b.screenshot(&format!("dashboard-{width}")).await;
            let faults = b
                .client
                .execute(LAYOUT_FAULTS, vec![])
                .await
                .unwrap_or_else(|e| panic!("cannot measure the page: {e}"));
            let faults: Vec<String> = serde_json::from_value(faults).unwrap();
            assert!(
                faults.is_empty(),
                "at {width} px (screenshot {}):\n{}",
                shot.display(),
                faults.join("\n")
            );
        })
        .await;
        drop(browser);
    }
    daemon.stop().await;
}

/// The number a counts table shows beside `label` in the section that
/// follows the heading `table` (`<h3>HTTPS (CONNECT)</h3>`).
fn shown_in(html: &str, table: &str, label: &str) -> Option<i64> {
    let start = html.find(&format!("<h3>{table}</h3>"))?;
    let rest = &html[start..];
    let rest = &rest[..rest[4..].find("<h3>").map_or(rest.len(), |e| e + 4)];
    let cell = format!("<td>{label}</td><td class=\"num\">");
    let at = rest.find(&cell)? + cell.len();
    let end = rest[at..].find('<')?;
    rest[at..at + end].replace(',', "").parse().ok()
}

#[tokio::test]
async fn plain_http_only_counts_proxies_known_to_lack_https_and_the_rest_are_not_known_yet() {
    let dir = tempfile::tempdir().unwrap();
    // Five servable proxies: one tunnels HTTPS, two are known not to, and
    // two were never tried with CONNECT. Each takes connections and never
    // answers, with an hour for a check: the re-check a start makes of
    // what it loads cannot end during the test and take them out of the
    // counts (ports that refused did, on a loaded machine).
    let silent: Vec<_> = (0..5)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let https = [Some(true), Some(false), Some(false), None, None];
    let proxies: Vec<AliveProxy> = silent
        .iter()
        .zip(https)
        .map(|(l, h)| AliveProxy {
            https: h,
            ..AliveProxy::new(format!("http://{}", l.local_addr().unwrap()))
        })
        .collect();
    let (store, _) = store_with_alive(&dir.path().join("daemon.db"), &proxies).await;
    drop(store);
    let daemon = Daemon::start(dir.path(), "", |c| {
        c.set("check", "connect_timeout", "\"1h\"")
            .set("check", "timeout", "\"1h\"")
    })
    .await;
    common::within(async {
        let (_, stats) = daemon.json("/stats").await;
        assert_eq!(stat(&stats, "servable"), Some(5), "{stats}");
        let resp = daemon.get("/").await;
        assert_eq!(resp.status(), 200);
        let page = resp.text().await.unwrap();
        let table = "HTTPS (CONNECT)";
        assert_eq!(shown_in(&page, table, "with HTTPS"), Some(1), "{page}");
        assert_eq!(shown_in(&page, table, "plain HTTP only"), Some(2), "{page}");
        assert_eq!(
            shown_in(&page, table, "HTTPS not known yet"),
            Some(2),
            "{page}"
        );
    })
    .await;
    daemon.stop().await;
}

/// The figure of the tile labelled `label` on the page.
fn tile_of(html: &str, label: &str) -> Option<i64> {
    let end = html.find(&format!("<div class=\"l\">{label}</div>"))?;
    let before = html[..end].strip_suffix("</div>")?;
    let start = before.rfind('>')? + 1;
    before[start..].replace(',', "").parse().ok()
}

#[tokio::test]
async fn checks_a_minute_counts_the_first_round_within_the_first_minute() {
    use proxywarden::model::{Candidate, Hints, SourceScheme};
    use proxywarden::proxy::Proxy;
    let dir = tempfile::tempdir().unwrap();
    // Three proxies never checked, so the first round checks them all.
    let closed: Vec<_> = (0..3).map(|_| closed_port()).collect();
    let candidates: Vec<Candidate> = closed
        .iter()
        .map(|c| {
            let p = Proxy::parse_url(&format!("http://{}", c.addr())).unwrap();
            Candidate::new(
                p.host,
                p.port,
                None,
                Some(p.scheme),
                SourceScheme::Detect,
                Hints::default(),
            )
        })
        .collect();
    let store = proxywarden::store::Store::open(&dir.path().join("daemon.db")).unwrap();
    let run = common::source_run("test", "file:test", proxywarden::store::now_ms());
    store.record_source_run(run, candidates).await.unwrap();
    drop(store);
    let started = Instant::now();
    let daemon = Daemon::start(dir.path(), "", |c| c).await;
    common::within(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        let checked = loop {
            let (_, stats) = daemon.json("/stats").await;
            if let Some(n) = stats["last_check"]["checked"].as_u64().filter(|n| *n > 0) {
                break n;
            }
            assert!(Instant::now() < deadline, "no check round: {stats}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let page = daemon.get("/").await.text().await.unwrap();
        let shown = tile_of(&page, "checks a minute");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the test ran past the first minute"
        );
        assert!(
            shown >= Some(checked as i64),
            "a round checked {checked} within the first minute; the page shows {shown:?} checks a minute"
        );
    })
    .await;
    daemon.stop().await;
}

#[tokio::test]
async fn the_proxy_table_narrows_to_a_search_and_pages_without_script() {
    let dir = tempfile::tempdir().unwrap();
    let (_three, dead) = pool(dir.path()).await;
    let daemon = Daemon::start(dir.path(), "", |c| c).await;
    let browser = common::within(Browser::start()).await;
    let b = &browser;
    common::within(async {
        let rows = "#proxy-table tr[data-proxy]";
        b.client.goto(&daemon.url("/")).await.unwrap();
        assert_eq!(b.count(rows).await, 4, "every stored proxy, dead ones too");
        assert_eq!(b.count(&format!("tr[data-proxy=\"{dead}\"]")).await, 1);

        // Typing a country code and pressing Search narrows the rows.
        let field = b.client.find(Locator::Css("#proxy-q")).await.unwrap();
        field.send_keys("de").await.unwrap();
        b.submit("#proxy-search button").await;
        assert_eq!(b.count(rows).await, 1, "{}", b.text("#proxies").await);
        assert!(b.text("#proxy-table").await.contains("DE"));
        assert_eq!(b.text("#proxy-total").await, "1 matching, 1 shown.");
        // The search stays in the box and in the address, so the page's
        // reload keeps it.
        let field = b.client.find(Locator::Css("#proxy-q")).await.unwrap();
        assert_eq!(field.prop("value").await.unwrap().as_deref(), Some("de"));
        let url = b.client.current_url().await.unwrap();
        assert!(url.query().unwrap_or("").contains("q=de"), "{url}");

        // A part of an address: the dead proxy's port.
        let (_, page) = daemon.json("/proxies/browse").await;
        let dead_address = page["proxies"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == dead)
            .unwrap()["address"]
            .as_str()
            .unwrap()
            .to_owned();
        let port = dead_address.rsplit(':').next().unwrap();
        field.clear().await.unwrap();
        field.send_keys(&format!(":{port}")).await.unwrap();
        b.submit("#proxy-search button").await;
        assert_eq!(b.count(rows).await, 1);
        assert_eq!(b.count(&format!("tr[data-proxy=\"{dead}\"]")).await, 1);

        // Two a page: next, next, then back.
        let shown = || async {
            let mut ids = Vec::new();
            for e in b.client.find_all(Locator::Css(rows)).await.unwrap() {
                ids.push(e.attr("data-proxy").await.unwrap().unwrap());
            }
            ids
        };
        b.client.goto(&daemon.url("/?limit=2")).await.unwrap();
        let first = shown().await;
        assert_eq!(first.len(), 2);
        assert_eq!(b.count("#proxy-prev").await, 0);
        b.submit("#proxy-next").await;
        let second = shown().await;
        assert_eq!(second.len(), 2);
        assert!(
            second.iter().all(|id| !first.contains(id)),
            "{first:?} {second:?}"
        );
        assert_eq!(b.count("#proxy-next").await, 0, "4 proxies are two pages");
        b.submit("#proxy-prev").await;
        assert_eq!(shown().await, first);

        // A bad parameter is said in the table; the rest of the page shows.
        b.client.goto(&daemon.url("/?limit=501")).await.unwrap();
        assert!(b.text("#proxy-error").await.contains("limit"));
        assert_eq!(b.count("#pool").await, 1);
    })
    .await;
    drop(browser);
    daemon.stop().await;
}
