//! A harvest against loopback sources that publish every format and fail in
//! every way a public list can: the store must hold exactly the valid,
//! de-duplicated proxies with their hints, and each source's record must
//! say what happened to it.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use common::config_toml;
use common::site::{Reply, Site, SiteOpts};
use proxywarden::config::Config;
use proxywarden::harvest::{HarvestReport, SourceReport, harvest_all};
use proxywarden::proxy::{Anonymity, Status};
use proxywarden::store::{ProxyFilter, ProxyRecord, Store};

const TEXT_LIST: &str = "# free proxies, updated hourly\n\
1.1.1.1:8080\n\
1.1.1.1:8080\n\
1.1.1.2:3128\r\n\
\n\
   1.1.1.3:80   \n\
socks5://1.1.1.4:1080\n\
user:p%40ss@1.1.1.5:8000\n\
socks4://alice:secret@1.1.1.6:1080\n\
[2001:db8::1]:8080\n\
999.1.1.1:80\n\
1.1.1.7:0\n\
1.1.1.8:65536\n\
hello\n\
1.2.3.\n\
1.1.1.9:\n\
https://1.1.1.10:443\n";

const HTML_TABLE: &str = r#"<html><body>
<table id="nav"><tr><th>Menu</th><th>Link</th></tr><tr><td>Home</td><td>/</td></tr></table>
<table class="table table-striped table-bordered">
<thead><tr><th>IP Address</th><th>Port</th><th>Code</th><th>Country</th><th>Anonymity</th>
<th>Google</th><th>Https</th><th>Last Checked</th></tr></thead>
<tbody>
<tr><td>2.2.2.1</td><td>8080</td><td>US</td><td>United States</td><td>elite proxy</td><td>no</td><td>yes</td><td>1 min ago</td></tr>
<tr><td>2.2.2.2</td><td>3128</td><td>de</td><td>Germany</td><td>anonymous</td><td>no</td><td>no</td><td>2 mins ago</td></tr>
<tr><td>2.2.2.3</td><td>80</td><td>Unknown</td><td>Unknown</td><td>transparent</td><td>no</td><td>no</td><td>3 mins ago</td></tr>
<tr><td>999.2.2.4</td><td>80</td><td>US</td><td>United States</td><td>elite proxy</td><td>no</td><td>no</td><td>x</td></tr>
<tr><td>2.2.2.5</td><td>0</td><td>US</td><td>United States</td><td>elite proxy</td><td>no</td><td>no</td><td>x</td></tr>
</tbody></table></body></html>"#;

/// Unclosed cells and rows, and the document simply stops in a row (whose
/// port may have been cut: `3128` could have been `31280`).
const HTML_TRUNCATED: &str = "<table><tr><th>IP</th><th>Port</th></tr><tr><td>3.3.3.1<td>8080<tr><td>3.3.3.4<td>1080\n\
    <tr><td>3.3.3.2</td><td>3128";

const GEONODE_PAGE_1: &str = r#"{"data":[
 {"ip":"4.4.4.1","port":"8080","protocols":["socks4","socks5"],"country":"FR","anonymityLevel":"elite"},
 {"ip":"4.4.4.2","port":3128,"protocols":["http"],"country":"GB","anonymityLevel":"transparent"}
],"total":3,"page":1,"limit":2}"#;
const GEONODE_PAGE_2: &str =
    r#"{"data":[{"ip":"4.4.4.3","port":"1080","protocols":"socks5"}],"total":3,"page":2}"#;
const GEONODE_PAGE_3: &str = r#"{"data":[],"total":3,"page":3}"#;

const JSON_ARRAY: &str = r#"[
 {"ip":"5.5.5.1","port":8080},
 "socks5://5.5.5.2:1080",
 {"host":"5.5.5.3","port":"bad"}
]"#;

