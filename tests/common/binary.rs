//! The built binary run as people run it, for the benches that measure the
//! whole service in its own process.

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::process::{Child, Command};

/// Runs `bin -c config args…` to the end; its output.
pub async fn run(bin: &str, config: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Command::new(bin)
        .arg("-c")
        .arg(config)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("run {bin}"))
}

/// Starts `bin -c config serve` with its log (stdout and stderr) in `log`;
/// the process, killed when dropped, and its pid.
pub fn spawn_serve(bin: &str, config: &Path, log: &Path) -> anyhow::Result<(Child, u32)> {
    let log = std::fs::File::create(log)?;
    let daemon = Command::new(bin)
        .arg("-c")
        .arg(config)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {bin} serve"))?;
    let pid = daemon.id().context("the daemon exited at once")?;
    Ok((daemon, pid))
}

/// Waits until `daemon` answers `GET http://{api}/healthz` with a success,
/// for at most `within`; how long that took. An error when the process
/// exits first or the time runs out.
pub async fn wait_healthy(
    daemon: &mut Child,
    api: impl std::fmt::Display,
    within: Duration,
) -> anyhow::Result<Duration> {
    let http = super::daemon::client(within);
    let up = Instant::now();
    loop {
        if let Ok(r) = http.get(format!("http://{api}/healthz")).send().await
            && r.status().is_success()
        {
            return Ok(up.elapsed());
        }
        if let Some(status) = daemon.try_wait()? {
            anyhow::bail!("serve exited with {status}");
        }
        anyhow::ensure!(
            up.elapsed() < within,
            "serve did not answer /healthz within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// This binary started again in another role (`args`, e.g. the farm of
/// fake servers a bench keeps out of its measured process), killed when
/// dropped; its stdin (the role ends when it closes) and the lines of its
/// stdout (how it says where it listens).
pub fn spawn_role(
    args: &[&str],
) -> anyhow::Result<(
    Child,
    tokio::process::ChildStdin,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
)> {
    use tokio::io::AsyncBufReadExt;
    let mut child = Command::new(std::env::current_exe()?)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start this bench as {args:?}"))?;
    let stdin = child.stdin.take().context("piped stdin")?;
    let stdout = child.stdout.take().context("piped stdout")?;
    Ok((child, stdin, tokio::io::BufReader::new(stdout).lines()))
}
