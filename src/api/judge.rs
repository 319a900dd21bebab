//! `GET /judge`: answers with the remote address and every request header
//! as received, plus a fixed marker, as JSON. Checks through proxies ask it
//! so that an instance with a public address can be its own judge. Secrets
//! a client or proxy sends (`Authorization`, `Cookie`,
//! `Proxy-Authorization`) are never echoed, and the answer is bounded so
//! that a request with huge headers cannot make it an amplifier.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Uri};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

pub use crate::check::judge::JUDGE_MARKER;

/// The judge's answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct JudgeAnswer {
    /// Always [`JUDGE_MARKER`].
    pub marker: &'static str,
    /// The peer address of the connection (`ip:port`).
    pub remote_addr: String,
    /// The request method.
    pub method: String,
    /// Path and query as received (the checker's nonce is in the query).
    pub url: String,
    /// Request headers; repeated ones joined with `, `. Secret values read
    /// [`REDACTED`]; long values are cut at [`MAX_VALUE`] bytes and headers
    /// past [`MAX_HEADER_BYTES`] in all are left out.
    pub headers: BTreeMap<String, String>,
    /// True when something was cut or left out to keep the answer bounded.
    pub truncated: bool,
}

/// Headers whose values are never echoed: credentials of the client, or of
/// the proxy a check goes through.
const SECRET_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

/// What a secret header's value reads as.
pub const REDACTED: &str = "<redacted>";

/// The longest header value or URL echoed, in bytes.
pub const MAX_VALUE: usize = 2048;

/// The most header bytes (names and values) echoed in all.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;

/// `s` cut to at most `max` bytes on a character boundary.
fn cut(mut s: String, max: usize, truncated: &mut bool) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        *truncated = true;
    }
    s
}

/// Builds the answer for a request.
pub async fn judge(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Json<JudgeAnswer> {
    let mut truncated = false;
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut total = 0;
    for (name, value) in &headers {
        let name = name.as_str();
        if SECRET_HEADERS.contains(&name) {
            out.insert(name.to_owned(), REDACTED.to_owned());
            continue;
        }
        let v = cut(
            String::from_utf8_lossy(value.as_bytes()).into_owned(),
            MAX_VALUE,
            &mut truncated,
        );
        if total + name.len() + v.len() > MAX_HEADER_BYTES {
            truncated = true;
            continue;
        }
        total += name.len() + v.len();
        match out.get_mut(name) {
            Some(e) if e.len() + v.len() <= MAX_VALUE => {
                e.push_str(", ");
                e.push_str(&v);
            }
            Some(_) => truncated = true,
            None => {
                out.insert(name.to_owned(), v);
            }
        }
    }
    let url = uri
        .path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned());
    Json(JudgeAnswer {
        marker: JUDGE_MARKER,
        remote_addr: peer.to_string(),
        method: method.to_string(),
        url: cut(url, MAX_VALUE, &mut truncated),
        headers: out,
        truncated,
    })
}

/// A router serving only `/judge`. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
pub fn router() -> Router {
    Router::new().route("/judge", get(judge))
}
