//! The one writer: a thread that owns the write connection and takes jobs
//! from a bounded channel. Jobs that queue up while a transaction runs are
//! committed together in the next one, each inside its own savepoint so a
//! failing job rolls back alone; every caller hears of its job only after
//! the transaction holding it has committed.

use std::ffi::c_int;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rusqlite::Connection;
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use tokio::sync::{mpsc, oneshot};

use super::StoreError;
use super::unwritable::{WriteFailure, WriteHealth};

/// Jobs waiting for the writer; senders wait when it is full.
pub const QUEUE: usize = 256;

/// The most jobs committed in one transaction.
const MAX_BATCH: usize = 128;

/// The most weight (rows, roughly) committed in one transaction: enough to
/// make batching pay, small enough that the write lock is held for tens of
/// milliseconds, never for as long as another process waits for it.
pub(super) const MAX_WEIGHT: usize = 10_000;

/// Attempts to take the write lock (each waits out the busy timeout)
/// before a transaction is given up; another process holding the lock for
/// minutes is a fault worth reporting.
const LOCK_ATTEMPTS: u32 = 24;

/// A unit of work for the writer.
pub trait Job: Send {
    /// Roughly how many rows the job writes.
    fn weight(&self) -> usize;
    /// Runs against the open transaction: inside a savepoint, unless the
    /// job is `alone` in it. Says how it went; a job alone in its
    /// transaction that fails is undone by rolling the transaction back.
    fn run(&mut self, conn: &mut Connection, alone: bool) -> Ran;
    /// Reports the outcome once the transaction is over: the job's own
    /// result if it committed, else the commit's error.
    fn finish(self: Box<Self>, committed: Result<(), CommitFailed>);
}

/// How a job went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ran {
    /// It succeeded.
    Done,
    /// It failed for reasons of its own.
    Failed,
    /// The disk refused its write: what SQLite said.
    Unwritable(WriteFailure, String),
}

/// Why a transaction did not commit.
#[derive(Clone, Debug)]
pub struct CommitFailed {
    /// What SQLite said.
    message: String,
    /// Set when the disk refused the write.
    kind: Option<WriteFailure>,
}

impl CommitFailed {
    fn of(e: &rusqlite::Error) -> CommitFailed {
        CommitFailed {
            message: e.to_string(),
            kind: WriteFailure::of(e),
        }
    }

    /// The error its jobs' callers get.
    fn error(self) -> StoreError {
        match self.kind {
            Some(kind) => StoreError::Unwritable {
                kind,
                reason: self.message,
            },
            None => StoreError::Commit(self.message),
        }
    }
}

/// A job running `f` and sending its result to `reply`.
pub struct Call<R, F> {
    f: Option<F>,
    weight: usize,
    result: Option<Result<R, StoreError>>,
    reply: Option<oneshot::Sender<Result<R, StoreError>>>,
}

impl<R, F> Call<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
{
    /// A job writing about `weight` rows, and the receiver of its result.
    pub fn job(weight: usize, f: F) -> (Box<dyn Job>, oneshot::Receiver<Result<R, StoreError>>) {
        let (tx, rx) = oneshot::channel();
        let job = Call {
            f: Some(f),
            weight: weight.max(1),
            result: None,
            reply: Some(tx),
        };
        (Box::new(job), rx)
    }
}

