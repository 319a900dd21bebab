//! What the crawler takes from an HTML page: its title, its links
//! (resolved against the page or its `<base href>`) and the fields the user
//! selected with CSS selectors. Pages go through the bounded parser of
//! [`crate::html`]: a page nested too deep, with too many nodes or
//! attributes, or too slow to parse yields what was read up to there.
//! Titles and field values are cut at [`MAX_TEXT`] bytes, and a field with
//! every match at [`MAX_FIELD`] bytes or [`MAX_MATCHES`] values, so a page's
//! line stays small whatever the page holds.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use scraper::{ElementRef, Selector};
use url::Url;

use crate::html::{Deadline, HtmlError, parse_document};

/// A field to extract: a name and the selector of the elements whose text
/// it takes.
#[derive(Clone, Debug)]
pub struct Select {
    /// The output key.
    pub name: String,
    /// Which elements.
    pub selector: Selector,
}

impl Select {
    /// Splits `name=css` into its name and selector, unchecked.
    pub fn split(spec: &str) -> Result<(&str, &str), String> {
        spec.split_once('=')
            .ok_or_else(|| format!("{spec:?} is not name=css-selector"))
    }

    /// Parses `name=css`.
    pub fn parse(spec: &str) -> Result<Select, String> {
        let (name, css) = Select::split(spec)?;
        let name = name.trim();
        if name.is_empty() {
            return Err(format!("{spec:?} has an empty name"));
        }
        let selector = Selector::parse(css.trim())
            .map_err(|e| format!("{css:?} is not a CSS selector: {e}"))?;
        Ok(Select {
            name: name.to_owned(),
            selector,
        })
    }
}

/// What a page yielded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extracted {
    /// `<title>`, trimmed.
    pub title: Option<String>,
    /// Every `a[href]` and `area[href]`, resolved (any scheme).
    pub links: Vec<Url>,
    /// Selected fields: the text of the first match, or with `all` an
    /// array of every match's text.
    pub fields: BTreeMap<String, serde_json::Value>,
    /// Why parsing stopped before the end of the page, if it did: what
    /// came before is above.
    pub stopped: Option<HtmlError>,
}

/// The most links taken from one page: a page with more is a trap.
const MAX_LINKS: usize = 10_000;

/// The longest title or field value kept, in bytes (cut at a character).
pub const MAX_TEXT: usize = 4 * 1024;

/// The most bytes of values one field keeps with `all`.
pub const MAX_FIELD: usize = 64 * 1024;

/// The most values one field keeps with `all`.
pub const MAX_MATCHES: usize = 1_000;

/// The built-in selectors, parsed once rather than for every page.
static TITLE: LazyLock<Selector> = LazyLock::new(|| built_in("title"));
static BASE: LazyLock<Selector> = LazyLock::new(|| built_in("base[href]"));
static LINKS: LazyLock<Selector> = LazyLock::new(|| built_in("a[href], area[href]"));

fn built_in(css: &str) -> Selector {
    Selector::parse(css).expect("built-in selectors parse")
}

/// Parses `html` found at `page`, within `deadline` (synchronous and
/// CPU-bound: call it off the async runtime).
pub fn extract(
    html: &str,
    page: &Url,
    selects: &[Select],
    all: bool,
    deadline: Option<Deadline>,
) -> Extracted {
    let parsed = parse_document(html, deadline);
    let doc = parsed.doc;
    let title = doc
        .select(&TITLE)
        .next()
        .map(text_of)
        .filter(|t| !t.is_empty());
    let base = doc
        .select(&BASE)
        .next()
        .and_then(|b| b.value().attr("href"))
        .and_then(|h| page.join(h.trim()).ok())
        .unwrap_or_else(|| page.clone());
    let links = doc
        .select(&LINKS)
        .filter_map(|a| a.value().attr("href"))
        .filter_map(|h| base.join(h.trim()).ok())
        .take(MAX_LINKS)
        .collect();
    let mut fields = BTreeMap::new();
    for s in selects {
        let mut texts = doc.select(&s.selector).map(text_of);
        let value = if all {
            let mut bytes = 0;
            let values = texts
                .take(MAX_MATCHES)
                .take_while(|t| {
                    bytes += t.len();
                    bytes <= MAX_FIELD
                })
                .map(serde_json::Value::String)
                .collect();
            serde_json::Value::Array(values)
        } else {
            texts
                .next()
                .map_or(serde_json::Value::Null, serde_json::Value::String)
        };
        fields.insert(s.name.clone(), value);
    }
    Extracted {
        title,
        links,
        fields,
        stopped: parsed.stopped,
    }
}

