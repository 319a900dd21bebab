//! The proxy filters' values read from text, one way wherever a client
//! gives them: API parameters, gateway controls (username words and
//! headers), crawl job options and the command line. Each reader answers
//! what it expected when the text is not valid; each surface frames that
//! in its own words (`parameter country="x" is invalid: expected ...`).

use std::time::Duration;

use crate::proxy::{Anonymity, Country, Scheme};

/// What a country filter takes.
pub const COUNTRY: &str = "two-letter country codes like de or us,gb";
/// What a scheme filter takes.
pub const SCHEME: &str = "http, socks4 or socks5";
/// What an anonymity filter takes (the least level wanted).
pub const ANONYMITY: &str = "transparent, anonymous or elite";
/// The longest latency bound, in ms: an hour.
pub const MAX_LATENCY_MS: i64 = 3_600_000;
/// What a latency bound takes.
pub const LATENCY: &str = "a whole number of milliseconds from 1 to 3600000";
/// What an age bound takes.
pub const AGE: &str = "a duration like 10m or 90s";

/// One country code, in any case.
pub fn country(text: &str) -> Result<Country, &'static str> {
    Country::parse(text.trim()).ok_or(COUNTRY)
}

/// One scheme, in any case.
pub fn scheme(text: &str) -> Result<Scheme, &'static str> {
    text.trim()
        .to_ascii_lowercase()
        .parse::<Scheme>()
        .map_err(|_| SCHEME)
}

/// The least anonymity wanted, in any case.
pub fn anonymity(text: &str) -> Result<Anonymity, &'static str> {
    text.trim()
        .to_ascii_lowercase()
        .parse::<Anonymity>()
        .map_err(|_| ANONYMITY)
}

/// The highest latency wanted, in ms.
pub fn max_latency_ms(text: &str) -> Result<i64, &'static str> {
    match text.trim().parse::<i64>() {
        Ok(ms) if (1..=MAX_LATENCY_MS).contains(&ms) => Ok(ms),
        _ => Err(LATENCY),
    }
}

/// The oldest last check wanted, longer than zero.
pub fn max_age(text: &str) -> Result<Duration, &'static str> {
    match humantime::parse_duration(text.trim()) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(AGE),
    }
}

/// A comma-separated list read item by item with `one` (blank items are
/// skipped); the item that failed and what was expected otherwise. A list
/// of separators only is refused: read as "any" it would widen what the
/// client asked for.
pub fn list<T>(
    text: &str,
    one: impl Fn(&str) -> Result<T, &'static str>,
) -> Result<Vec<T>, (String, String)> {
    let mut items = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        items.push(one(item).map_err(|e| (item.to_owned(), e.to_owned()))?);
    }
    if items.is_empty() {
        // Only the expectation is known without an item: ask `one` for it.
        let expected = one("").err().unwrap_or("a value");
        return Err((
            text.to_owned(),
            format!("{expected}, separated by commas (only separators were given)"),
        ));
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_read_alike_in_any_case_and_name_what_was_expected() {
        assert_eq!(country(" DE "), Ok(Country::parse("de").unwrap()));
        assert_eq!(country("germany"), Err(COUNTRY));
        assert_eq!(scheme("SOCKS5"), Ok(Scheme::Socks5));
        assert_eq!(scheme("ftp"), Err(SCHEME));
        assert_eq!(anonymity("Elite"), Ok(Anonymity::Elite));
        assert_eq!(max_latency_ms("800"), Ok(800));
        assert_eq!(max_latency_ms("0"), Err(LATENCY));
        assert_eq!(max_latency_ms("3600001"), Err(LATENCY));
        assert_eq!(max_age("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(max_age("0s"), Err(AGE));
    }

    #[test]
    fn lists_skip_blanks_and_refuse_separators_only() {
        assert_eq!(list("de, ,us,", country).unwrap().len(), 2);
        assert_eq!(
            list("de,xx1", country),
            Err(("xx1".to_owned(), COUNTRY.to_owned()))
        );
        let (text, expected) = list(",", country).unwrap_err();
        assert_eq!(text, ",");
        assert!(expected.starts_with(COUNTRY), "{expected}");
        assert!(expected.contains("only separators"), "{expected}");
    }
}
