//! The `regex` format: one regular expression with named groups (`ip`,
//! `port`, and optionally `scheme`, `country`, `anonymity`, `https`, `user`,
//! `pass`), for lists whose layout no other format reads. Every match is an
//! entry; a match whose address or port does not parse is skipped. The
//! `regex` crate matches in time linear in the body, and the pattern's
//! compiled size was capped when the config was loaded.

use std::time::{Duration, Instant};

use regex::Captures;

use super::text::any_host;
use super::{Candidates, countries, country_hint, parse_https_word};
use crate::config::RegexOptions;
use crate::model::{Candidate, Hints, SourceScheme};
use crate::proxy::{Anonymity, Credentials, Scheme, parse_port};

/// Matches between looks at the clock.
const CLOCK_EVERY: usize = 1024;

/// Why a body was not read to its end.
#[derive(Debug, thiserror::Error)]
pub enum PatternError {
    /// The matches took longer than the harvest allows for parsing.
    #[error("the pattern took longer than {0:?} to match; not read to the end")]
    Timeout(Duration),
}

/// Pushes every entry `opts.pattern` matches in `body` into `out` until it
/// is full, giving up after `deadline` (a start and the time allowed).
pub fn parse(
    body: &str,
    opts: &RegexOptions,
    default: SourceScheme,
    out: &mut Candidates,
    deadline: Option<(Instant, Duration)>,
) -> Result<(), PatternError> {
    for (n, caps) in opts.pattern.regex().captures_iter(body).enumerate() {
        if n % CLOCK_EVERY == CLOCK_EVERY - 1
            && let Some((started, allowed)) = deadline
            && started.elapsed() > allowed
        {
            return Err(PatternError::Timeout(allowed));
        }
        if let Some(c) = entry(&caps, default)
            && !out.push(c)
        {
            break;
        }
    }
    Ok(())
}

/// The candidate one match describes, if its address and port parse.
fn entry(caps: &Captures, default: SourceScheme) -> Option<Candidate> {
    let group = |name: &str| {
        caps.name(name)
            .map(|m| m.as_str().trim())
            .filter(|s| !s.is_empty())
    };
    let ip = group("ip")?;
    let host = any_host(ip.trim_start_matches('[').trim_end_matches(']'))?;
    let port = parse_port(group("port")?)?;
    let (scheme, https_scheme) = match group("scheme") {
        // An entry naming a scheme we do not speak is not ours to guess.
        Some(word) => (
            Some(Scheme::from_loose(word)?),
            word.eq_ignore_ascii_case("https"),
        ),
        None => (None, false),
    };
    let auth = group("user").map(|user| Credentials {
        username: user.to_owned(),
        password: group("pass").unwrap_or("").to_owned(),
    });
    let hints = Hints {
        country: group("country").and_then(country_word),
        anonymity: group("anonymity").and_then(anonymity_word),
        https: group("https")
            .and_then(parse_https_word)
            .or(https_scheme.then_some(true)),
    };
    Some(Candidate::new(host, port, auth, scheme, default, hints))
}

/// A two-letter code or an English name.
fn country_word(s: &str) -> Option<crate::proxy::Country> {
    if s.len() == 2 {
        country_hint(s)
    } else {
        countries::by_name(s)
    }
}

/// A level as lists spell it, or spys' one letter (`N`, `A`, `H`).
fn anonymity_word(s: &str) -> Option<Anonymity> {
    match s {
        "N" => Some(Anonymity::Transparent),
        "A" => Some(Anonymity::Anonymous),
        "H" => Some(Anonymity::Elite),
        _ => Anonymity::from_loose(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ListPattern;
    use crate::proxy::Country;

    fn run(pattern: &str, body: &str) -> Vec<Candidate> {
        let opts = RegexOptions {
            pattern: ListPattern::new(pattern).unwrap(),
        };
        let mut out = Candidates::new(100);
        parse(
            body,
            &opts,
            SourceScheme::Fixed(Scheme::Http),
            &mut out,
            None,
        )
        .unwrap();
        out.into_vec()
    }

    #[test]
    fn every_group_is_read() {
        let got = run(
            r"(?m)^(?P<scheme>\w+) (?P<ip>\S+) (?P<port>\d+) (?P<country>[^|]+)\|(?P<anonymity>\w+)\|(?P<https>\w+)(?: (?P<user>\w+)/(?P<pass>\w+))?$",
            "socks5 1.2.3.4 1080 Germany|elite|yes\n\
             https 5.6.7.8 443 fr|N|no u/p\n\
             ftp 9.9.9.9 21 US|H|yes\n\
             http 999.1.1.1 80 US|H|yes\n\
             http [2001:db8::1] 8080 Unknown|x|maybe\n",
        );
        let urls: Vec<String> = got.iter().map(|c| c.proxy.to_string()).collect();
        assert_eq!(
            urls,
            [
                "socks5://1.2.3.4:1080",
                "http://u:p@5.6.7.8:443",
                "http://[2001:db8::1]:8080"
            ]
        );
        assert_eq!(
            got[0].hints,
            Hints {
                country: Country::parse("DE"),
                anonymity: Some(Anonymity::Elite),
                https: Some(true),
            }
        );
        assert_eq!(
            got[1].hints,
            Hints {
                country: Country::parse("FR"),
                anonymity: Some(Anonymity::Transparent),
                https: Some(false),
            }
        );
        assert_eq!(got[2].hints, Hints::default());
    }

    #[test]
    fn patterns_are_checked_when_loaded() {
        let err = |p: &str| ListPattern::new(p).unwrap_err();
        assert!(err("(?P<ip>").starts_with("invalid regular expression"));
        assert_eq!(
            err(r"(?P<ip>\S+)"),
            "needs the named groups (?P<ip>...) and (?P<port>...); missing port"
        );
        assert!(err(r"(?P<ip>\S+):(?P<prot>\d+)").starts_with("unknown group name \"prot\""));
        let huge = format!("(?P<ip>x{{1000}}){{1000}}(?P<port>{})", r"\w{1000}");
        assert!(err(&huge).contains("size limit"), "{}", err(&huge));
        assert!(err(&"a".repeat(5000)).contains("at most 4096"));
    }

    #[test]
    fn the_limit_and_the_deadline_stop_it() {
        let opts = RegexOptions {
            pattern: ListPattern::new(r"(?P<ip>[\d.]+):(?P<port>\d+)").unwrap(),
        };
        let body: String = (1..=200).map(|i| format!("10.0.0.{i}:80\n")).collect();
        let mut out = Candidates::new(3);
        parse(&body, &opts, SourceScheme::Detect, &mut out, None).unwrap();
        assert_eq!(out.len(), 3);
        assert!(out.truncated());
        let empty = RegexOptions {
            pattern: ListPattern::new(r"(?P<ip>)(?P<port>)").unwrap(),
        };
        let long = "x".repeat(1 << 20);
        let mut out = Candidates::new(3);
        let started = Instant::now() - Duration::from_secs(10);
        let r = parse(
            &long,
            &empty,
            SourceScheme::Detect,
            &mut out,
            Some((started, Duration::from_secs(1))),
        );
        assert!(matches!(r, Err(PatternError::Timeout(_))));
    }
}
