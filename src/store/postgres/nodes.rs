//! PostgreSQL: harvest claims and their leases, giving back leases, and the connection that
//! LISTENs for new change numbers.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::Postgres;
use crate::store::StoreError;
use crate::store::nodes::{CLAIMS_KEPT_MS, ChangeNotices};

/// The channel the `meta` trigger notifies (migration 0003).
const CHANNEL: &str = "proxywarden_changes";

/// The wait before listening again after the connection failed, doubling
/// up to [`RELISTEN_MAX`].
const RELISTEN_FIRST: Duration = Duration::from_millis(500);
/// See [`RELISTEN_FIRST`].
const RELISTEN_MAX: Duration = Duration::from_secs(30);

impl Postgres {
    /// The primary key decides: of two nodes inserting one (source, slot),
    /// the second finds the row (waiting for the first to commit) and
    /// takes it only if its lease ended before its harvest did.
    pub(crate) async fn claim_harvest(
        &self,
        source: String,
        slot: i64,
        node: String,
        now: i64,
        until: i64,
    ) -> Result<bool, StoreError> {
        let c = self.client().await?;
        c.execute(
            "DELETE FROM harvest_claims WHERE claimed_at < $1",
            &[&now.saturating_sub(CLAIMS_KEPT_MS)],
        )
        .await?;
        let n = c
            .execute(
                "INSERT INTO harvest_claims (source, slot, node, claimed_at, lease_until)
                 VALUES ($1, $2, $3, $4, $5)
                 ON CONFLICT (source, slot) DO UPDATE
                 SET node = excluded.node, claimed_at = excluded.claimed_at,
                     lease_until = excluded.lease_until
                 WHERE harvest_claims.lease_until < excluded.claimed_at",
                &[&source, &slot, &node, &now, &until],
            )
            .await?;
        Ok(n == 1)
    }

    pub(crate) async fn renew_harvest_claims(
        &self,
        node: String,
        until: i64,
    ) -> Result<u64, StoreError> {
        Ok(self
            .client()
            .await?
            .execute(
                "UPDATE harvest_claims SET lease_until = $2
                 WHERE node = $1 AND lease_until IS NOT NULL",
                &[&node, &until],
            )
            .await?)
    }

    pub(crate) async fn finish_harvest_claims(
        &self,
        node: String,
        source: Option<String>,
    ) -> Result<u64, StoreError> {
        Ok(self
            .client()
            .await?
            .execute(
                "UPDATE harvest_claims SET lease_until = NULL
                 WHERE node = $1 AND lease_until IS NOT NULL
                   AND ($2::text IS NULL OR source = $2)",
                &[&node, &source],
            )
            .await?)
    }

    /// The UPDATE re-reads each row it waited for: a claim another node
    /// took meanwhile has a lease in the future and is left.
    pub(crate) async fn take_lapsed_harvests(
        &self,
        node: String,
        now: i64,
        until: i64,
    ) -> Result<Vec<(String, i64)>, StoreError> {
        let rows = self
            .client()
            .await?
            .query(
                "UPDATE harvest_claims SET node = $1, claimed_at = $2, lease_until = $3
                 WHERE lease_until IS NOT NULL AND (lease_until < $2 OR node = $1)
                 RETURNING source, slot",
                &[&node, &now, &until],
            )
            .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub(crate) async fn release_leases(&self, node: String) -> Result<u64, StoreError> {
        Ok(self
            .client()
            .await?
            .execute(
                "UPDATE proxies SET lease_until = NULL, lease_node = NULL WHERE lease_node = $1",
                &[&node],
            )
            .await?)
    }

    /// Starts (once per store) the task that LISTENs on its own
    /// connection and wakes the returned notices at every notification.
    /// The task ends with the store's last handle; a connection that
    /// fails is opened again after a backoff, and a wake-up is sent then,
    /// since notices may have been missed meanwhile.
    pub(crate) fn change_notices(&self) -> ChangeNotices {
        let notify = self
            .inner
            .notices
            .get_or_init(|| {
                let notify = Arc::new(Notify::new());
                let weak = Arc::downgrade(&notify);
                let config = self.inner.config.clone();
                tokio::spawn(listen(config, weak));
                notify
            })
            .clone();
        ChangeNotices {
            notify,
            available: true,
        }
    }
}

/// Listens until nobody holds the notices any more.
async fn listen(config: tokio_postgres::Config, notices: std::sync::Weak<Notify>) {
    let mut wait = RELISTEN_FIRST;
    loop {
        let failed = listen_once(&config, &notices).await;
        let Some(n) = notices.upgrade() else { return };
        // Whatever was committed while not listening is read now.
        n.notify_one();
        drop(n);
        match failed {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?wait, "listening for database changes failed");
            }
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(RELISTEN_MAX);
    }
}

/// One connection's life: `Ok` when nobody holds the notices any more.
async fn listen_once(
    config: &tokio_postgres::Config,
    notices: &std::sync::Weak<Notify>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    // The connection is driven here, and its notifications forwarded; the
    // client's LISTEN is answered through it.
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(AsyncMessage::Notification(_)) => {
                    if tx.send(()).is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    });
    let listening = client.batch_execute(&format!("LISTEN {CHANNEL}")).await;
    if let Err(e) = listening {
        driver.abort();
        return Err(e);
    }
    let mut alive = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            got = rx.recv() => match got {
                Some(()) => {
                    let Some(n) = notices.upgrade() else { return Ok(()) };
                    n.notify_one();
                }
                None => break,
            },
            // Checks now and then that someone still wants the notices.
            _ = alive.tick() => {
                if notices.strong_count() == 0 {
                    return Ok(());
                }
            }
        }
    }
    // The connection ended: its driver says why.
    match driver.await {
        Ok(Err(e)) => Err(e),
        _ => client.batch_execute("SELECT 1").await,
    }
}
