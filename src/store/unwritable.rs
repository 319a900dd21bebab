//! When the disk refuses writes (full, read-only, failing), or the
//! database server cannot be reached: the kinds of failure, how many of
//! each, and the back-off that pauses writes after a failure — 1 s,
//! doubling to a minute — so that work needing the disk waits for it
//! instead of failing over and over. A nearly full disk takes
//! small writes (the log file keeps the room a failed transaction took) and
//! refuses the next large one: a failure soon after writes worked again
//! goes on with the pause where it was, not from the first.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rusqlite::ErrorCode;
use tokio::sync::watch;

use super::StoreError;
use crate::lock;

/// Why the disk refused a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriteFailure {
    /// The file system is full (`SQLITE_FULL`).
    DiskFull,
    /// The file or its file system is read-only (`SQLITE_READONLY`).
    ReadOnly,
    /// The disk failed to read or write (`SQLITE_IOERR`).
    Io,
    /// The database server cannot be reached or takes no new connection
    /// (stopped, restarting, at its connection limit): PostgreSQL only.
    Unreachable,
}

impl WriteFailure {
    /// Every kind, in the order metrics and `/stats` list them.
    pub const ALL: [WriteFailure; 4] = [
        WriteFailure::DiskFull,
        WriteFailure::ReadOnly,
        WriteFailure::Io,
        WriteFailure::Unreachable,
    ];

    /// The name in metrics and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            WriteFailure::DiskFull => "disk_full",
            WriteFailure::ReadOnly => "read_only",
            WriteFailure::Io => "io_error",
            WriteFailure::Unreachable => "unreachable",
        }
    }

    /// The kind of a failed SQLite call, if the disk refused it.
    pub(crate) fn of(e: &rusqlite::Error) -> Option<WriteFailure> {
        match e.sqlite_error_code()? {
            ErrorCode::DiskFull => Some(WriteFailure::DiskFull),
            ErrorCode::ReadOnly => Some(WriteFailure::ReadOnly),
            ErrorCode::SystemIoFailure => Some(WriteFailure::Io),
            _ => None,
        }
    }

    fn slot(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for WriteFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WriteFailure::DiskFull => "disk full",
            WriteFailure::ReadOnly => "read-only",
            WriteFailure::Io => "I/O error",
            WriteFailure::Unreachable => "server unreachable",
        })
    }
}

/// The first pause after a failed write.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest pause: a disk that comes back is written again within this.
pub const RETRY_MAX: Duration = Duration::from_secs(60);

/// Writes are failing: since when, why, and when they are tried again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteTrouble {
    /// The kind of the latest failure.
    pub kind: WriteFailure,
    /// What the database said about it.
    pub reason: String,
    /// When the first failure was (unix ms).
    pub since_ms: i64,
    /// Failed transactions since then.
    pub failures: u64,
    /// The pause now between attempts.
    pub retry_every: Duration,
    /// Until when writes are refused without touching the disk.
    retry_at: Instant,
}

impl WriteTrouble {
    /// How long until writes are tried again (zero once they may be).
    pub fn retry_in(&self) -> Duration {
        self.retry_at.saturating_duration_since(Instant::now())
    }
}

/// The write health of one store, kept by its writer thread.
pub(super) struct WriteHealth {
    state: Mutex<State>,
    /// Every change of the trouble, for whoever reports it.
    changes: watch::Sender<Option<WriteTrouble>>,
}

#[derive(Default)]
struct State {
    trouble: Option<WriteTrouble>,
    /// The last trouble and when a write ended it, while a failure may
    /// still resume it (see [`RESUME_WITHIN`]).
    ended: Option<(WriteTrouble, Instant)>,
    /// Failed transactions since start, by [`WriteFailure::slot`].
    failures: [u64; WriteFailure::ALL.len()],
}

/// A failure this soon after writes worked again resumes the trouble they
/// ended: same start, the pause doubled.
pub const RESUME_WITHIN: Duration = RETRY_MAX;

impl Default for WriteHealth {
    fn default() -> Self {
        WriteHealth {
            state: Mutex::default(),
            changes: watch::Sender::new(None),
        }
    }
}

impl WriteHealth {
    /// A transaction failed because the disk refused it. Once the pause in
    /// force is over (this was a new attempt) the next one is twice as long.
    pub(super) fn failed(&self, kind: WriteFailure, reason: String) {
        let now = Instant::now();
        let mut state = lock(&self.state);
        state.failures[kind.slot()] += 1;
        let resumed = state
            .ended
            .take()
            .filter(|(_, at)| at.elapsed() < RESUME_WITHIN)
            .map(|(t, _)| t);
        let trouble = match state.trouble.take().or(resumed) {
            None => WriteTrouble {
                kind,
                reason,
                since_ms: super::now_ms(),
                failures: 1,
                retry_every: RETRY_FIRST,
                retry_at: now + RETRY_FIRST,
            },
            Some(mut t) => {
                if now >= t.retry_at {
                    t.retry_every = (t.retry_every * 2).min(RETRY_MAX);
                    t.retry_at = now + t.retry_every;
                }
                t.kind = kind;
                t.reason = reason;
                t.failures += 1;
                t
            }
        };
        state.trouble = Some(trouble.clone());
        drop(state);
        self.changes.send_replace(Some(trouble));
    }

