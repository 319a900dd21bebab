//! The dashboard's proxy table: a page of `/proxies/browse` with its
//! search form and the links to the pages before and after it. Without
//! script, the form and the links load the dashboard again with the
//! table's parameters in its address (so the reload keeps them).

use maud::{Markup, html};

use super::format::{ago, count, duration_ms};
use crate::api::browse::{BrowseRow, BrowseView, PARAMS};
use crate::api::query::Params;

/// The table's search and filters as asked, and the page they gave (or
/// what was wrong with them).
pub struct Table {
    /// Each parameter of [`PARAMS`] as given (empty when not).
    pub asked: Vec<(&'static str, String)>,
    /// The page, or the error message of a bad parameter.
    pub page: Result<BrowseView, String>,
}

impl Table {
    /// The parameters of `p` as asked.
    pub fn asked(p: &Params) -> Vec<(&'static str, String)> {
        PARAMS
            .iter()
            .map(|n| (*n, p.get(n).unwrap_or("").to_owned()))
            .collect()
    }

    fn get(&self, name: &str) -> &str {
        self.asked
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v.as_str())
    }

    /// The dashboard's address with the search and filters kept, the page
    /// cursors dropped and `extra` added, at the table.
    fn link(&self, extra: Option<(&str, &str)>) -> String {
        let mut q = url::form_urlencoded::Serializer::new(String::new());
        for (n, v) in &self.asked {
            if !v.is_empty() && *n != "after" && *n != "before" {
                q.append_pair(n, v);
            }
        }
        if let Some((n, v)) = extra {
            q.append_pair(n, v);
        }
        let q = q.finish();
        if q.is_empty() {
            "/#proxies".to_owned()
        } else {
            format!("/?{q}#proxies")
        }
    }
}

fn ms_of(rfc3339: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(rfc3339)
        .ok()
        .map(|t| t.timestamp_millis())
}

/// What sites taught, in a few words and the latest sites.
fn sites(r: &BrowseRow, now: i64) -> Markup {
    let s = &r.sites;
    html! {
        @if s.known == 0 {
            span.muted { "nothing yet" }
        } @else {
            span.taught {
                "worked at " (count(s.worked)) ", refused by " (count(s.blocked))
                @if s.banned_now > 0 { ", " span.bad { "banned by " (count(s.banned_now)) " now" } }
            }
            @for site in &s.latest {
                br;
                span.site {
                    (site.site) ": " (count(site.worked)) " ✓ " (count(site.blocked)) " ✗"
                    @if let Some(until) = site.banned_until.as_deref().and_then(ms_of) {
                        " " span.bad { "banned, ends " (ago(until, now)) }
                    }
                }
            }
            @if s.known > s.latest.len() as i64 {
                br; span.muted { "and " (count(s.known - s.latest.len() as i64)) " more sites" }
            }
        }
    }
}

/// The section: the form, the page and its links.
pub fn render(t: &Table, now: i64) -> Markup {
    let status = t.get("status");
    let sort = t.get("sort");
    html! {
        section.wide #proxies {
            h2 { "Proxies" }
            form #proxy-search method="get" action="/#proxies" {
                input #proxy-q type="search" name="q" value=(t.get("q"))
                    placeholder="address or country code" aria-label="Search proxies" maxlength="100";
                " "
                select name="status" aria-label="Status" {
                    @for (v, label) in [("all", "every status"), ("alive", "alive"), ("dead", "dead"), ("unknown", "not checked yet")] {
                        option value=(v) selected[status == v] { (label) }
                    }
                }
                " "
                select name="sort" aria-label="Order" {
                    @for (v, label) in [("id", "first stored first"), ("latency", "fastest first"), ("last_checked", "latest checked first")] {
                        option value=(v) selected[sort == v] { (label) }
                    }
                }
                " "
                button type="submit" { "Search" }
            }
            @match &t.page {
                Err(e) => p.error #proxy-error role="alert" { (e) },
                Ok(page) => {
                    p.muted #proxy-total {
                        @if page.total_capped { "More than " (count(page.total)) } @else { (count(page.total)) }
                        " matching"
                        @if !page.proxies.is_empty() { ", " (page.proxies.len()) " shown" }
                        "."
                    }
                    @if page.proxies.is_empty() {
                        p.muted { "No stored proxy matches." }
                    } @else {
                        div.scroll {
                            table #proxy-table {
                                tr {
                                    th { "Address" } th { "Scheme" } th { "Country" } th { "Status" }
                                    th.num { "Latency" } th { "Anonymity" } th { "Last checked" }
                                    th { "What sites taught" }
                                }
                                @for r in &page.proxies {
                                    tr data-proxy=(r.id) {
                                        td.url.address { (r.address) }
                                        td { (r.scheme) }
                                        td { (r.country.as_deref().unwrap_or("")) }
                                        td {
                                            span class=(match r.status.as_str() { "alive" => "good", "dead" => "bad", _ => "muted" }) {
                                                (r.status)
                                            }
                                            @if let Some(reason) = &r.reason { " " span.muted { (reason) } }
                                        }
                                        td.num { (r.latency_ms.map_or_else(String::new, duration_ms)) }
                                        td { (r.anonymity.as_deref().unwrap_or("")) }
                                        td { (r.last_checked.as_deref().and_then(ms_of).map_or_else(|| "never".to_owned(), |t| ago(t, now))) }
                                        td.sites { (sites(r, now)) }
                                    }
                                }
                            }
                        }
                    }
                    p.pager {
                        @if let Some(prev) = &page.prev {
                            a #proxy-prev href=(t.link(Some(("before", prev)))) { "← previous page" }
                            " "
                        }
                        @if let Some(next) = &page.next {
                            a #proxy-next href=(t.link(Some(("after", next)))) { "next page →" }
                            " "
                        }
                        @if !t.get("after").is_empty() || !t.get("before").is_empty() {
                            a #proxy-first href=(t.link(None)) { "first page" }
                        }
                    }
                }
            }
        }
    }
}
