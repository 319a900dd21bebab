//! What keeps the daemon from doing its whole job right now (every judge
//! out of reach, say): each condition with its reason and since when,
//! reported by `/healthz` as `degraded` while serving goes on.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;

use crate::lock;

/// One condition in force.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Condition {
    /// The part affected (`judges`).
    pub component: &'static str,
    /// What is wrong, for people.
    pub message: String,
    /// When it began (unix ms).
    #[serde(skip)]
    pub since_ms: i64,
    /// When it began (RFC 3339).
    pub since: String,
}

/// The conditions in force, by component: a cheap handle is an `Arc` of it.
#[derive(Debug, Default)]
pub struct Conditions {
    now: Mutex<BTreeMap<&'static str, Condition>>,
}

impl Conditions {
    /// Notes that `component` is degraded at `now` (unix ms), or still is
    /// (it then keeps its start and takes the new message). True when it
    /// was not before.
    pub fn set(&self, component: &'static str, message: String, now: i64) -> bool {
        let mut all = lock(&self.now);
        match all.get_mut(component) {
            Some(c) => {
                c.message = message;
                false
            }
            None => {
                all.insert(
                    component,
                    Condition {
                        component,
                        message,
                        since_ms: now,
                        since: crate::store::rfc3339(now),
                    },
                );
                true
            }
        }
    }

    /// Notes that `component` works again; the condition it was in, if any.
    pub fn clear(&self, component: &'static str) -> Option<Condition> {
        lock(&self.now).remove(component)
    }

    /// The condition of `component`, if any.
    pub fn get(&self, component: &'static str) -> Option<Condition> {
        lock(&self.now).get(component).cloned()
    }

    /// Every condition in force, by component.
    pub fn all(&self) -> Vec<Condition> {
        lock(&self.now).values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_start_until_cleared() {
        let c = Conditions::default();
        assert!(c.set("judges", "no judge answers".into(), 1_000));
        assert!(!c.set("judges", "still none".into(), 5_000));
        let now = c.get("judges").unwrap();
        assert_eq!((now.since_ms, now.message.as_str()), (1_000, "still none"));
        assert_eq!(c.all().len(), 1);
        assert_eq!(c.clear("judges").unwrap().since_ms, 1_000);
        assert!(c.all().is_empty());
        assert!(c.clear("judges").is_none());
    }
}
