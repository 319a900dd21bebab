//! Checks against real loopback proxies of every kind and real judges: each
//! proxy's stored verdict, reason, anonymity, HTTPS support, exit address
//! and schedule must be what a user of the proxy would find.

use crate::common;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::TestConfig;
use common::fakes::{
    self, FakeFarm, FakeHttpProxy, FakeSocks4, FakeSocks5, HttpProxyOpts, ProxyKind, SocksOpts,
};
use common::judges::{Fault, Judge};
use proxywarden::check::{
    CheckError, CheckOptions, Checker, RoundProgress, RoundSummary, check_round, open_geoip,
};
use proxywarden::config::Config;
use proxywarden::harvest::harvest_all;
use proxywarden::health::{Feedback, HealthIndex};
use proxywarden::model::{Reason, RecheckPolicy};
use proxywarden::proxy::{Anonymity, Status};
use proxywarden::store::{ProxyFilter, ProxyRecord, Store, now_ms};
use tokio_util::sync::CancellationToken;

const EXIT: &str = "127.0.0.2";

fn exit_ip() -> IpAddr {
    EXIT.parse().unwrap()
}

/// Writes `entries` as a text list (and `detect` entries as a second list
/// whose scheme is detected) and returns a config checking them.
fn config(
    dir: &Path,
    judges: &str,
    check_extra: &str,
    entries: &[String],
    detect: &[String],
) -> Config {
    std::fs::write(dir.join("list.txt"), entries.join("\n")).unwrap();
    std::fs::write(dir.join("detect.txt"), detect.join("\n")).unwrap();
    TestConfig::new(dir)
        .judges(judges)
        .lines("check", check_extra)
        .source("list", &dir.join("list.txt").display().to_string(), "")
        .source(
            "detect",
            &dir.join("detect.txt").display().to_string(),
            "scheme = \"detect\"",
        )
        .build()
}