fn site_routes() -> Vec<(&'static str, Reply)> {
    vec![
        ("/text.txt", Reply::ok(TEXT_LIST)),
        ("/table.html", Reply::ok(HTML_TABLE)),
        ("/truncated.html", Reply::ok(HTML_TRUNCATED)),
        ("/api?page=1", Reply::ok(GEONODE_PAGE_1)),
        ("/api?page=2", Reply::ok(GEONODE_PAGE_2)),
        ("/api?page=3", Reply::ok(GEONODE_PAGE_3)),
        ("/api?page=4", Reply::ok(GEONODE_PAGE_1)),
        ("/array.json", Reply::gzip(JSON_ARRAY.as_bytes())),
        ("/moved", Reply::redirect(302, "/moved-again")),
        ("/moved-again", Reply::redirect(302, "/redirected.txt")),
        ("/redirected.txt", Reply::ok("7.7.7.1:8080\n")),
        (
            "/latin1.txt",
            Reply::ok(b"7.7.7.2:8080\n\xff\xfe caf\xe9 \x807.7.7.3:3128\n".to_vec()),
        ),
        ("/broken", Reply::status(500)),
        ("/forbidden", Reply::status(403)),
        ("/hang", Reply::hang()),
        ("/endless", Reply::endless()),
        ("/bad.json", Reply::ok("{\"data\": [ {\"ip\": ")),
        ("/cut", Reply::cut(b"8.8.8.8:8080\n".repeat(100))),
        (
            "/empty.html",
            Reply::ok("<html><body><p>nothing here</p></body></html>"),
        ),
        ("/loop", Reply::redirect(302, "/loop")),
    ]
}

fn sources_toml(site: &Site, dir: &Path) -> String {
    let file = dir.join("local.txt");
    std::fs::write(&file, "6.6.6.1:8080\n6.6.6.2:8080\n").unwrap();
    let src = |name: &str, url: &str, extra: &str| {
        format!("[[sources]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n")
    };
    [
        src("text", &site.url("/text.txt"), ""),
        src(
            "table",
            &site.url("/table.html"),
            "format = \"html\"\nscheme = \"http\"",
        ),
        src(
            "truncated-html",
            &site.url("/truncated.html"),
            "format = \"html\"",
        ),
        src(
            "geonode",
            &site.url("/api?page={page}"),
            "format = \"json\"\npages = 5\nitems = \"/data\"\nanonymity = \"anonymityLevel\"",
        ),
        src(
            "gzip-json",
            &site.url("/array.json"),
            "format = \"json\"\nscheme = \"socks4\"",
        ),
        src("redirect", &site.url("/moved"), ""),
        src("latin1", &site.url("/latin1.txt"), ""),
        src(
            "local-file",
            &file.display().to_string(),
            "scheme = \"detect\"",
        ),
        src(
            "disabled",
            &site.url("/text.txt"),
            "enabled = false\nscheme = \"socks5\"",
        ),
        src("broken", &site.url("/broken"), ""),
        src("forbidden", &site.url("/forbidden"), ""),
        src("hang", &site.url("/hang"), ""),
        src("endless", &site.url("/endless"), ""),
        src("bad-json", &site.url("/bad.json"), "format = \"json\""),
        src("cut", &site.url("/cut"), ""),
        src("empty-html", &site.url("/empty.html"), "format = \"html\""),
        src(
            "missing-file",
            &dir.join("nope.txt").display().to_string(),
            "",
        ),
        src("redirect-loop", &site.url("/loop"), ""),
    ]
    .concat()
}

fn urls(records: &[ProxyRecord]) -> BTreeSet<String> {
    records.iter().map(|r| r.proxy.to_string()).collect()
}

fn find<'a>(records: &'a [ProxyRecord], url: &str) -> &'a ProxyRecord {
    records
        .iter()
        .find(|r| r.proxy.to_string() == url)
        .unwrap_or_else(|| panic!("{url} not stored"))
}

fn source<'a>(report: &'a HarvestReport, name: &str) -> &'a SourceReport {
    report
        .sources
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no report for {name}"))
}

async fn harvest(config: &Config) -> (Store, HarvestReport) {
    let store = Store::open(&config.database.path).unwrap();
    let report = harvest_all(config, &store).await.unwrap();
    (store, report)
}

