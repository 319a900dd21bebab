//! The built binary run as people run it, for the benches that measure the
//! whole service in its own process.

use std::path::Path;
use std::process::{Output, Stdio};

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
