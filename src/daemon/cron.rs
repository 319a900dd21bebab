//! The daemon's cron: a task per [`Schedule`] that fires at each of its runs.
//! The schedule's parser (croner, through [`Schedule`]) is the only cron
//! engine: what `config check` validates, what a harvest claims as its slot
//! and when a trigger fires all come from the same parsed expression.

use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Schedule;

/// The longest one wait lasts before the clock is read again: a wall clock
/// set forward or back (NTP, a resumed machine) moves the next run within
/// this long.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// Fires `fire` at each run of `schedule` (UTC) until `stop`. A run is
/// fired once, when the wall clock has reached it, never early; runs missed
/// while the machine slept are not made up (the next one comes as usual).
pub(super) fn spawn(
    tasks: &TaskTracker,
    schedule: Schedule,
    stop: CancellationToken,
    fire: impl Fn() + Send + 'static,
) {
    tasks.spawn(async move {
        let mut after = Utc::now();
        loop {
            let Some(next) = schedule.next_after(after) else {
                tracing::warn!(%schedule, "the schedule never runs again");
                return;
            };
            loop {
                let left = (next - Utc::now()).to_std().unwrap_or(Duration::ZERO);
                if left.is_zero() {
                    break;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(left.min(MAX_WAIT)) => {}
                }
            }
            if stop.is_cancelled() {
                return;
            }
            fire();
            // A clock set back would fire the same run again; the next run
            // is always after the one just fired.
            after = next.max(Utc::now());
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Every second: fired once a second, and never again after `stop`.
    #[tokio::test]
    async fn fires_at_each_run_and_stops() {
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let counter = fired.clone();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        spawn(
            &tasks,
            Schedule::parse("* * * * * *").unwrap(),
            stop.clone(),
            move || {
                counter.fetch_add(1, Ordering::SeqCst);
                let _ = tx.send(Utc::now());
            },
        );
        let first = rx.recv().await.unwrap();
        let second = rx.recv().await.unwrap();
        assert!(second > first, "runs come in order");
        assert!(
            second - first >= chrono::TimeDelta::milliseconds(500),
            "two runs of a once-a-second schedule came {} apart",
            second - first
        );
        stop.cancel();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("the cron task ends when stopped");
        assert!(fired.load(Ordering::SeqCst) >= 2);
    }

    /// A schedule that never runs again ends its task instead of spinning.
    #[tokio::test]
    async fn a_schedule_without_runs_ends() {
        let tasks = TaskTracker::new();
        let schedule = Schedule::parse("0 0 0 30 2 *").unwrap();
        spawn(&tasks, schedule, CancellationToken::new(), || {
            panic!("February 30th came")
        });
        tasks.close();
        tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .expect("a schedule without runs ends its task");
    }
}
