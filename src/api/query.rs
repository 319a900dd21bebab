//! Query parameters parsed by hand, so that every bad value is answered 400
//! with a message naming the parameter and what was expected.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use super::ApiError;
use crate::health::{ProxyQuery, filters};

/// Raw parameters, each name at most once.
#[derive(Debug, Default)]
pub struct Params(HashMap<String, String>);

impl Params {
    /// Parses a query string; repeated names are an error.
    pub fn parse(raw: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        let mut map = HashMap::new();
        for (k, v) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
            if !known.contains(&k.as_ref()) {
                return Err(ApiError::BadRequest(format!(
                    "unknown parameter {k:?} (expected one of: {})",
                    known.join(", ")
                )));
            }
            if map.insert(k.to_string(), v.to_string()).is_some() {
                return Err(ApiError::BadRequest(format!(
                    "parameter {k:?} given more than once (use a comma-separated list)"
                )));
            }
        }
        Ok(Params(map))
    }

    /// The raw value of `name`, if given and not empty.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|s| s.trim()).filter(|s| !s.is_empty())
    }

    fn bad(name: &str, value: &str, expected: &str) -> ApiError {
        ApiError::BadRequest(format!(
            "parameter {name}={value:?} is invalid: expected {expected}"
        ))
    }

    /// A comma-separated list, each item read by `one` (see
    /// [`filters::list`]).
    pub fn list<T>(
        &self,
        name: &str,
        one: impl Fn(&str) -> Result<T, &'static str>,
    ) -> Result<Vec<T>, ApiError> {
        match self.get(name) {
            None => Ok(Vec::new()),
            Some(v) => filters::list(v, one)
                .map_err(|(item, expected)| Params::bad(name, &item, &expected)),
        }
    }

    /// One value read by `one`, if given.
    pub fn value<T>(
        &self,
        name: &str,
        one: impl Fn(&str) -> Result<T, &'static str>,
    ) -> Result<Option<T>, ApiError> {
        self.get(name)
            .map(|v| one(v).map_err(|expected| Params::bad(name, v, expected)))
            .transpose()
    }

    /// A boolean: `true`/`false`/`1`/`0`/`yes`/`no`.
    pub fn boolean(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name)
            .map(|v| match v.to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Ok(true),
                "false" | "0" | "no" => Ok(false),
                _ => Err(Params::bad(name, v, "true or false")),
            })
            .transpose()
    }

    /// A whole number within `min..=max`.
    pub fn number(&self, name: &str, min: i64, max: i64) -> Result<Option<i64>, ApiError> {
        self.get(name)
            .map(|v| match v.parse::<i64>() {
                Ok(n) if (min..=max).contains(&n) => Ok(n),
                _ => Err(Params::bad(
                    name,
                    v,
                    &format!("a whole number from {min} to {max}"),
                )),
            })
            .transpose()
    }

    /// One of `choices`.
    pub fn choice<'a>(&self, name: &str, choices: &[&'a str]) -> Result<Option<&'a str>, ApiError> {
        self.get(name)
            .map(|v| {
                choices
                    .iter()
                    .find(|c| c.eq_ignore_ascii_case(v))
                    .copied()
                    .ok_or_else(|| Params::bad(name, v, &format!("one of {}", choices.join(", "))))
            })
            .transpose()
    }
}

/// The filter parameters every listing accepts.
pub const FILTERS: &[&str] = &[
    "country",
    "scheme",
    "anonymity",
    "https",
    "max_latency_ms",
    "max_age",
    "exclude",
    "site",
];

/// `site=`: the site a client will fetch (see [`parse_site`]).
pub fn site(p: &Params) -> Result<Option<String>, ApiError> {
    p.get("site")
        .map(|v| parse_site(v).map_err(|expected| Params::bad("site", v, expected)))
        .transpose()
}

/// A site as the pool names it, from `shop.example`, `shop.example:8080`
/// or a URL; otherwise what was expected.
pub fn parse_site(text: &str) -> Result<String, &'static str> {
    const EXPECTED: &str =
        "a host name such as shop.example (with :port when not 80 or 443), or a URL";
    let text = text.trim();
    let full = text.contains("://");
    let url = if full {
        url::Url::parse(text)
    } else {
        url::Url::parse(&format!("http://{text}/"))
    };
    match url {
        Ok(u)
            if matches!(u.scheme(), "http" | "https")
                && u.host_str()
                    .is_some_and(|h| !h.is_empty() && h.len() <= 253)
                && u.username().is_empty()
                && u.password().is_none()
                && (full || (u.path() == "/" && u.query().is_none())) =>
        {
            Ok(crate::pool::site_of(&u))
        }
        _ => Err(EXPECTED),
    }
}

/// Builds a query from the filter parameters; `max_age` defaults to
/// `default_max_age`.
pub fn proxy_query(p: &Params, default_max_age: Duration) -> Result<ProxyQuery, ApiError> {
    let mut q = ProxyQuery {
        countries: p.list("country", filters::country)?,
        schemes: p.list("scheme", filters::scheme)?,
        min_anonymity: p.value("anonymity", filters::anonymity)?,
        https: p.boolean("https")?.unwrap_or(false),
        max_latency_ms: p.value("max_latency_ms", filters::max_latency_ms)?,
        max_age: Some(
            p.value("max_age", filters::max_age)?
                .unwrap_or(default_max_age),
        ),
        ..ProxyQuery::default()
    };
    // Each item is read below; a blank one says what was expected.
    let ids_or_addresses = |s: &str| match s {
        "" => Err("proxy ids or host:port"),
        s => Ok(s.to_owned()),
    };
    for item in p.list("exclude", ids_or_addresses)? {
        if let Ok(id) = item.parse::<i64>() {
            q.exclude_ids.insert(id);
        } else if let Ok(addr) = item.parse::<SocketAddr>() {
            q.exclude_addrs.insert(addr);
        } else if let Ok(p) = crate::proxy::Proxy::parse_url(&item) {
            q.exclude_addrs.insert(SocketAddr::new(p.host, p.port));
        } else {
            return Err(Params::bad("exclude", &item, "proxy ids or host:port"));
        }
    }
    Ok(q)
}
