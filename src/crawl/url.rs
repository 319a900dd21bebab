//! URLs as the crawler compares them: normalised before de-duplication
//! (fragment, tracking parameters and parameter order do not make a new
//! page) and checked against the crawl's scope.

use std::collections::HashSet;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, percent_encode};
use regex::Regex;
use url::Url;

use crate::model::ScopeKind;

/// Query parameters dropped by default besides every `utm_*`: click and
/// referral trackers that never change the page.
pub const DEFAULT_STRIP: &[&str] = &[
    "ref", "ref_src", "fbclid", "gclid", "dclid", "gbraid", "wbraid", "msclkid", "yclid", "igshid",
    "mc_cid", "mc_eid", "_ga", "_gl",
];

/// The normal form of `url`, or `None` for anything but http(s): scheme
/// and host lower case and the default port dropped (the `url` crate does
/// these), fragment dropped, `utm_*` and `strip` parameters removed, the
/// query sorted, percent-encoding of unreserved characters undone and hex
/// digits upper case.
pub fn normalize(url: &Url, strip: &[String]) -> Option<Url> {
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return None;
    }
    let mut u = url.clone();
    u.set_fragment(None);
    let _ = u.set_username("");
    let _ = u.set_password(None);
    let path = normalize_escapes(u.path());
    u.set_path(&path);
    if let Some(q) = u.query() {
        let mut pairs: Vec<(String, String)> = url::form_urlencoded::parse(q.as_bytes())
            .filter(|(k, _)| {
                let k = k.to_ascii_lowercase();
                !k.starts_with("utm_")
                    && !DEFAULT_STRIP.contains(&k.as_str())
                    && !strip.iter().any(|s| s.eq_ignore_ascii_case(&k))
            })
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        if pairs.is_empty() {
            u.set_query(None);
        } else {
            pairs.sort();
            let q = url::form_urlencoded::Serializer::new(String::new())
                .extend_pairs(pairs)
                .finish();
            u.set_query(Some(&q));
        }
    }
    Some(u)
}

/// The longest host name DNS can carry, and the longest label in one
/// (RFC 1035 §2.3.4).
const MAX_HOST: usize = 253;
const MAX_LABEL: usize = 63;

/// Parses a URL to start a crawl from: http or https with a host that is
/// an IP address or a name DNS could resolve (at most 253 characters,
/// labels of 1 to 63). A longer one could never be fetched, and would be
/// carried through every retry and log line of the crawl. The error says
/// what is wrong, without repeating a long host whole.
pub fn parse_seed(text: &str) -> Result<Url, String> {
    let shown = |s: &str| -> String {
        if s.chars().count() > 80 {
            format!(
                "{:?}… ({} characters)",
                s.chars().take(60).collect::<String>(),
                s.chars().count()
            )
        } else {
            format!("{s:?}")
        }
    };
    let url = Url::parse(text).map_err(|e| match e {
        // `site.test/page`: a URL needs its scheme.
        url::ParseError::RelativeUrlWithoutBase => format!(
            "{} has no scheme: write it with http:// or https:// in front",
            shown(text)
        ),
        e => format!("{} is not a URL: {e}", shown(text)),
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!("{} is not an http or https URL", shown(text)));
    }
    match url.host() {
        None => Err(format!("{} has no host", shown(text))),
        Some(url::Host::Ipv4(_) | url::Host::Ipv6(_)) => Ok(url),
        Some(url::Host::Domain(name)) => {
            let name = name.strip_suffix('.').unwrap_or(name);
            if name.len() > MAX_HOST {
                return Err(format!(
                    "the host of {} is {} characters long; a host name has at most {MAX_HOST}",
                    shown(text),
                    name.len()
                ));
            }
            if let Some(label) = name
                .split('.')
                .find(|l| l.is_empty() || l.len() > MAX_LABEL)
            {
                return Err(format!(
                    "the host of {} has a label of {} characters; each part between dots has 1 to {MAX_LABEL}",
                    shown(text),
                    label.len()
                ));
            }
            Ok(url)
        }
    }
}

