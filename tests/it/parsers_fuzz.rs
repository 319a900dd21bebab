//! Whatever a source serves, the parsers must not panic: random bytes (as
//! the fetcher hands them over, lossily decoded) and random mutations of
//! valid lists, tables and documents go through all of them (text with its
//! annotations, regex, HTML, JSON, gzip). Valid entries generated at random
//! must come out exactly as they went in.

use std::io::Write as _;

use proptest::prelude::*;

use proxywarden::config::{
    HtmlColumns, HtmlOptions, JsonOptions, ListPattern, RegexOptions, TextOptions,
};
use proxywarden::harvest::{Candidates, gzip, html, json, pattern, text};
use proxywarden::model::{Hints, SourceScheme};
use proxywarden::proxy::{Anonymity, Country, Scheme};

const TEXT_SEED: &str = "# list\r\n1.2.3.4:8080\r\nhttps://5.6.7.8:443\nsocks5://u%40s:p@[2001:db8::1]:1080\n\
                         010.0.0.1:3128:user:pass\nftp://9.9.9.9:21 \"4.4.4.4:80\",\n";

const SPYS_SEED: &str = "Proxy list updated at Fri, 24 Mar 23 07:58:01 +0300\n\
    IP address:Port CountryCode-Anonymity(Noa/Anm/Hia)-SSL_support(S)-Google_passed(+)\n\n\
    1.2.3.4:999 CO-N-S! + \n5.6.7.8:80 HK-A + \n9.9.9.9:8000 TH-H-S -\n";

const HIDEIP_SEED: &str = "1.2.3.4:8080:Peru\n5.6.7.8:9002:The Netherlands\n\
    9.9.9.9:80:T\u{FFFD}rkiye\r\n1.2.3.5:80:Congo (DRC)\n1.2.3.6:80:user:pass\n";

const MONOSANS_SEED: &str = r#"[{"protocol":"socks4","username":null,"password":null,
    "host":"1.2.3.4","port":7890,"geolocation":{"continent":{"code":"EU"},
    "country":{"iso_code":"RU","names":{"en":"Russia"}},"postal":{"code":"101000"}}},
    {"protocol":"http","username":"u","password":"p","host":"5.6.7.8","port":80,
    "geolocation":{"country":{"code":"se"}}}]"#;

const REGEX_SEED: &str = "1.2.3.4 | 8080 | HTTP | Germany | elite | yes\n\
    5.6.7.8 | 1080 | SOCKS5 | br | anonymous | no\n";

const PATTERN: &str = r"(?m)^(?P<ip>[\d.]+) \| (?P<port>\d+) \| (?P<scheme>\w+) \| (?P<country>[^|]+?) \| (?P<anonymity>\w+) \| (?P<https>\w+)$";

const HTML_SEED: &str = "<html><body><table><thead><tr><th>IP Address</th><th>Port</th>\
    <th>Code</th><th>Anonymity</th><th>Https</th><th>Version</th></tr></thead><tbody>\
    <tr><td>1.2.3.4</td><td>8080</td><td>US</td><td>elite proxy</td><td>yes</td><td>Socks5</td></tr>\
    <tr><td>5.6.7.8</td><td>3128</td><td>DE</td><td>anonymous</td><td>no</td><td>HTTP, SOCKS4</td></tr>\
    </tbody></table><table><tr><th>IP:Port</th></tr><tr><td>9.9.9.9:80</td></tr></table></body></html>";

const JSON_SEED: &str = r#"{"data":[{"ip":"1.2.3.4","port":"8080","protocols":["socks4","socks5"],
    "country":"US","anonymityLevel":"elite","https":true},
    {"proxy":"http://5.6.7.8:80","geolocation":{"country":"BR"}},"9.9.9.9:3128",
    {"ip":"[2001:db8::1]:8080","type":"https"}],"total":3,"page":1}"#;

