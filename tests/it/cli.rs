//! The `proxywarden` binary as a user runs it: config discovery and
//! validation, `harvest` output and exit status, `stats`, and `export` in
//! every format.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Output;

use common::site::{Reply, Site, SiteOpts};
use common::{config_toml, write_config};

async fn proxywarden(dir: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        // Sources are fetched directly: a system proxy (here a closed port)
        // must not be used.
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .env("http_proxy", "http://127.0.0.1:9")
        .output()
        .await
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn config_example_is_valid_and_config_check_names_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let out = proxywarden(dir.path(), &["config", "example"]).await;
    assert!(out.status.success());
    let example = stdout(&out);
    assert!(example.contains("[[sources]]"));
    std::fs::write(dir.path().join("example.toml"), &example).unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "example.toml"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("example.toml: ok"));

    std::fs::write(
        dir.path().join("bad.toml"),
        "[harvest]\ntimeout = 5\nmax_per_source = -1\n[api]\nlisten = \"nowhere\"\ntokn = \"x\"\n",
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "bad.toml"]).await;
    assert!(!out.status.success());
    let err = stderr(&out);
    for needle in [
        "bad.toml: 4 problems",
        "harvest.timeout: 5 has no unit: write \"5s\" for seconds or \"5m\" for minutes",
        "harvest.max_per_source: must be between 1 and 10000000, found -1",
        "api.listen: expected an address",
        "api.tokn: unknown key (did you mean `token`?)",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }

    let out = proxywarden(dir.path(), &["config", "check", "-c", "missing.toml"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("missing.toml: 1 problem"));
    assert!(stderr(&out).contains("cannot read the file"));

    std::fs::write(dir.path().join("broken.toml"), "[harvest\n").unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "broken.toml"]).await;
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not valid TOML"), "{}", stderr(&out));
}

