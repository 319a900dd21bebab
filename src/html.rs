//! Bounded HTML parsing, shared by harvest (proxy tables) and crawl (links
//! and fields): html5ever (via `scraper`) fed in small chunks, stopped once
//! the tree nests deeper than [`MAX_DEPTH`], holds more than [`MAX_NODES`]
//! nodes or [`MAX_ATTRIBUTES`] attributes, or a deadline passes; a tag with
//! more than [`MAX_TAG_ATTRIBUTES`] attributes ends the document before it.
//! At most [`parsers`] documents are parsed at once in a process.
//!
//! html5ever's cost per element grows with the nesting depth (its scope
//! checks walk the stack of open elements), so a page of tens of thousands
//! of nested elements would take minutes: the depth cap keeps every page
//! cheap, and the chunks let a deadline stop it. A tree costs about 150
//! bytes a node, so a flat 10 MiB page of `<br>` would take 350 MB: the node
//! cap holds a page's tree to a few tens of MB.

use std::borrow::Cow;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use html5ever::interface::{ElementFlags, NodeOrText, QuirksMode, TreeSink};
use html5ever::tendril::{StrTendril, TendrilSink};
use html5ever::{Attribute, QualName};
use scraper::{Html, HtmlTreeSink};

/// The deepest element nesting parsed. Browsers stop nesting at 512 (Chromium
/// flattens deeper markup); a proxy list needs a few dozen levels. Deeper
/// pages are refused rather than parsed at a cost that grows with depth.
pub const MAX_DEPTH: usize = 1024;

/// The most nodes (elements, comments, runs of text) a document's tree
/// holds: about 30 MB of tree. Large real pages have tens of thousands.
pub const MAX_NODES: usize = 200_000;

/// The most attributes a document's elements hold together.
pub const MAX_ATTRIBUTES: usize = 200_000;

/// The most attributes one tag may have. html5ever compares each attribute
/// of a tag with every one before it (duplicates are dropped), so a tag of
/// 400,000 attributes would take minutes of CPU before the tree sees it:
/// the document ends before such a tag instead.
pub const MAX_TAG_ATTRIBUTES: usize = 1_000;

/// Bytes handed to the parser between two looks at the clock and the depth.
/// At most [`MAX_DEPTH`] levels deep, a chunk this size parses in well under
/// a millisecond, so a deadline is kept to that precision.
const CHUNK: usize = 4 * 1024;

/// Why parsing stopped before the end of a page.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HtmlError {
    /// The markup nests elements deeper than [`MAX_DEPTH`].
    #[error("HTML nested deeper than {MAX_DEPTH} elements; not parsed")]
    TooDeep,
    /// The document has more than [`MAX_NODES`] nodes.
    #[error("HTML with more than {MAX_NODES} nodes; not parsed past them")]
    TooManyNodes,
    /// The document's elements have more than [`MAX_ATTRIBUTES`] attributes
    /// together, or one tag more than [`MAX_TAG_ATTRIBUTES`].
    #[error(
        "HTML with more than {MAX_ATTRIBUTES} attributes, or a tag with more than \
         {MAX_TAG_ATTRIBUTES}; not parsed past them"
    )]
    TooManyAttributes,
    /// Parsing did not finish within the time allowed.
    #[error("parsing the HTML took longer than {} ({}); stopped", humantime::format_duration(*.0), .1)]
    TooSlow(Duration, &'static str),
}

/// The time a parse may take: counted from `started` (so that a wait for a
/// blocking thread counts too), `allowed` long, and the setting that says
/// so, named in the error.
#[derive(Clone, Copy, Debug)]
pub struct Deadline {
    /// When the time started.
    pub started: Instant,
    /// How long from then.
    pub allowed: Duration,
    /// The setting behind `allowed`, e.g. `harvest.timeout`.
    pub setting: &'static str,
}

