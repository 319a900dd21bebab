//! What becomes of a fetched page: hashed and parsed on the blocking pool,
//! its links normalised, kept in scope and bounded, its line written and
//! its end recorded in the frontier; and what a robots.txt fetch means for
//! its host.

use std::collections::HashSet;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sha2::Digest;
use texting_robots::Robot;
use tokio::time::Instant;

use super::frontier::{NewUrl, Queued, UrlState};
use super::output::{self, Sink};
use super::robots::{RobotsOutcome, Rules};
use super::run::{Crawler, Done};
use super::schedule::{MAX_BUFFERED, ROBOTS_TRIES, RobotsState};
use super::{CrawlError, Select, extract, normalize};
use crate::lock;
use crate::pool::{FetchError, Page, RedirectRule, site_of};

/// Hashes of recently seen links kept to spare the frontier most
/// duplicate inserts; cleared when full.
pub(super) const SEEN_CACHE: usize = 200_000;

/// The longest a page may take to parse (the parser also stops at its
/// nesting cap): links and fields read until then are kept. A flat 10 MiB
/// page parses in about a second.
pub(super) const PARSE_TIME: Duration = Duration::from_secs(10);

/// A fetched page, digested in its task.
pub(super) struct Fetched {
    pub(super) page: Page,
    pub(super) sha256: String,
    pub(super) title: Option<String>,
    pub(super) links: Vec<::url::Url>,
    pub(super) fields: std::collections::BTreeMap<String, serde_json::Value>,
    /// Why parsing stopped before the end of the page, if it did.
    pub(super) parse_stopped: Option<crate::html::HtmlError>,
}

