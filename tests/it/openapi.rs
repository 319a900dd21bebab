//! `/openapi.json` describes every route the API answers: each route the
//! router defines is in the document with its methods, and each operation
//! in the document reaches a handler (not the "no such route" fallback).
//! Real answers with proxies to serve fit the document's schemas here;
//! schemathesis, run against a live daemon by `.ci/run`, fuzzes the rest
//! (without proxies, so that nothing it asks for leaves the machine).

use crate::common;

use std::collections::BTreeSet;

use common::daemon::{Daemon, status_json};
use common::site::Site;
use common::{ThreeCountries, store_with_alive};

/// The files that define the router's routes.
const ROUTER_FILES: &[&str] = &["src/api/mod.rs", "src/api/dashboard/mod.rs"];

/// Every (METHOD, path) the router's source defines with `.route(...)`:
/// the path, and the method routers (`get(..)`, `.post(..)`, …) up to the
/// next call on the router.
fn routes_in_source() -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for file in ROUTER_FILES {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file))
                .unwrap();
        for chunk in text.split(".route(\"").skip(1) {
            let (path, rest) = chunk.split_once('"').unwrap();
            // The route's method routers end where the next router call starts.
            let end = ["\n        .", "\n    ."]
                .iter()
                .filter_map(|s| rest.find(s))
                .min()
                .unwrap_or(rest.len());
            let methods = &rest[..end];
            let mut found = false;
            for m in ["get", "post", "put", "patch", "delete"] {
                if methods.contains(&format!("{m}(")) {
                    out.insert((m.to_uppercase(), path.to_owned()));
                    found = true;
                }
            }
            assert!(found, "no method found for route {path} in {file}");
        }
    }
    out
}

/// Every (METHOD, path) in the document.
fn routes_in_document(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if ["get", "post", "put", "patch", "delete"].contains(&method.as_str()) {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[tokio::test]
async fn every_route_is_in_the_document_and_every_documented_one_answers() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let daemon = Daemon::start(dir.path(), "", |c| c).await;
        let (status, doc) = daemon.json("/openapi.json").await;
        assert_eq!(status, 200);
        assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");

        // Tools read it before they are given a token.
        std::fs::create_dir(dir.path().join("guarded")).unwrap();
        let open = Daemon::start(&dir.path().join("guarded"), "", |c| {
            c.set("api", "token", "\"openapi-test-token-0123456789\"")
        })
        .await;
        let resp = open
            .http
            .get(open.url("/openapi.json"))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(
            open.http
                .get(open.url("/stats"))
                .send()
                .await
                .unwrap()
                .status(),
            401
        );
        open.stop().await;

        let source = routes_in_source();
        assert!(
            source.len() >= 17,
            "the router's routes were not found: {source:?}"
        );
        let documented = routes_in_document(&doc);
        let missing: Vec<_> = source.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "routes missing from /openapi.json: {missing:?}"
        );
        let extra: Vec<_> = documented.difference(&source).collect();
        assert!(
            extra.is_empty(),
            "documented routes the router lacks: {extra:?}"
        );

        // Every documented operation reaches its handler: whatever it
        // answers to an empty request, it is not the fallback's "no such
        // route" nor 405.
        for (method, path) in &documented {
            let path = path.replace("{id}", "1");
            let resp = daemon
                .req(method.parse().unwrap(), &path)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap();
            assert_ne!(status, 405, "{method} {path}: {body}");
            assert!(!body.contains("no such route"), "{method} {path}: {body}");
        }

        // Each operation documents its errors with the envelope's schema,
        // and a real error fits it.
        for (path, ops) in doc["paths"].as_object().unwrap() {
            for (method, op) in ops.as_object().unwrap() {
                let e = &op["responses"]["400"]["content"]["application/json"]["schema"]["$ref"];
                assert_eq!(
                    e, "#/components/schemas/ErrorBody",
                    "{method} {path} has no documented error envelope"
                );
            }
        }
        let (status, err) = daemon.json("/proxies?limit=0").await;
        assert_eq!(status, 400);
        let schema = &doc["components"]["schemas"]["ErrorDetail"]["required"];
        for field in schema.as_array().unwrap() {
            assert!(err["error"][field.as_str().unwrap()].is_string(), "{err}");
        }
        daemon.stop().await;
    })
    .await;
}

