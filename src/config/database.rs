//! `[database]`: where the SQLite file lives.

use std::path::PathBuf;

use super::section::Section;

/// `[database]`
#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseConfig {
    /// The SQLite file.
    pub path: PathBuf,
}

/// Validates `[database]`.
pub(super) fn read(s: &mut Section) -> Option<DatabaseConfig> {
    Some(DatabaseConfig {
        path: s.path("path")?,
    })
}
