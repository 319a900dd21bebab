//! The Grafana board in `deploy/grafana/proxywarden.json`: a dashboard
//! Grafana can import (unique panel ids, every query on the board's
//! Prometheus data source), and every metric it queries is one `serve`
//! exposes on `/metrics` once it has harvested, checked and carried a
//! request through the gateway.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use common::daemon::Daemon;
use common::fakes::http_proxy;
use common::site::{Reply, Site, SiteOpts};

const BOARD: &str = include_str!("../../deploy/grafana/proxywarden.json");

/// Every panel of the board, rows' nested panels included.
fn panels(board: &serde_json::Value) -> Vec<&serde_json::Value> {
    let mut out = Vec::new();
    for p in board["panels"].as_array().expect("panels") {
        out.push(p);
        if let Some(nested) = p["panels"].as_array() {
            out.extend(nested);
        }
    }
    out
}

/// The `proxywarden_…` metric names the board's queries read.
fn queried_metrics(board: &serde_json::Value) -> BTreeSet<String> {
    let name = regex::Regex::new(r"proxywarden_[a-z0-9_]+").unwrap();
    let mut names = BTreeSet::new();
    for p in panels(board) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target with an expr");
            names.extend(name.find_iter(expr).map(|m| m.as_str().to_owned()));
        }
    }
    names
}

#[test]
fn the_board_is_an_importable_dashboard() {
    let board: serde_json::Value = serde_json::from_str(BOARD).expect("the board is JSON");
    assert_eq!(board["uid"], "proxywarden");
    let ids: Vec<i64> = panels(&board)
        .iter()
        .map(|p| p["id"].as_i64().expect("every panel has an id"))
        .collect();
    let unique: BTreeSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), ids.len(), "panel ids repeat: {ids:?}");
    let mut queries = 0;
    for p in panels(&board) {
        for t in p["targets"].as_array().into_iter().flatten() {
            assert_eq!(
                t["datasource"]["uid"], "${datasource}",
                "panel {:?} queries another data source",
                p["title"]
            );
            queries += 1;
        }
    }
    assert!(queries >= 15, "only {queries} queries");
    let templates: Vec<&str> = board["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(templates.contains(&"datasource"), "{templates:?}");
    assert!(templates.contains(&"job"), "{templates:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_board_queries_is_on_metrics() {
    common::within(async {
        let board: serde_json::Value = serde_json::from_str(BOARD).unwrap();
        let wanted = queried_metrics(&board);
        assert!(wanted.len() >= 15, "{wanted:?}");

        let dir = tempfile::tempdir().unwrap();
        let site = Site::start(SiteOpts::routes(vec![("/a", Reply::html("page a"))])).await;
        let proxy = http_proxy(2).await;
        let list = dir.path().join("list.txt");
        std::fs::write(&list, format!("{}\n", proxy.addr())).unwrap();
        let missing = dir.path().join("missing.txt");
        let sources = format!(
            "[[sources]]\nname = \"farm\"\nurl = \"{}\"\nscheme = \"http\"\n\n\
             [[sources]]\nname = \"gone\"\nurl = \"{}\"\n",
            list.display(),
            missing.display()
        );
        let (daemon, gateway) = Daemon::start_with_gateway(dir.path(), &sources, |c| c).await;
        daemon.until_servable(1).await;

        let tls =
            proxywarden::net::tls::client_config(None, proxywarden::net::tls::ALPN_H1).unwrap();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
            .proxy(reqwest::Proxy::all(format!("http://{gateway}")).unwrap())
            .build()
            .unwrap();
        let resp = client.get(site.url("/a")).send().await.unwrap();
        assert_eq!(resp.status(), 200);

        // What /metrics exposes: the name of every sample.
        let exposed = |text: &str| -> BTreeSet<String> {
            text.lines()
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .map(|l| l.split(['{', ' ']).next().unwrap().to_owned())
                .collect()
        };
        // Counters of a round or a harvest reach /metrics a moment after
        // the work: poll until nothing is missing, then say what is.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let text = daemon.get("/metrics").await.text().await.unwrap();
            let exposed = exposed(&text);
            let missing: BTreeSet<&String> = wanted.difference(&exposed).collect();
            if missing.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "queried by the board but not on /metrics: {missing:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        daemon.stop().await;
    })
    .await;
}
