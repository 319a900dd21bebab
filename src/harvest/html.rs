//! The `html` format: the table whose header names an IP and a port column,
//! other columns recognised by their header. Parsing goes through html5ever
//! (via `scraper`), which recovers from malformed and truncated markup the
//! way browsers do, so a broken page yields what it can instead of failing.
//! A page cut off inside a row yields the rows before it: the last one may
//! hold a cut port or address.
//!
//! Parsing is bounded by [`crate::html`]: pages nested deeper than
//! [`MAX_DEPTH`] are refused as soon as the parser gets there, and a
//! deadline stops a page that takes too long. A page with more nodes or
//! attributes than its caps yields the rows read before them (the last one
//! left out: it may be cut) and says why.

use std::borrow::Cow;
use std::time::{Duration, Instant};

use scraper::{ElementRef, Html, Selector};

use super::text::{Token, first_token};
use super::{Candidates, country_hint, parse_https_word, protocol_words, push_schemes};
use crate::config::{HtmlColumns, HtmlOptions};
pub use crate::html::MAX_DEPTH;
use crate::html::{Deadline, HtmlError as Stopped, parse_document};
use crate::model::{Hints, SourceScheme};
use crate::proxy::{Anonymity, parse_host, parse_port};

/// Why a page yielded nothing.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HtmlError {
    /// The markup nests elements deeper than [`MAX_DEPTH`]: a table cut
    /// off there may hold cut rows.
    #[error("HTML nested deeper than {MAX_DEPTH} elements; not parsed")]
    TooDeep,
    /// Parsing did not finish within the time allowed.
    #[error("parsing the HTML took longer than {} (harvest.timeout); stopped", humantime::format_duration(*.0))]
    TooSlow(Duration),
    /// The page has more nodes or attributes than [`crate::html`] parses:
    /// the rows before them were read.
    #[error("{0}; the rows before that were read")]
    Cut(Stopped),
    /// No table on the page is a proxy list: says what was looked for.
    #[error("{0}")]
    NoTable(String),
    /// The source's `table` is not a CSS selector.
    #[error("table = {0:?} is not a valid CSS selector: {1}")]
    BadSelector(String, String),
}

/// Parses `body` (synchronous and CPU-bound: call it off the async runtime)
/// without a deadline. A page nested deeper than [`MAX_DEPTH`] yields
/// nothing; [`parse_bounded`] says why.
pub fn parse(body: &str, opts: &HtmlOptions, default: SourceScheme, out: &mut Candidates) {
    if let Err(e) = parse_bounded(body, opts, default, out, None) {
        tracing::debug!(error = %e, "html page not parsed");
    }
}

/// Parses `body` like [`parse`], giving up with [`HtmlError::TooSlow`] once
/// `limit` (a start time and the time allowed from it) is over.
pub fn parse_bounded(
    body: &str,
    opts: &HtmlOptions,
    default: SourceScheme,
    out: &mut Candidates,
    limit: Option<(Instant, Duration)>,
) -> Result<(), HtmlError> {
    let body = close_title(body);
    let body = body.as_ref();
    let deadline = limit.map(|(started, allowed)| Deadline {
        started,
        allowed,
        setting: "harvest.timeout",
    });
    // A proxy table cut off anywhere may hold cut rows: a page not read to
    // its end yields nothing.
    let parsed = parse_document(body, deadline);
    // A page stopped at a cap on its size is read up to there, as a page
    // cut off in transit is, and says why it was not read whole.
    let cut = match parsed.stopped {
        None => None,
        Some(Stopped::TooDeep) => return Err(HtmlError::TooDeep),
        Some(Stopped::TooSlow(allowed, _)) => return Err(HtmlError::TooSlow(allowed)),
        Some(e @ (Stopped::TooManyNodes | Stopped::TooManyAttributes)) => Some(e),
    };
    let done = || cut.clone().map_or(Ok(()), |e| Err(HtmlError::Cut(e)));
    let doc = parsed.doc;
    let Ok(table_sel) = Selector::parse("table") else {
        return Ok(());
    };
    // With a selector the user named the tables: read every one that
    // qualifies. Without one, the first table that looks like a proxy list
    // is the list; later tables are usually sidebars or ads.
    let tables: Vec<ElementRef<'_>> = match &opts.table {
        Some(css) => match Selector::parse(css) {
            Ok(sel) => doc
                .select(&sel)
                .flat_map(|el| {
                    if el.value().name() == "table" {
                        vec![el]
                    } else {
                        el.select(&table_sel).collect()
                    }
                })
                .collect(),
            Err(e) => return Err(HtmlError::BadSelector(css.clone(), e.to_string())),
        },
        None => doc.select(&table_sel).collect(),
    };
    let mut read_any = false;
    // The row the page was cut off in, if it was: `8` may be what is left
    // of `8080`, so that row is not read.
    let read = &body.as_bytes()[..parsed.read];
    let cut_row = match (ends_inside_a_row(read), Selector::parse("tr")) {
        (true, Ok(tr)) => doc.select(&tr).next_back().map(|r| r.id()),
        _ => None,
    };
    for table in &tables {
        let rows = rows_of(*table);
        let Some((layout, header)) = Layout::detect(&rows, &opts.columns) else {
            continue;
        };
        read_any = true;
        for (i, row) in rows.iter().enumerate() {
            if i == header || Some(row.id()) == cut_row {
                continue;
            }
            if !read_row(*row, &layout, default, out) {
                return done();
            }
        }
        if opts.table.is_none() {
            return done();
        }
    }
    if read_any {
        done()
    } else if let Some(e) = cut {
        Err(HtmlError::Cut(e))
    } else {
        Err(HtmlError::NoTable(no_table(&doc, &tables, opts)))
    }
}

