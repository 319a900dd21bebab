//! A database on a full disk (issue 26), on a real tmpfs the test mounts
//! (as root; skipped with a message where mounting is impossible), over
//! loopback only: `harvest` keeps whole chunks and says what it stored
//! apart from the sources' notes, a `check` round stops at once and says
//! why, and `serve` backs off, says so in `/healthz`, `/stats`, `/metrics`
//! and one log line, keeps serving from memory, and takes writes again
//! within one pause once there is room.

use crate::common;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::TestConfig;
use common::judges::Judge;
use common::tmpfs::Tmpfs;
use tokio::io::AsyncBufReadExt;

/// The binary in `dir` (reading `dir/proxywarden.toml`), to its end.
async fn proxywarden(dir: &Path, args: &[&str]) -> std::process::Output {
    command(dir, args).output().await.unwrap()
}

fn command(dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"));
    cmd.args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9");
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `PRAGMA integrity_check` of the database at `path`, and how many of its
/// proxies have `status`.
fn inspect(path: &Path, status: &str) -> (String, i64) {
    let c = rusqlite::Connection::open(path).unwrap();
    let integrity: String = c
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    let n: i64 = c
        .query_row(
            "SELECT count(*) FROM proxies WHERE status = ?1 OR ?1 = 'any'",
            [status],
            |r| r.get(0),
        )
        .unwrap();
    (integrity, n)
}

/// `n` addresses on the discard port of 127.1.x.y, where nothing listens:
/// each is refused at once.
fn refusing(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("127.1.{}.{}:9", i / 250, i % 250 + 1))
        .collect()
}

/// Issue 26, Musts 3 and 4: the issue's own case, a 3 MB file system and a
/// list of 200,000 (kept to `harvest.max_per_source`, 100,000).
#[tokio::test]
async fn harvest_on_a_full_disk_keeps_whole_chunks_and_says_what_it_stored() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::for_test(&dir.path().join("db"), "3m") else {
        return;
    };
    let list = dir.path().join("list.txt");
    let lines: Vec<String> = (0..200_000u32)
        .map(|i| format!("10.{}.{}.{}:8080", i >> 16, (i >> 8) & 255, i & 255))
        .collect();
    std::fs::write(&list, lines.join("\n")).unwrap();
    TestConfig::new(dir.path())
        .db("db/pw.db")
        .set("harvest", "max_body", "\"16MiB\"")
        .source("big", &list.display().to_string(), "")
        .write();
    let db = fs.path().join("pw.db");

    let out = proxywarden(dir.path(), &["harvest"]).await;
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let (integrity, stored) = inspect(&db, "any");
    assert_eq!(integrity, "ok");
    assert!(
        stored > 0 && stored < 100_000 && stored % 6_000 == 0,
        "whole chunks of 6,000 are kept: {stored}\n{stdout}"
    );
    // The source's row: what it listed, what of it is new in the store,
    // and only the source's own note; the disk has lines of its own.
    let row: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("big "))
        .unwrap_or_else(|| panic!("{stdout}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        &row[..3],
        ["big", "100000", &stored.to_string()],
        "{stdout}"
    );
    assert_eq!(
        row[5..].join(" "),
        "truncated at harvest.max_per_source",
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "total: 1 sources (1 ok, 0 failed), {stored} distinct proxies, {stored} new"
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "not stored: cannot write the database (disk full): database or disk is full"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("stored before it: big {stored} of 100000")),
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!("{stored} of the 100000 proxies found were stored"))
            && stderr.contains("free space for"),
        "{stderr}"
    );
    assert!(!stderr.contains("nothing was harvested"), "{stderr}");

    // Room again: the same harvest stores the rest and succeeds.
    fs.resize("64m");
    let out = proxywarden(dir.path(), &["harvest"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(inspect(&db, "any"), ("ok".to_owned(), 100_000));
}

/// Issue 26, Must 4: a check round on a full disk stops at its first batch
/// instead of checking everything due, says why and what to do, and leaves
/// the database whole; with room again the next round records everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_round_on_a_full_disk_stops_at_once_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::for_test(&dir.path().join("db"), "64m") else {
        return;
    };
    let judge = Judge::plain().await;
    let list = dir.path().join("list.txt");
    std::fs::write(&list, refusing(3_000).join("\n")).unwrap();
    TestConfig::new(dir.path())
        .db("db/pw.db")
        .judges(&format!("[\"{}\"]", judge.url()))
        .set("check", "https", "false")
        .source("list", &list.display().to_string(), "")
        .write();
    let db = fs.path().join("pw.db");
    assert!(proxywarden(dir.path(), &["harvest"]).await.status.success());
    fs.fill_but_open();

    let out = proxywarden(dir.path(), &["check"]).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cannot write the database (disk full)") && stderr.contains("free space"),
        "{stderr}"
    );
    assert_eq!(inspect(&db, "unknown"), ("ok".to_owned(), 3_000));

    fs.resize("64m");
    let out = proxywarden(dir.path(), &["check"]).await;
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("checked 3000 proxies"), "{stdout}");
    assert_eq!(inspect(&db, "dead"), ("ok".to_owned(), 3_000));
}

