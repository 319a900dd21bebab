//! Which URL the crawl fetches next: host queues loaded from the frontier
//! in turn, robots.txt read first for each host, per-host concurrency and
//! delay, and URLs that need no request settled on the spot.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use texting_robots::Robot;
use tokio::time::Instant;

use super::frontier::{Queued, UrlState};
use super::output::Sink;
use super::page::{Fetched, failed_line};
use super::run::{Crawler, Job};
use super::{CrawlError, FetchError};

/// URLs buffered in memory across all host queues; the rest wait in the
/// frontier file.
pub(super) const MAX_BUFFERED: usize = 50_000;

/// Loaded from the frontier per host at a time.
pub(super) const HOST_BATCH: usize = 256;

/// Tries at a host's robots.txt before its pages fail.
pub(super) const ROBOTS_TRIES: u32 = 3;

/// URLs that need no request settled in one look for work, so that a
/// frontier of disallowed links is worked through in committed batches
/// between looks at the pages that finished.
pub(super) const SETTLE_PER_TURN: usize = 256;

/// What the crawler knows of a host's robots.txt.
pub(super) enum RobotsState {
    Unknown,
    /// Being fetched, after this many failed tries.
    Pending(u32),
    /// `None`: everything allowed.
    Ready(Option<Arc<Robot>>),
    Retry {
        at: Instant,
        tries: u32,
    },
    Unavailable,
}

pub(super) struct HostQueue {
    pub(super) buf: VecDeque<Queued>,
    /// More waiting rows in the frontier than in `buf`.
    pub(super) more: bool,
    pub(super) last_id: i64,
    pub(super) in_flight: usize,
    pub(super) robots: RobotsState,
    /// Pages in a row that timed out on two proxies each: the site is slow
    /// or silent, and backs off instead of costing more proxies.
    pub(super) silent: u32,
}

impl HostQueue {
    pub(super) fn new(more: bool, robots: RobotsState) -> HostQueue {
        HostQueue {
            buf: VecDeque::new(),
            more,
            last_id: 0,
            in_flight: 0,
            silent: 0,
            robots,
        }
    }
}