/// A config checking against `judge` alone, with `entries` as its list.
fn one_judge_config(dir: &Path, judge: &Judge, entries: &[String]) -> Config {
    config(dir, &format!(r#"["{}"]"#, judge.url()), "", entries, &[])
}

/// The store of `config` after one harvest of its sources.
async fn harvested(config: &Config) -> Store {
    let store = Store::open(&config.database.path).unwrap();
    harvest_all(config, &store).await.unwrap();
    store
}

async fn harvest_and_check(config: &Config) -> (Store, RoundSummary) {
    let store = harvested(config).await;
    let summary = run_round(config, &store, false).await.unwrap();
    (store, summary)
}

async fn run_round(config: &Config, store: &Store, all: bool) -> Result<RoundSummary, CheckError> {
    let opts = CheckOptions {
        all,
        ..CheckOptions::from_config(&config.check)
    };
    run_round_with(config, store, &opts).await
}

async fn run_round_with(
    config: &Config,
    store: &Store,
    opts: &CheckOptions,
) -> Result<RoundSummary, CheckError> {
    let checker = Arc::new(Checker::prepare(config, opts, open_geoip(config)?).await?);
    check_round(
        checker,
        store,
        &feedback(store),
        opts,
        config.check.recheck_policy(),
        &CancellationToken::new(),
        Arc::new(RoundProgress::default()),
    )
    .await
}

/// The feedback path a round commits through, with an index nobody serves.
fn feedback(store: &Store) -> Feedback {
    Feedback::new(HealthIndex::new(), store.clone())
}

fn by_addr(records: &[ProxyRecord], addr: SocketAddr) -> &ProxyRecord {
    records
        .iter()
        .find(|r| r.proxy.host == addr.ip() && r.proxy.port == addr.port())
        .unwrap_or_else(|| panic!("{addr} not stored"))
}

fn http_opts(kind: ProxyKind, connect: bool) -> HttpProxyOpts {
    HttpProxyOpts {
        kind,
        connect,
        upstream_bind: Some(exit_ip()),
        ..HttpProxyOpts::default()
    }
}

fn socks_opts(auth: Option<(&str, &str)>) -> SocksOpts {
    SocksOpts {
        auth: auth.map(|(u, p)| (u.to_owned(), p.to_owned())),
        upstream_bind: Some(exit_ip()),
        ..SocksOpts::default()
    }
}

fn with_behavior(b: fakes::Behavior) -> HttpProxyOpts {
    HttpProxyOpts {
        behavior: b,
        connect: true,
        upstream_bind: Some(exit_ip()),
        ..HttpProxyOpts::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_proxy_gets_the_verdict_a_user_would_find() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let tls_judge = Judge::tls(dir.path()).await;

    let elite = FakeHttpProxy::start(http_opts(ProxyKind::Elite, true)).await;
    let anonymous = FakeHttpProxy::start(http_opts(ProxyKind::Anonymous, false)).await;
    let transparent = FakeHttpProxy::start(http_opts(ProxyKind::Transparent, true)).await;
    let authed = FakeHttpProxy::start(HttpProxyOpts {
        auth: Some(("alice".into(), "s3cret".into())),
        ..http_opts(ProxyKind::Elite, true)
    })
    .await;
    let needs_auth = FakeHttpProxy::start(HttpProxyOpts {
        auth: Some(("bob".into(), "pw".into())),
        ..http_opts(ProxyKind::Elite, true)
    })
    .await;
    let socks4 = FakeSocks4::start(socks_opts(None)).await;
    let socks5 = FakeSocks5::start(socks_opts(None)).await;
    let socks5_auth = FakeSocks5::start(socks_opts(Some(("carol", "pw5")))).await;
    let socks5_wrong = FakeSocks5::start(socks_opts(Some(("dave", "right")))).await;
    let slow =
        FakeHttpProxy::start(with_behavior(fakes::Behavior::Slow(Duration::from_secs(4)))).await;
    let liar = FakeHttpProxy::start(with_behavior(fakes::Behavior::Liar)).await;
    let status_407 = FakeHttpProxy::start(with_behavior(fakes::Behavior::AlwaysStatus(407))).await;
    let status_502 = FakeHttpProxy::start(with_behavior(fakes::Behavior::AlwaysStatus(502))).await;
    let reset = FakeHttpProxy::start(with_behavior(fakes::Behavior::Reset)).await;
    let hang = FakeHttpProxy::start(with_behavior(fakes::Behavior::Hang)).await;
    let garbage = FakeHttpProxy::start(with_behavior(fakes::Behavior::Garbage)).await;
    let closed = fakes::closed_port();
    let detect_me = FakeSocks5::start(socks_opts(None)).await;

    let a = |s: SocketAddr| s.to_string();
    let entries = vec![
        format!("http://{}", a(elite.addr())),
        format!("http://{}", a(anonymous.addr())),
        format!("http://{}", a(transparent.addr())),
        format!("http://alice:s3cret@{}", a(authed.addr())),
        format!("http://{}", a(needs_auth.addr())),
        format!("socks4://{}", a(socks4.addr())),
        format!("socks5://{}", a(socks5.addr())),
        format!("socks5://carol:pw5@{}", a(socks5_auth.addr())),
        format!("socks5://dave:wrong@{}", a(socks5_wrong.addr())),
        format!("http://{}", a(slow.addr())),
        format!("http://{}", a(liar.addr())),
        format!("http://{}", a(status_407.addr())),
        format!("http://{}", a(status_502.addr())),
        format!("http://{}", a(reset.addr())),
        format!("http://{}", a(hang.addr())),
        format!("http://{}", a(garbage.addr())),
        format!("http://{}", a(closed.addr())),
    ];
    let judges = format!(
        r#"[{{ url = "{}", marker = "proxywarden-judge" }}, "{}"]"#,
        judge.url(),
        tls_judge.url()
    );
    let extra = format!("extra_ca_file = \"{}\"", tls_judge.ca_file().display());
    let config = config(
        dir.path(),
        &judges,
        &extra,
        &entries,
        &[a(detect_me.addr())],
    );
    let (store, summary) = harvest_and_check(&config).await;
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(summary.checked, 18);
    assert!(!summary.interrupted);

    let alive = |addr: SocketAddr, anonymity: Anonymity, https: bool| {
        let r = by_addr(&all, addr);
        assert_eq!(r.status, Status::Alive, "{addr}: {:?}", r.reason);
        assert_eq!(r.reason, None, "{addr}");
        assert_eq!(r.anonymity, Some(anonymity), "{addr}");
        assert_eq!(r.https, Some(https), "{addr}");
        assert_eq!(r.exit_ip.as_deref(), Some(EXIT), "{addr}");
        let latency = r.latency_ms.expect("latency");
        assert!((0..2000).contains(&latency), "{addr}: {latency} ms");
        let checked = r.last_checked.expect("last_checked");
        assert_eq!(r.last_alive, Some(checked));
        assert_eq!(
            (r.checks_total, r.checks_ok, r.consecutive_failures),
            (1, 1, 0)
        );
        assert!(
            (checked + 450_000..=checked + 600_000).contains(&r.next_check_at),
            "{addr}: re-check in 10 min less up to a quarter"
        );
    };
    alive(elite.addr(), Anonymity::Elite, true);
    alive(anonymous.addr(), Anonymity::Anonymous, false);
    alive(transparent.addr(), Anonymity::Transparent, true);
    alive(authed.addr(), Anonymity::Elite, true);
    alive(socks4.addr(), Anonymity::Elite, true);
    alive(socks5.addr(), Anonymity::Elite, true);
    alive(socks5_auth.addr(), Anonymity::Elite, true);

    let detected = by_addr(&all, detect_me.addr());
    assert_eq!(detected.status, Status::Alive);
    assert_eq!(detected.proxy.scheme.as_str(), "socks5");
    assert!(!detected.scheme_detect);

    let dead = |addr: SocketAddr, reason: Reason| {
        let r = by_addr(&all, addr);
        assert_eq!(r.status, Status::Dead, "{addr}");
        assert_eq!(r.reason.as_deref(), Some(reason.as_str()), "{addr}");
        assert_eq!(r.last_alive, None, "{addr}");
        assert_eq!(r.anonymity, None, "{addr}");
        let checked = r.last_checked.expect("last_checked");
        assert_eq!(
            (r.checks_total, r.checks_ok, r.consecutive_failures),
            (1, 0, 1)
        );
        assert_eq!(
            r.next_check_at,
            checked + 900_000,
            "{addr}: first backoff 15 min"
        );
    };
    dead(needs_auth.addr(), Reason::ProxyAuthRequired);
    dead(socks5_wrong.addr(), Reason::ProxyAuthRequired);
    dead(slow.addr(), Reason::Timeout);
    dead(liar.addr(), Reason::ContentMismatch);
    dead(status_407.addr(), Reason::ProxyAuthRequired);
    dead(status_502.addr(), Reason::BadStatus);
    dead(reset.addr(), Reason::Reset);
    dead(hang.addr(), Reason::Timeout);
    dead(garbage.addr(), Reason::ProtocolError);
    dead(closed.addr(), Reason::Refused);

    assert_eq!(summary.alive, 8);
    assert_eq!(summary.dead, 10);
    assert_eq!(summary.https, 7);
    assert_eq!(summary.dead_by_reason[&Reason::Timeout], 2);
}

#[tokio::test]
async fn a_judge_outage_marks_nothing_dead() {
    let dir = tempfile::tempdir().unwrap();
    let proxy = FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await;
    let down = fakes::closed_port();
    let config = config(
        dir.path(),
        &format!(r#"["http://{down}/judge"]"#),
        "",
        &[format!("http://{}", proxy.addr())],
        &[],
    );
    let store = harvested(&config).await;
    let err = run_round(&config, &store, true).await.unwrap_err();
    assert!(matches!(err, CheckError::NoJudge(_)), "{err}");
    assert!(
        err.to_string()
            .contains("no proxy was checked or marked dead")
    );
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(all[0].status, Status::Unknown);
    assert_eq!(all[0].checks_total, 0);
    assert_eq!(proxy.requests(), 0);
}

#[tokio::test]
async fn httpbin_judges_and_geoip_give_the_exit_country() {
    let dir = tempfile::tempdir().unwrap();
    // The judge reports the proxy's exit (127.0.0.2) as a GB test address.
    let judge = Judge::httpbin(HashMap::from([(exit_ip(), "81.2.69.160".parse().unwrap())])).await;
    let proxy = FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await;
    let geoip = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/geoip/GeoLite2-Country-Test.mmdb");
    let mut config = one_judge_config(dir.path(), &judge, &[format!("http://{}", proxy.addr())]);
    config.geoip.database = Some(geoip);
    let (store, summary) = harvest_and_check(&config).await;
    assert_eq!(summary.alive, 1);
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.exit_ip.as_deref(), Some("81.2.69.160"));
    assert_eq!(r.country.map(|c| c.to_string()).as_deref(), Some("GB"));
    assert_eq!(r.country_source.as_deref(), Some("geoip"));
    assert_eq!(r.anonymity, Some(Anonymity::Elite));
    assert_eq!(r.https, None, "no https judge configured: not tested");
}

/// A served proxy's re-check comes between two thirds and four thirds of a
/// cycle after its last, one cycle on average: the configured rate is what
/// is spent, and proxies checked together do not stay together.
#[tokio::test]
async fn served_rechecks_average_one_cycle_and_spread_out() {
    use proxywarden::model::Outcome;
    use proxywarden::store::CheckRecord;

    let dir = tempfile::tempdir().unwrap();
    let addrs: Vec<String> = (0..400)
        .map(|i| format!("10.2.{}.{}:80", i / 200, i % 200 + 1))
        .collect();
    let config = config(dir.path(), r#"["http://127.0.0.1:9/"]"#, "", &addrs, &[]);
    let store = harvested(&config).await;
    let ids = common::ids_of(&store).await;
    assert_eq!(ids.len(), 400);
    let served = 2_000;
    let cycle = config.check.serve_cycle(served).as_millis() as i64;
    let alive = Outcome {
        failure: None,
        latency: Some(Duration::from_millis(42)),
        anonymity: Some(Anonymity::Elite),
        https: None,
        exit_ip: None,
        country: None,
        detected: None,
    };
    let t = 1_000_000_i64;
    let checks = ids
        .iter()
        .map(|&id| CheckRecord {
            id,
            checked_at: t,
            outcome: alive.clone(),
        })
        .collect();
    store
        .record_checks(checks, config.check.serve_policy(served))
        .await
        .unwrap();
    let waits: Vec<i64> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.next_check_at - t)
        .collect();
    for w in &waits {
        assert!(
            (cycle * 2 / 3..=cycle * 4 / 3 + 1).contains(w),
            "re-check after {w} ms, cycle {cycle} ms"
        );
    }
    let mean = waits.iter().sum::<i64>() / waits.len() as i64;
    assert!(
        (mean - cycle).abs() < cycle / 20,
        "re-checks after {mean} ms on average, cycle {cycle} ms"
    );
    let early = waits.iter().filter(|&&w| w < cycle * 5 / 6).count();
    let late = waits.iter().filter(|&&w| w > cycle * 7 / 6).count();
    assert!(
        early > 40 && late > 40,
        "{early} in the first sixth of the range, {late} in the last"
    );
}

#[tokio::test]
async fn dead_proxies_back_off_doubling_up_to_the_cap_and_recover() {
    use proxywarden::model::Outcome;
    use proxywarden::store::CheckRecord;

    let dir = tempfile::tempdir().unwrap();
    let config = config(
        dir.path(),
        r#"["http://127.0.0.1:9/"]"#,
        "",
        &["10.1.1.1:80".into()],
        &[],
    );
    let store = harvested(&config).await;
    let id = store.list_proxies(ProxyFilter::default()).await.unwrap()[0].id;
    let policy = RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::from_secs(150),
        dead: Duration::from_secs(900),
        dead_max: Duration::from_secs(3600),
    };
    let dead = Outcome::dead(Reason::Refused);
    let mut t = 1_000_000_i64;
    let mut waits = Vec::new();
    for _ in 0..5 {
        store
            .record_checks(
                vec![CheckRecord {
                    id,
                    checked_at: t,
                    outcome: dead.clone(),
                }],
                policy,
            )
            .await
            .unwrap();
        let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
        waits.push((r.next_check_at - t) / 1000);
        t = r.next_check_at;
    }
    assert_eq!(waits, [900, 1800, 3600, 3600, 3600]);
    // Due exactly when its backoff ends, not before.
    assert_eq!(store.count_due(t - 1, false).await.unwrap(), 0);
    assert_eq!(store.count_due(t, false).await.unwrap(), 1);

    let alive = Outcome {
        failure: None,
        latency: Some(Duration::from_millis(42)),
        anonymity: Some(Anonymity::Elite),
        https: Some(false),
        exit_ip: Some("10.1.1.1".parse().unwrap()),
        country: None,
        detected: None,
    };
    store
        .record_checks(
            vec![CheckRecord {
                id,
                checked_at: t,
                outcome: alive,
            }],
            policy,
        )
        .await
        .unwrap();
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.status, Status::Alive);
    assert_eq!(r.consecutive_failures, 0);
    // 10 min less up to a quarter, so re-checks spread out.
    assert!(
        (t + 450_000..=t + 600_000).contains(&r.next_check_at),
        "{}",
        r.next_check_at - t
    );
    assert_eq!((r.checks_total, r.checks_ok), (6, 1));
    assert_eq!(r.reason, None);

    // Purge: only dead proxies, unlisted and dead for longer than the limit.
    let week = Duration::from_secs(7 * 86_400);
    assert_eq!(
        store.purge(t + 8 * 86_400_000, week).await.unwrap(),
        0,
        "alive"
    );
    store
        .record_checks(
            vec![CheckRecord {
                id,
                checked_at: t,
                outcome: dead,
            }],
            policy,
        )
        .await
        .unwrap();
    let now = now_ms();
    assert_eq!(store.purge(now, week).await.unwrap(), 0, "listed recently");
    assert_eq!(store.purge(now + 8 * 86_400_000, week).await.unwrap(), 1);
    assert!(
        store
            .list_proxies(ProxyFilter::default())
            .await
            .unwrap()
            .is_empty()
    );
}

/// The farm as a list: answering proxies first, then the silent ones.
fn farm_list(farm: &FakeFarm) -> Vec<String> {
    farm.alive_addrs()
        .into_iter()
        .chain(farm.silent_addrs())
        .map(|a| format!("http://{a}"))
        .collect()
}

type Round = tokio::task::JoinHandle<Result<RoundSummary, CheckError>>;

/// Harvests the farm (answering proxies first) and starts a plain-HTTP
/// round over it in the background.
async fn start_round(
    dir: &Path,
    judge: &Judge,
    farm: &FakeFarm,
    concurrency: usize,
    cancel: &CancellationToken,
) -> (Store, Arc<RoundProgress>, Round) {
    let entries = farm_list(farm);
    let mut config = one_judge_config(dir, judge, &entries);
    config.check.concurrency = concurrency;
    config.check.https = false;
    let store = harvested(&config).await;
    let opts = CheckOptions::from_config(&config.check);
    let checker = Arc::new(Checker::prepare(&config, &opts, None).await.unwrap());
    let progress = Arc::new(RoundProgress::default());
    let round = {
        let (store, cancel, progress) = (store.clone(), cancel.clone(), progress.clone());
        let policy = config.check.recheck_policy();
        tokio::spawn(async move {
            let feedback = feedback(&store);
            check_round(checker, &store, &feedback, &opts, policy, &cancel, progress).await
        })
    };
    (store, progress, round)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_round_keeps_every_completed_result() {
    // 40 quick proxies then 200 that never answer; 8 at a time.
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(40, 200, Some(exit_ip())).await;
    let cancel = CancellationToken::new();
    let (store, progress, round) = start_round(dir.path(), &judge, &farm, 8, &cancel).await;
    // Interrupt once the first results are in (as Ctrl-C would).
    common::until("ten checks done", Duration::from_secs(30), || async {
        progress.done.load(Ordering::Relaxed) >= 10
    })
    .await;
    cancel.cancel();
    let summary = common::within(round).await.unwrap().unwrap();
    assert!(summary.interrupted);
    assert!(
        summary.checked >= 10 && summary.checked < 240,
        "{}",
        summary.checked
    );
    let checked: Vec<ProxyRecord> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.last_checked.is_some())
        .collect();
    assert_eq!(
        checked.len() as u64,
        summary.checked,
        "every completed result is stored"
    );
    assert_eq!(
        checked.iter().filter(|r| r.status == Status::Alive).count() as u64,
        summary.alive
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_thousand_proxy_round_gives_every_proxy_a_status() {
    let _alone = common::THOUSANDS.lock().await;
    fakes::raise_nofile_limit();
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(2_000, 8_000, Some(exit_ip())).await;
    // One answering proxy in five, spread through the list as in a real one.
    let silent = farm.silent_addrs();
    let entries: Vec<String> = farm
        .alive_addrs()
        .into_iter()
        .zip(silent.chunks(4))
        .flat_map(|(a, s)| std::iter::once(a).chain(s.iter().copied()))
        .map(|a| format!("http://{a}"))
        .collect();
    assert_eq!(entries.len(), 10_000);
    let mut config = one_judge_config(dir.path(), &judge, &entries);
    config.check.concurrency = proxywarden::check::clamp_concurrency(2_000);
    config.check.https = false;
    config.check.connect_timeout = Duration::from_secs(1);
    config.check.timeout = Duration::from_secs(2);
    let (store, summary) = harvest_and_check(&config).await;
    // Every proxy has a status, and the summary says what the store holds.
    assert_eq!(summary.checked, 10_000);
    assert_eq!(summary.alive + summary.dead, 10_000, "{summary:?}");
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.by_status["unknown"], 0);
    assert_eq!(stats.by_status["alive"], summary.alive as i64);
    assert_eq!(stats.by_status["dead"], summary.dead as i64);
    // Every answering proxy was asked (how many got their answer back
    // within the round's 2 s depends on how busy the machine is, not on
    // the checker).
    let asked = farm.alive_requests();
    assert!(
        asked.iter().all(|&n| n >= 1),
        "unasked: {}",
        asked.iter().filter(|&&n| n == 0).count()
    );
    // A silent proxy is dead of its timeout, always; an answering one is
    // alive, or dead of that same timeout when its answer came late, never
    // of anything else.
    let silent: std::collections::HashSet<SocketAddr> = silent.into_iter().collect();
    let mut alive = 0;
    for r in store.list_proxies(ProxyFilter::default()).await.unwrap() {
        let addr = SocketAddr::new(r.proxy.host, r.proxy.port);
        if silent.contains(&addr) {
            assert_eq!(r.status, Status::Dead, "silent {addr}");
            assert_eq!(r.reason.as_deref(), Some("timeout"), "silent {addr}");
        } else if r.status == Status::Alive {
            alive += 1;
        } else {
            assert_eq!(r.reason.as_deref(), Some("timeout"), "answering {addr}");
        }
    }
    assert_eq!(alive, summary.alive);
    assert!(summary.alive > 0, "{summary:?}");
}

/// Rows with a recorded check, read from the database file as another
/// process would.
fn checked_rows(db: &Path) -> i64 {
    rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM proxies WHERE last_checked IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

/// `proxywarden check` as a user runs it: Ctrl-C (SIGINT) mid-round stops
/// new checks, commits what completed, prints the summary and exits 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_command_stops_on_ctrl_c_with_status_130() {
    check_stops_on("INT").await;
}

/// Issue 10, Must 9: SIGTERM (a service manager, `kill`) stops `check` as
/// Ctrl-C does, summary and committed results included, instead of killing
/// it on the spot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_command_handles_sigterm_like_ctrl_c() {
    check_stops_on("TERM").await;
}

/// Sends `signal` (a `kill` name) to process `pid`.
fn send_signal(signal: &str, pid: u32) {
    let kill = std::process::Command::new("sh")
        .args(["-c", &format!("kill -{signal} {pid}")])
        .status()
        .unwrap();
    assert!(kill.success());
}

/// `proxywarden check` started in `dir` with its output piped, once
/// `harvest` has stored the proxies of `list` (the text of its one source):
/// it checks them over HTTP against `judge`, ten at a time, with
/// `connect_timeout` and `timeout` (TOML durations).
async fn harvested_check(
    dir: &Path,
    judge: &Judge,
    list: &str,
    connect_timeout: &str,
    timeout: &str,
) -> tokio::process::Child {
    harvested_for_check(
        dir,
        judge,
        list,
        connect_timeout,
        timeout,
        "path = \"test.db\"",
    )
    .await;
    check_cmd(dir, &[])
}

/// `proxywarden check ARGS` started in `dir` with its output piped.
fn check_cmd(dir: &Path, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_proxywarden"))
        .arg("check")
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// The config and database [`harvested_check`] checks, without the check;
/// `database` is the body of the config's `[database]`.
async fn harvested_for_check(
    dir: &Path,
    judge: &Judge,
    list: &str,
    connect_timeout: &str,
    timeout: &str,
    database: &str,
) {
    std::fs::write(dir.join("list.txt"), list).unwrap();
    let toml = format!(
        "[database]\n{database}\n[harvest]\nallow_private_addresses = true\n[check]\njudges = [\"{}\"]\nconcurrency = 10\n\
         connect_timeout = \"{connect_timeout}\"\ntimeout = \"{timeout}\"\nhttps = false\n\
         [[sources]]\nname = \"list\"\nurl = \"list.txt\"\n",
        judge.url()
    );
    std::fs::write(dir.join("proxywarden.toml"), toml).unwrap();
    let bin = env!("CARGO_BIN_EXE_proxywarden");
    let harvest = tokio::process::Command::new(bin)
        .arg("harvest")
        .current_dir(dir)
        .output()
        .await
        .unwrap();
    assert!(harvest.status.success());
}

/// `proxywarden check` run by hand beside `serve` nodes sharing its
/// PostgreSQL database takes no proxy a node holds a lease on, and leaves
/// that lease alone; `--all` checks every proxy.
#[tokio::test]
async fn a_check_run_by_hand_leaves_the_proxies_a_node_is_checking() {
    use proxywarden::store::DueLane;
    let server = tokio::task::spawn_blocking(common::postgres::PgServer::start)
        .await
        .unwrap();
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(20, 0, Some(exit_ip())).await;
    let list = farm_list(&farm).join("\n");
    let database = format!("url = \"{url}\"");
    harvested_for_check(dir.path(), &judge, &list, "1s", "2s", &database).await;
    let store = Store::connect(&url).await.unwrap();
    let mut held = Vec::new();
    for lane in DueLane::TIMED_OUT.iter().chain(DueLane::REST.iter()) {
        let want = 8 - held.len();
        if want == 0 {
            break;
        }
        let page = store
            .lease_due(
                "node-b".into(),
                now_ms(),
                *lane,
                want,
                Duration::from_secs(600),
            )
            .await
            .unwrap();
        held.extend(page.into_iter().map(|d| d.id));
    }
    assert_eq!(held.len(), 8, "the other node holds 8 of the 20");

    let out = check_cmd(dir.path(), &[]).wait_with_output().await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("checked 12 "), "{stdout}");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let ids = |sql: &'static str| {
        let client = &client;
        async move {
            let mut v: Vec<i64> = client
                .query(sql, &[])
                .await
                .unwrap()
                .iter()
                .map(|r| r.get(0))
                .collect();
            v.sort_unstable();
            v
        }
    };
    held.sort_unstable();
    assert_eq!(
        ids("SELECT id FROM proxies WHERE last_checked IS NULL").await,
        held,
        "exactly the held proxies wait for their node"
    );
    assert_eq!(
        ids("SELECT id FROM proxies WHERE lease_node = 'node-b'").await,
        held,
        "the other node's leases are its own to end"
    );

    let out = check_cmd(dir.path(), &["--all"])
        .wait_with_output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("checked 20 "), "{stdout}");
    assert!(
        ids("SELECT id FROM proxies WHERE last_checked IS NULL")
            .await
            .is_empty()
    );
}

