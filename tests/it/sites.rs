//! What a site teaches about a proxy, as one record the whole daemon
//! shares: a site that bans a proxy through the gateway no longer gets it
//! from the gateway, `/proxy?site=` or `/proxies?site=`; a proxy reported
//! as working there comes first; and both survive a restart.

use crate::common;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use common::daemon::{Daemon, proxied_client};
use common::fakes::{FakeHttpProxy, http_proxy, ip};
use common::site::{Site, SiteOpts};
use common::{AliveProxy, store_with_alive, within};
use tempfile::TempDir;

/// Three working proxies forwarding from 127.0.0.2, .3 and .4.
async fn three_proxies() -> Vec<FakeHttpProxy> {
    let mut proxies = Vec::new();
    for last in 2..=4 {
        proxies.push(http_proxy(last).await);
    }
    proxies
}

/// The country each proxy is recorded in, in order: `country=` then asks
/// for one proxy alone, whatever the strategy makes of their latencies
/// (best of two among three never hands out the slowest).
const COUNTRIES: [&str; 3] = ["US", "DE", "FR"];

/// A daemon with its gateway over a store holding `proxies` as alive, in
/// [`COUNTRIES`]; their ids in the same order. It is returned once its
/// start-up re-checks have passed every proxy: until then a loaded record
/// is only a suspect and a fresh check outranks what a site taught (see
/// `Feedback::reverify_all`), so which proxy a site gets would depend on
/// which re-checks happen to have finished.
async fn daemon_over(dir: &TempDir, proxies: &[FakeHttpProxy]) -> (Daemon, SocketAddr, Vec<i64>) {
    let alive: Vec<AliveProxy> = proxies
        .iter()
        .zip(COUNTRIES)
        .map(|(p, country)| AliveProxy {
            country: Some(country),
            ..AliveProxy::new(p.url())
        })
        .collect();
    let path = dir.path().join("test.db");
    let ids = if path.exists() {
        Vec::new()
    } else {
        let (store, ids) = store_with_alive(&path, &alive).await;
        drop(store);
        ids
    };
    let started = proxywarden::store::rfc3339(proxywarden::store::now_ms());
    let (daemon, gw) = Daemon::start_with_gateway(dir.path(), "", |c| c.db("test.db")).await;
    daemon.until_servable(proxies.len() as u64).await;
    common::until(
        "every proxy re-checked since the start",
        Duration::from_secs(30),
        || async {
            let (_, body) = daemon.json("/proxies").await;
            let rows = body["proxies"].as_array().cloned().unwrap_or_default();
            // RFC 3339 in UTC with milliseconds: the strings sort as the times.
            rows.len() == proxies.len()
                && rows.iter().all(|p| {
                    p["last_alive"]
                        .as_str()
                        .is_some_and(|t| t > started.as_str())
                })
        },
    )
    .await;
    (daemon, gw, ids)
}

/// The ids `/proxy?{query}` hands out over `n` asks.
async fn handed_out(daemon: &Daemon, query: &str, n: usize) -> HashSet<i64> {
    let mut ids = HashSet::new();
    for _ in 0..n {
        let (status, body) = daemon.json(&format!("/proxy?{query}")).await;
        assert_eq!(status, 200, "{body}");
        ids.insert(body["id"].as_i64().unwrap());
    }
    ids
}

/// What `/proxy?{query}` answers: the id handed out, or the status and
/// error message.
async fn one(daemon: &Daemon, query: &str) -> Result<i64, (u16, String)> {
    let (status, body) = daemon.json(&format!("/proxy?{query}")).await;
    match body["id"].as_i64() {
        Some(id) if status == 200 => Ok(id),
        _ => Err((status, body["error"]["message"].to_string())),
    }
}

