//! The store on real SQLite files: migrations from empty, re-opening, and
//! refusing a database written by a newer version; and the suite of the
//! store's surface on both backends, SQLite and a real PostgreSQL server.

use crate::common;
use crate::on_both_backends;

use common::backend::TestDb;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use proxywarden::model::{Candidate, Hints, SourceScheme};
use proxywarden::proxy::Scheme;
use proxywarden::store::{
    CancelAsk, DueCursor, DueLane, NewUrl, POSTGRES_SCHEMA_VERSION, ProxyFilter, ProxySort,
    SCHEMA_VERSION, SourceRun, Store, StoreError, UrlState,
};

fn run(name: &str, at: i64) -> SourceRun {
    SourceRun {
        name: name.into(),
        url: "https://example.invalid/list".into(),
        format: "text".into(),
        started_at: at,
        http_status: Some(200),
        duration_ms: 5,
        error: None,
        private: 0,
    }
}

fn candidates(n: u32) -> Vec<Candidate> {
    entries(n, SourceScheme::Fixed(Scheme::Http), Hints::default())
}

/// `n` entries 10.0.0.0:8080 up, as a source with `scheme` and `hints`
/// lists them.
fn entries(n: u32, scheme: SourceScheme, hints: Hints) -> Vec<Candidate> {
    (0..n)
        .map(|i| {
            Candidate::new(
                IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)),
                8080,
                None,
                None,
                scheme,
                hints,
            )
        })
        .collect()
}

/// A store at `path` holding `candidates(n)`, listed by one run of `a`.
async fn store_of(path: &std::path::Path, n: u32) -> Store {
    let store = Store::open(path).unwrap();
    store
        .record_source_run(run("a", 1_000), candidates(n))
        .await
        .unwrap();
    store
}

/// `db`'s store holding `candidates(n)`, listed by one run of `a`.
async fn listing_of(db: &TestDb, n: u32) -> Store {
    db.store
        .record_source_run(run("a", 1_000), candidates(n))
        .await
        .unwrap();
    db.store.clone()
}

#[tokio::test]
async fn a_fresh_file_is_migrated_in_wal_mode_and_reopens() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh.db");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    store
        .record_source_run(run("a", 1_000), candidates(3))
        .await
        .unwrap();
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mode: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(conn);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    assert_eq!(
        store
            .list_proxies(ProxyFilter::default())
            .await
            .unwrap()
            .len(),
        3
    );
}

#[tokio::test]
async fn a_database_from_a_newer_version_is_refused() {
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
            supported: SCHEMA_VERSION,
            ..
        }
    ));
    let msg = err.to_string();
    assert!(msg.contains("schema version 99"), "{msg}");
    assert!(
        msg.contains("upgrade proxywarden or point database.path at another database"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_missing_directory_is_a_clear_error() {
    let err = Store::open(std::path::Path::new("/nonexistent-dir/x/proxywarden.db")).unwrap_err();
    assert!(err.to_string().contains("cannot open database"), "{err}");
}

#[tokio::test]
async fn a_large_batch_lands_and_counts_new_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("big.db")).unwrap();
    let batch = candidates(100_000);
    let c = store
        .record_source_run(run("big", 1_000), batch.clone())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (100_000, 100_000));
    // A second source listing half of them links them without new rows.
    let c = store
        .record_source_run(run("half", 2_000), batch[..50_000].to_vec())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (50_000, 0));
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.total, 100_000);
    assert_eq!(stats.by_status["unknown"], 100_000);
    let half = stats.sources.iter().find(|s| s.name == "half").unwrap();
    assert_eq!(half.proxies, 50_000);
    assert_eq!(store.count_seen_since(2_000).await.unwrap(), 50_000);
}

#[tokio::test]
async fn a_version_1_database_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v1.db");
    {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(include_str!("../../migrations/0001_init.sql"))
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
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].proxy.to_string(), "http://10.9.9.9:3128");
    assert!(store.record_report(all[0].id, false, 5).await.unwrap());
}

/// Reads go to their own connections: while the writer commits a large
/// harvest, stats keep answering instead of queueing behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_do_not_wait_for_a_large_write() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("busy.db")).unwrap();
    store
        .record_source_run(run("seed", 1_000), candidates(10))
        .await
        .unwrap();
    let write = {
        let store = store.clone();
        tokio::spawn(async move {
            store
                .record_source_run(run("big", 2_000), candidates(100_000))
                .await
        })
    };
    let mut reads_during_write = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !write.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "the write never ended"
        );
        let stats = tokio::time::timeout(std::time::Duration::from_secs(10), store.stats())
            .await
            .expect("stats answer while the write runs")
            .unwrap();
        // Readers see committed chunks (6,000 candidates each, the first
        // ten already stored), never half of one.
        assert!(
            stats.total == 10 || stats.total % 6_000 == 0 || stats.total == 100_000,
            "saw {} proxies",
            stats.total
        );
        if stats.total < 100_000 {
            reads_during_write += 1;
        }
    }
    write.await.unwrap().unwrap();
    assert!(
        reads_during_write >= 3,
        "only {reads_during_write} reads finished while the write ran"
    );
    assert_eq!(store.stats().await.unwrap().total, 100_000);
}

/// The write-ahead log is copied into the database by the checkpointer
/// while the writer goes on: after a harvest, the database file itself
/// holds what was written, without another write or a restart.
#[tokio::test]
async fn the_log_is_copied_into_the_database_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Store::open(&path).unwrap();
    let before = std::fs::metadata(&path).unwrap().len();
    // Some thousands of pages: past the log size that wakes the
    // checkpointer, far below the one at which the writer would
    // checkpoint itself.
    store
        .record_source_run(run("a", 1_000), candidates(40_000))
        .await
        .unwrap();
    let log = dir.path().join("p.db-wal");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let size = std::fs::metadata(&path).unwrap().len();
        if size > before + 4 * 1024 * 1024 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the database file stayed at {size} bytes (from {before}), the log is {} bytes",
            std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0)
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(store.stats().await.unwrap().total, 40_000);
}

/// Records at `at` (unix ms) a passed check of each of `alive` and a
/// refused one of each of `dead`.
/// The re-check policy the verdicts of these tests are recorded under.
fn policy() -> proxywarden::model::RecheckPolicy {
    proxywarden::model::RecheckPolicy {
        alive: std::time::Duration::from_secs(600),
        alive_jitter: std::time::Duration::ZERO,
        dead: std::time::Duration::from_secs(60),
        dead_max: std::time::Duration::from_secs(3600),
    }
}

async fn record_verdicts(store: &Store, alive: &[i64], dead: &[i64], at: i64) {
    let verdicts = alive
        .iter()
        .map(|&id| common::alive_at(id, at))
        .chain(dead.iter().map(|&id| common::refused_at(id, at)))
        .collect();
    store.record_checks(verdicts, policy()).await.unwrap();
}

/// A candidate on port 0 is refused with an error naming it, on either
/// write path, and its chunk leaves nothing behind.
async fn a_candidate_on_port_0_is_refused_by_name(db: TestDb) {
    let store = db.store;
    let mut list = candidates(10);
    list[4].proxy.port = 0;
    // Batched (distinct addresses), then row by row (one repeated).
    let mut repeated = list.clone();
    repeated.push(list[0].clone());
    for list in [list, repeated] {
        let err = store
            .record_source_run(run("a", 1_000), list)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("10.0.0.4:0: port 0 is not a proxy's port"),
            "{err}"
        );
        assert_eq!(store.stats().await.unwrap().total, 0);
    }
}

/// Proxies not checked yet stay out of the status index, which a harvest
/// of new proxies then never writes, while listings of alive and of dead
/// proxies, and of unknown ones, still find exactly those, the first two
/// through the index.
#[tokio::test]
async fn the_status_index_holds_checked_proxies_only() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = store_of(&path, 20).await;
    let ids = common::ids_of(&store).await;
    record_verdicts(&store, &ids[..3], &ids[3..5], 2_000).await;
    for (status, want) in [
        (proxywarden::proxy::Status::Alive, &ids[..3]),
        (proxywarden::proxy::Status::Dead, &ids[3..5]),
        (proxywarden::proxy::Status::Unknown, &ids[5..]),
    ] {
        let filter = ProxyFilter {
            status: Some(status),
            ..ProxyFilter::default()
        };
        let found: Vec<i64> = store
            .list_proxies(filter)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(found, want, "{status:?}");
    }

    let conn = rusqlite::Connection::open(&path).unwrap();
    let indexed: i64 = conn
        .query_row(
            "SELECT count(*) FROM proxies INDEXED BY proxies_status
             WHERE status = 'alive' OR status = 'dead'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(indexed, 5);
    let unknown_indexed = conn.query_row(
        "SELECT count(*) FROM proxies INDEXED BY proxies_status WHERE status = 'unknown'",
        [],
        |r| r.get::<_, i64>(0),
    );
    assert!(
        unknown_indexed.is_err(),
        "unknown proxies are in the index: {unknown_indexed:?}"
    );
    for status in ["alive", "dead"] {
        let plan: String = conn
            .query_row(
                "EXPLAIN QUERY PLAN SELECT p.id FROM proxies p WHERE p.status = ?1",
                [status],
                |r| r.get(3),
            )
            .unwrap();
        assert!(plan.contains("proxies_status"), "{status}: {plan}");
    }
}

/// A purge of more proxies than one transaction deletes (it goes in
/// bounded ones) deletes every one that qualifies, and their links, and
/// leaves the others.
#[tokio::test]
async fn a_large_purge_deletes_every_qualifying_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = store_of(&path, 12_500).await;
    let ids = common::ids_of(&store).await;
    // All but the first 100 die; those stay alive.
    record_verdicts(&store, &ids[..100], &ids[100..], 2_000).await;
    let day = std::time::Duration::from_secs(86_400);
    let purged = store.purge(10 * 86_400_000, day).await.unwrap();
    assert_eq!(purged, 12_400);
    assert_eq!(common::ids_of(&store).await, ids[..100]);
    assert_eq!(store.list_sources().await.unwrap()[0].proxies, 100);
    assert_eq!(store.counts().await.unwrap(), scanned(&path));
}

/// A listing page is filtered, sorted and cut in SQL, with the total of
/// all matches.
async fn listing_pages_are_cut_in_sql(db: TestDb) {
    let store = listing_of(&db, 25).await;
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let ids: Vec<i64> = all.iter().map(|r| r.id).collect();
    let page = store
        .list_page(ProxyFilter::default(), ProxySort::Id, 10, 20)
        .await
        .unwrap();
    assert_eq!(page.total, 25);
    let got: Vec<i64> = page.proxies.iter().map(|r| r.id).collect();
    assert_eq!(got, ids[20..]);

    let filter = ProxyFilter {
        exclude_ids: vec![ids[0]],
        exclude_addrs: vec![std::net::SocketAddr::new(
            all[1].proxy.host,
            all[1].proxy.port,
        )],
        ..ProxyFilter::default()
    };
    let page = store
        .list_page(filter, ProxySort::LastChecked, 5, 0)
        .await
        .unwrap();
    assert_eq!(page.total, 23);
    assert_eq!(page.proxies[0].id, ids[2], "never checked: by id");
}

/// Another process holding the write lock longer than the busy timeout
/// (5 s) delays a write; it does not lose it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_waits_out_another_process_holding_the_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shared.db");
    let store = store_of(&path, 1).await;
    let (locked_tx, locked) = tokio::sync::oneshot::channel();
    let holder = std::thread::spawn(move || {
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("BEGIN IMMEDIATE").unwrap();
        locked_tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_secs(7));
        conn.execute_batch("COMMIT").unwrap();
    });
    locked.await.unwrap();
    let written = common::within(store.record_source_run(run("b", 2_000), candidates(3))).await;
    assert_eq!(written.unwrap().found, 3);
    holder.join().unwrap();
    assert_eq!(store.stats().await.unwrap().total, 3);
}

