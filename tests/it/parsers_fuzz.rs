//! Whatever a source serves, the parsers must not panic: random bytes (as
//! the fetcher hands them over, lossily decoded) and random mutations of
//! valid lists, tables and documents go through all three.

use proptest::prelude::*;

use proxywarden::config::{HtmlColumns, HtmlOptions, JsonOptions};
use proxywarden::harvest::{Candidates, html, json, text};
use proxywarden::model::SourceScheme;
use proxywarden::proxy::Scheme;

const TEXT_SEED: &str = "# list\r\n1.2.3.4:8080\r\nhttps://5.6.7.8:443\nsocks5://u%40s:p@[2001:db8::1]:1080\n\
                         010.0.0.1:3128:user:pass\nftp://9.9.9.9:21 \"4.4.4.4:80\",\n";

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
    for default in defaults {
        let mut out = Candidates::new(limit);
        text::parse(body, default, &mut out);
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