async fn check_stops_on(signal: &str) {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(20, 200, Some(exit_ip())).await;
    let entries = farm_list(&farm);
    let child = harvested_check(dir.path(), &judge, &entries.join("\n"), "1s", "2s").await;
    let pid = child.id().unwrap();
    // Interrupt once results are committed (the writer flushes every second).
    let db = dir.path().join("test.db");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if checked_rows(&db) >= 5 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no results committed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    send_signal(signal, pid);
    let out = child.wait_with_output().await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().next().unwrap_or_default();
    assert!(line.contains("(interrupted)"), "{stdout}");
    let reported: i64 = line
        .strip_prefix("checked ")
        .and_then(|s| s.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {line:?}"));
    let stored = checked_rows(&db);
    assert_eq!(stored, reported, "every completed result is committed");
    assert!(reported < 220, "{reported}");
    assert!(stdout.contains("alive"), "{stdout}");
}

/// Issue 10, Must 9: a second Ctrl-C ends `check` at once, even with
/// checks in flight that would take an hour to time out (so only the second
/// Ctrl-C ends it before the test's own bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_ctrl_c_ends_the_check_command_at_once() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    // A proxy that takes the request and never answers.
    let silent = FakeHttpProxy::start(with_behavior(fakes::Behavior::Hang)).await;
    let list = format!("{}\n", silent.addr());
    let mut child = harvested_check(dir.path(), &judge, &list, "10s", "1h").await;
    let pid = child.id().unwrap();
    common::until("a check started", Duration::from_secs(30), || async {
        silent.connections() > 0
    })
    .await;
    send_signal("INT", pid);
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    common::within(async {
        while let Some(line) = stderr.next_line().await.unwrap() {
            if line.contains("interrupted") {
                assert!(line.contains("Ctrl-C again to quit now"), "{line}");
                return;
            }
        }
        panic!("no word of the interruption");
    })
    .await;
    send_signal("INT", pid);
    let status = common::within(child.wait()).await.unwrap();
    assert_eq!(status.code(), Some(130));
}

