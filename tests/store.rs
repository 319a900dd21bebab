//! The store on real SQLite files: migrations from empty, re-opening, and
//! refusing a database written by a newer version.

use std::net::{IpAddr, Ipv4Addr};

use proxywarden::model::{Candidate, Hints, SourceScheme};
use proxywarden::proxy::Scheme;
use proxywarden::store::{ProxyFilter, SourceRun, Store, StoreError};

fn run(name: &str, at: i64) -> SourceRun {
    SourceRun {
        name: name.into(),
        url: "https://example.invalid/list".into(),
        format: "text".into(),
        started_at: at,
        http_status: Some(200),
        duration_ms: 5,
        error: None,
    }
}

fn candidates(n: u32) -> Vec<Candidate> {
    (0..n)
        .map(|i| {
            Candidate::new(
                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                8080,
                None,
                None,
                SourceScheme::Fixed(Scheme::Http),
                Hints::default(),
            )
        })
        .collect()
}

#[test]
fn a_fresh_file_is_migrated_in_wal_mode_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), 2);
    store
        .record_source_run(&run("a", 1_000), &candidates(3))
        .unwrap();
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), 2);
    assert_eq!(
        store.list_proxies(&ProxyFilter::default()).unwrap().len(),
        3
    );
}

#[test]
fn a_database_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("newer.db");
    drop(Store::open(&path).unwrap());
    rusqlite::Connection::open(&path)
        .unwrap()
        .pragma_update(None, "user_version", 99)
        .unwrap();
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(
        err,
        StoreError::TooNew {
            found: 99,
            supported: 2,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(msg.contains("schema version 99"), "{msg}");
    assert!(msg.contains("upgrade proxywarden"), "{msg}");
}

#[test]
fn a_missing_directory_is_a_clear_error() {
    let err = Store::open(std::path::Path::new("/nonexistent-dir/x/proxywarden.db")).unwrap_err();
    assert!(err.to_string().contains("cannot open database"), "{err}");
}

#[test]
fn a_large_batch_lands_and_counts_new_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("big.db")).unwrap();
    let batch = candidates(100_000);
    let c = store.record_source_run(&run("big", 1_000), &batch).unwrap();
    assert_eq!((c.found, c.new), (100_000, 100_000));
    // A second source listing half of them links them without new rows.
    let c = store
        .record_source_run(&run("half", 2_000), &batch[..50_000])
        .unwrap();
    assert_eq!((c.found, c.new), (50_000, 0));
    let stats = store.stats().unwrap();
    assert_eq!(stats.total, 100_000);
    assert_eq!(stats.by_status["unknown"], 100_000);
    let half = stats.sources.iter().find(|s| s.name == "half").unwrap();
    assert_eq!(half.proxies, 50_000);
    assert_eq!(store.count_seen_since(2_000).unwrap(), 50_000);
}

#[test]
fn a_version_1_database_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(include_str!("../migrations/0001_init.sql"))
            .unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute(
            "INSERT INTO proxies (scheme, host, port, first_seen, last_seen, next_check_at)
             VALUES ('http', '10.9.9.9', 3128, 1, 1, 1)",
            [],
        )
        .unwrap();
    }
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), 2);
    let all = store.list_proxies(&ProxyFilter::default()).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].proxy.to_string(), "http://10.9.9.9:3128");
    assert!(store.record_report(all[0].id, false, 5).unwrap());
}