impl<R, F> Job for Call<R, F>
where
    R: Send + 'static,
    F: FnOnce(&Connection) -> Result<R, StoreError> + Send + 'static,
{
    fn weight(&self) -> usize {
        self.weight
    }

    fn run(&mut self, conn: &mut Connection, alone: bool) -> Ran {
        let Some(f) = self.f.take() else {
            return Ran::Done;
        };
        // A savepoint copies every page the job changes first, so that it
        // can be undone alone: a job alone in its transaction (a chunk of
        // a harvest, most often) is undone with the transaction instead.
        let result = if alone {
            f(conn)
        } else {
            match conn.savepoint() {
                Ok(sp) => match f(&sp) {
                    Ok(v) => sp.commit().map(|()| v).map_err(StoreError::from),
                    // Dropping the savepoint rolls this job back alone.
                    Err(e) => Err(e),
                },
                Err(e) => Err(e.into()),
            }
        };
        // A statement the disk refused says so in the kinds callers match.
        let result = result.map_err(StoreError::classified);
        let ran = match &result {
            Ok(_) => Ran::Done,
            Err(StoreError::Unwritable { kind, reason }) => Ran::Unwritable(*kind, reason.clone()),
            Err(_) => Ran::Failed,
        };
        self.result = Some(result);
        ran
    }

    fn finish(mut self: Box<Self>, committed: Result<(), CommitFailed>) {
        let result = match (committed, self.result.take()) {
            (Ok(()), Some(r)) => r,
            (Err(e), Some(Ok(_))) => Err(e.error()),
            (_, Some(Err(e))) => Err(e),
            (_, None) => Err(StoreError::Commit("the job never ran".into())),
        };
        if let Some(reply) = self.reply.take() {
            // The caller may have gone away (cancelled); the write stands.
            let _ = reply.send(result);
        }
    }
}

/// Frames in the write-ahead log after a commit from which the
/// checkpointer copies the log into the database (SQLite's own default
/// for checkpointing at commit).
const CHECKPOINT_FRAMES: i32 = 1_000;

/// Frames from which the writer checkpoints after its commit itself, as
/// SQLite does by default, should the checkpointer fall behind: the log
/// stays bounded (32 MiB of 4 KiB pages) whatever the write load.
const WRITER_CHECKPOINT_FRAMES: i32 = 8_000;

/// Starts the writer thread on `conn`, and its checkpointer; they run
/// until every sender is gone. The writer keeps `health`: a transaction the
/// disk refused pauses writes, one that wrote ends the pause.
pub fn start(
    mut conn: Connection,
    path: PathBuf,
    health: Arc<WriteHealth>,
) -> Result<mpsc::Sender<Box<dyn Job>>, StoreError> {
    let wrote = Arc::new(AtomicBool::new(false));
    checkpoint_off_thread(&mut conn, &path, wrote.clone())?;
    let (tx, rx) = mpsc::channel(QUEUE);
    let writer = Writer {
        conn,
        path,
        health,
        wrote,
    };
    std::thread::Builder::new()
        .name("proxywarden-store-writer".into())
        .spawn(move || writer.run(rx))
        .map_err(StoreError::Thread)?;
    Ok(tx)
}