/// A round pages through what is due in the order it fell due, through the
/// due-time index: every due proxy comes exactly once, across pages and
/// across proxies that fell due at the same moment, and none that is not.
async fn due_proxies_page_once_each_in_due_order(db: TestDb) {
    let store = listing_of(&db, 2_500).await;
    let ids: Vec<i64> = common::ids_of(&store).await;
    let now = proxywarden::store::now_ms();
    // A third not due for an hour; the rest due together, at one moment.
    let later: Vec<i64> = ids.iter().copied().step_by(3).collect();
    store
        .defer_checks(later.clone(), now + 3_600_000)
        .await
        .unwrap();
    let due: BTreeSet<i64> = ids
        .iter()
        .copied()
        .filter(|id| !later.contains(id))
        .collect();
    assert_eq!(store.count_due(now, false).await.unwrap(), due.len() as i64);

    let (mut seen, mut after, mut pages) = (Vec::new(), DueCursor::START, 0);
    loop {
        let page = store
            .due_page(now, false, DueLane::Others, after, 500)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.cursor();
        pages += 1;
        seen.extend(page.iter().map(|d| d.id));
    }
    assert_eq!(pages, 4);
    assert_eq!(seen.len(), due.len(), "a proxy came twice");
    assert_eq!(seen.iter().copied().collect::<BTreeSet<_>>(), due);
    // With `all`, every proxy of the lane, due or not.
    let every = store
        .due_page(now, true, DueLane::Others, DueCursor::START, 5_000)
        .await
        .unwrap();
    assert_eq!(every.len(), 2_500);
}

/// Candidates `0..n` of [`candidates`], with a country and an anonymity
/// claim on each, as a text list would not give but a JSON API does.
fn hinted(n: u32, country: &str) -> Vec<Candidate> {
    candidates(n)
        .into_iter()
        .map(|mut c| {
            c.hints.country = proxywarden::proxy::Country::parse(country);
            c.hints.anonymity = Some(proxywarden::proxy::Anonymity::Elite);
            c.hints.https = Some(true);
            c
        })
        .collect()
}

/// Counts every row update SQLite executes on `proxies` and
/// `proxy_sources` from now on (an update that writes the same values
/// counts too): a re-harvest must not rewrite what did not change.
fn count_row_writes(path: &std::path::Path) {
    let conn = rusqlite::Connection::open(path).unwrap();
    conn.execute_batch(
        "CREATE TABLE row_writes (tbl TEXT NOT NULL, id INTEGER NOT NULL);
         CREATE TRIGGER proxies_written AFTER UPDATE ON proxies
             BEGIN INSERT INTO row_writes VALUES ('proxies', new.id); END;
         CREATE TRIGGER links_written AFTER UPDATE ON proxy_sources
             BEGIN INSERT INTO row_writes VALUES ('proxy_sources', new.proxy_id); END;",
    )
    .unwrap();
}

fn row_writes(path: &std::path::Path) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT tbl, id FROM row_writes ORDER BY tbl, id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// (id, changed_seq) of every proxy, by id.
fn change_numbers(path: &std::path::Path) -> Vec<(i64, i64)> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT id, changed_seq FROM proxies ORDER BY id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Issue 9, Must 7: a re-harvest of an unchanged list writes no proxy row
/// and no link, gives no row a new change number, and still shows every
/// proxy as seen by the new run, with exact counts.
#[tokio::test]
async fn an_unchanged_re_harvest_rewrites_no_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Store::open(&path).unwrap();
    let list = hinted(12_000, "DE");
    let first = store
        .record_source_run(run("a", 1_000), list.clone())
        .await
        .unwrap();
    assert_eq!((first.found, first.new), (12_000, 12_000));
    let seq_before = store.change_seq().await.unwrap();
    let numbers_before = change_numbers(&path);
    count_row_writes(&path);

    let again = store
        .record_source_run(run("a", 2_000), list.clone())
        .await
        .unwrap();
    assert_eq!((again.found, again.new), (12_000, 0));
    assert_eq!(
        row_writes(&path),
        vec![],
        "rows rewritten by an unchanged re-harvest"
    );
    assert_eq!(change_numbers(&path), numbers_before);
    assert_eq!(store.change_seq().await.unwrap(), seq_before);

    let proxies = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(proxies.len(), 12_000);
    assert!(
        proxies
            .iter()
            .all(|p| p.first_seen == 1_000 && p.last_seen == 2_000)
    );
    assert!(
        proxies
            .iter()
            .all(|p| p.country.map(|c| c.to_string()).as_deref() == Some("DE"))
    );
    assert_eq!(store.count_seen_since(2_000).await.unwrap(), 12_000);
    let sources = store.list_sources().await.unwrap();
    assert_eq!(
        (
            sources[0].last_found,
            sources[0].last_new,
            sources[0].proxies
        ),
        (Some(12_000), Some(0), 12_000)
    );
}

/// A changed hint rewrites that proxy's row alone, and only that row gets
/// a new change number.
#[tokio::test]
async fn a_changed_hint_updates_only_that_row() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Store::open(&path).unwrap();
    let mut list = hinted(6_000, "DE");
    store
        .record_source_run(run("a", 1_000), list.clone())
        .await
        .unwrap();
    let before = change_numbers(&path);
    count_row_writes(&path);

    list[4_321].hints.country = proxywarden::proxy::Country::parse("AT");
    let changed = list[4_321].proxy.clone();
    let c = store
        .record_source_run(run("a", 2_000), list)
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (6_000, 0));
    let proxies = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let id = proxies.iter().find(|p| p.proxy == changed).unwrap().id;
    assert_eq!(row_writes(&path), vec![("proxies".to_owned(), id)]);
    let after = change_numbers(&path);
    let bumped: Vec<i64> = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b != a)
        .map(|(_, a)| a.0)
        .collect();
    assert_eq!(bumped, vec![id]);
    let at = proxies.iter().find(|p| p.id == id).unwrap();
    assert_eq!(at.country.map(|c| c.to_string()).as_deref(), Some("AT"));
    assert_eq!(
        proxies
            .iter()
            .filter(|p| p.country.map(|c| c.to_string()).as_deref() == Some("DE"))
            .count(),
        5_999
    );
}

/// A proxy a new list leaves out keeps the time it was last listed; the
/// rest are seen by the new run; one listed again is seen again.
async fn a_proxy_left_out_keeps_its_last_sighting(db: TestDb) {
    let store = db.store;
    let list = candidates(10);
    store
        .record_source_run(run("a", 1_000), list.clone())
        .await
        .unwrap();
    let c = store
        .record_source_run(run("a", 2_000), list[1..].to_vec())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (9, 0));
    let seen = |records: &[proxywarden::store::ProxyRecord], p: &proxywarden::proxy::Proxy| {
        records.iter().find(|r| &r.proxy == p).unwrap().last_seen
    };
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(seen(&records, &list[0].proxy), 1_000);
    assert!(list[1..].iter().all(|c| seen(&records, &c.proxy) == 2_000));
    assert_eq!(store.count_seen_since(2_000).await.unwrap(), 9);
    assert_eq!(store.list_sources().await.unwrap()[0].proxies, 10);

    // A failed fetch (nothing stored) leaves the last list standing.
    let mut failed = run("a", 3_000);
    failed.error = Some("timed out".into());
    store.record_source_run(failed, Vec::new()).await.unwrap();
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert!(list[1..].iter().all(|c| seen(&records, &c.proxy) == 2_000));

    let c = store
        .record_source_run(run("a", 4_000), list.clone())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (10, 0));
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert!(list.iter().all(|c| seen(&records, &c.proxy) == 4_000));
}

/// Counts stay exact when a list mixes new and known proxies, entries of
/// other kinds (IPv6, credentials) and an entry whose scheme is to be
/// detected at the address of a known proxy.
#[tokio::test]
async fn counts_are_exact_for_mixed_lists() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("p.db")).unwrap();
    let parse = |s: &str| Candidate {
        proxy: proxywarden::proxy::Proxy::parse_url(s).unwrap(),
        detect: false,
        hints: Hints::default(),
    };
    let mut known = candidates(100);
    known.push(parse("socks5://[2001:db8::1]:1080"));
    known.push(parse("http://user:pw@10.9.9.9:3128"));
    let c = store
        .record_source_run(run("a", 1_000), known.clone())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (102, 102));

    let mut next: Vec<Candidate> = known[50..].to_vec();
    next.extend((0..25).map(|i| parse(&format!("socks4://10.200.0.{i}:1080"))));
    // The address of a known http proxy, scheme unknown: the same proxy.
    let mut detect = known[60].clone();
    detect.detect = true;
    next.push(detect);
    next.push(parse("socks5://[2001:db8::2]:1080"));
    let c = store
        .record_source_run(run("a", 2_000), next)
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (79, 26));
    assert_eq!(store.stats().await.unwrap().total, 128);
    // The repeated address took the row-by-row path: its counts are as
    // exact as the batched path's.
    assert_eq!(
        store.counts().await.unwrap(),
        scanned(&dir.path().join("p.db"))
    );
    assert_eq!(store.count_seen_since(2_000).await.unwrap(), 78);
    let src = &store.list_sources().await.unwrap()[0];
    assert_eq!(
        (src.last_found, src.last_new, src.proxies),
        (Some(79), Some(26), 128)
    );
}

/// A list whose long run of new proxies runs into known ones, and then
/// into new ones again: new proxies are written once each, numbered in
/// the list's order, and known ones keep their rows, take the list's hints
/// and are linked to the source, whichever way the store took each batch.
#[tokio::test]
async fn a_run_of_new_proxies_meeting_known_ones_stores_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Store::open(&path).unwrap();
    // Known: entries 150..350, stored by another source.
    let known: Vec<Candidate> = candidates(350).split_off(150);
    store
        .record_source_run(run("a", 1_000), known.clone())
        .await
        .unwrap();
    let known_ids = common::ids_of(&store).await;

    // 0..150 new, 150..350 known, 350..700 new; all with hints.
    let list = hinted(700, "DE");
    let c = store
        .record_source_run(run("b", 2_000), list.clone())
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (700, 500));

    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(records.len(), 700);
    let id_of = |c: &Candidate| records.iter().find(|r| r.proxy == c.proxy).unwrap().id;
    // The known rows are the same rows, now with the list's country.
    let kept: Vec<i64> = list[150..350].iter().map(id_of).collect();
    assert_eq!(kept, known_ids);
    assert!(
        records
            .iter()
            .all(|r| r.country.as_ref().map(|c| c.as_str()) == Some("DE"))
    );
    // The new ones are numbered after them, in the list's order.
    let new_ids: Vec<i64> = list[..150].iter().chain(&list[350..]).map(id_of).collect();
    assert!(new_ids.windows(2).all(|w| w[0] < w[1]));
    assert!(new_ids[0] > *known_ids.last().unwrap());

    let sources = store.list_sources().await.unwrap();
    let by_name = |n: &str| sources.iter().find(|s| s.name == n).unwrap().proxies;
    assert_eq!((by_name("a"), by_name("b")), (200, 700));
    assert_eq!(store.count_seen_since(2_000).await.unwrap(), 700);
    assert_eq!(store.counts().await.unwrap(), scanned(&path));

    // The same list again finds every one of them.
    let c = store
        .record_source_run(run("b", 3_000), list)
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (700, 0));
    assert_eq!(store.stats().await.unwrap().total, 700);
}

/// Two sources listing overlapping proxies in one round: each proxy counts
/// once among those seen since the round began, and so does one a list
/// left out after that.
async fn proxies_seen_by_two_sources_count_once(db: TestDb) {
    let store = db.store;
    let all = candidates(30);
    store
        .record_source_run(run("old", 1_000), all.clone())
        .await
        .unwrap();
    store
        .record_source_run(run("a", 5_000), all[..20].to_vec())
        .await
        .unwrap();
    store
        .record_source_run(run("b", 5_100), all[10..25].to_vec())
        .await
        .unwrap();
    assert_eq!(store.count_seen_since(5_000).await.unwrap(), 25);
    assert_eq!(store.count_seen_since(5_100).await.unwrap(), 15);
    assert_eq!(store.count_seen_since(1_000).await.unwrap(), 30);
    assert_eq!(store.count_seen_since(6_000).await.unwrap(), 0);

    // "a" lists five of its twenty again: the fifteen it left out were last
    // listed at 5,000, and still count as seen since then, each once, five
    // of them (5..10) through no recent source's list.
    store
        .record_source_run(run("a", 7_000), all[..5].to_vec())
        .await
        .unwrap();
    assert_eq!(store.count_seen_since(5_000).await.unwrap(), 25);
    assert_eq!(store.count_seen_since(5_100).await.unwrap(), 20);
    assert_eq!(store.count_seen_since(7_000).await.unwrap(), 5);
}

