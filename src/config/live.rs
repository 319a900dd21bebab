//! The configuration in force while the daemon runs: the one it started
//! with, then each one a reload (SIGHUP) put in force.

use std::sync::Arc;

use tokio::sync::watch;

use super::Config;

/// The configuration in force, shared by the components that follow a
/// reload (the API's token and allowed hosts, the checks, the harvest
/// schedule). Cheap to clone.
#[derive(Clone, Debug)]
pub struct Live(Arc<watch::Sender<Arc<Config>>>);

impl Live {
    /// `config` in force until [`Live::set`] replaces it.
    pub fn new(config: Arc<Config>) -> Live {
        Live(Arc::new(watch::Sender::new(config)))
    }

    /// The configuration in force now.
    pub fn get(&self) -> Arc<Config> {
        self.0.borrow().clone()
    }

    /// Follows the configuration in force: woken at each [`Live::set`].
    pub fn watch(&self) -> watch::Receiver<Arc<Config>> {
        self.0.subscribe()
    }

    /// Puts `config` in force: what reads [`Live::get`] sees it at once,
    /// what follows [`Live::watch`] at its next step.
    pub fn set(&self, config: Arc<Config>) {
        self.0.send_replace(config);
    }
}
