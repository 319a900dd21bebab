use super::fresh::BURST_MIN;
use super::sites::{GAP_HALF_LIFE, GAP_RAISE_EVERY};
use super::*;
use crate::model::{Candidate, Hints, Outcome, Reason, SourceScheme};
use crate::proxy::Scheme;
use crate::store::{ProxyFilter, SourceRun, now_ms};

const POLICY: RecheckPolicy = RecheckPolicy {
    alive: Duration::from_secs(600),
    alive_jitter: Duration::from_secs(150),
    dead: Duration::from_secs(900),
    dead_max: Duration::from_secs(86_400),
};

/// A store in `dir` holding proxies on ports 1..=n; their ids.
async fn store_with(dir: &std::path::Path, n: u16) -> (Store, Vec<i64>) {
    let store = Store::open(&dir.join("f.db")).unwrap();
    let run = SourceRun {
        name: "s".into(),
        url: "u".into(),
        format: "text".into(),
        started_at: 1,
        http_status: None,
        duration_ms: 0,
        error: None,
        private: 0,
    };
    let candidates: Vec<Candidate> = (1..=n)
        .map(|port| {
            Candidate::new(
                "10.1.1.1".parse().unwrap(),
                port,
                None,
                None,
                SourceScheme::Fixed(Scheme::Http),
                Hints::default(),
            )
        })
        .collect();
    store.record_source_run(run, candidates).await.unwrap();
    let ids = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    (store, ids)
}

fn checked(id: i64, at: i64, failure: Option<Reason>) -> CheckRecord {
    CheckRecord {
        id,
        checked_at: at,
        outcome: Outcome {
            failure,
            latency: failure.is_none().then_some(Duration::from_millis(5)),
            ..Outcome::dead(Reason::Timeout)
        },
    }
}

#[tokio::test]
async fn committed_checks_update_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 2).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    let now = now_ms();
    feedback
        .commit_checks(
            vec![checked(ids[0], now, None), checked(ids[1], now, None)],
            POLICY,
        )
        .await
        .unwrap();
    assert_eq!(feedback.index().len(), 2);
    feedback
        .commit_checks(vec![checked(ids[1], now, Some(Reason::Refused))], POLICY)
        .await
        .unwrap();
    assert!(feedback.index().get(ids[0]).is_some());
    assert!(
        feedback.index().get(ids[1]).is_none(),
        "dead leaves the index"
    );
}

#[tokio::test]
async fn a_failure_in_use_hides_the_proxy_and_asks_for_a_recheck() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 1).await;
    let feedback = Feedback::new(HealthIndex::new(), store.clone());
    let now = now_ms();
    feedback
        .commit_checks(vec![checked(ids[0], now, None)], POLICY)
        .await
        .unwrap();
    assert_eq!(store.count_due(now, false).await.unwrap(), 0);

    let wanted = feedback.recheck_wanted();
    let reported = feedback
        .report(ids[0], UseVerdict::failed(Reason::Reset), None)
        .await
        .unwrap();
    assert_eq!(
        reported,
        Reported {
            found: true,
            hidden: true,
            recheck: true
        }
    );
    assert!(feedback.index().is_empty());
    assert_eq!(store.count_due(now_ms(), false).await.unwrap(), 1);
    tokio::time::timeout(Duration::from_secs(5), wanted)
        .await
        .expect("the check loop is woken");

    let missing = feedback
        .report(ids[0] + 1000, UseVerdict::ProxyFailed(None), None)
        .await
        .unwrap();
    assert!(!missing.found);
}

/// A start on an empty database sweeps nothing, so it holds back no
/// sweep: a burst of failures among the proxies checked since, however
/// soon, puts every other served one up for a re-check.
#[tokio::test]
async fn a_burst_soon_after_a_start_on_an_empty_index_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 8).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    let start = now_ms();
    feedback.reverify_all(start);
    let alive = ids.iter().map(|id| checked(*id, start, None)).collect();
    feedback.commit_checks(alive, POLICY).await.unwrap();
    assert!(feedback.take_rechecks().is_empty());

    let refused = Outcome::dead(Reason::Refused);
    for id in &ids[..BURST_MIN] {
        feedback.checked(*id, &refused, start + 1_000);
    }
    let mut queued = feedback.take_rechecks();
    queued.sort_unstable();
    assert_eq!(queued, ids[BURST_MIN..], "the survivors are re-checked");
}