/// Each source's yield: of the proxies it lists, how many are alive at
/// their last check and how many no other source lists.
async fn each_source_counts_its_alive_and_unique_proxies(db: TestDb) {
    let store = db.store;
    let all = candidates(30);
    for (name, range) in [("a", 0..20), ("b", 10..25), ("c", 25..30)] {
        store
            .record_source_run(run(name, 1_000), all[range].to_vec())
            .await
            .unwrap();
    }
    let ids = common::ids_of(&store).await;
    assert_eq!(ids.len(), 30);
    let now = proxywarden::store::now_ms();
    // 10.0.0.0, .12 and .27: one only "a" lists, one "a" and "b" list, one
    // only "c" lists.
    let alive = [0, 12, 27].map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)));
    let by_ip = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let verdicts = alive
        .iter()
        .map(|ip| {
            let id = by_ip.iter().find(|r| r.proxy.host == *ip).unwrap().id;
            common::alive_at(id, now)
        })
        .collect();
    store.record_checks(verdicts, policy()).await.unwrap();
    let got = source_counts(&store).await;
    assert_eq!(
        got,
        [
            ("a".to_owned(), 20, 2, 10),
            ("b".to_owned(), 15, 1, 5),
            ("c".to_owned(), 5, 1, 5),
        ]
    );
}

/// Each source's name, proxies, alive and unique counts, by name.
async fn source_counts(store: &Store) -> Vec<(String, i64, i64, i64)> {
    store
        .list_sources()
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.proxies, s.alive, s.unique))
        .collect()
}

/// Sources listing tens of thousands of proxies each count them all: the
/// counts read links in batches of thousands, and every batch's edge
/// counts once.
async fn source_counts_hold_across_many_thousand_links(db: TestDb) {
    let store = db.store;
    let all = candidates(30_000);
    for (name, range) in [("a", 0..25_000), ("b", 5_000..30_000)] {
        store
            .record_source_run(run(name, 1_000), all[range].to_vec())
            .await
            .unwrap();
    }
    let by_ip = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(by_ip.len(), 30_000);
    // Every 7th address is alive.
    let index = |r: &proxywarden::store::ProxyRecord| match r.proxy.host {
        IpAddr::V4(ip) => u32::from(ip) - 0x0a00_0000,
        IpAddr::V6(_) => unreachable!(),
    };
    let now = proxywarden::store::now_ms();
    let verdicts = by_ip
        .iter()
        .filter(|r| index(r) % 7 == 0)
        .map(|r| common::alive_at(r.id, now))
        .collect();
    store.record_checks(verdicts, policy()).await.unwrap();
    let alive_in = |range: std::ops::Range<u32>| range.filter(|i| i % 7 == 0).count() as i64;
    let got = source_counts(&store).await;
    assert_eq!(
        got,
        [
            ("a".to_owned(), 25_000, alive_in(0..25_000), 5_000),
            ("b".to_owned(), 25_000, alive_in(5_000..30_000), 5_000),
        ]
    );
}

/// An entry whose scheme is to be detected is the proxy already stored at
/// its address, whatever scheme that row has, and only an address no row
/// holds is new.
async fn a_detected_entry_is_the_proxy_known_at_its_address(db: TestDb) {
    let store = db.store;
    let entry = |url: &str, detect: bool| {
        let proxy = proxywarden::proxy::Proxy::parse_url(url).unwrap();
        Candidate::new(
            proxy.host,
            proxy.port,
            None,
            (!detect).then_some(proxy.scheme),
            SourceScheme::Detect,
            Hints::default(),
        )
    };
    let first = vec![
        entry("socks5://10.1.0.1:1080", false),
        entry("socks4://10.1.0.2:1080", false),
        entry("http://10.1.0.3:8080", false),
        entry("http://10.1.0.4:80", true),
    ];
    let c = store
        .record_source_run(run("a", 1_000), first)
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (4, 4));
    let second = vec![
        entry("http://10.1.0.1:1080", true),
        entry("http://10.1.0.2:1080", true),
        entry("http://10.1.0.4:80", true),
        entry("http://10.1.0.5:80", true),
    ];
    let c = store
        .record_source_run(run("b", 2_000), second)
        .await
        .unwrap();
    assert_eq!((c.found, c.new), (4, 1));
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(all.len(), 5);
    let by_url = |url: &str| {
        all.iter()
            .find(|r| r.proxy.to_string() == url)
            .unwrap_or_else(|| panic!("{url} is not stored"))
    };
    for url in [
        "socks5://10.1.0.1:1080",
        "socks4://10.1.0.2:1080",
        "http://10.1.0.4:80",
    ] {
        assert_eq!(by_url(url).sources, ["a", "b"], "{url}");
    }
    // A detected entry never takes away a scheme already settled.
    assert!(!by_url("socks5://10.1.0.1:1080").scheme_detect);
    assert_eq!(by_url("http://10.1.0.3:8080").sources, ["a"]);
    assert_eq!(by_url("http://10.1.0.5:80").sources, ["b"]);
    assert!(by_url("http://10.1.0.5:80").scheme_detect);
}

/// The migration that rebuilds the proxies table keeps every row, its id
/// and its links, and the rebuilt table refuses what the old one refused.
#[tokio::test]
async fn rebuilding_the_proxies_table_keeps_rows_links_and_rules() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.db");
    let store = Store::open(&path).unwrap();
    store
        .record_source_run(run("a", 1_000), hinted(50, "DE"))
        .await
        .unwrap();
    let before = store.list_proxies(ProxyFilter::default()).await.unwrap();
    drop(store);
    // Back to the version before the rebuild (6), so that opening runs it
    // and the migrations after it: without what 0008, 0009, 0012, 0013, 0014,
    // 0015, 0017 and 0018 add.
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch(
        "ALTER TABLE sources DROP COLUMN last_private;
         ALTER TABLE crawl_jobs DROP COLUMN lease_node;
         ALTER TABLE crawl_jobs DROP COLUMN lease_until;
         ALTER TABLE crawl_jobs DROP COLUMN cancel_requested;
         DROP TABLE crawl_hosts;
         DROP TABLE proxy_sites;
         DROP TABLE snapshots;
         DROP TABLE proxy_counts;
         DROP TABLE crawl_urls;
         DROP TABLE crawl_meta;
         DROP TABLE harvest_claims;
         DROP TRIGGER proxies_delete_links;
         DROP TRIGGER sources_delete_links;",
    )
    .unwrap();
    conn.pragma_update(None, "user_version", 6).unwrap();
    drop(conn);

    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().await.unwrap(), SCHEMA_VERSION);
    let after = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(after, before);
    assert!(after.iter().all(|r| r.sources == ["a"]));
    drop(store);

    let conn = rusqlite::Connection::open(&path).unwrap();
    let tables: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        tables,
        [
            "crawl_hosts",
            "crawl_jobs",
            "crawl_meta",
            "crawl_urls",
            "harvest_claims",
            "meta",
            "proxies",
            "proxy_counts",
            "proxy_sites",
            "proxy_sources",
            "snapshots",
            "sources"
        ]
    );
    for (column, value) in [
        ("scheme", "'ftp'"),
        ("status", "'maybe'"),
        ("anonymity", "'high'"),
        ("hint_anonymity", "'high'"),
        ("country_source", "'guess'"),
        ("scheme_detect", "2"),
        ("https", "2"),
        ("hint_https", "-1"),
    ] {
        let written = conn.execute(&format!("UPDATE proxies SET {column} = {value}"), []);
        assert!(
            written.is_err(),
            "{column} = {value} was accepted: {written:?}"
        );
    }
    conn.execute("UPDATE proxies SET anonymity = 'elite', https = 1", [])
        .unwrap();
    // A proxy's links go with it, and a source's with it.
    let links = |c: &rusqlite::Connection| -> i64 {
        c.query_row("SELECT count(*) FROM proxy_sources", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(links(&conn), 50);
    conn.execute(
        "DELETE FROM proxies WHERE id = (SELECT min(id) FROM proxies)",
        [],
    )
    .unwrap();
    assert_eq!(links(&conn), 49);
    conn.execute("DELETE FROM sources", []).unwrap();
    assert_eq!(links(&conn), 0);
}

/// The counts of `stats` as a full scan of the table finds them.
fn scanned(path: &std::path::Path) -> proxywarden::store::Stats {
    use std::collections::BTreeMap;
    let c = rusqlite::Connection::open(path).unwrap();
    let group = |sql: &str| -> BTreeMap<String, i64> {
        c.prepare(sql)
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let mut by_status = group("SELECT status, count(*) FROM proxies GROUP BY 1");
    for s in ["unknown", "alive", "dead"] {
        by_status.entry(s.into()).or_insert(0);
    }
    proxywarden::store::Stats {
        total: c
            .query_row("SELECT count(*) FROM proxies", [], |r| r.get(0))
            .unwrap(),
        by_status,
        by_scheme: group("SELECT scheme, count(*) FROM proxies GROUP BY 1"),
        by_country: group("SELECT coalesce(country, 'unknown'), count(*) FROM proxies GROUP BY 1"),
        by_anonymity: group(
            "SELECT anonymity, count(*) FROM proxies
             WHERE status = 'alive' AND anonymity IS NOT NULL GROUP BY 1",
        ),
        by_reason: group(
            "SELECT last_reason, count(*) FROM proxies
             WHERE status = 'dead' AND last_reason IS NOT NULL GROUP BY 1",
        ),
        sources: Vec::new(),
        by_status_scheme: c
            .prepare("SELECT status, scheme, count(*) FROM proxies GROUP BY 1, 2")
            .unwrap()
            .query_map([], |r| Ok(((r.get(0)?, r.get(1)?), r.get(2)?)))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap(),
    }
}

/// Issue 10, Must 12: the counts `/stats` and `/metrics` serve (kept by
/// every write, never a scan per request) stay exact across harvests with
/// country hints, verdicts that change status, anonymity, reason, country
/// and scheme, writes of another process, and purges.
#[tokio::test]
async fn counts_stay_exact_across_harvest_check_and_purge() {
    use proxywarden::model::{Outcome, Reason, RecheckPolicy};
    use proxywarden::proxy::{Anonymity, Country};
    use proxywarden::store::{CheckRecord, now_ms};
    use std::time::Duration;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counts.db");
    let store = Store::open(&path).unwrap();
    let same = |label: &str, counts: proxywarden::store::Stats| {
        assert_eq!(counts, scanned(&path), "after {label}");
    };
    same("opening", store.counts().await.unwrap());

    let country = |c: &str| Country::parse(c);
    let listed = |n: u32, scheme: SourceScheme, c: Option<&str>| {
        let hints = Hints {
            country: c.and_then(country),
            ..Hints::default()
        };
        entries(n, scheme, hints)
    };
    store
        .record_source_run(
            run("a", 1_000),
            listed(300, SourceScheme::Fixed(Scheme::Http), Some("DE")),
        )
        .await
        .unwrap();
    store
        .record_source_run(
            run("b", 2_000),
            listed(400, SourceScheme::Fixed(Scheme::Socks5), None),
        )
        .await
        .unwrap();
    store
        .record_source_run(
            run("c", 3_000),
            listed(50, SourceScheme::Detect, Some("FR")),
        )
        .await
        .unwrap();
    // Known proxies listed again with another country.
    store
        .record_source_run(
            run("a", 4_000),
            listed(100, SourceScheme::Fixed(Scheme::Http), Some("NL")),
        )
        .await
        .unwrap();
    let stats = store.counts().await.unwrap();
    assert_eq!(stats.total, 700, "{stats:?}");
    same("harvests", stats);

    let rows = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let now = now_ms();
    let policy = RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::from_secs(150),
        dead: Duration::from_secs(60),
        dead_max: Duration::from_secs(3600),
    };
    let reasons = [Reason::Refused, Reason::Timeout, Reason::BadStatus];
    let anonymity = [
        Anonymity::Transparent,
        Anonymity::Anonymous,
        Anonymity::Elite,
    ];
    let verdicts = |round: usize| -> Vec<CheckRecord> {
        rows.iter()
            .enumerate()
            .map(|(i, r)| {
                let outcome = if (i + round).is_multiple_of(3) {
                    Outcome::dead(reasons[(i + round) % reasons.len()])
                } else {
                    Outcome {
                        failure: None,
                        latency: Some(Duration::from_millis(20)),
                        anonymity: Some(anonymity[(i + round) % 3]),
                        https: None,
                        exit_ip: None,
                        country: i.is_multiple_of(7).then(|| country("US").unwrap()),
                        detected: r.scheme_detect.then_some(if i.is_multiple_of(2) {
                            Scheme::Socks5
                        } else {
                            Scheme::Http
                        }),
                    }
                };
                CheckRecord {
                    id: r.id,
                    checked_at: now + round as i64,
                    outcome,
                }
            })
            .collect()
    };
    store.record_checks(verdicts(0), policy).await.unwrap();
    same("the first round", store.counts().await.unwrap());
    store.record_checks(verdicts(1), policy).await.unwrap();
    same("the second round", store.counts().await.unwrap());

    // Another process (a CLI check beside the daemon) writes verdicts.
    {
        let other = Store::open(&path).unwrap();
        other.record_checks(verdicts(2), policy).await.unwrap();
    }
    let stats = store.counts().await.unwrap();
    assert!(
        stats.by_status["dead"] > 0 && stats.by_status["alive"] > 0,
        "{stats:?}"
    );
    same("another process's round", stats);

    // Everything dead and unlisted long enough goes.
    let purged = store
        .purge(now + 10 * 86_400_000, Duration::from_secs(86_400))
        .await
        .unwrap();
    assert!(purged > 0);
    let stats = store.counts().await.unwrap();
    assert_eq!(stats.by_status["dead"], 0, "{stats:?}");
    same("the purge", stats);
    // `stats` is the same counts with the sources added.
    let full = store.stats().await.unwrap();
    assert_eq!(full.sources.len(), 3);
    assert_eq!(
        proxywarden::store::Stats {
            sources: Vec::new(),
            ..full
        },
        scanned(&path)
    );
}

/// The daemon indexes its own check results as it commits them: reading
/// changed rows back skips the rows of the change numbers it names, yet
/// moves past them, and says when a page was full.
#[tokio::test]
async fn changed_rows_of_known_change_numbers_are_skipped_not_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("p.db")).unwrap();
    store
        .record_source_run(run("a", 1_000), hinted(3, "DE"))
        .await
        .unwrap();
    let ids: Vec<i64> = common::ids_of(&store).await;
    let policy = proxywarden::model::RecheckPolicy {
        alive: std::time::Duration::from_secs(600),
        alive_jitter: std::time::Duration::from_secs(150),
        dead: std::time::Duration::from_secs(60),
        dead_max: std::time::Duration::from_secs(3600),
    };
    let now = proxywarden::store::now_ms();
    let ours = store
        .record_checks(
            vec![common::alive_at(ids[0], now), common::alive_at(ids[1], now)],
            policy,
        )
        .await
        .unwrap();
    assert_eq!(ours.records.len(), 2);
    let theirs = store
        .record_checks(vec![common::alive_at(ids[2], now)], policy)
        .await
        .unwrap();
    assert!(theirs.seq > ours.seq);
    let before = ours.seq - 1;

    let (records, mark, full) = store
        .changed_since(before, 100, vec![ours.seq])
        .await
        .unwrap();
    let read: Vec<i64> = records.iter().map(|r| r.id).collect();
    assert_eq!((read, mark, full), (vec![ids[2]], theirs.seq, false));

    // A page that holds only known rows is full, reads nothing, and the
    // next page starts after them.
    let (records, mark, full) = store
        .changed_since(before, 2, vec![ours.seq])
        .await
        .unwrap();
    assert_eq!((records.len(), mark, full), (0, ours.seq, true));
    let (records, _, _) = store.changed_since(mark, 2, vec![ours.seq]).await.unwrap();
    assert_eq!(
        records.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![ids[2]]
    );

    // Without the known numbers every changed row is read.
    let (records, _, _) = store.changed_since(before, 100, vec![]).await.unwrap();
    assert_eq!(records.len(), 3);
}

