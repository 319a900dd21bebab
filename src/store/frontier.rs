//! Crawl frontiers: every URL a crawl has seen, its depth, parent and
//! state, and the crawl's settings and output lengths, keyed by job.
//! A crawl's loop works its frontier from a thread of its own that may
//! block, through a [`Frontier`] holding its own connection; finished
//! pages are committed in small batches (what the crawler handled in one
//! turn of its loop), so a crawl of millions of URLs keeps only queue
//! heads in memory and resumes after `kill -9`.

pub use super::sqlite::frontier::Frontier;
use super::{Store, StoreError, dispatch};

/// A URL's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UrlState {
    /// Waiting (or in flight: nothing marks a fetch as started, so a
    /// crash leaves it waiting and it is fetched again).
    Queued = 0,
    /// Fetched and written out.
    Done = 2,
    /// Failed for good (written out with its error).
    Failed = 3,
    /// Not fetched: robots.txt disallows it.
    Disallowed = 4,
}

/// A URL waiting in the frontier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queued {
    /// Row id: discovery order.
    pub id: i64,
    /// The normalised URL.
    pub url: String,
    /// Its host key (`host[:port]`): the politeness unit.
    pub host: String,
    /// Links from a seed.
    pub depth: u32,
    /// The page it was found on.
    pub parent: Option<String>,
}

/// A URL to add.
#[derive(Clone, Debug)]
pub struct NewUrl {
    /// The normalised URL.
    pub url: String,
    /// Its host key.
    pub host: String,
    /// Links from a seed.
    pub depth: u32,
    /// The page it was found on.
    pub parent: Option<String>,
}

impl Store {
    /// Job `job`'s crawl frontier (empty when it has none yet), on a
    /// connection of its own. Blocks: call it from a thread that may.
    pub fn frontier(&self, job: i64) -> Result<Frontier, StoreError> {
        dispatch!(self.frontier(job), sync)
    }
}