/// Runs every parser on `body` and checks what any result must satisfy.
fn parse_all(body: &str, limit: usize) {
    let defaults = [SourceScheme::Detect, SourceScheme::Fixed(Scheme::Socks5)];
    // Compiled once: a debug build takes milliseconds per compile.
    static REGEX: std::sync::LazyLock<RegexOptions> = std::sync::LazyLock::new(|| RegexOptions {
        pattern: ListPattern::new(PATTERN).unwrap(),
    });
    let regex = &*REGEX;
    for default in defaults {
        let mut out = Candidates::new(limit);
        text::parse(body, default, &mut out);
        check(&out, limit);

        // The same addresses whether or not annotations are read.
        let mut bare = Candidates::new(limit);
        let off = TextOptions { annotations: false };
        text::parse_with(body, &off, default, &mut bare);
        check(&bare, limit);
        let addresses = |c: &Candidates| -> Vec<String> {
            c.items().iter().map(|c| c.proxy.to_string()).collect()
        };
        assert_eq!(addresses(&out), addresses(&bare));

        let mut out = Candidates::new(limit);
        pattern::parse(body, regex, default, &mut out, None).unwrap();
        check(&out, limit);

        let mut out = Candidates::new(limit);
        html::parse(body, &HtmlOptions::default(), default, &mut out);
        check(&out, limit);

        let mut out = Candidates::new(limit);
        let _ = json::parse(body, &JsonOptions::default(), default, &mut out);
        check(&out, limit);
    }

    let html_opts = HtmlOptions {
        table: Some("body > table, div".into()),
        columns: HtmlColumns {
            ip: Some("ip:port".into()),
            port: None,
            country: Some("code".into()),
            anonymity: None,
            https: Some("https".into()),
            protocol: Some("version".into()),
        },
    };
    let mut out = Candidates::new(limit);
    html::parse(body, &html_opts, SourceScheme::Detect, &mut out);
    check(&out, limit);

    let json_opts = JsonOptions {
        items: Some("/data".into()),
        ip: Some("proxy".into()),
        port: Some("a.0.b".into()),
        country: Some("geolocation.country".into()),
        protocols: Some("/protocols".into()),
        anonymity: None,
        https: Some("https".into()),
    };
    let mut out = Candidates::new(limit);
    let _ = json::parse(body, &json_opts, SourceScheme::Detect, &mut out);
    check(&out, limit);
}

fn check(out: &Candidates, limit: usize) {
    assert!(out.len() <= limit);
    for c in out.items() {
        assert_ne!(c.proxy.port, 0);
        assert!(c.proxy.auth.as_ref().is_none_or(|a| !a.username.is_empty()));
    }
}

#[derive(Clone, Debug)]
enum Mutation {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, Vec<u8>),
    Replace(usize, u8),
    Duplicate(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that matter to the parsers, plus anything at all.
    let interesting = prop_oneof![
        prop::sample::select(b":./@[]<>\"{},0123456789\r\n%-_ ".to_vec()),
        any::<u8>(),
    ];
    prop_oneof![
        any::<usize>().prop_map(Mutation::Truncate),
        (any::<usize>(), 0..16usize).prop_map(|(at, n)| Mutation::Delete(at, n)),
        (
            any::<usize>(),
            prop::collection::vec(interesting.clone(), 1..8)
        )
            .prop_map(|(at, b)| Mutation::Insert(at, b)),
        (any::<usize>(), interesting).prop_map(|(at, b)| Mutation::Replace(at, b)),
        (any::<usize>(), 1..64usize).prop_map(|(at, n)| Mutation::Duplicate(at, n)),
    ]
}