/// Verdicts land on their rows, move them between statuses in listings
/// and counts, and carry a change number that a follower reading changes
/// since its mark finds, once.
async fn verdicts_are_listed_counted_and_followed(db: TestDb) {
    let store = listing_of(&db, 6).await;
    let ids = common::ids_of(&store).await;
    let mark = store.change_seq().await.unwrap();
    let now = proxywarden::store::now_ms();
    record_verdicts(&store, &ids[..2], &ids[2..3], now).await;
    let alive = store
        .list_proxies(ProxyFilter {
            status: Some(proxywarden::proxy::Status::Alive),
            ..ProxyFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(alive.iter().map(|r| r.id).collect::<Vec<_>>(), ids[..2]);
    assert!(
        alive
            .iter()
            .all(|r| r.checks_ok == 1 && r.last_alive == Some(now))
    );
    let stats = store.stats().await.unwrap();
    assert_eq!(
        (
            stats.by_status["alive"],
            stats.by_status["dead"],
            stats.by_status["unknown"]
        ),
        (2, 1, 3)
    );
    assert_eq!(stats.by_reason["refused"], 1);
    // Checked proxies are due again later; the unchecked ones still now,
    // and those whose checks are pulled in or asked for.
    assert_eq!(store.count_due(now, false).await.unwrap(), 3);
    store.pull_checks_in(vec![(ids[0], now)]).await.unwrap();
    store.mark_due_many(vec![ids[1]], now).await.unwrap();
    assert_eq!(store.count_due(now, false).await.unwrap(), 5);
    assert_eq!(store.next_due_at(now).await.unwrap(), Some(1_000));
    let (changed, next, full) = store.changed_since(mark, 100, Vec::new()).await.unwrap();
    let mut changed: Vec<i64> = changed.iter().map(|r| r.id).collect();
    changed.sort_unstable();
    assert_eq!(changed, ids[..3]);
    assert!(!full && next > mark);
    let (again, _, _) = store.changed_since(next, 100, Vec::new()).await.unwrap();
    assert!(again.is_empty(), "a change read twice");
    assert_eq!(
        store.proxies_by_ids(vec![ids[2]]).await.unwrap()[0]
            .reason
            .as_deref(),
        Some("refused")
    );
}

/// `min_anonymity` lists the proxies at that level or above, and none
/// whose anonymity is unknown.
async fn a_minimum_anonymity_lists_that_level_and_above(db: TestDb) {
    use proxywarden::proxy::Anonymity;
    let store = listing_of(&db, 4).await;
    let ids = common::ids_of(&store).await;
    let now = proxywarden::store::now_ms();
    let levels = [
        Anonymity::Transparent,
        Anonymity::Anonymous,
        Anonymity::Elite,
    ];
    let verdicts = ids
        .iter()
        .zip(levels)
        .map(|(&id, level)| {
            let mut v = common::alive_at(id, now);
            v.outcome.anonymity = Some(level);
            v
        })
        .collect();
    store.record_checks(verdicts, policy()).await.unwrap();
    for (min, want) in [
        (Anonymity::Transparent, &ids[..3]),
        (Anonymity::Anonymous, &ids[1..3]),
        (Anonymity::Elite, &ids[2..3]),
    ] {
        let listed = store
            .list_proxies(ProxyFilter {
                min_anonymity: Some(min),
                ..ProxyFilter::default()
            })
            .await
            .unwrap();
        let mut listed: Vec<i64> = listed.iter().map(|r| r.id).collect();
        listed.sort_unstable();
        assert_eq!(listed, want, "min_anonymity {min:?}");
    }
}

/// What use teaches lands on the rows: reports, worked uses (a sighting
/// alive), a failed report asking for a check; proxies are found by
/// identity; and a purge takes the long-dead proxies no list names.
async fn uses_reports_lookups_and_purge(db: TestDb) {
    let store = listing_of(&db, 4).await;
    let ids = common::ids_of(&store).await;
    assert!(store.record_report(ids[0], true, 5).await.unwrap());
    assert!(!store.record_report(ids[3] + 100, true, 5).await.unwrap());
    store
        .record_worked(vec![(ids[1], 3, 7_000), (ids[1], 2, 6_000)])
        .await
        .unwrap();
    let r = &store.proxies_by_ids(vec![ids[1]]).await.unwrap()[0];
    assert_eq!(r.last_alive, Some(7_000));
    let mut wanted: Vec<proxywarden::proxy::Proxy> =
        candidates(2).into_iter().map(|c| c.proxy).collect();
    wanted.push(proxywarden::proxy::Proxy::parse_url("socks5://10.9.9.9:1080").unwrap());
    assert_eq!(
        store.proxy_ids(wanted).await.unwrap(),
        [Some(ids[0]), Some(ids[1]), None]
    );
    // Dead since 2 s, listed by no source since: purged after a day, but
    // only once the source's list is older than the cut too.
    record_verdicts(&store, &[], &ids[2..], 2_000).await;
    let day = std::time::Duration::from_secs(86_400);
    assert_eq!(store.purge(500, day).await.unwrap(), 0);
    assert_eq!(store.purge(10 * 86_400_000, day).await.unwrap(), 2);
    assert_eq!(common::ids_of(&store).await, ids[..2]);
}

/// Site records and snapshots are kept, read back, bounded.
async fn site_records_and_snapshots_round_trip(db: TestDb) {
    let store = listing_of(&db, 2).await;
    let ids = common::ids_of(&store).await;
    let site = |proxy_id: i64, at: i64| proxywarden::store::SiteRecord {
        site: "example.com".into(),
        proxy_id,
        worked: 3,
        blocked: 1,
        latency_ms: Some(120),
        last_worked_at: Some(at),
        last_blocked_at: None,
        banned_until: Some(at + 60_000),
        updated_at: at,
    };
    // A record of a proxy that is gone is dropped, not an error.
    store
        .save_site_records(vec![
            site(ids[0], 1_000),
            site(ids[1], 2_000),
            site(ids[1] + 9, 3_000),
        ])
        .await
        .unwrap();
    store
        .save_site_records(vec![site(ids[0], 4_000)])
        .await
        .unwrap();
    let loaded = store.load_site_records(0, 10).await.unwrap();
    assert_eq!(loaded, [site(ids[0], 4_000), site(ids[1], 2_000)]);

    let snap = |at: i64, alive: i64| proxywarden::store::Snapshot {
        at,
        alive,
        servable: alive,
        ..Default::default()
    };
    for (at, alive) in [(0, 2), (60_000, 4), (120_000, 7), (180_000, 9)] {
        store
            .record_snapshot(snap(at, alive), 60_000)
            .await
            .unwrap();
    }
    // The first fell out of the window; buckets of two minutes average.
    let got = store.snapshots(0, 120_000).await.unwrap();
    assert_eq!(got, [snap(0, 4), snap(120_000, 8)]);
}

/// Crawl jobs: queued within the bound, listed newest first without their
/// long lists, run and ended, and the unended ones found for a restart.
async fn crawl_jobs_are_queued_run_and_ended(db: TestDb) {
    let store = db.store;
    let spec = |seed: &str| format!(r#"{{"seeds":["{seed}","{seed}2"],"max_pages":5}}"#);
    let a = store.insert_crawl_job(spec("http://a/")).await.unwrap();
    let b = store
        .insert_crawl_job_bounded(spec("http://b/"), 2)
        .await
        .unwrap()
        .expect("room for a second");
    assert_eq!(
        store
            .insert_crawl_job_bounded(spec("http://c/"), 2)
            .await
            .unwrap(),
        None
    );
    assert_eq!((a.state.as_str(), b.id > a.id), ("queued", true));
    store.crawl_job_running(a.id).await.unwrap();
    store.crawl_job_paused(a.id, "{}".into()).await.unwrap();
    store
        .crawl_job_ended(b.id, "failed", None, Some("no proxy".into()))
        .await
        .unwrap();
    let unended = store.unended_crawl_jobs().await.unwrap();
    assert_eq!(unended.len(), 1);
    assert_eq!(
        (unended[0].id, unended[0].state.as_str()),
        (a.id, "running")
    );
    assert_eq!(unended[0].summary.as_deref(), Some("{}"));
    let ended = store.crawl_job(b.id).await.unwrap().unwrap();
    assert_eq!(ended.error.as_deref(), Some("no proxy"));
    assert!(ended.finished_at.is_some());
    let listing = store.crawl_job_listing(10, None).await.unwrap();
    assert_eq!(
        listing.iter().map(|(r, n)| (r.id, *n)).collect::<Vec<_>>(),
        [(b.id, 2), (a.id, 2)]
    );
    let options: serde_json::Value = serde_json::from_str(&listing[0].0.spec).unwrap();
    assert_eq!(options, serde_json::json!({"max_pages": 5}));
    assert_eq!(
        store.crawl_job_listing(10, Some(b.id)).await.unwrap().len(),
        1
    );
    assert_eq!(store.crawl_jobs(1).await.unwrap()[0].id, b.id);
}

/// Two nodes leasing due checks at once take disjoint proxies that cover
/// all that is due; while the leases hold nothing more is leased; a
/// deferral or a verdict ends a lease, and a lease that expires (its node
/// died) lets another node take the proxy.
async fn due_checks_are_leased_once_across_nodes(db: TestDb) {
    let a = listing_of(&db, 300).await;
    let b = db.second_node().await;
    let now = proxywarden::store::now_ms();
    let lease = std::time::Duration::from_secs(60);
    let lane = DueLane::Others;
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    loop {
        let (pa, pb) = tokio::join!(
            a.lease_due("a".into(), now, lane, 25, lease),
            b.lease_due("b".into(), now, lane, 25, lease)
        );
        let (pa, pb) = (pa.unwrap(), pb.unwrap());
        if pa.is_empty() && pb.is_empty() {
            break;
        }
        assert!(
            pa.windows(2)
                .all(|w| (w[0].next_check_at, w[0].id) < (w[1].next_check_at, w[1].id)),
            "in due order"
        );
        got_a.extend(pa.iter().map(|d| d.id));
        got_b.extend(pb.iter().map(|d| d.id));
    }
    let mut all: Vec<i64> = got_a.iter().chain(&got_b).copied().collect();
    all.sort_unstable();
    assert_eq!(all, common::ids_of(&a).await, "every due proxy leased once");
    if db.is_postgres() {
        assert!(
            !got_a.is_empty() && !got_b.is_empty(),
            "both nodes took work"
        );
    }

    // A deferral ends the lease: due again, another node takes it.
    let deferred: Vec<i64> = got_a.iter().take(10).copied().collect();
    a.defer_checks(deferred.clone(), now).await.unwrap();
    let retaken = b
        .lease_due("b".into(), now, lane, 100, lease)
        .await
        .unwrap();
    assert_eq!(retaken.iter().map(|d| d.id).collect::<Vec<_>>(), deferred);
    // A verdict ends it too (and the proxy is due later, not now).
    record_verdicts(&a, &got_a[10..20], &[], now).await;
    let after = now + 61_000;
    // Node a died holding the rest: its leases expire, b takes them.
    let expired = b
        .lease_due("b".into(), after, lane, 1_000, lease)
        .await
        .unwrap();
    let mut expired: Vec<i64> = expired.iter().map(|d| d.id).collect();
    expired.sort_unstable();
    let mut expected: Vec<i64> = got_a[20..]
        .iter()
        .chain(&got_b)
        .chain(&deferred)
        .copied()
        .collect();
    expected.sort_unstable();
    assert_eq!(expired, expected);
}

/// A scheduled harvest of a source is claimed once per slot across nodes;
/// a node's leases given back are due for any node at once; a failure in
/// use is stamped with a change number every node reads.
async fn harvest_claims_leases_given_back_and_failures_in_use(db: TestDb) {
    let a = listing_of(&db, 20).await;
    let b = db.second_node().await;
    let now = proxywarden::store::now_ms();
    let claim = |s: &Store, source: &str, slot: i64, node: &str| {
        let s = s.clone();
        let (source, node) = (source.to_owned(), node.to_owned());
        async move {
            s.claim_harvest(source, slot, node, now, now + 60_000)
                .await
                .unwrap()
        }
    };
    let (first, second) = tokio::join!(claim(&a, "x", 1_000, "a"), claim(&b, "x", 1_000, "b"));
    assert!(
        first ^ second,
        "one claim of (x, 1000) wins: {first} {second}"
    );
    assert!(!claim(&a, "x", 1_000, "a").await);
    assert!(claim(&b, "x", 2_000, "b").await, "the next slot is free");
    assert!(claim(&b, "y", 1_000, "b").await, "another source is free");

    // Held claims lapse when their node stops renewing them (it died):
    // another node takes them over, one node each; a finished harvest is
    // never taken again; a node restarted under its id takes its own back
    // at once.
    let lapsed = |s: &Store, node: &str, at: i64| {
        let (s, node) = (s.clone(), node.to_owned());
        async move {
            let mut taken = s.take_lapsed_harvests(node, at, at + 60_000).await.unwrap();
            taken.sort_unstable();
            taken
        }
    };
    let holder = if first { "a" } else { "b" };
    // x (slot 1000) is the holder's; x (2000) and y are b's.
    assert!(lapsed(&a, "c", now + 1).await.is_empty(), "all are held");
    assert_eq!(
        b.renew_harvest_claims("b".into(), now + 120_000)
            .await
            .unwrap(),
        2 + u64::from(second)
    );
    let (one, other) = tokio::join!(lapsed(&a, "c", now + 60_001), lapsed(&b, "d", now + 60_001));
    let taken: Vec<_> = one.iter().chain(&other).cloned().collect();
    let expected: Vec<(String, i64)> = if holder == "a" {
        vec![("x".into(), 1_000)]
    } else {
        Vec::new()
    };
    assert_eq!(
        taken, expected,
        "only the lapsed claim of a, once: {one:?} {other:?}"
    );
    assert!(!claim(&a, "y", 1_000, "a").await, "b still holds y");
    assert_eq!(
        b.finish_harvest_claims("b".into(), Some("y".into()))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        b.finish_harvest_claims("b".into(), None).await.unwrap(),
        1 + u64::from(second)
    );
    assert_eq!(
        lapsed(&a, "c", now + 10_000_000).await,
        expected,
        "what c or d took lapses in turn; what b finished never does"
    );
    assert!(
        !claim(&a, "y", 1_000, "a").await,
        "y was harvested in that slot"
    );
    assert!(claim(&a, "z", 1_000, "a").await);
    assert_eq!(
        lapsed(&a, "a", now).await,
        vec![("z".into(), 1_000)],
        "a restarted takes its own claim back at once"
    );
    assert!(!claim(&b, "z", 1_000, "b").await);

    let lease = std::time::Duration::from_secs(60);
    let held = a
        .lease_due("a".into(), now, DueLane::Others, 100, lease)
        .await
        .unwrap();
    assert_eq!(held.len(), 20);
    assert!(
        b.lease_due("b".into(), now, DueLane::Others, 100, lease)
            .await
            .unwrap()
            .is_empty()
    );
    // Proxies another node is checking are not due for this one until
    // their lease ends: an idle node waits, rather than running empty
    // rounds.
    assert_eq!(b.next_due_at(now).await.unwrap(), None);
    let lease_ms = i64::try_from(lease.as_millis()).unwrap();
    assert!(
        b.next_due_at(now + lease_ms + 1)
            .await
            .unwrap()
            .is_some_and(|t| t <= now),
        "due again once the lease has ended"
    );
    assert_eq!(a.release_leases("a".into()).await.unwrap(), 20);
    assert!(b.next_due_at(now).await.unwrap().is_some_and(|t| t <= now));
    assert_eq!(
        b.lease_due("b".into(), now, DueLane::Others, 100, lease)
            .await
            .unwrap()
            .len(),
        20,
        "given back, due for any node"
    );

    let id = held[0].id;
    let mark = b.change_seq().await.unwrap();
    assert!(a.record_report(id, false, now).await.unwrap());
    let (changed, _, _) = b.changed_since(mark, 100, Vec::new()).await.unwrap();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].id, id);
    assert_eq!(changed[0].failed_in_use_at, Some(now));
    assert!(changed[0].failed_since_checked());
}

/// Sources whose lists overlap, as public lists do, written at the same
/// time (a harvest's concurrency, and on PostgreSQL two nodes): every
/// source is stored whole, each proxy once with a link to every source
/// that lists it, the hints any source gave, and the new ones counted once
/// in all. Lists longer than a transaction and short ones, in the
/// sources' own orders, so that writers meet the same new proxies in
/// different orders.
async fn overlapping_sources_written_at_once_store_every_source(db: TestDb) {
    const SOURCES: u32 = 8;
    const ADDRESSES: u32 = 9_000;
    let other = db.second_node().await;
    // Source `s` lists address `a` when this hash says so: about half of
    // all, so that every pair of lists shares about a quarter.
    let lists =
        |s: u32, a: u32| (a.wrapping_mul(2_654_435_761) ^ s.wrapping_mul(40_503)) % 7 < 3 + s % 2;
    let country = |a: u32| ["DE", "US", "FR"][(a % 3) as usize];
    let mut expected: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    let mut runs = Vec::new();
    for s in 0..SOURCES {
        let name = format!("s{s}");
        // Short lists (one transaction) and long ones; forward and backward.
        let limit = if s % 3 == 0 { 1_500 } else { ADDRESSES };
        let mut addrs: Vec<u32> = (0..ADDRESSES)
            .filter(|&a| lists(s, a))
            .take(limit as usize)
            .collect();
        if s % 2 == 1 {
            addrs.reverse();
        }
        let list: Vec<Candidate> = addrs
            .iter()
            .map(|&a| {
                // Half the sources give a country: the same one for an
                // address whichever source gives it.
                let hints = Hints {
                    country: (s % 2 == 0)
                        .then(|| proxywarden::proxy::Country::parse(country(a)).unwrap()),
                    ..Hints::default()
                };
                let scheme = if a % 5 == 0 {
                    Scheme::Socks5
                } else {
                    Scheme::Http
                };
                Candidate::new(
                    IpAddr::V4(Ipv4Addr::from(0x0b00_0000 + a)),
                    8080,
                    None,
                    None,
                    SourceScheme::Fixed(scheme),
                    hints,
                )
            })
            .collect();
        for c in &list {
            expected
                .entry(c.proxy.to_string())
                .or_default()
                .insert(name.clone());
        }
        let store = if s % 2 == 0 {
            db.store.clone()
        } else {
            other.clone()
        };
        let len = list.len();
        runs.push(async move {
            let counts = store.record_source_run(run(&name, 1_000), list).await;
            (name, len, counts)
        });
    }
    let mut new = 0;
    for (name, len, counts) in futures::future::join_all(runs).await {
        let counts = counts.unwrap_or_else(|e| panic!("source {name} was not stored: {e}"));
        assert_eq!(counts.found, len, "{name}");
        new += counts.new;
    }
    assert_eq!(new, expected.len(), "every proxy counted new once in all");
    let stats = db.store.stats().await.unwrap();
    assert_eq!(stats.total, expected.len() as i64);
    let stored = db.store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(stored.len(), expected.len());
    for r in &stored {
        let url = r.proxy.to_string();
        let sources: BTreeSet<String> = r.sources.iter().cloned().collect();
        assert_eq!(Some(&sources), expected.get(&url), "{url}");
        // It has a country when one of its sources gave it.
        let gave = sources
            .iter()
            .any(|n| n[1..].parse::<u32>().unwrap() % 2 == 0);
        let a = u32::from(match r.proxy.host {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(_) => unreachable!(),
        }) - 0x0b00_0000;
        assert_eq!(
            r.country.as_ref().map(|c| c.as_str().to_owned()),
            gave.then(|| country(a).to_owned()),
            "{url}"
        );
    }
    for source in db.store.list_sources().await.unwrap() {
        let listed = expected
            .values()
            .filter(|s| s.contains(&source.name))
            .count();
        assert_eq!(source.proxies, listed as i64, "{}", source.name);
        assert_eq!(source.last_found, Some(listed as i64), "{}", source.name);
    }
}

on_both_backends!(
    overlapping_sources_written_at_once_store_every_source,
    harvest_claims_leases_given_back_and_failures_in_use,
    due_checks_are_leased_once_across_nodes,
    uses_reports_lookups_and_purge,
    site_records_and_snapshots_round_trip,
    crawl_jobs_are_queued_run_and_ended,
    a_candidate_on_port_0_is_refused_by_name,
    listing_pages_are_cut_in_sql,
    due_proxies_page_once_each_in_due_order,
    a_proxy_left_out_keeps_its_last_sighting,
    proxies_seen_by_two_sources_count_once,
    each_source_counts_its_alive_and_unique_proxies,
    source_counts_hold_across_many_thousand_links,
    a_detected_entry_is_the_proxy_known_at_its_address,
    verdicts_are_listed_counted_and_followed,
    a_minimum_anonymity_lists_that_level_and_above,
    crawl_frontiers_batch_their_writes_and_resume,
    crawl_pages_are_leased_to_one_node_until_they_end,
    crawl_jobs_are_leased_renewed_taken_over_and_cancelled_from_any_node,
    crawl_turns_at_a_host_are_a_delay_apart_across_nodes,
    an_ended_jobs_frontier_is_deleted_and_ended_jobs_are_kept_for_a_while,
);

/// Nodes starting together on one PostgreSQL database migrate it once
/// (the advisory lock), and both then write and read the same rows; a
/// database from a newer proxywarden is refused, not written.
#[tokio::test]
async fn postgres_nodes_starting_together_share_one_migrated_database() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let url = server.url();
    let (a, b) = tokio::join!(Store::connect(&url), Store::connect(&url));
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.schema_version().await.unwrap(), POSTGRES_SCHEMA_VERSION);
    assert_eq!(b.schema_version().await.unwrap(), POSTGRES_SCHEMA_VERSION);
    a.record_source_run(run("a", 1_000), candidates(5))
        .await
        .unwrap();
    assert_eq!(b.stats().await.unwrap().total, 5);

    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .execute(
            "INSERT INTO schema_migrations (version, applied_at) VALUES (99, 0)",
            &[],
        )
        .await
        .unwrap();
    let err = Store::connect(&url).await.unwrap_err();
    assert!(matches!(err, StoreError::TooNew { found: 99, .. }), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "only knows up to {POSTGRES_SCHEMA_VERSION}; upgrade proxywarden or point database.url \
             at another database"
        )),
        "{err}"
    );
}