/// A judge that dies mid-round must not make proxies look dead: failures
/// seen once no judge answers are discarded and the round stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_dying_mid_round_marks_nothing_dead() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(20, 100, Some(exit_ip())).await;
    let (store, progress, round) =
        start_round(dir.path(), &judge, &farm, 10, &CancellationToken::new()).await;
    common::until("ten checks done", Duration::from_secs(30), || async {
        progress.done.load(Ordering::Relaxed) >= 10
    })
    .await;
    drop(judge);
    let err = common::within(round).await.unwrap().unwrap_err();
    assert!(matches!(err, CheckError::JudgeLost { .. }), "{err}");
    let stats = store.stats().await.unwrap();
    assert_eq!(stats.by_status["dead"], 0, "{stats:?}");
    assert!(stats.by_status["alive"] >= 10, "{stats:?}");
}

/// A public judge that starts rate-limiting mid-round must not make the
/// proxies asked through it look dead: the next judge is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiting_judge_does_not_kill_proxies() {
    let dir = tempfile::tempdir().unwrap();
    let good = Judge::plain().await;
    let asked = Arc::new(AtomicUsize::new(0));
    let limited = Judge::plain_with(Judge::rate_limited(asked.clone())).await;
    let mut proxies = Vec::new();
    for _ in 0..6 {
        proxies.push(FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await);
    }
    let entries: Vec<String> = proxies
        .iter()
        .map(|p| format!("http://{}", p.addr()))
        .collect();
    let judges = format!(r#"["{}", "{}"]"#, limited.url(), good.url());
    let config = config(dir.path(), &judges, "", &entries, &[]);
    let (_, summary) = harvest_and_check(&config).await;
    assert!(
        asked.load(Ordering::Relaxed) > 1,
        "the limited judge was asked through proxies"
    );
    assert_eq!(summary.alive, 6, "{:?}", summary.dead_by_reason);
}

