//! The dashboard's HTML: one page, rendered on the server from a [`View`]
//! of the daemon's state, with its stylesheet inline and no script (the
//! proxy table is in `table`). Each
//! figure that `/stats` also gives carries `data-stat` naming its key there,
//! so that what the page shows can be compared with the API.

use std::collections::BTreeMap;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::charts::{self, Series};
use super::format::{ago, bytes, count, duration_ms, percent};
use crate::api::conditions::Condition;
use crate::api::metrics::JudgeView;
use crate::api::{CheckInfo, HarvestInfo};
use crate::gateway::GatewayStats;
use crate::store::{Snapshot, SourceRecord, Stats};

/// How often the page reloads itself, in seconds.
pub const REFRESH_S: u64 = 30;

/// Everything the page shows, gathered before rendering.
pub struct View {
    /// When it was gathered (unix ms).
    pub now: i64,
    /// Stored proxies by status, scheme, country, anonymity, reason.
    pub stats: Stats,
    /// When `stats` and `sources` were counted (unix ms).
    pub counted_at: i64,
    /// Servable proxies now: the count, then by scheme, country,
    /// anonymity and HTTPS, and their latencies (ms).
    pub servable: usize,
    pub servable_by: Breakdowns,
    pub latencies: Vec<i64>,
    /// What is degraded now.
    pub degraded: Vec<Condition>,
    /// The last harvest and check rounds, and the recent check rounds.
    pub last_harvest: Option<HarvestInfo>,
    pub last_check: Option<CheckInfo>,
    pub rounds: Vec<CheckInfo>,
    /// History: the last 24 h (5 min buckets) and 7 days (30 min buckets).
    pub day: Vec<Snapshot>,
    pub week: Vec<Snapshot>,
    /// Each source's last run.
    pub sources: Vec<SourceRecord>,
    /// Each judge's direct answers.
    pub judges: BTreeMap<String, JudgeView>,
    /// The gateway's counters, when it runs.
    pub gateway: Option<GatewayStats>,
    /// How each site's requests spread over proxies lately.
    pub rotation: Vec<crate::health::SiteSpread>,
    /// The latest crawl jobs (their API views).
    pub crawls: Vec<crate::crawl::jobs::JobView>,
    /// The proxy table's page, with its search.
    pub proxies: super::table::Table,
    /// The CSRF token of this page's forms.
    pub csrf: String,
    /// Whether the viewer is logged in with a cookie (a logout button).
    pub session: bool,
}

/// Servable proxies counted by what a client filters on.
#[derive(Default)]
pub struct Breakdowns {
    pub scheme: BTreeMap<String, i64>,
    pub country: BTreeMap<String, i64>,
    pub anonymity: BTreeMap<String, i64>,
    pub https: i64,
    /// Known to fail CONNECT (HTTPS): plain HTTP only.
    pub no_https: i64,
}

