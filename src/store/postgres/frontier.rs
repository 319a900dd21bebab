//! PostgreSQL: crawl frontiers, each on a connection of its own, every
//! call async I/O on the runtime: a batch is one open transaction on the
//! frontier's connection, as on SQLite, so what a turn of the crawl's loop
//! wrote is seen by its next reads and committed whole.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, NoTls, Row};

use super::Postgres;
use crate::store::{NewUrl, Queued, StoreError, UrlState, now_ms};

/// One crawl's frontier on a PostgreSQL connection of its own.
pub(crate) struct Frontier {
    client: Arc<Client>,
    job: i64,
    /// A transaction is open: writes since the last commit.
    open: bool,
    /// Pages are leased to this node for this long when handed out.
    lease: Option<(String, Duration)>,
    /// The URL without its password, for `Debug`.
    shown: String,
}

impl std::fmt::Debug for Frontier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontier")
            .field("url", &self.shown)
            .field("job", &self.job)
            .finish()
    }
}

impl Postgres {
    pub(crate) async fn frontier(&self, job: i64) -> Result<crate::store::Frontier, StoreError> {
        let mut config = self.inner.config.clone();
        // Named apart from the pool's sessions, so that an operator sees
        // which session crawls which job.
        config.application_name(format!("proxywarden crawl {job}"));
        let (client, conn) = tokio::time::timeout(super::CONNECT_TIMEOUT, config.connect(NoTls))
            .await
            .map_err(|_| StoreError::Cancelled)??;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "a crawl frontier's connection ended");
            }
        });
        Ok(Frontier {
            client: Arc::new(client),
            job,
            open: false,
            lease: None,
            shown: self.path().display().to_string(),
        }
        .into())
    }
}

const SET_META: &str = "INSERT INTO crawl_meta (job, key, value) VALUES ($1, $2, $3)
     ON CONFLICT (job, key) DO UPDATE SET value = excluded.value";

/// Adds the URLs not seen before in one statement, leased to `lease` if
/// given; returns those added, in discovery order.
const INSERT: &str =
    "INSERT INTO crawl_urls (job, url, host, depth, parent, lease_node, lease_until)
     SELECT $1, u.url, u.host, u.depth, u.parent, $6, $7
     FROM unnest($2::text[], $3::text[], $4::int[], $5::text[]) WITH ORDINALITY
          AS u(url, host, depth, parent, n)
     ORDER BY u.n
     ON CONFLICT (job, url) DO NOTHING
     RETURNING id, url, host, depth, parent";

