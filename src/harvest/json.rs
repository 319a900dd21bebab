//! The `json` format: a list of items with configurable paths to the item
//! list and to each field; the defaults handle the common shapes.

use serde_json::Value;

use super::text::{Token, any_host, first_token, scan};
use super::{Candidates, countries, country_hint, parse_https_word, protocol_words, push_schemes};
use crate::config::JsonOptions;
use crate::model::{Hints, SourceScheme};
use crate::proxy::{Anonymity, Country, Credentials, Scheme, parse_port};

/// Why a JSON body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The body is not JSON.
    #[error("invalid JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    /// The configured or default item path found no array.
    #[error("{0}")]
    NoItems(String),
}

/// Parses `body`, pushing candidates into `out` until it is full.
pub fn parse(
    body: &str,
    opts: &JsonOptions,
    default: SourceScheme,
    out: &mut Candidates,
) -> Result<(), JsonError> {
    // A byte-order mark is not JSON, but some servers send one.
    let body = body.trim_start_matches('\u{FEFF}');
    let root: Value = match serde_json::from_str(body) {
        Ok(root) => root,
        Err(e) => json_lines(body).ok_or(e)?,
    };
    for item in items(&root, opts.items.as_deref())? {
        if !read_item(item, opts, default, out) {
            break;
        }
    }
    Ok(())
}

/// A body of several JSON values one after another (JSON Lines, one item
/// per line) as an array of them; `None` unless it is exactly that.
fn json_lines(body: &str) -> Option<Value> {
    let values = serde_json::Deserializer::from_str(body)
        .into_iter::<Value>()
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    (values.len() > 1).then_some(Value::Array(values))
}

/// Field names tried in order when no path is configured; the first that
/// holds a usable value wins. Dotted names reach into nested objects
/// (proxifly's `geolocation`, proxyscrape's `ip_data`); a country field
/// may itself be an object (monosans' `geolocation.country.iso_code`, see
/// [`country_of`]).
const IP_KEYS: &[&str] = &["ip", "host", "address", "ipAddress", "ip_address", "addr"];
const PORT_KEYS: &[&str] = &["port"];
const COUNTRY_KEYS: &[&str] = &[
    "country",
    "country_code",
    "countryCode",
    "code",
    "geolocation.country",
    "geolocation.countryCode",
    "geolocation.country_code",
    "ip_data.countryCode",
    "geo.country",
    "location.country",
];
const PROTOCOL_KEYS: &[&str] = &["protocols", "protocol", "type", "types", "scheme"];
const ANONYMITY_KEYS: &[&str] = &["anonymity", "anonymityLevel", "anonymity_level", "level"];
const HTTPS_KEYS: &[&str] = &["https", "ssl", "supportsHttps"];
/// Where APIs that publish whole URLs put them (proxifly: `"proxy"`).
const URL_KEYS: &[&str] = &["proxy", "url"];
/// Top-level keys that name the item list in APIs we know, tried before
/// any other array: serde_json keeps object keys sorted, not in document
/// order, so "the first array" alone would depend on spelling.
const ITEMS_KEYS: &[&str] = &["data", "proxies", "list", "results", "items", "proxy_list"];

/// The item array: at the configured path, or found in the common shapes.
fn items<'a>(root: &'a Value, path: Option<&str>) -> Result<&'a [Value], JsonError> {
    if let Some(path) = path {
        return match lookup(root, path) {
            Some(Value::Array(items)) => Ok(items),
            Some(other) => Err(JsonError::NoItems(format!(
                "items path {path:?} holds {}, not an array",
                kind(other)
            ))),
            None => Err(JsonError::NoItems(format!(
                "items path {path:?} is not in the document"
            ))),
        };
    }
    match root {
        Value::Array(items) => Ok(items),
        Value::Object(_) => find_array(root, 2).ok_or_else(|| {
            JsonError::NoItems(
                "no array of items in the document (looked two levels deep); \
                 set the source's items path"
                    .to_owned(),
            )
        }),
        other => Err(JsonError::NoItems(format!(
            "the document is {}, not an array or an object holding one",
            kind(other)
        ))),
    }
}

