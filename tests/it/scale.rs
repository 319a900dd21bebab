//! A large store served in bounded memory: `/export` streams its body a
//! chunk at a time (never the whole list at once), and the store lists
//! every proxy a page at a time by id for the CLI's export, on both
//! backends.

use crate::common;
use crate::on_both_backends;

use common::backend::TestDb;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use proxywarden::api;
use proxywarden::daemon::Service;
use proxywarden::export::{self, Format};
use proxywarden::health::{Feedback, HealthIndex};
use proxywarden::model::{Candidate, Hints, SourceScheme};
use proxywarden::proxy::{Anonymity, Country, Credentials, Proxy, Scheme, Status};
use proxywarden::store::{ProxyFilter, ProxyRecord, SourceRun, Store, now_ms};
use tower::ServiceExt;

const SERVED: usize = 2_000;

/// `n` alive proxies checked at `now`, every tenth with credentials.
fn alive(n: usize, now: i64) -> Vec<ProxyRecord> {
    (0..n)
        .map(|i| ProxyRecord {
            id: i as i64 + 1,
            proxy: Proxy {
                scheme: [Scheme::Http, Scheme::Socks4, Scheme::Socks5][i % 3],
                host: IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + i as u32)),
                port: 1000 + (i % 60_000) as u16,
                auth: (i % 10 == 0).then(|| Credentials {
                    username: format!("user{i}"),
                    password: "pass,\"word\"\n".into(),
                }),
            },
            scheme_detect: false,
            status: Status::Alive,
            country: Country::parse(["US", "DE", "FR"][i % 3]),
            country_source: Some("source".into()),
            anonymity: Some(Anonymity::Elite),
            https: Some(i % 2 == 0),
            latency_ms: Some(50 + i as i64),
            exit_ip: None,
            last_checked: Some(now),
            last_alive: Some(now),
            first_seen: now,
            last_seen: now,
            reason: None,
            hint_anonymity: None,
            hint_https: None,
            checks_total: 3,
            checks_ok: 3,
            consecutive_failures: 0,
            next_check_at: now + 600_000,
            sources: vec!["a".into(), "b".into()],
            failed_in_use_at: None,
        })
        .collect()
}

/// `/export` in every format sends its first chunk holding a small part of
/// the list (the rest is written as the client reads), and the whole body
/// is the export of every servable proxy, byte for byte.
#[tokio::test]
async fn export_streams_the_list_a_chunk_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::TestConfig::new(dir.path()).db("scale.db").build();
    let store = Store::open(&config.database.path).unwrap();
    let records = alive(SERVED, now_ms());
    let index = HealthIndex::from_records(records.clone());
    let state = Service::new(store.clone(), Feedback::new(index, store), Arc::new(config)).api();
    for (name, format) in [
        ("txt", Format::Txt),
        ("json", Format::Json),
        ("csv", Format::Csv),
    ] {
        let req = Request::get(format!("/export?format={name}"))
            .body(Body::empty())
            .unwrap();
        let resp = api::router(state.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        let mut body = resp.into_body();
        let first = body
            .frame()
            .await
            .expect("a first chunk")
            .unwrap()
            .into_data()
            .unwrap();
        let mut whole = first.to_vec();
        while let Some(frame) = body.frame().await {
            whole.extend_from_slice(&frame.unwrap().into_data().unwrap());
        }
        let mut expected = Vec::new();
        export::write(&records, format, &mut expected).unwrap();
        assert!(
            first.len() * 4 < expected.len(),
            "{name}: the first chunk is {} of {} bytes: the list was written whole",
            first.len(),
            expected.len()
        );
        assert_eq!(
            String::from_utf8(whole).unwrap(),
            String::from_utf8(expected).unwrap(),
            "{name}"
        );
    }
}

/// An empty servable list exports as the empty list of each format.
#[tokio::test]
async fn an_empty_export_streams_the_empty_list() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::TestConfig::new(dir.path()).db("empty.db").build();
    let store = Store::open(&config.database.path).unwrap();
    let state = Service::new(
        store.clone(),
        Feedback::new(HealthIndex::new(), store),
        Arc::new(config),
    )
    .api();
    for (name, expected) in [
        ("txt", String::new()),
        ("json", "[]\n".to_owned()),
        ("csv", format!("{}\n", export::CSV_COLUMNS.join(","))),
    ] {
        let req = Request::get(format!("/export?format={name}"))
            .body(Body::empty())
            .unwrap();
        let resp = api::router(state.clone()).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{name}");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(String::from_utf8_lossy(&body), expected, "{name}");
    }
}

/// Pages by id after a given id list every proxy matching the filter
/// exactly once, in id order, whatever the page size.
async fn listing_after_an_id_pages_every_proxy_once(db: TestDb) {
    let candidates: Vec<Candidate> = (0..250u32)
        .map(|i| {
            Candidate::new(
                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                8080,
                None,
                None,
                SourceScheme::Fixed([Scheme::Http, Scheme::Socks5][i as usize % 2]),
                Hints::default(),
            )
        })
        .collect();
    db.store
        .record_source_run(
            SourceRun {
                name: "a".into(),
                url: "https://example.invalid/list".into(),
                format: "text".into(),
                started_at: 1_000,
                http_status: Some(200),
                duration_ms: 5,
                error: None,
                private: 0,
            },
            candidates,
        )
        .await
        .unwrap();
    for filter in [
        ProxyFilter::default(),
        ProxyFilter {
            schemes: vec![Scheme::Socks5],
            ..ProxyFilter::default()
        },
    ] {
        let whole = db.store.list_proxies(filter.clone()).await.unwrap();
        for limit in [1, 7, 100, 1_000] {
            let mut paged = Vec::new();
            let mut after = 0;
            loop {
                let page = db
                    .store
                    .list_proxies_after(filter.clone(), after, limit)
                    .await
                    .unwrap();
                assert!(page.len() <= limit);
                let Some(last) = page.last() else { break };
                after = last.id;
                paged.extend(page);
            }
            assert_eq!(paged, whole, "limit {limit}, {filter:?}");
        }
    }
}

on_both_backends!(listing_after_an_id_pages_every_proxy_once);