/// What the file's text cannot show but would leave `serve` storing
/// nothing is a problem too: a database folder that is not there, and
/// enabled sources that are all on addresses the harvest refuses.
#[tokio::test]
async fn config_check_refuses_a_missing_database_folder_and_only_private_sources() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-made-yet");
    std::fs::write(
        dir.path().join("nofolder.toml"),
        format!(
            "[database]\npath = {}\n",
            toml::Value::from(missing.join("proxywarden.db").display().to_string())
        ),
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "nofolder.toml"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(!stdout(&out).contains("ok"), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("database.path: the folder") && err.contains("not-made-yet"),
        "{err}"
    );

    let private = "[[sources]]\nname = \"home\"\nurl = \"http://192.168.1.10/list.txt\"\n\
                   [[sources]]\nname = \"here\"\nurl = \"http://localhost:8000/list.txt\"\n\
                   [[sources]]\nname = \"off\"\nurl = \"https://example.com/l.txt\"\nenabled = false\n";
    std::fs::write(dir.path().join("private.toml"), private).unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "private.toml"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    for needle in [
        "home (private)",
        "here (loopback)",
        "harvest.allow_private_addresses = true",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    // Allowed, or with one public source beside them, it is fine.
    std::fs::write(
        dir.path().join("allowed.toml"),
        format!("[harvest]\nallow_private_addresses = true\n{private}"),
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "allowed.toml"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(
        dir.path().join("mixed.toml"),
        format!("{private}[[sources]]\nname = \"public\"\nurl = \"https://example.net/l.txt\"\n"),
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "mixed.toml"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn config_is_found_in_the_environment_then_the_working_directory() {
    let dir = tempfile::tempdir().unwrap();
    // No file anywhere: built-in defaults.
    let out = proxywarden(dir.path(), &["config", "check"]).await;
    assert!(out.status.success());
    assert!(
        stdout(&out).starts_with("built-in defaults: ok"),
        "{}",
        stdout(&out)
    );

    write_config(dir.path(), "[database]\npath = \"here.db\"\n");
    let out = proxywarden(dir.path(), &["config", "check"]).await;
    assert!(
        stdout(&out).contains("proxywarden.toml: ok"),
        "{}",
        stdout(&out)
    );
    assert!(stdout(&out).contains("database here.db"));

    std::fs::write(
        dir.path().join("env.toml"),
        "[database]\npath = \"env.db\"\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(["config", "check"])
        .current_dir(dir.path())
        .env("PROXYWARDEN_CONFIG", "env.toml")
        .output()
        .await
        .unwrap();
    assert!(stdout(&out).contains("env.toml: ok"), "{}", stdout(&out));
    assert!(stdout(&out).contains("database env.db"));
}

#[tokio::test]
async fn harvest_prints_a_line_per_source_and_export_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![
        ("/a.txt", Reply::ok("1.2.3.4:8080\n5.6.7.8:3128\nsocks5://9.9.9.9:1080\n")),
        (
            "/b.json",
            Reply::ok(r#"[{"ip":"5.6.7.8","port":3128,"country":"DE"},{"ip":"4.3.2.1","port":"80","country":"us"}]"#),
        ),
        ("/gone", Reply::status(404)),
    ])
    .await;
    let sources = format!(
        "[[sources]]\nname = \"list-a\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"api-b\"\nurl = \"{}\"\nformat = \"json\"\n\
         [[sources]]\nname = \"gone\"\nurl = \"{}\"\n",
        site.url("/a.txt"),
        site.url("/b.json"),
        site.url("/gone")
    );
    // One source at a time, so which source a shared proxy is "new" for is fixed.
    let toml = config_toml(dir.path(), &sources).replace("[harvest]", "[harvest]\nconcurrency = 1");
    write_config(dir.path(), &toml);

    let out = proxywarden(dir.path(), &["harvest"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no line for {name} in\n{text}"))
            .split_whitespace()
            .collect::<Vec<_>>()
    };
    assert_eq!(line("list-a")[1..4], ["3", "3", "200"]);
    assert_eq!(line("api-b")[1..4], ["2", "1", "200"]);
    assert_eq!(line("gone")[1..4], ["0", "0", "404"]);
    assert!(line("gone").join(" ").contains("HTTP 404 Not Found"));
    assert!(
        text.contains("total: 3 sources (2 ok, 1 failed), 4 distinct proxies, 4 new"),
        "{text}"
    );

    // stats, as a table and as JSON
    let out = proxywarden(dir.path(), &["stats"]).await;
    assert!(out.status.success());
    let table = stdout(&out);
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in:\n{table}"))
    };
    assert_eq!(
        row("proxies").split_whitespace().nth(1),
        Some("4"),
        "{table}"
    );
    // Nothing was checked yet: nothing can be served.
    assert_eq!(
        row("servable").split_whitespace().nth(1),
        Some("0"),
        "{table}"
    );
    // Every count of the sections above "by source" ends in one column.
    let counts: Vec<&str> = table
        .split("\nby source")
        .next()
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("  "))
        .collect();
    assert!(counts.len() >= 6, "{table}");
    let end = counts[0].trim_end().len();
    for l in &counts {
        assert_eq!(
            l.trim_end().len(),
            end,
            "misaligned line {l:?} in:\n{table}"
        );
    }
    let out = proxywarden(dir.path(), &["stats", "--json"]).await;
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["servable"], 0, "{stats}");
    assert_eq!(stats["total"], 4);
    assert_eq!(stats["by_status"]["unknown"], 4);
    assert_eq!(stats["by_scheme"]["socks5"], 1);
    assert_eq!(stats["by_country"]["DE"], 1);
    assert_eq!(stats["by_country"]["US"], 1);
    let gone = stats["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "gone")
        .unwrap();
    assert_eq!(gone["last_error"], "HTTP 404 Not Found");

    // Nothing is alive yet: the default export is empty.
    let out = proxywarden(dir.path(), &["export"]).await;
    assert!(out.status.success());
    assert_eq!(stdout(&out), "");

    let all: BTreeSet<String> = [
        "http://1.2.3.4:8080",
        "http://5.6.7.8:3128",
        "socks5://9.9.9.9:1080",
        "http://4.3.2.1:80",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = proxywarden(dir.path(), &["export", "--status", "all"]).await;
    let txt: BTreeSet<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(txt, all);

    let out = proxywarden(
        dir.path(),
        &["export", "--status", "all", "--format", "json"],
    )
    .await;
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    let json: BTreeSet<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{}://{}:{}",
                r["scheme"].as_str().unwrap(),
                r["host"].as_str().unwrap(),
                r["port"]
            )
        })
        .collect();
    assert_eq!(json, all);
    let de = rows.iter().find(|r| r["host"] == "5.6.7.8").unwrap();
    assert_eq!(de["country"], "DE");
    assert_eq!(de["status"], "unknown");
    assert_eq!(de["username"], serde_json::Value::Null);
    assert_eq!(de["last_checked"], serde_json::Value::Null);
    assert_eq!(de["sources"], serde_json::json!(["api-b", "list-a"]));
    for key in [
        "scheme",
        "host",
        "port",
        "username",
        "status",
        "country",
        "anonymity",
        "https",
        "latency_ms",
        "exit_ip",
        "last_checked",
        "last_alive",
        "first_seen",
        "last_seen",
        "reason",
    ] {
        assert!(de.get(key).is_some(), "json export lacks {key}");
    }
    let first_seen = de["first_seen"].as_str().unwrap();
    assert!(
        chrono::DateTime::parse_from_rfc3339(first_seen).is_ok(),
        "{first_seen} is not RFC 3339"
    );

    // csv to a file, written atomically, filtered by country and scheme
    let out = proxywarden(
        dir.path(),
        &[
            "export",
            "--status",
            "all",
            "--format",
            "csv",
            "--country",
            "de,US",
            "--scheme",
            "http",
            "--output",
            "out.csv",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("wrote 2 proxies to out.csv"));
    let mut reader = csv::Reader::from_path(dir.path().join("out.csv")).unwrap();
    let headers = reader.headers().unwrap().clone();
    let first: Vec<&str> = headers.iter().take(5).collect();
    assert_eq!(first, ["id", "url", "scheme", "host", "port"]);
    let hosts: BTreeSet<String> = reader
        .records()
        .map(|r| r.unwrap()[3].to_string())
        .collect();
    assert_eq!(
        hosts,
        BTreeSet::from(["5.6.7.8".to_string(), "4.3.2.1".to_string()])
    );
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".proxywarden-export"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    // Nothing matches: an empty list, and stderr says so.
    let out = proxywarden(
        dir.path(),
        &["export", "--status", "all", "--country", "ZZ"],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty());
    assert!(
        stderr(&out).contains("no stored proxy matched"),
        "{}",
        stderr(&out)
    );

    let out = proxywarden(dir.path(), &["export", "--country", "Germany"]).await;
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains(
            "invalid value 'Germany' for '--country <COUNTRY>': expected two-letter country codes"
        ),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn harvest_fails_with_a_clear_message_when_every_source_fails() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![("/x", Reply::status(500))]).await;
    let sources = format!(
        "[[sources]]\nname = \"down\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"nofile\"\nurl = \"/definitely/not/here.txt\"\n",
        site.url("/x")
    );
    write_config(dir.path(), &config_toml(dir.path(), &sources));
    let out = proxywarden(dir.path(), &["harvest"]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("all 2 sources failed"),
        "{}",
        stderr(&out)
    );
    // And says what to do.
    assert!(
        stderr(&out).contains("[[sources]]") && stderr(&out).contains("config example"),
        "{}",
        stderr(&out)
    );
    assert!(stdout(&out).contains("HTTP 500"));
    assert!(stdout(&out).contains("cannot read /definitely/not/here.txt"));

    let out = proxywarden(dir.path(), &["harvest", "--source", "nope"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no source named \"nope\""));
}

#[tokio::test]
async fn a_newer_database_is_refused_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &config_toml(dir.path(), ""));
    let db = dir.path().join("test.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", 42)
        .unwrap();
    let out = proxywarden(dir.path(), &["stats"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("schema version 42"),
        "{}",
        stderr(&out)
    );
}

