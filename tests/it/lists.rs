//! The layouts real public lists use, from the fixtures in
//! `tests/fixtures/lists` (documentation addresses, which the test config
//! keeps with `harvest.allow_private_addresses`; nothing connects to them),
//! harvested end to end from a loopback server: every entry stored, every
//! annotation kept as the source's hints, and a gzip copy served without
//! `Content-Encoding` read like the plain one.

use crate::common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use common::config_toml;
use common::site::{Reply, Site};
use proxywarden::config::Config;
use proxywarden::harvest::{HarvestReport, SourceReport, harvest_all};
use proxywarden::store::{ProxyFilter, ProxyRecord, Store};

fn fixture(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lists")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gz(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

/// What a user sees of a stored proxy: its URL, country, anonymity and
/// HTTPS hints (`-` for none).
fn seen(r: &ProxyRecord) -> String {
    let or_dash = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    format!(
        "{} {} {} {}",
        r.proxy,
        or_dash(r.country.map(|c| c.to_string())),
        or_dash(r.hint_anonymity.map(|a| a.to_string())),
        or_dash(r.hint_https.map(|h| h.to_string())),
    )
}

async fn harvest(dir: &Path, sources: &str) -> (Vec<String>, HarvestReport) {
    let config = Config::from_toml(&config_toml(dir, sources), "t").unwrap();
    let store = Store::open(&config.database.path).unwrap();
    let report = harvest_all(&config, &store).await.unwrap();
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let mut seen: Vec<String> = all.iter().map(seen).collect();
    seen.sort();
    (seen, report)
}

fn source<'a>(report: &'a HarvestReport, name: &str) -> &'a SourceReport {
    report.sources.iter().find(|s| s.name == name).unwrap()
}

fn src(name: &str, url: &str, extra: &str) -> String {
    format!("[[sources]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
}

const PIPES: &str = r"(?m)^(?P<ip>[\d.]+) \| (?P<port>\d+) \| (?P<scheme>\w+) \| (?P<country>[^|]+?) \| (?P<anonymity>\w+) \| (?P<https>\w+)$";

#[tokio::test]
async fn every_layout_is_stored_with_every_annotation() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![
        ("/spys.txt", Reply::ok(fixture("spys.txt"))),
        ("/hideip.txt", Reply::ok(fixture("hideip.txt"))),
        ("/prefixed.txt", Reply::ok(fixture("prefixed.txt"))),
        ("/proxies.json", Reply::ok(fixture("monosans.json"))),
        ("/pipes.txt", Reply::ok(fixture("pipes.txt"))),
        ("/unusable.txt", Reply::ok(fixture("unusable.txt"))),
        ("/scripted.html", Reply::ok(fixture("scripted.html"))),
    ])
    .await;
    let sources = [
        src("spys", &site.url("/spys.txt"), ""),
        src("hideip", &site.url("/hideip.txt"), ""),
        src("prefixed", &site.url("/prefixed.txt"), ""),
        src("monosans", &site.url("/proxies.json"), "format = \"json\""),
        src(
            "pipes",
            &site.url("/pipes.txt"),
            &format!("format = \"regex\"\npattern = '{PIPES}'"),
        ),
        src("unusable", &site.url("/unusable.txt"), ""),
        src("scripted", &site.url("/scripted.html"), ""),
    ]
    .concat();
    let (stored, report) = harvest(dir.path(), &sources).await;
    let want = [
        // spys: country, anonymity N/A/H, S for HTTPS; ZZ is no country
        "http://192.0.2.10:999 CO transparent true",
        "http://192.0.2.11:80 HK anonymous false",
        "http://192.0.2.12:999 EC transparent true",
        "http://192.0.2.13:8000 TH elite false",
        "http://192.0.2.14:80 GB anonymous false",
        "http://192.0.2.15:3128 DE elite true",
        "http://192.0.2.16:8080 - transparent false",
        // hideip.me: English names, a Latin-1 one among them
        "http://198.51.100.20:8080 PE - -",
        "http://198.51.100.21:7777 ID - -",
        "http://198.51.100.22:9002 NL - -",
        "http://198.51.100.23:999 US - -",
        "http://198.51.100.24:3128 CD - -",
        "http://198.51.100.25:80 TR - -",
        "http://198.51.100.26:80 HK - -",
        "http://198.51.100.27:8080 - - -",
        // scheme prefixes and both credential layouts
        "socks4://203.0.113.30:7890 - - -",
        "http://203.0.113.31:7080 - - -",
        "socks5://user:p%40ss@203.0.113.32:1080 - - -",
        "http://203.0.113.33:443 - - true",
        "http://alice:secret@203.0.113.34:8080 - - -",
        "socks5://bob:hunter2@203.0.113.35:1081 - - -",
        "http://203.0.113.36:3128 - - -",
        // monosans' JSON: the country inside geolocation.country.iso_code
        "socks4://192.0.2.40:7890 RU - -",
        "http://192.0.2.41:7080 SE - -",
        "socks5://u:p@192.0.2.42:1080 - - -",
        // regex: every group; the FTP entry is not a proxy we speak
        "http://198.51.100.50:8080 DE elite true",
        "socks5://198.51.100.51:1080 BR anonymous false",
        "http://198.51.100.52:3128 JP transparent true",
    ];
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(stored, want);

    for (name, n) in [
        ("spys", 7),
        ("hideip", 8),
        ("prefixed", 7),
        ("monosans", 3),
        ("pipes", 3),
    ] {
        let r = source(&report, name);
        assert_eq!((r.error.as_deref(), r.found), (None, n), "{name}");
    }
    let unusable = source(&report, "unusable");
    assert_eq!(unusable.private, 4);
    assert_eq!(
        unusable.error.as_deref(),
        Some(
            "every address it lists is one no proxy can listen on (0.0.0.0, broadcast or \
             multicast; 4 entries dropped)"
        )
    );
    let scripted = source(&report, "scripted").error.as_deref().unwrap();
    assert!(
        scripted.contains("the page has scripts: addresses a page writes with JavaScript"),
        "{scripted}"
    );
}