#[tokio::test]
async fn harvest_stores_exactly_the_valid_proxies_and_records_every_source() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(site_routes()).await;
    let toml = config_toml(dir.path(), &sources_toml(&site, dir.path()));
    let config = Config::from_toml(&toml, "test.toml").unwrap();
    let (store, report) = harvest(&config).await;
    let all = store.list_proxies(ProxyFilter::default()).await.unwrap();

    let expected: BTreeSet<String> = [
        // text: every valid token, duplicates once, CRLF and blanks ignored
        "http://1.1.1.1:8080",
        "http://1.1.1.2:3128",
        "http://1.1.1.3:80",
        "socks5://1.1.1.4:1080",
        "http://user:p%40ss@1.1.1.5:8000",
        "socks4://alice:secret@1.1.1.6:1080",
        "http://[2001:db8::1]:8080",
        "http://1.1.1.10:443",
        // html: the proxy table, not the navigation table; bad rows skipped
        "http://2.2.2.1:8080",
        "http://2.2.2.2:3128",
        "http://2.2.2.3:80",
        // truncated html still yields its complete rows, not the cut one
        "http://3.3.3.1:8080",
        "http://3.3.3.4:1080",
        // paged json: one candidate per protocol, pages 1..3
        "socks4://4.4.4.1:8080",
        "socks5://4.4.4.1:8080",
        "http://4.4.4.2:3128",
        "socks5://4.4.4.3:1080",
        // gzip json: default scheme for items without one, string items
        "socks4://5.5.5.1:8080",
        "socks5://5.5.5.2:1080",
        // local file, scheme to be detected (stored as http for now)
        "http://6.6.6.1:8080",
        "http://6.6.6.2:8080",
        // two redirects followed
        "http://7.7.7.1:8080",
        // non-UTF-8 bytes around valid entries
        "http://7.7.7.2:8080",
        "http://7.7.7.3:3128",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(urls(&all), expected);

    // Every new proxy is unknown and due at once.
    for r in &all {
        assert_eq!(r.status, Status::Unknown, "{}", r.proxy);
        assert!(r.next_check_at <= r.first_seen, "{}", r.proxy);
        assert_eq!(r.first_seen, r.last_seen);
        assert_eq!(r.last_checked, None);
    }

    // Hints from the table and the JSON API.
    let us = find(&all, "http://2.2.2.1:8080");
    assert_eq!(us.country.map(|c| c.to_string()).as_deref(), Some("US"));
    assert_eq!(us.country_source.as_deref(), Some("source"));
    assert_eq!(us.hint_anonymity, Some(Anonymity::Elite));
    assert_eq!(us.hint_https, Some(true));
    assert_eq!(us.sources, vec!["table".to_string()]);
    let de = find(&all, "http://2.2.2.2:3128");
    assert_eq!(de.country.map(|c| c.to_string()).as_deref(), Some("DE"));
    assert_eq!(de.hint_anonymity, Some(Anonymity::Anonymous));
    assert_eq!(de.hint_https, Some(false));
    let unknown = find(&all, "http://2.2.2.3:80");
    assert_eq!(unknown.country, None);
    assert_eq!(unknown.hint_anonymity, Some(Anonymity::Transparent));
    let fr = find(&all, "socks5://4.4.4.1:8080");
    assert_eq!(fr.country.map(|c| c.to_string()).as_deref(), Some("FR"));
    assert_eq!(fr.hint_anonymity, Some(Anonymity::Elite));
    assert_eq!(
        find(&all, "http://4.4.4.2:3128")
            .country
            .map(|c| c.to_string())
            .as_deref(),
        Some("GB")
    );
    let https = find(&all, "http://1.1.1.10:443");
    assert_eq!(https.hint_https, Some(true));
    let creds = find(&all, "http://user:p%40ss@1.1.1.5:8000");
    let auth = creds.proxy.auth.as_ref().unwrap();
    assert_eq!(
        (auth.username.as_str(), auth.password.as_str()),
        ("user", "p@ss")
    );
    assert!(find(&all, "http://6.6.6.1:8080").scheme_detect);
    assert!(!find(&all, "http://1.1.1.1:8080").scheme_detect);

    // Per-source reports and records.
    let ok = |name: &str, found: usize| {
        let r = source(&report, name);
        assert_eq!(r.error, None, "{name}");
        assert_eq!(r.found, found, "{name}");
        assert_eq!(r.new, found, "{name}");
    };
    ok("text", 8);
    ok("table", 3);
    ok("truncated-html", 2);
    ok("geonode", 4);
    ok("gzip-json", 2);
    ok("redirect", 1);
    ok("latin1", 2);
    ok("local-file", 2);
    assert_eq!(source(&report, "geonode").pages, 3);
    assert_eq!(
        site.hits("/api?page=4"),
        0,
        "paging stops at the empty page"
    );
    assert_eq!(source(&report, "text").http_status, Some(200));
    assert_eq!(source(&report, "local-file").http_status, None);
    assert!(
        report.sources.iter().all(|s| s.name != "disabled"),
        "disabled sources are not fetched"
    );

    let failed = |name: &str, needle: &str| {
        let r = source(&report, name);
        let e = r
            .error
            .as_deref()
            .unwrap_or_else(|| panic!("{name} did not fail"));
        assert!(e.contains(needle), "{name}: {e:?} lacks {needle:?}");
        assert_eq!(r.found, 0, "{name}");
        assert!(!r.worked(), "{name}");
    };
    failed("broken", "HTTP 500");
    failed("forbidden", "HTTP 403");
    failed("hang", "timed out");
    failed("endless", "larger than the 1 MiB limit");
    failed("bad-json", "invalid JSON");
    failed("cut", "");
    failed(
        "empty-html",
        "no <table> in the page; try format = \"text\"",
    );
    failed("missing-file", "cannot read");
    failed("redirect-loop", "redirect");
    assert_eq!(source(&report, "broken").http_status, Some(500));
    assert_eq!(site.hits("/broken"), 2, "a 5xx is retried (retries = 1)");
    assert_eq!(site.hits("/forbidden"), 1, "a 4xx is not retried");

    let records = store.list_sources().await.unwrap();
    let rec = |name: &str| records.iter().find(|r| r.name == name).unwrap();
    assert_eq!(rec("text").last_found, Some(8));
    assert_eq!(rec("text").last_error, None);
    assert_eq!(rec("text").last_http_status, Some(200));
    assert_eq!(rec("text").proxies, 8);
    assert!(rec("text").last_ok_at.is_some());
    assert_eq!(rec("broken").last_http_status, Some(500));
    assert_eq!(rec("broken").fetches_failed, 1);
    assert_eq!(rec("broken").last_ok_at, None);
    assert!(
        rec("hang")
            .last_error
            .as_deref()
            .unwrap()
            .contains("timed out")
    );
    assert_eq!(report.distinct, expected.len() as i64);
    assert_eq!(report.new, expected.len());
    assert!(report.any_worked());
}

