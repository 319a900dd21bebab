//! Fetching source bodies.