/// A document, whole or as far as the parser got.
#[derive(Debug)]
pub struct Parsed {
    /// The tree: every element read before parsing stopped, closed as a
    /// browser closes a page cut off there.
    pub doc: Html,
    /// Why parsing stopped before the end, if it did.
    pub stopped: Option<HtmlError>,
    /// The bytes of the body the parser was given: all of it, unless it
    /// stopped early.
    pub read: usize,
}

/// Runs html5ever over `body` in chunks, stopping when the tree gets too
/// deep or `deadline` passes; what was read up to there is kept.
/// Synchronous and CPU-bound: call it off the async runtime.
pub fn parse_document(body: &str, deadline: Option<Deadline>) -> Parsed {
    let caps = Rc::new(Caps::default());
    let sink = DepthCap {
        inner: HtmlTreeSink::new(Html::new_document()),
        caps: caps.clone(),
    };
    let mut parser = html5ever::driver::parse_document(sink, Default::default()).from_utf8();
    // A tag html5ever would spend minutes on ends the document before it.
    let crowded = crowded_tag(body.as_bytes());
    let read = &body.as_bytes()[..crowded.unwrap_or(body.len())];
    let mut stopped = None;
    let mut given = 0;
    for chunk in read.chunks(CHUNK) {
        parser.process(chunk.into());
        given += chunk.len();
        if let Some(over) = caps.over() {
            stopped = Some(over);
            break;
        }
        if let Some(d) = deadline
            && d.started.elapsed() > d.allowed
        {
            stopped = Some(HtmlError::TooSlow(d.allowed, d.setting));
            break;
        }
    }
    if stopped.is_none() && crowded.is_some() {
        stopped = Some(HtmlError::TooManyAttributes);
    }
    // Closing what is open costs one step per open element: at most a
    // chunk's worth beyond the cap.
    let doc = parser.finish();
    Parsed {
        doc,
        stopped,
        read: given,
    }
}

/// How many documents are parsed at once in this process: about one per
/// core. A parse is CPU work holding a tree of up to [`MAX_NODES`]; more at
/// once would only add memory, not speed.
pub fn parsers() -> &'static tokio::sync::Semaphore {
    static PARSERS: LazyLock<tokio::sync::Semaphore> = LazyLock::new(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        tokio::sync::Semaphore::new(cores.clamp(1, 16))
    });
    &PARSERS
}

/// The byte offset of the first tag (`<` and a letter, up to its `>`) with
/// more than [`MAX_TAG_ATTRIBUTES`] attributes, if there is one. A scan of
/// the bytes that does not know where scripts or comments are: text there
/// that looks like such a tag ends the document too, which takes a
/// thousand words between a `<` and the next `>`.
fn crowded_tag(b: &[u8]) -> Option<usize> {
    let blank = |c: u8| c.is_ascii_whitespace() || c == b'/';
    let mut i = 0;
    while let Some(at) = memchr::memchr(b'<', &b[i..]) {
        let start = i + at;
        let mut j = start + 1;
        if !b.get(j).is_some_and(u8::is_ascii_alphabetic) {
            i = j;
            continue;
        }
        while j < b.len() && !blank(b[j]) && b[j] != b'>' {
            j += 1;
        }
        let mut attributes = 0;
        loop {
            while j < b.len() && blank(b[j]) {
                j += 1;
            }
            if j >= b.len() {
                return None;
            }
            if b[j] == b'>' {
                j += 1;
                break;
            }
            attributes += 1;
            if attributes > MAX_TAG_ATTRIBUTES {
                return Some(start);
            }
            // The name (its first character may be anything, `=` too).
            j += 1;
            while j < b.len() && !blank(b[j]) && !matches!(b[j], b'=' | b'>') {
                j += 1;
            }
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            if b.get(j) != Some(&b'=') {
                continue;
            }
            j += 1;
            while j < b.len() && b[j].is_ascii_whitespace() {
                j += 1;
            }
            match b.get(j) {
                Some(&q @ (b'"' | b'\'')) => match memchr::memchr(q, &b[j + 1..]) {
                    Some(end) => j += end + 2,
                    None => return None,
                },
                _ => {
                    while j < b.len() && !b[j].is_ascii_whitespace() && b[j] != b'>' {
                        j += 1;
                    }
                }
            }
        }
        i = j;
    }
    None
}

