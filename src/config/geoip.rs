//! `[geoip]`: the optional country database for exit IPs.

use std::path::PathBuf;

use super::section::Section;

/// `[geoip]`
#[derive(Clone, Debug, PartialEq)]
pub struct GeoipConfig {
    /// A MaxMind-format country database.
    pub database: Option<PathBuf>,
}

/// Validates `[geoip]`.
pub(super) fn read(s: &mut Section) -> GeoipConfig {
    GeoipConfig {
        database: s.optional_path("database"),
    }
}