/// A TLS judge that answers 429 through a working tunnel says nothing about
/// the proxy: the next TLS judge is asked, and with none left the HTTPS flag
/// stays unknown instead of turning false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_tls_judge_does_not_decide_https() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let plain = Judge::plain().await;
    let asked = Arc::new(AtomicUsize::new(0));
    let busy = Judge::tls_with(&a, Judge::rate_limited(asked.clone())).await;
    let good = Judge::tls(&b).await;
    let both_cas = dir.path().join("cas.pem");
    std::fs::write(
        &both_cas,
        [busy.ca_file(), good.ca_file()]
            .map(|f| std::fs::read_to_string(f).unwrap())
            .concat(),
    )
    .unwrap();
    let extra = format!("extra_ca_file = \"{}\"", both_cas.display());
    let tunnels = FakeHttpProxy::start(http_opts(ProxyKind::Elite, true)).await;
    let refuses = FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await;
    let entries = [&tunnels, &refuses].map(|p| format!("http://{}", p.addr()));

    // Only the busy TLS judge: unknown, not false, for the tunnelling proxy.
    let only_busy = format!(r#"["{}", "{}"]"#, plain.url(), busy.url());
    let config1 = config(dir.path(), &only_busy, &extra, &entries, &[]);
    let (store, summary) = harvest_and_check(&config1).await;
    assert_eq!(summary.alive, 2, "{:?}", summary.dead_by_reason);
    assert!(
        asked.load(Ordering::Relaxed) > 1,
        "asked through the tunnel"
    );
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(by_addr(&records, tunnels.addr()).https, None);
    assert_eq!(by_addr(&records, refuses.addr()).https, Some(false));

    // With a second TLS judge the tunnel is proven.
    let both = format!(r#"["{}", "{}", "{}"]"#, plain.url(), busy.url(), good.url());
    let config2 = config(dir.path(), &both, &extra, &entries, &[]);
    run_round(&config2, &store, true).await.unwrap();
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(by_addr(&records, tunnels.addr()).https, Some(true));
    assert_eq!(by_addr(&records, refuses.addr()).https, Some(false));
}

/// The daemon's rounds stop starting checks after a while and leave the
/// rest due; each round takes the alive proxies that fell due before any
/// new or dead one, so the re-checks of proxies being served never wait
/// behind a backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_round_rechecks_alive_proxies_first() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    // 30 silent proxies listed first (lower ids), the working one last.
    let farm = FakeFarm::start(0, 30, None).await;
    let working = FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await;
    let mut entries = farm_list(&farm);
    entries.push(format!("http://{}", working.addr()));
    let mut config = one_judge_config(dir.path(), &judge, &entries);
    config.check.https = false;
    let store = harvested(&config).await;

    // The working proxy passed a check an hour ago: alive, and due again.
    let id = by_addr(
        &store.list_proxies(ProxyFilter::default()).await.unwrap(),
        working.addr(),
    )
    .id;
    let policy = config.check.recheck_policy();
    store
        .record_checks(vec![common::alive_at(id, now_ms() - 3_600_000)], policy)
        .await
        .unwrap();
    assert_eq!(store.count_due(now_ms(), false).await.unwrap(), 31);

    // One at a time, starting checks for 300 ms: a silent proxy holds the
    // only slot for the whole 2 s timeout, so the round can start at most
    // one of them after whatever it takes first.
    let opts = CheckOptions {
        concurrency: 1,
        dispatch_for: Some(Duration::from_millis(300)),
        ..CheckOptions::from_config(&config.check)
    };
    let summary = run_round_with(&config, &store, &opts).await.unwrap();
    assert_eq!(summary.alive, 1, "{summary:?}");
    assert!(summary.checked <= 2, "{summary:?}");
    assert!(!summary.interrupted);
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(by_addr(&records, working.addr()).checks_total, 2);
    assert!(store.count_due(now_ms(), false).await.unwrap() >= 29);
}