const STYLE: &str = r#"
:root { color-scheme: light dark; --fg: #1d2330; --muted: #5b6475; --bg: #f6f7f9; --card: #fff;
  --line: #dde1e8; --c1: #2f6fdf; --c2: #1f9d55; --c3: #d9534f; --c4: #e59c23; }
@media (prefers-color-scheme: dark) { :root { --fg: #e6e9ef; --muted: #9aa3b5; --bg: #14171d;
  --card: #1c2029; --line: #2c3240; } }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, sans-serif; color: var(--fg); background: var(--bg); }
header { display: flex; flex-wrap: wrap; gap: 1em; align-items: baseline; padding: .8em 1.5em;
  background: var(--card); border-bottom: 1px solid var(--line); }
header h1 { font-size: 1.25em; margin: 0; }
header .meta { color: var(--muted); }
header form { margin-left: auto; }
nav a { margin-right: .8em; color: var(--c1); }
main { padding: 1em 1.5em; display: grid; gap: 1em;
  grid-template-columns: repeat(auto-fit, minmax(min(420px, 100%), 1fr)); }
@media (max-width: 600px) { main { padding: .6em; } header { padding: .6em; } }
section { min-width: 0; background: var(--card); border: 1px solid var(--line); border-radius: 6px; padding: .8em 1em; }
section.wide { grid-column: 1 / -1; }
h2 { font-size: 1.05em; margin: 0 0 .6em; }
h3 { font-size: .95em; margin: .8em 0 .3em; color: var(--muted); }
.tiles { display: flex; flex-wrap: wrap; gap: .6em; }
.tile { min-width: 8.5em; padding: .5em .8em; border: 1px solid var(--line); border-radius: 6px; }
.tile .n { font-size: 1.6em; font-weight: 600; font-variant-numeric: tabular-nums; }
.tile .l { color: var(--muted); font-size: .85em; }
table { border-collapse: collapse; width: 100%; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: .25em .5em; border-bottom: 1px solid var(--line); vertical-align: top;
  overflow-wrap: break-word; }
/* A table keeps its words whole and scrolls in its box; a URL breaks anywhere. */
td.url { overflow-wrap: anywhere; min-width: 8em; }
.scroll { overflow-x: auto; max-width: 100%; }
td.num, th.num { text-align: right; }
.muted { color: var(--muted); }
.bad { color: var(--c3); }
.good { color: var(--c2); }
.banner { grid-column: 1 / -1; background: #fff4e0; color: #6b4500; border: 1px solid #e5c07b;
  border-radius: 6px; padding: .6em 1em; }
figure { overflow-x: auto; }
/* Axis labels are 18 units of a 640 wide chart: never drawn narrower than
   392 px, they stay at 11 px or more; a narrower box scrolls. */
svg.chart { width: 100%; min-width: 392px; height: auto; }
svg.chart .grid { stroke: var(--line); stroke-width: 1; }
svg.chart .axis { fill: var(--muted); font-size: 18px; }
svg polyline { stroke-width: 1.8; }
.c1 { stroke: var(--c1); fill: var(--c1); } .c2 { stroke: var(--c2); fill: var(--c2); }
.c3 { stroke: var(--c3); fill: var(--c3); } .c4 { stroke: var(--c4); fill: var(--c4); }
svg polyline.c1, svg polyline.c2, svg polyline.c3, svg polyline.c4 { fill: none; }
figure { margin: 0; }
figcaption { color: var(--muted); font-size: .85em; }
.legend { margin-right: 1em; }
.swatch { display: inline-block; width: .8em; height: .8em; margin-right: .3em; border-radius: 2px; }
.swatch.c1 { background: var(--c1); } .swatch.c2 { background: var(--c2); }
.swatch.c3 { background: var(--c3); } .swatch.c4 { background: var(--c4); }
svg.share { width: 6em; height: .6em; }
svg.share .track { fill: var(--line); }
.cols { display: grid; grid-template-columns: repeat(auto-fit, minmax(min(180px, 100%), 1fr)); gap: 0 1em; }
.cols > * { min-width: 0; }
button { font: inherit; padding: .2em .7em; cursor: pointer; }
.login { max-width: 26em; margin: 12vh auto; }
.login input[type=password] { width: 100%; font: inherit; padding: .4em; margin: .4em 0 .8em; }
.error { color: var(--c3); }
nav { display: flex; flex-wrap: wrap; min-width: 0; }
#proxy-search { display: flex; flex-wrap: wrap; gap: .4em; margin-bottom: .6em; }
#proxy-search input, #proxy-search select { font: inherit; min-width: 0; max-width: 100%; }
#proxy-search input { flex: 1 1 12em; padding: .2em .4em; }
td.sites { min-width: 12em; }
.pager a { margin-right: 1em; color: var(--c1); }
"#;

/// The page around `body`: the head, the stylesheet and, when `refresh`,
/// the reload every [`REFRESH_S`] seconds.
fn document(title: &str, refresh: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                @if refresh { meta http-equiv="refresh" content=(REFRESH_S); }
                // An Origin of `null` (what `no-referrer` makes a form post send)
                // would fail the forms' same-origin check.
                meta name="referrer" content="same-origin";
                title { (title) }
                style { (PreEscaped(STYLE)) }
            }
            body { (body) }
        }
    }
}

