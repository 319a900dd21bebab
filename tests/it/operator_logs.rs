//! What `serve` tells its operator at the default level (INFO), read from
//! its log as journald would: a line per check round, nothing about
//! migrations, no error while sources work, no judge warnings with nothing
//! to check, what the last harvest found after a restart and when the next
//! runs, and the judges answering again.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fakes;
use common::judges::Judge;
use common::{TestConfig, within};
use tokio::io::AsyncBufReadExt;
use tokio::sync::mpsc;

/// A `serve` child whose log lines arrive on a channel.
struct Serve {
    child: tokio::process::Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    seen: Vec<String>,
    port: u16,
}

impl Serve {
    /// Starts `serve` in `dir` with the config at `config`, its API on
    /// `port`.
    fn start(dir: &Path, config: &Path, port: u16) -> Serve {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
            .arg("serve")
            .arg("-c")
            .arg(config)
            .current_dir(dir)
            .env_remove("PROXYWARDEN_CONFIG")
            .env_remove("RUST_LOG")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok(Some(line)) = out.next_line().await {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Serve {
            child,
            lines,
            seen: Vec::new(),
            port,
        }
    }

    /// The first line from now on containing `needle`.
    async fn line(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = self.lines.recv().await {
                self.seen.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        })
        .await;
        match found {
            Ok(Some(line)) => line,
            _ => panic!("no {needle:?} in the log:\n{}", self.seen.join("\n")),
        }
    }

    /// The first line containing `needle`, among those read already or
    /// from now on: for lines whose order the daemon does not fix (a
    /// check round may end before or after the harvest that fed it).
    async fn line_anywhere(&mut self, needle: &str) -> String {
        match self.seen.iter().find(|l| l.contains(needle)) {
            Some(line) => line.clone(),
            None => self.line(needle).await,
        }
    }

    /// Stops it with SIGTERM and returns the whole log.
    async fn stop(mut self) -> String {
        let pid = self.child.id().unwrap();
        let kill = std::process::Command::new("sh")
            .args(["-c", &format!("kill -TERM {pid}")])
            .status()
            .unwrap();
        assert!(kill.success());
        within(self.child.wait()).await.unwrap();
        while let Some(line) = self.lines.recv().await {
            self.seen.push(line);
        }
        self.seen.join("\n")
    }

    /// `GET path` on its API: status and JSON body.
    async fn get(&self, path: &str) -> (u16, serde_json::Value) {
        let resp = common::daemon::client(Duration::from_secs(10))
            .get(format!("http://127.0.0.1:{}{path}", self.port))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }
}

/// A config in `dir` for `serve` on `port`: sources as given, a harvest
/// schedule a year away, failed sources retried after `failed_retry`.
fn config(dir: &Path, port: u16, judges: &str, failed_retry: &str, sources: &str) -> PathBuf {
    TestConfig::new(dir)
        .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
        .set("api", "judge_per_minute", "1000000")
        .set("gateway", "listen", "\"127.0.0.1:0\"")
        .set("harvest", "schedule", "\"0 0 0 1 1 *\"")
        .set("harvest", "failed_retry", &format!("\"{failed_retry}\""))
        .set("check", "serve_recheck_min", "\"1s\"")
        .judges(judges)
        .sources_toml(sources)
        .write()
}