#[tokio::test]
async fn a_second_harvest_keeps_checked_facts_and_updates_sightings_and_hints() {
    let dir = tempfile::tempdir().unwrap();
    let first = Site::routes(vec![("/t.html", Reply::ok(HTML_TABLE))]).await;
    let src = |site: &Site| {
        format!(
            "[[sources]]\nname = \"table\"\nurl = \"{}\"\nformat = \"html\"\n",
            site.url("/t.html")
        )
    };
    let config = Config::from_toml(&config_toml(dir.path(), &src(&first)), "t").unwrap();
    let (store, r1) = harvest(&config).await;
    assert_eq!(r1.new, 3);
    let before = store.list_proxies(ProxyFilter::default()).await.unwrap();
    let us_before = find(&before, "http://2.2.2.1:8080").clone();
    drop(store);

    // Pretend the checker found 2.2.2.1 alive, elite-less and in Canada by GeoIP.
    {
        let conn = rusqlite::Connection::open(&config.database.path).unwrap();
        conn.execute(
            "UPDATE proxies SET status = 'alive', anonymity = 'anonymous', https = 0,
                 latency_ms = 123, last_checked = 5, last_alive = 5, checks_total = 1,
                 checks_ok = 1, country = 'CA', country_source = 'geoip', next_check_at = 99
             WHERE host = '2.2.2.1'",
            [],
        )
        .unwrap();
    }

    // The source now says different things about its proxies.
    let changed = HTML_TABLE
        .replace("<td>de</td>", "<td>AT</td>")
        .replace("<td>anonymous</td>", "<td>elite proxy</td>");
    drop(first);
    let second = Site::routes(vec![("/t.html", Reply::ok(changed))]).await;
    let config = Config::from_toml(&config_toml(dir.path(), &src(&second)), "t").unwrap();
    let (store, r2) = harvest(&config).await;
    assert_eq!(r2.new, 0);
    assert_eq!(source(&r2, "table").found, 3);
    let after = store.list_proxies(ProxyFilter::default()).await.unwrap();
    assert_eq!(urls(&after), urls(&before));

    let us = find(&after, "http://2.2.2.1:8080");
    assert_eq!(us.id, us_before.id);
    assert_eq!(us.first_seen, us_before.first_seen);
    assert!(us.last_seen > us_before.last_seen);
    assert_eq!(us.status, Status::Alive);
    assert_eq!(us.anonymity, Some(Anonymity::Anonymous));
    assert_eq!(us.https, Some(false));
    assert_eq!(us.latency_ms, Some(123));
    assert_eq!(
        us.next_check_at, 99,
        "a re-listing does not reschedule the check"
    );
    assert_eq!(
        us.country.map(|c| c.to_string()).as_deref(),
        Some("CA"),
        "GeoIP wins over a source hint"
    );

    let de = find(&after, "http://2.2.2.2:3128");
    assert_eq!(de.country.map(|c| c.to_string()).as_deref(), Some("AT"));
    assert_eq!(de.hint_anonymity, Some(Anonymity::Elite));
    assert_eq!(store.list_sources().await.unwrap()[0].fetches_total, 2);
}