impl Crawler {
    pub(super) async fn handle(&mut self, done: Done, sink: &mut Sink) -> Result<(), CrawlError> {
        match done {
            Done::Robots(host, outcome) => {
                let Some(h) = self.hosts.get_mut(&host) else {
                    return Ok(());
                };
                h.in_flight = h.in_flight.saturating_sub(1);
                let tries = match h.robots {
                    RobotsState::Pending(tries) => tries,
                    _ => 0,
                };
                let ready: Result<Option<Arc<Robot>>, String> = match outcome {
                    RobotsOutcome::Parsed(robot) => {
                        self.crawl_delay(&host, Some(&robot));
                        Ok(Some(Arc::new(robot)))
                    }
                    RobotsOutcome::AllowAll => Ok(None),
                    RobotsOutcome::NoProxy(e) => {
                        if let Some(why) = self.no_proxy_matches(&e) {
                            self.no_proxy = Some(why);
                            return Ok(());
                        }
                        Err(e.to_string())
                    }
                    RobotsOutcome::Unavailable(why) => Err(why),
                };
                let Some(h) = self.hosts.get_mut(&host) else {
                    return Ok(());
                };
                match ready {
                    Ok(r) => {
                        self.robots.insert(&host, r.clone());
                        h.robots = RobotsState::Ready(r);
                    }
                    Err(error) if tries + 1 >= ROBOTS_TRIES => {
                        tracing::warn!(host, error, "robots.txt unreachable; its pages fail");
                        h.robots = RobotsState::Unavailable;
                    }
                    Err(error) => {
                        let wait = self.opts.robots_retry * 2u32.pow(tries);
                        tracing::info!(
                            host,
                            ?wait,
                            error,
                            "robots.txt unreachable; trying again later"
                        );
                        h.robots = RobotsState::Retry {
                            at: Instant::now() + wait,
                            tries: tries + 1,
                        };
                    }
                }
            }
            Done::Page(q, result, elapsed) => {
                if let Some(h) = self.hosts.get_mut(&q.host) {
                    h.in_flight = h.in_flight.saturating_sub(1);
                    h.silent = match &*result {
                        Err(FetchError::SiteTimeout { .. }) => h.silent + 1,
                        _ => 0,
                    };
                }
                let q = match self.site_silent(q, &result) {
                    Some(q) => q,
                    None => return Ok(()),
                };
                match *result {
                    Ok(f) => self.fetched(sink, q, f, elapsed).await?,
                    Err(e) => {
                        if matches!(e, FetchError::NoProxy { .. })
                            && let Some(why) = self.no_proxy_matches(&e)
                        {
                            // Not the page's failure: it stays queued.
                            self.no_proxy = Some(why);
                            return Ok(());
                        }
                        let line =
                            failed_line(&q, e.code(), &e.to_string(), e.attempts(), e.status());
                        *self
                            .summary
                            .failed_by_reason
                            .entry(e.code().to_owned())
                            .or_default() += 1;
                        self.write(sink, &q, line, UrlState::Failed, e.attempts(), &[])
                            .await?;
                    }
                }
            }
        }
        Ok(())
    }
    pub(super) async fn fetched(
        &mut self,
        sink: &mut Sink,
        q: Queued,
        f: Fetched,
        elapsed: Duration,
    ) -> Result<(), CrawlError> {
        let page = &f.page;
        let status = page.status().as_u16();
        let failed = status >= 400;
        self.summary.latency.add(elapsed);
        self.summary.bytes += page.body().len() as u64;
        if failed {
            *self
                .summary
                .failed_by_reason
                .entry(format!("http_{status}"))
                .or_default() += 1;
        } else {
            *self.summary.ok_by_status.entry(status).or_default() += 1;
        }
        let final_url = normalize(page.final_url(), &self.opts.strip_params);
        if let Some(fu) = &final_url
            && fu.as_str() != q.url
        {
            // Reached through redirects: that URL needs no fetch of its own.
            self.frontier
                .mark_seen_done(fu.as_str(), &site_of(fu), q.depth)
                .await?;
            if self.redirected.len() < SEEN_CACHE {
                self.redirected.insert(fu.to_string());
            }
        }
        let mut links = Vec::new();
        let follow = self.opts.max_depth.is_none_or(|m| q.depth < m);
        let mut targets: Vec<&::url::Url> = f.links.iter().collect();
        let location = page
            .status()
            .is_redirection()
            .then(|| page.headers().get(http::header::LOCATION))
            .flatten()
            .and_then(|l| l.to_str().ok())
            .and_then(|l| page.final_url().join(l).ok());
        if let Some(l) = &location {
            targets.push(l);
        }
        if follow {
            for link in targets {
                let Some(n) = normalize(link, &self.opts.strip_params) else {
                    continue;
                };
                if !self.scope.allows(&n) || !first_sight(&self.seen, n.as_str()) {
                    continue;
                }
                links.push(NewUrl {
                    host: site_of(&n),
                    url: n.to_string(),
                    depth: q.depth + 1,
                    parent: Some(q.url.clone()),
                });
            }
        }
        self.bound_links(&mut links);
        let line = serde_json::json!({
            "url": q.url,
            "final_url": page.final_url().as_str(),
            "status": status,
            "depth": q.depth,
            "parent": q.parent,
            "proxy": page.proxy().to_string(),
            "attempts": page.attempts(),
            "elapsed_ms": elapsed.as_millis() as u64,
            "content_type": page.content_type(),
            "bytes": page.body().len(),
            "sha256": f.sha256,
            "title": f.title,
            "links": f.links.len(),
            "fields": f.fields,
            "parse_stopped": f.parse_stopped.as_ref().map(stopped_note),
            "error": failed.then(|| format!("http {status}")),
        });
        let state = if failed {
            UrlState::Failed
        } else {
            UrlState::Done
        };
        self.write(sink, &q, line, state, page.attempts(), &links)
            .await
    }
    /// Writes a page's line, then commits its end (with the output length)
    /// and the links it added.
    pub(super) async fn write(
        &mut self,
        sink: &mut Sink,
        q: &Queued,
        line: serde_json::Value,
        state: UrlState,
        attempts: u32,
        links: &[NewUrl],
    ) -> Result<(), CrawlError> {
        let failed = state == UrlState::Failed;
        sink.page(&line, failed)
            .map_err(|source| CrawlError::Output {
                what: "the output".into(),
                source,
            })?;
        let added = self.frontier.finish(q.id, state, attempts, links).await?;
        self.known += added.len() as u64;
        self.progress.done.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.progress.failed.fetch_add(1, Ordering::Relaxed);
        }
        for a in added {
            self.progress.queued.fetch_add(1, Ordering::Relaxed);
            if !self.hosts.contains_key(&a.host) {
                if self.hosts.len() >= self.opts.max_hosts.max(1) {
                    // Waits in the frontier for a place.
                    self.hosts_left = true;
                    continue;
                }
                self.add_host(&a.host, false);
            }
            let Some(h) = self.hosts.get_mut(&a.host) else {
                continue;
            };
            if !h.more && self.buffered < MAX_BUFFERED {
                h.last_id = a.id;
                h.buf.push_back(a);
                self.buffered += 1;
            } else {
                h.more = true;
            }
        }
        self.progress
            .queued
            .store(self.buffered as u64, Ordering::Relaxed);
        Ok(())
    }
    /// Keeps of a page's new links what the caps allow: at most
    /// `max_new_links`, and no more than the frontier has room for; counts
    /// the rest.
    pub(super) fn bound_links(&mut self, links: &mut Vec<NewUrl>) {
        if let Some(max) = self.opts.max_new_links
            && links.len() > max
        {
            self.summary.links_cut += (links.len() - max) as u64;
            links.truncate(max);
        }
        if let Some(max) = self.max_frontier {
            let room = usize::try_from(max.saturating_sub(self.known)).unwrap_or(usize::MAX);
            if links.len() > room {
                self.summary.frontier_full += (links.len() - room) as u64;
                links.truncate(room);
            }
        }
    }
    /// Redirects are followed within the host (so its politeness and
    /// robots.txt hold), in scope and allowed; others end the page, and
    /// the target is queued as a link. One rule per page: a hop it agreed
    /// to is agreed to again when the page is tried on another proxy, so a
    /// proxied page follows the chain a direct one does.
    pub(super) fn follow_rule(&self, host: &str) -> RedirectRule {
        let scope = self.scope.clone();
        // Redirects stay on the page's host: its rules are the ones.
        let robots: Option<Rules> = self.hosts.get(host).and_then(|h| match &h.robots {
            RobotsState::Ready(r) => Some(r.clone()),
            _ => None,
        });
        let strip = self.opts.strip_params.clone();
        let ignore = self.opts.ignore_robots;
        let seen = self.seen.clone();
        // At most the redirects of each attempt.
        let agreed: Mutex<HashSet<String>> = Mutex::default();
        Arc::new(move |from, to| {
            let Some(to) = normalize(to, &strip) else {
                return false;
            };
            if site_of(from) != site_of(&to) || !scope.allows(&to) {
                return false;
            }
            let allowed = ignore
                || robots
                    .as_ref()
                    .is_some_and(|r| r.as_ref().is_none_or(|r| r.allowed(to.as_str())));
            if lock(&agreed).contains(to.as_str()) {
                return true;
            }
            let follow = allowed && first_sight(&seen, to.as_str());
            if follow {
                lock(&agreed).insert(to.to_string());
            }
            follow
        })
    }
}

