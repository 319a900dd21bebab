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

/// Why a page was not parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum HtmlError {
    /// The markup nests elements deeper than [`MAX_DEPTH`].
    #[error("HTML nested deeper than {MAX_DEPTH} elements; not parsed")]
    TooDeep,
    /// Parsing did not finish within the time allowed.
    #[error("parsing the HTML took longer than {} (harvest.timeout); stopped", humantime::format_duration(*.0))]
    TooSlow(Duration),
}

/// Runs html5ever over `body` in chunks, stopping when the tree gets too
/// deep or `limit` is over.
pub fn parse_document(body: &str, limit: Option<(Instant, Duration)>) -> Result<Html, HtmlError> {
    let too_deep = Rc::new(Cell::new(false));
    let sink = DepthCap {
        inner: HtmlTreeSink::new(Html::new_document()),
        too_deep: too_deep.clone(),
    };
    let mut parser = html5ever::driver::parse_document(sink, Default::default()).from_utf8();
    for chunk in body.as_bytes().chunks(CHUNK) {
        parser.process(chunk.into());
        if too_deep.get() {
            return Err(HtmlError::TooDeep);
        }
        if let Some((started, allowed)) = limit
            && started.elapsed() > allowed
        {
            return Err(HtmlError::TooSlow(allowed));
        }
    }
    let doc = parser.finish();
    Ok(doc)
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
