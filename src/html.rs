//! Bounded HTML parsing, shared by harvest (proxy tables) and crawl (links
//! and fields): html5ever (via `scraper`) fed in small chunks, stopped once
//! the tree nests deeper than [`MAX_DEPTH`] or a deadline passes.
//!
//! html5ever's cost per element grows with the nesting depth (its scope
//! checks walk the stack of open elements), so a page of tens of thousands
//! of nested elements would take minutes: the depth cap keeps every page
//! cheap, and the chunks let a deadline stop it.

use std::borrow::Cow;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use html5ever::interface::{ElementFlags, NodeOrText, QuirksMode, TreeSink};
use html5ever::tendril::{StrTendril, TendrilSink};
use html5ever::{Attribute, QualName};
use scraper::{Html, HtmlTreeSink};

/// The deepest element nesting parsed. Browsers stop nesting at 512 (Chromium
/// flattens deeper markup); a proxy list needs a few dozen levels. Deeper
/// pages are refused rather than parsed at a cost that grows with depth.
pub const MAX_DEPTH: usize = 1024;

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
}

/// Runs html5ever over `body` in chunks, stopping when the tree gets too
/// deep or `deadline` passes; what was read up to there is kept.
/// Synchronous and CPU-bound: call it off the async runtime.
pub fn parse_document(body: &str, deadline: Option<Deadline>) -> Parsed {
    let too_deep = Rc::new(Cell::new(false));
    let sink = DepthCap {
        inner: HtmlTreeSink::new(Html::new_document()),
        too_deep: too_deep.clone(),
    };
    let mut parser = html5ever::driver::parse_document(sink, Default::default()).from_utf8();
    let mut stopped = None;
    for chunk in body.as_bytes().chunks(CHUNK) {
        parser.process(chunk.into());
        if too_deep.get() {
            stopped = Some(HtmlError::TooDeep);
            break;
        }
        if let Some(d) = deadline
            && d.started.elapsed() > d.allowed
        {
            stopped = Some(HtmlError::TooSlow(d.allowed, d.setting));
            break;
        }
    }
    // Closing what is open costs one step per open element: at most a
    // chunk's worth beyond the cap.
    let doc = parser.finish();
    Parsed { doc, stopped }
}

/// scraper's tree sink, noting when an element is appended deeper than
/// [`MAX_DEPTH`]. The tree builder cannot be stopped from inside the sink,
/// so the feeding loop checks the flag after each chunk.
struct DepthCap {
    inner: HtmlTreeSink,
    too_deep: Rc<Cell<bool>>,
}

impl DepthCap {
    /// Flags the tree when `parent` is already [`MAX_DEPTH`] deep. Counting
    /// stops at the cap, so this costs at most that many steps per element.
    fn check(&self, parent: &<HtmlTreeSink as TreeSink>::Handle) {
        if self.too_deep.get() {
            return;
        }
        let html = self.inner.0.borrow();
        let depth = html
            .tree
            .get(*parent)
            .map_or(0, |n| n.ancestors().take(MAX_DEPTH).count());
        if depth >= MAX_DEPTH {
            self.too_deep.set(true);
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
        self.inner.create_element(name, attrs, flags)
    }
    fn create_comment(&self, text: StrTendril) -> Handle {
        self.inner.create_comment(text)
    }
    fn create_pi(&self, target: StrTendril, data: StrTendril) -> Handle {
        self.inner.create_pi(target, data)
    }
    fn append(&self, parent: &Handle, child: NodeOrText<Handle>) {
        if matches!(child, NodeOrText::AppendNode(_)) {
            self.check(parent);
        }
        self.inner.append(parent, child)
    }
    fn append_based_on_parent_node(
        &self,
        element: &Handle,
        prev_element: &Handle,
        child: NodeOrText<Handle>,
    ) {
        if matches!(child, NodeOrText::AppendNode(_)) {
            self.check(prev_element);
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
        self.inner.append_before_sibling(sibling, new_node)
    }
    fn add_attrs_if_missing(&self, target: &Handle, attrs: Vec<Attribute>) {
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
        let started = Instant::now();
        let parsed = parse_document(&page, None);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(parsed.stopped, Some(HtmlError::TooDeep));
        assert_eq!(links(&parsed.doc), ["/before"]);

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
}
