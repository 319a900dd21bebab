//! The harvest round.

/// Placeholder.
pub struct HarvestReport;
/// Placeholder.
pub struct SourceReport;
/// Placeholder.
pub fn harvest_all() {}