#[tokio::test]
async fn a_source_over_max_per_source_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let list: String = (1..=10).map(|i| format!("9.9.9.{i}:80\n")).collect();
    let site = Site::routes(vec![("/l", Reply::ok(list))]).await;
    let toml = config_toml(
        dir.path(),
        &format!(
            "[[sources]]\nname = \"big\"\nurl = \"{}\"\n",
            site.url("/l")
        ),
    )
    .replace("[harvest]", "[harvest]\nmax_per_source = 4");
    let config = Config::from_toml(&toml, "t").unwrap();
    let (store, report) = harvest(&config).await;
    let r = &report.sources[0];
    assert_eq!(r.found, 4);
    assert!(r.truncated);
    assert!(r.worked());
    assert_eq!(
        store
            .list_proxies(ProxyFilter::default())
            .await
            .unwrap()
            .len(),
        4
    );
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::start(SiteOpts::flaky("/flaky", 1, 1, Reply::ok("8.8.4.4:8080\n"))).await;
    let toml = config_toml(
        dir.path(),
        &format!(
            "[[sources]]\nname = \"flaky\"\nurl = \"{}\"\n",
            site.url("/flaky")
        ),
    );
    let config = Config::from_toml(&toml, "t").unwrap();
    let (_, report) = harvest(&config).await;
    let r = &report.sources[0];
    assert_eq!(r.error, None);
    assert_eq!(r.found, 1);
    assert_eq!(site.hits("/flaky"), 2);
    // The retry waited for the server's Retry-After (1 s), not the 10 ms backoff.
    assert!(r.duration >= Duration::from_millis(900), "{:?}", r.duration);
}

#[tokio::test]
async fn requests_carry_the_user_agent_and_source_headers_and_accept_brotli() {
    let dir = tempfile::tempdir().unwrap();
    let site = Site::routes(vec![
        ("/br.txt", Reply::brotli(b"4.4.4.1:8080\n4.4.4.2:3128\n")),
        ("/plain.txt", Reply::ok("4.4.4.3:80\n")),
    ])
    .await;
    let toml = config_toml(
        dir.path(),
        &format!(
            "[[sources]]\nname = \"br\"\nurl = \"{}\"\n\
             headers = {{ Authorization = \"Bearer s3cret\", X-Extra = \"1\" }}\n\
             [[sources]]\nname = \"plain\"\nurl = \"{}\"\n",
            site.url("/br.txt"),
            site.url("/plain.txt")
        ),
    )
    .replace("[harvest]", "[harvest]\nuser_agent = \"tester/7.1\"");
    let config = Config::from_toml(&toml, "t").unwrap();
    let (store, report) = harvest(&config).await;
    assert_eq!(source(&report, "br").error, None);
    assert_eq!(source(&report, "br").found, 2);
    assert_eq!(
        urls(&store.list_proxies(ProxyFilter::default()).await.unwrap()),
        [
            "http://4.4.4.1:8080",
            "http://4.4.4.2:3128",
            "http://4.4.4.3:80"
        ]
        .map(String::from)
        .into()
    );

    let header = |path: &str, name: &str| site.last_header(path, name);
    for path in ["/br.txt", "/plain.txt"] {
        assert_eq!(header(path, "user-agent").as_deref(), Some("tester/7.1"));
        let accept = header(path, "accept-encoding").unwrap_or_default();
        assert!(accept.contains("br") && accept.contains("gzip"), "{accept}");
    }
    // A source's own headers go to that source only.
    assert_eq!(
        header("/br.txt", "authorization").as_deref(),
        Some("Bearer s3cret")
    );
    assert_eq!(header("/br.txt", "x-extra").as_deref(), Some("1"));
    assert_eq!(header("/plain.txt", "authorization"), None);
}

