//! The two backends are one contract: random sequences of store work —
//! harvests of overlapping lists with repeats and hints, check verdicts,
//! leases taken and given back, reports, site records, crawl jobs — run
//! on a fresh SQLite file and a fresh database of one real PostgreSQL
//! server, and everything a user can observe (what each call answers,
//! `/stats` counts, the listing and export, the sources, site records,
//! crawl jobs) must be the same on both. Row ids differ between backends
//! and are compared through the proxies they name.

use crate::common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proxywarden::model::{Candidate, Hints, Outcome, Reason, SourceScheme};
use proxywarden::proxy::{Anonymity, Country, Scheme, Status};
use proxywarden::store::{
    DueLane, NewUrl, ProxyFilter, SiteRecord, SourceRecord, SourceRun, Store, UrlState,
};

/// Addresses the lists draw from: few, so that lists overlap and repeat.
const ADDRESSES: u8 = 24;

/// One entry of a list.
#[derive(Clone, Debug)]
struct Entry {
    addr: u8,
    /// 0 http, 1 socks4, 2 socks5, 3 to detect.
    scheme: u8,
    country: Option<u8>,
    anonymity: Option<u8>,
}

/// One step of store work. `pick`s choose a stored proxy by its place in
/// identity order, the same proxy on both backends.
#[derive(Clone, Debug)]
enum Op {
    Harvest {
        source: u8,
        list: Vec<Entry>,
        failed: bool,
    },
    Verdicts {
        picks: Vec<(u8, bool, Option<u8>)>,
    },
    Lease {
        node: u8,
        limit: u8,
    },
    Release {
        node: u8,
    },
    Report {
        pick: u8,
        ok: bool,
    },
    Site {
        pick: u8,
        site: u8,
        worked: u16,
    },
    CrawlJob {
        seed: u8,
        end: Option<bool>,
    },
    /// On a crawl job's frontier: pages found, then pages ended (a pick
    /// among a host's waiting ones, done or failed, with what they link
    /// to), committed; a job picked among those stored.
    Frontier {
        job: u8,
        found: Vec<u8>,
        ended: Vec<(u8, bool, Vec<u8>)>,
    },
}

fn entry() -> impl Strategy<Value = Entry> {
    (
        0..ADDRESSES,
        0u8..4,
        proptest::option::weighted(0.3, 0u8..3),
        proptest::option::weighted(0.2, 0u8..3),
    )
        .prop_map(|(addr, scheme, country, anonymity)| Entry {
            addr,
            scheme,
            country,
            anonymity,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..4, proptest::collection::vec(entry(), 0..16), proptest::bool::weighted(0.1))
            .prop_map(|(source, list, failed)| Op::Harvest { source, list, failed }),
        3 => proptest::collection::vec((any::<u8>(), any::<bool>(), proptest::option::of(0u8..3)), 1..6)
            .prop_map(|picks| Op::Verdicts { picks }),
        2 => (0u8..2, 1u8..8).prop_map(|(node, limit)| Op::Lease { node, limit }),
        1 => (0u8..2).prop_map(|node| Op::Release { node }),
        2 => (any::<u8>(), any::<bool>()).prop_map(|(pick, ok)| Op::Report { pick, ok }),
        1 => (any::<u8>(), 0u8..2, 0u16..5).prop_map(|(pick, site, worked)| Op::Site { pick, site, worked }),
        1 => (0u8..3, proptest::option::of(any::<bool>())).prop_map(|(seed, end)| Op::CrawlJob { seed, end }),
        2 => (
            any::<u8>(),
            proptest::collection::vec(0u8..20, 0..6),
            proptest::collection::vec((any::<u8>(), any::<bool>(), proptest::collection::vec(0u8..20, 0..3)), 0..4),
        )
            .prop_map(|(job, found, ended)| Op::Frontier { job, found, ended }),
    ]
}

const COUNTRIES: [&str; 3] = ["DE", "US", "BR"];
const LEVELS: [Anonymity; 3] = [
    Anonymity::Transparent,
    Anonymity::Anonymous,
    Anonymity::Elite,
];

