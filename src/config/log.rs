//! `[log]`: how much the daemon says.

use super::section::Section;

/// `[log]`
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogConfig {
    /// proxywarden's own level: one of [`LEVELS`]. Unset, `-v` decides
    /// (`info` for `serve`); `RUST_LOG`, when set, overrides both.
    pub level: Option<String>,
}

/// The levels `log.level` takes, quietest first.
pub const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// Validates `[log]`.
pub(super) fn read(s: &mut Section) -> Option<LogConfig> {
    let level = s.optional("level", Section::string);
    if let Some(level) = &level
        && !LEVELS.contains(&level.as_str())
    {
        s.problem(
            "level",
            &format!("expected one of {}, found {level:?}", LEVELS.join(", ")),
        );
        return None;
    }
    Some(LogConfig { level })
}