/// What [`parse_bounded`] looked for and did not find, for the source's
/// error.
fn no_table(doc: &Html, tables: &[ElementRef<'_>], opts: &HtmlOptions) -> String {
    const TRY_TEXT: &str = "try format = \"text\"";
    if let Some(css) = &opts.table
        && tables.is_empty()
    {
        return format!("no table matches table = {css:?}; {TRY_TEXT}");
    }
    let any_table = Selector::parse("table")
        .ok()
        .is_some_and(|sel| doc.select(&sel).next().is_some());
    if !any_table {
        return format!("no <table> in the page; {TRY_TEXT}");
    }
    let c = &opts.columns;
    let wanted = match (&c.ip, &c.port) {
        (None, None) => "IP and Port columns".to_owned(),
        (ip, port) => format!(
            "the columns named by columns (ip = {:?}, port = {:?})",
            ip.as_deref().unwrap_or("recognised"),
            port.as_deref().unwrap_or("recognised")
        ),
    };
    // The first table's headers show what the page calls its columns.
    let headers: Vec<String> = tables
        .first()
        .map(|t| rows_of(*t))
        .and_then(|rows| {
            let first = *rows.first()?;
            Some(
                cells_of(first)
                    .map(|c| cell_text(c).trim().to_owned())
                    .filter(|h| !h.is_empty())
                    .take(8)
                    .map(|h| format!("{h:?}"))
                    .collect(),
            )
        })
        .unwrap_or_default();
    let seen = if headers.is_empty() {
        String::new()
    } else {
        format!(" (the first one's header: {})", headers.join(", "))
    };
    format!(
        "no table with {wanted} among {} tables{seen}; name them with columns = {{ ip = \"...\", \
         port = \"...\" }}, or {TRY_TEXT}",
        tables.len()
    )
}

/// `body` with a `</title>` after an unclosed `<title>`: its text runs to
/// the end of the page otherwise (HTML reads a title as plain text until it
/// closes), and the table after it would be title text. Browsers show such
/// a page's table; so does this.
fn close_title(body: &str) -> Cow<'_, str> {
    static OPEN: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"(?i)<title\b[^>]*>").ok());
    static CLOSE: std::sync::LazyLock<Option<regex::Regex>> =
        std::sync::LazyLock::new(|| regex::Regex::new(r"(?i)</title\s*>").ok());
    let (Some(open), Some(close)) = (OPEN.as_ref(), CLOSE.as_ref()) else {
        return Cow::Borrowed(body);
    };
    match open.find(body) {
        Some(m) if !close.is_match(&body[m.end()..]) => {
            let mut fixed = String::with_capacity(body.len() + 8);
            fixed.push_str(&body[..m.end()]);
            fixed.push_str("</title>");
            fixed.push_str(&body[m.end()..]);
            Cow::Owned(fixed)
        }
        _ => Cow::Borrowed(body),
    }
}

/// True when the markup ends inside a table row: after the last `<tr` no
/// tag closes the row, its table or the document. A page that simply leaves
/// its last row open at the end is read the same way, as nothing tells the
/// two apart.
fn ends_inside_a_row(b: &[u8]) -> bool {
    let is_tr_start = |i: usize| {
        b[i..].len() >= 3
            && b[i] == b'<'
            && b[i + 1..i + 3].eq_ignore_ascii_case(b"tr")
            && b.get(i + 3)
                .is_none_or(|c| c.is_ascii_whitespace() || matches!(c, b'>' | b'/'))
    };
    let Some(start) = memchr::memrchr_iter(b'<', b).find(|&i| is_tr_start(i)) else {
        return false;
    };
    let tail = &b[start..];
    const CLOSERS: [&[u8]; 7] = [
        b"</tr", b"</table", b"</tbody", b"</tfoot", b"</thead", b"</body", b"</html",
    ];
    !CLOSERS.iter().any(|closer| {
        tail.windows(closer.len())
            .any(|w| w.eq_ignore_ascii_case(closer))
    })
}