fn candidate(e: &Entry) -> Candidate {
    let (explicit, default) = match e.scheme {
        0 => (None, SourceScheme::Fixed(Scheme::Http)),
        1 => (None, SourceScheme::Fixed(Scheme::Socks4)),
        2 => (None, SourceScheme::Fixed(Scheme::Socks5)),
        _ => (None, SourceScheme::Detect),
    };
    Candidate::new(
        IpAddr::V4(Ipv4Addr::new(11, 0, 0, e.addr)),
        8000 + u16::from(e.addr % 3),
        None,
        explicit,
        default,
        Hints {
            country: e
                .country
                .and_then(|c| Country::parse(COUNTRIES[usize::from(c)])),
            anonymity: e.anonymity.map(|a| LEVELS[usize::from(a)]),
            ..Hints::default()
        },
    )
}

/// What one backend answered to a step, with ids turned into proxies.
#[derive(Debug, PartialEq)]
enum Answer {
    Harvest(usize, usize),
    Nothing,
    Leased(Vec<String>),
    Released(u64),
    Reported(bool),
    Queued(Vec<String>),
}

/// Page `n` of the two hosts of the crawls.
fn page(n: u8) -> NewUrl {
    let host = format!("h{}.example", n % 2);
    NewUrl {
        url: format!("http://{host}/p{n}"),
        host,
        depth: u32::from(n % 3),
        parent: None,
    }
}

/// The jobs' ids, oldest first.
async fn job_ids(store: &Store) -> Vec<i64> {
    let mut ids: Vec<i64> = store
        .crawl_jobs(1_000)
        .await
        .unwrap()
        .iter()
        .map(|j| j.id)
        .collect();
    ids.sort_unstable();
    ids
}

/// The stored proxies, by identity: ids and their proxies.
async fn by_identity(store: &Store) -> Vec<(String, i64)> {
    let mut all: Vec<(String, i64)> = store
        .list_proxies(ProxyFilter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.proxy.to_string(), r.id))
        .collect();
    all.sort();
    all
}

