//! The `text` format: every `[scheme://][user:pass@]host:port` token found
//! anywhere in a body, so raw lists, CSV, HTML and JSON that merely contain
//! addresses all work. `host:port:user:pass`, the usual layout of lists with
//! credentials, is read as well. A body with no such token at all is read a
//! second way, as columns: an address followed by its port in the next
//! field (`1.2.3.4 8080`, `1.2.3.4,8080,US`). What a list writes after an
//! address in the layouts lists use (`1.2.3.4:80 US-H-S +`,
//! `1.2.3.4:80:Germany`) becomes the entry's hints, unless the source turns
//! annotations off (see `annotations`).
//!
//! Written by hand rather than with a regex: lists run to tens of megabytes,
//! and jumping from one `:` to the next with `memchr`, then validating a
//! bounded window around it, keeps the scan linear and fast.

use std::mem;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::mpsc;
use std::thread;

use memchr::memchr;

use super::{Candidates, annotations};
use crate::config::TextOptions;
use crate::model::{Candidate, Hints, SourceScheme};
use crate::proxy::{Credentials, Scheme, parse_ipv4_lenient, parse_port, percent_decode};

/// Longest textual IPv6 (an IPv4-mapped address written in full).
const MAX_V6: usize = 45;
/// Longest `user:pass` we look back for; real credentials are far shorter,
/// and the bound keeps a run of junk before an `@` from costing O(n²).
const MAX_CREDS: usize = 256;
/// Longest scheme word we look back for (`socks5h` is the longest we know).
const MAX_SCHEME: usize = 10;

/// Scans `body` for proxy tokens and pushes them into `out` until it is
/// full, reading annotations.
pub fn parse(body: &str, default: SourceScheme, out: &mut Candidates) {
    parse_with(body, &TextOptions::default(), default, out)
}

/// [`parse`] with a source's options.
pub fn parse_with(body: &str, opts: &TextOptions, default: SourceScheme, out: &mut Candidates) {
    let before = (out.len(), out.private());
    let notes = opts.annotations;
    if body.len() < PIPELINE_MIN || !pipelined(body, default, notes, out, CHUNK) {
        serial(body, default, notes, out);
    }
    if (out.len(), out.private()) == before && !out.truncated() {
        columns(body, default, out);
    }
}

/// Reads `body` as lines of fields separated by blanks, commas, semicolons
/// or `|`, quotes ignored, and takes every address field whose next field is a
/// port. Only used when the body holds no `host:port` token: there a bare
/// number after an address is far more likely a port than anything else.
fn columns(body: &str, default: SourceScheme, out: &mut Candidates) {
    let separator = |c: char| c.is_whitespace() || matches!(c, ',' | ';' | '|' | '"' | '\'');
    for line in body.lines() {
        let mut fields = line.split(separator).filter(|f| !f.is_empty());
        let Some(mut prev) = fields.next() else {
            continue;
        };
        for field in fields {
            if let Some(c) = column_pair(prev, field, default)
                && !out.push(c)
            {
                return;
            }
            prev = field;
        }
    }
}

/// An address field and a port field as a candidate.
fn column_pair(ip: &str, port: &str, default: SourceScheme) -> Option<Candidate> {
    let host = any_host(ip)?;
    let port = parse_port(port)?;
    Some(Candidate::new(
        host,
        port,
        None,
        None,
        default,
        Hints::default(),
    ))
}

/// An address as written, whether or not a proxy could listen there: the
/// ones that cannot (`0.0.0.0`, multicast) are dropped and counted by
/// [`Candidates::push`], not skipped unseen.
pub(super) fn any_host(s: &str) -> Option<IpAddr> {
    let s = s.trim();
    if s.contains(':') {
        s.parse::<Ipv6Addr>().ok().map(IpAddr::V6)
    } else {
        parse_ipv4_lenient(s.as_bytes()).map(|o| IpAddr::V4(o.into()))
    }
}

/// Bodies from this size on are scanned on a second thread while this one
/// de-duplicates: on a multi-megabyte list the two halves cost about the
/// same, and a thread is not worth starting for the small lists most
/// sources serve.
const PIPELINE_MIN: usize = 4 << 20;
/// Candidates per hand-over between the scanning and pushing threads.
const CHUNK: usize = 4096;
/// Candidates handed to [`Candidates::push`] at a time when scanning and
/// pushing share a thread.
const BATCH: usize = 32;

