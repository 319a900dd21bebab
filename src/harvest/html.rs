//! The `html` format: the table whose header names an IP and a port column,
//! other columns recognised by their header.

use super::{Candidates, SourceScheme};

/// Which table and columns to read; every field is optional and falls back
/// to recognising the table by its headers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HtmlOptions {
    /// A CSS selector for the table (validated when the config is loaded).
    pub table: Option<String>,
    /// Header texts naming the columns, overriding recognition.
    pub columns: HtmlColumns,
}

/// Header texts of the columns to read (matched case-insensitively).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HtmlColumns {
    /// The address column (may also hold `host:port`).
    pub ip: Option<String>,
    /// The port column.
    pub port: Option<String>,
    /// The two-letter country code column.
    pub country: Option<String>,
    /// The anonymity column.
    pub anonymity: Option<String>,
    /// The HTTPS yes/no column.
    pub https: Option<String>,
    /// The protocol/type column.
    pub protocol: Option<String>,
}

/// Parses `body` (synchronous and CPU-bound: call it off the async runtime).
pub fn parse(body: &str, opts: &HtmlOptions, default: SourceScheme, out: &mut Candidates) {
    let _ = (body, opts, default, out);
    todo!("html parser")
}
