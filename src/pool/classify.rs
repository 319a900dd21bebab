//! What an answer means for the proxy that carried it: content, a site
//! blocking this proxy, the site failing on its own, or the proxy failing
//! (a proxy-made 502/504, a captive portal in place of the page).

use std::time::{Duration, SystemTime};

use http::{HeaderMap, StatusCode};
use regex::Regex;

use crate::model::{Block, Reason, UseVerdict};

/// How much of a body the patterns look at: block and portal pages say
/// what they are near the top, and scanning megabytes per page would cost
/// more than the fetch.
const SCAN: usize = 16 * 1024;

/// Decides which answers are blocks and which are a proxy's own page. The
/// defaults catch the common captcha and captive-portal pages; callers add
/// the markers of the sites they crawl.
#[derive(Clone, Debug)]
pub struct Classifier {
    /// Statuses that mean "the site refuses this proxy" (default 403, 429,
    /// 503): the (proxy, site) pair cools down, another proxy is tried.
    pub block_statuses: Vec<u16>,
    /// A body matching one of these (in its first 16 KiB) is a captcha or
    /// ban page, whatever its status.
    pub block_patterns: Vec<Regex>,
    /// A body matching one of these (in its first 16 KiB) came from the
    /// proxy, not the site (a captive portal, a login wall): the proxy is
    /// lying and is treated as failed. Not applied to TLS answers, which the
    /// certificate proves came from the site.
    pub portal_patterns: Vec<Regex>,
}

/// Default captcha and ban page markers.
pub const DEFAULT_BLOCK_PATTERNS: &[&str] = &[
    r"(?i)<title>\s*(captcha|access denied|attention required|just a moment|are you a (ro)?bot)",
    r"(?i)g-recaptcha|h-captcha|cf-chl-|challenge-platform|/captcha/",
    r"(?i)unusual traffic from your (computer )?network",
];

/// Default captive-portal and proxy login page markers.
pub const DEFAULT_PORTAL_PATTERNS: &[&str] = &[
    r"(?i)captive.portal|hotspot login|wi-?fi login|free ?wi-?fi",
    r"(?i)please (log|sign) ?in to (use|access|continue|the network)",
    r"(?i)welcome to [^<]{0,40}(wi-?fi|hotspot)",
];

impl Default for Classifier {
    fn default() -> Classifier {
        let compile = |ps: &[&str]| {
            ps.iter()
                .map(|p| Regex::new(p).expect("built-in patterns compile"))
                .collect()
        };
        Classifier {
            block_statuses: vec![403, 429, 503],
            block_patterns: compile(DEFAULT_BLOCK_PATTERNS),
            portal_patterns: compile(DEFAULT_PORTAL_PATTERNS),
        }
    }
}

impl Classifier {
    /// What an answer says of the proxy that carried it, and the
    /// `Retry-After` of a block. A page the site meant (404, 410, …) is
    /// [`UseVerdict::Worked`]. `forward` is true when an HTTP proxy fetched
    /// the URL itself (absolute-form): its 502/504 are its own failures.
    /// `tls` is true when the answer came over TLS verified end to end.
    pub(crate) fn classify(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        body: &[u8],
        forward: bool,
        tls: bool,
    ) -> (UseVerdict, Option<Duration>) {
        let code = status.as_u16();
        if forward && matches!(code, 502 | 504) {
            return (UseVerdict::failed(Reason::BadStatus), None);
        }
        if code == 407 {
            return (UseVerdict::failed(Reason::ProxyAuthRequired), None);
        }
        let head = String::from_utf8_lossy(&body[..body.len().min(SCAN)]);
        if !tls && self.portal_patterns.iter().any(|p| p.is_match(&head)) {
            return (UseVerdict::failed(Reason::ContentMismatch), None);
        }
        let page = self.block_patterns.iter().any(|p| p.is_match(&head));
        if page || self.block_statuses.contains(&code) {
            let block = if page {
                Block::Banned
            } else if matches!(code, 429 | 503) {
                Block::RateLimited
            } else {
                Block::Refused
            };
            let wait = crate::net::retry_after(headers, SystemTime::now());
            return (UseVerdict::Blocked(block), wait);
        }
        if status.is_server_error() {
            return (UseVerdict::TargetError, None);
        }
        (UseVerdict::Worked, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(status: u16, body: &str, forward: bool, tls: bool) -> UseVerdict {
        Classifier::default()
            .classify(
                StatusCode::from_u16(status).unwrap(),
                &HeaderMap::new(),
                body.as_bytes(),
                forward,
                tls,
            )
            .0
    }

    #[test]
    fn statuses_map_to_classes() {
        assert_eq!(class(200, "<p>hi</p>", true, false), UseVerdict::Worked);
        assert_eq!(class(404, "gone", true, false), UseVerdict::Worked);
        assert_eq!(class(410, "gone", false, true), UseVerdict::Worked);
        assert_eq!(
            class(403, "no", false, false),
            UseVerdict::Blocked(Block::Refused)
        );
        assert_eq!(
            class(429, "slow", false, false),
            UseVerdict::Blocked(Block::RateLimited)
        );
        assert_eq!(class(500, "oops", true, false), UseVerdict::TargetError);
        // A 502 through a tunnel is the site's; from a forwarding proxy, the proxy's.
        assert_eq!(class(502, "bad", false, false), UseVerdict::TargetError);
        assert_eq!(
            class(502, "bad", true, false),
            UseVerdict::failed(Reason::BadStatus)
        );
        assert_eq!(
            class(407, "auth", true, false),
            UseVerdict::failed(Reason::ProxyAuthRequired)
        );
    }

    #[test]
    fn bodies_reveal_captchas_and_portals() {
        let captcha = "<html><head><title>Attention Required!</title></head></html>";
        assert_eq!(
            class(200, captcha, false, true),
            UseVerdict::Blocked(Block::Banned)
        );
        let portal = "<html>Welcome to FreeWifi, please log in</html>";
        assert_eq!(
            class(200, portal, true, false),
            UseVerdict::failed(Reason::ContentMismatch)
        );
        // Over verified TLS the page is the site's own words.
        assert_eq!(class(200, portal, false, true), UseVerdict::Worked);
        let article = "<title>How captchas work</title><p>Free software.</p>";
        assert_eq!(class(200, article, true, false), UseVerdict::Worked);
    }
}