#[tokio::test]
async fn a_gzip_list_without_content_encoding_reads_like_the_plain_one() {
    let plain_dir = tempfile::tempdir().unwrap();
    let gz_dir = tempfile::tempdir().unwrap();
    let file = gz_dir.path().join("hideip.txt.gz");
    std::fs::write(&file, gz(&fixture("hideip.txt"))).unwrap();
    // Zeros compress a thousandfold: 64 MiB out of about 64 KiB.
    let bomb = gz(&vec![b'0'; 64 << 20]);
    assert!(bomb.len() < 1 << 20);
    let site = Site::routes(vec![
        ("/spys.txt", Reply::ok(fixture("spys.txt"))),
        ("/hideip.txt", Reply::ok(fixture("hideip.txt"))),
        (
            "/spys.txt.gz",
            Reply::ok(gz(&fixture("spys.txt"))).with("Content-Type", "application/gzip"),
        ),
        ("/bomb.gz", Reply::ok(bomb)),
        (
            "/not.gz",
            Reply::ok(b"\x1f\x8b\x08 not gzip at all".to_vec()),
        ),
    ])
    .await;
    let (plain, _) = harvest(
        plain_dir.path(),
        &[
            src("spys", &site.url("/spys.txt"), ""),
            src("hideip", &site.url("/hideip.txt"), ""),
        ]
        .concat(),
    )
    .await;
    let (packed, report) = harvest(
        gz_dir.path(),
        &[
            src("spys", &site.url("/spys.txt.gz"), ""),
            src("hideip", &file.display().to_string(), ""),
            src("bomb", &site.url("/bomb.gz"), ""),
            src("not-gzip", &site.url("/not.gz"), ""),
        ]
        .concat(),
    )
    .await;
    assert_eq!(plain.len(), 15);
    assert_eq!(packed, plain);
    assert_eq!(source(&report, "spys").found, 7);
    assert_eq!(source(&report, "hideip").found, 8);
    assert_eq!(
        source(&report, "bomb").error.as_deref(),
        Some("gzip body larger than the 1 MiB limit (harvest.max_body) once decompressed")
    );
    let not = source(&report, "not-gzip").error.as_deref().unwrap();
    assert!(
        not.starts_with("gzip body could not be decompressed"),
        "{not}"
    );
}

#[tokio::test]
async fn a_source_may_turn_annotations_off() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![("/spys.txt", Reply::ok(fixture("spys.txt")))]).await;
    let (stored, _) = harvest(
        dir.path(),
        &src("spys", &site.url("/spys.txt"), "annotations = false"),
    )
    .await;
    let urls: BTreeSet<&str> = stored.iter().map(|s| s.as_str()).collect();
    assert_eq!(urls.len(), 7);
    assert!(stored.iter().all(|s| s.ends_with(" - - -")), "{stored:?}");
}

/// `/sources` and the dashboard show what each source adds: its proxies
/// alive at their last check, and those no other source lists.
#[tokio::test]
async fn sources_and_the_dashboard_show_each_ones_yield() {
    use axum::body::Body;
    use axum::extract::ConnectInfo;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use proxywarden::api;
    use proxywarden::daemon::Service;
    use proxywarden::health::{Feedback, load_index};
    use tower::ServiceExt;

    let dir = tempfile::tempdir().unwrap();
    let spys = String::from_utf8(fixture("spys.txt")).unwrap();
    let some: String = spys
        .lines()
        .filter(|l| l.contains(":80 "))
        .collect::<Vec<_>>()
        .join("\n");
    let site = Site::routes(vec![
        ("/spys.txt", Reply::ok(spys.clone())),
        ("/some.txt", Reply::ok(some)),
    ])
    .await;
    let sources = [
        src("spys", &site.url("/spys.txt"), ""),
        src("some", &site.url("/some.txt"), ""),
    ]
    .concat();
    let config = Config::from_toml(&config_toml(dir.path(), &sources), "t").unwrap();
    let store = Store::open(&config.database.path).unwrap();
    harvest_all(&config, &store).await.unwrap();
    let index = load_index(&store).await.unwrap();
    let state = Service::new(store.clone(), Feedback::new(index, store), Arc::new(config)).api();
    let get = |path: &'static str| {
        let mut req = Request::get(path)
            .header("host", "127.0.0.1")
            .body(Body::empty())
            .unwrap();
        req.extensions_mut().insert(ConnectInfo(
            "127.0.0.1:40000".parse::<std::net::SocketAddr>().unwrap(),
        ));
        let app = api::router(state.clone());
        async move {
            let resp = app.oneshot(req).await.unwrap();
            assert!(resp.status().is_success(), "{path}: {}", resp.status());
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        }
    };
    let listed: serde_json::Value = serde_json::from_str(&get("/sources").await).unwrap();
    let yield_of = |name: &str| {
        let s = listed
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == name)
            .unwrap();
        (
            s["proxies"].as_i64(),
            s["alive"].as_i64(),
            s["unique"].as_i64(),
        )
    };
    // spys lists 7, two of them (port 80) also listed by "some".
    assert_eq!(yield_of("spys"), (Some(7), Some(0), Some(5)));
    assert_eq!(yield_of("some"), (Some(2), Some(0), Some(0)));
    let page = get("/").await;
    assert!(page.contains("Only here"), "no yield column");
    assert!(
        page.contains(r#"class="num unique">5<"#),
        "spys' 5 not shown"
    );
}
