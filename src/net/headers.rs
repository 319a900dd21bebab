//! Reading the response headers every client of the network acts on.

use std::time::{Duration, SystemTime};

use http::HeaderMap;

/// `Retry-After` as a wait from `now`: delay-seconds or an HTTP date (one
/// in the past is no wait). None when absent or unreadable.
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let v = headers
        .get(http::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(v).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_seconds_or_a_date() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        let mut h = HeaderMap::new();
        assert_eq!(retry_after(&h, now), None);
        h.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(7)));
        h.insert(http::header::RETRY_AFTER, " 3 ".parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(3)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        h.insert(http::header::RETRY_AFTER, later.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::from_secs(30)));
        let past = httpdate::fmt_http_date(now - Duration::from_secs(30));
        h.insert(http::header::RETRY_AFTER, past.parse().unwrap());
        assert_eq!(retry_after(&h, now), Some(Duration::ZERO));
        h.insert(http::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&h, now), None);
    }
}