/// The text of `el` with runs of whitespace as one space, trimmed, cut at
/// [`MAX_TEXT`] bytes: a 9 MiB title costs 4 KiB, not a copy of itself.
fn text_of(el: ElementRef<'_>) -> String {
    let mut out = String::new();
    let mut space = false;
    for piece in el.text() {
        for c in piece.chars() {
            if c.is_whitespace() {
                space = !out.is_empty();
                continue;
            }
            let room = MAX_TEXT - out.len();
            if c.len_utf8() + usize::from(space) > room {
                return out;
            }
            if space {
                out.push(' ');
                space = false;
            }
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn titles_links_and_fields() {
        let html = r#"<html><head><title> Shop
            Home </title><base href="/shop/"></head><body>
            <h1>Deals</h1><span class="price">1.99</span><span class="price">2.99</span>
            <a href="item/1">one</a><a href="http://other.test/x#y">out</a>
            <a href="mailto:a@b.c">mail</a><map><area href="/z"></map></body></html>"#;
        let page = Url::parse("http://shop.test/index.html").unwrap();
        let selects = [
            Select::parse("title=h1").unwrap(),
            Select::parse("price=.price").unwrap(),
            Select::parse("missing=.nothing").unwrap(),
        ];
        let e = extract(html, &page, &selects, false, None);
        assert_eq!(e.title.as_deref(), Some("Shop Home"));
        let links: Vec<&str> = e.links.iter().map(Url::as_str).collect();
        assert_eq!(
            links,
            [
                "http://shop.test/shop/item/1",
                "http://other.test/x#y",
                "mailto:a@b.c",
                "http://shop.test/z"
            ]
        );
        assert_eq!(e.fields["title"], "Deals");
        assert_eq!(e.fields["price"], "1.99");
        assert_eq!(e.fields["missing"], serde_json::Value::Null);
        let all = extract(html, &page, &selects, true, None);
        assert_eq!(all.fields["price"], serde_json::json!(["1.99", "2.99"]));
        assert!(Select::parse("nocss").is_err());
        assert!(Select::parse("x=[[[").is_err());
    }

    #[test]
    fn a_page_nested_too_deep_yields_the_links_before_the_cap() {
        let page = Url::parse("http://shop.test/").unwrap();
        let html = format!(
            "<title>Deep</title><a href=\"/one\">1</a>{}<a href=\"/lost\">2</a>",
            "<div>".repeat(100_000)
        );
        let e = extract(&html, &page, &[], false, None);
        assert_eq!(e.title.as_deref(), Some("Deep"));
        assert_eq!(e.links, [Url::parse("http://shop.test/one").unwrap()]);
        assert_eq!(e.stopped, Some(HtmlError::TooDeep));
    }

    #[test]
    fn titles_and_fields_are_cut_to_their_caps() {
        let page = Url::parse("http://shop.test/").unwrap();
        let big = "é word ".repeat(20_000);
        let html = format!(
            "<title>{big}</title><p class=x>{big}</p>{}",
            "<i class=y>ab  cd</i>".repeat(5_000)
        );
        let selects = [
            Select::parse("x=.x").unwrap(),
            Select::parse("y=.y").unwrap(),
        ];
        let e = extract(&html, &page, &selects, false, None);
        let title = e.title.unwrap();
        assert!(
            title.len() <= MAX_TEXT && title.len() > MAX_TEXT - 8,
            "{}",
            title.len()
        );
        assert!(title.starts_with("é word é"));
        assert!(e.fields["x"].as_str().unwrap().len() <= MAX_TEXT);
        assert_eq!(e.fields["y"], "ab cd");
        let all = extract(&html, &page, &selects, true, None);
        assert_eq!(all.fields["y"].as_array().unwrap().len(), MAX_MATCHES);
        assert_eq!(all.fields["x"].as_array().unwrap().len(), 1);
        let line = serde_json::to_string(&all.fields).unwrap();
        assert!(line.len() < 2 * MAX_FIELD, "{}", line.len());
    }

    #[test]
    fn a_huge_flat_page_yields_a_bounded_result_and_says_why() {
        let page = Url::parse("http://shop.test/").unwrap();
        // 10 MiB: a link every 64 bytes, then a flood of `<br>`.
        let links = "<a href=\"/l\">x</a><br><br><br><br><br><br><br><br>".repeat(4_000);
        let html = format!(
            "<title>t</title>{links}{}",
            "<br>".repeat(10 * 1024 * 1024 / 4)
        );
        let e = extract(&html, &page, &[], false, None);
        assert_eq!(e.stopped, Some(HtmlError::TooManyNodes));
        assert_eq!(e.title.as_deref(), Some("t"));
        assert_eq!(e.links.len(), 4_000);
        let many = "<a href=\"/l\">x</a>".repeat(200_000);
        let e = extract(&many, &page, &[], false, None);
        assert_eq!(e.stopped, Some(HtmlError::TooManyNodes));
        assert_eq!(e.links.len(), MAX_LINKS);
    }
}