/// What the tree holds so far, against its caps.
#[derive(Default)]
struct Caps {
    too_deep: Cell<bool>,
    nodes: Cell<usize>,
    attributes: Cell<usize>,
}

impl Caps {
    /// The first cap passed, if any.
    fn over(&self) -> Option<HtmlError> {
        if self.too_deep.get() {
            Some(HtmlError::TooDeep)
        } else if self.nodes.get() > MAX_NODES {
            Some(HtmlError::TooManyNodes)
        } else if self.attributes.get() > MAX_ATTRIBUTES {
            Some(HtmlError::TooManyAttributes)
        } else {
            None
        }
    }

    fn node(&self) {
        self.nodes.set(self.nodes.get().saturating_add(1));
    }
}

/// scraper's tree sink, noting when an element is appended deeper than
/// [`MAX_DEPTH`] and counting nodes and attributes. The tree builder cannot
/// be stopped from inside the sink, so the feeding loop checks the caps
/// after each chunk.
struct DepthCap {
    inner: HtmlTreeSink,
    caps: Rc<Caps>,
}

impl DepthCap {
    /// Flags the tree when `parent` is already [`MAX_DEPTH`] deep. Counting
    /// stops at the cap, so this costs at most that many steps per element.
    fn check(&self, parent: &<HtmlTreeSink as TreeSink>::Handle) {
        if self.caps.too_deep.get() {
            return;
        }
        let html = self.inner.0.borrow();
        let depth = html
            .tree
            .get(*parent)
            .map_or(0, |n| n.ancestors().take(MAX_DEPTH).count());
        if depth >= MAX_DEPTH {
            self.caps.too_deep.set(true);
        }
    }
}

type Handle = <HtmlTreeSink as TreeSink>::Handle;

impl TreeSink for DepthCap {
    type Handle = Handle;
    type Output = Html;
    type ElemName<'a> = <HtmlTreeSink as TreeSink>::ElemName<'a>;