/// `database.url` picks PostgreSQL for the commands: `harvest` writes
/// there (no SQLite file appears), `stats` reads it back, and `config
/// check` names the database without its password.
#[tokio::test]
async fn commands_use_the_postgres_database_the_config_names() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("list.txt"),
        "1.2.3.4:8080\n5.6.7.8:3128\nsocks5://9.9.9.9:1080\n",
    )
    .unwrap();
    // The server trusts every local user: the password is only shown, not checked.
    let url = server.url().replace("postgres@", "postgres:s3cret@");
    let config = dir.path().join("proxywarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = {url:?}\npath = {:?}\n\
             [[sources]]\nname = \"list\"\nurl = {:?}\n",
            dir.path().join("local.db"),
            dir.path().join("list.txt"),
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };

    let out = common::binary::run(bin, &config, &["config", "check"])
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("database postgres://postgres:***@127.0.0.1:"),
        "{}",
        text(&out)
    );
    assert!(!text(&out).contains("s3cret"));

    let out = common::binary::run(bin, &config, &["harvest"])
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        !dir.path().join("local.db").exists(),
        "a SQLite file was made"
    );
    let out = common::binary::run(bin, &config, &["stats", "--json"])
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(stats["total"], 3);
    assert_eq!(stats["sources"][0]["last_found"], 3);
    let store = Store::connect(&server.url()).await.unwrap();
    assert_eq!(store.list_sources().await.unwrap()[0].name, "list");
}

