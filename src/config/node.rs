//! `[node]`: this `serve` process as one node of several sharing a
//! database: its name, and how long it holds the proxies it leases for a
//! check.

use std::time::Duration;

use super::section::Section;

/// `[node]`
#[derive(Clone, Debug, PartialEq)]
pub struct NodeConfig {
    /// The node's name, unique among the nodes sharing a database: what
    /// leases, harvest claims and logs name it by. Unset in the file, it
    /// is the host name and process id (see [`NodeConfig::id`]).
    pub id: Option<String>,
    /// How long a proxy leased for a check stays this node's: longer than
    /// any check takes, since a lease that runs out mid-check lets another
    /// node check the proxy too; a dead node's proxies wait this long.
    pub lease: Duration,
}

/// The longest node id: it is stored with every lease.
const MAX_ID: usize = 100;

impl NodeConfig {
    /// The node's id: `id` when set, else `<host name>-<process id>`, so
    /// that two processes on one machine differ too.
    pub fn id(&self) -> String {
        if let Some(id) = &self.id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| "node".to_owned());
        format!("{host}-{}", std::process::id())
    }
}

/// Validates `[node]`.
pub(super) fn read(s: &mut Section) -> Option<NodeConfig> {
    let id = s.optional("id", Section::string);
    let lease = s.duration("lease");
    if let Some(id) = &id
        && (id.is_empty()
            || id.len() > MAX_ID
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)))
    {
        s.problem(
            "id",
            &format!(
                "expected 1 to {MAX_ID} letters, digits or - _ . : (a name unique among the nodes), found {id:?}"
            ),
        );
        return None;
    }
    let lease = lease?;
    if lease < Duration::from_secs(1) {
        s.problem("lease", "expected at least 1s");
        return None;
    }
    Some(NodeConfig { id, lease })
}