/// The ids `/proxies?{query}` lists, in its order.
async fn listed(daemon: &Daemon, query: &str) -> Vec<i64> {
    let (status, body) = daemon.json(&format!("/proxies?{query}")).await;
    assert_eq!(status, 200, "{body}");
    body["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_i64().unwrap())
        .collect()
}

async fn report(daemon: &Daemon, id: i64, body: serde_json::Value) -> (u16, serde_json::Value) {
    let resp = daemon
        .req(reqwest::Method::POST, &format!("/proxies/{id}/report"))
        .json(&body)
        .send()
        .await
        .unwrap();
    common::daemon::status_json(resp).await
}

#[tokio::test]
async fn a_site_that_bans_a_proxy_through_the_gateway_never_gets_it_again_even_after_a_restart() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = three_proxies().await;
        // The shop shows a captcha to the proxy on 127.0.0.2 only.
        let shop = Site::start(SiteOpts {
            banned: vec![ip(2)],
            ..SiteOpts::routes(vec![("/a", common::site::Reply::html("page a"))])
        })
        .await;
        let (daemon, gw, ids) = daemon_over(&dir, &proxies).await;
        let banned_id = ids[0];
        let client = proxied_client(reqwest::Proxy::all(format!("http://{gw}")).unwrap());
        for _ in 0..9 {
            let resp = client.get(shop.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
            assert_eq!(resp.text().await.unwrap(), "page a");
        }
        let banned_hits = || shop.log().iter().filter(|h| h.peer == ip(2)).count();
        assert!(
            banned_hits() <= 1,
            "the banned proxy came {} times",
            banned_hits()
        );

        let site = shop
            .url("/")
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_owned();
        let for_shop = handed_out(&daemon, &format!("site={site}"), 30).await;
        assert!(!for_shop.contains(&banned_id), "{for_shop:?}");
        assert!(
            !listed(&daemon, &format!("site={site}"))
                .await
                .contains(&banned_id)
        );
        // A URL names the same site; other sites still get the proxy.
        let by_url = handed_out(&daemon, &format!("site={}", shop.url("/a")), 30).await;
        assert!(!by_url.contains(&banned_id), "{by_url:?}");
        let alone = format!("country={}", COUNTRIES[0]);
        assert_eq!(
            one(&daemon, &format!("site={site}&{alone}")).await,
            Err((404, "\"no alive proxy matches the filters\"".into()))
        );
        assert_eq!(
            one(&daemon, &format!("site=elsewhere.example&{alone}")).await,
            Ok(banned_id)
        );
        assert_eq!(one(&daemon, &alone).await, Ok(banned_id));
        assert!(
            listed(&daemon, "site=elsewhere.example")
                .await
                .contains(&banned_id)
        );
        daemon.stop().await;

        // What the shop taught was written: a restart keeps it.
        let (daemon, gw, _) = daemon_over(&dir, &proxies).await;
        let before = banned_hits();
        let client = proxied_client(reqwest::Proxy::all(format!("http://{gw}")).unwrap());
        for _ in 0..9 {
            let resp = client.get(shop.url("/a")).send().await.unwrap();
            assert_eq!(resp.status(), 200);
        }
        assert_eq!(
            banned_hits(),
            before,
            "the restarted gateway used the banned proxy"
        );
        let for_shop = handed_out(&daemon, &format!("site={site}"), 30).await;
        assert!(!for_shop.contains(&banned_id), "{for_shop:?}");
        daemon.stop().await;
    })
    .await;
}

#[tokio::test]
async fn reports_naming_a_site_ban_the_pair_or_put_the_proxy_first_for_that_site() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let proxies = three_proxies().await;
        let (daemon, _gw, ids) = daemon_over(&dir, &proxies).await;

        // Blocked at one site: the proxy stays served for the others.
        let (status, body) = report(
            &daemon,
            ids[1],
            serde_json::json!({"ok": false, "site": "https://shop.example/cart"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["site"], "shop.example");
        assert_eq!(body["hidden"], false);
        assert!(
            !handed_out(&daemon, "site=shop.example", 30)
                .await
                .contains(&ids[1])
        );
        assert!(!listed(&daemon, "site=shop.example").await.contains(&ids[1]));
        // Asked for alone (its country): refused for the shop, served for
        // another site.
        let alone = format!("country={}", COUNTRIES[1]);
        assert_eq!(
            one(&daemon, &format!("site=shop.example&{alone}")).await,
            Err((404, "\"no alive proxy matches the filters\"".into()))
        );
        assert_eq!(
            one(&daemon, &format!("site=news.example&{alone}")).await,
            Ok(ids[1])
        );
        assert!(listed(&daemon, "site=news.example").await.contains(&ids[1]));

        // Worked at a site: it wins every draw of two it is in there (5 in
        // 9 answers of three), the others are still answered; listed first.
        let (status, body) = report(
            &daemon,
            ids[2],
            serde_json::json!({"ok": true, "site": "news.example"}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let mut won = 0;
        for _ in 0..90 {
            if one(&daemon, "site=news.example").await == Ok(ids[2]) {
                won += 1;
            }
        }
        // 50 expected, a standard deviation of 4.7.
        assert!(won > 30, "{won} of 90");
        assert_eq!(handed_out(&daemon, "site=news.example", 90).await.len(), 3);
        assert_eq!(listed(&daemon, "site=news.example").await[0], ids[2]);
        assert_eq!(listed(&daemon, "site=news.example").await.len(), 3);

        // Bad input is named.
        let (status, body) = report(
            &daemon,
            ids[0],
            serde_json::json!({"ok": false, "site": "a b"}),
        )
        .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("\"site\""),
            "{body}"
        );
        let (status, _) = report(
            &daemon,
            999_999,
            serde_json::json!({"ok": false, "site": "shop.example"}),
        )
        .await;
        assert_eq!(status, 404);
        let (status, body) = daemon.json("/proxy?site=user@shop.example").await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("site"),
            "{body}"
        );
        daemon.stop().await;
    })
    .await;
}