/// `harvest` of lists that repeat each other's proxies, all fetched at
/// once: PostgreSQL stores every source, and what `export` and `stats`
/// show is what SQLite shows for the same lists. A store error that is not
/// the disk's is named as it is, without advice about disk space or a
/// SQLite file.
#[tokio::test]
async fn a_harvest_of_overlapping_lists_stores_on_postgres_what_it_stores_on_sqlite() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut sources = String::from("[harvest]\nconcurrency = 8\n");
    for s in 0..8u32 {
        // Each list: a run of its own and a run shared with the next list.
        let mut text = String::new();
        for a in (s * 300)..(s * 300 + 700) {
            let [_, _, hi, lo] = (0x0c00_0000u32 + a).to_be_bytes();
            let scheme = if a % 4 == 0 { "socks5://" } else { "" };
            text.push_str(&format!("{scheme}12.0.{hi}.{lo}:{}\n", 3128 + a % 3));
        }
        let path = dir.path().join(format!("list{s}.txt"));
        std::fs::write(&path, text).unwrap();
        sources.push_str(&format!(
            "[[sources]]\nname = \"list{s}\"\nurl = {:?}\n",
            path.display().to_string()
        ));
    }
    let config_of = |name: &str, database: &str| {
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, format!("[database]\n{database}\n{sources}")).unwrap();
        path
    };
    let sqlite = config_of(
        "sqlite",
        &format!("path = {:?}", dir.path().join("proxywarden.db")),
    );
    let postgres = config_of(
        "postgres",
        &format!(
            "url = {:?}\npath = {:?}",
            server.url(),
            dir.path().join("unused.db")
        ),
    );
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let mut seen = Vec::new();
    for config in [&sqlite, &postgres] {
        let out = common::binary::run(bin, config, &["harvest"])
            .await
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let out = common::binary::run(bin, config, &["export", "--status", "all"])
            .await
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let mut exported: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        exported.sort();
        let out = common::binary::run(bin, config, &["stats", "--json"])
            .await
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
        let stats: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let per_source: Vec<(String, i64, i64)> = stats["sources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["name"].as_str().unwrap().to_owned(),
                    s["last_found"].as_i64().unwrap(),
                    s["proxies"].as_i64().unwrap(),
                )
            })
            .collect();
        seen.push((exported, stats["total"].clone(), per_source));
    }
    assert_eq!(seen[0].1, 2_800, "the lists hold 2,800 distinct proxies");
    assert_eq!(seen[0].0.len(), 2_800);
    assert_eq!(seen[1], seen[0], "PostgreSQL stores what SQLite stores");

    // A write the server refuses for a reason that is not the disk.
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN RAISE EXCEPTION 'refused by a rule of the test' USING DETAIL = 'no new proxies'; END $$;
             CREATE TRIGGER refuse BEFORE INSERT ON proxies FOR EACH ROW EXECUTE FUNCTION refuse();",
        )
        .await
        .unwrap();
    std::fs::write(dir.path().join("list0.txt"), "13.0.0.1:8080\n").unwrap();
    let out = common::binary::run(bin, &postgres, &["harvest", "--source", "list0"])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("refused by a rule of the test"), "{stderr}");
    assert!(!stderr.contains("free space"), "{stderr}");
    assert!(!stderr.contains(".db"), "{stderr}");
}

/// `stats` and `export` only read: on an empty PostgreSQL database they
/// say there is nothing there yet, naming the database, and leave it as
/// it was (no tables made); `check`, which writes, names the database by
/// its URL when it holds no proxies, not a SQLite file.
#[tokio::test]
async fn reading_commands_leave_an_empty_postgres_database_untouched() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let url = server.url().replace("postgres@", "postgres:s3cret@");
    let config = dir.path().join("proxywarden.toml");
    std::fs::write(
        &config,
        format!(
            "[database]\nurl = {url:?}\npath = {:?}\n",
            dir.path().join("proxywarden.db")
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let tables = async || -> i64 {
        client
            .query_one(
                "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
                &[],
            )
            .await
            .unwrap()
            .get(0)
    };
    for args in [&["stats"][..], &["export", "--status", "all"]] {
        let out = common::binary::run(bin, &config, args).await.unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(
            stderr.contains("the database postgres://postgres:***@127.0.0.1:")
                && stderr.contains("holds no proxywarden data yet"),
            "{args:?}: {stderr}"
        );
        assert!(!stderr.contains("s3cret"), "{stderr}");
        assert_eq!(tables().await, 0, "{args:?} made tables");
    }
    let out = common::binary::run(bin, &config, &["check"]).await.unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the database postgres://postgres:***@127.0.0.1:")
            && stderr.contains("holds no proxies yet"),
        "{stderr}"
    );
    assert!(!stderr.contains("proxywarden.db"), "{stderr}");
}

/// `config check` connects to the PostgreSQL database `database.url`
/// names and says in plain words what is wrong: a server that cannot be
/// reached, a database it does not have, a login it refuses; `--offline`
/// checks the file alone.
#[tokio::test]
async fn config_check_names_a_postgres_database_it_cannot_use() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("CREATE ROLE locked NOLOGIN")
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let base = server.url();
    let port = base
        .rsplit(':')
        .next()
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let nobody = common::free_port();
    let cases = [
        (base.clone(), None),
        (
            format!("postgres://postgres@127.0.0.1:{nobody}/postgres"),
            Some(format!(
                "cannot reach the PostgreSQL server at 127.0.0.1:{nobody}"
            )),
        ),
        (
            format!("postgres://postgres@127.0.0.1:{port}/nosuch"),
            Some(format!(
                "the server at 127.0.0.1:{port} has no database \"nosuch\""
            )),
        ),
        (
            format!("postgres://locked@127.0.0.1:{port}/postgres"),
            Some(format!(
                "the server at 127.0.0.1:{port} refused the login of user \"locked\""
            )),
        ),
    ];
    for (url, wrong) in cases {
        let config = dir.path().join("proxywarden.toml");
        std::fs::write(&config, format!("[database]\nurl = {url:?}\n")).unwrap();
        let out = common::binary::run(bin, &config, &["config", "check"])
            .await
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        match &wrong {
            None => assert!(out.status.success(), "{url}: {text}"),
            Some(what) => {
                assert!(!out.status.success(), "{url}: {text}");
                assert!(text.contains(what), "{url}: {text}");
                assert_eq!(text.trim().lines().count(), 1, "one line: {text}");
                let out = common::binary::run(bin, &config, &["config", "check", "--offline"])
                    .await
                    .unwrap();
                assert!(out.status.success(), "{url} --offline");
                // `serve` says the server's own words, not the pool's "db error".
                let out = tokio::time::timeout(
                    Duration::from_secs(60),
                    common::binary::run(bin, &config, &["serve"]),
                )
                .await
                .expect("serve gives up on a database it cannot use")
                .unwrap();
                let text = String::from_utf8_lossy(&out.stderr).into_owned()
                    + &String::from_utf8_lossy(&out.stdout);
                assert!(!out.status.success(), "{url}: {text}");
                assert!(!text.contains("db error"), "{url}: {text}");
            }
        }
    }
}

fn new_url(url: &str, depth: u32) -> NewUrl {
    NewUrl {
        url: url.into(),
        host: "h".into(),
        depth,
        parent: None,
    }
}

