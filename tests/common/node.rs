//! A `serve` process of its own on a database several nodes share, for
//! the tests and benches of several nodes: started on a config in its own
//! folder, asked over its API, killed with `kill -9`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::daemon::{client, status_json};
use super::{TestConfig, until};

/// A `serve` process of its own, on the shared database.
pub struct Node {
    child: tokio::process::Child,
    port: u16,
    /// A direct client for its API.
    pub http: reqwest::Client,
}

impl Node {
    /// `bin serve` in `dir` on the PostgreSQL database at `url`, its API
    /// on a free port, one crawl job at a time, nothing to harvest; once
    /// its API answers.
    pub async fn start(dir: &Path, url: &str, bin: &str) -> Node {
        Node::start_as(dir, url, bin, None).await
    }

    /// [`Node::start`] under `node.id` `id`, when given.
    pub async fn start_as(dir: &Path, url: &str, bin: &str, id: Option<&str>) -> Node {
        std::fs::create_dir_all(dir).unwrap();
        let port = super::free_port();
        let empty = dir.join("empty.txt");
        std::fs::write(&empty, "").unwrap();
        let config = TestConfig::new(dir)
            .set("database", "url", &format!("\"{url}\""))
            .set("api", "listen", &format!("\"127.0.0.1:{port}\""))
            .set("gateway", "listen", "\"127.0.0.1:0\"")
            .set("harvest", "schedule", "\"0 0 0 1 1 *\"")
            .set("check", "https", "false")
            .set("crawls", "max_running", "1")
            .judges(&format!(
                "[{{ url = \"http://127.0.0.1:{port}/judge\", marker = \"proxywarden-judge\" }}]"
            ))
            .source("empty", &empty.display().to_string(), "");
        let config = match id {
            Some(id) => config.set("node", "id", &format!("\"{id}\"")),
            None => config,
        };
        let config: PathBuf = config.write();
        let log = std::fs::File::create(dir.join("serve.log")).unwrap();
        let child = tokio::process::Command::new(bin)
            .arg("serve")
            .arg("-c")
            .arg(&config)
            .current_dir(dir)
            .env_remove("PROXYWARDEN_CONFIG")
            .env("RUST_LOG", "proxywarden=info")
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let node = Node {
            child,
            port,
            http: client(Duration::from_secs(30)),
        };
        until("the node answers", Duration::from_secs(30), || async {
            node.http
                .get(node.url("/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success())
        })
        .await;
        node
    }

    /// `http://127.0.0.1:port{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// `GET path`: the status and the JSON body.
    pub async fn json(&self, path: &str) -> (u16, serde_json::Value) {
        status_json(self.http.get(self.url(path)).send().await.unwrap()).await
    }

    /// `POST /crawls` with `body`: the status and the JSON answer.
    pub async fn post_crawl(&self, body: String) -> (u16, serde_json::Value) {
        let resp = self
            .http
            .post(self.url("/crawls"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        status_json(resp).await
    }

    /// Job `id`'s state.
    pub async fn state(&self, id: i64) -> String {
        let (status, job) = self.json(&format!("/crawls/{id}")).await;
        assert_eq!(status, 200, "{job}");
        job["state"].as_str().unwrap_or_default().to_owned()
    }

    /// `kill -9`: no shutdown, its leases stay until they end.
    pub async fn kill(mut self) {
        self.child.start_kill().unwrap();
        self.child.wait().await.unwrap();
    }
}