fn serial(body: &str, default: SourceScheme, notes: bool, out: &mut Candidates) {
    // Pushing is dominated by cache misses in the de-duplication set.
    // Pushing in runs, rather than between scans, lets the CPU overlap
    // those misses: about 40% faster on a 50 MB list.
    let mut batch = Vec::with_capacity(BATCH);
    let mut open = true;
    scan_ends(body, |t, end| {
        batch.push(t.into_candidate(default, hints_after(body, end, notes)));
        if batch.len() == BATCH {
            open = batch.drain(..).all(|c| out.push(c));
        }
        open
    });
    if open {
        for c in batch {
            if !out.push(c) {
                break;
            }
        }
    }
}

/// Scans on a scoped thread and pushes here, through a bounded channel so
/// that at most a few chunks are in flight. Returns `false`, having done
/// nothing, when the thread cannot be started.
fn pipelined(
    body: &str,
    default: SourceScheme,
    notes: bool,
    out: &mut Candidates,
    chunk: usize,
) -> bool {
    let (tx, rx) = mpsc::sync_channel::<Vec<Candidate>>(4);
    thread::scope(|s| {
        let scanner = thread::Builder::new()
            .name("text-scan".into())
            .spawn_scoped(s, move || {
                let mut batch = Vec::with_capacity(chunk);
                scan_ends(body, |t, end| {
                    batch.push(t.into_candidate(default, hints_after(body, end, notes)));
                    // A failed send means the pusher hit the limit: stop.
                    batch.len() < chunk
                        || tx
                            .send(mem::replace(&mut batch, Vec::with_capacity(chunk)))
                            .is_ok()
                });
                if !batch.is_empty() {
                    let _ = tx.send(batch);
                }
            });
        if scanner.is_err() {
            return false;
        }
        // Dropping the receiver when full stops the scanner.
        'chunks: for batch in rx {
            for c in batch {
                if !out.push(c) {
                    break 'chunks;
                }
            }
        }
        true
    })
}

/// One `[scheme://][user:pass@]host:port` occurrence.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Token {
    pub(super) host: IpAddr,
    pub(super) port: u16,
    pub(super) auth: Option<Credentials>,
    pub(super) scheme: Option<Scheme>,
    /// The entry said `https://`, i.e. an HTTP proxy claimed to do CONNECT.
    pub(super) https: bool,
}

impl Token {
    /// Turns the token into a candidate; `hints` come from the surrounding
    /// source (table cells, JSON fields) and the token's own `https://` wins.
    pub(super) fn into_candidate(self, default: SourceScheme, mut hints: Hints) -> Candidate {
        if self.https {
            hints.https = Some(true);
        }
        Candidate::new(self.host, self.port, self.auth, self.scheme, default, hints)
    }
}

/// Calls `f` with every token in `body`, in order, until `f` returns false.
/// Shared with the HTML and JSON parsers for cells and strings that hold a
/// whole `host:port` or URL.
pub(super) fn scan(body: &str, mut f: impl FnMut(Token) -> bool) {
    scan_ends(body, |t, _| f(t))
}

/// The hints written after the token ending at `end`, when read.
fn hints_after(body: &str, end: usize, notes: bool) -> Hints {
    if notes {
        annotations::after(body, end)
    } else {
        Hints::default()
    }
}

/// [`scan`], also giving the index just past each token.
fn scan_ends(body: &str, mut f: impl FnMut(Token, usize) -> bool) {
    let b = body.as_bytes();
    let mut pos = 0;
    while let Some(colon) = next_colon(b, pos) {
        match token_at(body, colon) {
            Some((token, end)) => {
                if !f(token, end) {
                    return;
                }
                pos = end;
            }
            None => pos = colon + 1,
        }
    }
}

/// The first `:` at or after `pos`. In a list the next one is a line away,
/// closer than `memchr` needs to pay off, so look a little way by hand.
fn next_colon(b: &[u8], pos: usize) -> Option<usize> {
    let near = b.len().min(pos + 32);
    match b[pos..near].iter().position(|&c| c == b':') {
        Some(off) => Some(pos + off),
        None => memchr(b':', &b[near..]).map(|off| near + off),
    }
}

