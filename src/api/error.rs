//! The API's one error type: every failure becomes
//! `{"error": {"code": "...", "message": "..."}}` with its status. Internal
//! details are logged, never sent.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// A parameter or body is invalid; the message names it.
    #[error("{0}")]
    BadRequest(String),
    /// Missing or wrong bearer token.
    #[error("missing or invalid bearer token")]
    Unauthorized,
    /// Nothing matches (no proxy, unknown id, unknown route).
    #[error("{0}")]
    NotFound(String),
    /// The client asks too often; it may ask again in `retry_after` seconds.
    #[error("too many requests; try again in {retry_after} s")]
    TooManyRequests {
        /// Seconds until the next request is allowed (the `Retry-After`).
        retry_after: u64,
    },
    /// The request body is larger than the API accepts.
    #[error("request body larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// The request took longer than `api.request_timeout`.
    #[error("the request took too long (api.request_timeout)")]
    Timeout,
    /// Switched off by configuration.
    #[error("{0}")]
    Disabled(String),
    /// The store failed; details are logged.
    #[error("internal error")]
    Store(#[from] crate::store::StoreError),
    /// Anything else unexpected; details are logged.
    #[error("internal error")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status for this error.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) | ApiError::Disabled(_) => StatusCode::NOT_FOUND,
            ApiError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Store(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) | ApiError::Disabled(_) => "not_found",
            ApiError::TooManyRequests { .. } => "too_many_requests",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::Timeout => "timeout",
            ApiError::Store(_) | ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Store(e) => tracing::error!(error = %e, "store failed during a request"),
            ApiError::Internal(e) => tracing::error!(error = %e, "request failed"),
            _ => {}
        }
        let body = serde_json::json!({
            "error": { "code": self.code(), "message": self.to_string() }
        });
        let mut resp = (self.status_code(), Json(body)).into_response();
        match self {
            ApiError::Unauthorized => {
                resp.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer"),
                );
            }
            ApiError::TooManyRequests { retry_after } => {
                resp.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(retry_after),
                );
            }
            _ => {}
        }
        resp
    }
}