async fn apply(store: &Store, op: &Op, at: i64) -> Answer {
    let known = by_identity(store).await;
    let pick = |p: u8| (!known.is_empty()).then(|| known[usize::from(p) % known.len()].1);
    let name_of = |id: i64| {
        known
            .iter()
            .find(|(_, i)| *i == id)
            .map(|(n, _)| n.clone())
            .unwrap_or_default()
    };
    match op {
        Op::Harvest {
            source,
            list,
            failed,
        } => {
            let run = SourceRun {
                name: format!("source{source}"),
                url: format!("https://lists.invalid/{source}"),
                format: "text".into(),
                started_at: at,
                http_status: Some(if *failed { 500 } else { 200 }),
                duration_ms: 7,
                error: failed.then(|| "status 500".to_owned()),
                private: 0,
            };
            let list: Vec<Candidate> = if *failed {
                Vec::new()
            } else {
                list.iter().map(candidate).collect()
            };
            let c = store.record_source_run(run, list).await.unwrap();
            Answer::Harvest(c.found, c.new)
        }
        Op::Verdicts { picks } => {
            let mut batch = Vec::new();
            let mut seen = std::collections::BTreeSet::new();
            for &(p, alive, country) in picks {
                let Some(id) = pick(p) else { continue };
                if !seen.insert(id) {
                    continue;
                }
                let outcome = if alive {
                    Outcome {
                        failure: None,
                        latency: Some(Duration::from_millis(40 + u64::from(p))),
                        anonymity: Some(LEVELS[usize::from(p % 3)]),
                        https: Some(p % 2 == 0),
                        exit_ip: Some(IpAddr::V4(Ipv4Addr::new(12, 0, 0, p))),
                        country: country.and_then(|c| Country::parse(COUNTRIES[usize::from(c)])),
                        detected: None,
                    }
                } else {
                    Outcome::dead([Reason::Refused, Reason::Timeout][usize::from(p % 2)])
                };
                batch.push(proxywarden::store::CheckRecord {
                    id,
                    checked_at: at,
                    outcome,
                });
            }
            if !batch.is_empty() {
                store.record_checks(batch, policy()).await.unwrap();
            }
            Answer::Nothing
        }
        Op::Lease { node, limit } => {
            let mut leased = Vec::new();
            for lane in [DueLane::Alive, DueLane::Others] {
                let got = store
                    .lease_due(
                        format!("node{node}"),
                        at,
                        lane,
                        usize::from(*limit),
                        Duration::from_secs(60),
                    )
                    .await
                    .unwrap();
                leased.extend(got.iter().map(|d| name_of(d.id)));
            }
            Answer::Leased(leased)
        }
        Op::Release { node } => {
            Answer::Released(store.release_leases(format!("node{node}")).await.unwrap())
        }
        Op::Report { pick: p, ok } => match pick(*p) {
            Some(id) => Answer::Reported(store.record_report(id, *ok, at).await.unwrap()),
            None => Answer::Nothing,
        },
        Op::Site {
            pick: p,
            site,
            worked,
        } => {
            if let Some(proxy_id) = pick(*p) {
                store
                    .save_site_records(vec![SiteRecord {
                        site: format!("site{site}.example"),
                        proxy_id,
                        worked: i64::from(*worked),
                        blocked: i64::from(*worked % 2),
                        latency_ms: Some(i64::from(*worked) * 10),
                        last_worked_at: Some(at),
                        last_blocked_at: None,
                        banned_until: (*worked == 0).then_some(at + 60_000),
                        updated_at: at,
                    }])
                    .await
                    .unwrap();
            }
            Answer::Nothing
        }
        Op::Frontier { job, found, ended } => {
            let jobs = job_ids(store).await;
            if jobs.is_empty() {
                return Answer::Nothing;
            }
            let job = jobs[usize::from(*job) % jobs.len()];
            let (store, found, ended) = (store.clone(), found.clone(), ended.clone());
            let queued = async move {
                let mut f = store.frontier(job).await.unwrap();
                let mut queued: Vec<String> = f
                    .add(&found.iter().map(|&n| page(n)).collect::<Vec<_>>())
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|q| q.url)
                    .collect();
                for (pick, done, links) in ended {
                    let host = format!("h{}.example", pick % 2);
                    let waiting = f.waiting(&host, 0, 100).await.unwrap();
                    if waiting.is_empty() {
                        continue;
                    }
                    let q = &waiting[usize::from(pick) % waiting.len()];
                    let state = if done {
                        UrlState::Done
                    } else {
                        UrlState::Failed
                    };
                    let links: Vec<NewUrl> = links.iter().map(|&n| page(n)).collect();
                    let more = f.finish(q.id, state, 1, &links).await.unwrap();
                    queued.push(format!("ended {}", q.url));
                    queued.extend(more.into_iter().map(|q| q.url));
                }
                f.commit(&[("pages", queued.len().to_string())])
                    .await
                    .unwrap();
                queued
            }
            .await;
            Answer::Queued(queued)
        }
        Op::CrawlJob { seed, end } => {
            let spec = format!(r#"{{"seeds":["http://site{seed}.example/"],"max_pages":5}}"#);
            let job = store.insert_crawl_job(spec).await.unwrap();
            match end {
                Some(true) => {
                    store.crawl_job_running(job.id).await.unwrap();
                    store
                        .crawl_job_ended(job.id, "done", Some(r#"{"pages_ok":3}"#.into()), None)
                        .await
                        .unwrap();
                }
                Some(false) => {
                    store.crawl_job_running(job.id).await.unwrap();
                    store
                        .crawl_job_paused(job.id, r#"{"pages_ok":1}"#.into())
                        .await
                        .unwrap();
                }
                None => {}
            }
            Answer::Nothing
        }
    }
}

fn policy() -> proxywarden::model::RecheckPolicy {
    proxywarden::model::RecheckPolicy {
        alive: Duration::from_secs(600),
        alive_jitter: Duration::ZERO,
        dead: Duration::from_secs(60),
        dead_max: Duration::from_secs(3600),
    }
}

/// Everything a user sees of the store, ids replaced by proxies. The time
/// of the next check is left out: re-checks are spread at random.
async fn observe(store: &Store) -> String {
    let known = by_identity(store).await;
    let name_of = |id: i64| {
        known
            .iter()
            .find(|(_, i)| *i == id)
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| format!("gone {id}"))
    };
    let mut out = String::new();
    let stats = store.stats().await.unwrap();
    out.push_str(&format!("{stats:#?}\n"));
    // The sources' last runs as a start-up reads them: the records
    // without their counts.
    let runs = store.source_runs().await.unwrap();
    let uncounted: Vec<SourceRecord> = store
        .list_sources()
        .await
        .unwrap()
        .into_iter()
        .map(|s| SourceRecord {
            proxies: 0,
            alive: 0,
            unique: 0,
            ..s
        })
        .collect();
    assert_eq!(format!("{runs:?}"), format!("{uncounted:?}"));
    out.push_str(&format!("{runs:#?}\n"));
    // The listing in its own order, as the API and export give it.
    for mut r in store.list_proxies(ProxyFilter::default()).await.unwrap() {
        r.id = 0;
        r.next_check_at = 0;
        r.sources.sort();
        out.push_str(&format!("{r:?}\n"));
    }
    // The alive and the dead alone (records scattered among the ids), and
    // the listing in small pages as the CLI's export reads it: each reads
    // its records' sources its own way.
    for status in [Status::Alive, Status::Dead] {
        let filter = ProxyFilter {
            status: Some(status),
            ..ProxyFilter::default()
        };
        for mut r in store.list_proxies(filter).await.unwrap() {
            r.id = 0;
            r.next_check_at = 0;
            r.sources.sort();
            out.push_str(&format!("{status:?}: {r:?}\n"));
        }
    }
    let mut after = 0;
    loop {
        let page = store
            .list_proxies_after(ProxyFilter::default(), after, 3)
            .await
            .unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        for mut r in page {
            r.id = 0;
            r.next_check_at = 0;
            r.sources.sort();
            out.push_str(&format!("page: {r:?}\n"));
        }
    }
    let mut records = Vec::new();
    proxywarden::export::write(
        &store.list_proxies(ProxyFilter::default()).await.unwrap(),
        proxywarden::export::Format::Txt,
        &mut records,
    )
    .unwrap();
    out.push_str(&String::from_utf8_lossy(&records));
    for s in store.load_site_records(0, 1_000).await.unwrap() {
        let proxy = name_of(s.proxy_id);
        out.push_str(&format!(
            "site {proxy} {:?}\n",
            SiteRecord { proxy_id: 0, ..s }
        ));
    }
    for job in job_ids(store).await {
        let s = store.clone();
        let pages = async move {
            let mut f = s.frontier(job).await.unwrap();
            let mut text = format!(
                "frontier total={} done={} failed={} meta={:?}\n",
                f.total().await.unwrap(),
                f.count(UrlState::Done).await.unwrap(),
                f.count(UrlState::Failed).await.unwrap(),
                f.meta("pages").await.unwrap()
            );
            for host in f.hosts_with_work_after("", 10).await.unwrap() {
                let waiting: Vec<String> = f
                    .waiting(&host, 0, 100)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|q| format!("{} {}", q.url, q.depth))
                    .collect();
                text.push_str(&format!("{host}: {waiting:?}\n"));
            }
            text
        }
        .await;
        out.push_str(&pages);
    }
    for j in store.crawl_jobs(100).await.unwrap() {
        out.push_str(&format!(
            "job {} {} {:?} {:?} started={} finished={}\n",
            j.spec,
            j.state,
            j.summary,
            j.error,
            j.started_at.is_some(),
            j.finished_at.is_some()
        ));
    }
    out
}

/// One PostgreSQL server for every case, a fresh database per case. The
/// server belongs to the test, not to a static: a static is never
/// dropped, so its server would outlive the run with its folder.
#[test]
fn sqlite_and_postgres_answer_the_same_work_alike() {
    let server = common::postgres::PgServer::start();
    let cases = AtomicU32::new(0);
    // Each case is some thirty steps on both backends: hundreds of steps
    // in all, in seconds.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 16,
        ..ProptestConfig::default()
    });
    let result = runner.run(&proptest::collection::vec(op(), 10..40), |ops| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let sqlite = Store::open(&dir.path().join("store.db")).unwrap();
            let case = cases.fetch_add(1, Ordering::Relaxed);
            let postgres = server.fresh_store(&format!("case{case}")).await;
            for (i, op) in ops.iter().enumerate() {
                let at = 1_000_000 + i as i64 * 1_000;
                let a = apply(&sqlite, op, at).await;
                let b = apply(&postgres, op, at).await;
                prop_assert_eq!(&a, &b, "step {} {:?}", i, op);
            }
            let (a, b) = (observe(&sqlite).await, observe(&postgres).await);
            prop_assert_eq!(a, b);
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