/// The first token in `s`, for a cell or field meant to hold one entry.
pub(super) fn first_token(s: &str) -> Option<Token> {
    let mut found = None;
    scan(s, |t| {
        found = Some(t);
        false
    });
    found
}

/// Validates the token whose host/port separator is the `:` at `colon`.
/// Returns the token and the index just past its port.
fn token_at(body: &str, colon: usize) -> Option<(Token, usize)> {
    let b = body.as_bytes();
    let (port, mut end) = port_after(b, colon)?;
    let (host, mut start) = if colon > 0 && b[colon - 1] == b']' {
        ipv6_before(body, colon - 1)?
    } else {
        ipv4_before(b, colon)?
    };
    if start > 0 && is_word_byte(b[start - 1]) {
        return None;
    }

    let mut auth = None;
    if start > 0 && b[start - 1] == b'@' {
        let at = start - 1;
        let lo = at.saturating_sub(MAX_CREDS + 1);
        let mut i = at;
        while i > lo && is_userinfo_byte(b[i - 1]) {
            i -= 1;
        }
        if at - i > MAX_CREDS {
            return None;
        }
        // Userinfo bytes are ASCII, so these are char boundaries.
        let creds = &body[i..at];
        let (user, pass) = creds.split_once(':').unwrap_or((creds, ""));
        if user.is_empty() {
            return None;
        }
        auth = Some(Credentials {
            username: percent_decode(user),
            password: percent_decode(pass),
        });
        start = i;
    }

    if auth.is_none()
        && let Some((creds, after)) = trailing_credentials(body, end)
    {
        auth = Some(creds);
        end = after;
    }

    let mut scheme = None;
    let mut https = false;
    if start >= 3 && &b[start - 3..start] == b"://" {
        let e = start - 3;
        let lo = e.saturating_sub(MAX_SCHEME + 1);
        let mut i = e;
        while i > lo && b[i - 1].is_ascii_alphanumeric() {
            i -= 1;
        }
        // A longer word, or one that continues with URL-scheme punctuation
        // (`svn+ssh`), is not a scheme we know: skip the whole token rather
        // than guess.
        if i == e || e - i > MAX_SCHEME || (i > 0 && matches!(b[i - 1], b'+' | b'-' | b'.')) {
            return None;
        }
        let word = &body[i..e];
        scheme = Some(Scheme::from_loose(word)?);
        https = word.eq_ignore_ascii_case("https");
    }

    Some((
        Token {
            host,
            port,
            auth,
            scheme,
            https,
        },
        end,
    ))
}

/// The port after `colon`: 1–5 digits, 1–65535, not followed by another
/// digit or by `@` (then it was a password, not a port).
fn port_after(b: &[u8], colon: usize) -> Option<(u16, usize)> {
    let mut end = colon + 1;
    let mut value: u32 = 0;
    while end < b.len() && b[end].is_ascii_digit() {
        if end - colon > 5 {
            return None;
        }
        value = value * 10 + u32::from(b[end] - b'0');
        end += 1;
    }
    if end == colon + 1 || !(1..=65535).contains(&value) {
        return None;
    }
    if end < b.len() && b[end] == b'@' {
        return None;
    }
    Some((value as u16, end))
}

/// `:user:pass` right after a port, running to the end of the entry (a
/// blank, a delimiter or the end of the body), as in `1.2.3.4:8080:user:pass`.
/// Returns the credentials and the index just past them.
fn trailing_credentials(body: &str, port_end: usize) -> Option<(Credentials, usize)> {
    let b = body.as_bytes();
    let field = |from: usize| {
        let lo = from;
        let mut i = from;
        while i < b.len() && i - lo <= MAX_CREDS && is_userinfo_byte(b[i]) && b[i] != b':' {
            i += 1;
        }
        (i > lo && i - lo <= MAX_CREDS).then_some(i)
    };
    if b.get(port_end) != Some(&b':') {
        return None;
    }
    let user_end = field(port_end + 1)?;
    if b.get(user_end) != Some(&b':') {
        return None;
    }
    let pass_end = field(user_end + 1)?;
    let ends_entry = b.get(pass_end).is_none_or(|&c| {
        c.is_ascii_whitespace() || matches!(c, b',' | b';' | b'"' | b'\'' | b'<' | b')' | b']')
    });
    if !ends_entry {
        return None;
    }
    // Userinfo bytes are ASCII, so these are char boundaries.
    let creds = Credentials {
        username: percent_decode(&body[port_end + 1..user_end]),
        password: percent_decode(&body[user_end + 1..pass_end]),
    };
    Some((creds, pass_end))
}