/// A start-up re-check that passed everything has done its work: a
/// burst of failures soon after it (a mass death in the first seconds
/// of `serve`) sweeps at once, not a quarter of a freshness window
/// later. A burst while its re-checks still run does not.
#[tokio::test]
async fn a_burst_after_the_start_up_re_check_passed_everything_is_swept() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 12).await;
    let before = now_ms() - 60_000;
    let alive = ids.iter().map(|id| checked(*id, before, None)).collect();
    store.record_checks(alive, POLICY).await.unwrap();
    let index = crate::health::load_index(&store).await.unwrap();
    let feedback = Feedback::new(index, store);
    feedback.set_fresh_within(Duration::from_secs(118));
    let start = now_ms();
    feedback.reverify_all(start);
    feedback.take_rechecks();
    let refused = Outcome::dead(Reason::Refused);
    let pass = |ids: &[i64], at: i64| ids.iter().map(|id| checked(*id, at, None)).collect();

    // A third re-checked, a third failed, a third still waiting: the
    // start-up re-check still runs, so no second sweep.
    feedback
        .commit_checks(pass(&ids[..4], start + 10), POLICY)
        .await
        .unwrap();
    for id in &ids[4..8] {
        feedback.checked(*id, &refused, start + 500);
    }
    assert!(feedback.take_rechecks().is_empty(), "the sweep still runs");

    // The rest passed it too; then a burst among what is served.
    feedback
        .commit_checks(pass(&ids[8..], start + 600), POLICY)
        .await
        .unwrap();
    for id in &ids[..4] {
        feedback.checked(*id, &refused, start + 1_000);
    }
    let mut queued = feedback.take_rechecks();
    queued.sort_unstable();
    assert_eq!(queued, ids[8..], "the survivors are re-checked");

    // The next burst waits the gap: a quarter of the window.
    feedback
        .commit_checks(pass(&ids[8..], start + 1_100), POLICY)
        .await
        .unwrap();
    for id in &ids[8..] {
        feedback.checked(*id, &refused, start + 2_000);
    }
    assert!(
        feedback.take_rechecks().is_empty(),
        "swept a second after the last"
    );
}

/// A failure whose verdict is dropped (the judges were lost) does not
/// keep the proxy hidden.
#[tokio::test]
async fn a_failure_dropped_with_the_judges_serves_the_proxy_again() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 2).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    let now = now_ms();
    let alive = ids.iter().map(|id| checked(*id, now, None)).collect();
    feedback.commit_checks(alive, POLICY).await.unwrap();
    feedback.checked(ids[0], &Outcome::dead(Reason::Timeout), now + 10);
    assert!(feedback.index().get(ids[0]).is_none(), "hidden at once");
    feedback.restore(vec![ids[0]]).await.unwrap();
    assert!(feedback.index().get(ids[0]).is_some(), "served again");
}

/// `reports_ok` of proxy `id`.
async fn reports_ok(store: &Store, id: i64) -> i64 {
    store
        .sqlite()
        .read(move |c| {
            Ok(
                c.query_row("SELECT reports_ok FROM proxies WHERE id = ?1", [id], |r| {
                    r.get(0)
                })?,
            )
        })
        .await
        .unwrap()
}