/// The login form, with `error` above it when the last try failed.
pub fn login(error: Option<&str>) -> Markup {
    document(
        "proxywarden: log in",
        false,
        html! {
            section.login {
                h1 { "proxywarden" }
                p { "This dashboard is guarded by the API token (" code { "api.token" } ")." }
                @if let Some(e) = error { p.error id="login-error" role="alert" { (e) } }
                form method="post" action="/dashboard/login" {
                    label for="token" { "Token" }
                    input #token type="password" name="token" autocomplete="current-password"
                        required autofocus;
                    button type="submit" { "Log in" }
                }
            }
        },
    )
}

/// A page saying a form was refused, with a way back.
pub fn refused(message: &str) -> Markup {
    document(
        "proxywarden: refused",
        false,
        html! {
            section.login {
                h1 { "Refused" }
                p.error id="refused" { (message) }
                p { a href="/" { "Back to the dashboard" } }
            }
        },
    )
}

fn ms_of(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// A figure tile; `stat` names its key in `/stats`.
fn tile(label: &str, value: String, stat: Option<&str>) -> Markup {
    html! {
        div.tile {
            div.n data-stat=[stat] { (value) }
            div.l { (label) }
        }
    }
}

/// A two-column table of counts with a share bar, biggest first; `stat`
/// is its map's key in `/stats` (none: not there). At most `limit` rows,
/// then how many more.
fn counts_table(
    title: &str,
    map: &BTreeMap<String, i64>,
    stat: Option<&str>,
    limit: usize,
) -> Markup {
    let total: i64 = map.values().sum();
    let mut rows: Vec<(&String, &i64)> = map.iter().filter(|(_, n)| **n > 0).collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let more = rows.len().saturating_sub(limit);
    html! {
        div {
            h3 { (title) }
            @if rows.is_empty() {
                p.muted { "none" }
            } @else {
                div.scroll {
                    table {
                        @for (k, n) in rows.iter().take(limit) {
                            tr {
                                td { (k) }
                                td.num data-stat=[stat.map(|s| format!("{s}.{k}"))] { (count(**n)) }
                                td { (charts::share(**n, total)) }
                            }
                        }
                    }
                }
                @if more > 0 { p.muted { "and " (count(more as i64)) " more" } }
            }
        }
    }
}

fn hour_label(t: i64) -> String {
    chrono::DateTime::from_timestamp_millis(t)
        .map(|d| d.format("%H:%M").to_string())
        .unwrap_or_default()
}

fn day_label(t: i64) -> String {
    chrono::DateTime::from_timestamp_millis(t)
        .map(|d| d.format("%a %d").to_string())
        .unwrap_or_default()
}

const HOUR: i64 = 3_600_000;
const DAY: i64 = 24 * HOUR;

fn history(v: &View) -> Markup {
    let line = |snaps: &[Snapshot], f: fn(&Snapshot) -> i64| -> Vec<(i64, i64)> {
        snaps.iter().map(|s| (s.at, f(s))).collect()
    };
    let pool = |snaps: &[Snapshot]| {
        vec![
            Series {
                name: "servable",
                class: "c1",
                points: line(snaps, |s| s.servable),
            },
            Series {
                name: "alive (stored)",
                class: "c2",
                points: line(snaps, |s| s.alive),
            },
        ]
    };
    html! {
        section.wide #history {
            h2 { "Servable and alive" }
            div.cols {
                div {
                    h3 { "Last 24 hours (UTC)" }
                    (charts::lines("Servable and alive proxies, last 24 hours", &pool(&v.day),
                        (v.now - DAY, v.now), (3 * HOUR, hour_label), 15 * 60_000))
                }
                div {
                    h3 { "Last 7 days (UTC)" }
                    (charts::lines("Servable and alive proxies, last 7 days", &pool(&v.week),
                        (v.now - 7 * DAY, v.now), (DAY, day_label), 2 * HOUR))
                }
            }
        }
    }
}

