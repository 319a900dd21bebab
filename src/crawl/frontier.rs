//! Where a crawl keeps its frontier ([`crate::store::Frontier`]): a daemon
//! job's in the daemon's database under the job's id; a CLI crawl's in a
//! database of its own at `--state FILE`, or in a temporary one, as job
//! [`STANDALONE`] there.

use std::ops::{Deref, DerefMut};
use std::path::Path;

use crate::store::{self, Store, StoreError};
pub use crate::store::{NewUrl, Queued, UrlState};

/// The job id of the one crawl a `--state` database holds.
pub const STANDALONE: i64 = 0;

/// Why the crawl state could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum FrontierError {
    /// The database holding it failed.
    #[error("crawl state {path}: {source}")]
    Store {
        /// The state file.
        path: String,
        /// What the store said.
        source: StoreError,
    },
    /// The temporary state could not be made.
    #[error("cannot create a temporary crawl state: {0}")]
    Temp(std::io::Error),
}

/// A crawl's frontier, with the temporary database it lives in, if any
/// (removed when the frontier is dropped).
#[derive(Debug)]
pub struct Frontier {
    state: store::Frontier,
    _temp: Option<tempfile::TempDir>,
}

impl Frontier {
    /// The frontier of the crawl state at `path` (created if needed), or
    /// of a temporary state removed when the frontier is dropped.
    pub async fn open(path: Option<&Path>) -> Result<Frontier, FrontierError> {
        Frontier::open_at(path, false).await
    }

    /// [`Frontier::open`] for a crawl on a thread of its own: the
    /// connection is that thread's, and each call runs on it
    /// ([`Store::frontier_here`]).
    pub async fn open_here(path: Option<&Path>) -> Result<Frontier, FrontierError> {
        Frontier::open_at(path, true).await
    }

    async fn open_at(path: Option<&Path>, here: bool) -> Result<Frontier, FrontierError> {
        let (path, temp) = match path {
            Some(p) => (p.to_path_buf(), None),
            None => {
                let t = tempfile::Builder::new()
                    .prefix("proxywarden-crawl-")
                    .tempdir()
                    .map_err(FrontierError::Temp)?;
                (t.path().join("crawl.db"), Some(t))
            }
        };
        let err = |source| FrontierError::Store {
            path: path.display().to_string(),
            source,
        };
        // Opening migrates the file: blocking work, off the async workers.
        let opened = path.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&opened))
            .await
            .map_err(|_| err(StoreError::Cancelled))?
            .map_err(err)?;
        let state = match here {
            true => store.frontier_here(STANDALONE).await,
            false => store.frontier(STANDALONE).await,
        }
        .map_err(err)?;
        Ok(Frontier { state, _temp: temp })
    }

    /// Job `job`'s frontier in `store`.
    pub async fn of_job(store: &Store, job: i64) -> Result<Frontier, FrontierError> {
        let state = store
            .frontier(job)
            .await
            .map_err(|source| FrontierError::Store {
                path: format!("{} (crawl job {job})", store.path().display()),
                source,
            })?;
        Ok(Frontier { state, _temp: None })
    }

    /// Closes the frontier's connection, then removes its temporary
    /// database, if any.
    pub async fn close(self) {
        let Frontier { state, _temp } = self;
        state.close().await;
    }
}

impl Deref for Frontier {
    type Target = store::Frontier;

    fn deref(&self) -> &store::Frontier {
        &self.state
    }
}

impl DerefMut for Frontier {
    fn deref_mut(&mut self) -> &mut store::Frontier {
        &mut self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_temporary_frontier_removes_its_files() {
        let mut f = Frontier::open(None).await.unwrap();
        let dir = f._temp.as_ref().unwrap().path().to_path_buf();
        f.add(&[NewUrl {
            url: "http://h/".into(),
            host: "h".into(),
            depth: 0,
            parent: None,
        }])
        .await
        .unwrap();
        assert!(dir.join("crawl.db").exists());
        f.close().await;
        assert!(!dir.exists());
    }

    #[tokio::test]
    async fn a_frontier_on_the_crawl_s_thread_keeps_its_batch_until_commit() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crawl.db");
        let mut f = Frontier::open_here(Some(&path)).await.unwrap();
        let url = |u: &str| NewUrl {
            url: u.into(),
            host: "h".into(),
            depth: 0,
            parent: None,
        };
        let added = f.add(&[url("http://h/")]).await.unwrap();
        let page = added[0].id;
        // Ended without links: not waited for, in the open batch.
        f.finish(page, UrlState::Done, 1, &[]).await.unwrap();
        assert!(f.dirty());
        f.commit(&[("out_len", "7".into())]).await.unwrap();
        assert!(!f.dirty());
        f.finish(page, UrlState::Failed, 2, &[url("http://h/a")])
            .await
            .unwrap();
        // Dropped with its batch open: rolled back, as after kill -9.
        f.close().await;
        let mut f = Frontier::open_here(Some(&path)).await.unwrap();
        assert_eq!(f.count(UrlState::Done).await.unwrap(), 1);
        assert_eq!(f.count(UrlState::Failed).await.unwrap(), 0);
        assert_eq!(f.total().await.unwrap(), 1);
        assert_eq!(f.meta("out_len").await.unwrap().as_deref(), Some("7"));
    }

    #[tokio::test]
    async fn many_urls_added_on_the_crawl_s_thread_join_the_same_batch() {
        let mut f = Frontier::open_here(None).await.unwrap();
        let urls = |from: usize, n: usize| -> Vec<NewUrl> {
            (from..from + n)
                .map(|i| NewUrl {
                    url: format!("http://h/{i}"),
                    host: "h".into(),
                    depth: 1,
                    parent: None,
                })
                .collect()
        };
        // More than a call on the crawl's thread takes: the blocking pool
        // runs these, on the same connection and batch.
        let added = f.add(&urls(0, 300)).await.unwrap();
        assert_eq!(added.len(), 300);
        let linked = f
            .finish(added[0].id, UrlState::Done, 1, &urls(200, 300))
            .await
            .unwrap();
        assert_eq!(linked.len(), 200, "the 100 known already are not added");
        assert!(f.dirty());
        f.commit(&[]).await.unwrap();
        assert_eq!(f.total().await.unwrap(), 500);
        assert_eq!(f.count(UrlState::Done).await.unwrap(), 1);
        assert_eq!(f.waiting("h", 0, 1_000).await.unwrap().len(), 499);
        f.close().await;
    }

    #[tokio::test]
    async fn a_state_file_resumes_its_crawl() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("crawl.db");
        let mut f = Frontier::open(Some(&path)).await.unwrap();
        f.set_meta("argv", "[]").await.unwrap();
        f.close().await;
        let mut f = Frontier::open(Some(&path)).await.unwrap();
        assert_eq!(f.meta("argv").await.unwrap().as_deref(), Some("[]"));
    }
}