/// The item list in an object: a well-known key first, then any array,
/// then the same one level further down (`{"data": {"proxies": [...]}}`).
fn find_array(v: &Value, depth: usize) -> Option<&[Value]> {
    let Value::Object(map) = v else {
        return None;
    };
    let known = || ITEMS_KEYS.iter().filter_map(|k| map.get(*k));
    if let Some(a) = known().chain(map.values()).find_map(Value::as_array) {
        return Some(a);
    }
    if depth == 0 {
        return None;
    }
    known()
        .chain(map.values())
        .find_map(|inner| find_array(inner, depth - 1))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Follows a JSON pointer (`/data/0/ip`) or a dotted key path (`geo.cc`;
/// numeric parts index arrays).
fn lookup<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    if path.starts_with('/') {
        return v.pointer(path);
    }
    path.split('.').try_fold(v, |v, key| match v {
        Value::Object(map) => map.get(key),
        Value::Array(items) => items.get(key.parse::<usize>().ok()?),
        _ => None,
    })
}

/// The first usable value: at the configured path, or under the first
/// default key that yields one.
fn field<'a, T>(
    item: &'a Value,
    path: &Option<String>,
    defaults: &[&str],
    read: impl Fn(&'a Value) -> Option<T>,
) -> Option<T> {
    match path {
        Some(path) => lookup(item, path).and_then(read),
        None => defaults
            .iter()
            .find_map(|k| lookup(item, k).and_then(&read)),
    }
}

/// Keys of a country object that hold its code, in order.
const COUNTRY_CODE_KEYS: &[&str] = &["iso_code", "code", "country_code", "countryCode", "iso"];

/// A country as APIs write it: a two-letter code, an English name, or an
/// object holding a code (`{"iso_code": "RU", "names": {...}}`) or a
/// `country` of its own, one level down at most.
fn country_of(v: &Value) -> Option<Country> {
    country_within(v, 2)
}

fn country_within(v: &Value, depth: usize) -> Option<Country> {
    match v {
        Value::String(s) if s.trim().len() == 2 => country_hint(s),
        Value::String(s) => countries::by_name(s),
        Value::Object(map) if depth > 0 => COUNTRY_CODE_KEYS
            .iter()
            .chain(std::iter::once(&"country"))
            .filter_map(|k| map.get(*k))
            .find_map(|v| country_within(v, depth - 1)),
        _ => None,
    }
}

fn port_of(v: &Value) -> Option<u16> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .filter(|p| (1..=65535).contains(p))
            .map(|p| p as u16),
        Value::String(s) => parse_port(s),
        _ => None,
    }
}

fn https_of(v: &Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => parse_https_word(s),
        Value::Number(n) => match n.as_u64() {
            Some(1) => Some(true),
            Some(0) => Some(false),
            _ => None,
        },
        _ => None,
    }
}

/// The schemes a protocol field names, and whether it said HTTPS; `None`
/// when it names none we know.
fn protocols_of(v: &Value) -> Option<(Vec<Scheme>, bool)> {
    let (schemes, https) = match v {
        Value::String(s) => protocol_words(s),
        Value::Array(list) => {
            let mut schemes = Vec::new();
            let mut https = false;
            for (found, said_https) in list.iter().filter_map(Value::as_str).map(protocol_words) {
                https |= said_https;
                for s in found {
                    if !schemes.contains(&s) {
                        schemes.push(s);
                    }
                }
            }
            (schemes, https)
        }
        _ => return None,
    };
    (!schemes.is_empty()).then_some((schemes, https))
}