/// The rows of `table` itself, in document order, leaving out the rows of
/// tables nested in its cells.
fn rows_of(table: ElementRef<'_>) -> Vec<ElementRef<'_>> {
    let mut rows = Vec::new();
    for child in table.child_elements() {
        match child.value().name() {
            "tr" => rows.push(child),
            "thead" | "tbody" | "tfoot" => {
                rows.extend(child.child_elements().filter(|e| e.value().name() == "tr"));
            }
            _ => {}
        }
    }
    rows
}

fn cells_of(row: ElementRef<'_>) -> impl Iterator<Item = ElementRef<'_>> {
    row.child_elements()
        .filter(|e| matches!(e.value().name(), "td" | "th"))
}

fn cell_text(cell: ElementRef<'_>) -> String {
    let text: String = cell.text().collect();
    text.trim().to_owned()
}

/// Lowercase with runs of blanks folded, so `IP&nbsp; Address` and
/// `ip address` name the same column.
fn normalize(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Which cell of a row holds what.
#[derive(Debug, Default, PartialEq, Eq)]
struct Layout {
    ip: usize,
    /// `None` when the address cells hold `host:port` themselves.
    port: Option<usize>,
    country: Option<usize>,
    anonymity: Option<usize>,
    https: Option<usize>,
    protocol: Option<usize>,
}

impl Layout {
    /// Recognises the columns from the header row: the first row with `th`
    /// cells, or else the first row. Returns the layout and the header's
    /// index, or `None` when the table has no usable address column.
    fn detect(rows: &[ElementRef<'_>], names: &HtmlColumns) -> Option<(Layout, usize)> {
        let header = rows
            .iter()
            .position(|r| cells_of(*r).any(|c| c.value().name() == "th"))
            .unwrap_or(0);
        let headers: Vec<String> = cells_of(*rows.get(header)?)
            .map(|c| normalize(&cell_text(c)))
            .collect();
        let find = |name: &Option<String>, recognise: fn(&str) -> bool| match name {
            Some(name) => {
                let name = normalize(name);
                headers.iter().position(|h| *h == name)
            }
            None => headers.iter().position(|h| recognise(h)),
        };

        let port = find(&names.port, is_port_header);
        let ip = match find(&names.ip, is_ip_header) {
            Some(ip) => ip,
            // `IP:Port` or `Proxy`: one column with both, usable only when
            // its cells say so (checked below).
            None if names.ip.is_none() && port.is_none() => {
                headers.iter().position(|h| is_combined_header(h))?
            }
            None => return None,
        };
        if port.is_none() && !holds_host_port(rows, header, ip) {
            return None;
        }
        // A code column beats a `Country` column, which often holds names.
        let country = match &names.country {
            Some(_) => find(&names.country, |_| false),
            None => find(&None, is_country_code_header).or_else(|| find(&None, |h| h == "country")),
        };
        let layout = Layout {
            ip,
            port,
            country,
            anonymity: find(&names.anonymity, is_anonymity_header),
            https: find(&names.https, is_https_header),
            protocol: find(&names.protocol, is_protocol_header),
        };
        Some((layout, header))
    }
}

/// True when one of the first data rows has `host:port` in column `ip`.
fn holds_host_port(rows: &[ElementRef<'_>], header: usize, ip: usize) -> bool {
    rows.iter()
        .enumerate()
        .filter(|(i, _)| *i != header)
        .take(5)
        .filter_map(|(_, r)| cells_of(*r).nth(ip))
        .any(|c| first_token(&cell_text(c)).is_some())
}

fn words(h: &str) -> impl Iterator<Item = &str> {
    h.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
}

fn names_address(h: &str) -> bool {
    words(h).any(|w| {
        matches!(w, "ip" | "ips" | "ipv4" | "ipaddress")
            || w.contains("address")
            || w.contains("host")
    })
}

fn is_ip_header(h: &str) -> bool {
    names_address(h) && !words(h).any(|w| w == "port")
}

fn is_port_header(h: &str) -> bool {
    words(h).any(|w| w == "port") && !names_address(h)
}

fn is_combined_header(h: &str) -> bool {
    names_address(h) || matches!(h, "proxy" | "proxies" | "proxy list")
}

fn is_country_code_header(h: &str) -> bool {
    matches!(
        h,
        "code" | "cc" | "country code" | "country_code" | "countrycode" | "country iso" | "iso"
    )
}

fn is_anonymity_header(h: &str) -> bool {
    h.contains("anonym") || h == "level"
}

fn is_https_header(h: &str) -> bool {
    matches!(h, "https" | "ssl" | "https support" | "supports https")
}

fn is_protocol_header(h: &str) -> bool {
    matches!(
        h,
        "protocol" | "protocols" | "type" | "types" | "proxy type" | "version" | "proxy protocol"
    )
}

/// Pushes the candidates of one data row; returns `false` once `out` is full.
fn read_row(
    row: ElementRef<'_>,
    layout: &Layout,
    default: SourceScheme,
    out: &mut Candidates,
) -> bool {
    let cells: Vec<ElementRef<'_>> = cells_of(row).collect();
    let text = |i: Option<usize>| i.and_then(|i| cells.get(i)).map(|c| cell_text(*c));
    let Some(address) = text(Some(layout.ip)) else {
        return true;
    };
    let token = match layout.port {
        Some(_) => {
            let host = parse_host(&address);
            let port = text(layout.port).and_then(|p| parse_port(&p));
            match (host, port) {
                (Some(host), Some(port)) => Token {
                    host,
                    port,
                    auth: None,
                    scheme: None,
                    https: false,
                },
                _ => return true,
            }
        }
        None => match first_token(&address) {
            Some(t) => t,
            None => return true,
        },
    };

    let (schemes, says_https) = match text(layout.protocol) {
        Some(p) if token.scheme.is_none() => protocol_words(&p),
        _ => (Vec::new(), false),
    };
    let hints = Hints {
        country: text(layout.country).and_then(|c| country_hint(&c)),
        anonymity: text(layout.anonymity).and_then(|a| Anonymity::from_loose(&a)),
        https: text(layout.https)
            .and_then(|h| parse_https_word(&h))
            .or(says_https.then_some(true)),
    };
    push_schemes(token, &schemes, default, hints, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::{Country, Scheme};

    const HTTP: SourceScheme = SourceScheme::Fixed(Scheme::Http);

    fn run(body: &str, opts: &HtmlOptions, default: SourceScheme) -> Candidates {
        let mut out = Candidates::new(1000);
        parse(body, opts, default, &mut out);
        out
    }

    fn urls(body: &str) -> Vec<String> {
        urls_with(body, &HtmlOptions::default())
    }

    fn urls_with(body: &str, opts: &HtmlOptions) -> Vec<String> {
        run(body, opts, HTTP)
            .items()
            .iter()
            .map(|c| c.proxy.to_string())
            .collect()
    }

    const FREE_PROXY_LIST: &str = r#"<html><body>
        <table class="layout"><tr><td>menu</td><td>ads</td></tr></table>
        <div class="table-responsive fpl-list"><table class="table table-striped table-bordered">
        <thead><tr><th>IP Address</th><th>Port</th><th>Code</th><th class='hm'>Country</th>
        <th>Anonymity</th><th class='hm'>Google</th><th class='hx'>Https</th><th class='hm'>Last Checked</th></tr></thead>
        <tbody>
        <tr><td>1.2.3.4</td><td>8080</td><td>US</td><td class='hm'>United States</td><td>elite proxy</td><td class='hm'>no</td><td class='hx'>yes</td><td class='hm'>1 min ago</td></tr>
        <tr><td>5.6.7.8</td><td>3128</td><td>DE</td><td class='hm'>Germany</td><td>anonymous</td><td class='hm'>no</td><td class='hx'>no</td><td class='hm'>2 mins ago</td></tr>
        <tr><td>9.9.9.9</td><td>80</td><td>Unknown</td><td class='hm'>Unknown</td><td>transparent</td><td class='hm'>-</td><td class='hx'>?</td><td class='hm'>3 mins ago</td></tr>
        <tr><td>999.1.1.1</td><td>80</td><td>US</td><td></td><td></td><td></td><td></td><td></td></tr>
        <tr><td>1.1.1.1</td><td>0</td><td>US</td><td></td><td></td><td></td><td></td><td></td></tr>
        <tr><td>1.2.3.4</td><td>8080</td><td>US</td><td></td><td></td><td></td><td></td><td></td></tr>
        </tbody><tfoot><tr><th class="input"><input type="text" /></th><th></th></tr></tfoot></table></div>
        <table><tr><th>IP</th><th>Port</th></tr><tr><td>7.7.7.7</td><td>7</td></tr></table>
        </body></html>"#;

    #[test]
    fn free_proxy_list_net() {
        let out = run(FREE_PROXY_LIST, &HtmlOptions::default(), HTTP);
        let items = out.items();
        assert_eq!(items.len(), 3, "{items:?}");
        assert_eq!(items[0].proxy.to_string(), "http://1.2.3.4:8080");
        assert_eq!(
            items[0].hints,
            Hints {
                country: Country::parse("US"),
                anonymity: Some(Anonymity::Elite),
                https: Some(true),
            }
        );
        assert_eq!(items[1].hints.anonymity, Some(Anonymity::Anonymous));
        assert_eq!(items[1].hints.https, Some(false));
        assert_eq!(items[1].hints.country, Country::parse("de"));
        // Unknown codes and unknown https words leave the hints unset.
        assert_eq!(items[2].hints.country, None);
        assert_eq!(items[2].hints.https, None);
        assert_eq!(items[2].hints.anonymity, Some(Anonymity::Transparent));
    }

    #[test]
    fn socks_proxy_net() {
        let body = r#"<table id="proxylisttable"><thead><tr><th>IP Address</th><th>Port</th>
            <th>Code</th><th>Country</th><th>Version</th><th>Anonymity</th><th>Https</th>
            <th>Last Checked</th></tr></thead><tbody>
            <tr><td>1.2.3.4</td><td>1080</td><td>BR</td><td>Brazil</td><td>Socks4</td><td>Anonymous</td><td>Yes</td><td>1 min</td></tr>
            <tr><td>5.6.7.8</td><td>1081</td><td>ID</td><td>Indonesia</td><td>Socks5</td><td>Anonymous</td><td>No</td><td>1 min</td></tr>
            <tr><td>9.9.9.9</td><td>1082</td><td>ID</td><td>Indonesia</td><td>?</td><td>Anonymous</td><td>No</td><td>1 min</td></tr>
            </tbody></table>"#;
        let out = run(body, &HtmlOptions::default(), SourceScheme::Detect);
        let got: Vec<_> = out
            .items()
            .iter()
            .map(|c| (c.proxy.to_string(), c.detect))
            .collect();
        assert_eq!(
            got,
            [
                ("socks4://1.2.3.4:1080".to_owned(), false),
                ("socks5://5.6.7.8:1081".to_owned(), false),
                // A protocol cell naming nothing known falls back to the default.
                ("http://9.9.9.9:1082".to_owned(), true),
            ]
        );
        assert_eq!(out.items()[0].hints.country, Country::parse("BR"));
    }

    #[test]
    fn several_protocols_give_one_candidate_each() {
        let body = "<table><tr><th>Host</th><th>Port</th><th>Protocols</th></tr>\
            <tr><td>1.2.3.4</td><td>80</td><td>HTTP, SOCKS5</td></tr>\
            <tr><td>5.6.7.8</td><td>443</td><td>HTTPS</td></tr></table>";
        let out = run(body, &HtmlOptions::default(), HTTP);
        let got: Vec<_> = out.items().iter().map(|c| c.proxy.to_string()).collect();
        assert_eq!(
            got,
            [
                "http://1.2.3.4:80",
                "socks5://1.2.3.4:80",
                "http://5.6.7.8:443"
            ]
        );
        assert_eq!(out.items()[2].hints.https, Some(true));
        assert_eq!(out.items()[0].hints.https, None);
    }

    #[test]
    fn header_from_the_first_row_without_th() {
        let body = "<table><tr><td>Proxy IP</td><td>Proxy Port</td><td>Type</td></tr>\
            <tr><td>1.2.3.4</td><td>1080</td><td>socks5</td></tr></table>";
        assert_eq!(urls(body), ["socks5://1.2.3.4:1080"]);
    }

    #[test]
    fn address_column_holding_host_port() {
        let body = "<table><tr><th>IP:Port</th><th>Country</th></tr>\
            <tr><td>1.2.3.4:8080</td><td>FR</td></tr>\
            <tr><td>socks5://5.6.7.8:1080</td><td>France</td></tr>\
            <tr><td>garbage</td><td>FR</td></tr></table>";
        let out = run(body, &HtmlOptions::default(), HTTP);
        let got: Vec<_> = out.items().iter().map(|c| c.proxy.to_string()).collect();
        assert_eq!(got, ["http://1.2.3.4:8080", "socks5://5.6.7.8:1080"]);
        // A `Country` column counts when it holds codes; names are ignored.
        assert_eq!(out.items()[0].hints.country, Country::parse("FR"));
        assert_eq!(out.items()[1].hints.country, None);
    }

    #[test]
    fn tables_without_address_and_port_are_skipped() {
        let body = "<table><tr><th>Name</th><th>Port</th></tr><tr><td>1.2.3.4</td><td>80</td></tr></table>\
            <table><tr><th>IP</th><th>Notes</th></tr><tr><td>1.2.3.4</td><td>80</td></tr></table>";
        assert!(urls(body).is_empty());
        assert!(urls("<p>no tables here 1.2.3.4:80</p>").is_empty());
        assert!(urls("").is_empty());
    }

    #[test]
    fn selector_picks_the_table_or_the_tables_inside() {
        let body = "<table id=a><tr><th>IP</th><th>Port</th></tr><tr><td>1.1.1.1</td><td>1</td></tr></table>\
            <div class=list><table><tr><th>IP</th><th>Port</th></tr><tr><td>2.2.2.2</td><td>2</td></tr></table></div>\
            <table class=more><tr><th>IP</th><th>Port</th></tr><tr><td>3.3.3.3</td><td>3</td></tr></table>";
        assert_eq!(urls(body), ["http://1.1.1.1:1"]);
        let opts = |css: &str| HtmlOptions {
            table: Some(css.to_owned()),
            ..HtmlOptions::default()
        };
        assert_eq!(urls_with(body, &opts("div.list")), ["http://2.2.2.2:2"]);
        assert_eq!(urls_with(body, &opts("table.more")), ["http://3.3.3.3:3"]);
        assert_eq!(
            urls_with(body, &opts("div.list, table.more")),
            ["http://2.2.2.2:2", "http://3.3.3.3:3"]
        );
        assert!(urls_with(body, &opts("#missing")).is_empty());
        assert!(urls_with(body, &opts("[[[")).is_empty());
    }

    #[test]
    fn column_names_override_recognition() {
        let body = "<table><tr><th>Server</th><th>Listen</th><th>Land</th><th>Art</th><th>Anon</th><th>TLS</th></tr>\
            <tr><td>1.2.3.4</td><td>1080</td><td>at</td><td>SOCKS5</td><td>HIA</td><td>+</td></tr></table>";
        assert!(urls(body).is_empty());
        let opts = HtmlOptions {
            table: None,
            columns: HtmlColumns {
                ip: Some(" server ".into()),
                port: Some("LISTEN".into()),
                country: Some("land".into()),
                anonymity: Some("anon".into()),
                https: Some("tls".into()),
                protocol: Some("art".into()),
            },
        };
        let out = run(body, &opts, HTTP);
        assert_eq!(out.len(), 1);
        let c = &out.items()[0];
        assert_eq!(c.proxy.to_string(), "socks5://1.2.3.4:1080");
        assert_eq!(
            c.hints,
            Hints {
                country: Country::parse("AT"),
                anonymity: Some(Anonymity::Elite),
                https: Some(true),
            }
        );
    }

    #[test]
    fn nested_tables_do_not_leak_rows() {
        let body = "<table><tr><th>IP</th><th>Port</th></tr>\
            <tr><td>1.1.1.1</td><td>1<table><tr><td>2.2.2.2</td><td>2</td></tr></table></td></tr>\
            <tr><td>3.3.3.3</td><td>3</td></tr></table>";
        // The nested table's text sits in the port cell, which then is not a port.
        assert_eq!(urls(body), ["http://3.3.3.3:3"]);
    }

    #[test]
    fn malformed_and_truncated_html() {
        // Cut off mid-row: the last row's `8` may be the start of `8080`.
        let body = "<table><tr><th>IP<th>Port<tr><td>1.2.3.4<td>80<tr><td>5.6.7.8<td>81</tr>\
            <tr><td>9.9.9.9</td><td>8";
        assert_eq!(urls(body), ["http://1.2.3.4:80", "http://5.6.7.8:81"]);
        for cut in 0..FREE_PROXY_LIST.len() {
            if FREE_PROXY_LIST.is_char_boundary(cut) {
                let _ = urls(&FREE_PROXY_LIST[..cut]);
            }
        }
        assert!(urls("<<<table>>></tr></td><th>").is_empty());
    }

    /// A `/broken.html`-style page: no closing tags, unknown country codes,
    /// and the file cut off in the middle of a row (in a cell, in a tag).
    #[test]
    fn a_page_cut_off_mid_row_yields_its_complete_rows() {
        let page = "<html><body><h1>Proxies<table class=list>\
            <tr><th>IP Address<th>Port<th>Code<th>Https\n\
            <tr><td>1.1.1.1<td>8080<td>US<td>yes\n\
            <tr><td><b>2.2.2.2</b><td>3128<td>ZZ<td>no\n\
            <tr><td>3.3.3.3<td>80<td>--<td>\n\
            <tr><td>4.4.4.4<td>1080<td>XX<td>no\n\
            <tr><td>5.5.5.5<td>808";
        let complete = [
            ("http://1.1.1.1:8080", Country::parse("US")),
            ("http://2.2.2.2:3128", None),
            ("http://3.3.3.3:80", None),
            ("http://4.4.4.4:1080", None),
        ];
        let got = |body: &str| -> Vec<(String, Option<Country>)> {
            run(body, &HtmlOptions::default(), HTTP)
                .items()
                .iter()
                .map(|c| (c.proxy.to_string(), c.hints.country))
                .collect()
        };
        let expected: Vec<_> = complete.iter().map(|(u, c)| (u.to_string(), *c)).collect();
        assert_eq!(got(page), expected);
        // Cut inside a tag or a cell of the last row, or right after its start.
        for tail in ["<td", "<td>US<t", "<TD>U", ""] {
            assert_eq!(got(&format!("{page}{tail}")), expected, "{tail:?}");
        }
        let cut_in_row_start = page.rsplit_once("<tr>").unwrap().0.to_owned() + "<tr>";
        assert_eq!(got(&cut_in_row_start), expected);
        // Once something closes the row, the page was not cut there.
        for end in ["</tr>", "</TABLE>", "</body></html>"] {
            let mut all = expected.clone();
            all.push(("http://5.5.5.5:808".into(), None));
            assert_eq!(got(&format!("{page}{end}")), all, "{end:?}");
        }
    }

    const SMALL_TABLE: &str =
        "<table><tr><th>IP</th><th>Port</th></tr><tr><td>1.1.1.1</td><td>80</td></tr></table>";

    fn bounded(body: &str, limit: Option<(Instant, Duration)>) -> Result<usize, HtmlError> {
        let mut out = Candidates::new(1000);
        parse_bounded(body, &HtmlOptions::default(), HTTP, &mut out, limit)?;
        Ok(out.len())
    }

    /// Issue 24, Must 7: a page whose table yields nothing says what was
    /// looked for; an unclosed `<title>` does not hide the table.
    #[test]
    fn a_page_without_a_proxy_table_says_what_was_looked_for() {
        let err = |body: &str, opts: &HtmlOptions| {
            let mut out = Candidates::new(10);
            parse_bounded(body, opts, HTTP, &mut out, None)
                .unwrap_err()
                .to_string()
        };
        let none = HtmlOptions::default();
        assert_eq!(
            err("<p>1.2.3.4:80</p>", &none),
            "no <table> in the page; try format = \"text\""
        );
        assert_eq!(
            err(
                "<table><tr><th>Host</th><th>Speed</th></tr><tr><td>a</td><td>1</td></tr></table>",
                &none
            ),
            "no table with IP and Port columns among 1 tables (the first one's header: \
             \"Host\", \"Speed\"); name them with columns = { ip = \"...\", port = \"...\" }, \
             or try format = \"text\""
        );
        let selected = HtmlOptions {
            table: Some("#list".into()),
            ..HtmlOptions::default()
        };
        assert_eq!(
            err(SMALL_TABLE, &selected),
            "no table matches table = \"#list\"; try format = \"text\""
        );
        let bad = HtmlOptions {
            table: Some("[[".into()),
            ..HtmlOptions::default()
        };
        assert!(err(SMALL_TABLE, &bad).starts_with("table = \"[[\" is not a valid CSS selector"));
    }

    #[test]
    fn an_unclosed_title_still_yields_the_rows() {
        let page = format!("<html><head><TITLE class=x>Free proxies</head><body>{SMALL_TABLE}");
        // As HTML reads it, the table is the title's text.
        let raw = parse_document(&page, None).doc;
        let table = Selector::parse("table").unwrap();
        assert_eq!(raw.select(&table).count(), 0);
        assert_eq!(bounded(&page, None), Ok(1));
        let closed = format!("<title>a</title><p>b</p>{SMALL_TABLE}");
        assert_eq!(bounded(&closed, None), Ok(1));
        assert!(matches!(close_title(&closed), Cow::Borrowed(_)));
    }

    #[test]
    fn nesting_up_to_the_cap_is_read_and_deeper_is_refused_at_once() {
        let at = |depth: usize| "<div>".repeat(depth) + SMALL_TABLE;
        // html, body and the table's own elements count too.
        assert_eq!(bounded(&at(MAX_DEPTH - 10), None), Ok(1));
        // Refused as soon as the parser gets there: the rest of a page of
        // 200,000 levels (1 MB) is never parsed, so it costs about what
        // 20,000 levels cost, not ten times as much.
        let (small, big) = (at(20_000), at(200_000));
        assert_eq!(bounded(&big, None), Err(HtmlError::TooDeep));
        let ratio = crate::growth::ratio(
            || assert_eq!(bounded(&small, None), Err(HtmlError::TooDeep)),
            || assert_eq!(bounded(&big, None), Err(HtmlError::TooDeep)),
        );
        assert!(ratio < 4.0, "10x the levels cost {ratio:.1}x");
        assert_eq!(
            HtmlError::TooDeep.to_string(),
            "HTML nested deeper than 1024 elements; not parsed"
        );
    }

    #[test]
    fn a_list_over_the_node_cap_yields_the_rows_before_it_and_says_why() {
        let mut page = String::from("<table><tr><th>IP</th><th>Port</th></tr>");
        let mut rows = 0;
        while page.len() < 6 * 1024 * 1024 {
            page.push_str(&format!(
                "<tr><td>10.{}.{}.{}</td><td>80</td></tr>",
                rows / 65536,
                rows / 256 % 256,
                rows % 256
            ));
            rows += 1;
        }
        let mut out = Candidates::new(1_000_000);
        let err = parse_bounded(&page, &HtmlOptions::default(), HTTP, &mut out, None).unwrap_err();
        assert_eq!(err, HtmlError::Cut(Stopped::TooManyNodes));
        assert_eq!(
            err.to_string(),
            "HTML with more than 200000 nodes; not parsed past them; the rows before that were read"
        );
        // About one row per 5 nodes (tr, 2 td, 2 texts), the cut one left out.
        let read = out.len();
        assert!(read > 30_000 && read < rows, "{read} of {rows}");
    }

    #[test]
    fn one_tag_with_400000_attributes_costs_no_harvest_timeout() {
        let attrs: String = (0..400_000).map(|i| format!(" a{i}")).collect();
        let page = format!("{SMALL_TABLE}<table{attrs}><tr><td>1</td></tr></table>");
        let mut out = Candidates::new(10);
        // Cut by the attribute cap, not by the time allowed: a parse that
        // ran out the minute would say so instead.
        let limit = Some((Instant::now(), Duration::from_secs(60)));
        let err = parse_bounded(&page, &HtmlOptions::default(), HTTP, &mut out, limit).unwrap_err();
        assert_eq!(err, HtmlError::Cut(Stopped::TooManyAttributes));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn parsing_stops_when_the_time_allowed_is_over() {
        let mut page = String::from("<table><tr><th>IP</th><th>Port</th></tr>");
        for i in 0..500 {
            page.push_str(&format!(
                "<tr><td>10.0.{}.{}</td><td>80</td></tr>",
                i / 250,
                i % 250
            ));
        }
        assert_eq!(
            bounded(&page, Some((Instant::now(), Duration::from_secs(60)))),
            Ok(500)
        );
        let spent = (Instant::now(), Duration::ZERO);
        let err = bounded(&page, Some(spent)).unwrap_err();
        assert_eq!(err, HtmlError::TooSlow(Duration::ZERO));
        assert_eq!(
            HtmlError::TooSlow(Duration::from_secs(30)).to_string(),
            "parsing the HTML took longer than 30s (harvest.timeout); stopped"
        );
    }

    #[test]
    fn replacement_characters_and_blanks_in_cells() {
        let body = "<table><tr><th>IP\u{a0} Address</th><th>Port</th><th>Code</th></tr>\
            <tr><td> 1.2.3.4\n</td><td>\t80 </td><td>\u{FFFD}\u{FFFD}</td></tr>\
            <tr><td>1.2.3.\u{FFFD}</td><td>80</td><td>US</td></tr></table>";
        let out = run(body, &HtmlOptions::default(), HTTP);
        assert_eq!(out.len(), 1);
        assert_eq!(out.items()[0].hints.country, None);
    }

    #[test]
    fn duplicates_and_the_limit() {
        let mut body = String::from("<table><tr><th>IP</th><th>Port</th></tr>");
        for i in 1..=10 {
            body.push_str(&format!("<tr><td>1.1.1.{i}</td><td>80</td></tr>"));
            body.push_str(&format!("<tr><td>1.1.1.{i}</td><td>80</td></tr>"));
        }
        assert_eq!(urls(&body).len(), 10);
        let mut out = Candidates::new(3);
        parse(&body, &HtmlOptions::default(), HTTP, &mut out);
        assert_eq!(out.len(), 3);
        assert!(out.truncated());
    }
}