/// A frontier keeps a batch of page ends and their links until it is
/// committed with its output lengths; what was never committed (a crash)
/// is not kept; a reopened frontier resumes with what was.
async fn crawl_frontiers_batch_their_writes_and_resume(db: TestDb) {
    let store = db.store.clone();
    let job = store.insert_crawl_job("{}".into()).await.unwrap().id;
    let s = store.clone();
    async move {
        let mut f = s.frontier(job).await.unwrap();
        let added = f
            .add(&[new_url("http://h/a", 0), new_url("http://h/b", 0)])
            .await
            .unwrap();
        assert_eq!(added.len(), 2);
        assert!(f.add(&[new_url("http://h/a", 1)]).await.unwrap().is_empty());
        let more = f
            .finish(added[0].id, UrlState::Done, 2, &[new_url("http://h/c", 1)])
            .await
            .unwrap();
        assert_eq!(more.len(), 1);
        assert_eq!(more[0].url, "http://h/c");
        assert!(f.dirty());
        // Reads in the batch see its writes.
        assert_eq!(f.count(UrlState::Done).await.unwrap(), 1);
        f.commit(&[("output_len", "10".into())]).await.unwrap();
        assert!(!f.dirty());
        f.finish(added[1].id, UrlState::Done, 1, &[new_url("http://h/d", 1)])
            .await
            .unwrap();
        // Dropped with the batch open: as after kill -9.
    }
    .await;
    let s = store.clone();
    async move {
        let mut f = s.frontier(job).await.unwrap();
        assert_eq!(f.meta("output_len").await.unwrap().as_deref(), Some("10"));
        assert_eq!(f.hosts_with_work_after("", 10).await.unwrap(), ["h"]);
        let waiting: Vec<String> = f
            .waiting("h", 0, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|q| q.url)
            .collect();
        assert_eq!(waiting, ["http://h/b", "http://h/c"], "in discovery order");
        assert_eq!(f.count(UrlState::Done).await.unwrap(), 1);
        assert_eq!(f.total().await.unwrap(), 3);
        let b = f.waiting("h", 0, 1).await.unwrap().remove(0);
        f.finish(b.id, UrlState::Failed, 1, &[]).await.unwrap();
        f.commit(&[]).await.unwrap();
        assert_eq!(f.requeue_failed().await.unwrap(), 1);
        f.mark_seen_done("http://h/c", "h", 1).await.unwrap();
        f.commit(&[]).await.unwrap();
        assert_eq!(f.waiting("h", 0, 10).await.unwrap().len(), 1);
        // Another job's frontier is its own.
        let mut other = s.frontier(job + 1).await.unwrap();
        assert_eq!(other.meta("output_len").await.unwrap(), None);
        assert_eq!(
            other.add(&[new_url("http://h/a", 0)]).await.unwrap().len(),
            1
        );
    }
    .await;
}

/// Pages a node's frontier hands out are leased to it: another node's
/// frontier of the same job gets the others, and none twice; the end of a
/// page clears its lease, and a lease that ended (a node that stopped) is
/// taken again. The heartbeat's renewal keeps them.
async fn crawl_pages_are_leased_to_one_node_until_they_end(db: TestDb) {
    let (a, b) = (db.store.clone(), db.second_node().await);
    let job = a.insert_crawl_job("{}".into()).await.unwrap().id;
    let minute = Duration::from_secs(60);
    let urls: Vec<NewUrl> = (0..10)
        .map(|i| new_url(&format!("http://h/{i}"), 0))
        .collect();
    let (sa, sb) = (a.clone(), b.clone());
    let taken_by_a = async move {
        let mut fa = sa.frontier(job).await.unwrap();
        fa.lease_pages("a", minute).await;
        fa.add(&urls).await.unwrap();
        let got = fa.waiting("h", 0, 4).await.unwrap();
        fa.commit(&[]).await.unwrap();
        let mut fb = sb.frontier(job).await.unwrap();
        fb.lease_pages("b", minute).await;
        let got_b = fb.waiting("h", 0, 100).await.unwrap();
        fb.commit(&[]).await.unwrap();
        (got, got_b)
    }
    .await;
    let (got_a, got_b) = taken_by_a;
    let ids = |q: &[proxywarden::store::Queued]| q.iter().map(|q| q.id).collect::<Vec<_>>();
    // Every URL added through a leasing frontier is leased to its node at
    // once (the crawl keeps new links in memory): b finds none free.
    assert_eq!(got_a.len(), 4);
    assert!(got_b.is_empty(), "b took a's pages: {got_b:?}");
    // The renewal keeps a's leases; a release lets them go.
    let now = proxywarden::store::now_ms();
    assert_eq!(
        a.lease_crawl_jobs("a", now, minute, 1).await.unwrap().len(),
        1
    );
    assert_eq!(
        a.renew_crawl_job(job, "a", now, minute).await.unwrap(),
        Some(false)
    );
    let (sa, sb) = (a.clone(), b.clone());
    let first = got_a[0].id;
    let (after_end, b_after_release) = async move {
        let mut fa = sa.frontier(job).await.unwrap();
        fa.lease_pages("a", minute).await;
        fa.finish(first, UrlState::Done, 1, &[]).await.unwrap();
        fa.commit(&[]).await.unwrap();
        let mut fb = sb.frontier(job).await.unwrap();
        fb.lease_pages("b", minute).await;
        let none = fb.waiting("h", 0, 100).await.unwrap();
        fb.commit(&[]).await.unwrap();
        (none, fb)
    }
    .await;
    assert!(
        after_end.is_empty(),
        "the page a finished is done, the rest a's"
    );
    a.release_crawl_job(job, "a").await.unwrap();
    let mut fb = b_after_release;
    let got_b = async move {
        let got = fb.waiting("h", 0, 100).await.unwrap();
        fb.commit(&[]).await.unwrap();
        got
    }
    .await;
    assert_eq!(got_b.len(), 9, "released: b takes all but the done one");
    assert!(!ids(&got_b).contains(&first));

    // A lease that ended is taken by another node.
    let sb = b.clone();
    let sa = a.clone();
    let taken = async move {
        let mut fb = sb.frontier(job).await.unwrap();
        fb.lease_pages("b", Duration::ZERO).await;
        fb.waiting("h", 0, 100).await.unwrap();
        fb.commit(&[]).await.unwrap();
        let mut fa = sa.frontier(job).await.unwrap();
        fa.lease_pages("a", minute).await;
        let got = fa.waiting("h", 0, 100).await.unwrap();
        fa.commit(&[]).await.unwrap();
        got
    }
    .await;
    assert_eq!(taken.len(), 9, "b's leases ended: a takes its pages");

    // b takes the job over: the pages a still leases are b's to take.
    let now = proxywarden::store::now_ms();
    assert_eq!(
        b.lease_crawl_jobs("b", now, minute, 1).await.unwrap().len(),
        1
    );
    let sb = b.clone();
    let got = async move {
        let mut fb = sb.frontier(job).await.unwrap();
        fb.lease_pages("b", minute).await;
        let got = fb.waiting("h", 0, 100).await.unwrap();
        fb.commit(&[]).await.unwrap();
        got
    }
    .await;
    assert_eq!(got.len(), 9, "the job's new holder takes its pages");
}

/// A job is leased by one node; its renewal keeps it; once the lease ends
/// another node takes it over, and the first learns it lost it. A cancel
/// asked anywhere ends a job no node holds at once, and reaches the node
/// holding one through its renewal.
async fn crawl_jobs_are_leased_renewed_taken_over_and_cancelled_from_any_node(db: TestDb) {
    let (a, b) = (db.store.clone(), db.second_node().await);
    let lease = Duration::from_secs(10);
    let j1 = a.insert_crawl_job("{}".into()).await.unwrap().id;
    let j2 = a.insert_crawl_job("{}".into()).await.unwrap().id;
    let now = proxywarden::store::now_ms();
    let (la, lb) = tokio::join!(
        a.lease_crawl_jobs("a", now, lease, 1),
        b.lease_crawl_jobs("b", now, lease, 1)
    );
    let (la, lb) = (la.unwrap(), lb.unwrap());
    let mut both: Vec<i64> = la.iter().chain(&lb).map(|j| j.id).collect();
    both.sort_unstable();
    assert_eq!(both, [j1, j2], "each job to one node");
    let (held_a, held_b) = (la[0].id, lb[0].id);
    assert!(
        a.lease_crawl_jobs("c", now, lease, 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        a.renew_crawl_job(held_a, "a", now, lease).await.unwrap(),
        Some(false)
    );
    assert_eq!(
        a.renew_crawl_job(held_a, "b", now, lease).await.unwrap(),
        None
    );

    // a stops renewing: after its lease, c takes the job over.
    let later = now + 11_000;
    let taken = b.lease_crawl_jobs("c", later, lease, 5).await.unwrap();
    let taken_ids: Vec<i64> = taken.iter().map(|j| j.id).collect();
    assert_eq!(taken_ids, [j1, j2]);
    assert_eq!(
        a.renew_crawl_job(held_a, "a", later, lease).await.unwrap(),
        None
    );
    assert_eq!(
        b.renew_crawl_job(held_b, "c", later, lease).await.unwrap(),
        Some(false)
    );

    // A cancel asked on a node that does not hold the job reaches c.
    assert_eq!(
        a.cancel_crawl_job(j1, later).await.unwrap(),
        CancelAsk::Asked
    );
    assert_eq!(
        b.renew_crawl_job(j1, "c", later, lease).await.unwrap(),
        Some(true)
    );
    b.crawl_job_ended(j1, "cancelled", None, None)
        .await
        .unwrap();
    assert_eq!(a.crawl_job(j1).await.unwrap().unwrap().state, "cancelled");
    assert_eq!(
        b.renew_crawl_job(j1, "c", later, lease).await.unwrap(),
        None,
        "ended"
    );
    assert_eq!(
        a.cancel_crawl_job(j1, later).await.unwrap(),
        CancelAsk::NotRunning
    );

    // A job no node holds (queued, or its node gone) ends at once.
    let j3 = a.insert_crawl_job("{}".into()).await.unwrap().id;
    assert_eq!(
        b.cancel_crawl_job(j3, later).await.unwrap(),
        CancelAsk::Ended
    );
    assert_eq!(a.crawl_job(j3).await.unwrap().unwrap().state, "cancelled");
    assert_eq!(
        b.cancel_crawl_job(j2, later + 20_000).await.unwrap(),
        CancelAsk::Ended
    );
    assert_eq!(
        b.cancel_crawl_job(999_999, later).await.unwrap(),
        CancelAsk::NotRunning
    );

    // A node alone on its database takes back its last run's leases.
    let j4 = a.insert_crawl_job("{}".into()).await.unwrap().id;
    assert_eq!(
        a.lease_crawl_jobs("old", later, lease, 5)
            .await
            .unwrap()
            .len(),
        1
    );
    a.clear_crawl_leases().await.unwrap();
    let back = a.lease_crawl_jobs("new", later, lease, 5).await.unwrap();
    assert_eq!(back.iter().map(|j| j.id).collect::<Vec<_>>(), [j4]);
}

/// Turns at one host of one job, taken at once from two nodes, start a
/// delay apart, whatever the order they arrive in; another host or job
/// has turns of its own.
async fn crawl_turns_at_a_host_are_a_delay_apart_across_nodes(db: TestDb) {
    let (a, b) = (db.store.clone(), db.second_node().await);
    let now = proxywarden::store::now_ms();
    let delay = Duration::from_millis(1500);
    let mut turns = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..20 {
        let s = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move { s.take_crawl_turn(7, "site:80", now, delay).await.unwrap() });
    }
    while let Some(t) = tasks.join_next().await {
        turns.push(t.unwrap());
    }
    turns.sort_unstable();
    assert_eq!(turns[0], now, "the first turn is now");
    for w in turns.windows(2) {
        assert_eq!(w[1] - w[0], 1500, "{turns:?}");
    }
    // A turn asked after the last one's time starts then.
    let late = turns[19] + 10_000;
    assert_eq!(
        a.take_crawl_turn(7, "site:80", late, delay).await.unwrap(),
        late
    );
    assert_eq!(
        a.take_crawl_turn(7, "other:80", now, delay).await.unwrap(),
        now
    );
    assert_eq!(
        b.take_crawl_turn(8, "site:80", now, delay).await.unwrap(),
        now
    );
}