/// Checks a minute now: the last snapshot's figure (checks committed in
/// the minute before it), or the checks of the rounds that finished in the
/// last minute when those are more. The snapshot taken at start counts
/// nothing, so without the rounds the first minute would read 0 while
/// rounds are already reported.
fn checks_a_minute(v: &View) -> Option<i64> {
    let recent: i64 = v
        .rounds
        .iter()
        .filter_map(|r| {
            let at = chrono::DateTime::parse_from_rfc3339(&r.finished_at).ok()?;
            let at = at.timestamp_millis();
            (at > v.now - 60_000 && at <= v.now).then_some(r.checked as i64)
        })
        .sum();
    match v.day.last() {
        Some(s) => Some(s.checks.max(recent)),
        None if !v.rounds.is_empty() => Some(recent),
        None => None,
    }
}

fn pool_now(v: &View) -> Markup {
    let by_status = |k: &str| v.stats.by_status.get(k).copied().unwrap_or(0);
    let mut https = BTreeMap::new();
    https.insert("with HTTPS".to_owned(), v.servable_by.https);
    https.insert("plain HTTP only".to_owned(), v.servable_by.no_https);
    // Not tested for CONNECT yet: neither of the above.
    https.insert(
        "HTTPS not known yet".to_owned(),
        v.servable as i64 - v.servable_by.https - v.servable_by.no_https,
    );
    html! {
        section.wide #pool {
            h2 { "The pool now" }
            div.tiles {
                (tile("servable now", count(v.servable as i64), Some("servable")))
                (tile("alive (stored)", count(by_status("alive")), Some("by_status.alive")))
                (tile("dead", count(by_status("dead")), Some("by_status.dead")))
                (tile("not checked yet", count(by_status("unknown")), Some("by_status.unknown")))
                (tile("stored in all", count(v.stats.total), Some("total")))
                @if let Some(n) = checks_a_minute(v) {
                    (tile("checks a minute", count(n), None))
                }
            }
            h3 { "Servable, by what clients filter on" }
            div.cols {
                (counts_table("Scheme", &v.servable_by.scheme, None, 10))
                (counts_table("Country", &v.servable_by.country, None, 12))
                (counts_table("Anonymity", &v.servable_by.anonymity, None, 10))
                (counts_table("HTTPS (CONNECT)", &https, None, 10))
            }
            h3 { "Stored, every status" }
            p.muted #counted { "Counted " (ago(v.counted_at, v.now)) ", as the sources below." }
            div.cols {
                (counts_table("Status", &v.stats.by_status, Some("by_status"), 10))
                (counts_table("Scheme", &v.stats.by_scheme, Some("by_scheme"), 10))
                (counts_table("Country", &v.stats.by_country, Some("by_country"), 12))
                (counts_table("Anonymity (alive)", &v.stats.by_anonymity, Some("by_anonymity"), 10))
            }
        }
    }
}

/// Latency buckets: (upper bound in ms, label).
const LATENCY_BUCKETS: &[(i64, &str)] = &[
    (100, "<100 ms"),
    (250, "<250 ms"),
    (500, "<500 ms"),
    (1_000, "<1 s"),
    (2_000, "<2 s"),
    (5_000, "<5 s"),
    (i64::MAX, "5 s+"),
];