    /// A transaction that changed the database was committed: writes work.
    pub(super) fn wrote(&self) {
        let mut state = lock(&self.state);
        let Some(ended) = state.trouble.take() else {
            return;
        };
        state.ended = Some((ended, Instant::now()));
        drop(state);
        self.changes.send_replace(None);
    }

    /// Refuses a write while the pause after a failure runs, so that it
    /// costs no disk work; lets it through once the pause is over.
    pub(super) fn gate(&self) -> Result<(), StoreError> {
        match &lock(&self.state).trouble {
            Some(t) if Instant::now() < t.retry_at => Err(StoreError::Unwritable {
                kind: t.kind,
                reason: t.reason.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The trouble in force, if any.
    pub(super) fn trouble(&self) -> Option<WriteTrouble> {
        lock(&self.state).trouble.clone()
    }

    /// Failed transactions since start, by kind.
    pub(super) fn failures(&self) -> Vec<(WriteFailure, u64)> {
        let state = lock(&self.state);
        WriteFailure::ALL
            .iter()
            .map(|k| (*k, state.failures[k.slot()]))
            .collect()
    }

    /// Every change of the trouble from now on.
    pub(super) fn subscribe(&self) -> watch::Receiver<Option<WriteTrouble>> {
        self.changes.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_pause_writes_with_a_doubling_bounded_delay_until_one_works() {
        let h = WriteHealth::default();
        assert!(h.gate().is_ok());
        h.failed(WriteFailure::DiskFull, "database or disk is full".into());
        let t = h.trouble().unwrap();
        assert_eq!((t.failures, t.retry_every), (1, RETRY_FIRST));
        let err = h.gate().unwrap_err();
        assert_eq!(err.write_failure(), Some(WriteFailure::DiskFull));
        // A failure during the pause (a write queued before it) counts,
        // but does not lengthen it.
        h.failed(WriteFailure::DiskFull, "again".into());
        assert_eq!(h.trouble().unwrap().retry_every, RETRY_FIRST);
        // Attempts after each pause double it, up to the longest.
        for _ in 0..10 {
            lock(&h.state).trouble.as_mut().unwrap().retry_at = Instant::now();
            h.failed(WriteFailure::Io, "disk I/O error".into());
        }
        let t = h.trouble().unwrap();
        assert_eq!(
            (t.retry_every, t.failures, t.kind),
            (RETRY_MAX, 12, WriteFailure::Io)
        );
        assert_eq!(
            h.failures(),
            vec![
                (WriteFailure::DiskFull, 2),
                (WriteFailure::ReadOnly, 0),
                (WriteFailure::Io, 10),
                (WriteFailure::Unreachable, 0)
            ]
        );
        let mut changes = h.subscribe();
        h.wrote();
        assert!(h.trouble().is_none() && h.gate().is_ok());
        assert!(changes.has_changed().unwrap());
        assert!(changes.borrow_and_update().is_none());
        // A failure soon after (a nearly full disk that took a small write)
        // goes on where the trouble was.
        let since = t.since_ms;
        h.failed(WriteFailure::DiskFull, "database or disk is full".into());
        let t = h.trouble().unwrap();
        assert_eq!(
            (t.since_ms, t.retry_every, t.failures),
            (since, RETRY_MAX, 13)
        );
        // Long after, a failure starts over from the first pause.
        h.wrote();
        lock(&h.state).ended.as_mut().unwrap().1 = Instant::now() - RESUME_WITHIN;
        h.failed(
            WriteFailure::ReadOnly,
            "attempt to write a readonly database".into(),
        );
        let t = h.trouble().unwrap();
        assert_eq!((t.retry_every, t.failures), (RETRY_FIRST, 1));
    }

    #[test]
    fn sqlite_errors_are_classified_by_their_primary_code() {
        let err = |code| rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
        assert_eq!(
            WriteFailure::of(&err(rusqlite::ffi::SQLITE_FULL)),
            Some(WriteFailure::DiskFull)
        );
        assert_eq!(
            WriteFailure::of(&err(rusqlite::ffi::SQLITE_READONLY_DBMOVED)),
            Some(WriteFailure::ReadOnly)
        );
        assert_eq!(
            WriteFailure::of(&err(rusqlite::ffi::SQLITE_IOERR_WRITE)),
            Some(WriteFailure::Io)
        );
        assert_eq!(
            WriteFailure::of(&err(rusqlite::ffi::SQLITE_CONSTRAINT)),
            None
        );
        assert_eq!(WriteFailure::of(&err(rusqlite::ffi::SQLITE_BUSY)), None);
    }
}
