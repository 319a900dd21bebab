//! What a plain-text list says about an entry after its address, in the two
//! layouts public lists use:
//! - spys (spys.me's proxy.txt, clarketm's list): `1.2.3.4:8080 US-H-S! +`,
//!   the country code, the anonymity (`N` none, `A` anonymous, `H` high),
//!   `S` when it does HTTPS, `!` when its exit address differs, and `+`/`-`
//!   for "Google passed" (not kept: the checker's own judge decides);
//! - a country after another colon: `1.2.3.4:8080:The Netherlands` (hideip.me),
//!   an English name or a two-letter code.
//!
//! Anything else after an address is no annotation, and leaves the hints
//! unset: a hint is only ever what the list plainly said.

use super::countries;
use super::country_hint;
use crate::model::Hints;
use crate::proxy::Anonymity;

/// Blanks skipped between an address and a spys annotation.
const MAX_GAP: usize = 8;

/// The hints the rest of the entry gives, reading from `end` (just past
/// the port). Looks at no more than a line's worth of bytes, so the text
/// scan stays linear.
pub(super) fn after(body: &str, end: usize) -> Hints {
    let b = body.as_bytes();
    match b.get(end) {
        Some(b':') => country_field(body, end + 1),
        Some(b' ' | b'\t') => spys(b, end),
        _ => Hints::default(),
    }
}

/// `:Country name` or `:CC` running to the end of the line.
fn country_field(body: &str, from: usize) -> Hints {
    let b = body.as_bytes();
    let mut i = from;
    while i < b.len() && !matches!(b[i], b'\n' | b'\r') {
        if i - from > countries::MAX_NAME * 3 || matches!(b[i], b':' | b'@' | b'/') {
            return Hints::default();
        }
        i += 1;
    }
    // Bytes up to a newline end on a char boundary.
    let field = body[from..i].trim();
    let country = if field.len() == 2 {
        country_hint(field)
    } else {
        countries::by_name(field)
    };
    Hints {
        country,
        ..Hints::default()
    }
}

/// ` CC-A[!][-S][!] [+|-]` after the port at `end`.
fn spys(b: &[u8], end: usize) -> Hints {
    let mut i = end;
    while i < b.len() && matches!(b[i], b' ' | b'\t') {
        if i - end > MAX_GAP {
            return Hints::default();
        }
        i += 1;
    }
    // The longest annotation is `CC-A!-S!`; a longer word is something else.
    let rest = &b[i..b.len().min(i + 17)];
    let n = rest
        .iter()
        .position(|c| c.is_ascii_whitespace())
        .unwrap_or(rest.len());
    if n > 16 {
        return Hints::default();
    }
    let word = &rest[..n];
    let mut parts = word.split(|&c| c == b'-');
    let (Some(cc), Some(level)) = (parts.next(), parts.next()) else {
        return Hints::default();
    };
    if cc.len() != 2 || !cc.iter().all(u8::is_ascii_uppercase) {
        return Hints::default();
    }
    let anonymity = match level.strip_suffix(b"!").unwrap_or(level) {
        b"N" => Anonymity::Transparent,
        b"A" => Anonymity::Anonymous,
        b"H" => Anonymity::Elite,
        _ => return Hints::default(),
    };
    let https = match parts.next() {
        None => false,
        Some(b"S" | b"S!") => true,
        Some(_) => return Hints::default(),
    };
    if parts.next().is_some() {
        return Hints::default();
    }
    // Two ASCII letters are a str.
    let cc = std::str::from_utf8(cc).unwrap_or("");
    Hints {
        country: country_hint(cc),
        anonymity: Some(anonymity),
        https: Some(https),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Country;

    fn at(line: &str) -> Hints {
        let end = line.find([' ', '\t']).unwrap();
        after(line, end)
    }

    #[test]
    fn spys_layout() {
        let h = at("1.2.3.4:80 CO-N-S! + \n");
        assert_eq!(h.country, Country::parse("CO"));
        assert_eq!(h.anonymity, Some(Anonymity::Transparent));
        assert_eq!(h.https, Some(true));
        let h = at("1.2.3.4:80 HK-A +");
        assert_eq!(
            (h.country, h.anonymity, h.https),
            (
                Country::parse("HK"),
                Some(Anonymity::Anonymous),
                Some(false)
            )
        );
        let h = at("1.2.3.4:80\tGB-H! -\r\n");
        assert_eq!(h.anonymity, Some(Anonymity::Elite));
        assert_eq!(at("1.2.3.4:80 ZZ-H -").country, None);
        for not in [
            "1.2.3.4:80 US",
            "1.2.3.4:80 us-H",
            "1.2.3.4:80 US-X",
            "1.2.3.4:80 US-H-Q",
            "1.2.3.4:80 US-H-S-S",
            "1.2.3.4:80 USA-H",
            "1.2.3.4:80 US-Hx",
            "1.2.3.4:80 hello world",
        ] {
            assert_eq!(at(not), Hints::default(), "{not}");
        }
    }

    #[test]
    fn country_after_a_colon() {
        let country = |s: &str| after(s, s.find(':').unwrap() + 3).country;
        assert_eq!(
            country("1.2.3.4:80:The Netherlands\n"),
            Country::parse("NL")
        );
        assert_eq!(
            country("1.2.3.4:80:T\u{FFFD}rkiye\r\n"),
            Country::parse("TR")
        );
        assert_eq!(country("1.2.3.4:80:de"), Country::parse("DE"));
        assert_eq!(country("1.2.3.4:80:Unknown"), None);
        assert_eq!(country("1.2.3.4:80:user:pass"), None);
        assert_eq!(country("1.2.3.4:80:http://x"), None);
    }
}
