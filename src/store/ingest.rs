//! A source run written: its candidates in bounded transactions (known
//! proxies updated only where something changed, new ones inserted and
//! counted), the links the list left out unlisted, and the source's row.

use super::{Store, StoreError, dispatch};
use crate::model::CandidateList;

/// What happened when one source was fetched.
#[derive(Clone, Debug)]
pub struct SourceRun {
    /// The source's configured name.
    pub name: String,
    /// Its URL as configured.
    pub url: String,
    /// Its format name.
    pub format: String,
    /// When the fetch started (unix ms); also the `last_seen` of what it found.
    pub started_at: i64,
    /// The last HTTP status received, if any.
    pub http_status: Option<u16>,
    /// How long fetching and parsing took.
    pub duration_ms: i64,
    /// Why the source failed, if it did.
    pub error: Option<String>,
    /// Entries dropped for their address (private, or the daemon's own).
    pub private: usize,
}

/// How a batch of candidates landed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UpsertCounts {
    /// Distinct candidates written.
    pub found: usize,
    /// Of those, proxies the store had never seen.
    pub new: usize,
}

impl Store {
    /// Records one source fetch and writes its candidates. New proxies
    /// start `unknown` and due at once; known ones keep their checked facts
    /// and get the source link and the source's hints updated, and a row
    /// is written only when something in it changes, so a re-harvest of an
    /// unchanged list costs lookups, not writes. A list longer than one
    /// transaction is written in identity order (see
    /// [`CandidateList::sort_by_identity_text`]), so the lookups and inserts
    /// walk the identity index in order. The
    /// candidates go in chunks of bounded transactions, so a huge list never
    /// holds the write lock longer than another process waits for it; then
    /// the source's links that this list left out are unlisted, and the
    /// source's row records the run.
    pub async fn record_source_run(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
    ) -> Result<UpsertCounts, StoreError> {
        let mut counts = UpsertCounts::default();
        self.record_source_run_into(run, candidates, &mut counts)
            .await
            .map(|()| counts)
    }

    /// [`Store::record_source_run`], adding to `counts` what each chunk
    /// wrote as it commits: when a later chunk fails (a full disk), the
    /// chunks before it stay written and `counts` says how many.
    pub async fn record_source_run_into(
        &self,
        run: SourceRun,
        candidates: impl Into<CandidateList>,
        counts: &mut UpsertCounts,
    ) -> Result<(), StoreError> {
        dispatch!(self.record_source_run_into(run, candidates, counts))
    }
}
