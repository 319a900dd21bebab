//! A source run written: its candidates in bounded transactions (known
//! proxies updated only where something changed, new ones inserted and
//! counted), the links the list left out unlisted, and the source's row.

use super::{Store, StoreError, dispatch};
use crate::model::{Candidate, CandidateList};
use crate::proxy::Anonymity;

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

/// True when two candidates of the chunk share an address (and user
/// name), whatever their schemes: one may then find or change the row the
/// other writes, which only the row-by-row path sees.
pub(super) fn addresses_repeat(candidates: &[Candidate]) -> bool {
    // Sorting a chunk's addresses costs less than hashing them.
    let mut addresses: Vec<_> = candidates
        .iter()
        .map(|c| (c.proxy.host, c.proxy.port, c.proxy.username()))
        .collect();
    addresses.sort_unstable();
    addresses.windows(2).any(|w| w[0] == w[1])
}

/// What a stored proxy's row holds of what a source may tell about it.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StoredHints<'a> {
    pub password: Option<&'a str>,
    pub detect: bool,
    pub country: Option<&'a str>,
    pub country_source: Option<&'a str>,
    pub anonymity: Option<&'a str>,
    pub https: Option<bool>,
}

impl StoredHints<'_> {
    /// Whether writing candidate `c` over this row changes it, and whether
    /// its country changes (which changes what filters select). A GeoIP
    /// country is what the exit address really is: a source's claim never
    /// overrides it. The same rules as every backend's update statement.
    pub(super) fn changed_by(&self, c: &Candidate) -> (bool, bool) {
        let password = c.proxy.auth.as_ref().map(|a| a.password.as_str());
        let country = c.hints.country.as_ref().map(|c| c.as_str());
        let country_changes =
            self.country_source != Some("geoip") && country.is_some() && self.country != country;
        let changes = country_changes
            || (password.is_some() && self.password != password)
            || (self.detect && !c.detect)
            || (country.is_some()
                && self.country_source != Some("geoip")
                && self.country_source != Some("source"))
            || (c.hints.anonymity.is_some()
                && self.anonymity != c.hints.anonymity.map(Anonymity::as_str))
            || (c.hints.https.is_some() && self.https != c.hints.https);
        (changes, country_changes)
    }
}
