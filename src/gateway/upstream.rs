//! The body of requests forwarded upstream: the connections they go on
//! are the pool's (see `pool::http1`).

/// The body of a request forwarded upstream (and of the answers the
/// gateway makes itself).
pub(super) type Body = crate::pool::Body;