fn latency(v: &View) -> Markup {
    let mut bars: Vec<(String, i64)> = LATENCY_BUCKETS
        .iter()
        .map(|(_, l)| ((*l).to_owned(), 0))
        .collect();
    for ms in &v.latencies {
        let i = LATENCY_BUCKETS
            .iter()
            .position(|(max, _)| ms < max)
            .unwrap_or(LATENCY_BUCKETS.len() - 1);
        bars[i].1 += 1;
    }
    let mut sorted = v.latencies.clone();
    sorted.sort_unstable();
    let pct = |p: usize| sorted.get((sorted.len() * p / 100).min(sorted.len().saturating_sub(1)));
    html! {
        section #latency {
            h2 { "Latency of servable proxies" }
            (charts::bars("Servable proxies by latency of their last check", "c1", &bars, " proxies"))
            @if let (Some(p50), Some(p90)) = (pct(50), pct(90)) {
                p.muted { "median " (duration_ms(*p50)) ", 90% under " (duration_ms(*p90)) }
            }
        }
    }
}

fn checks(v: &View) -> Markup {
    let per_minute = vec![
        Series {
            name: "checks a minute",
            class: "c1",
            points: v.day.iter().map(|s| (s.at, s.checks)).collect(),
        },
        Series {
            name: "of those alive",
            class: "c2",
            points: v.day.iter().map(|s| (s.at, s.checks_alive)).collect(),
        },
    ];
    let durations: Vec<(String, i64)> = v
        .rounds
        .iter()
        .map(|r| {
            let label = ms_of(&r.finished_at).map_or_else(String::new, hour_label);
            (label, r.duration_ms as i64)
        })
        .collect();
    html! {
        section #checks {
            h2 { "Checks" }
            (charts::lines("Checks a minute, last 24 hours", &per_minute,
                (v.now - DAY, v.now), (3 * HOUR, hour_label), 15 * 60_000))
            h3 { "Round durations (latest " (v.rounds.len()) ")" }
            (charts::bars("Check round durations in milliseconds", "c4", &durations, " ms"))
            @if let Some(c) = &v.last_check {
                p {
                    "Last round "
                    (ms_of(&c.finished_at).map_or_else(String::new, |t| ago(t, v.now)))
                    ": " span data-stat="last_check.checked" { (count(c.checked as i64)) } " checked, "
                    span data-stat="last_check.alive" { (count(c.alive as i64)) } " alive, "
                    span data-stat="last_check.dead" { (count(c.dead as i64)) } " dead"
                    @if c.unconfirmed > 0 { ", " (count(c.unconfirmed as i64)) " unconfirmed" }
                    " in " (duration_ms(c.duration_ms as i64)) "."
                }
            } @else {
                p.muted { "No check round has finished yet." }
            }
        }
    }
}

