//! `GET /judge`: answers with the remote address and every request header
//! as received, plus a fixed marker, as JSON. Checks through proxies ask it
//! so that an instance with a public address can be its own judge.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::extract::ConnectInfo;
use axum::http::{HeaderMap, Method, Uri};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

pub use crate::check::judge::JUDGE_MARKER;

/// The judge's answer.
#[derive(Debug, Serialize)]
pub struct JudgeAnswer {
    /// Always [`JUDGE_MARKER`].
    pub marker: &'static str,
    /// The peer address of the connection (`ip:port`).
    pub remote_addr: String,
    /// The request method.
    pub method: String,
    /// Path and query as received (the checker's nonce is in the query).
    pub url: String,
    /// Request headers; repeated ones joined with `, `.
    pub headers: BTreeMap<String, String>,
}

/// Builds the answer for a request.
pub async fn judge(
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
) -> Json<JudgeAnswer> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in &headers {
        let v = String::from_utf8_lossy(value.as_bytes()).into_owned();
        out.entry(name.as_str().to_owned())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    Json(JudgeAnswer {
        marker: JUDGE_MARKER,
        remote_addr: peer.to_string(),
        method: method.to_string(),
        url: uri
            .path_and_query()
            .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        headers: out,
    })
}

/// A router serving only `/judge`. Serve it with
/// `into_make_service_with_connect_info::<SocketAddr>()`.
pub fn router() -> Router {
    Router::new().route("/judge", get(judge))
}
