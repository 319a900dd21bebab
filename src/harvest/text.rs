//! The `text` format: every `[scheme://][user:pass@]host:port` token found
//! anywhere in a body, so raw lists, CSV, HTML and JSON that merely contain
//! addresses all work.

use super::{Candidates, SourceScheme};

/// Scans `body` for proxy tokens and pushes them into `out` until it is full.
pub fn parse(body: &str, default: SourceScheme, out: &mut Candidates) {
    let _ = (body, default, out);
    todo!("text parser")
}