/// Copies the write-ahead log into the database on a thread of its own,
/// with its own connection, instead of on the writer's after a commit (a
/// tenth of a harvest's time, and its waits for the disk): SQLite lets one
/// connection checkpoint while another writes. The writer's commits wake
/// the checkpointer once the log has grown past [`CHECKPOINT_FRAMES`].
/// Every commit that put frames in the log sets `wrote`.
fn checkpoint_off_thread(
    conn: &mut Connection,
    path: &Path,
    wrote: Arc<AtomicBool>,
) -> Result<(), StoreError> {
    let open_err = |e: rusqlite::Error| StoreError::Open {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let checkpointer = Connection::open(path).map_err(open_err)?;
    checkpointer
        .execute_batch("PRAGMA synchronous = NORMAL")
        .map_err(open_err)?;
    // Holds one wake-up; more commits while it waits add nothing.
    let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
    let shown = path.display().to_string();
    std::thread::Builder::new()
        .name("proxywarden-checkpoint".into())
        .spawn(move || {
            // Ends with the writer's connection, which holds `wake`.
            for () in woken {
                if let Err(e) =
                    checkpointer.wal_checkpoint_v2(Some("main"), CheckpointMode::PASSIVE)
                {
                    tracing::warn!(path = shown, error = %e, "checkpointing the database failed");
                }
            }
        })
        .map_err(StoreError::Thread)?;
    // Replaces SQLite's checkpoint at commit (itself a hook).
    conn.wal_hook(Some(move |wal: &mut Wal, frames: c_int| {
        wrote.store(true, Ordering::Relaxed);
        if frames >= WRITER_CHECKPOINT_FRAMES {
            // Another checkpoint running is no fault: this is a backstop.
            let _ = wal.checkpoint_v2(CheckpointMode::PASSIVE);
        } else if frames >= CHECKPOINT_FRAMES {
            let _ = wake.try_send(());
        }
        Ok(())
    }))
    .map_err(open_err)
}

/// The writer thread's state.
struct Writer {
    /// The one connection that writes.
    conn: Connection,
    /// The database file, for the log.
    path: PathBuf,
    /// Told of every transaction the disk refused and every one that wrote.
    health: Arc<WriteHealth>,
    /// Set by the log's hook when a commit wrote frames.
    wrote: Arc<AtomicBool>,
}

/// What a transaction came to.
struct Outcome {
    /// Its commit, or why there was none.
    committed: Result<(), CommitFailed>,
    /// True when it put something on the disk.
    wrote: bool,
    /// The disk refused the transaction or a job in it: the kind and what
    /// SQLite said.
    refused: Option<(WriteFailure, String)>,
}

impl Writer {
    fn run(mut self, mut rx: mpsc::Receiver<Box<dyn Job>>) {
        // A job taken from the queue that did not fit the last transaction.
        let mut next: Option<Box<dyn Job>> = None;
        loop {
            let first = match next.take() {
                Some(job) => job,
                None => match rx.blocking_recv() {
                    Some(job) => job,
                    None => return,
                },
            };
            let mut weight = first.weight();
            let mut jobs = vec![first];
            while jobs.len() < MAX_BATCH && weight < MAX_WEIGHT {
                match rx.try_recv() {
                    Ok(job) if weight + job.weight() > MAX_WEIGHT => {
                        next = Some(job);
                        break;
                    }
                    Ok(job) => {
                        weight += job.weight();
                        jobs.push(job);
                    }
                    Err(_) => break,
                }
            }
            let outcome = self.commit(&mut jobs);
            match (&outcome.refused, &outcome.committed) {
                // Reported by whoever watches the store's write health (the
                // daemon, once a minute) or waits for the write (a command).
                (Some((kind, reason)), _) => {
                    tracing::debug!(path = %self.path.display(), %kind, reason, jobs = jobs.len(), "the disk refused a write");
                    self.health.failed(*kind, reason.clone());
                }
                (None, Err(e)) => {
                    tracing::error!(path = %self.path.display(), error = %e.message, jobs = jobs.len(), "database commit failed");
                }
                (None, Ok(())) if outcome.wrote => self.health.wrote(),
                (None, Ok(())) => {}
            }
            for job in jobs {
                job.finish(outcome.committed.clone());
            }
        }
    }

    /// Runs `jobs` in one transaction and commits it. Another process (a
    /// `proxywarden check` beside the daemon) may hold the write lock: taking
    /// it and committing are retried while the database says it is busy, so a
    /// write is delayed, never dropped.
    fn commit(&mut self, jobs: &mut [Box<dyn Job>]) -> Outcome {
        let conn = &mut self.conn;
        let changes_before = conn.total_changes();
        self.wrote.store(false, Ordering::Relaxed);
        let failed = |e: rusqlite::Error| {
            let failed = CommitFailed::of(&e);
            Outcome {
                refused: failed.kind.map(|k| (k, failed.message.clone())),
                committed: Err(failed),
                wrote: false,
            }
        };
        if let Err(e) = retry_busy("BEGIN IMMEDIATE", || conn.execute_batch("BEGIN IMMEDIATE")) {
            return failed(e);
        }
        let alone = jobs.len() == 1;
        let mut job_failed = false;
        let mut refused = None;
        for job in jobs.iter_mut() {
            match job.run(conn, alone) {
                Ran::Done => {}
                Ran::Failed => job_failed = true,
                Ran::Unwritable(kind, reason) => {
                    job_failed = true;
                    refused = Some((kind, reason));
                }
            }
        }
        if alone && job_failed {
            // The job reports its own error; nothing else was in the
            // transaction.
            let committed = conn
                .execute_batch("ROLLBACK")
                .map_err(|e| CommitFailed::of(&e));
            return Outcome {
                committed,
                wrote: false,
                refused,
            };
        }
        match retry_busy("COMMIT", || conn.execute_batch("COMMIT")) {
            // The log's hook says whether frames were written; a database not
            // in WAL mode has no hook calls, but counts its changed rows.
            Ok(()) => Outcome {
                committed: Ok(()),
                wrote: self.wrote.swap(false, Ordering::Relaxed)
                    || conn.total_changes() > changes_before,
                refused,
            },
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                failed(e)
            }
        }
    }
}