/// Issue 10, Must 8: `config check` fails on what would only fail later:
/// files that cannot be read, and a source URL that is neither a URL nor an
/// existing path. `serve` and `check` refuse to start on the files they read.
#[tokio::test]
async fn config_check_fails_on_files_that_would_fail_later() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("list.txt"), "1.2.3.4:80\n").unwrap();
    std::fs::create_dir(dir.path().join("geo.mmdb")).unwrap();
    let src = |name: &str, url: &str, extra: &str| {
        format!("[[sources]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
    };
    let sources = [
        src("here", "list.txt", ""),
        src("no-scheme", "example.com/list.txt", ""),
        src("gone", "/nope/list.txt", ""),
        src("off", "/nope/off.txt", "enabled = false"),
        src("web", "http://127.0.0.1:9/list.txt", ""),
    ]
    .concat();
    let toml = format!(
        "[check]\nextra_ca_file = \"missing-ca.pem\"\n[geoip]\ndatabase = \"geo.mmdb\"\n{sources}"
    );
    std::fs::write(dir.path().join("files.toml"), &toml).unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "files.toml"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for needle in [
        "files.toml: 4 problems",
        "files.toml: check.extra_ca_file: cannot read missing-ca.pem: No such file or directory",
        "files.toml: geoip.database: cannot read geo.mmdb: it is a directory",
        "files.toml: sources[1].url: \"example.com/list.txt\" is neither an http(s) URL nor a readable file",
        "files.toml: sources[2].url: cannot read /nope/list.txt: No such file or directory",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(
        !err.contains("off.txt"),
        "a disabled source is not checked: {err}"
    );

    // The daemon and `check` read the CA file and the database at start.
    for command in [&["serve"][..], &["check"][..]] {
        let mut args = command.to_vec();
        args.extend(["-c", "files.toml"]);
        let out = proxywarden(dir.path(), &args).await;
        assert_eq!(out.status.code(), Some(2), "{command:?}");
        assert!(
            stderr(&out).contains("check.extra_ca_file: cannot read missing-ca.pem"),
            "{command:?}: {}",
            stderr(&out)
        );
    }

    // Duplicate names are reported whatever else is wrong.
    let dup = format!(
        "{}{}",
        src("x", "list.txt", ""),
        src("x", "/nope/b.txt", "")
    );
    std::fs::write(dir.path().join("dup.toml"), dup).unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "dup.toml"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("sources[1].name: duplicate source name \"x\""),
        "{}",
        stderr(&out)
    );

    // Once the files exist, the same config passes.
    std::fs::write(dir.path().join("missing-ca.pem"), "").unwrap();
    std::fs::remove_dir(dir.path().join("geo.mmdb")).unwrap();
    // A real (MaxMind's test) country database: any readable file is not
    // enough.
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/geoip/GeoLite2-Country-Test.mmdb"),
        dir.path().join("geo.mmdb"),
    )
    .unwrap();
    let fixed = toml
        .replace("example.com/list.txt", "list.txt")
        .replace("/nope/list.txt", "list.txt");
    std::fs::write(dir.path().join("files.toml"), fixed).unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "files.toml"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
}

/// A store in `dir/test.db` (the database of `config_toml`) holding
/// `proxies` (`host:port` or `user:pass@host:port`).
async fn store_with(dir: &Path, proxies: &[&str]) {
    use proxywarden::model::{Candidate, Hints, SourceScheme};
    let store = proxywarden::store::Store::open(&dir.join("test.db")).unwrap();
    let candidates: Vec<Candidate> = proxies
        .iter()
        .map(|p| {
            let p = proxywarden::proxy::Proxy::parse_url(&format!("http://{p}")).unwrap();
            Candidate::new(
                p.host,
                p.port,
                p.auth,
                None,
                SourceScheme::Fixed(proxywarden::proxy::Scheme::Http),
                Hints::default(),
            )
        })
        .collect();
    let run = common::source_run("s", "u", 1);
    store.record_source_run(run, candidates).await.unwrap();
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

/// Issue 10, Must 4: an export keeps the mode of the file it replaces, a
/// new one holding credentials is private, and temporaries a killed export
/// left behind are cleaned up.
#[cfg(unix)]
#[tokio::test]
async fn export_keeps_modes_and_cleans_stale_temporaries() {
    use std::os::unix::fs::PermissionsExt;
    let with_creds = tempfile::tempdir().unwrap();
    let without = tempfile::tempdir().unwrap();
    for (dir, proxies) in [
        (
            &with_creds,
            &["alice:s3cret@10.0.0.1:8080", "10.0.0.2:3128"][..],
        ),
        (&without, &["10.0.0.3:80"][..]),
    ] {
        write_config(dir.path(), &config_toml(dir.path(), ""));
        store_with(dir.path(), proxies).await;
    }
    let export = |dir: &Path, file: &str| {
        let dir = dir.to_path_buf();
        let file = file.to_owned();
        async move {
            let out = proxywarden(&dir, &["export", "--status", "all", "--output", &file]).await;
            assert!(out.status.success(), "{}", stderr(&out));
        }
    };

    // New files: private when they hold a password, the usual mode if not.
    export(with_creds.path(), "new.txt").await;
    let new = with_creds.path().join("new.txt");
    assert!(
        std::fs::read_to_string(&new)
            .unwrap()
            .contains("alice:s3cret@")
    );
    assert_eq!(mode(&new), 0o600);
    export(without.path(), "new.txt").await;
    assert_eq!(mode(&without.path().join("new.txt")), 0o644);

    // An existing file keeps its mode, whatever the export holds.
    for (dir, file, m) in [
        (&with_creds, "kept.txt", 0o600),
        (&with_creds, "shared.txt", 0o640),
        (&without, "kept.txt", 0o600),
    ] {
        let path = dir.path().join(file);
        std::fs::write(&path, "old list\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
        export(dir.path(), file).await;
        assert_ne!(std::fs::read_to_string(&path).unwrap(), "old list\n");
        assert_eq!(mode(&path), m, "{file}");
    }

    // A killed export's temporary is removed once stale; a fresh one (an
    // export in progress) is left alone.
    let stale = with_creds.path().join(".proxywarden-exportAbC123");
    let fresh = with_creds.path().join(".proxywarden-exportXyZ789");
    std::fs::write(&stale, "half a list").unwrap();
    std::fs::write(&fresh, "half a list").unwrap();
    let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(hour_ago)
        .unwrap();
    export(with_creds.path(), "new.txt").await;
    assert!(!stale.exists(), "the stale temporary is still there");
    assert!(fresh.exists(), "a fresh temporary was removed");
    let left: Vec<String> = std::fs::read_dir(with_creds.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".proxywarden-export"))
        .collect();
    assert_eq!(left, [".proxywarden-exportXyZ789"]);
}

/// Runs the binary with stdout on a pipe whose reader is already gone, as
/// in `proxywarden stats | head -1` once `head` has exited.
#[cfg(unix)]
async fn into_closed_pipe(dir: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        // Not output(), which would replace stdout with a pipe of its own.
        .spawn()
        .unwrap()
        .wait_with_output()
        .await
        .unwrap()
}

/// Issue 10, Must 15: a closed pipe ends a command quietly with status 0.
#[cfg(unix)]
#[tokio::test]
async fn a_closed_pipe_ends_quietly_with_status_0() {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), &config_toml(dir.path(), ""));
    store_with(dir.path(), &["10.0.0.1:80", "10.0.0.2:80"]).await;
    for args in [
        &["stats"][..],
        &["stats", "--json"],
        &["export", "--status", "all", "--format", "csv"],
        &["export", "--status", "all", "--format", "json"],
        &["export", "--status", "all"],
        &["config", "example"],
    ] {
        let out = into_closed_pipe(dir.path(), args).await;
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out), "", "{args:?}");
    }
}

