//! Finding stored proxies by identity, for commands that add proxies they
//! checked themselves (`check --list --store`) and then record the checks.

use super::{Store, StoreError, dispatch};
use crate::proxy::Proxy;

impl Store {
    /// The row id of each proxy, by identity (scheme, host, port,
    /// username), in order; `None` for one that is not stored.
    pub async fn proxy_ids(&self, proxies: Vec<Proxy>) -> Result<Vec<Option<i64>>, StoreError> {
        dispatch!(self.proxy_ids(proxies))
    }
}