pub(super) fn hash(url: &str) -> u64 {
    let mut h = DefaultHasher::new();
    url.hash(&mut h);
    h.finish()
}

/// False when `url` was seen lately; notes it otherwise.
pub(super) fn first_sight(seen: &Mutex<HashSet<u64>>, url: &str) -> bool {
    let mut seen = lock(seen);
    if seen.len() >= SEEN_CACHE {
        seen.clear();
    }
    seen.insert(hash(url))
}

/// The body's SHA-256 and, when it is `html`, its title, links and fields.
pub(super) fn hash_and_extract(
    body: &[u8],
    base: &::url::Url,
    html: bool,
    selects: &[Select],
    all: bool,
) -> (String, extract::Extracted) {
    let e = if html {
        let deadline = crate::html::Deadline {
            started: std::time::Instant::now(),
            allowed: PARSE_TIME,
            setting: "the crawl's parse time",
        };
        let text = String::from_utf8_lossy(body);
        extract::extract(&text, base, selects, all, Some(deadline))
    } else {
        extract::Extracted::default()
    };
    (sha256_hex(body), e)
}

/// A successful answer that is (or says nothing against being) HTML.
pub(super) fn is_html(page: &Page) -> bool {
    page.status().is_success()
        && page
            .content_type()
            .is_none_or(|t| t.to_ascii_lowercase().contains("html"))
}

