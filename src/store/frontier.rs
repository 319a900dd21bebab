//! Crawl frontiers: every URL a crawl has seen, its depth, parent and
//! state, and the crawl's settings and output lengths, keyed by job.
//! A crawl's loop works its frontier through a [`Frontier`] holding its own
//! connection, with async calls on both backends (on SQLite the connection
//! lives on a thread of its own that takes the calls); finished pages are
//! committed in small batches (what the crawler handled in one turn of its
//! loop), so a crawl of millions of URLs keeps only queue heads in memory
//! and resumes after `kill -9`.

use super::{Store, StoreError};
use super::{postgres, sqlite};

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
    /// connection of its own.
    pub async fn frontier(&self, job: i64) -> Result<Frontier, StoreError> {
        // A frontier's failures are the crawl's to report, not a sign of
        // the store's health: not observed.
        match &self.backend {
            super::Backend::Sqlite(db) => db.frontier(job).await,
            super::Backend::Postgres(db) => db.frontier(job).await,
        }
    }

    /// [`Store::frontier`] for a crawl on a thread of its own, in a
    /// database no one else writes: on SQLite the connection is the
    /// calling thread's, and a call blocks it while it runs (no hand-over
    /// to another thread and back), but for one adding many URLs, which
    /// the blocking pool runs; on PostgreSQL it is [`Store::frontier`].
    pub async fn frontier_here(&self, job: i64) -> Result<Frontier, StoreError> {
        match &self.backend {
            super::Backend::Sqlite(db) => db.frontier_here(job),
            super::Backend::Postgres(db) => db.frontier(job).await,
        }
    }
}

/// One crawl's frontier and seen set, on a connection of its own. Calls
/// run in the order made; none blocks an async worker.
#[derive(Debug)]
pub struct Frontier {
    backend: FrontierBackend,
}

#[derive(Debug)]
enum FrontierBackend {
    Sqlite(sqlite::frontier::Frontier),
    Postgres(postgres::frontier::Frontier),
}

impl From<sqlite::frontier::Frontier> for Frontier {
    fn from(f: sqlite::frontier::Frontier) -> Frontier {
        Frontier {
            backend: FrontierBackend::Sqlite(f),
        }
    }
}

impl From<postgres::frontier::Frontier> for Frontier {
    fn from(f: postgres::frontier::Frontier) -> Frontier {
        Frontier {
            backend: FrontierBackend::Postgres(f),
        }
    }
}

/// Calls the method of the same name on the frontier's backend.
macro_rules! on_backend {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match &$self.backend {
            FrontierBackend::Sqlite(f) => f.$method($($arg),*),
            FrontierBackend::Postgres(f) => f.$method($($arg),*),
        }
    };
    (mut $self:ident . $method:ident ( $($arg:expr),* )) => {
        match &mut $self.backend {
            FrontierBackend::Sqlite(f) => f.$method($($arg),*).await,
            FrontierBackend::Postgres(f) => f.$method($($arg),*).await,
        }
    };
}

impl Frontier {
    /// From now on, pages this frontier hands out ([`Frontier::waiting`])
    /// and adds are leased to node `node` for `ttl`: rows another node
    /// leased are left to it until its lease ends, and the end of a page
    /// clears its lease. A crawl job's heartbeat renews them
    /// ([`Store::renew_crawl_job`]). Without it (a node alone on its
    /// database), pages are read without leases.
    pub async fn lease_pages(&mut self, node: &str, ttl: std::time::Duration) {
        on_backend!(mut self.lease_pages(node, ttl))
    }

    /// A stored setting.
    pub async fn meta(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        on_backend!(mut self.meta(key))
    }

    /// Stores a setting (in the open batch, if there is one).
    pub async fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        on_backend!(mut self.set_meta(key, value))
    }

    /// Commits what was written since the last commit, with `meta` (the
    /// output lengths that include the lines of the pages it finishes).
    pub async fn commit(&mut self, meta: &[(&str, String)]) -> Result<(), StoreError> {
        on_backend!(mut self.commit(meta))
    }

    /// True while writes wait for [`Frontier::commit`].
    pub fn dirty(&self) -> bool {
        on_backend!(self.dirty())
    }

    /// Adds `urls` not seen before and commits; returns those it added.
    pub async fn add(&mut self, urls: &[NewUrl]) -> Result<Vec<Queued>, StoreError> {
        on_backend!(mut self.add(urls))
    }

    /// Records page `id`'s end (its state and attempts) and adds the URLs
    /// it linked to, in the open batch: nothing is durable before
    /// [`Frontier::commit`], which also stores the output lengths.
    pub async fn finish(
        &mut self,
        id: i64,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<Vec<Queued>, StoreError> {
        on_backend!(mut self.finish(id, state, attempts, links))
    }

    /// Marks a URL done without fetching it (it was reached through a
    /// redirect), if it is still waiting.
    pub async fn mark_seen_done(
        &mut self,
        url: &str,
        host: &str,
        depth: u32,
    ) -> Result<(), StoreError> {
        on_backend!(mut self.mark_seen_done(url, host, depth))
    }

    /// Up to `limit` hosts with waiting URLs named after `after`, by name.
    pub async fn hosts_with_work_after(
        &mut self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        on_backend!(mut self.hosts_with_work_after(after, limit))
    }

    /// Up to `limit` waiting URLs of `host` after row `after`, in
    /// discovery order; leased, in the open batch, when the frontier
    /// leases pages.
    pub async fn waiting(
        &mut self,
        host: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Queued>, StoreError> {
        on_backend!(mut self.waiting(host, after, limit))
    }

    /// URLs in `state`.
    pub async fn count(&mut self, state: UrlState) -> Result<u64, StoreError> {
        on_backend!(mut self.count(state))
    }

    /// Every URL the crawl knows.
    pub async fn total(&mut self) -> Result<u64, StoreError> {
        on_backend!(mut self.total())
    }

    /// When pages are leased: the earliest end (unix ms) of the leases
    /// another node holds on queued pages, which this node must not take
    /// before then; `None` when there are none (or pages are not leased).
    pub async fn held_elsewhere(&mut self) -> Result<Option<i64>, StoreError> {
        on_backend!(mut self.held_elsewhere())
    }

    /// Puts the pages that failed for good back in the queue; how many.
    pub async fn requeue_failed(&mut self) -> Result<usize, StoreError> {
        on_backend!(mut self.requeue_failed())
    }

    /// Closes the frontier's connection (an open batch is rolled back) and
    /// waits until it is closed.
    pub async fn close(self) {
        match self.backend {
            FrontierBackend::Sqlite(f) => f.close().await,
            FrontierBackend::Postgres(f) => drop(f),
        }
    }
}
