//! The `json` format: a list of items with configurable paths to the item
//! list and to each field; the defaults handle the common shapes.

use super::{Candidates, SourceScheme};

/// Paths into the document. A path starting with `/` is a JSON pointer;
/// otherwise it is a key, with `.` separating nested keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JsonOptions {
    /// Path to the array of items (from the document root).
    pub items: Option<String>,
    /// Path to the address within an item.
    pub ip: Option<String>,
    /// Path to the port within an item.
    pub port: Option<String>,
    /// Path to the country code within an item.
    pub country: Option<String>,
    /// Path to the protocol list or string within an item.
    pub protocols: Option<String>,
    /// Path to the anonymity level within an item.
    pub anonymity: Option<String>,
    /// Path to the HTTPS flag within an item.
    pub https: Option<String>,
}

/// Why a JSON body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The body is not JSON.
    #[error("invalid JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    /// The configured or default item path found no array.
    #[error("{0}")]
    NoItems(String),
}

/// Parses `body`, pushing candidates into `out` until it is full.
pub fn parse(
    body: &str,
    opts: &JsonOptions,
    default: SourceScheme,
    out: &mut Candidates,
) -> Result<(), JsonError> {
    let _ = (body, opts, default, out);
    todo!("json parser")
}