/// Issue 10, Must 15: logs go where `--help` says (stderr, but stdout for
/// `serve`), with colours only on a terminal and never with NO_COLOR.
#[tokio::test]
async fn logs_go_where_help_says_without_colours_off_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "10.0.0.1:80\n").unwrap();
    let sources = format!(
        "[[sources]]\nname = \"local\"\nurl = \"{}\"\n",
        list.display()
    );
    write_config(
        dir.path(),
        &format!(
            "{}\n[api]\nlisten = \"127.0.0.1:0\"\n",
            config_toml(dir.path(), &sources)
        ),
    );
    let help = stdout(&proxywarden(dir.path(), &["--help"]).await);
    assert!(
        help.contains("Logs go to stderr, except for `serve`, which logs to stdout"),
        "{help}"
    );

    // A command logs on stderr, its results on stdout; piped, no colours.
    for no_color in [None, Some("1")] {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"));
        cmd.args(["harvest", "-v"])
            .current_dir(dir.path())
            .env_remove("PROXYWARDEN_CONFIG")
            .env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM");
        match no_color {
            Some(v) => cmd.env("NO_COLOR", v),
            None => cmd.env_remove("NO_COLOR"),
        };
        let out = cmd.output().await.unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("harvest finished"),
            "{}",
            stderr(&out)
        );
        assert!(!stdout(&out).contains("harvest finished"));
        assert!(stdout(&out).contains("local"));
        assert!(
            !stderr(&out).contains('\x1b'),
            "colours off a terminal: {:?}",
            stderr(&out)
        );
    }

    // `serve` logs on stdout.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .arg("serve")
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .env_remove("JOURNAL_STREAM")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
        .await
        .expect("serve logged nothing on stdout within 10 s")
        .unwrap()
        .unwrap_or_default();
    assert!(first.contains("starting"), "{first}");
    assert!(!first.contains('\x1b'), "{first:?}");
    child.kill().await.unwrap();
}

/// Issue 10, Must 14: on a terminal `harvest` shows each source as it
/// finishes (not everything at the end), and a source that timed out says
/// after how many attempts; piped, only the table is printed.
#[tokio::test]
async fn harvest_shows_each_source_as_it_finishes_on_a_terminal() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![
        ("/fast", Reply::ok("10.0.0.1:80\n")),
        ("/hang", Reply::hang()),
    ])
    .await;
    let sources = format!(
        "[[sources]]\nname = \"fast\"\nurl = \"{}\"\n[[sources]]\nname = \"hang\"\nurl = \"{}\"\n",
        site.url("/fast"),
        site.url("/hang")
    );
    // timeout 2s, retries 1: the hanging source takes about 4 s.
    write_config(dir.path(), &config_toml(dir.path(), &sources));

    // Piped: the table only, and the timeout says how often it was tried.
    let out = proxywarden(dir.path(), &["harvest"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("[1/2]"), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("timed out after 2 attempts"),
        "{}",
        stdout(&out)
    );

    // On a terminal (script(1) gives the command a pseudo-terminal).
    let tried_before = site.hits("/hang");
    let mut child = tokio::process::Command::new("script")
        .args([
            "-qec",
            &format!("'{}' harvest", env!("CARGO_BIN_EXE_proxywarden")),
            "/dev/null",
        ])
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("script(1) from util-linux runs the command on a terminal");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), lines.next_line())
        .await
        .expect("no output within 10 s")
        .unwrap()
        .unwrap_or_default();
    // (Not new: the piped run above stored it.)
    assert!(first.contains("[1/2] fast: 1 found, 0 new in"), "{first:?}");
    // Shown as it finished: the hanging source was still on its first
    // attempt, which lasts the 2 s timeout, and the harvest still running.
    // Held back to the end, the line would come after both attempts.
    let tried = site.hits("/hang") - tried_before;
    assert!(
        tried < 2,
        "the fast source was shown only after the hanging one was tried {tried} times"
    );
    assert!(child.try_wait().unwrap().is_none(), "shown only at the end");
    let mut rest = Vec::new();
    while let Some(line) =
        tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
            .await
            .expect("harvest did not end within 20 s")
            .unwrap()
    {
        rest.push(line);
    }
    let rest = rest.join("\n");
    assert!(
        rest.contains("[2/2] hang: failed after") && rest.contains("timed out after 2 attempts"),
        "{rest}"
    );
    // While it hangs, the source is named (issue 24, Must 7), and its
    // failure is printed once: in the table, not also as a log line.
    assert!(rest.contains("still waiting after 2s for: hang"), "{rest}");
    assert_eq!(
        rest.matches("timed out after 2 attempts").count(),
        1,
        "{rest}"
    );
    assert!(!rest.contains("WARN"), "{rest}");
    assert!(child.wait().await.unwrap().success());
}

/// Issue 10, Must 14: `check` on an empty database says to harvest first
/// (instead of contacting judges to check nothing).
#[tokio::test]
async fn check_on_an_empty_database_says_to_harvest_first() {
    let dir = tempfile::tempdir().unwrap();
    common::TestConfig::new(dir.path())
        .judges("[\"http://127.0.0.1:9/judge\"]")
        .write();
    let out = proxywarden(dir.path(), &["check"]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("holds no proxies yet: run `proxywarden harvest` first"),
        "{}",
        stderr(&out)
    );
}

