//! The checker of the latest round, for checks made outside rounds
//! (`verify=true`).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::Checker;

/// The checker the check loop prepared last (judges asked, own address
/// known); none until the first round is ready. Cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Current(Arc<watch::Sender<Option<Arc<Checker>>>>);

impl Current {
    /// Hands out `checker` from now on.
    pub fn set(&self, checker: Arc<Checker>) {
        self.0.send_replace(Some(checker));
    }

    /// The current checker; right after start-up, when the first one is
    /// still being prepared, waits for it up to `wait`.
    pub async fn wait(&self, wait: Duration) -> Option<Arc<Checker>> {
        let mut rx = self.0.subscribe();
        let ready = tokio::time::timeout(wait, rx.wait_for(Option::is_some)).await;
        match ready {
            Ok(Ok(checker)) => checker.clone(),
            _ => None,
        }
    }
}