fn queued(r: &Row) -> Queued {
    Queued {
        id: r.get(0),
        url: r.get(1),
        host: r.get(2),
        depth: r.get::<_, i32>(3) as u32,
        parent: r.get(4),
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Frontier {
    async fn run<T, F>(&self, f: impl FnOnce(Arc<Client>) -> F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        f(self.client.clone()).await
    }

    /// The lease's node and its end from now, or NULLs.
    fn lease_now(&self) -> (Option<String>, Option<i64>) {
        match &self.lease {
            Some((node, ttl)) => (Some(node.clone()), Some(now_ms().saturating_add(ms(*ttl)))),
            None => (None, None),
        }
    }

    pub(crate) async fn lease_pages(&mut self, node: &str, ttl: Duration) {
        self.lease = Some((node.to_owned(), ttl));
    }

    pub async fn meta(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        let (job, key) = (self.job, key.to_owned());
        self.run(move |c| async move {
            let row = c
                .query_opt(
                    "SELECT value FROM crawl_meta WHERE job = $1 AND key = $2",
                    &[&job, &key],
                )
                .await?;
            Ok(row.map(|r| r.get(0)))
        })
        .await
    }

    pub async fn set_meta(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        let (job, key, value) = (self.job, key.to_owned(), value.to_owned());
        self.run(move |c| async move {
            c.execute(SET_META, &[&job, &key, &value]).await?;
            Ok(())
        })
        .await
    }

    async fn begin(&mut self) -> Result<(), StoreError> {
        if !self.open {
            self.run(|c| async move { Ok(c.batch_execute("BEGIN").await?) })
                .await?;
            self.open = true;
        }
        Ok(())
    }

    pub async fn commit(&mut self, meta: &[(&str, String)]) -> Result<(), StoreError> {
        if !self.open {
            return Ok(());
        }
        let job = self.job;
        let meta: Vec<(String, String)> = meta
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        let r = self
            .run(move |c| async move {
                let done = async {
                    for (k, v) in &meta {
                        c.execute(SET_META, &[&job, k, v]).await?;
                    }
                    c.batch_execute("COMMIT").await
                }
                .await;
                if done.is_err() {
                    let _ = c.batch_execute("ROLLBACK").await;
                }
                Ok(done?)
            })
            .await;
        self.open = false;
        r
    }

    pub fn dirty(&self) -> bool {
        self.open
    }

    pub async fn add(&mut self, urls: &[NewUrl]) -> Result<Vec<Queued>, StoreError> {
        self.begin().await?;
        let added = self.insert(urls).await?;
        self.commit(&[]).await?;
        Ok(added)
    }

    async fn insert(&self, urls: &[NewUrl]) -> Result<Vec<Queued>, StoreError> {
        if urls.is_empty() {
            return Ok(Vec::new());
        }
        let job = self.job;
        let url: Vec<String> = urls.iter().map(|u| u.url.clone()).collect();
        let host: Vec<String> = urls.iter().map(|u| u.host.clone()).collect();
        let depth: Vec<i32> = urls
            .iter()
            .map(|u| i32::try_from(u.depth).unwrap_or(i32::MAX))
            .collect();
        let parent: Vec<Option<String>> = urls.iter().map(|u| u.parent.clone()).collect();
        let (node, until) = self.lease_now();
        self.run(move |c| async move {
            let rows = c
                .query(INSERT, &[&job, &url, &host, &depth, &parent, &node, &until])
                .await?;
            let mut added: Vec<Queued> = rows.iter().map(queued).collect();
            added.sort_by_key(|q| q.id);
            Ok(added)
        })
        .await
    }

    pub async fn finish(
        &mut self,
        id: i64,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<Vec<Queued>, StoreError> {
        self.begin().await?;
        let (state, attempts) = (state as i32, i32::try_from(attempts).unwrap_or(i32::MAX));
        self.run(move |c| async move {
            c.execute(
                "UPDATE crawl_urls SET state = $2, attempts = attempts + $3,
                        lease_node = NULL, lease_until = NULL
                 WHERE id = $1",
                &[&id, &state, &attempts],
            )
            .await?;
            Ok(())
        })
        .await?;
        self.insert(links).await
    }

    pub async fn mark_seen_done(
        &mut self,
        url: &str,
        host: &str,
        depth: u32,
    ) -> Result<(), StoreError> {
        self.begin().await?;
        let (job, url, host) = (self.job, url.to_owned(), host.to_owned());
        let depth = i32::try_from(depth).unwrap_or(i32::MAX);
        self.run(move |c| async move {
            c.execute(
                "INSERT INTO crawl_urls (job, url, host, depth, state) VALUES ($1, $2, $3, $4, 2)
                 ON CONFLICT (job, url) DO UPDATE
                 SET state = 2, lease_node = NULL, lease_until = NULL WHERE crawl_urls.state = 0",
                &[&job, &url, &host, &depth],
            )
            .await?;
            Ok(())
        })
        .await
    }

    pub async fn hosts_with_work_after(
        &mut self,
        after: &str,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let (job, after, limit) = (self.job, after.to_owned(), limit as i64);
        let (node, _) = self.lease_now();
        let now = now_ms();
        self.run(move |c| async move {
            let rows = c
                .query(
                    "SELECT DISTINCT host FROM crawl_urls
                     WHERE job = $1 AND state = 0 AND host > $2
                       AND ($4::text IS NULL OR lease_node IS NULL OR lease_node = $4
                            OR lease_until <= $5)
                     ORDER BY host LIMIT $3",
                    &[&job, &after, &limit, &node, &now],
                )
                .await?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
        .await
    }

    /// Leased to this frontier's node when it leases pages: rows leased to
    /// another node whose lease has not ended are left to it, and those
    /// another transaction holds are skipped, not waited for.
    pub async fn waiting(
        &mut self,
        host: &str,
        after: i64,
        limit: usize,
    ) -> Result<Vec<Queued>, StoreError> {
        let (job, host, limit) = (self.job, host.to_owned(), limit as i64);
        let (node, until) = self.lease_now();
        let now = now_ms();
        self.run(move |c| async move {
            let rows = match node {
                None => {
                    c.query(
                        "SELECT id, url, host, depth, parent FROM crawl_urls
                         WHERE job = $1 AND host = $2 AND state = 0 AND id > $3
                         ORDER BY id LIMIT $4",
                        &[&job, &host, &after, &limit],
                    )
                    .await?
                }
                Some(node) => {
                    c.query(
                        "UPDATE crawl_urls SET lease_node = $5, lease_until = $6 WHERE id IN (
                             SELECT id FROM crawl_urls
                             WHERE job = $1 AND host = $2 AND state = 0 AND id > $3
                               AND (lease_node IS NULL OR lease_node = $5 OR lease_until <= $7)
                             ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
                         RETURNING id, url, host, depth, parent",
                        &[&job, &host, &after, &limit, &node, &until, &now],
                    )
                    .await?
                }
            };
            let mut q: Vec<Queued> = rows.iter().map(queued).collect();
            q.sort_by_key(|q| q.id);
            Ok(q)
        })
        .await
    }

    pub async fn count(&mut self, state: UrlState) -> Result<u64, StoreError> {
        let (job, state) = (self.job, state as i32);
        self.run(move |c| async move {
            let n: i64 = c
                .query_one(
                    "SELECT count(*) FROM crawl_urls WHERE job = $1 AND state = $2",
                    &[&job, &state],
                )
                .await?
                .get(0);
            Ok(n as u64)
        })
        .await
    }

    /// See [`crate::store::Frontier::held_elsewhere`].
    pub async fn held_elsewhere(&mut self) -> Result<Option<i64>, StoreError> {
        let Some((node, _)) = self.lease.clone() else {
            return Ok(None);
        };
        let job = self.job;
        self.run(move |c| async move {
            let at: Option<i64> = c
                .query_one(
                    "SELECT min(lease_until) FROM crawl_urls
                     WHERE job = $1 AND state = 0 AND lease_node IS NOT NULL
                       AND lease_node <> $2 AND lease_until > $3",
                    &[&job, &node, &now_ms()],
                )
                .await?
                .get(0);
            Ok(at)
        })
        .await
    }

    pub async fn total(&mut self) -> Result<u64, StoreError> {
        let job = self.job;
        self.run(move |c| async move {
            let n: i64 = c
                .query_one("SELECT count(*) FROM crawl_urls WHERE job = $1", &[&job])
                .await?
                .get(0);
            Ok(n as u64)
        })
        .await
    }

    pub async fn requeue_failed(&mut self) -> Result<usize, StoreError> {
        self.commit(&[]).await?;
        let job = self.job;
        self.run(move |c| async move {
            let n = c
                .execute(
                    "UPDATE crawl_urls SET state = 0, lease_node = NULL, lease_until = NULL
                     WHERE job = $1 AND state = $2",
                    &[&job, &(UrlState::Failed as i32)],
                )
                .await?;
            Ok(n as usize)
        })
        .await
    }
}