/// The address of an object item: `ip` and `port` fields, or an `ip` field
/// holding `host:port`, or a URL field.
fn address(item: &Value, opts: &JsonOptions) -> Option<Token> {
    let ip = field(item, &opts.ip, IP_KEYS, Value::as_str);
    if let Some(ip) = ip {
        if let Some(host) = any_host(ip) {
            if let Some(port) = field(item, &opts.port, PORT_KEYS, port_of) {
                return Some(Token {
                    host,
                    port,
                    auth: credentials(item),
                    scheme: None,
                    https: false,
                });
            }
        } else if let Some(token) = first_token(ip) {
            return Some(token);
        }
    }
    if opts.ip.is_some() {
        return None;
    }
    URL_KEYS
        .iter()
        .find_map(|k| item.get(*k).and_then(Value::as_str).and_then(first_token))
}

/// Where APIs put a proxy's credentials beside its `ip` and `port`
/// (monosans: `"username": null` when there are none).
const USER_KEYS: &[&str] = &["username", "user", "login"];
const PASS_KEYS: &[&str] = &["password", "pass"];

/// The item's user name and password fields, when it has a user name.
fn credentials(item: &Value) -> Option<Credentials> {
    let text = |keys: &[&str]| {
        keys.iter()
            .find_map(|k| item.get(*k).and_then(Value::as_str))
            .filter(|s| !s.is_empty())
    };
    Some(Credentials {
        username: text(USER_KEYS)?.to_owned(),
        password: text(PASS_KEYS).unwrap_or("").to_owned(),
    })
}