/// The largest body a crawl on a thread of its own parses there, in bytes:
/// a small page costs less to parse than a hand-over to the blocking pool
/// and back; a larger one would hold up the crawl's other pages.
const PARSE_HERE_MAX: usize = 64 * 1024;

/// Hashes, parses and stores a page in its own task; hashing and parsing
/// (CPU work that grows with the page) run on the blocking pool (with
/// `here`, for a crawl on a thread of its own, a page of at most
/// [`PARSE_HERE_MAX`] bytes is parsed on that thread), bounded by
/// [`PARSE_TIME`] and the parser's caps, at most [`crate::html::parsers`]
/// pages at once.
pub(super) async fn digest(
    page: Page,
    selects: Arc<[Select]>,
    all: bool,
    bodies: Option<&std::path::Path>,
    here: bool,
) -> Fetched {
    let body = page.body().clone();
    let base = page.final_url().clone();
    let html = is_html(&page);
    // Pages parsed at once are bounded per process (each holds a tree):
    // the others wait here with their bodies.
    let _parsing = match html {
        true => crate::html::parsers().acquire().await.ok(),
        false => None,
    };
    let joined = match here && body.len() <= PARSE_HERE_MAX {
        true => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            hash_and_extract(&body, &base, html, &selects, all)
        }))
        .map_err(|_| "the parser panicked".to_owned()),
        false => {
            tokio::task::spawn_blocking(move || hash_and_extract(&body, &base, html, &selects, all))
                .await
                .map_err(|e| e.to_string())
        }
    };
    let (sha256, e) = match joined {
        Ok(done) => done,
        // A parser panic is a bug; it costs the page its extraction, not
        // the crawl.
        Err(error) => {
            tracing::warn!(url = %page.final_url(), %error, "parsing a page failed unexpectedly");
            (sha256_hex(page.body()), extract::Extracted::default())
        }
    };
    if let Some(dir) = bodies
        && let Err(e) = output::store_body(dir, &sha256, page.body()).await
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot store a body");
    }
    Fetched {
        page,
        sha256,
        title: e.title,
        links: e.links,
        fields: e.fields,
        parse_stopped: e.stopped,
    }
}

pub(super) fn sha256_hex(body: &[u8]) -> String {
    sha2::Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What the output says of a page whose parse stopped early.
pub(super) fn stopped_note(e: &crate::html::HtmlError) -> String {
    use crate::html::{HtmlError, MAX_DEPTH};
    match e {
        HtmlError::TooDeep => {
            format!("nested deeper than {MAX_DEPTH} elements: links and fields read up to there")
        }
        HtmlError::TooManyNodes => format!(
            "more than {} nodes: links and fields read up to there",
            crate::html::MAX_NODES
        ),
        HtmlError::TooManyAttributes => format!(
            "more than {} attributes, or a tag with more than {}: links and fields read up to there",
            crate::html::MAX_ATTRIBUTES,
            crate::html::MAX_TAG_ATTRIBUTES
        ),
        HtmlError::TooSlow(allowed, _) => format!(
            "took longer than {} to parse: links and fields read up to there",
            humantime::format_duration(*allowed)
        ),
    }
}

pub(super) fn failed_line(
    q: &Queued,
    code: &str,
    message: &str,
    attempts: u32,
    status: Option<u16>,
) -> serde_json::Value {
    serde_json::json!({
        "url": q.url,
        "final_url": null,
        "status": status,
        "depth": q.depth,
        "parent": q.parent,
        "proxy": null,
        "attempts": attempts,
        "error": format!("{code}: {message}"),
    })
}
