//! The running process's log level, changed by `log.level` at start and on
//! a reload (SIGHUP). The binary installs the hook that swaps its filter;
//! without one (a library user, or `RUST_LOG` set, which wins) setting a
//! level does nothing.

use std::sync::OnceLock;

type Hook = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The level the process started with, and how to change it.
static HOOK: OnceLock<(String, Hook)> = OnceLock::new();

/// Installs `set`, which puts a level in force; `base` is the level in
/// force now, used again when `log.level` is removed.
pub fn install(base: &str, set: impl Fn(&str) -> Result<(), String> + Send + Sync + 'static) {
    let _ = HOOK.set((base.to_owned(), Box::new(set)));
}

/// Puts `level` in force (`None`: the level the process started with).
/// Whether a hook was there to do it.
pub fn set(level: Option<&str>) -> Result<bool, String> {
    match HOOK.get() {
        Some((base, set)) => set(level.unwrap_or(base)).map(|()| true),
        None => Ok(false),
    }
}
