//! One harvest round: every enabled source fetched with bounded
//! concurrency, parsed off the async runtime, and written to the store in
//! one transaction per source. One broken source never fails the others.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;

use super::addresses::AddressPolicy;
use super::fetch::{Fetched, Fetcher};
use super::{Candidates, html, json, pattern, text};
use crate::config::{Config, SourceConfig, SourceFormat, SourceLocation};
use crate::store::{SourceRun, Store, StoreError, UpsertCounts, WriteFailure, now_ms};

/// What happened to one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceReport {
    /// The source's name.
    pub name: String,
    /// Distinct proxies it listed.
    pub found: usize,
    /// Of those, proxies written to the store: all of them unless the
    /// store failed (see `store_error`).
    pub stored: usize,
    /// Of those, proxies the store had never seen.
    pub new: usize,
    /// The last HTTP status, for URL sources.
    pub http_status: Option<u16>,
    /// Pages fetched.
    pub pages: u32,
    /// Fetch, parse and store time.
    pub duration: Duration,
    /// True when `max_per_source` cut the list short.
    pub truncated: bool,
    /// Entries dropped for their address: private, loopback and the like
    /// (unless `harvest.allow_private_addresses`), or the daemon's own.
    pub private: usize,
    /// Why the source failed, if it did (fetching or parsing it).
    pub error: Option<String>,
    /// Why the store could not take all it listed (a full disk, say): not
    /// the source's fault, so kept apart from `error`.
    pub store_error: Option<String>,
    /// The disk's part in `store_error`, when it refused the write.
    pub unwritable: Option<WriteFailure>,
}

impl SourceReport {
    /// A source "worked" when it produced proxies or failed in no way.
    pub fn worked(&self) -> bool {
        self.error.is_none() || self.found > 0
    }

    /// True when everything it listed was stored.
    pub fn stored_all(&self) -> bool {
        self.store_error.is_none()
    }
}

/// How far a round is, for progress displays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    /// Sources finished so far, this one included.
    pub finished: usize,
    /// Sources in the round.
    pub total: usize,
}

/// What a whole round did.
#[derive(Clone, Debug)]
pub struct HarvestReport {
    /// Per source, in config order.
    pub sources: Vec<SourceReport>,
    /// Distinct proxies listed by any source this round.
    pub distinct: i64,
    /// Proxies new to the store.
    pub new: usize,
    /// Wall time of the round.
    pub elapsed: Duration,
}

impl HarvestReport {
    /// True when at least one source worked.
    pub fn any_worked(&self) -> bool {
        self.sources.iter().any(SourceReport::worked)
    }

    /// The first error of the store, if it could not take all that was
    /// listed.
    pub fn store_error(&self) -> Option<&str> {
        self.sources.iter().find_map(|s| s.store_error.as_deref())
    }
}

