//! `/openapi.json` describes every route the API answers: each route the
//! router defines is in the document with its methods, and each operation
//! in the document reaches a handler (not the "no such route" fallback).
//! Conformance of real answers to the document is schemathesis's job, run
//! against a live daemon by `.ci/run`.

mod common;

use std::collections::BTreeSet;

use common::daemon::Daemon;

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