/// The tables and schema version of the SQLite file at `path`.
fn schema(path: &Path) -> (Vec<String>, i64) {
    let c = rusqlite::Connection::open(path).unwrap();
    let tables = c
        .prepare("SELECT name FROM sqlite_schema ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let version = c
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    (tables, version)
}

/// Issue 10, Must 7: `stats` and `export` only read: in an empty directory
/// they say there is no database yet and create none.
#[tokio::test]
async fn stats_and_export_never_create_a_database() {
    let dir = tempfile::tempdir().unwrap();
    for args in [&["stats"][..], &["export"], &["export", "--status", "all"]] {
        let out = proxywarden(dir.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("there is no database at proxywarden.db yet"),
            "{args:?}: {}",
            stderr(&out)
        );
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
}

/// Issue 10, Must 7: a SQLite file of another application (or no SQLite at
/// all) is refused by every command and left exactly as it was.
#[tokio::test]
async fn another_applications_database_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("list.txt");
    std::fs::write(&list, "10.0.0.1:8080\n").unwrap();
    write_config(
        dir.path(),
        &config_toml(
            dir.path(),
            &format!("[[sources]]\nname = \"l\"\nurl = \"{}\"\n", list.display()),
        ),
    );
    let db = dir.path().join("test.db");
    {
        let c = rusqlite::Connection::open(&db).unwrap();
        c.execute_batch("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT); INSERT INTO users (name) VALUES ('ann');")
            .unwrap();
    }
    let before = schema(&db);
    for args in [
        &["stats"][..],
        &["export"],
        &["harvest"],
        &["check"],
        &["purge"],
    ] {
        let out = proxywarden(dir.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("is not a proxywarden database")
                && err.contains("tables that are not proxywarden's: users"),
            "{args:?}: {err}"
        );
        assert_eq!(schema(&db), before, "{args:?} changed the file");
    }
    std::fs::write(&db, "name,age\nann,3\n").unwrap();
    for args in [&["stats"][..], &["harvest"]] {
        let out = proxywarden(dir.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("not a SQLite file"),
            "{}",
            stderr(&out)
        );
        assert_eq!(std::fs::read(&db).unwrap(), b"name,age\nann,3\n");
    }
}

/// Runs the binary as a user that the file modes apply to: as is when not
/// root, else as `nobody` through `setpriv`. `None` when neither is possible.
async fn proxywarden_unprivileged(dir: &Path, args: &[&str]) -> Option<Output> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let root = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"));
    let mut cmd = if root {
        let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
            .into_iter()
            .find(|p| Path::new(p).exists())?;
        let mut c = tokio::process::Command::new(setpriv);
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_proxywarden"));
        c
    } else {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
    };
    let out = cmd
        .args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .output()
        .await
        .unwrap();
    Some(out)
}

/// Issue 10, Must 7: on a database this user may not write, `serve` and
/// `check` stop at start saying "permission denied" (once, not SQLite's
/// "Error code 14" twice), and `stats` and `export` read it as it is; a
/// missing directory is named as such.
#[cfg(unix)]
#[tokio::test]
async fn an_unwritable_database_is_named_plainly_and_still_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    let config = |db: &str| {
        common::TestConfig::new(dir.path())
            .db(db)
            .set("api", "listen", "\"127.0.0.1:0\"")
            .write();
    };
    config("ro/test.db");
    store_with(&ro, &["10.0.0.1:8080", "10.0.0.2:3128"]).await;
    // The writer is gone; fold the WAL in so that the file alone holds all.
    rusqlite::Connection::open(ro.join("test.db"))
        .unwrap()
        .execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    for f in std::fs::read_dir(&ro).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e != "db") {
            std::fs::remove_file(f).unwrap();
        }
    }
    for (path, mode) in [
        (dir.path(), 0o755),
        (&ro, 0o555),
        (&ro.join("test.db"), 0o444),
    ] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for args in [&["check"][..], &["serve"], &["harvest"]] {
        let Some(out) = proxywarden_unprivileged(dir.path(), args).await else {
            eprintln!("skipped: running as root without setpriv");
            return;
        };
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("permission denied"), "{args:?}: {err}");
        assert!(!err.contains("code 14"), "{args:?}: {err}");
        assert_eq!(err.matches("cannot open database").count(), 1, "{err}");
    }
    let out = proxywarden_unprivileged(dir.path(), &["stats", "--json"])
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["total"], 2);
    let out = proxywarden_unprivileged(dir.path(), &["export", "--status", "all"])
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).lines().count(), 2, "{}", stdout(&out));
    // Nothing was created beside the file.
    assert_eq!(std::fs::read_dir(&ro).unwrap().count(), 1);

    // A writable directory and a read-only file.
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = proxywarden_unprivileged(dir.path(), &["check"])
        .await
        .unwrap();
    assert!(
        stderr(&out).contains("permission denied"),
        "{}",
        stderr(&out)
    );

    config("gone/test.db");
    for args in [&["check"][..], &["serve"]] {
        let out = proxywarden(dir.path(), args).await;
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("directory does not exist"), "{args:?}: {err}");
        assert_eq!(err.matches("does not exist").count(), 1, "{err}");
    }
}

/// Issue 10, Must 13: `serve` with no source working says so in one log
/// line naming each source and why, answers `/proxy` with a 404 that says
/// no sources worked, tries the failed sources again with backoff well
/// before the next scheduled harvest (here a year away), and then says
/// nothing was checked yet (the judge is unreachable).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_says_no_source_worked_and_retries_failed_sources() {
    use tokio::io::AsyncBufReadExt;
    let site = Site::start(SiteOpts::flaky(
        "/list.txt",
        4,
        0,
        Reply::ok("10.0.0.1:8080\n10.0.0.2:8080\n"),
    ))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    common::TestConfig::new(dir.path())
        .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
        .set("harvest", "schedule", "\"0 0 0 1 1 *\"")
        .set("harvest", "failed_retry", "\"1s\"")
        .judges("[\"http://127.0.0.1:9/judge\"]")
        .source("flaky", &site.url("/list.txt"), "")
        .source("refusing", "http://127.0.0.1:9/list.txt", "")
        .write();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .arg("serve")
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut logs = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (before, line) = common::within(async {
        let mut before = Vec::new();
        while let Some(line) = logs.next_line().await.unwrap() {
            if line.contains("no source worked") {
                return (before, line);
            }
            before.push(line);
        }
        panic!("serve ended without saying no source worked");
    })
    .await;
    // One line names the sources, says when they are tried again and how
    // sources are configured; each source's error has a line of its own.
    for needle in [
        "flaky",
        "refusing",
        "retry_in=1s",
        "[[sources]]",
        "config example",
    ] {
        assert!(line.contains(needle), "{needle:?} not in {line}");
    }
    assert!(
        line.len() < 700,
        "a line of {} characters: {line}",
        line.len()
    );
    for (source, error) in [("flaky", "503"), ("refusing", "refused")] {
        let said: Vec<&String> = before
            .iter()
            .filter(|l| l.contains(&format!("source={source} ")))
            .collect();
        assert_eq!(said.len(), 1, "{source}'s error said once: {before:#?}");
        assert!(said[0].contains(error), "{error:?} not in {}", said[0]);
    }
    // Keep reading the log so the daemon never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = logs.next_line().await {} });

    let tls =
        proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H2_H1).unwrap();
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(std::sync::Arc::unwrap_or_clone(tls))
        .no_proxy()
        .build()
        .unwrap();
    let get = |path: &str| {
        let request = http.get(format!("http://127.0.0.1:{port}{path}"));
        async move { request.send().await.unwrap() }
    };
    let resp = get("/proxy").await;
    assert_eq!(resp.status().as_u16(), 404);
    let body: serde_json::Value = resp.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no sources worked"), "{message}");

    // Retried after 1 s and 2 s: the third harvest gets the list.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stats: serde_json::Value = get("/stats").await.json().await.unwrap();
        if stats["total"] == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never harvested: {stats}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(site.hits("/list.txt"), 5);
    let resp = get("/proxy?format=text").await;
    assert_eq!(resp.status().as_u16(), 404);
    let text = resp.text().await.unwrap();
    assert!(text.contains("nothing checked yet"), "{text}");
    child.kill().await.unwrap();
}