/// Why a round could not run at all (a single source failing is not this).
#[derive(Debug, thiserror::Error)]
pub enum HarvestError {
    /// No source is enabled in the config.
    #[error("no enabled sources in the config")]
    NoSources,
    /// The HTTP client could not be built.
    #[error(transparent)]
    Fetch(#[from] super::fetch::FetchError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Harvests every enabled source once into `store`.
pub async fn harvest_all(config: &Config, store: &Store) -> Result<HarvestReport, HarvestError> {
    harvest_all_reporting(config, store, &|_, _| {}).await
}

/// Like [`harvest_all`], calling `done` with each source's report as soon as
/// that source is finished, and how many of the round's sources are
/// finished by then (for progress on a terminal).
pub async fn harvest_all_reporting(
    config: &Config,
    store: &Store,
    done: &(dyn Fn(&SourceReport, Progress) + Sync),
) -> Result<HarvestReport, HarvestError> {
    harvest_all_with(config, store, AddressPolicy::from_config(config), done).await
}

/// Like [`harvest_all_reporting`], keeping the addresses `policy` keeps
/// (the daemon's names the addresses it actually listens on).
pub async fn harvest_all_with(
    config: &Config,
    store: &Store,
    policy: AddressPolicy,
    done: &(dyn Fn(&SourceReport, Progress) + Sync),
) -> Result<HarvestReport, HarvestError> {
    let policy = Arc::new(policy);
    // Owned copies keep the stream's futures free of borrowed lifetimes, so
    // the round can run inside spawned tasks.
    let sources: Vec<SourceConfig> = config
        .sources
        .iter()
        .filter(|s| s.enabled)
        .cloned()
        .collect();
    if sources.is_empty() {
        return Err(HarvestError::NoSources);
    }
    let fetcher = Fetcher::new(&config.harvest, policy.allow_private)?;
    let started = Instant::now();
    let round_start = now_ms();
    let limit = config.harvest.max_per_source;
    // A page may not cost more to parse than it may take to fetch.
    let parse_time = config.harvest.timeout;
    let total = sources.len();
    let mut stream = futures::stream::iter(sources.into_iter().enumerate())
        .map(|(i, src)| {
            let fetcher = fetcher.clone();
            let store = store.clone();
            let policy = policy.clone();
            async move {
                let report =
                    harvest_source(&fetcher, &store, &src, limit, parse_time, policy).await;
                (i, report)
            }
        })
        .buffer_unordered(config.harvest.concurrency);
    let mut reports: Vec<(usize, SourceReport)> = Vec::with_capacity(total);
    while let Some((i, report)) = stream.next().await {
        let finished = reports.len() + 1;
        done(&report, Progress { finished, total });
        reports.push((i, report));
    }
    reports.sort_by_key(|(i, _)| *i);
    let sources: Vec<SourceReport> = reports.into_iter().map(|(_, r)| r).collect();
    let distinct = store.count_seen_since(round_start).await?;
    let new = sources.iter().map(|s| s.new).sum();
    let report = HarvestReport {
        sources,
        distinct,
        new,
        elapsed: started.elapsed(),
    };
    let failed = report.sources.iter().filter(|s| !s.worked()).count();
    let not_stored = report.sources.iter().filter(|s| !s.stored_all()).count();
    tracing::info!(
        sources = report.sources.len(),
        failed,
        not_stored,
        distinct = report.distinct,
        new = report.new,
        elapsed_ms = report.elapsed.as_millis() as u64,
        "harvest finished"
    );
    Ok(report)
}

/// Fetches, parses and stores one source; every failure ends up in the
/// report and the source's row, never as an error of the round.
async fn harvest_source(
    fetcher: &Fetcher,
    store: &Store,
    src: &SourceConfig,
    limit: usize,
    parse_time: Duration,
    policy: Arc<AddressPolicy>,
) -> SourceReport {
    let started = Instant::now();
    let started_at = now_ms();
    let mut candidates = Candidates::with_policy(limit, policy.clone());
    let mut http_status = None;
    let mut error = None;
    let mut pages = 0;
    let page_count = src.pages.unwrap_or(1);
    for page in 1..=page_count {
        let fetched = match &src.location {
            SourceLocation::File(path) => fetcher.fetch_file(path).await,
            SourceLocation::Http(url) => {
                let url = url.replace("{page}", &page.to_string());
                fetcher.fetch_url(&url, &src.headers).await
            }
        };
        pages = page;
        let Fetched { status, body } = match fetched {
            Ok(f) => f,
            Err(e) => {
                http_status = e.status.or(http_status);
                error = Some(if page_count > 1 {
                    format!("page {page}: {e}")
                } else {
                    e.to_string()
                });
                break;
            }
        };
        http_status = status;
        let before = candidates.len();
        let scripted = page == 1 && has_scripts(&body);
        let (parsed, parse_error) =
            parse_off_runtime(src.format.clone(), src.scheme, body, candidates, parse_time).await;
        candidates = parsed;
        if let Some(e) = parse_error {
            error = Some(if page_count > 1 {
                format!("page {page}: {e}")
            } else {
                e
            });
        }
        if error.is_some() || candidates.truncated() {
            break;
        }
        // Paged APIs answer past their end with an empty page.
        if candidates.len() == before {
            if page == 1
                && candidates.private() > 0
                && candidates.private() == candidates.unusable()
            {
                error = Some(format!(
                    "every address it lists is one no proxy can listen on (0.0.0.0, broadcast \
                     or multicast; {} entries dropped)",
                    candidates.private()
                ));
            } else if page == 1 && candidates.private() > 0 {
                error = Some(format!(
                    "every address it lists is private or the daemon's own ({} entries \
                     dropped{})",
                    candidates.private(),
                    if policy.allow_private {
                        ""
                    } else {
                        "; harvest.allow_private_addresses = true keeps private ones"
                    }
                ));
            } else if page == 1 {
                error = Some(format!(
                    "no proxies found in the {} body{}",
                    src.format.name(),
                    if scripted {
                        "; the page has scripts: addresses a page writes with JavaScript \
                         are not read"
                    } else {
                        ""
                    }
                ));
            }
            break;
        }
    }
    if candidates.truncated() {
        tracing::warn!(
            source = %src.name,
            kept = candidates.len(),
            "source lists more than harvest.max_per_source proxies; the rest were dropped"
        );
    }
    let truncated = candidates.truncated();
    let private = candidates.private();
    if private > 0 {
        tracing::info!(
            source = %src.name,
            private,
            "dropped entries on private, loopback or the daemon's own addresses"
        );
    }
    let items = candidates.into_list();
    let listed = items.len();
    let run = SourceRun {
        name: src.name.clone(),
        url: src.url.clone(),
        format: src.format.name().to_owned(),
        started_at,
        http_status,
        duration_ms: started.elapsed().as_millis() as i64,
        error: error.clone(),
        private,
    };
    let mut counts = UpsertCounts::default();
    let stored = store.record_source_run_into(run, items, &mut counts).await;
    let (found, store_error, unwritable) = match stored {
        Ok(()) => (counts.found, None, None),
        Err(e) => {
            let unwritable = e.write_failure();
            // What was written went in whole transactions; it stays.
            (listed.max(counts.found), Some(e.to_string()), unwritable)
        }
    };
    match (&error, &store_error) {
        // Said once by the caller, with every failed source: the daemon's
        // line per harvest, the command's table.
        (Some(e), _) => tracing::debug!(source = %src.name, found, error = %e, "source failed"),
        // A disk refusing writes is reported once for all sources (by the
        // daemon, or the command's summary).
        (None, Some(e)) if unwritable.is_some() => {
            tracing::debug!(source = %src.name, found, stored = counts.found, error = %e, "source not stored")
        }
        (None, Some(e)) => {
            tracing::warn!(source = %src.name, found, stored = counts.found, error = %e, "source not stored")
        }
        (None, None) => {
            tracing::debug!(source = %src.name, found, new = counts.new, "source harvested")
        }
    }
    SourceReport {
        name: src.name.clone(),
        found,
        stored: counts.found,
        new: counts.new,
        http_status,
        pages,
        duration: started.elapsed(),
        truncated,
        private,
        error,
        store_error,
        unwritable,
    }
}

/// True when `body` holds a `<script` tag (any case): a page that finds no
/// proxies and has scripts most likely writes its addresses with
/// JavaScript, which no format runs.
fn has_scripts(body: &str) -> bool {
    memchr::memmem::find_iter(body.as_bytes(), b"<").any(|i| {
        body.as_bytes()[i + 1..]
            .get(..6)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"script"))
    })
}