/// Pushes the candidates of one item; returns `false` once `out` is full.
/// Items that are not usable are skipped: one bad entry must not cost the
/// whole source.
fn read_item(
    item: &Value,
    opts: &JsonOptions,
    default: SourceScheme,
    out: &mut Candidates,
) -> bool {
    match item {
        Value::String(s) => {
            let mut open = true;
            scan(s, |t| {
                open = out.push(t.into_candidate(default, Hints::default()));
                open
            });
            open
        }
        Value::Object(_) => {
            let Some(token) = address(item, opts) else {
                return true;
            };
            let (schemes, says_https) = match token.scheme {
                Some(_) => (Vec::new(), false),
                None => {
                    field(item, &opts.protocols, PROTOCOL_KEYS, protocols_of).unwrap_or_default()
                }
            };
            let hints = Hints {
                country: field(item, &opts.country, COUNTRY_KEYS, country_of),
                anonymity: field(item, &opts.anonymity, ANONYMITY_KEYS, |v| {
                    v.as_str().and_then(Anonymity::from_loose)
                }),
                https: field(item, &opts.https, HTTPS_KEYS, https_of)
                    .or(says_https.then_some(true)),
            };
            push_schemes(token, &schemes, default, hints, out)
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::Country;

    const HTTP: SourceScheme = SourceScheme::Fixed(Scheme::Http);

    fn run(body: &str, opts: &JsonOptions) -> Result<Candidates, JsonError> {
        let mut out = Candidates::new(1000);
        parse(body, opts, HTTP, &mut out)?;
        Ok(out)
    }

    fn urls(body: &str) -> Vec<String> {
        urls_with(body, &JsonOptions::default())
    }

    fn urls_with(body: &str, opts: &JsonOptions) -> Vec<String> {
        run(body, opts)
            .unwrap()
            .items()
            .iter()
            .map(|c| c.proxy.to_string())
            .collect()
    }

    #[test]
    fn geonode() {
        let body = r#"{"data":[
            {"_id":"x","ip":"1.2.3.4","port":"8080","protocols":["socks4","socks5"],
             "country":"US","anonymityLevel":"elite","speed":1},
            {"ip":"5.6.7.8","port":"3128","protocols":["http","https"],"country":"de",
             "anonymityLevel":"transparent"},
            {"ip":"999.1.1.1","port":"80","protocols":["http"]},
            {"ip":"9.9.9.9","port":"0","protocols":["http"]}
            ],"total":4,"page":1,"limit":500}"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out.items().iter().map(|c| c.proxy.to_string()).collect();
        assert_eq!(
            got,
            [
                "socks4://1.2.3.4:8080",
                "socks5://1.2.3.4:8080",
                "http://5.6.7.8:3128"
            ]
        );
        let first = &out.items()[0].hints;
        assert_eq!(first.country, Country::parse("US"));
        assert_eq!(first.anonymity, Some(Anonymity::Elite));
        assert_eq!(first.https, None);
        let third = &out.items()[2].hints;
        assert_eq!(third.https, Some(true));
        assert_eq!(third.country, Country::parse("DE"));
        assert_eq!(third.anonymity, Some(Anonymity::Transparent));
    }

    #[test]
    fn proxifly() {
        let body = r#"[{"proxy":"socks5://1.2.3.4:1080","protocol":"socks5","ip":"1.2.3.4",
            "port":1080,"https":false,"anonymity":"elite","score":1,
            "geolocation":{"country":"BR","city":"Unknown"}},
            {"proxy":"http://5.6.7.8:80","protocol":"http","https":true,
            "geolocation":{"country":"ZZZ"}}]"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out.items().iter().map(|c| c.proxy.to_string()).collect();
        assert_eq!(got, ["socks5://1.2.3.4:1080", "http://5.6.7.8:80"]);
        assert_eq!(out.items()[0].hints.country, Country::parse("BR"));
        assert_eq!(out.items()[0].hints.https, Some(false));
        assert_eq!(out.items()[1].hints.country, None);
        assert_eq!(out.items()[1].hints.https, Some(true));
    }

    #[test]
    fn proxyscrape_v4() {
        let body = r#"{"shown_records":1,"total_records":1,"proxies":[{"alive":true,
            "ip":"1.2.3.4","port":8080,"protocol":"http","ssl":true,"anonymity":"anonymous",
            "ip_data":{"countryCode":"NL"},"proxy":"http://1.2.3.4:8080"}]}"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        assert_eq!(out.len(), 1);
        let c = &out.items()[0];
        assert_eq!(c.proxy.to_string(), "http://1.2.3.4:8080");
        assert_eq!(
            c.hints,
            Hints {
                country: Country::parse("NL"),
                anonymity: Some(Anonymity::Anonymous),
                https: Some(true),
            }
        );
    }

    #[test]
    fn string_items_and_host_port_in_ip() {
        assert_eq!(
            urls(r#"["1.2.3.4:8080", "socks5://u:p@5.6.7.8:1080", "nonsense", 7, null]"#),
            ["http://1.2.3.4:8080", "socks5://u:p@5.6.7.8:1080"]
        );
        assert_eq!(
            urls(
                r#"{"list":[{"ip":"1.2.3.4:8080"},{"addr":"https://5.6.7.8:443","type":"socks4"}]}"#
            ),
            ["http://1.2.3.4:8080", "http://5.6.7.8:443"]
        );
    }

    #[test]
    fn default_fields_and_protocol_strings() {
        let body = r#"{"results":[
            {"host":"1.1.1.1","port":1,"type":"http,socks5"},
            {"ipAddress":"2.2.2.2","port":"2","scheme":"SOCKS4"},
            {"ip_address":"3.3.3.3","port":3,"protocol":"ftp"},
            {"address":"4.4.4.4","port":4.5},
            {"ip":"5.5.5.5"},
            {"ip":"6.6.6.6","port":70000}
            ]}"#;
        assert_eq!(
            urls(body),
            [
                "http://1.1.1.1:1",
                "socks5://1.1.1.1:1",
                "socks4://2.2.2.2:2",
                // An unknown protocol falls back to the source default.
                "http://3.3.3.3:3",
            ]
        );
    }

    #[test]
    fn country_only_from_codes() {
        let body = r#"[{"ip":"1.1.1.1","port":1,"country":"Germany","country_code":"de"},
            {"ip":"2.2.2.2","port":2,"countryCode":"fr","code":"xx"},
            {"ip":"3.3.3.3","port":3,"country":"Unknown"}]"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out.items().iter().map(|c| c.hints.country).collect();
        assert_eq!(got, [Country::parse("DE"), Country::parse("FR"), None]);
    }

    #[test]
    fn nested_country_shapes_without_options() {
        // monosans' proxies.json: the country is an object, beside a
        // continent and a postal code that also have a `code`.
        let body = r#"[{"protocol":"socks4","username":null,"password":null,
            "host":"1.1.1.1","port":7890,"geolocation":{"continent":{"code":"EU"},
            "country":{"geoname_id":2017370,"iso_code":"RU","names":{"en":"Russia"}},
            "postal":{"code":"101000"}}},
            {"ip":"2.2.2.2","port":2,"country":{"code":"se","name":"Sweden"}},
            {"ip":"3.3.3.3","port":3,"geolocation":{"country_code":"jp"}},
            {"ip":"4.4.4.4","port":4,"country":"Germany"},
            {"ip":"5.5.5.5","port":5,"location":{"country":{"iso_code":"BR"}}},
            {"ip":"6.6.6.6","port":6,"country":{"names":{"en":"Nowhere"}}}]"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out
            .items()
            .iter()
            .map(|c| c.hints.country.map(|c| c.to_string()))
            .collect();
        let want = [
            Some("RU"),
            Some("SE"),
            Some("JP"),
            Some("DE"),
            Some("BR"),
            None,
        ];
        assert_eq!(got, want.map(|c| c.map(str::to_owned)));
        assert_eq!(out.items()[0].proxy.to_string(), "socks4://1.1.1.1:7890");
        let with_user = r#"[{"host":"1.1.1.1","port":1,"username":"u","password":"p:w"},
            {"host":"2.2.2.2","port":2,"username":"","password":"x"}]"#;
        assert_eq!(
            urls(with_user),
            ["http://u:p%3Aw@1.1.1.1:1", "http://2.2.2.2:2"]
        );
    }

    #[test]
    fn unusable_addresses_are_counted_as_dropped() {
        let out = run(
            r#"[{"ip":"0.0.0.0","port":80},{"ip":"239.1.1.1","port":80},"0.0.0.0:81"]"#,
            &JsonOptions::default(),
        )
        .unwrap();
        assert_eq!((out.len(), out.unusable()), (0, 3));
    }

    #[test]
    fn country_codes_meaning_unknown_are_not_hints() {
        // "ZZ" is skipped like any unusable value, so a later key can still
        // give the country.
        let body = r#"[{"ip":"1.1.1.1","port":1,"country":"ZZ"},
            {"ip":"2.2.2.2","port":2,"country":"XX","country_code":"nl"},
            {"ip":"3.3.3.3","port":3,"country":"--"},
            {"ip":"4.4.4.4","port":4,"country":""}]"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out.items().iter().map(|c| c.hints.country).collect();
        assert_eq!(got, [None, Country::parse("NL"), None, None]);
    }

    #[test]
    fn https_spellings() {
        let body = r#"[{"ip":"1.1.1.1","port":1,"https":"yes"},
            {"ip":"2.2.2.2","port":2,"ssl":0},{"ip":"3.3.3.3","port":3,"supportsHttps":true},
            {"ip":"4.4.4.4","port":4,"https":"maybe"}]"#;
        let out = run(body, &JsonOptions::default()).unwrap();
        let got: Vec<_> = out.items().iter().map(|c| c.hints.https).collect();
        assert_eq!(got, [Some(true), Some(false), Some(true), None]);
    }

    #[test]
    fn configured_paths() {
        let body = r#"{"result":{"nodes":[{"addr":{"v4":"1.2.3.4"},"p":[0,8080],
            "geo":{"cc":"jp"},"kind":["socks5"],"anon":"L1","tls":"+"}]}}"#;
        let opts = JsonOptions {
            items: Some("result.nodes".into()),
            ip: Some("/addr/v4".into()),
            port: Some("p.1".into()),
            country: Some("geo.cc".into()),
            protocols: Some("kind".into()),
            anonymity: Some("anon".into()),
            https: Some("/tls".into()),
        };
        let out = run(body, &opts).unwrap();
        assert_eq!(out.len(), 1);
        let c = &out.items()[0];
        assert_eq!(c.proxy.to_string(), "socks5://1.2.3.4:8080");
        assert_eq!(
            c.hints,
            Hints {
                country: Country::parse("JP"),
                anonymity: Some(Anonymity::Elite),
                https: Some(true),
            }
        );
        let pointer = JsonOptions {
            items: Some("/result/nodes".into()),
            ..opts
        };
        assert_eq!(run(body, &pointer).unwrap().len(), 1);
        // A configured ip path is the only place looked at.
        let wrong = JsonOptions {
            ip: Some("ip".into()),
            ..pointer
        };
        assert_eq!(run(body, &wrong).unwrap().len(), 0);
    }

    #[test]
    fn item_discovery() {
        // One level down.
        let nested =
            r#"{"status":"ok","data":{"count":1,"proxies":[{"ip":"9.8.7.6","port":3128}]}}"#;
        assert_eq!(urls(nested), ["http://9.8.7.6:3128"]);
        // Not `data`, but the only array.
        assert_eq!(
            urls(r#"{"count":1,"zzz":["1.2.3.4:80"],"meta":{}}"#),
            ["http://1.2.3.4:80"]
        );
        // Known names win over arrays that merely sort first.
        assert_eq!(
            urls(r#"{"errors":[],"proxies":["1.2.3.4:80"]}"#),
            ["http://1.2.3.4:80"]
        );
        assert!(urls("[]").is_empty());
    }

    #[test]
    fn byte_order_mark_and_json_lines() {
        assert_eq!(
            urls("\u{FEFF}[{\"ip\":\"1.2.3.4\",\"port\":80}]"),
            ["http://1.2.3.4:80"]
        );
        let lines = "{\"ip\":\"1.2.3.4\",\"port\":80}\r\n\
                     {\"ip\":\"5.6.7.8\",\"port\":\"1080\",\"protocol\":\"socks5\"}\n";
        assert_eq!(urls(lines), ["http://1.2.3.4:80", "socks5://5.6.7.8:1080"]);
        // One bad line makes the body invalid JSON, not a partial list.
        let bad = "{\"ip\":\"1.2.3.4\",\"port\":80}\n{\"ip\": \n";
        assert!(matches!(
            run(bad, &JsonOptions::default()),
            Err(JsonError::Syntax(_))
        ));
    }

    #[test]
    fn errors() {
        let opts = JsonOptions::default();
        assert!(matches!(run("{not json", &opts), Err(JsonError::Syntax(_))));
        assert!(matches!(run("", &opts), Err(JsonError::Syntax(_))));
        assert!(matches!(
            run(r#"{"data":[1,2"#, &opts),
            Err(JsonError::Syntax(_))
        ));
        for body in [r#"{"total":0}"#, "42", r#""1.2.3.4:80""#, "null"] {
            match run(body, &opts) {
                Err(JsonError::NoItems(msg)) => assert!(!msg.is_empty(), "{body}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        let at = |p: &str| JsonOptions {
            items: Some(p.into()),
            ..JsonOptions::default()
        };
        let err = run(r#"{"data":{"x":1}}"#, &at("data")).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"items path "data" holds an object, not an array"#
        );
        let err = run(r#"{"data":[]}"#, &at("/nope")).unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"items path "/nope" is not in the document"#
        );
    }

    #[test]
    fn duplicates_and_the_limit() {
        let body = r#"[{"ip":"1.1.1.1","port":1},{"ip":"1.1.1.1","port":"1"},
            "1.1.1.1:1",{"ip":"2.2.2.2","port":2,"protocols":["http","socks5"]},
            {"ip":"3.3.3.3","port":3}]"#;
        assert_eq!(urls(body).len(), 4);
        let mut out = Candidates::new(2);
        parse(body, &JsonOptions::default(), HTTP, &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert!(out.truncated());
    }

    #[test]
    fn replacement_characters() {
        assert_eq!(
            urls("[\"\u{FFFD}1.2.3.4:80\u{FFFD}\", {\"ip\":\"\u{FFFD}\",\"port\":1}]"),
            ["http://1.2.3.4:80"]
        );
    }
}
