//! The HTTP API. So far: the judge endpoint that lets an instance with a
//! public address be its own judge.

pub mod judge;