/// Issue 9, Must 3: a proxy that resets one connection and works on the next
/// is alive once it has worked: for a proxy that passed its last check, a
/// reset is retried once before the verdict, on the main request and on the
/// HTTPS test alike, so the flag comes from the tunnel that worked, not from
/// the reset. Issue 22: a proxy that never worked gets no retry; its reset
/// is its verdict, and the next round finds it working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_resetting_every_other_connection_is_alive_and_tunnels() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let tls_judge = Judge::tls(dir.path()).await;
    let flaky = FakeHttpProxy::start(with_behavior(fakes::Behavior::ResetEveryOther)).await;
    let judges = format!(r#"["{}", "{}"]"#, judge.url(), tls_judge.url());
    let extra = format!("extra_ca_file = \"{}\"", tls_judge.ca_file().display());
    let entries = [format!("http://{}", flaky.addr())];
    let config = config(dir.path(), &judges, &extra, &entries, &[]);
    let (store, summary) = harvest_and_check(&config).await;
    assert_eq!(summary.dead_by_reason.get(&Reason::Reset), Some(&1));
    assert_eq!(flaky.requests(), 1, "a proxy that never worked: no retry");

    // The second connection works; the CONNECT after it resets, then passes.
    let summary = run_round(&config, &store, true).await.unwrap();
    assert_eq!(summary.alive, 1, "{:?}", summary.dead_by_reason);
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.https, Some(true), "the second CONNECT tunnelled");
    assert_eq!(flaky.requests(), 4);

    // Alive before: the main request resets, then passes.
    let summary = run_round(&config, &store, true).await.unwrap();
    assert_eq!(summary.alive, 1, "{:?}", summary.dead_by_reason);
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.status, Status::Alive);
    assert_eq!(flaky.requests(), 6);
}

/// Issue 22: probes to an https judge use TLS 1.2 when it speaks it (its
/// resumed sessions need no key exchange); a judge that speaks TLS 1.3 only
/// is probed with TLS 1.3, directly and through every tunnel.
#[tokio::test]
async fn a_judge_speaking_tls_1_3_only_still_tests_https() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let tls_judge = Judge::tls13_only(dir.path()).await;
    let proxy = FakeHttpProxy::start(http_opts(ProxyKind::Elite, true)).await;
    let judges = format!(r#"["{}", "{}"]"#, judge.url(), tls_judge.url());
    let extra = format!("extra_ca_file = \"{}\"", tls_judge.ca_file().display());
    let config = config(
        dir.path(),
        &judges,
        &extra,
        &[format!("http://{}", proxy.addr())],
        &[],
    );
    let (store, summary) = harvest_and_check(&config).await;
    assert_eq!(summary.alive, 1, "{:?}", summary.dead_by_reason);
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(
        r.https,
        Some(true),
        "the tunnel to the TLS 1.3 judge worked"
    );
}

/// Issue 9, Must 3: a CONNECT that is reset says nothing about whether the
/// proxy tunnels. The flag stays unknown, and a known flag unchanged; only a
/// refused CONNECT makes it false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_tunnel_never_makes_https_false() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let tls_judge = Judge::tls(dir.path()).await;
    let resets = FakeHttpProxy::start(with_behavior(fakes::Behavior::ResetTunnels)).await;
    let refuses = FakeHttpProxy::start(http_opts(ProxyKind::Elite, false)).await;
    let judges = format!(r#"["{}", "{}"]"#, judge.url(), tls_judge.url());
    let extra = format!("extra_ca_file = \"{}\"", tls_judge.ca_file().display());
    let entries = [&resets, &refuses].map(|p| format!("http://{}", p.addr()));
    let config = config(dir.path(), &judges, &extra, &entries, &[]);
    let (store, summary) = harvest_and_check(&config).await;
    assert_eq!(summary.alive, 2, "{:?}", summary.dead_by_reason);
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(by_addr(&records, resets.addr()).https, None);
    assert_eq!(by_addr(&records, refuses.addr()).https, Some(false));

    // Known to tunnel from a check seven hours ago (HTTPS is due again):
    // resets on every CONNECT now leave the flag as it was.
    let id = by_addr(&records, resets.addr()).id;
    let mut earlier = common::alive_at(id, now_ms() - 7 * 3_600_000);
    earlier.outcome.https = Some(true);
    store
        .record_checks(vec![earlier], config.check.recheck_policy())
        .await
        .unwrap();
    run_round(&config, &store, true).await.unwrap();
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let r = by_addr(&records, resets.addr());
    assert_eq!(r.status, Status::Alive);
    assert_eq!(r.https, Some(true), "a reset never turns the flag false");
    assert_eq!(by_addr(&records, refuses.addr()).https, Some(false));
}

/// The proxies of the faulty-judge tests, all due again: 40 working ones
/// that passed their last check, one that passed and now refuses, one that
/// passed and now injects its own page, and a liar already found dead.
struct Scene {
    farm: FakeFarm,
    gone: fakes::ClosedPort,
    turned_liar: FakeHttpProxy,
    liar: FakeHttpProxy,
    /// Passed its last check and now never answers.
    went_silent: Option<FakeHttpProxy>,
}

impl Scene {
    async fn start(with_silent: bool) -> Scene {
        let went_silent = if with_silent {
            Some(FakeHttpProxy::start(with_behavior(fakes::Behavior::Hang)).await)
        } else {
            None
        };
        Scene {
            farm: FakeFarm::start(40, 0, Some(exit_ip())).await,
            gone: fakes::closed_port(),
            turned_liar: FakeHttpProxy::start(with_behavior(fakes::Behavior::Liar)).await,
            liar: FakeHttpProxy::start(with_behavior(fakes::Behavior::Liar)).await,
            went_silent,
        }
    }

    /// Lists the proxies, harvests them and records their last checks an
    /// hour ago; returns the store and the config, for `judges`.
    async fn stored(&self, dir: &Path, judges: &str) -> (Config, Store) {
        let mut entries = farm_list(&self.farm);
        entries.push(format!("http://{}", self.gone.addr()));
        entries.push(format!("http://{}", self.turned_liar.addr()));
        entries.push(format!("http://{}", self.liar.addr()));
        if let Some(s) = &self.went_silent {
            entries.push(format!("http://{}", s.addr()));
        }
        let mut config = config(dir, judges, "", &entries, &[]);
        config.check.concurrency = 8;
        config.check.https = false;
        let store = harvested(&config).await;
        let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
        let hour_ago = now_ms() - 3_600_000;
        let mut earlier: Vec<_> = records
            .iter()
            .map(|r| common::alive_at(r.id, hour_ago))
            .collect();
        let liar = by_addr(&records, self.liar.addr()).id;
        for rec in &mut earlier {
            if rec.id == liar {
                rec.outcome = proxywarden::model::Outcome::dead(Reason::ContentMismatch);
            }
        }
        store
            .record_checks(earlier, config.check.recheck_policy())
            .await
            .unwrap();
        assert_eq!(
            store.count_due(now_ms(), false).await.unwrap() as usize,
            records.len()
        );
        (config, store)
    }