/// The log lines a child writes to stdout, as they come.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    fn follow(&self, out: tokio::process::ChildStdout) {
        let lines = self.0.clone();
        tokio::spawn(async move {
            let mut reader = tokio::io::BufReader::new(out).lines();
            while let Ok(Some(line)) = reader.next_line().await {
                lines.lock().unwrap().push(line);
            }
        });
    }

    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn count(&self, needle: &str) -> usize {
        self.lines().iter().filter(|l| l.contains(needle)).count()
    }
}

/// GET `url` as JSON, or `None` while nothing answers.
async fn get_json(http: &reqwest::Client, url: &str) -> Option<(u16, serde_json::Value)> {
    let resp = http.get(url).send().await.ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.json().await.ok()?))
}

/// Polls `/healthz` until its status is `want`, for at most `within`.
async fn until_health(
    http: &reqwest::Client,
    base: &str,
    want: &str,
    within: Duration,
) -> serde_json::Value {
    let deadline = Instant::now() + within;
    loop {
        if let Some((_, h)) = get_json(http, &format!("{base}/healthz")).await
            && h["status"] == want
        {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz not {want} within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 26, Musts 1, 2 and 4: `serve` started on a full disk, with three
/// working proxies just checked. Over 30 s it logs the failure once, uses
/// next to no CPU, answers `/healthz` degraded with the reason and since
/// when, counts the failures in `/stats` and `/metrics`, and still serves
/// the proxies although their last recorded check is older than the
/// freshness window; once the tmpfs is remounted larger it takes writes
/// again within the pause in force, says so in one line, records checks
/// again and stops cleanly on a whole database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_on_a_full_disk_backs_off_says_so_keeps_serving_and_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::for_test(&dir.path().join("db"), "64m") else {
        return;
    };
    let judge = Judge::plain().await;
    let (_proxies, alive) = common::working_proxies(3).await;
    let urls: Vec<String> = alive.iter().map(|a| a.url.clone()).collect();
    let mut list = urls.clone();
    list.extend(refusing(200));
    std::fs::write(dir.path().join("list.txt"), list.join("\n")).unwrap();
    let port = common::free_port();
    TestConfig::new(dir.path())
        .db("db/pw.db")
        .judges(&format!("[\"{}\"]", judge.url()))
        .set("check", "https", "false")
        .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
        .set("gateway", "listen", "\"127.0.0.1:0\"")
        .source(
            "list",
            &dir.path().join("list.txt").display().to_string(),
            "",
        )
        .write();
    let db = fs.path().join("pw.db");
    assert!(proxywarden(dir.path(), &["harvest"]).await.status.success());
    assert!(proxywarden(dir.path(), &["check"]).await.status.success());
    assert_eq!(inspect(&db, "alive").1, 3);
    fs.fill_but_open();

    let mut child = command(dir.path(), &["serve"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let started = Instant::now();
    let pid = child.id().unwrap();
    let log = Log::default();
    log.follow(child.stdout.take().unwrap());
    let http = common::daemon::client(Duration::from_secs(30));
    let base = format!("http://127.0.0.1:{port}");

    let health = until_health(&http, &base, "degraded", Duration::from_secs(30)).await;
    let reason = &health["reasons"][0];
    assert_eq!(reason["component"], "store", "{health}");
    let message = reason["message"].as_str().unwrap();
    assert!(
        message.starts_with("cannot write the database (disk full): database or disk is full;"),
        "{message}"
    );
    assert!(
        chrono::DateTime::parse_from_rfc3339(reason["since"].as_str().unwrap()).is_ok(),
        "{health}"
    );

    // Thirty seconds on the full disk: the window a user watches the log in.
    tokio::time::sleep_until((started + Duration::from_secs(30)).into()).await;
    let cpu = common::cpu_seconds(pid);
    let lines = log.lines();
    assert_eq!(
        log.count("cannot write the database"),
        1,
        "one line for the failure in 30 s:\n{}",
        lines.join("\n")
    );
    assert_eq!(log.count("ERROR"), 1, "{}", lines.join("\n"));
    assert!(
        lines.len() <= 8,
        "{} lines:\n{}",
        lines.len(),
        lines.join("\n")
    );
    assert!(cpu < 3.0, "{cpu} s of CPU in 30 s on a full disk");
    eprintln!(
        "30 s on a full disk: {} log lines, {cpu:.2} s of CPU:\n{}",
        lines.len(),
        lines.join("\n")
    );

    // Still served from memory: their last recorded check is 30 s old,
    // past the freshness window of three served proxies (22 s), within
    // api.max_age.
    let (status, one) = get_json(&http, &format!("{base}/proxy")).await.unwrap();
    assert_eq!(status, 200, "{one}");
    assert!(
        urls.contains(&one["url"].as_str().unwrap().to_owned()),
        "{one}"
    );
    let (_, stats) = get_json(&http, &format!("{base}/stats")).await.unwrap();
    let store = &stats["store"];
    // If these fail, the daemon's log goes with them: its failure, and
    // whether it said the database took writes again.
    let said = || log.lines().join("\n");
    assert_eq!(store["writable"], false, "{stats}\n{}", said());
    assert!(
        store["write_failures"]["disk_full"].as_u64() >= Some(3),
        "{stats}\n{}",
        said()
    );
    assert_eq!(store["write_trouble"]["kind"], "disk_full", "{stats}");
    assert_eq!(stats["degraded"][0]["component"], "store", "{stats}");
    let metrics = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let failures: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("proxywarden_store_write_failures_total{kind=\"disk_full\"} "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(failures >= 3, "{metrics}");

    // Room again: writes are tried at the end of the pause in force, and
    // work for a moment before the daemon says so.
    let (_, stats) = get_json(&http, &format!("{base}/stats")).await.unwrap();
    let pause = Duration::from_secs(
        stats["store"]["write_trouble"]["retry_every_s"]
            .as_u64()
            .unwrap(),
    );
    fs.resize("64m");
    let remounted = Instant::now();
    until_health(&http, &base, "ok", pause + Duration::from_secs(10)).await;
    let took = remounted.elapsed();
    eprintln!("writes noticed {took:?} after the room came back (pause {pause:?})");
    assert!(
        took <= pause + Duration::from_secs(4),
        "writes noticed {took:?} after the room came back, with a pause of {pause:?}"
    );
    assert_eq!(
        log.count("the database takes writes again"),
        1,
        "{}",
        log.lines().join("\n")
    );
    // Checks are recorded again: every served proxy is re-checked at once.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, stats) = get_json(&http, &format!("{base}/stats")).await.unwrap();
        if stats["last_check"]["alive"].as_u64() >= Some(1) {
            assert_eq!(stats["store"]["writable"], true, "{stats}");
            break;
        }
        assert!(Instant::now() < deadline, "no check recorded: {stats}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let kill = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let status = common::within(child.wait()).await.unwrap();
    assert!(status.success(), "{status:?}");
    assert_eq!(inspect(&db, "alive"), ("ok".to_owned(), 3));
}
