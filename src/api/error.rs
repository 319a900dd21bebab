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
    /// The request does not fit the resource's state (a finished crawl
    /// job cannot be cancelled).
    #[error("{0}")]
    Conflict(String),
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
    /// The daemon cannot answer this yet (no judge has answered).
    #[error("{0}")]
    NotReady(String),
    /// Switched off by configuration.
    #[error("{0}")]
    Disabled(String),
    /// The route exists but not for this method.
    #[error("method not allowed on this route")]
    MethodNotAllowed,
    /// The request target is longer than the API reads.
    #[error("request URI longer than {0} bytes")]
    UriTooLong(usize),
    /// A body sent as anything but `application/json`: what a web page can
    /// send cross-site without the browser asking first.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// Without a token, a `Host` this API does not answer to (DNS
    /// rebinding); the message names `api.allowed_hosts`.
    #[error("{0}")]
    HostNotAllowed(String),
    /// A browser says another site's page made the request.
    #[error("{0}")]
    CrossSite(String),
    /// A queue the client would add to is full; the message names its
    /// limit.
    #[error("{message}")]
    QueueFull {
        /// What is full, and its limit.
        message: String,
        /// Seconds after which trying again may succeed.
        retry_after: u64,
    },
    /// The request's headers are larger than the API reads.
    #[error("request headers larger than {0} bytes in all, or more than {1} of them")]
    HeadersTooLarge(usize, usize),
    /// An error answered below the handlers (an extractor's rejection, the
    /// HTTP layer), put into the envelope with its status and text.
    #[error("{message}")]
    Other {
        /// The status it was answered with.
        status: StatusCode,
        /// What it said.
        message: String,
    },
    /// The disk refuses the database's writes (full, read-only, failing):
    /// what needs a write waits until it takes them again; the message says
    /// why, which is the operator's to fix, not a secret.
    #[error("{0}; try again later")]
    Unwritable(String),
    /// The store failed; details are logged.
    #[error("internal error")]
    Store(crate::store::StoreError),
    /// Anything else unexpected; details are logged.
    #[error("internal error")]
    Internal(String),
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> ApiError {
        match e.write_failure() {
            Some(_) => ApiError::Unwritable(e.to_string()),
            None => ApiError::Store(e),
        }
    }
}

impl ApiError {
    /// The HTTP status for this error.
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) | ApiError::Disabled(_) => StatusCode::NOT_FOUND,
            ApiError::Conflict(_) => StatusCode::CONFLICT,
            ApiError::TooManyRequests { .. } | ApiError::QueueFull { .. } => {
                StatusCode::TOO_MANY_REQUESTS
            }
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ApiError::HostNotAllowed(_) => StatusCode::MISDIRECTED_REQUEST,
            ApiError::CrossSite(_) => StatusCode::FORBIDDEN,
            ApiError::Timeout | ApiError::NotReady(_) | ApiError::Unwritable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            ApiError::HeadersTooLarge(..) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::Other { status, .. } => *status,
            ApiError::Store(_) | ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "bad_request",
            ApiError::Unauthorized => "unauthorized",
            ApiError::NotFound(_) | ApiError::Disabled(_) => "not_found",
            ApiError::Conflict(_) => "conflict",
            ApiError::TooManyRequests { .. } | ApiError::QueueFull { .. } => "too_many_requests",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::UnsupportedMediaType(_) => "unsupported_media_type",
            ApiError::HostNotAllowed(_) => "host_not_allowed",
            ApiError::CrossSite(_) => "cross_site",
            ApiError::Timeout => "timeout",
            ApiError::NotReady(_) => "not_ready",
            ApiError::Unwritable(_) => "unavailable",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::UriTooLong(_) => "uri_too_long",
            ApiError::HeadersTooLarge(..) => "headers_too_large",
            ApiError::Other { status, .. } => match status.as_u16() {
                400 | 422 => "bad_request",
                401 => "unauthorized",
                404 => "not_found",
                405 => "method_not_allowed",
                413 => "payload_too_large",
                414 => "uri_too_long",
                415 => "unsupported_media_type",
                421 => "host_not_allowed",
                429 => "too_many_requests",
                431 => "headers_too_large",
                503 => "unavailable",
                s if s >= 500 => "internal",
                _ => "client_error",
            },
            ApiError::Store(_) | ApiError::Internal(_) => "internal",
        }
    }
}

/// Marks a response as an [`ApiError`] in the envelope, with its message.
#[derive(Clone, Debug)]
pub(super) struct Enveloped(pub(super) String);

/// Marks `resp` (a page of the dashboard, say) as answered in its own form:
/// the outer layer then leaves it out of the JSON envelope whatever its
/// status.
pub(super) fn keep_as_is(mut resp: Response) -> Response {
    let message = resp
        .status()
        .canonical_reason()
        .unwrap_or("")
        .to_lowercase();
    resp.extensions_mut().insert(Enveloped(message));
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match &self {
            ApiError::Store(e) => tracing::error!(error = %e, "store failed during a request"),
            ApiError::Internal(e) => tracing::error!(error = %e, "request failed"),
            _ => {}
        }
        let message = self.to_string();
        let body = serde_json::json!({
            "error": { "code": self.code(), "message": message }
        });
        let mut resp = (self.status_code(), Json(body)).into_response();
        // Lets the outer layer tell an enveloped error from a foreign one,
        // and give `/proxy?format=text` the message as text.
        resp.extensions_mut().insert(Enveloped(message));
        match self {
            ApiError::Unauthorized => {
                resp.headers_mut().insert(
                    axum::http::header::WWW_AUTHENTICATE,
                    axum::http::HeaderValue::from_static("Bearer"),
                );
            }
            ApiError::TooManyRequests { retry_after } | ApiError::QueueFull { retry_after, .. } => {
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