/// Parsing a 10 MiB body is CPU work; it runs on the blocking pool so the
/// runtime keeps serving other sources. HTML, the one format whose parsing
/// is not linear, gives up after `allowed` (counted from now, so that time
/// spent waiting for a blocking thread counts too). Returns what was parsed
/// and the parse error, if any (candidates found before an error are kept).
async fn parse_off_runtime(
    format: SourceFormat,
    scheme: super::SourceScheme,
    body: String,
    mut out: Candidates,
    allowed: Duration,
) -> (Candidates, Option<String>) {
    let started = Instant::now();
    // An HTML list's tree is bounded in nodes; lists parsed at once are
    // bounded per process, with the crawl's pages.
    let _parsing = match format {
        SourceFormat::Html(_) => crate::html::parsers().acquire().await.ok(),
        _ => None,
    };
    let joined = tokio::task::spawn_blocking(move || {
        let error = match &format {
            SourceFormat::Text(opts) => {
                text::parse_with(&body, opts, scheme, &mut out);
                None
            }
            SourceFormat::Regex(opts) => {
                pattern::parse(&body, opts, scheme, &mut out, Some((started, allowed)))
                    .err()
                    .map(|e| e.to_string())
            }
            SourceFormat::Html(opts) => {
                html::parse_bounded(&body, opts, scheme, &mut out, Some((started, allowed)))
                    .err()
                    .map(|e| e.to_string())
            }
            SourceFormat::Json(opts) => json::parse(&body, opts, scheme, &mut out)
                .err()
                .map(|e| e.to_string()),
        };
        (out, error)
    })
    .await;
    match joined {
        Ok(r) => r,
        // A parser panic is a bug, but it must not take the harvest down.
        Err(e) => (
            Candidates::new(0),
            Some(format!("parser failed unexpectedly: {e}")),
        ),
    }
}