    /// No working proxy was marked dead, and the dead ones are dead for
    /// what they did. The proxy that turned liar is dead when a second
    /// healthy judge confirmed its wrong page; when none was left to (the
    /// faulty judge quarantined, or the only one), it keeps its status, its
    /// check unrecorded and due again within a minute.
    async fn assert_verdicts(&self, store: &Store) {
        let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
        let killed: Vec<_> = self
            .farm
            .alive_addrs()
            .into_iter()
            .map(|a| by_addr(&records, a))
            .filter(|r| r.status != Status::Alive)
            .map(|r| (r.proxy.port, r.reason.clone()))
            .collect();
        assert!(killed.is_empty(), "working proxies marked dead: {killed:?}");
        let dead = |addr: SocketAddr, reason: Reason| {
            let r = by_addr(&records, addr);
            assert_eq!(r.status, Status::Dead, "{addr}");
            assert_eq!(r.reason.as_deref(), Some(reason.as_str()), "{addr}");
        };
        dead(self.gone.addr(), Reason::Refused);
        dead(self.liar.addr(), Reason::ContentMismatch);
        let turned = by_addr(&records, self.turned_liar.addr());
        if turned.status == Status::Alive {
            assert_eq!(turned.checks_total, 1, "not recorded: {turned:?}");
            assert!(turned.next_check_at <= now_ms() + 60_000, "{turned:?}");
        } else {
            dead(self.turned_liar.addr(), Reason::ContentMismatch);
        }
        if let Some(s) = &self.went_silent {
            dead(s.addr(), Reason::Timeout);
        }
    }
}

/// Issue 9, Must 4 (a): of two judges, one starts answering 200 with random
/// content mid-round. No working proxy is marked dead; proxies that are
/// dead or lying still come out dead, confirmed by the healthy judge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_turning_to_random_content_kills_no_proxy() {
    one_of_two_judges_turning(Fault::RandomContent, false, 3, "fault").await;
}

/// Issue 9, Must 4 (b): of two judges, one stops answering mid-round. No
/// working proxy is marked dead; one that went silent is still found dead
/// once the healthy judge confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_stalling_mid_round_kills_no_proxy() {
    one_of_two_judges_turning(Fault::Stall, true, 1, "stall").await;
}

/// Of two judges, one starts dripping its answers (the head at once, then a
/// byte a second) mid-round: each check through it ends at `check.timeout`
/// like a silent one, and the slowness is the judge's, so no working proxy
/// is marked dead; one that went silent is still found dead once the
/// healthy judge confirms it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_judge_dripping_its_answers_mid_round_kills_no_proxy() {
    one_of_two_judges_turning(Fault::Drip, true, 1, "drip").await;
}

/// The only judge starts dripping every answer mid-round, its direct ones
/// too: the judge is out of reach, not the proxies, so the round stops and
/// no working proxy is marked dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_only_judge_dripping_every_answer_kills_no_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let faulted = Arc::new(AtomicUsize::new(0));
    let judge = Judge::plain_with(Judge::turning(6, Fault::Drip, faulted.clone())).await;
    let scene = Scene::start(false).await;
    let judges = format!(r#"["{}"]"#, judge.url());
    let (config, store) = scene.stored(dir.path(), &judges).await;
    let round = common::within(run_round(&config, &store, false)).await;
    assert!(
        faulted.load(Ordering::Relaxed) >= 1,
        "no check met the drip ({round:?})"
    );
    // The round may stop before the others' verdicts: what it must not do
    // is bury a working proxy.
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    for addr in scene.farm.alive_addrs() {
        let r = by_addr(&records, addr);
        assert_eq!(r.status, Status::Alive, "{addr}: {r:?} ({round:?})");
    }
}

/// A round of the scene (with a proxy that went silent if `with_silent`)
/// against two judges, the first turning to `fault` after six requests: at
/// least `at_least` checks meet the fault (`what` in the message), all 40
/// working proxies stay alive and the others get their verdicts.
async fn one_of_two_judges_turning(fault: Fault, with_silent: bool, at_least: usize, what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let faulted = Arc::new(AtomicUsize::new(0));
    let turning = Judge::plain_with(Judge::turning(6, fault, faulted.clone())).await;
    let good = Judge::plain().await;
    let scene = Scene::start(with_silent).await;
    let judges = format!(r#"["{}", "{}"]"#, turning.url(), good.url());
    let (config, store) = scene.stored(dir.path(), &judges).await;
    let summary = common::within(run_round(&config, &store, false))
        .await
        .unwrap();
    assert!(
        faulted.load(Ordering::Relaxed) >= at_least,
        "checks met the {what}: {}",
        faulted.load(Ordering::Relaxed)
    );
    assert_eq!(summary.alive, 40, "{summary:?}");
    scene.assert_verdicts(&store).await;
}

/// Issue 9, Must 4 (c): the only judge answers garbage to three requests in
/// ten. No working proxy is marked dead: with no second judge to confirm a
/// wrong answer, the proxy keeps its status and is checked again soon. A
/// proxy that refuses is dead all the same (no judge is needed for that),
/// and the liar found dead before stays dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_judge_answering_garbage_sometimes_kills_no_proxy() {
    let dir = tempfile::tempdir().unwrap();
    let faulted = Arc::new(AtomicUsize::new(0));
    let judge =
        Judge::plain_with(Judge::turning(1, Fault::GarbageSometimes, faulted.clone())).await;
    let scene = Scene::start(false).await;
    let judges = format!(r#"["{}"]"#, judge.url());
    let (config, store) = scene.stored(dir.path(), &judges).await;
    run_round(&config, &store, false).await.unwrap();
    assert!(
        faulted.load(Ordering::Relaxed) >= 3,
        "checks met the garbage: {}",
        faulted.load(Ordering::Relaxed)
    );
    scene.assert_verdicts(&store).await;
    // Working proxies whose verdict could not be confirmed were not
    // recorded as checked, and are due again within a minute.
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let soon = now_ms() + 60_000;
    for addr in scene.farm.alive_addrs() {
        let r = by_addr(&records, addr);
        assert!(
            r.checks_total == 2 || r.next_check_at <= soon,
            "{addr}: {r:?}"
        );
    }
}

/// Issue 9, Must 6a: the HTTPS test (a second connection and a TLS
/// handshake) runs on its own cadence, `check.https_recheck` (6 h), not on
/// every check of a working proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_is_tested_on_its_own_cadence() {
    let dir = tempfile::tempdir().unwrap();
    let scene = HttpsScene::start(dir.path()).await;
    let proxy = &scene.proxy;
    let config = scene.config(dir.path(), None);
    let (store, _) = harvest_and_check(&config).await;
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.https, Some(true));
    assert_eq!(proxy.targets().len(), 1, "one CONNECT");

    let summary = run_round(&config, &store, true).await.unwrap();
    assert_eq!(summary.alive, 1);
    let r = &store.list_proxies(ProxyFilter::default()).await.unwrap()[0];
    assert_eq!(r.checks_total, 2);
    assert_eq!(r.https, Some(true), "the result stands");
    assert_eq!(proxy.targets().len(), 1, "no CONNECT on the re-check");
}