    fn finish(self) -> Html {
        self.inner.finish()
    }
    fn parse_error(&self, msg: Cow<'static, str>) {
        self.inner.parse_error(msg)
    }
    fn get_document(&self) -> Handle {
        self.inner.get_document()
    }
    fn elem_name<'a>(&'a self, target: &'a Handle) -> Self::ElemName<'a> {
        self.inner.elem_name(target)
    }
    fn create_element(&self, name: QualName, attrs: Vec<Attribute>, flags: ElementFlags) -> Handle {
        self.caps.node();
        let a = &self.caps.attributes;
        a.set(a.get().saturating_add(attrs.len()));
        self.inner.create_element(name, attrs, flags)
    }
    fn create_comment(&self, text: StrTendril) -> Handle {
        self.caps.node();
        self.inner.create_comment(text)
    }
    fn create_pi(&self, target: StrTendril, data: StrTendril) -> Handle {
        self.caps.node();
        self.inner.create_pi(target, data)
    }
    fn append(&self, parent: &Handle, child: NodeOrText<Handle>) {
        match child {
            NodeOrText::AppendNode(_) => self.check(parent),
            // A run of text may join the one before it; counted anyway.
            NodeOrText::AppendText(_) => self.caps.node(),
        }
        self.inner.append(parent, child)
    }
    fn append_based_on_parent_node(
        &self,
        element: &Handle,
        prev_element: &Handle,
        child: NodeOrText<Handle>,
    ) {
        match child {
            NodeOrText::AppendNode(_) => self.check(prev_element),
            NodeOrText::AppendText(_) => self.caps.node(),
        }
        self.inner
            .append_based_on_parent_node(element, prev_element, child)
    }
    fn append_doctype_to_document(
        &self,
        name: StrTendril,
        public_id: StrTendril,
        system_id: StrTendril,
    ) {
        self.inner
            .append_doctype_to_document(name, public_id, system_id)
    }
    fn mark_script_already_started(&self, node: &Handle) {
        self.inner.mark_script_already_started(node)
    }
    fn pop(&self, node: &Handle) {
        self.inner.pop(node)
    }
    fn get_template_contents(&self, target: &Handle) -> Handle {
        self.inner.get_template_contents(target)
    }
    fn same_node(&self, x: &Handle, y: &Handle) -> bool {
        self.inner.same_node(x, y)
    }
    fn set_quirks_mode(&self, mode: QuirksMode) {
        self.inner.set_quirks_mode(mode)
    }
    fn append_before_sibling(&self, sibling: &Handle, new_node: NodeOrText<Handle>) {
        if matches!(new_node, NodeOrText::AppendText(_)) {
            self.caps.node();
        }
        self.inner.append_before_sibling(sibling, new_node)
    }
    fn add_attrs_if_missing(&self, target: &Handle, attrs: Vec<Attribute>) {
        let a = &self.caps.attributes;
        a.set(a.get().saturating_add(attrs.len()));
        self.inner.add_attrs_if_missing(target, attrs)
    }
    fn associate_with_form(
        &self,
        target: &Handle,
        form: &Handle,
        nodes: (&Handle, Option<&Handle>),
    ) {
        self.inner.associate_with_form(target, form, nodes)
    }
    fn remove_from_parent(&self, target: &Handle) {
        self.inner.remove_from_parent(target)
    }
    fn reparent_children(&self, node: &Handle, new_parent: &Handle) {
        self.inner.reparent_children(node, new_parent)
    }
    fn is_mathml_annotation_xml_integration_point(&self, handle: &Handle) -> bool {
        self.inner
            .is_mathml_annotation_xml_integration_point(handle)
    }
    fn set_current_line(&self, line_number: u64) {
        self.inner.set_current_line(line_number)
    }
    fn allow_declarative_shadow_roots(&self, intended_parent: &Handle) -> bool {
        self.inner.allow_declarative_shadow_roots(intended_parent)
    }
    fn attach_declarative_shadow(
        &self,
        location: &Handle,
        template: &Handle,
        attrs: &[Attribute],
    ) -> bool {
        self.inner
            .attach_declarative_shadow(location, template, attrs)
    }
    fn maybe_clone_an_option_into_selectedcontent(&self, option: &Handle) {
        self.inner
            .maybe_clone_an_option_into_selectedcontent(option)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use scraper::Selector;

    fn links(doc: &Html) -> Vec<String> {
        let a = Selector::parse("a[href]").unwrap();
        doc.select(&a)
            .filter_map(|e| e.value().attr("href"))
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn a_page_too_deep_keeps_what_was_read_before_the_cap() {
        let page = format!(
            "<a href=\"/before\">b</a>{}<a href=\"/after\">a</a>",
            "<div>".repeat(100_000)
        );
        let parsed = parse_document(&page, None);
        assert_eq!(parsed.stopped, Some(HtmlError::TooDeep));
        assert_eq!(links(&parsed.doc), ["/before"]);
        // Stopped at the cap, the rest unread: ten times the levels cost
        // about what a tenth of them do, not ten times as much.
        let small = format!("<a href=\"/before\">b</a>{}", "<div>".repeat(10_000));
        let ratio = crate::growth::ratio(
            || assert!(parse_document(&small, None).stopped.is_some()),
            || assert!(parse_document(&page, None).stopped.is_some()),
        );
        assert!(ratio < 4.0, "10x the levels cost {ratio:.1}x");

        let flat = "<p><a href=\"/x\">x</a></p>".repeat(1000);
        let whole = parse_document(&flat, None);
        assert_eq!(whole.stopped, None);
        assert_eq!(links(&whole.doc).len(), 1000);
    }

    #[test]
    fn a_deadline_stops_the_parse_and_names_its_setting() {
        let page = "<p><a href=\"/x\">x</a></p>".repeat(10_000);
        let spent = Deadline {
            started: Instant::now(),
            allowed: Duration::ZERO,
            setting: "crawl.parse",
        };
        let parsed = parse_document(&page, Some(spent));
        let err = parsed.stopped.expect("stopped");
        assert_eq!(err, HtmlError::TooSlow(Duration::ZERO, "crawl.parse"));
        // The first chunk was read.
        assert!(!links(&parsed.doc).is_empty());
        assert!(links(&parsed.doc).len() < 10_000);
        assert_eq!(
            HtmlError::TooSlow(Duration::from_secs(30), "harvest.timeout").to_string(),
            "parsing the HTML took longer than 30s (harvest.timeout); stopped"
        );
    }

    #[test]
    fn a_flat_page_stops_at_the_node_cap_with_what_came_before() {
        // 10 MiB of `<br>`: 2.6 million elements parsed whole before.
        let page = format!(
            "<a href=\"/first\">f</a>{}<a href=\"/lost\">l</a>",
            "<br>".repeat(10 * 1024 * 1024 / 4)
        );
        let parsed = parse_document(&page, None);
        assert_eq!(parsed.stopped, Some(HtmlError::TooManyNodes));
        assert_eq!(links(&parsed.doc), ["/first"]);
        // At most a chunk's worth past the cap.
        let nodes = parsed.doc.tree.nodes().count();
        assert!(nodes <= MAX_NODES + CHUNK + 16, "{nodes}");
        assert_eq!(
            HtmlError::TooManyNodes.to_string(),
            "HTML with more than 200000 nodes; not parsed past them"
        );
    }

    #[test]
    fn a_tag_with_too_many_attributes_ends_the_document_before_it() {
        let crowded = |n: usize| {
            let attrs: String = (0..n).map(|i| format!(" a{i}=\"x>\"")).collect();
            format!("<a href=\"/before\">b</a><div{attrs}>text</div><a href=\"/after\">a</a>")
        };
        // At the cap the tag is read.
        let whole = parse_document(&crowded(MAX_TAG_ATTRIBUTES), None);
        assert_eq!(whole.stopped, None);
        assert_eq!(links(&whole.doc), ["/before", "/after"]);
        // 400,000 attributes: html5ever alone would take minutes on them.
        // The cap, not the clock, ends it here, as the reason says.
        let parsed = parse_document(&crowded(400_000), None);
        assert_eq!(parsed.stopped, Some(HtmlError::TooManyAttributes));
        assert_eq!(links(&parsed.doc), ["/before"]);
        // Unquoted, single-quoted and bare attributes count alike.
        let bare: String = (0..2_000).map(|i| format!(" b{i}")).collect();
        let mixed = format!("<p a=1 b='2' c>ok</p><p{bare}>");
        assert_eq!(crowded_tag(mixed.as_bytes()), mixed.find("<p b0"));
        assert_eq!(crowded_tag(b"<p a=1 b='2' c>ok</p><!-- < -->"), None);
    }

    #[test]
    fn the_attributes_of_a_document_are_capped() {
        let tag = format!(
            "<i{}></i>",
            (0..500).map(|i| format!(" a{i}")).collect::<String>()
        );
        let page = format!(
            "<a href=\"/first\">f</a>{}<a href=\"/lost\">l</a>",
            tag.repeat(MAX_ATTRIBUTES / 500 + 20)
        );
        let parsed = parse_document(&page, None);
        assert_eq!(parsed.stopped, Some(HtmlError::TooManyAttributes));
        assert_eq!(links(&parsed.doc), ["/first"]);
    }
}