fn sources(v: &View) -> Markup {
    html! {
        section.wide #sources {
            h2 { "Sources" }
            @if let Some(h) = &v.last_harvest {
                p.muted {
                    "Last harvest "
                    (ms_of(&h.finished_at).map_or_else(String::new, |t| ago(t, v.now)))
                    ": " (count(h.sources as i64)) " sources, " (count(h.failed as i64)) " failed, "
                    (count(h.new as i64)) " new proxies, in " (duration_ms(h.duration_ms as i64)) "."
                }
            }
            @if v.sources.is_empty() {
                p.muted { "No source has run yet." }
            } @else {
                div.scroll {
                    table {
                        tr {
                            th { "Source" } th { "Last run" } th.num { "Took" } th.num { "Found" }
                            th.num { "New" } th.num { "Alive" } th { "Alive share" } th.num { "Only here" }
                            th.num { "Failed runs" } th { "Last error" }
                        }
                        @for s in &v.sources {
                            @let failing = s.last_error.is_some();
                            tr data-source=(s.name) {
                                td { span class=(if failing { "bad" } else { "good" }) {
                                    (if failing { "✗ " } else { "✓ " }) } (s.name) }
                                td { (s.last_fetch_at.map_or_else(|| "never".to_owned(), |t| ago(t, v.now))) }
                                td.num { (s.last_duration_ms.map_or_else(String::new, duration_ms)) }
                                td.num { (s.last_found.map_or_else(String::new, count)) }
                                td.num { (s.last_new.map_or_else(String::new, count)) }
                                td.num { (count(s.alive)) " of " (count(s.proxies)) }
                                td { (charts::share(s.alive, s.proxies)) " " (percent(s.alive, s.proxies)) }
                                td.num.unique { (count(s.unique)) }
                                td.num { (count(s.fetches_failed)) " of " (count(s.fetches_total)) }
                                td.bad.url { (s.last_error.as_deref().unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn judges(v: &View) -> Markup {
    html! {
        section #judges {
            h2 { "Judges" }
            @if v.judges.is_empty() {
                p.muted { "No judge asked yet (they are asked before each check round)." }
            } @else {
                div.scroll {
                    table {
                        tr { th { "Judge" } th { "State" } th.num { "Answers in" } th.num { "Failures" }
                             th { "Asked" } }
                        @for (url, j) in &v.judges {
                            tr {
                                td.url { (url) }
                                td { @if j.up { span.good { "answers" } } @else {
                                    span.bad title=[j.last_error.as_deref()] { "no answer" } } }
                                td.num { (j.latency.map_or_else(String::new, |l| duration_ms(l.as_millis() as i64))) }
                                td.num { (count(j.failures as i64)) }
                                td { (ago(j.last_asked_ms, v.now)) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn gateway(v: &View) -> Markup {
    let traffic = vec![
        Series {
            name: "requests and tunnels a minute",
            class: "c1",
            points: v.day.iter().map(|s| (s.at, s.gateway_requests)).collect(),
        },
        Series {
            name: "upstream failures a minute",
            class: "c3",
            points: v.day.iter().map(|s| (s.at, s.gateway_failures)).collect(),
        },
    ];
    let to_i64 = |m: &BTreeMap<String, u64>| -> BTreeMap<String, i64> {
        m.iter().map(|(k, n)| (k.clone(), *n as i64)).collect()
    };
    html! {
        section #gateway {
            h2 { "Gateway" }
            @match &v.gateway {
                None => p.muted { "The gateway is off (" code { "gateway.enabled" } ")." },
                Some(g) => {
                    div.tiles {
                        (tile("open connections", count(g.connections), Some("gateway.connections")))
                        (tile("open tunnels", count(g.tunnels_open), Some("gateway.tunnels_open")))
                        (tile("retries", count(g.retries as i64), Some("gateway.retries")))
                        (tile("refused at the cap", count(g.refused as i64), Some("gateway.refused")))
                        (tile("sent", bytes(g.bytes_sent), None))
                        (tile("received", bytes(g.bytes_received), None))
                    }
                    (charts::lines("Gateway traffic a minute, last 24 hours", &traffic,
                        (v.now - DAY, v.now), (3 * HOUR, hour_label), 15 * 60_000))
                    div.cols {
                        (counts_table("Requests", &to_i64(&g.requests), Some("gateway.requests"), 10))
                        (counts_table("CONNECT tunnels", &to_i64(&g.connect_tunnels), Some("gateway.connect_tunnels"), 10))
                        (counts_table("SOCKS5 tunnels", &to_i64(&g.socks_tunnels), Some("gateway.socks_tunnels"), 10))
                        (counts_table("Upstream failures", &to_i64(&g.upstream_failures), Some("gateway.upstream_failures"), 12))
                    }
                    p.muted { "The gateway adds " (format!("{:.1}", g.added_latency_mean_ms)) " ms on average." }
                }
            }
            (rotation(v))
        }
    }
}

/// Per site, how many proxies carried its requests in the last 10 minutes
/// and the largest share one took (the gateway, crawl jobs and the pool).
fn rotation(v: &View) -> Markup {
    html! {
        h3 { "Rotation by site, last 10 minutes" }
        @if v.rotation.is_empty() {
            p.muted { "No request through the pool in the last 10 minutes." }
        } @else {
            div.scroll {
                table #rotation {
                    tr { th { "site" } th.num { "requests" } th.num { "proxies" } th.num { "largest share" } }
                    @for s in v.rotation.iter().take(20) {
                        tr {
                            td.url { (s.site) }
                            td.num { (s.uses) }
                            td.num { (s.proxies) }
                            td.num { (format!("{:.0}%", s.top_share * 100.0)) }
                        }
                    }
                }
            }
        }
    }
}

fn crawls(v: &View) -> Markup {
    let n = |v: u64| count(i64::try_from(v).unwrap_or(i64::MAX));
    html! {
        section.wide #crawls {
            h2 { "Crawl jobs" }
            @if v.crawls.is_empty() {
                p.muted { "No crawl job yet (" code { "POST /crawls" } ")." }
            } @else {
                div.scroll {
                    table {
                        tr { th.num { "Job" } th { "State" } th.num { "Seeds" } th.num { "Pages" }
                             th.num { "Failed" } th.num { "Queued" } th.num { "In flight" }
                             th { "Started" } th { "Ended" } th {} }
                        @for j in &v.crawls {
                            @let id = j.id;
                            @let state = j.state.as_str();
                            tr data-crawl=(id) {
                                td.num { a href=(format!("/crawls/{id}")) { (id) } }
                                td.state { (state) @if let Some(e) = &j.error { " " span.bad { (e) } } }
                                td.num { (count(j.seeds_total.unwrap_or(0))) }
                                td.num { (n(j.progress.pages)) }
                                td.num { (n(j.progress.failed)) }
                                td.num { (n(j.progress.queued)) }
                                td.num { (n(j.progress.in_flight)) }
                                td { (j.started_at.as_deref().and_then(ms_of).map_or_else(String::new, |t| ago(t, v.now))) }
                                td { (j.finished_at.as_deref().and_then(ms_of).map_or_else(String::new, |t| ago(t, v.now))) }
                                td {
                                    @if state == "queued" || state == "running" {
                                        form method="post" action=(format!("/dashboard/crawls/{id}/cancel")) {
                                            input type="hidden" name="csrf" value=(v.csrf);
                                            button type="submit" { "Cancel" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn failures(v: &View) -> Markup {
    html! {
        section #failures {
            h2 { "Why dead proxies failed" }
            (counts_table("Last failure of each dead proxy", &v.stats.by_reason, Some("by_reason"), 20))
        }
    }
}

/// The whole dashboard.
pub fn dashboard(v: &View) -> Markup {
    let generated = chrono::DateTime::from_timestamp_millis(v.now)
        .map(|d| d.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_default();
    document(
        "proxywarden",
        true,
        html! {
            header {
                h1 { "proxywarden" }
                span.meta {
                    (count(v.servable as i64)) " servable · updated " (generated)
                    " · reloads every " (REFRESH_S) " s"
                }
                nav {
                    a href="#pool" { "Pool" } a href="#proxies" { "Proxies" } a href="#sources" { "Sources" }
                    a href="#checks" { "Checks" } a href="#gateway" { "Gateway" }
                    a href="#crawls" { "Crawls" } a href="/stats" { "/stats" }
                }
                @if v.session {
                    form method="post" action="/dashboard/logout" {
                        input type="hidden" name="csrf" value=(v.csrf);
                        button type="submit" { "Log out" }
                    }
                }
            }
            main {
                @for c in &v.degraded {
                    div.banner role="status" {
                        strong { "Degraded: " (c.component) } " since " (ago(c.since_ms, v.now)) ": " (c.message)
                    }
                }
                (pool_now(v))
                (super::table::render(&v.proxies, v.now))
                (history(v))
                (latency(v))
                (checks(v))
                (sources(v))
                (judges(v))
                (gateway(v))
                (failures(v))
                (crawls(v))
            }
        },
    )
}