/// Issue 9, Must 6a: a tunnel that failed in use asks for the HTTPS test at
/// the next check, which it makes due at once; and a short
/// `check.https_recheck` tests it on every check.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tunnel_failing_in_use_gets_https_tested_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let scene = HttpsScene::start(dir.path()).await;
    let proxy = &scene.proxy;
    let config = scene.config(dir.path(), None);
    let (store, _) = harvest_and_check(&config).await;
    assert_eq!(proxy.targets().len(), 1);
    let id = store.list_proxies(ProxyFilter::default()).await.unwrap()[0].id;
    assert_eq!(store.count_due(now_ms(), false).await.unwrap(), 0);

    store
        .request_https_recheck(vec![id], now_ms())
        .await
        .unwrap();
    assert_eq!(store.count_due(now_ms(), false).await.unwrap(), 1);
    run_round(&config, &store, false).await.unwrap();
    assert_eq!(proxy.targets().len(), 2, "tested again");
    run_round(&config, &store, true).await.unwrap();
    assert_eq!(proxy.targets().len(), 2, "and then not for 6 h");

    let every_check = scene.config(dir.path(), Some("1ms"));
    run_round(&every_check, &store, true).await.unwrap();
    assert_eq!(proxy.targets().len(), 3);
    assert_eq!(
        store.list_proxies(ProxyFilter::default()).await.unwrap()[0].https,
        Some(true)
    );
}

/// A plain judge, a TLS judge and an elite proxy that tunnels, to test
/// the proxy's HTTPS support.
struct HttpsScene {
    judge: Judge,
    tls_judge: Judge,
    proxy: FakeHttpProxy,
}

impl HttpsScene {
    async fn start(dir: &Path) -> HttpsScene {
        HttpsScene {
            judge: Judge::plain().await,
            tls_judge: Judge::tls(dir).await,
            proxy: FakeHttpProxy::start(http_opts(ProxyKind::Elite, true)).await,
        }
    }

    /// A config checking the proxy alone against both judges, trusting the
    /// TLS judge's CA, with `check.https_recheck` set to `https_recheck`
    /// when given.
    fn config(&self, dir: &Path, https_recheck: Option<&str>) -> Config {
        let judges = format!(r#"["{}", "{}"]"#, self.judge.url(), self.tls_judge.url());
        let mut extra = format!("extra_ca_file = \"{}\"", self.tls_judge.ca_file().display());
        if let Some(every) = https_recheck {
            extra.push_str(&format!("\nhttps_recheck = \"{every}\""));
        }
        let entries = [format!("http://{}", self.proxy.addr())];
        config(dir, &judges, &extra, &entries, &[])
    }
}

/// Issue 9, Must 6b: a proxy that takes the connection and never answers
/// its SOCKS greeting costs the connect timeout (1 s), not the total one
/// (10 s here, so that a busy machine cannot blur the two), and is dead
/// with reason `timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_silent_in_its_handshake_costs_the_connect_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let hang = SocksOpts {
        behavior: fakes::SocksBehavior::Hang,
        ..SocksOpts::default()
    };
    let socks5 = FakeSocks5::start(hang.clone()).await;
    let socks4 = FakeSocks4::start(hang).await;
    let entries = [
        format!("socks5://{}", socks5.addr()),
        format!("socks4://{}", socks4.addr()),
    ];
    let mut config = one_judge_config(dir.path(), &judge, &entries);
    config.check.connect_timeout = Duration::from_secs(1);
    config.check.timeout = Duration::from_secs(10);
    let (store, summary) = harvest_and_check(&config).await;
    assert_eq!(summary.dead_by_reason[&Reason::Timeout], 2, "{summary:?}");
    assert!(
        summary.elapsed < config.check.timeout,
        "the round took {:?}: the total timeout, not the connect one",
        summary.elapsed
    );
    for r in store.list_proxies(ProxyFilter::default()).await.unwrap() {
        assert_eq!(r.reason.as_deref(), Some("timeout"));
    }
}

/// Issue 9, Must 6c: results are committed without asking the judge
/// directly first. A judge slow to answer the checker's own requests (10 s)
/// but quick through proxies does not hold up a round whose failures came
/// before checks that passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committing_failures_never_waits_for_a_direct_answer() {
    let dir = tempfile::tempdir().unwrap();
    let direct_delay = Duration::from_secs(10);
    let judge = Judge::plain_with(Judge::slow_to_checker(direct_delay)).await;
    let closed: Vec<_> = (0..20).map(|_| fakes::closed_port()).collect();
    let farm = FakeFarm::start(30, 0, Some(exit_ip())).await;
    // The refusing proxies first: they are checked (and fail) first.
    let entries: Vec<String> = closed
        .iter()
        .map(|c| format!("http://{}", c.addr()))
        .chain(farm_list(&farm))
        .collect();
    let mut config = one_judge_config(dir.path(), &judge, &entries);
    config.check.concurrency = 4;
    config.check.https = false;
    let (_, summary) = harvest_and_check(&config).await;
    assert_eq!((summary.alive, summary.dead), (30, 20), "{summary:?}");
    assert!(
        summary.elapsed < direct_delay,
        "the round took {:?}: it waited for the judge's direct answer",
        summary.elapsed
    );
}

/// Issue 9, Must 6d: proxies that timed out last time are started first,
/// so that the longest checks never form a round's tail. Here a round may
/// start checks for 1 s only, four at a time, and 400 new silent proxies
/// (2 s each) come first in the list: the three that timed out last time
/// are checked all the same, whichever stream's first page is read first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_that_timed_out_last_time_are_started_first() {
    let dir = tempfile::tempdir().unwrap();
    let judge = Judge::plain().await;
    let farm = FakeFarm::start(0, 403, None).await;
    let entries = farm_list(&farm);
    let mut config = one_judge_config(dir.path(), &judge, &entries);
    config.check.https = false;
    let store = harvested(&config).await;
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let last_three: Vec<i64> = farm.silent_addrs()[400..]
        .iter()
        .map(|a| by_addr(&records, *a).id)
        .collect();
    let hour_ago = now_ms() - 3_600_000;
    let earlier = last_three
        .iter()
        .map(|&id| proxywarden::store::CheckRecord {
            id,
            checked_at: hour_ago,
            outcome: proxywarden::model::Outcome::dead(Reason::Timeout),
        })
        .collect();
    store
        .record_checks(earlier, config.check.recheck_policy())
        .await
        .unwrap();
    let opts = CheckOptions {
        concurrency: 4,
        dispatch_for: Some(Duration::from_secs(1)),
        ..CheckOptions::from_config(&config.check)
    };
    let summary = run_round_with(&config, &store, &opts).await.unwrap();
    assert!(summary.checked <= 8, "{summary:?}");
    let records = store.list_proxies(ProxyFilter::default()).await.unwrap();
    for id in last_three {
        let r = records.iter().find(|r| r.id == id).unwrap();
        assert_eq!(r.checks_total, 2, "{r:?}");
    }
}