/// A job's frontier (URLs, settings, hosts' turns) goes when the job ends
/// or is cancelled while no node holds it; ended jobs beyond the newest
/// `keep` or ended before a time are deleted; jobs not ended never are.
async fn an_ended_jobs_frontier_is_deleted_and_ended_jobs_are_kept_for_a_while(db: TestDb) {
    let store = db.store.clone();
    let mut ids = Vec::new();
    for _ in 0..5 {
        ids.push(store.insert_crawl_job("{}".into()).await.unwrap().id);
    }
    let now = proxywarden::store::now_ms();
    for &job in &ids {
        let s = store.clone();
        async move {
            let mut f = s.frontier(job).await.unwrap();
            let urls: Vec<NewUrl> = (0..100)
                .map(|i| new_url(&format!("http://h/{i}"), 0))
                .collect();
            assert_eq!(f.add(&urls).await.unwrap().len(), 100);
            f.set_meta("seeds", "http://h/0").await.unwrap();
            f.commit(&[]).await.unwrap();
        }
        .await;
        store
            .take_crawl_turn(job, "h:80", now, Duration::from_secs(1))
            .await
            .unwrap();
    }
    let frontier = |job: i64| {
        let s = store.clone();
        async move {
            let mut f = s.frontier(job).await.unwrap();
            (f.total().await.unwrap(), f.meta("seeds").await.unwrap())
        }
    };
    let (a, b, c, d, e) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    store
        .crawl_job_ended(a, "finished", Some("{}".into()), None)
        .await
        .unwrap();
    assert_eq!(frontier(a).await, (0, None), "ended: its frontier is gone");
    assert_eq!(
        store.cancel_crawl_job(b, now).await.unwrap(),
        CancelAsk::Ended
    );
    assert_eq!(
        frontier(b).await,
        (0, None),
        "cancelled: its frontier is gone"
    );
    assert_eq!(frontier(c).await, (100, Some("http://h/0".into())));
    // Its turns at the host went too: the next starts now.
    assert_eq!(
        store
            .take_crawl_turn(a, "h:80", now, Duration::from_secs(1))
            .await
            .unwrap(),
        now
    );
    store
        .crawl_job_ended(d, "failed", None, Some("x".into()))
        .await
        .unwrap();
    store
        .crawl_job_ended(e, "cancelled", None, None)
        .await
        .unwrap();
    store.crawl_job_running(c).await.unwrap();

    // The newest two ended jobs are kept; nothing ended long ago.
    let purged = store.purge_crawl_jobs(2, now - 60_000).await.unwrap();
    assert_eq!(purged, [a, b]);
    assert!(store.crawl_job(a).await.unwrap().is_none());
    assert!(store.crawl_job(d).await.unwrap().is_some());
    let purged = store.purge_crawl_jobs(1, now - 60_000).await.unwrap();
    assert_eq!(purged, [d]);
    // Ended before the time: gone whatever the count; a running job stays.
    let purged = store.purge_crawl_jobs(100, now + 60_000).await.unwrap();
    assert_eq!(purged, [e]);
    let left: Vec<i64> = store
        .crawl_jobs(10)
        .await
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(left, [c]);
    assert_eq!(frontier(c).await.0, 100);
}

/// On PostgreSQL a source's links go with their proxy and with their
/// source (triggers, as on SQLite): a deleted proxy or source leaves no
/// link behind.
#[tokio::test]
async fn postgres_links_go_with_their_proxy_and_their_source() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let store = Store::connect(&server.url()).await.unwrap();
    let candidates: Vec<Candidate> = (1..=3u8)
        .map(|i| {
            Candidate::new(
                IpAddr::from([10, 0, 0, i]),
                8080,
                None,
                None,
                SourceScheme::Fixed(Scheme::Http),
                Hints::default(),
            )
        })
        .collect();
    for source in ["a", "b"] {
        store
            .record_source_run(
                common::source_run(source, "http://127.0.0.1/x", 1_000),
                candidates.clone(),
            )
            .await
            .unwrap();
    }
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let links = async || -> i64 {
        client
            .query_one("SELECT count(*) FROM proxy_sources", &[])
            .await
            .unwrap()
            .get(0)
    };
    assert_eq!(links().await, 6);
    client
        .execute("DELETE FROM proxies WHERE host = '10.0.0.1'", &[])
        .await
        .unwrap();
    assert_eq!(links().await, 4, "the proxy's two links went with it");
    client
        .execute("DELETE FROM sources WHERE name = 'a'", &[])
        .await
        .unwrap();
    assert_eq!(links().await, 2, "the source's links went with it");
}

/// On PostgreSQL a purge that deletes a proxy while a harvest's chunk
/// links it (found, not yet committed) leaves no link to a proxy that is
/// gone: the purge waits for the chunk, whose links its delete then
/// removes with the proxy. The interleaving is made, not raced: the chunk
/// is held after writing its links, where it waits for the change
/// counter, which the test holds locked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_purge_racing_a_harvest_leaves_no_link_to_a_gone_proxy() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let store = Store::connect(&server.url()).await.unwrap();
    // Two proxies of source a: 10.0.0.0 dead long ago, 10.0.0.1 never
    // checked (never purged).
    store
        .record_source_run(run("a", 1_000), candidates(2))
        .await
        .unwrap();
    let (mut client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
        .execute(
            "UPDATE proxies SET status = 'dead', last_checked = 2000 WHERE host = '10.0.0.0'",
            &[],
        )
        .await
        .unwrap();
    // The change counter held: a chunk that changes a country stops
    // before its commit, its links written.
    let held = client.transaction().await.unwrap();
    held.execute("UPDATE meta SET change_seq = change_seq", &[])
        .await
        .unwrap();
    let mut listed = candidates(2);
    listed[1].hints.country = proxywarden::proxy::Country::parse("DE");
    let harvest = tokio::spawn({
        let store = store.clone();
        async move { store.record_source_run(run("b", 3_000), listed).await }
    });
    let (probe, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    common::until(
        "the chunk waits for the counter",
        Duration::from_secs(30),
        || async { lock_waits(&probe, "UPDATE meta SET change_seq = change_seq + 1").await == 1 },
    )
    .await;
    // A purge of what was last alive or listed before 5 s runs meanwhile
    // (b's list, at 3 s, does not keep 10.0.0.0): it deletes 10.0.0.0 at
    // once or waits for the chunk.
    let purge = tokio::spawn({
        let store = store.clone();
        async move { store.purge(10_000, Duration::from_secs(5)).await }
    });
    common::until(
        "the purge is done or waits",
        Duration::from_secs(30),
        || async { purge.is_finished() || lock_waits(&probe, "pg_advisory_xact_lock(").await == 1 },
    )
    .await;
    held.rollback().await.unwrap();
    harvest.await.unwrap().unwrap();
    assert_eq!(purge.await.unwrap().unwrap(), 1);
    let orphans: i64 = probe
        .query_one(
            "SELECT count(*) FROM proxy_sources ps
             WHERE NOT EXISTS (SELECT 1 FROM proxies p WHERE p.id = ps.proxy_id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(orphans, 0, "links to a purged proxy");
    let links: i64 = probe
        .query_one("SELECT count(*) FROM proxy_sources", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(links, 2, "10.0.0.1's links to a and b");
}

/// On PostgreSQL a check that finds a placeholder's scheme already stored
/// under another row merges the placeholder into that row and deletes it;
/// a harvest's chunk that links the placeholder meanwhile (found, not yet
/// committed) loses no link to it: the merge waits for the chunk, as a
/// purge does, and then moves its link over with the others. The
/// interleaving is made as in the purge's test: the chunk is held after
/// writing its links, waiting for the change counter the test holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_a_scheme_merge_racing_a_harvest_leaves_no_link_to_a_gone_proxy() {
    use proxywarden::model::{Outcome, RecheckPolicy};
    use proxywarden::store::CheckRecord;
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let store = Store::connect(&server.url()).await.unwrap();
    // Source a: 10.0.0.0:8080 with its scheme to detect (a placeholder
    // row) and http://10.0.0.1:8080.
    let mut first = entries(2, SourceScheme::Detect, Hints::default());
    first[1] = candidates(2).remove(1);
    store
        .record_source_run(run("a", 1_000), first)
        .await
        .unwrap();
    let (mut client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let placeholder: i64 = client
        .query_one("SELECT id FROM proxies WHERE scheme_detect", &[])
        .await
        .unwrap()
        .get(0);
    let (probe, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // The change counter held: a chunk that changes a country stops
    // before its commit, its links written.
    let held = client.transaction().await.unwrap();
    held.execute("UPDATE meta SET change_seq = change_seq", &[])
        .await
        .unwrap();
    // Source b lists the placeholder (found at its address, unchanged)
    // and gives 10.0.0.1 a country.
    let mut listed = entries(2, SourceScheme::Detect, Hints::default());
    listed[1] = candidates(2).remove(1);
    listed[1].hints.country = proxywarden::proxy::Country::parse("DE");
    let harvest = tokio::spawn({
        let store = store.clone();
        async move { store.record_source_run(run("b", 3_000), listed).await }
    });
    common::until(
        "the chunk waits for the counter",
        Duration::from_secs(30),
        || async { lock_waits(&probe, "").await == 1 },
    )
    .await;
    // Source c lists socks5://10.0.0.0:8080: a row of its own, written
    // beside the held chunk.
    let socks = Candidate::new(
        IpAddr::from([10, 0, 0, 0]),
        8080,
        None,
        Some(Scheme::Socks5),
        SourceScheme::Detect,
        Hints::default(),
    );
    store
        .record_source_run(run("c", 3_000), vec![socks])
        .await
        .unwrap();
    // The check finds the placeholder speaks socks5: it is merged into
    // c's row. The merge is done at once or waits.
    let outcome = Outcome {
        failure: None,
        latency: Some(Duration::from_millis(20)),
        anonymity: None,
        https: None,
        exit_ip: None,
        country: None,
        detected: Some(Scheme::Socks5),
    };
    let check = tokio::spawn({
        let store = store.clone();
        async move {
            store
                .record_checks(
                    vec![CheckRecord {
                        id: placeholder,
                        checked_at: 4_000,
                        outcome,
                    }],
                    RecheckPolicy {
                        alive: Duration::from_secs(600),
                        alive_jitter: Duration::ZERO,
                        dead: Duration::from_secs(60),
                        dead_max: Duration::from_secs(3600),
                    },
                )
                .await
        }
    });
    common::until(
        "the merge is done or waits",
        Duration::from_secs(30),
        || async { check.is_finished() || lock_waits(&probe, "").await == 2 },
    )
    .await;
    held.rollback().await.unwrap();
    harvest.await.unwrap().unwrap();
    check.await.unwrap().unwrap();
    let orphans: i64 = probe
        .query_one(
            "SELECT count(*) FROM proxy_sources ps
             WHERE NOT EXISTS (SELECT 1 FROM proxies p WHERE p.id = ps.proxy_id)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(orphans, 0, "links to a merged placeholder");
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let sources: BTreeSet<(String, Vec<String>)> = all
        .iter()
        .map(|r| (r.proxy.to_string(), r.sources.clone()))
        .collect();
    assert_eq!(
        sources,
        BTreeSet::from([
            (
                "http://10.0.0.1:8080".to_owned(),
                vec!["a".to_owned(), "b".to_owned()]
            ),
            (
                "socks5://10.0.0.0:8080".to_owned(),
                vec!["a".to_owned(), "b".to_owned(), "c".to_owned()]
            ),
        ]),
        "every source's link reaches the merged row"
    );
}

/// On PostgreSQL a source whose first run was cut short after some of its
/// links were written (its row never recorded a list) is stored whole by
/// the next run: the links met again are taken as they are, not refused.
#[tokio::test]
async fn postgres_a_run_after_one_cut_short_meets_its_links_and_stores_whole() {
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let store = Store::connect(&server.url()).await.unwrap();
    // More than one transaction's worth, so that later chunks follow the
    // one that meets the links.
    let list = candidates(12_000);
    store
        .record_source_run(run("a", 1_000), list[..7_000].to_vec())
        .await
        .unwrap();
    let (client, conn) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    // As a run whose last chunks failed leaves it: links, and no list.
    client
        .execute("UPDATE sources SET listed_at = NULL", &[])
        .await
        .unwrap();
    let counts = store
        .record_source_run(run("a", 2_000), list.clone())
        .await
        .unwrap();
    assert_eq!((counts.found, counts.new), (12_000, 5_000));
    let row = client
        .query_one(
            "SELECT count(*), count(*) FILTER (WHERE listed), min(first_seen), max(last_seen)
             FROM proxy_sources",
            &[],
        )
        .await
        .unwrap();
    let got: (i64, i64, i64, i64) = (row.get(0), row.get(1), row.get(2), row.get(3));
    assert_eq!(got, (12_000, 12_000, 1_000, 2_000));
}

/// How many PostgreSQL sessions wait for a lock in a statement containing
/// `what` (any statement for "").
async fn lock_waits(client: &tokio_postgres::Client, what: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity
             WHERE wait_event_type = 'Lock' AND query LIKE '%' || $1 || '%'",
            &[&what],
        )
        .await
        .unwrap()
        .get(0)
}
