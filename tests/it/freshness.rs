//! Served proxies stay fresh from the first second: after a bulk check
//! (here the start-up re-check of a database another process filled) the
//! next re-checks are spread over the cycle, so the stream of re-checks
//! never stops and a mass death right after the start is seen within a
//! few of its slots, on SQLite and PostgreSQL alike.

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::fakes::{FakeHttpProxy, HttpProxyOpts};
use common::postgres::PgServer;
use proxywarden::store::{ProxyFilter, Store, now_ms};

/// Proxies served.
const SERVED: usize = 100;
/// Re-checks a second: a 25 s cycle for 100 proxies. Checked together and
/// then put two thirds to four thirds of a cycle away, none would come
/// back for the first 16 s.
const RATE: u32 = 4;
/// The cycle those give, in ms.
const CYCLE_MS: i64 = SERVED as i64 * 1_000 / RATE as i64;

async fn farm() -> Vec<FakeHttpProxy> {
    let mut proxies = Vec::new();
    for _ in 0..SERVED {
        proxies.push(
            FakeHttpProxy::start(HttpProxyOpts {
                upstream_bind: Some("127.0.0.2".parse().unwrap()),
                ..HttpProxyOpts::default()
            })
            .await,
        );
    }
    proxies
}

/// The proxies recorded alive as a `proxywarden check` records them (next
/// check ten minutes away), then a daemon started on that database; and
/// when it started (unix ms).
async fn start_on(
    store: &Store,
    dir: &std::path::Path,
    proxies: &[FakeHttpProxy],
    pg: Option<&str>,
) -> (Daemon, i64) {
    let alive: Vec<common::AliveProxy> = proxies
        .iter()
        .map(|p| common::AliveProxy::new(format!("http://{}", p.addr())))
        .collect();
    common::put_alive(store, &alive).await;
    let started = now_ms() + 1;
    let d = Daemon::start(dir, "", |c| {
        let c = c
            .set("check", "concurrency", "32")
            .set("check", "serve_recheck_rate", &RATE.to_string())
            .set("api", "judge_per_minute", "1000000");
        match pg {
            Some(url) => c.set("database", "url", &format!("\"{url}\"")),
            None => c,
        }
    })
    .await;
    (d, started)
}

/// Waits until every stored proxy was checked at or after `since`; their
/// offsets from that check to the next (ms).
async fn rechecked(store: &Store, since: i64) -> Vec<i64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = store.list_proxies(ProxyFilter::default()).await.unwrap();
        if rows.len() == SERVED && rows.iter().all(|r| r.last_checked >= Some(since)) {
            return rows
                .iter()
                .map(|r| r.next_check_at - r.last_checked.unwrap())
                .collect();
        }
        assert!(
            Instant::now() < deadline,
            "the start-up re-check never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_bulk_check_spreads_re_checks_and_a_death_is_seen_at_once(
    store: Store,
    dir: &std::path::Path,
    pg: Option<&str>,
) {
    let mut proxies = farm().await;
    let (d, started) = start_on(&store, dir, &proxies, pg).await;
    d.until_servable(SERVED as u64).await;
    let offsets = rechecked(&store, started).await;

    // Every three seconds of the cycle after the start-up re-check has
    // re-checks due, about a share each (an eighth of the proxies), none
    // more than two and a half shares.
    let mut buckets = [0usize; (CYCLE_MS / 3_000) as usize];
    for o in &offsets {
        if let Some(n) = usize::try_from(*o / 3_000)
            .ok()
            .and_then(|i| buckets.get_mut(i))
        {
            *n += 1;
        }
    }
    let share = SERVED / buckets.len();
    assert!(
        buckets.iter().all(|n| (1..=share * 5 / 2).contains(n)),
        "re-checks due in each 3 s after the start-up re-check: {buckets:?}"
    );

    // 30% die at once: a burst among the first re-checks shows it, and
    // every served proxy is re-checked, before the last of the dead would
    // have come back on its schedule.
    let killed: BTreeSet<String> = proxies
        .drain(..SERVED * 3 / 10)
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    let died = Instant::now();
    let last_due = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .iter()
        .filter(|r| killed.contains(&r.proxy.to_string()))
        .map(|r| r.next_check_at)
        .max()
        .unwrap();
    let (mut answers, mut dead) = (0u32, 0u32);
    loop {
        let (status, stats) = d.json("/stats").await;
        assert_eq!(status, 200);
        if stats["servable"].as_u64() == Some((SERVED - killed.len()) as u64) {
            break;
        }
        // The schedule alone drops the last of them at `last_due`: the
        // sweep is what must come first.
        assert!(
            now_ms() < last_due,
            "the dead were still served when their own re-checks came due: {stats}"
        );
        let resp = d.get("/proxy?format=text").await;
        if resp.status() == 200 {
            answers += 1;
            dead += u32::from(killed.contains(&resp.text().await.unwrap()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "dead dropped after {:.1}s; {dead} of {answers} answers meanwhile named one",
        died.elapsed().as_secs_f64()
    );
    for _ in 0..100 {
        let resp = d.get("/proxy?format=text").await;
        assert_eq!(resp.status(), 200);
        assert!(!killed.contains(&resp.text().await.unwrap()));
    }
    d.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_bulk_check_re_checks_are_spread_and_a_mass_death_is_seen_on_sqlite() {
    let _farm = common::THOUSANDS.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("daemon.db")).unwrap();
    a_bulk_check_spreads_re_checks_and_a_death_is_seen_at_once(store, dir.path(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_bulk_check_re_checks_are_spread_and_a_mass_death_is_seen_on_postgres() {
    let _farm = common::THOUSANDS.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::spawn_blocking(PgServer::start).await.unwrap();
    let store = Store::connect(&server.url()).await.unwrap();
    a_bulk_check_spreads_re_checks_and_a_death_is_seen_at_once(
        store,
        dir.path(),
        Some(&server.url()),
    )
    .await;
}