/// The dotted IPv4 ending just before `colon`, and where it starts. Parsed
/// right to left in one pass (the same rules as `parse_ipv4_lenient`: four
/// octets of 1–3 digits, leading zeros read as decimal, each at most 255),
/// which reads at most 15 bytes and is the scanner's hottest loop.
fn ipv4_before(b: &[u8], colon: usize) -> Option<(IpAddr, usize)> {
    let mut i = colon;
    let mut ip: u32 = 0;
    for octet in 0..4 {
        let mut value: u32 = 0;
        let mut place: u32 = 1;
        while i > 0 && b[i - 1].is_ascii_digit() {
            if place == 1000 {
                return None;
            }
            value += u32::from(b[i - 1] - b'0') * place;
            place *= 10;
            i -= 1;
        }
        if place == 1 || value > 255 {
            return None;
        }
        ip |= value << (8 * octet);
        if octet < 3 {
            if i == 0 || b[i - 1] != b'.' {
                return None;
            }
            i -= 1;
        }
    }
    // `1.2.3.4.5:80` is a longer dotted run, not an address.
    if i > 0 && b[i - 1] == b'.' {
        return None;
    }
    Some((IpAddr::V4(Ipv4Addr::from(ip)), i))
}

/// The bracketed IPv6 whose `]` is at `close`, and where its `[` is.
fn ipv6_before(body: &str, close: usize) -> Option<(IpAddr, usize)> {
    let b = body.as_bytes();
    let lo = close.saturating_sub(MAX_V6 + 1);
    let mut i = close;
    loop {
        if i == lo {
            return None;
        }
        i -= 1;
        match b[i] {
            b'[' => break,
            c if c.is_ascii_hexdigit() || c == b':' || c == b'.' => {}
            _ => return None,
        }
    }
    let ip: Ipv6Addr = body[i + 1..close].parse().ok()?;
    Some((IpAddr::V6(ip), i))
}

/// Bytes that, right before a host, mean it is part of a longer word
/// (`v1.2.3.4:80`, `a_1.2.3.4:80`), not an address of its own.
fn is_word_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-')
}