/// Issue 24, Must 7: with one source working and one failing, the log says
/// so as a warning (also when the failed one fails again), never "no source
/// worked"; each check round has an INFO line with what it found; the
/// database's migrations are not logged at INFO.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_tells_the_truth_while_sources_work() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let a = fakes::http_proxy(2).await;
    let b = fakes::http_proxy(3).await;
    let list = dir.path().join("list.txt");
    std::fs::write(&list, format!("{}\n{}\n", a.addr(), b.addr())).unwrap();
    let sources = format!(
        "[[sources]]\nname = \"mine\"\nurl = \"{}\"\n\
         [[sources]]\nname = \"refusing\"\nurl = \"http://127.0.0.1:9/list.txt\"\n",
        list.display()
    );
    let port = common::free_port();
    let path = config(
        dir.path(),
        port,
        &format!("[\"{}\"]", judge.url()),
        "1s",
        &sources,
    );
    let mut serve = Serve::start(dir.path(), &path, port);
    let failed = serve.line("some sources failed").await;
    assert!(
        failed.contains("WARN") && failed.contains("sources=refusing"),
        "{failed}"
    );
    assert!(failed.contains("next_harvest="), "{failed}");
    let round = serve.line_anywhere("check round finished").await;
    for needle in [" INFO ", "checked=2", "alive=2", "dead=0", "took="] {
        assert!(round.contains(needle), "{needle:?} not in {round}");
    }
    // The retry of the failed source alone fails again: still a warning.
    let again = serve.line("sources failed again").await;
    assert!(
        again.contains("WARN") && again.contains("served="),
        "{again}"
    );
    let log = serve.stop().await;
    assert!(!log.contains("no source worked"), "{log}");
    assert!(!log.contains("applied database migration"), "{log}");
    // The failure is said once: the harvest's line names the source, one
    // line gives its error.
    assert!(!log.contains("source failed"), "{log}");
    assert!(
        log.contains("cannot harvest this source source=refusing"),
        "{log}"
    );
}

/// Issue 24, Must 7: a daemon whose only source fails says "no source
/// worked" and when the next harvest runs, and, with nothing to check,
/// never warns about its (unreachable) judges. Restarted, it still answers
/// `/proxy` with "no sources worked" and says when the failed source is
/// tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_last_harvest_still_speaks() {
    let dir = tempfile::tempdir().unwrap();
    let sources = "[[sources]]\nname = \"refusing\"\nurl = \"http://127.0.0.1:9/list.txt\"\n";
    let port = common::free_port();
    let path = config(
        dir.path(),
        port,
        "[\"http://127.0.0.1:9/judge\"]",
        "1h",
        sources,
    );
    let mut serve = Serve::start(dir.path(), &path, port);
    let none = serve.line("no source worked").await;
    assert!(
        none.contains("ERROR") && none.contains("retry_in=1h"),
        "{none}"
    );
    assert!(none.contains("next_harvest="), "{none}");
    let (status, body) = serve.get("/proxy").await;
    assert_eq!(status, 404);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no sources worked"),
        "{body}"
    );
    let log = serve.stop().await;
    assert!(
        !log.contains("judge"),
        "judges mentioned with nothing to check:\n{log}"
    );
    assert!(!log.contains("cannot check"), "{log}");

    let mut serve = Serve::start(dir.path(), &path, port);
    let again = serve
        .line("sources that failed before the restart are harvested again")
        .await;
    for needle in ["refusing", "retry_in=1h", "next_harvest="] {
        assert!(again.contains(needle), "{needle:?} not in {again}");
    }
    let (status, body) = serve.get("/proxy").await;
    assert_eq!(status, 404);
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("no sources worked"), "{message}");
    assert!(!message.contains("first harvest"), "{message}");
    serve.stop().await;
}

/// Issue 24, Must 7: when the judges stop answering the log says so, and
/// says "judges answer again" when they are back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_says_when_the_judges_answer_again() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let judge_addr = judge.addr;
    let a = fakes::http_proxy(2).await;
    let list = dir.path().join("list.txt");
    std::fs::write(&list, format!("{}\n", a.addr())).unwrap();
    let sources = format!(
        "[[sources]]\nname = \"mine\"\nurl = \"{}\"\n",
        list.display()
    );
    let port = common::free_port();
    let path = config(
        dir.path(),
        port,
        &format!("[\"{}\"]", judge.url()),
        "1s",
        &sources,
    );
    let mut serve = Serve::start(dir.path(), &path, port);
    serve.line("check round finished").await;
    drop(judge);
    serve.line("cannot check").await;
    let _judge = Judge::plain_at(judge_addr).await;
    let back = serve.line("judges answer again").await;
    assert!(back.contains("INFO"), "{back}");
    serve.stop().await;
}