/// Issue 10, Must 1: html5ever's cost per element grows with the nesting
/// depth, so 60,000 nested `<div>`s (300 KB) would take minutes of CPU. The
/// source must fail quickly with a clear error, the others unharmed.
#[tokio::test]
async fn deeply_nested_html_fails_its_source_instead_of_pinning_a_core() {
    let dir = tempfile::tempdir().unwrap();
    let nested = "<div>".repeat(60_000)
        + "<table><tr><th>IP</th><th>Port</th></tr><tr><td>8.8.8.1</td><td>80</td></tr></table>";
    let site = Site::routes(vec![
        ("/nested.html", Reply::ok(nested)),
        ("/list.txt", Reply::ok("8.8.8.2:8080\n")),
    ])
    .await;
    let sources = format!(
        "[[sources]]\nname = \"nested\"\nurl = \"{}\"\nformat = \"html\"\n\
         [[sources]]\nname = \"list\"\nurl = \"{}\"\n",
        site.url("/nested.html"),
        site.url("/list.txt")
    );
    let config = Config::from_toml(&config_toml(dir.path(), &sources), "t").unwrap();
    // Refused by the depth cap, as the error below says, not parsed until
    // the harvest's time ran out (which would say so instead).
    let (store, report) = tokio::time::timeout(Duration::from_secs(20), harvest(&config))
        .await
        .expect("the harvest waited on a nested page for 20 s");
    let nested = source(&report, "nested");
    assert_eq!(
        nested.error.as_deref(),
        Some("HTML nested deeper than 1024 elements; not parsed")
    );
    assert!(!nested.worked());
    assert!(source(&report, "list").worked());
    let stored = urls(&store.list_proxies(ProxyFilter::default()).await.unwrap());
    assert_eq!(stored, BTreeSet::from(["http://8.8.8.2:8080".to_owned()]));
    let rec = store.list_sources().await.unwrap();
    let rec = rec.iter().find(|s| s.name == "nested").unwrap();
    assert_eq!(
        rec.last_error.as_deref(),
        Some("HTML nested deeper than 1024 elements; not parsed")
    );
}

/// Issue 10, Must 10: a source's own headers (here an API key and a bearer
/// token) and its URL must not leak to another origin it redirects to; a
/// redirect within the source's origin keeps them.
#[tokio::test]
async fn a_redirect_to_another_origin_gets_no_source_headers_and_no_referer() {
    let dir = tempfile::tempdir().unwrap();
    // Two loopback sites on different ports: different origins.
    let other = Site::routes(vec![("/list.txt", Reply::ok("9.8.7.1:8080\n"))]).await;
    let site = Site::routes(vec![
        (
            "/api?key=s3cret",
            Reply::redirect(302, &other.url("/list.txt")),
        ),
        ("/same?key=s3cret", Reply::redirect(302, "/here.txt")),
        ("/here.txt", Reply::ok("9.8.7.2:8080\n")),
    ])
    .await;
    let headers = "headers = { X-Api-Key = \"k3y\", Authorization = \"Bearer t0ken\" }";
    let toml = config_toml(
        dir.path(),
        &format!(
            "[[sources]]\nname = \"away\"\nurl = \"{}\"\n{headers}\n\
             [[sources]]\nname = \"home\"\nurl = \"{}\"\n{headers}\n",
            site.url("/api?key=s3cret"),
            site.url("/same?key=s3cret"),
        ),
    );
    let config = Config::from_toml(&toml, "t").unwrap();
    let (_store, report) = harvest(&config).await;
    assert_eq!(source(&report, "away").error, None);
    assert_eq!(source(&report, "away").found, 1);
    assert_eq!(source(&report, "home").found, 1);

    assert_eq!(
        site.last_header("/api?key=s3cret", "x-api-key").as_deref(),
        Some("k3y")
    );
    for name in ["x-api-key", "authorization", "referer"] {
        assert_eq!(
            other.last_header("/list.txt", name),
            None,
            "{name} was sent to the other origin"
        );
    }
    assert_eq!(
        site.last_header("/here.txt", "x-api-key").as_deref(),
        Some("k3y"),
        "the same origin keeps the source's headers"
    );
    assert_eq!(site.last_header("/here.txt", "referer"), None);
}