/// Bytes allowed in `user:pass` without percent-encoding. A subset of RFC
/// 3986 userinfo: quotes, parentheses, `,` and `;` are left out because in
/// free text they delimit tokens far more often than they sit in passwords.
fn is_userinfo_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric()
        || matches!(
            c,
            b'-' | b'.' | b'_' | b'~' | b'%' | b'!' | b'$' | b'&' | b'*' | b'+' | b'=' | b':'
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(body: &str) -> Vec<String> {
        run_with(body, SourceScheme::Fixed(Scheme::Http), 1000)
    }

    fn run_with(body: &str, default: SourceScheme, limit: usize) -> Vec<String> {
        let mut out = Candidates::new(limit);
        parse(body, default, &mut out);
        out.items().iter().map(|c| c.proxy.to_string()).collect()
    }

    fn one(body: &str) -> Candidate {
        let mut out = Candidates::new(10);
        parse(body, SourceScheme::Fixed(Scheme::Http), &mut out);
        assert_eq!(out.len(), 1, "{body:?} → {:?}", out.items());
        out.into_vec().remove(0)
    }

    #[test]
    fn plain_list_with_crlf_blank_lines_and_comments() {
        let body = "# free proxies, updated hourly\r\n1.2.3.4:8080\r\n\r\n5.6.7.8:3128\n# end\n";
        assert_eq!(run(body), ["http://1.2.3.4:8080", "http://5.6.7.8:3128"]);
    }

    #[test]
    fn duplicates_are_kept_once() {
        let body = "1.2.3.4:80\n1.2.3.4:80\n001.002.003.004:80\n";
        assert_eq!(run(body), ["http://1.2.3.4:80"]);
    }

    #[test]
    fn leading_zeros_are_decimal() {
        assert_eq!(run("010.002.003.004:080"), ["http://10.2.3.4:80"]);
    }

    #[test]
    fn schemes_and_default() {
        let body = "HTTP://1.1.1.1:80 socks4://2.2.2.2:1080 SOCKS4A://3.3.3.3:1080 \
                    socks5://4.4.4.4:1080 socks5h://5.5.5.5:1080 6.6.6.6:1080";
        assert_eq!(
            run_with(body, SourceScheme::Fixed(Scheme::Socks5), 100),
            [
                "http://1.1.1.1:80",
                "socks4://2.2.2.2:1080",
                "socks4://3.3.3.3:1080",
                "socks5://4.4.4.4:1080",
                "socks5://5.5.5.5:1080",
                "socks5://6.6.6.6:1080",
            ]
        );
        let c = one("7.7.7.7:80");
        assert!(!c.detect);
        let mut out = Candidates::new(10);
        parse("7.7.7.7:80", SourceScheme::Detect, &mut out);
        assert!(out.items()[0].detect);
        assert_eq!(out.items()[0].proxy.scheme, Scheme::Http);
    }

    #[test]
    fn https_scheme_is_http_with_a_hint() {
        let c = one("https://1.2.3.4:443");
        assert_eq!(c.proxy.scheme, Scheme::Http);
        assert!(!c.detect);
        assert_eq!(c.hints.https, Some(true));
        assert_eq!(one("http://1.2.3.4:80").hints.https, None);
    }

    #[test]
    fn unknown_scheme_skips_the_token() {
        assert!(run("ftp://1.2.3.4:21 svn+ssh://1.2.3.4:22 ://1.2.3.4:23").is_empty());
        assert!(run("averyverylongscheme://1.2.3.4:21").is_empty());
        assert_eq!(
            run("ftp://1.2.3.4:21 http://5.6.7.8:80"),
            ["http://5.6.7.8:80"]
        );
    }

    #[test]
    fn credentials_are_kept_and_decoded() {
        let c = one("socks5://us%40er:p%3Ass@1.2.3.4:1080");
        let a = c.proxy.auth.unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("us@er", "p:ss")
        );
        assert_eq!(c.proxy.scheme, Scheme::Socks5);

        let c = one("user:pass@1.2.3.4:8080");
        assert_eq!(c.proxy.username(), "user");
        let c = one("user@1.2.3.4:8080");
        assert_eq!(c.proxy.auth.unwrap().password, "");

        // Same address, different users: different identities.
        assert_eq!(run("a:x@1.2.3.4:80 b:y@1.2.3.4:80 1.2.3.4:80").len(), 3);
    }

    #[test]
    fn empty_username_skips_the_token() {
        assert!(run(":pass@1.2.3.4:80").is_empty());
        assert!(run(" @1.2.3.4:80").is_empty());
    }

    #[test]
    fn overlong_credentials_skip_the_token() {
        let long = format!("{}:pass@1.2.3.4:80", "u".repeat(300));
        assert!(run(&long).is_empty());
        let ok = format!("{}:pass@1.2.3.4:80", "u".repeat(200));
        assert_eq!(run(&ok).len(), 1);
    }

    #[test]
    fn ip_port_user_pass_keeps_the_credentials() {
        let c = one("1.2.3.4:8080:us%40er:p4ss");
        let a = c.proxy.auth.unwrap();
        assert_eq!(
            (a.username.as_str(), a.password.as_str()),
            ("us@er", "p4ss")
        );
        assert_eq!(
            run("socks5://5.6.7.8:1080:a:b\r\n1.2.3.4:80:u:p,US\n"),
            ["socks5://a:b@5.6.7.8:1080", "http://u:p@1.2.3.4:80"]
        );
        // Credentials given before the host win; an entry that goes on
        // after the password, or lacks one, is just the address.
        assert_eq!(run("x:y@1.2.3.4:80:u:p"), ["http://x:y@1.2.3.4:80"]);
        assert_eq!(
            run("1.2.3.4:80:u:p/path 1.2.3.5:81:u 1.2.3.6:82::p"),
            [
                "http://1.2.3.4:80",
                "http://1.2.3.5:81",
                "http://1.2.3.6:82"
            ]
        );
    }

    #[test]
    fn columns_when_no_host_port_token() {
        let body = "ip\tport\tcountry\n1.2.3.4\t8080\tUS\n\n5.6.7.8   3128 DE\r\n";
        assert_eq!(run(body), ["http://1.2.3.4:8080", "http://5.6.7.8:3128"]);
        let csv = "\"ip\",\"port\"\r\n\"9.9.9.9\",\"80\"\r\n10.0.0.1;81\n";
        assert_eq!(run(csv), ["http://9.9.9.9:80", "http://10.0.0.1:81"]);
        // Not ports, not addresses, or not next to each other.
        let junk = "1.2.3.4 0\n1.2.3.4 65536\n999.1.1.1 80\n1.2.3 80\n\
                    1.2.3.4 US 80\n224.0.0.1 80\n1.2.3.4 8080x\n";
        assert!(run(junk).is_empty(), "{:?}", run(junk));
        // A body with real tokens is not read as columns as well.
        assert_eq!(run("1.2.3.4:80\n5.6.7.8 81\n"), ["http://1.2.3.4:80"]);
    }

    #[test]
    fn ipv6_in_brackets() {
        assert_eq!(
            run("[2001:db8::1]:8080 socks5://u:p@[::ffff:1.2.3.4]:1080"),
            [
                "http://[2001:db8::1]:8080",
                "socks5://u:p@[::ffff:1.2.3.4]:1080"
            ]
        );
        assert!(run("[::]:80 [ff02::1]:80 [2001:db8::g]:80 2001:db8::1:80").is_empty());
    }

    #[test]
    fn invalid_entries_are_skipped() {
        let body = "999.1.1.1:80\n1.2.3.4:0\n1.2.3.4:65536\n1.2.3.4:080801\nhello\n\
                    1.2.3.\n1.2.3.4:\n1.2.3:80\n1.2.3.4.5:80\n0.0.0.0:80\n\
                    255.255.255.255:80\n224.0.0.1:80\n1.2.3.4:-1\n:80\n";
        assert!(run(body).is_empty(), "{:?}", run(body));
    }

    #[test]
    fn token_boundaries() {
        assert!(run("v1.2.3.4:80 a_1.2.3.4:80 x-1.2.3.4:80 1.2.3.4:80123").is_empty());
        assert!(run("1.2.3.4:80@host").is_empty());
        assert_eq!(
            run(
                "1.2.3.4:8080/path 2.2.2.2:80 extra \"3.3.3.3:8080\", (4.4.4.4:81). <td>5.5.5.5:82</td>"
            ),
            [
                "http://1.2.3.4:8080",
                "http://2.2.2.2:80",
                "http://3.3.3.3:8080",
                "http://4.4.4.4:81",
                "http://5.5.5.5:82",
            ]
        );
    }

    #[test]
    fn csv_json_and_html_that_contain_addresses() {
        let csv = "ip,port\r\n\"1.2.3.4:80\",US\r\n";
        assert_eq!(run(csv), ["http://1.2.3.4:80"]);
        let json = r#"{"proxies":["1.2.3.4:80","socks5://5.6.7.8:1080"]}"#;
        assert_eq!(run(json), ["http://1.2.3.4:80", "socks5://5.6.7.8:1080"]);
    }

    #[test]
    fn times_and_versions_are_not_addresses() {
        assert!(run("updated 12:30:45, version 1.2.3 at 10:00").is_empty());
    }

    #[test]
    fn replacement_characters_from_lossy_decoding() {
        assert_eq!(
            run("\u{FFFD}\u{FFFD}1.2.3.4:80\u{FFFD}\n\u{FFFD}:\u{FFFD}5.6.7.8:81"),
            ["http://1.2.3.4:80", "http://5.6.7.8:81"]
        );
    }

    #[test]
    fn stops_at_the_limit() {
        let body = "1.1.1.1:1\n1.1.1.1:1\n2.2.2.2:2\n3.3.3.3:3\n4.4.4.4:4\n";
        let mut out = Candidates::new(2);
        parse(body, SourceScheme::Detect, &mut out);
        assert_eq!(out.len(), 2);
        assert!(out.truncated());
    }

    #[test]
    fn pipelined_matches_serial() {
        let mut body = String::new();
        for i in 0..5000u32 {
            body.push_str(&format!("{}.{}.0.1:{}\n", 1 + i % 200, i % 7, 1 + i % 300));
        }
        let default = SourceScheme::Detect;
        for limit in [0, 1, 100, 4999, 100_000] {
            let mut a = Candidates::new(limit);
            serial(&body, default, true, &mut a);
            let mut b = Candidates::new(limit);
            assert!(pipelined(&body, default, true, &mut b, 64));
            assert_eq!(a.items(), b.items(), "limit {limit}");
            assert_eq!(a.truncated(), b.truncated(), "limit {limit}");
        }
    }

    #[test]
    fn annotations_become_hints_unless_turned_off() {
        use crate::proxy::{Anonymity, Country};
        let body = "IP address:Port CountryCode-Anonymity(Noa/Anm/Hia)-SSL_support(S)-Google_passed(+)\n\
                    \n1.2.3.4:80 CO-N-S! + \n5.6.7.8:8080 HK-A -\n\
                    9.9.9.9:3128:The Netherlands\r\n9.9.9.8:3128:u:p\n\
                    socks5://9.9.9.7:1080 DE-H -\n9.9.9.6:81 see notes\n";
        let mut out = Candidates::new(100);
        parse(body, SourceScheme::Fixed(Scheme::Http), &mut out);
        let got: Vec<(String, Hints)> = out
            .items()
            .iter()
            .map(|c| (c.proxy.to_string(), c.hints))
            .collect();
        let h = |cc: &str, a: Option<Anonymity>, https: Option<bool>| Hints {
            country: Country::parse(cc),
            anonymity: a,
            https,
        };
        assert_eq!(
            got,
            [
                (
                    "http://1.2.3.4:80".to_owned(),
                    h("CO", Some(Anonymity::Transparent), Some(true))
                ),
                (
                    "http://5.6.7.8:8080".to_owned(),
                    h("HK", Some(Anonymity::Anonymous), Some(false))
                ),
                ("http://9.9.9.9:3128".to_owned(), h("NL", None, None)),
                ("http://u:p@9.9.9.8:3128".to_owned(), Hints::default()),
                (
                    "socks5://9.9.9.7:1080".to_owned(),
                    h("DE", Some(Anonymity::Elite), Some(false))
                ),
                ("http://9.9.9.6:81".to_owned(), Hints::default()),
            ]
        );
        let mut off = Candidates::new(100);
        let opts = TextOptions { annotations: false };
        parse_with(body, &opts, SourceScheme::Fixed(Scheme::Http), &mut off);
        assert_eq!(off.len(), 6);
        assert!(off.items().iter().all(|c| c.hints == Hints::default()));
    }

    #[test]
    fn unusable_addresses_are_counted_as_dropped() {
        let mut out = Candidates::new(100);
        parse(
            "0.0.0.0:80\n224.0.0.1:80\n255.255.255.255:8080\n[ff02::1]:80\n1.2.3.4:80\n",
            SourceScheme::Detect,
            &mut out,
        );
        assert_eq!(out.len(), 1);
        assert_eq!((out.private(), out.unusable()), (4, 4));
        let mut cols = Candidates::new(100);
        parse("0.0.0.0 80\n", SourceScheme::Detect, &mut cols);
        assert_eq!((cols.len(), cols.unusable()), (0, 1));
    }

    #[test]
    fn pathological_input_stays_linear() {
        // Long runs of what the backscans accept: each colon must cost O(1),
        // so four times the input costs about four times as much, where a
        // backscan per colon would cost sixteen.
        let body = |n: usize| format!("{}{}{}", "1.".repeat(n), ":1".repeat(n), "a:".repeat(n));
        let (small, big) = (body(20_000), body(80_000));
        assert!(run(&big).is_empty());
        let ratio = crate::growth::ratio(
            || assert!(run(&small).is_empty()),
            || assert!(run(&big).is_empty()),
        );
        assert!(ratio < 9.0, "4x the input cost {ratio:.1}x");
    }
}