impl Crawler {
    /// The next job of a ready host; otherwise when a host waiting for its
    /// turn may be ready, or `None` when only pages in flight can bring
    /// more work (their end wakes the crawl) or nothing is left.
    ///
    /// URLs that need no request (disallowed, reached through a redirect,
    /// failed with their robots.txt) are settled on the spot and the same
    /// host looked at again, up to [`SETTLE_PER_TURN`] of them: beyond
    /// that it asks to be called again at once, after a commit.
    pub(super) async fn next_job(
        &mut self,
        sink: &mut Sink,
    ) -> Result<(Option<Job>, Option<Instant>), CrawlError> {
        let now = Instant::now();
        let mut wake: Option<Instant> = None;
        let limit_reached = self.opts.max_pages.is_some_and(|m| self.taken >= m);
        if self.hosts_left && self.hosts.len() <= self.opts.max_hosts * 9 / 10 {
            self.take_in_hosts().await?;
        }
        // Hosts to look at in this pass; a host put back at the front to
        // be looked at again counts once more.
        let mut left = self.order.len();
        let mut settled = 0;
        while left > 0 {
            left -= 1;
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some(h) = self.hosts.get_mut(&key) else {
                continue;
            };
            if h.buf.is_empty() && h.more {
                let batch = self.frontier.waiting(&key, h.last_id, HOST_BATCH).await?;
                h.more = batch.len() == HOST_BATCH;
                if let Some(last) = batch.last() {
                    h.last_id = last.id;
                }
                self.buffered += batch.len();
                h.buf.extend(batch);
            }
            if h.buf.is_empty() {
                // Nothing left here; a host whose robots.txt is in flight
                // stays until it lands.
                if matches!(h.robots, RobotsState::Pending(_)) || h.in_flight > 0 {
                    self.order.push_back(key);
                } else {
                    self.hosts.remove(&key);
                }
                continue;
            }
            if limit_reached {
                self.order.push_back(key);
                continue;
            }
            if !self.opts.ignore_robots
                && matches!(h.robots, RobotsState::Ready(_))
                && self.robots.get(&key).is_none()
            {
                // Its rules are a day old (or were crowded out): read again.
                h.robots = RobotsState::Unknown;
            }
            match h.robots {
                RobotsState::Unknown => {
                    h.robots = RobotsState::Pending(0);
                    h.in_flight += 1;
                    let first = ::url::Url::parse(&h.buf[0].url).ok();
                    let robots = first.and_then(|u| u.join("/robots.txt").ok());
                    match robots {
                        Some(url) => {
                            self.order.push_back(key.clone());
                            return Ok((Some(Job::Robots(key, url)), None));
                        }
                        None => {
                            h.in_flight -= 1;
                            h.robots = RobotsState::Ready(None);
                            self.robots.insert(&key, None);
                            self.order.push_front(key);
                            left += 1;
                            continue;
                        }
                    }
                }
                RobotsState::Pending(_) => {
                    self.order.push_back(key);
                    continue;
                }
                RobotsState::Retry { at, tries } if at <= now => {
                    h.robots = RobotsState::Pending(tries);
                    h.in_flight += 1;
                    let url = ::url::Url::parse(&h.buf[0].url)
                        .ok()
                        .and_then(|u| u.join("/robots.txt").ok());
                    if let Some(url) = url {
                        self.order.push_back(key.clone());
                        return Ok((Some(Job::Robots(key, url)), None));
                    }
                    h.in_flight -= 1;
                    h.robots = RobotsState::Ready(None);
                    self.robots.insert(&key, None);
                    self.order.push_front(key);
                    left += 1;
                    continue;
                }
                RobotsState::Retry { at, .. } => {
                    wake = Some(wake.map_or(at, |w| w.min(at)));
                    self.order.push_back(key);
                    continue;
                }
                RobotsState::Ready(_) | RobotsState::Unavailable => {}
            }
            if h.in_flight >= self.opts.per_host_concurrency {
                self.order.push_back(key);
                continue;
            }
            // A host no request has started to yet (robots.txt ignored)
            // is ready: it has no turn to wait for.
            if let Some(ready) = self.polite.ready_at(&key)
                && ready > now
            {
                wake = Some(wake.map_or(ready, |w| w.min(ready)));
                self.order.push_back(key);
                continue;
            }
            let q = h.buf.pop_front().expect("not empty");
            self.buffered -= 1;
            enum Verdict {
                Fetch,
                Redirected,
                Unavailable,
                Disallowed,
            }
            let verdict = match &h.robots {
                _ if self.redirected.remove(&q.url) => Verdict::Redirected,
                RobotsState::Unavailable => Verdict::Unavailable,
                RobotsState::Ready(Some(robot)) if !robot.allowed(&q.url) => Verdict::Disallowed,
                _ => Verdict::Fetch,
            };
            if let Verdict::Fetch = verdict {
                h.in_flight += 1;
                self.order.push_back(key);
                return Ok((Some(Job::Page(q)), None));
            }
            match verdict {
                Verdict::Fetch | Verdict::Redirected => {}
                Verdict::Unavailable => {
                    self.unqueue();
                    let line = failed_line(
                        &q,
                        "robots_unavailable",
                        "robots.txt could not be fetched",
                        0,
                        None,
                    );
                    self.write(sink, &q, line, UrlState::Failed, 0, &[]).await?;
                    *self
                        .summary
                        .failed_by_reason
                        .entry("robots_unavailable".into())
                        .or_default() += 1;
                }
                Verdict::Disallowed => {
                    self.unqueue();
                    self.frontier
                        .finish(q.id, UrlState::Disallowed, 0, &[])
                        .await?;
                    self.summary.disallowed += 1;
                }
            }
            settled += 1;
            if settled >= SETTLE_PER_TURN {
                self.order.push_front(key);
                return Ok((None, Some(now)));
            }
            // The host's next URL may be ready too: look at it again now,
            // not a pass later.
            self.order.push_front(key);
            left += 1;
        }
        // Hosts still in `order` wait for a time (`wake`) or for their
        // pages or robots.txt in flight, whose end runs the next pass.
        if limit_reached {
            return Ok((None, None));
        }
        Ok((None, wake))
    }
    /// Takes in hosts with waiting URLs from the frontier until
    /// [`CrawlOptions::max_hosts`] are held, going round the frontier's
    /// hosts by name from where the last call stopped; when a round finds
    /// room for every one, none is left out.
    pub(super) async fn take_in_hosts(&mut self) -> Result<(), CrawlError> {
        let max = self.opts.max_hosts.max(1);
        let mut from_start = self.host_cursor.is_empty();
        while self.hosts_left && self.hosts.len() < max {
            let want = (max - self.hosts.len()).min(1000);
            let batch = self
                .frontier
                .hosts_with_work_after(&self.host_cursor, want)
                .await?;
            let end = batch.len() < want;
            for h in batch {
                if !self.hosts.contains_key(&h) {
                    self.add_host(&h, true);
                }
                self.host_cursor = h;
            }
            if end {
                self.host_cursor.clear();
                if from_start {
                    self.hosts_left = false;
                }
                from_start = true;
            }
        }
        Ok(())
    }
    /// Takes host `host` in turn (`more`: it has work in the frontier not
    /// yet loaded), with the robots.txt rules already read for it.
    pub(super) fn add_host(&mut self, host: &str, more: bool) {
        let robots = if self.opts.ignore_robots {
            RobotsState::Ready(None)
        } else {
            match self.robots.get(host) {
                Some(rules) => {
                    self.crawl_delay(host, rules.as_deref());
                    RobotsState::Ready(rules)
                }
                None => RobotsState::Unknown,
            }
        };
        self.hosts
            .insert(host.to_owned(), HostQueue::new(more, robots));
        self.order.push_back(host.to_owned());
    }
    /// Spaces host `host`'s requests by its robots.txt's Crawl-delay.
    pub(super) fn crawl_delay(&self, host: &str, robot: Option<&Robot>) {
        if let Some(secs) = robot
            .and_then(|r| r.delay)
            .filter(|d| d.is_finite() && *d > 0.0)
        {
            self.polite
                .set_crawl_delay(host, Duration::from_secs_f32(secs.min(3600.0)));
        }
    }
    /// When page `q` timed out on two proxies in a row and its host has not
    /// done so [`ROBOTS_TRIES`] times in a row: the host backs off (as for
    /// robots.txt, doubled each time) and the page waits its turn again,
    /// neither fetched nor failed. Otherwise hands `q` back to be written.
    pub(super) fn site_silent(
        &mut self,
        q: Queued,
        result: &Result<Fetched, FetchError>,
    ) -> Option<Queued> {
        if !matches!(result, Err(FetchError::SiteTimeout { .. })) {
            return Some(q);
        }
        let Some(h) = self.hosts.get_mut(&q.host) else {
            return Some(q);
        };
        if h.silent >= ROBOTS_TRIES {
            return Some(q);
        }
        let wait = self.opts.robots_retry * 2u32.pow(h.silent - 1);
        tracing::info!(host = %q.host, ?wait, "the site gave no answer in time; backing off");
        self.polite.note(&q.host, None, Some(wait));
        h.buf.push_front(q);
        self.buffered += 1;
        self.taken = self.taken.saturating_sub(1);
        self.progress.queued.fetch_add(1, Ordering::Relaxed);
        None
    }
    pub(super) fn unqueue(&self) {
        let _ = self
            .progress
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}