#[test]
fn worked_uses_are_written_together_not_one_write_each() {
    // On tokio's paused clock: the flush's wait passes as soon as
    // nothing else is to be done.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = rt.block_on(store_with(dir.path(), 2));
    let feedback = Feedback::new(HealthIndex::new(), store.clone());
    // Outside the runtime no flush is scheduled: what the store holds
    // is only what a flush wrote.
    for _ in 0..5 {
        feedback.worked(ids[0]);
    }
    feedback.worked(ids[1]);
    rt.block_on(async {
        assert_eq!(reports_ok(&store, ids[0]).await, 0, "no write per use");
        feedback.flush().await.unwrap();
        assert_eq!(reports_ok(&store, ids[0]).await, 5);
        assert_eq!(reports_ok(&store, ids[1]).await, 1);
        feedback.flush().await.unwrap();
        assert_eq!(reports_ok(&store, ids[0]).await, 5, "counted once");

        // Inside the runtime a use schedules the flush itself, for
        // WORKED_FLUSH_AFTER later.
        let used = tokio::time::Instant::now();
        feedback.worked(ids[1]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while reports_ok(&store, ids[1]).await != 2 {
            assert!(Instant::now() < deadline, "the batch was never written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(used.elapsed() >= WORKED_FLUSH_AFTER, "{:?}", used.elapsed());
    });
}

#[test]
fn a_use_after_a_runtime_ended_under_its_scheduled_write_schedules_another() {
    let paused = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    let main = paused();
    let (store, ids) = main.block_on(store_with(dir.path(), 1));
    let feedback = Feedback::new(HealthIndex::new(), store.clone());
    // A use on a runtime that ends before its write (a crawl's own
    // thread): the scheduled write goes with it.
    let gone = paused();
    gone.block_on(async { feedback.worked(ids[0]) });
    gone.shutdown_background();
    main.block_on(async {
        assert_eq!(reports_ok(&store, ids[0]).await, 0);
        // The next use schedules a write of both.
        feedback.worked(ids[0]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while reports_ok(&store, ids[0]).await != 2 {
            assert!(Instant::now() < deadline, "the uses were never written");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[tokio::test]
async fn a_block_bans_only_the_pair() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 1).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    feedback
        .commit_checks(vec![checked(ids[0], now_ms(), None)], POLICY)
        .await
        .unwrap();
    feedback
        .report(
            ids[0],
            UseVerdict::Blocked(Block::Banned),
            Some("shop.example"),
        )
        .await
        .unwrap();
    assert!(feedback.is_banned(ids[0], "shop.example"));
    assert!(!feedback.is_banned(ids[0], "news.example"));
    feedback.rest(ids[0], "news.example", Duration::from_millis(50));
    feedback.rest(ids[0], "shop.example", Duration::from_millis(50));
    assert!(feedback.is_banned(ids[0], "news.example"));
    std::thread::sleep(Duration::from_millis(60));
    assert!(!feedback.is_banned(ids[0], "news.example"), "a rest ends");
    assert!(feedback.is_banned(ids[0], "shop.example"), "the ban stays");
    assert_eq!(feedback.index().len(), 1, "still served for other sites");
}

#[tokio::test]
async fn a_sites_rate_limits_widen_the_gap_once_a_second_and_it_decays() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = store_with(dir.path(), 1).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    assert_eq!(feedback.site_gap("shop.example"), Duration::ZERO);
    feedback.rate_limited("shop.example", Instant::now());
    let first = feedback.site_gap("shop.example");
    assert!(first <= Duration::from_millis(100) && first > Duration::from_millis(99));
    // A burst of 429s within a second widens it once.
    feedback.rate_limited("shop.example", Instant::now());
    assert!(feedback.site_gap("shop.example") <= first);
    assert_eq!(feedback.site_gap("news.example"), Duration::ZERO);
    // A second later it widens again, by half, but only for a request
    // sent since it last widened.
    let raised = {
        let mut gaps = lock(&feedback.inner.gaps);
        let g = gaps.get_mut("shop.example").unwrap();
        g.raised -= GAP_RAISE_EVERY;
        g.raised
    };
    feedback.rate_limited("shop.example", raised - Duration::from_millis(1));
    assert!(feedback.site_gap("shop.example") <= first, "sent before");
    feedback.rate_limited("shop.example", Instant::now());
    let second = feedback.site_gap("shop.example").as_secs_f64() * 1000.0;
    assert!((second - 150.0).abs() < 2.0, "{second}");
    // A minute without limits halves it.
    let g = SiteGap {
        ms: 400.0,
        raised: Instant::now() - GAP_HALF_LIFE,
    };
    assert!((g.now() - 200.0).abs() < 1.0, "{}", g.now());
}

#[tokio::test]
async fn served_proxies_with_old_checks_are_queued_for_recheck() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 1).await;
    let feedback = Feedback::new(HealthIndex::new(), store);
    let now = now_ms();
    feedback
        .commit_checks(vec![checked(ids[0], now - 120_000, None)], POLICY)
        .await
        .unwrap();
    let old = feedback.index().get(ids[0]).unwrap();
    feedback.served(&old, now);
    assert_eq!(feedback.take_rechecks(), vec![ids[0]]);
    assert!(feedback.take_rechecks().is_empty(), "drained");

    feedback
        .commit_checks(vec![checked(ids[0], now, None)], POLICY)
        .await
        .unwrap();
    let fresh = feedback.index().get(ids[0]).unwrap();
    feedback.served(&fresh, now);
    assert!(feedback.take_rechecks().is_empty());
}

/// Right after a start every served proxy is suspect and none has passed
/// a check yet: a pick looks for a re-checked one only once one may
/// exist, instead of scanning every match for it at each request (at a
/// million stored, most of the CPU of `/proxy` then). Once one passes,
/// it is the one served.
#[tokio::test]
async fn a_pick_after_a_start_does_not_scan_for_a_re_checked_proxy_before_one_passed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 400).await;
    let before = now_ms() - 60_000;
    let alive = ids.iter().map(|id| checked(*id, before, None)).collect();
    store.record_checks(alive, POLICY).await.unwrap();
    let index = crate::health::load_index(&store).await.unwrap();
    let feedback = Feedback::new(index, store);
    feedback.set_fresh_within(Duration::from_secs(600));
    let start = now_ms();
    feedback.reverify_all(start);
    let q = ProxyQuery::default();
    let looked = std::cell::Cell::new(0usize);
    let count = |_: &Entry| {
        looked.set(looked.get() + 1);
        false
    };
    for _ in 0..10 {
        let picked = feedback.pick(&q, None, start + 5, &crate::health::BestOfTwo, &count);
        assert!(picked.is_some(), "a suspect proxy is served meanwhile");
    }
    assert!(
        looked.get() < ids.len(),
        "10 picks looked at {} proxies of {}",
        looked.get(),
        ids.len()
    );

    feedback
        .commit_checks(vec![checked(ids[7], start + 10, None)], POLICY)
        .await
        .unwrap();
    for _ in 0..10 {
        let picked = feedback.pick(&q, None, start + 20, &crate::health::BestOfTwo, &|_| false);
        assert_eq!(picked.map(|e| e.id), Some(ids[7]), "the re-checked one");
    }
}

/// Once some proxies passed their re-check after a start, a pick takes
/// one of them without looking at the suspect ones: the index keeps the
/// re-checked apart. Before, each pick looked through every match for
/// them until enough had passed for random draws to find one (at a
/// million stored, the slow /proxy of the first seconds). A proxy that
/// carried a request joins them, one whose re-check failed is never
/// served, and the next sweep makes them all suspect again.
#[tokio::test]
async fn a_pick_after_a_start_does_not_scan_for_a_re_checked_proxy_once_some_passed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 400).await;
    let before = now_ms() - 60_000;
    let alive = ids.iter().map(|id| checked(*id, before, None)).collect();
    store.record_checks(alive, POLICY).await.unwrap();
    let index = crate::health::load_index(&store).await.unwrap();
    let feedback = Feedback::new(index, store);
    feedback.set_fresh_within(Duration::from_secs(600));
    let start = now_ms();
    feedback.reverify_all(start);
    let passed = [ids[7], ids[150], ids[333]];
    let rechecks = passed.iter().map(|id| checked(*id, start + 10, None));
    feedback
        .commit_checks(rechecks.collect(), POLICY)
        .await
        .unwrap();

    let q = ProxyQuery::default();
    let looked = std::cell::Cell::new(0usize);
    let count = |_: &Entry| {
        looked.set(looked.get() + 1);
        false
    };
    let best = &crate::health::BestOfTwo;
    for _ in 0..10 {
        let picked = feedback.pick(&q, None, start + 20, best, &count);
        let picked = picked.map(|e| e.id);
        assert!(
            picked.is_some_and(|id| passed.contains(&id)),
            "{picked:?} is not one of the re-checked {passed:?}"
        );
    }
    assert!(
        looked.get() < ids.len(),
        "10 picks looked at {} proxies of {}",
        looked.get(),
        ids.len()
    );

    // A use that worked proves a suspect proxy as a check would.
    let others = |e: &Entry| passed.contains(&e.id);
    feedback.worked(ids[42]);
    for _ in 0..10 {
        let picked = feedback.pick(&q, None, start + 30, best, &others);
        assert_eq!(picked.map(|e| e.id), Some(ids[42]), "the one that worked");
    }
    // Its re-check fails: never served again, suspect ones are meanwhile.
    let failed = checked(ids[42], now_ms(), Some(Reason::Refused));
    feedback.commit_checks(vec![failed], POLICY).await.unwrap();
    for _ in 0..50 {
        let picked = feedback.pick(&q, None, start + 40, best, &others);
        let picked = picked.map(|e| e.id);
        assert!(picked.is_some_and(|id| id != ids[42]), "{picked:?}");
    }

    // A sweep: what passed before it is suspect again, what passes after
    // it is served first.
    let sweep = now_ms() + 100;
    feedback.reverify_all(sweep);
    let again = checked(ids[200], sweep + 10, None);
    feedback.commit_checks(vec![again], POLICY).await.unwrap();
    looked.set(0);
    for _ in 0..10 {
        let picked = feedback.pick(&q, None, sweep + 20, best, &count);
        assert_eq!(
            picked.map(|e| e.id),
            Some(ids[200]),
            "re-checked after the sweep"
        );
    }
    assert!(looked.get() < ids.len(), "{} looked at", looked.get());
}

/// What the dashboard counts in place is what `select` gives: the same
/// proxies, the freshness window applied.
#[tokio::test]
async fn each_visits_what_select_gives() {
    let dir = tempfile::tempdir().unwrap();
    let (store, ids) = store_with(dir.path(), 40).await;
    let now = now_ms();
    let checks = ids.iter().enumerate().map(|(i, id)| {
        let age = if i % 3 == 0 { 900_000 } else { 1_000 };
        checked(*id, now - age, None)
    });
    store.record_checks(checks.collect(), POLICY).await.unwrap();
    let index = crate::health::load_index(&store).await.unwrap();
    let feedback = Feedback::new(index, store);
    feedback.set_fresh_within(Duration::from_secs(600));
    let q = ProxyQuery::default();
    let mut seen = Vec::new();
    let n = feedback.each(&q, now, |e| seen.push(e.id));
    seen.sort();
    let selected: Vec<i64> = feedback
        .select(&q, None, now)
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(seen, selected);
    assert_eq!(n, selected.len());
    assert!(n > 0 && n < ids.len(), "{n} of {}", ids.len());
}
