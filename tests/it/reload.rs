//! `kill -HUP` (`systemctl reload`) on the real `serve`: the config file is
//! read again, a source it adds is harvested and a judge it changes is
//! asked, without dropping a connection to the API or a tunnel through the
//! gateway; a file with errors is refused with every error in the log and
//! the daemon keeps serving on what it runs.

#![cfg(unix)]

use crate::common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use common::fakes::{EchoServer, http_proxy};
use common::judges::Judge;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BIN: &str = env!("CARGO_BIN_EXE_proxywarden");

/// A text source named `name` listing `proxy`.
fn source(dir: &Path, name: &str, proxy: SocketAddr) -> String {
    let path = dir.join(format!("{name}.txt"));
    std::fs::write(&path, format!("http://{proxy}\n")).unwrap();
    format!(
        "[[sources]]\nname = \"{name}\"\nurl = \"{}\"\nformat = \"text\"\n",
        path.display()
    )
}

/// The config: the API and the gateway on their ports, `judge`, `sources`.
fn config(dir: &Path, api: u16, gateway: u16, judge: &str, sources: &str) -> String {
    common::TestConfig::new(dir)
        .db("daemon.db")
        .set("api", "listen", &format!("\"127.0.0.1:{api}\""))
        .set("gateway", "enabled", "true")
        .set("gateway", "listen", &format!("\"127.0.0.1:{gateway}\""))
        .set("check", "https", "false")
        .judges(&format!("[\"{judge}\"]"))
        .sources_toml(sources)
        .toml()
}

fn hang_up(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// `GET /healthz` on a kept-alive connection: the status line.
async fn healthz(conn: &mut TcpStream) -> String {
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // The answer is small JSON: its head and body come together, and end
    // with the closing brace.
    while !got.ends_with(b"}") {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "the API closed a kept-alive connection");
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    text.lines().next().unwrap_or_default().to_owned()
}

async fn servable(http: &reqwest::Client, api: u16) -> u64 {
    let stats: serde_json::Value = http
        .get(format!("http://127.0.0.1:{api}/stats"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    stats["servable"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_sources_and_judges_keeps_connections_and_refuses_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    // Both tunnel (CONNECT), forwarding from 127.0.0.2.
    let (one, two) = (http_proxy(2).await, http_proxy(2).await);
    let (first_judge, second_judge) = (Judge::plain().await, Judge::plain().await);
    let echo = EchoServer::start().await;
    let (api, gateway) = (common::free_port(), common::free_port());
    let first = source(dir.path(), "one", one.addr());
    let path = common::write_config(
        dir.path(),
        &config(dir.path(), api, gateway, &first_judge.url(), &first),
    );
    let log = dir.path().join("serve.log");
    let (mut child, pid) = common::binary::spawn_serve(BIN, &path, &log).unwrap();
    common::binary::wait_healthy(
        &mut child,
        format!("127.0.0.1:{api}"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let http = common::daemon::client(Duration::from_secs(10));
    common::until(
        "the first source's proxy served",
        Duration::from_secs(30),
        || async { servable(&http, api).await == 1 },
    )
    .await;

    // A kept-alive API connection and a tunnel through the gateway.
    let mut conn = TcpStream::connect(("127.0.0.1", api)).await.unwrap();
    assert!(healthz(&mut conn).await.starts_with("HTTP/1.1 200"));
    let mut tunnel = TcpStream::connect(("127.0.0.1", gateway)).await.unwrap();
    let connect = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\n", echo.addr());
    tunnel.write_all(connect.as_bytes()).await.unwrap();
    let mut buf = [0u8; 256];
    let n = tunnel.read(&mut buf).await.unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&buf[..n])
    );

    // A source added, the judge changed.
    let asked_before = second_judge.requests();
    let both = format!("{first}{}", source(dir.path(), "two", two.addr()));
    std::fs::write(
        &path,
        config(dir.path(), api, gateway, &second_judge.url(), &both),
    )
    .unwrap();
    hang_up(pid);
    common::until(
        "the added source's proxy served",
        Duration::from_secs(30),
        || async { servable(&http, api).await == 2 },
    )
    .await;
    assert!(
        second_judge.requests() > asked_before,
        "the new judge was never asked"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("config reloaded") && text.contains("sources (added: two)"),
        "{text}"
    );
    assert!(text.contains("check.judges"), "{text}");
    assert!(healthz(&mut conn).await.starts_with("HTTP/1.1 200"));
    tunnel.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    tunnel.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"ping", "the tunnel carries data after the reload");

    // A file with errors: refused, each error logged, the daemon serves on.
    std::fs::write(
        &path,
        "[check]\nconcurrency = \"many\"\ntimeout = \"soon\"\n[api]\nlisten = 5\n",
    )
    .unwrap();
    hang_up(pid);
    common::until("the refusal logged", Duration::from_secs(10), || async {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("config reload refused")
    })
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    for key in ["check.concurrency", "check.timeout", "api.listen"] {
        assert!(text.contains(key), "{key} not in the log: {text}");
    }
    assert!(child.try_wait().unwrap().is_none(), "serve exited");
    assert!(healthz(&mut conn).await.starts_with("HTTP/1.1 200"));
    assert_eq!(servable(&http, api).await, 2);

    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = common::within(child.wait()).await.unwrap();
    assert!(exit.success(), "{exit}");
}

/// `log.level` is in force from the start, and a reload changes it: at
/// `warn` the daemon says nothing of its rounds; reloaded at `info`, it
/// does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_the_log_level() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let (api, gateway) = (common::free_port(), common::free_port());
    let proxy = http_proxy(2).await;
    let sources = source(dir.path(), "one", proxy.addr());
    let at = |level: &str| {
        format!(
            "{}[log]\nlevel = \"{level}\"\n",
            config(dir.path(), api, gateway, &judge.url(), &sources)
        )
    };
    let path = common::write_config(dir.path(), &at("warn"));
    let log = dir.path().join("serve.log");
    let file = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(BIN)
        .arg("-c")
        .arg(&path)
        .arg("serve")
        .env_remove("RUST_LOG")
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let pid = child.id().unwrap();
    common::binary::wait_healthy(
        &mut child,
        format!("127.0.0.1:{api}"),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    let http = common::daemon::client(Duration::from_secs(10));
    common::until("the proxy served", Duration::from_secs(30), || async {
        servable(&http, api).await == 1
    })
    .await;
    let quiet = std::fs::read_to_string(&log).unwrap();
    assert!(!quiet.contains(" INFO "), "info lines at warn: {quiet}");

    std::fs::write(&path, at("info")).unwrap();
    hang_up(pid);
    common::until(
        "info lines after the reload",
        Duration::from_secs(10),
        || async {
            std::fs::read_to_string(&log)
                .unwrap()
                .contains("config reloaded")
        },
    )
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("log.level (info)"), "{text}");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = common::within(child.wait()).await.unwrap();
    assert!(exit.success(), "{exit}");
}