/// What in `body` falls outside the schema the document gives `method
/// path` for `status` as JSON; the document's components resolve its
/// references.
fn violations(
    doc: &serde_json::Value,
    method: &str,
    path: &str,
    status: u16,
    body: &serde_json::Value,
) -> Vec<String> {
    let schema = &doc["paths"][path][method]["responses"][status.to_string()]["content"]["application/json"]
        ["schema"];
    assert!(
        schema.is_object(),
        "{method} {path} documents no JSON answer for {status}"
    );
    let root = serde_json::json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "allOf": [schema],
        "components": doc["components"],
    });
    let validator = jsonschema::validator_for(&root)
        .unwrap_or_else(|e| panic!("the schema of {method} {path} does not compile: {e}"));
    validator
        .iter_errors(body)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Asserts that `body` fits the document (see [`violations`]).
fn conforms(
    doc: &serde_json::Value,
    method: &str,
    path: &str,
    status: u16,
    body: &serde_json::Value,
) {
    let errors = violations(doc, method, path, status, body);
    assert!(
        errors.is_empty(),
        "{method} {path} answered {status} outside its schema: {errors:?}\n{body:#}"
    );
}

#[tokio::test]
async fn answers_with_proxies_to_serve_fit_the_document() {
    common::within(async {
        let dir = tempfile::tempdir().unwrap();
        let three = ThreeCountries::start().await;
        let (store, ids) = store_with_alive(&dir.path().join("daemon.db"), &three.alive()).await;
        drop(store);
        let site = Site::tree(50, 3, std::time::Duration::from_millis(100)).await;
        let (daemon, _gateway) = Daemon::start_with_gateway(dir.path(), "", |c| c).await;
        let (_, doc) = daemon.json("/openapi.json").await;
        // The check has teeth: a wrong answer is caught.
        let wrong = serde_json::json!({"total": "many", "servable": -1});
        assert!(!violations(&doc, "get", "/stats", 200, &wrong).is_empty());

        for (path, route) in [
            ("/proxy", "/proxy"),
            ("/proxies?status=all", "/proxies"),
            ("/stats", "/stats"),
            ("/sources", "/sources"),
            ("/healthz", "/healthz"),
            ("/judge", "/judge"),
        ] {
            let (status, body) = daemon.json(path).await;
            assert_eq!(status, 200, "{path}: {body}");
            conforms(&doc, "get", route, 200, &body);
        }
        let export = daemon.get("/export?format=json").await;
        assert_eq!(export.status(), 200);
        let rows: serde_json::Value = export.json().await.unwrap();
        assert_eq!(rows.as_array().unwrap().len(), 3);
        let schema =
            &doc["paths"]["/export"]["get"]["responses"]["200"]["content"]["application/json"];
        assert!(
            schema["schema"].is_object(),
            "/export documents no JSON form"
        );

        let resp = daemon
            .req(
                reqwest::Method::POST,
                &format!("/proxies/{}/report", ids[0]),
            )
            .header("content-type", "application/json")
            .body(r#"{"ok": true}"#)
            .send()
            .await
            .unwrap();
        let (status, body) = status_json(resp).await;
        assert_eq!(status, 200, "{body}");
        conforms(&doc, "post", "/proxies/{id}/report", 200, &body);

        let resp = daemon
            .req(reqwest::Method::POST, "/crawls")
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"seeds": ["{}"], "max_pages": 5}}"#,
                site.url("/")
            ))
            .send()
            .await
            .unwrap();
        let (status, job) = status_json(resp).await;
        assert_eq!(status, 201, "{job}");
        conforms(&doc, "post", "/crawls", 201, &job);
        let id = job["id"].as_i64().unwrap();
        let (_, list) = daemon.json("/crawls").await;
        conforms(&doc, "get", "/crawls", 200, &list);
        let (_, one) = daemon.json(&format!("/crawls/{id}")).await;
        conforms(&doc, "get", "/crawls/{id}", 200, &one);
        let resp = daemon
            .req(reqwest::Method::DELETE, &format!("/crawls/{id}"))
            .send()
            .await
            .unwrap();
        let (status, ended) = status_json(resp).await;
        assert_eq!(status, 200, "{ended}");
        conforms(&doc, "delete", "/crawls/{id}", 200, &ended);

        let (status, err) = daemon.json("/proxy?max_latency_ms=fast").await;
        assert_eq!(status, 400);
        conforms(&doc, "get", "/proxy", 400, &err);
        drop(three);
        daemon.stop().await;
    })
    .await;
}