/// `%xx` escapes of unreserved characters decoded, the others upper case.
fn normalize_escapes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let byte = rest.get(at..at + 3).and_then(|e| {
            let mut bytes = percent_decode_str(e);
            // Three characters in, one byte out: a whole escape.
            match (bytes.next(), bytes.next()) {
                (Some(c), None) => Some(c),
                _ => None,
            }
        });
        match byte {
            Some(c) => {
                out.extend(percent_encode(&[c], ESCAPED));
                rest = &rest[at + 3..];
            }
            None => {
                out.push('%');
                rest = &rest[at + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// What stays escaped: all but RFC 3986's unreserved characters.
const ESCAPED: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The crawl's scope: a kind, the seeds it is measured from, and regexes
/// that URLs must (`include`, any of them when given) and must not
/// (`exclude`) match.
#[derive(Clone, Debug)]
pub struct Scope {
    kind: ScopeKind,
    hosts: HashSet<String>,
    sites: HashSet<String>,
    include: Vec<Regex>,
    exclude: Vec<Regex>,
}

impl Scope {
    /// The scope of a crawl from `seeds`.
    pub fn new(kind: ScopeKind, seeds: &[Url], include: Vec<Regex>, exclude: Vec<Regex>) -> Scope {
        Scope {
            kind,
            hosts: seeds.iter().map(crate::pool::site_of).collect(),
            sites: seeds.iter().filter_map(site).collect(),
            include,
            exclude,
        }
    }

    /// True when the crawl may fetch `url` (normalised).
    pub fn allows(&self, url: &Url) -> bool {
        let in_kind = match self.kind {
            ScopeKind::SameHost => self.hosts.contains(&crate::pool::site_of(url)),
            ScopeKind::SameSite => site(url).is_some_and(|s| self.sites.contains(&s)),
            ScopeKind::Any => true,
        };
        let s = url.as_str();
        in_kind
            && (self.include.is_empty() || self.include.iter().any(|r| r.is_match(s)))
            && !self.exclude.iter().any(|r| r.is_match(s))
    }
}

/// The registrable domain of `url`'s host (an IP address stands for
/// itself).
fn site(url: &Url) -> Option<String> {
    match url.host()? {
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.');
            Some(psl::domain_str(d).unwrap_or(d).to_owned())
        }
        url::Host::Ipv4(ip) => Some(ip.to_string()),
        url::Host::Ipv6(ip) => Some(ip.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> Option<String> {
        normalize(&Url::parse(s).unwrap(), &["sessionid".to_owned()]).map(|u| u.to_string())
    }

    #[test]
    fn escapes_of_unreserved_characters_are_decoded_the_others_upper_cased() {
        for (path, normal) in [
            ("/%61%2d%2E%5f%7E", "/a-._~"),
            ("/%2f%3a%c3%a9", "/%2F%3A%C3%A9"),
            ("/100%", "/100%"),
            ("/%4", "/%4"),
            ("/%zz%41", "/%zzA"),
            ("/%%41", "/%A"),
            ("/a%20b%", "/a%20b%"),
        ] {
            assert_eq!(normalize_escapes(path), normal, "{path}");
        }
    }

    #[test]
    fn equal_pages_normalise_equal() {
        let same = [
            "HTTP://Example.COM:80/a/b?y=2&x=1#top",
            "http://example.com/a/./c/../b?x=1&y=2",
            "http://example.com/a/b?x=1&utm_source=news&y=2&ref=home",
            "http://example.com/%61/b?x=1&y=2&SessionID=42",
            "http://user:pw@example.com/a/b?y=2&fbclid=abc&x=1",
        ];
        for s in same {
            assert_eq!(
                norm(s).as_deref(),
                Some("http://example.com/a/b?x=1&y=2"),
                "{s}"
            );
        }
        assert_eq!(
            norm("https://example.com:443").as_deref(),
            Some("https://example.com/")
        );
        assert_eq!(
            norm("http://example.com/?utm_medium=x").as_deref(),
            Some("http://example.com/")
        );
        assert_eq!(
            norm("http://example.com/a%2fb").as_deref(),
            Some("http://example.com/a%2Fb")
        );
        assert_ne!(
            norm("http://example.com:8080/"),
            norm("http://example.com/")
        );
        assert_ne!(
            norm("http://example.com/?p=2"),
            norm("http://example.com/?p=3")
        );
    }

    #[test]
    fn other_schemes_are_skipped() {
        for s in [
            "mailto:a@b.c",
            "javascript:void(0)",
            "data:text/plain,hi",
            "ftp://x.org/f",
            "tel:123",
        ] {
            assert_eq!(norm(s), None, "{s}");
        }
    }

    #[test]
    fn scopes_compare_hosts_sites_and_patterns() {
        let seeds = [Url::parse("https://www.shop.example.co.uk/").unwrap()];
        let u = |s: &str| Url::parse(s).unwrap();
        let host = Scope::new(ScopeKind::SameHost, &seeds, vec![], vec![]);
        assert!(host.allows(&u("https://www.shop.example.co.uk/a")));
        assert!(host.allows(&u("http://www.shop.example.co.uk/a")));
        assert!(!host.allows(&u("https://cdn.example.co.uk/a")));
        assert!(!host.allows(&u("https://www.shop.example.co.uk:8443/a")));
        let site = Scope::new(ScopeKind::SameSite, &seeds, vec![], vec![]);
        assert!(site.allows(&u("https://cdn.example.co.uk/a")));
        assert!(!site.allows(&u("https://other.co.uk/a")));
        let any = Scope::new(
            ScopeKind::Any,
            &seeds,
            vec![Regex::new("/products/").unwrap()],
            vec![Regex::new(r"\.pdf$").unwrap()],
        );
        assert!(any.allows(&u("https://other.org/products/1")));
        assert!(!any.allows(&u("https://other.org/about")));
        assert!(!any.allows(&u("https://other.org/products/1.pdf")));
    }

    #[test]
    fn a_seed_without_a_scheme_is_told_to_add_one() {
        let e = parse_seed("site.test").unwrap_err();
        assert!(e.contains("has no scheme") && e.contains("http://"), "{e}");
        assert!(!e.contains("relative URL"), "{e}");
    }
}