/// Runs `step` until it succeeds, fails with something other than a busy
/// database, or [`LOCK_ATTEMPTS`] attempts (each waiting out the busy
/// timeout) have passed.
fn retry_busy(what: &str, mut step: impl FnMut() -> rusqlite::Result<()>) -> rusqlite::Result<()> {
    let mut attempt = 1;
    loop {
        match step() {
            Ok(()) => return Ok(()),
            Err(rusqlite::Error::SqliteFailure(e, _))
                if e.code == rusqlite::ErrorCode::DatabaseBusy && attempt < LOCK_ATTEMPTS =>
            {
                tracing::warn!(
                    step = what,
                    attempt,
                    "the database is locked by another writer; retrying"
                );
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer on a fresh database holding one table, `t (v NOT NULL)`.
    fn writer_on_table() -> (tempfile::TempDir, mpsc::Sender<Box<dyn Job>>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch("CREATE TABLE t (v INTEGER NOT NULL)")
            .unwrap();
        let writer = start(conn, path, Arc::default()).unwrap();
        (dir, writer)
    }

    /// The values committed to `t`, in order.
    fn values_of(dir: &tempfile::TempDir) -> Vec<i64> {
        Connection::open(dir.path().join("w.db"))
            .unwrap()
            .prepare("SELECT v FROM t ORDER BY v")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }

    /// Jobs sharing a transaction: one failing rolls back alone, and every
    /// caller hears only after the commit.
    #[tokio::test]
    async fn a_failing_job_rolls_back_alone() {
        let (dir, writer) = writer_on_table();
        let (good, good_done) = Call::job(1, |c: &Connection| {
            c.execute("INSERT INTO t (v) VALUES (1)", [])?;
            Ok(())
        });
        let (bad, bad_done) = Call::job(1, |c: &Connection| {
            c.execute("INSERT INTO t (v) VALUES (2)", [])?;
            c.execute("INSERT INTO t (v) VALUES (NULL)", [])?;
            Ok(())
        });
        // Queued back to back, so the writer usually takes both at once;
        // either way the outcome must be the same.
        writer.send(good).await.unwrap();
        writer.send(bad).await.unwrap();
        good_done.await.unwrap().unwrap();
        assert!(bad_done.await.unwrap().is_err());
        let values = values_of(&dir);
        assert_eq!(values, [1]);
    }

    /// A job alone in its transaction runs without a savepoint: when it
    /// fails, what it wrote is rolled back all the same, and the writer
    /// goes on with the next.
    #[tokio::test]
    async fn a_failing_job_alone_leaves_nothing_behind() {
        let (dir, writer) = writer_on_table();
        let (bad, bad_done) = Call::job(1, |c: &Connection| {
            c.execute("INSERT INTO t (v) VALUES (1)", [])?;
            c.execute("INSERT INTO t (v) VALUES (NULL)", [])?;
            Ok(())
        });
        writer.send(bad).await.unwrap();
        let err = bad_done.await.unwrap().unwrap_err();
        assert!(err.to_string().contains("NOT NULL"), "{err}");
        let (good, good_done) = Call::job(1, |c: &Connection| {
            c.execute("INSERT INTO t (v) VALUES (2)", [])?;
            Ok(())
        });
        writer.send(good).await.unwrap();
        good_done.await.unwrap().unwrap();
        let values = values_of(&dir);
        assert_eq!(values, [2]);
    }
}
