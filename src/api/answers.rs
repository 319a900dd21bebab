//! Rendered `/proxy` answers, cached per indexed entry: the same proxy is
//! handed out many times between two checks, and rendering it once is most
//! of what serving costs. An entry's version tells a stale answer apart.

use std::collections::HashMap;
use std::sync::RwLock;

use bytes::Bytes;

use crate::export::ExportRow;
use crate::health::Entry;

/// The forms an answer is rendered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// The proxy's fields as JSON.
    Json,
    /// `scheme://[user:pass@]host:port`.
    Text,
}

/// Answers by (proxy id, form), each with the entry version it renders.
#[derive(Debug, Default)]
pub struct Answers {
    cache: RwLock<HashMap<(i64, Form), (u64, Bytes)>>,
}

impl Answers {
    /// The answer for `entry` in `form`, rendered now if the cache has none
    /// for this version of the entry.
    pub fn get(&self, entry: &Entry, form: Form, index_len: usize) -> Bytes {
        let key = (entry.id, form);
        if let Some((version, body)) = self
            .cache
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            && *version == entry.version
        {
            return body.clone();
        }
        let body = render(entry, form);
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        // Bounded by the index: answers of proxies that left it are dropped
        // wholesale once they could make up half the cache.
        if cache.len() >= 2 * (index_len + 1) * 2 {
            cache.clear();
        }
        cache.insert(key, (entry.version, body.clone()));
        body
    }
}

fn render(entry: &Entry, form: Form) -> Bytes {
    match form {
        Form::Text => Bytes::from(entry.proxy.to_string()),
        // Serialising a plain struct of strings and numbers cannot fail.
        Form::Json => {
            Bytes::from(serde_json::to_vec(&ExportRow::from(&*entry.record)).unwrap_or_default())
        }
    }
}