#[tokio::test]
async fn completions_and_the_manual_page_are_printed() {
    let dir = tempfile::tempdir().unwrap();
    let out = proxywarden(dir.path(), &["completions", "bash"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let script = stdout(&out);
    assert!(script.contains("_proxywarden()"), "{script}");
    // It is a script bash reads without a syntax error.
    let path = dir.path().join("proxywarden.bash");
    std::fs::write(&path, &script).unwrap();
    let checked = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .unwrap();
    assert!(checked.status.success(), "{checked:?}");
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let out = proxywarden(dir.path(), &["completions", shell]).await;
        assert!(out.status.success() && !out.stdout.is_empty(), "{shell}");
    }
    let out = proxywarden(dir.path(), &["completions", "tcsh"]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("possible values"), "{}", stderr(&out));

    let out = proxywarden(dir.path(), &["man"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let page = stdout(&out);
    assert!(page.contains(".TH proxywarden 1"), "{page}");
    for command in [
        "serve",
        "harvest",
        "check",
        "export",
        "crawl",
        "completions",
        "config check",
        "config example",
        "man",
    ] {
        // Each command is a subsection of this one page.
        assert!(
            page.contains(&format!(".SS \"proxywarden {command}\"")),
            "{command} missing from the manual page"
        );
    }
    // It sends the reader to no page that is not installed: the only
    // page is proxywarden(1) itself.
    let refs: Vec<&str> = page
        .match_indices("(1)")
        .map(|(at, _)| {
            let start = page[..at]
                .rfind(|c: char| c.is_whitespace() || c == '"')
                .map_or(0, |i| i + 1);
            &page[start..at]
        })
        .filter(|name| *name != "proxywarden")
        .collect();
    assert!(refs.is_empty(), "pages named but not installed: {refs:?}");
}

/// Runs the binary with `input` on stdin.
async fn proxywarden_stdin(dir: &Path, args: &[&str], input: &str) -> Output {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(args)
        .current_dir(dir)
        .env_remove("PROXYWARDEN_CONFIG")
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).await.unwrap();
    drop(stdin);
    child.wait_with_output().await.unwrap()
}

/// Issue 24, Must 6: `check --list FILE` with no config checks a list
/// given by hand (loopback addresses included, as the user gave them)
/// against the judge named on the command line and prints the working
/// proxies with the daemon's verdicts; bad lines are counted, not fatal;
/// nothing is stored without `--store`.
#[tokio::test]
async fn check_list_prints_the_working_proxies_with_their_verdicts() {
    use common::fakes::{self, FakeHttpProxy, FakeSocks5, HttpProxyOpts, ProxyKind, SocksOpts};
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let elite = fakes::http_proxy(2).await;
    let transparent = FakeHttpProxy::start(HttpProxyOpts {
        kind: ProxyKind::Transparent,
        upstream_bind: Some(fakes::ip(3)),
        ..HttpProxyOpts::default()
    })
    .await;
    let socks = FakeSocks5::start(SocksOpts {
        upstream_bind: Some(fakes::ip(4)),
        ..SocksOpts::default()
    })
    .await;
    let closed = fakes::closed_port();
    let list = format!(
        "# from a forum\nhttp://{}\n{}\n\nhttp://{}\nnot a proxy at all\n{} \n",
        elite.addr(),
        socks.addr(),
        transparent.addr(),
        closed.addr(),
    );
    std::fs::write(dir.path().join("list.txt"), &list).unwrap();
    let out = proxywarden(
        dir.path(),
        &[
            "check",
            "--list",
            "list.txt",
            "--judge",
            &judge.url(),
            "--format",
            "json",
            "--timeout",
            "2s",
            "--connect-timeout",
            "1s",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON on stdout");
    let rows = rows.as_array().unwrap();
    let by_url = |url: &str| {
        rows.iter()
            .find(|r| r["url"] == url)
            .unwrap_or_else(|| panic!("{url} not in {rows:?}"))
    };
    let e = by_url(&format!("http://{}", elite.addr()));
    assert_eq!(e["anonymity"], "elite");
    assert_eq!(e["exit_ip"], "127.0.0.2");
    assert!(e["latency_ms"].is_u64());
    assert_eq!(
        by_url(&format!("http://{}", transparent.addr()))["anonymity"],
        "transparent"
    );
    // No scheme in the list and no --scheme: detected.
    let s = by_url(&format!("socks5://{}", socks.addr()));
    assert_eq!(s["scheme"], "socks5");
    assert_eq!(rows.len(), 3, "{rows:?}");
    let err = stderr(&out);
    assert!(
        err.contains("checked 4 proxies in") && err.contains("3 working, 1 dead"),
        "{err}"
    );
    assert!(
        err.contains("1 line without a proxy skipped: line 6: \"not a proxy at all\""),
        "{err}"
    );
    // Piped: no progress lines.
    assert!(!err.contains("alive,"), "{err}");
    assert!(!dir.path().join("proxywarden.db").exists());

    // From stdin, as txt, with --scheme for entries without one.
    let out = proxywarden_stdin(
        dir.path(),
        &[
            "check",
            "--list",
            "-",
            "--scheme",
            "http",
            "--judge",
            &judge.url(),
        ],
        &format!("{}\n{}\n", elite.addr(), transparent.addr()),
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let mut lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    lines.sort();
    let mut want = vec![
        format!("http://{}", elite.addr()),
        format!("http://{}", transparent.addr()),
    ];
    want.sort();
    assert_eq!(lines, want);

    // A list with nothing in it is an error that says so.
    std::fs::write(dir.path().join("empty.txt"), "hello\nworld\n").unwrap();
    let out = proxywarden(
        dir.path(),
        &["check", "--list", "empty.txt", "--judge", &judge.url()],
    )
    .await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("no proxy found in empty.txt (2 lines without a proxy skipped"),
        "{}",
        stderr(&out)
    );
    let out = proxywarden(
        dir.path(),
        &["check", "--list", "missing.txt", "--judge", &judge.url()],
    )
    .await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("cannot open the list missing.txt"),
        "{}",
        stderr(&out)
    );
    let out = proxywarden(
        dir.path(),
        &["check", "--list", "list.txt", "--judge", "ftp://x/"],
    )
    .await;
    assert!(
        stderr(&out).contains("--judge \"ftp://x/\": expected an http(s) URL"),
        "{}",
        stderr(&out)
    );
}

/// Issue 24, Must 6: `check --list --store` adds the working proxies, with
/// their verdicts, to the database; CSV has a header and the verdicts.
#[tokio::test]
async fn check_list_store_adds_the_working_proxies_to_the_database() {
    use common::fakes;
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let elite = fakes::http_proxy(2).await;
    let closed = fakes::closed_port();
    let list = format!("{}\n{}\n", elite.addr(), closed.addr());
    std::fs::write(dir.path().join("mine.txt"), &list).unwrap();
    let out = proxywarden(
        dir.path(),
        &[
            "check",
            "--list",
            "mine.txt",
            "--scheme",
            "http",
            "--judge",
            &judge.url(),
            "--format",
            "csv",
            "--store",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let csv = stdout(&out);
    let mut lines = csv.lines();
    assert_eq!(
        lines.next(),
        Some("url,scheme,host,port,anonymity,https,latency_ms,country,exit_ip")
    );
    let row = lines.next().unwrap();
    assert!(
        row.starts_with(&format!(
            "http://{},http,127.0.0.1,{},elite,",
            elite.addr(),
            elite.addr().port()
        )),
        "{row}"
    );
    assert_eq!(lines.next(), None);
    assert!(
        stderr(&out).contains("stored 1 working proxies (1 new)"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("as source list:mine.txt"));

    let out = proxywarden(dir.path(), &["export", "--format", "json"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["url"], format!("http://{}", elite.addr()));
    assert_eq!(rows[0]["status"], "alive");
    assert_eq!(rows[0]["anonymity"], "elite");
    assert_eq!(rows[0]["sources"][0], "list:mine.txt");
}

/// SIGTERM to a running `proxywarden` child.
fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().unwrap();
    // The shell's built-in kill: a /bin/kill may not be installed.
    let kill = std::process::Command::new("sh")
        .args(["-c", &format!("kill -TERM {pid}")])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// Waits until `proxy` has received a request: the checks are in flight.
async fn until_asked(proxy: &common::fakes::FakeHttpProxy) {
    let asked = || async { proxy.requests() > 0 };
    common::until("the proxy asked", std::time::Duration::from_secs(20), asked).await;
}

/// Issue 24, Must 7: `check --list` and `check` end with status 130 and say
/// "(interrupted)" on SIGTERM, even when every check was already in flight.
#[tokio::test]
async fn check_exits_130_on_sigterm_with_every_check_in_flight() {
    use common::fakes::{Behavior as ProxyBehavior, FakeHttpProxy, HttpProxyOpts};
    let dir = tempfile::tempdir().unwrap();
    let judge = common::judges::Judge::plain().await;
    let hang = FakeHttpProxy::start(HttpProxyOpts {
        behavior: ProxyBehavior::Hang,
        ..HttpProxyOpts::default()
    })
    .await;
    std::fs::write(
        dir.path().join("l.txt"),
        format!("http://{}\n", hang.addr()),
    )
    .unwrap();
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args([
            "check",
            "--list",
            "l.txt",
            "--judge",
            &judge.url(),
            "--timeout",
            "3s",
        ])
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    until_asked(&hang).await;
    sigterm(&child);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stderr(&out).contains("(interrupted)"), "{}", stderr(&out));

    // The stored proxies' check, concurrency far above what is due.
    let hang2 = FakeHttpProxy::start(HttpProxyOpts {
        behavior: ProxyBehavior::Hang,
        ..HttpProxyOpts::default()
    })
    .await;
    common::TestConfig::new(dir.path())
        .judges(&format!("[\"{}\"]", judge.url()))
        .set("check", "timeout", "\"3s\"")
        .write();
    store_with(dir.path(), &[&hang2.addr().to_string()]).await;
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .args(["check", "--concurrency", "64"])
        .current_dir(dir.path())
        .env_remove("PROXYWARDEN_CONFIG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    until_asked(&hang2).await;
    sigterm(&child);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    assert!(stdout(&out).contains("(interrupted)"), "{}", stdout(&out));
}

/// Issue 24, Must 7: the package states its licence (MIT OR Apache-2.0, with
/// both texts beside it) and what it is; the installed binary carries no
/// full debug information while benchmarks keep line tables.
#[test]
fn the_package_states_its_licence_and_installs_lean() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table = std::fs::read_to_string(root.join("Cargo.toml"))
        .unwrap()
        .parse()
        .unwrap();
    let package = manifest["package"].as_table().unwrap();
    assert_eq!(package["license"].as_str(), Some("MIT OR Apache-2.0"));
    assert!(!package["description"].as_str().unwrap().is_empty());
    let mit = std::fs::read_to_string(root.join("LICENSE-MIT")).unwrap();
    assert!(mit.contains("Permission is hereby granted, free of charge"));
    let apache = std::fs::read_to_string(root.join("LICENSE-APACHE")).unwrap();
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0"));
    let profiles = manifest["profile"].as_table().unwrap();
    let release = profiles["release"].as_table().unwrap();
    assert_eq!(release["debug"].as_bool(), Some(false));
    assert_eq!(release["strip"].as_str(), Some("debuginfo"));
    assert_eq!(
        profiles["bench"]["debug"].as_str(),
        Some("line-tables-only")
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    assert!(readme.contains("cargo install --path ."));
}

/// Issue 24, Must 7: the crawler's User-Agent names no address that is not
/// the project's (it named a GitHub page that does not exist).
#[tokio::test]
async fn the_crawler_user_agent_names_no_made_up_address() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![("/", Reply::ok("<html>hi</html>"))]).await;
    let out = proxywarden(
        dir.path(),
        &[
            "crawl",
            &site.url("/"),
            "--direct",
            "--ignore-robots",
            "--max-pages",
            "1",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let ua = site.last_header("/", "user-agent").unwrap();
    assert_eq!(ua, format!("proxywarden/{}", env!("CARGO_PKG_VERSION")));
}

/// Issue 24, Must 7: `config check` reports the files a config names
/// together with the mistakes in its text, suggests the nearest key for an
/// unknown one and words duration errors plainly; `[[extra_sources]]` adds
/// to the built-in sources instead of replacing them.
#[tokio::test]
async fn config_check_reports_everything_at_once_in_plain_words() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        "[check]\njudge = [\"http://127.0.0.1:9/\"]\nextra_ca_file = \"missing-ca.pem\"\n\
         timeout = \"5 minuts\"\nconnect_timeout = \"2\"\n\
         [[extra_sources]]\nname = \"mine\"\nurl = \"./nope.txt\"\n",
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "bad.toml"]).await;
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    for needle in [
        "bad.toml: 5 problems",
        "check.judge: unknown key (did you mean `judges`?)",
        "check.timeout: \"5 minuts\" has an unknown unit \"minuts\": use ms, s, m, h or d",
        "check.connect_timeout: \"2\" has no unit: write \"2s\" for seconds",
        "check.extra_ca_file: cannot read missing-ca.pem",
        "extra_sources[0].url: cannot read ./nope.txt",
    ] {
        assert!(err.contains(needle), "{needle:?} not in {err}");
    }
    assert!(!err.contains(" at "), "parser jargon: {err}");

    std::fs::write(dir.path().join("list.txt"), "1.2.3.4:80\n").unwrap();
    std::fs::write(
        dir.path().join("add.toml"),
        "[[extra_sources]]\nname = \"mine\"\nurl = \"./list.txt\"\n",
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "add.toml"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("add.toml: ok (20 sources, 20 enabled;"),
        "{}",
        stdout(&out)
    );
    // A name already taken by a built-in source is refused.
    std::fs::write(
        dir.path().join("dup.toml"),
        "[[extra_sources]]\nname = \"proxifly\"\nurl = \"./list.txt\"\n",
    )
    .unwrap();
    let out = proxywarden(dir.path(), &["config", "check", "-c", "dup.toml"]).await;
    assert!(
        stderr(&out).contains("extra_sources[0].name: duplicate source name \"proxifly\""),
        "{}",
        stderr(&out)
    );
}

/// Issue 24, Must 7: an HTML source whose page has no proxy table says what
/// was looked for, and a page with an unclosed `<title>` still yields its
/// rows.
#[tokio::test]
async fn html_sources_say_what_they_looked_for() {
    let dir = tempfile::tempdir().unwrap();
    let table = "<table><tr><th>IP Address</th><th>Port</th></tr>\
                 <tr><td>10.1.2.3</td><td>8080</td></tr></table>";
    let site = Site::routes(vec![
        (
            "/other.html",
            Reply::ok("<table><tr><th>Name</th><th>Speed</th></tr></table>"),
        ),
        (
            "/title.html",
            Reply::ok(format!("<html><head><title>Proxies</head><body>{table}")),
        ),
    ])
    .await;
    let sources = format!(
        "[[sources]]\nname = \"other\"\nurl = \"{}\"\nformat = \"html\"\n\
         [[sources]]\nname = \"title\"\nurl = \"{}\"\nformat = \"html\"\n",
        site.url("/other.html"),
        site.url("/title.html")
    );
    write_config(dir.path(), &config_toml(dir.path(), &sources));
    let out = proxywarden(dir.path(), &["harvest"]).await;
    let table_out = stdout(&out);
    let other = table_out
        .lines()
        .find(|l| l.starts_with("other"))
        .unwrap_or_else(|| panic!("{table_out}"));
    assert!(
        other.contains("no table with IP and Port columns")
            && other.contains("\"Name\", \"Speed\"")
            && other.contains("try format = \"text\""),
        "{other}"
    );
    let title = table_out
        .lines()
        .find(|l| l.starts_with("title"))
        .unwrap_or_else(|| panic!("{table_out}"));
    assert!(
        title.split_whitespace().nth(1) == Some("1"),
        "one proxy found: {title}"
    );
}

/// Issue 24, Must 6: `check --list` gives the verdicts the daemon records:
/// the exit country from the configured GeoIP database and HTTPS support
/// from a TLS judge (one proxy tunnels, one refuses CONNECT).
#[tokio::test]
async fn check_list_gives_country_and_https_as_the_daemon_does() {
    use common::fakes::{self, FakeHttpProxy, HttpProxyOpts};
    use std::collections::HashMap;
    let dir = tempfile::tempdir().unwrap();
    // The judge reports the proxies' exit (127.0.0.2) as a GB test address.
    let judge = common::judges::Judge::httpbin(HashMap::from([(
        fakes::ip(2),
        "81.2.69.160".parse().unwrap(),
    )]))
    .await;
    let tls_judge = common::judges::Judge::tls(dir.path()).await;
    let tunnels = fakes::http_proxy(2).await;
    let plain_only = FakeHttpProxy::start(HttpProxyOpts {
        connect: false,
        upstream_bind: Some(fakes::ip(2)),
        ..HttpProxyOpts::default()
    })
    .await;
    let geoip = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/geoip/GeoLite2-Country-Test.mmdb");
    std::fs::write(
        dir.path().join("c.toml"),
        format!(
            "[check]\nextra_ca_file = \"{}\"\n[geoip]\ndatabase = \"{}\"\n",
            tls_judge.ca_file().display(),
            geoip.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("l.txt"),
        format!("{}\n{}\n", tunnels.addr(), plain_only.addr()),
    )
    .unwrap();
    let out = proxywarden(
        dir.path(),
        &[
            "check",
            "-c",
            "c.toml",
            "--list",
            "l.txt",
            "--scheme",
            "http",
            "--judge",
            &judge.url(),
            "--judge",
            &tls_judge.url(),
            "--format",
            "json",
        ],
    )
    .await;
    assert!(out.status.success(), "{}", stderr(&out));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    let row = |addr: std::net::SocketAddr| {
        rows.as_array()
            .unwrap()
            .iter()
            .find(|r| r["url"] == format!("http://{addr}"))
            .unwrap_or_else(|| panic!("{addr} not in {rows}"))
            .clone()
    };
    let t = row(tunnels.addr());
    assert_eq!(t["country"], "GB", "{t}");
    assert_eq!(t["exit_ip"], "81.2.69.160", "{t}");
    assert_eq!(t["anonymity"], "elite", "{t}");
    assert_eq!(t["https"], true, "{t}");
    assert_eq!(row(plain_only.addr())["https"], false);
}

/// `--version` names the commit the binary was built from: the one
/// checked out here when the build read it from git (not from
/// `PROXYWARDEN_COMMIT`, and not outside a checkout).
#[tokio::test]
async fn version_names_the_commit_the_binary_was_built_from() {
    let dir = tempfile::tempdir().unwrap();
    let out = proxywarden(dir.path(), &["--version"]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let built = env!("PROXYWARDEN_COMMIT");
    assert_eq!(
        stdout(&out).trim(),
        format!("proxywarden {} ({built})", env!("CARGO_PKG_VERSION"))
    );
    if env!("PROXYWARDEN_COMMIT_FROM") != "git" {
        return;
    }
    let head = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&head.stdout).trim().to_owned();
    assert_eq!(built, head, "the binary names another commit than HEAD");
}