fn mutate(seed: &str, mutations: &[Mutation]) -> String {
    let mut b = seed.as_bytes().to_vec();
    for m in mutations {
        let len = b.len();
        let at = |i: usize| if len == 0 { 0 } else { i % (len + 1) };
        match m {
            Mutation::Truncate(i) => b.truncate(at(*i)),
            Mutation::Delete(i, n) => {
                let s = at(*i);
                let e = (s + n).min(len);
                b.drain(s..e);
            }
            Mutation::Insert(i, bytes) => {
                let s = at(*i);
                b.splice(s..s, bytes.iter().copied());
            }
            Mutation::Replace(i, byte) => {
                if len > 0 {
                    b[i % len] = *byte;
                }
            }
            Mutation::Duplicate(i, n) => {
                let s = at(*i);
                let e = (s + n).min(len);
                let copy = b[s..e].to_vec();
                b.splice(e..e, copy);
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Countries as (code, English name) for generated entries.
const COUNTRIES: &[(&str, &str)] = &[
    ("US", "United States"),
    ("NL", "The Netherlands"),
    ("TR", "T\u{FFFD}rkiye"),
    ("CD", "Congo (DRC)"),
    ("KR", "South Korea"),
    ("GB", "United Kingdom"),
    ("HK", "Hong Kong"),
    ("CI", "Côte d'Ivoire"),
];

/// (spys layout or a country name, country, anonymity level, HTTPS).
#[allow(clippy::type_complexity)]
fn annotated() -> impl Strategy<Value = (bool, (&'static str, &'static str), usize, bool)> {
    (
        any::<bool>(),
        prop::sample::select(COUNTRIES),
        0..3usize,
        any::<bool>(),
    )
}

fn limit() -> impl Strategy<Value = usize> {
    prop_oneof![0..4usize, Just(1000)]
}

proptest! {
    #[test]
    fn random_bytes(bytes in prop::collection::vec(any::<u8>(), 0..2048), limit in limit()) {
        parse_all(&String::from_utf8_lossy(&bytes), limit);
    }

    #[test]
    fn token_soup(body in "[a-z0-9:/@.%\\[\\]<>\" \n-]{0,300}", limit in limit()) {
        parse_all(&body, limit);
    }

    #[test]
    fn mutated_text(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(TEXT_SEED, &ms), limit);
    }

    #[test]
    fn mutated_spys(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(SPYS_SEED, &ms), limit);
    }

    #[test]
    fn mutated_hideip(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(HIDEIP_SEED, &ms), limit);
    }

    #[test]
    fn mutated_monosans(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(MONOSANS_SEED, &ms), limit);
    }

    #[test]
    fn mutated_regex_layout(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(REGEX_SEED, &ms), limit);
    }

    #[test]
    fn random_patterns_compile_or_say_why(p in "[(?P<>ipor:t)\\\\d.+*{}\\[\\]a-z0-9|^$]{0,60}", body in "[0-9.: a-z\n|]{0,200}") {
        match ListPattern::new(&p) {
            Ok(pattern) => {
                let mut out = Candidates::new(100);
                let opts = RegexOptions { pattern };
                pattern::parse(&body, &opts, SourceScheme::Detect, &mut out, None).unwrap();
                check(&out, 100);
            }
            Err(e) => prop_assert!(!e.is_empty()),
        }
    }

    /// Generated spys and hideip entries come out with exactly their hints.
    #[test]
    fn annotations_match_what_was_written(entries in prop::collection::vec(annotated(), 1..40)) {
        let mut body = String::new();
        for (i, (spys, cc, level, ssl)) in entries.iter().enumerate() {
            let ip = format!("1.{}.{}.{}", i / 250, i % 250, 1 + i % 200);
            if *spys {
                let level = ["N", "A", "H"][*level];
                let ssl = if *ssl { "-S" } else { "" };
                body.push_str(&format!("{ip}:{} {}-{level}{ssl} +\n", 1000 + i, cc.0));
            } else {
                body.push_str(&format!("{ip}:{}:{}\r\n", 1000 + i, cc.1));
            }
        }
        let mut out = Candidates::new(1000);
        text::parse(&body, SourceScheme::Detect, &mut out);
        let got: Vec<Hints> = out.items().iter().map(|c| c.hints).collect();
        let want: Vec<Hints> = entries
            .iter()
            .map(|(spys, cc, level, ssl)| Hints {
                country: Country::parse(cc.0),
                anonymity: spys.then(|| {
                    [Anonymity::Transparent, Anonymity::Anonymous, Anonymity::Elite][*level]
                }),
                https: spys.then_some(*ssl),
            })
            .collect();
        prop_assert_eq!(got, want);
    }

    /// Whatever follows the gzip magic, decompression stops at the limit.
    #[test]
    fn gzip_bodies_are_bounded(tail in prop::collection::vec(any::<u8>(), 0..512), cut in any::<usize>()) {
        let mut body = vec![0x1f, 0x8b, 0x08];
        body.extend_from_slice(&tail);
        if let Ok(out) = gzip::gunzip(&body, 4096) {
            prop_assert!(out.len() <= 4096);
        }
        let list = b"1.2.3.4:80 US-H +\n".repeat(50);
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(&list).unwrap();
        let packed = e.finish().unwrap();
        let cut = &packed[..cut % (packed.len() + 1)];
        match gzip::gunzip(cut, 1 << 20) {
            Ok(out) => prop_assert!(list.starts_with(&out)),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }

    #[test]
    fn mutated_html(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(HTML_SEED, &ms), limit);
    }

    #[test]
    fn mutated_json(ms in prop::collection::vec(mutation(), 0..8), limit in limit()) {
        parse_all(&mutate(JSON_SEED, &ms), limit);
    }
}

#[test]
fn seeds_parse() {
    let mut out = Candidates::new(100);
    text::parse(TEXT_SEED, SourceScheme::Detect, &mut out);
    assert_eq!(out.len(), 5);

    let mut out = Candidates::new(100);
    html::parse(
        HTML_SEED,
        &HtmlOptions::default(),
        SourceScheme::Detect,
        &mut out,
    );
    assert_eq!(out.len(), 3);

    let mut out = Candidates::new(100);
    json::parse(
        JSON_SEED,
        &JsonOptions::default(),
        SourceScheme::Detect,
        &mut out,
    )
    .unwrap();
    assert_eq!(out.len(), 5);
}
