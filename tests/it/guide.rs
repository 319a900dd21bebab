//! The guide's examples, run: every TOML block in the README and
//! `docs/src` is read by the config loader as `config check --offline`
//! reads a file, and every `proxywarden` and `curl` line of a `sh` or
//! `console` block runs against a loopback farm (a daemon with its gateway,
//! fake proxies from 127.0.0.x, a fake site) and must exit 0 (`curl`: with
//! an answer of 2xx, or 404 where nothing matches). A line of any other
//! program stands in a block marked `skip=NAME`, and [`SKIPPED`] counts
//! those lines by name, so the number left unrun is written down here.

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::daemon::Daemon;
use common::fakes::{FakeSocks5, SocksOpts, http_proxy, ip};
use common::site::Site;
use proxywarden::config::Config;

/// Lines that cannot run offline, by the `skip=NAME` of their block: how
/// many lines each name covers and why. `proxywarden` and `curl` lines in
/// these blocks still run.
const SKIPPED: &[(&str, usize, &str)] = &[
    ("cargo", 7, "builds, tests, benches, installs"),
    ("debian-package", 4, "builds a .deb and installs it as root"),
    ("systemd", 8, "installs and drives a systemd unit as root"),
    (
        "postgres-setup",
        2,
        "creates a PostgreSQL role and database",
    ),
    ("benches", 16, "the benchmarks take minutes each"),
    ("scrapy", 1, "needs Scrapy and a spider"),
];

/// The words a fenced block may open with. Languages other than `toml`,
/// `sh` and `console` hold no line the test runs (`rust` is the pool's
/// library example, `python` client snippets).
const LANGUAGES: &[&str] = &["toml", "sh", "console", "python", "rust", "text", "json"];

/// One fenced code block.
#[derive(Debug)]
struct Block {
    /// `README.md:12` or `docs/src/api.md:119`: where it opens.
    at: String,
    lang: String,
    /// Words after the language in the info string (`skip=cargo`,
    /// `fragment`).
    attrs: Vec<String>,
    text: String,
}

impl Block {
    fn skip_name(&self) -> Option<&str> {
        self.attrs.iter().find_map(|a| a.strip_prefix("skip="))
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The README, then the guide's chapters in the order of its summary.
/// Every chapter file must be in the summary, so none goes untested.
fn documents() -> Vec<(String, String)> {
    let read = |rel: &str| std::fs::read_to_string(root().join(rel)).unwrap();
    let summary = read("docs/src/SUMMARY.md");
    let mut listed: Vec<String> = summary
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(f, _)| f.to_owned()))
        .collect();
    listed.dedup();
    let mut on_disk: Vec<String> = std::fs::read_dir(root().join("docs/src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|f| f.ends_with(".md") && f != "SUMMARY.md")
        .collect();
    on_disk.sort();
    let mut sorted = listed.clone();
    sorted.sort();
    assert_eq!(sorted, on_disk, "docs/src/SUMMARY.md lists every chapter");
    let mut docs = vec![("README.md".to_owned(), read("README.md"))];
    for f in listed {
        let rel = format!("docs/src/{f}");
        let text = read(&rel);
        docs.push((rel, text));
    }
    docs
}

/// The fenced blocks of `text` (opened and closed by ```` ``` ```` at the
/// start of a line).
fn blocks(file: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<String>, String)> = None;
    for (n, line) in text.lines().enumerate() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => {
                let mut words = info.split([' ', ',']).filter(|w| !w.is_empty());
                let lang = words.next().unwrap_or("").to_owned();
                let attrs = words.map(str::to_owned).collect();
                open = Some((n + 1, lang, attrs, String::new()));
            }
            (Some(_), Some(_)) => {
                let (line, lang, attrs, text) = open.take().unwrap();
                out.push(Block {
                    at: format!("{file}:{line}"),
                    lang,
                    attrs,
                    text,
                });
            }
            (Some((_, _, _, text)), None) => {
                text.push_str(line);
                text.push('\n');
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "{file}: a code block is never closed");
    out
}

fn all_blocks() -> Vec<Block> {
    documents()
        .iter()
        .flat_map(|(file, text)| blocks(file, text))
        .collect()
}

/// A config for `fragment` blocks to be merged into.
const MINIMAL: &str = "[[sources]]\nname = \"mine\"\nurl = \"https://example.com/list.txt\"\n";

/// What `config check --offline` says of a TOML block: the text over the
/// defaults, then the files it names. A `fragment` is merged into
/// [`MINIMAL`] first, table by table.
fn check_toml(block: &Block) -> Result<(), String> {
    let text = if block.attrs.iter().any(|a| a == "fragment") {
        let mut base: toml::Table = MINIMAL.parse().unwrap();
        let part: toml::Table = block
            .text
            .parse()
            .map_err(|e| format!("not valid TOML: {e}"))?;
        merge(&mut base, part);
        toml::to_string(&base).unwrap()
    } else {
        block.text.clone()
    };
    let config = Config::from_toml(&text, &block.at).map_err(|e| e.to_string())?;
    config.check_files(&block.at).map_err(|e| e.to_string())
}

fn merge(base: &mut toml::Table, part: toml::Table) {
    for (k, v) in part {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(p)) => merge(b, p),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[test]
fn every_toml_block_is_a_valid_config() {
    let blocks = all_blocks();
    let mut checked = 0;
    let mut problems = Vec::new();
    for b in &blocks {
        assert!(
            LANGUAGES.contains(&b.lang.as_str()),
            "{}: a block without a known language ({:?}): say what it holds",
            b.at,
            b.lang
        );
        if b.lang == "toml" {
            checked += 1;
            if let Err(e) = check_toml(b) {
                problems.push(format!("{}: {e}", b.at));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 2, "only {checked} TOML blocks found");
    eprintln!("{checked} TOML blocks are valid configs");
}

#[test]
fn a_broken_toml_block_is_reported() {
    let doc = "```toml\n[check]\njudge = []\n```\n```toml fragment\n[harvest]\ntimeout = \"5 minuts\"\n```\n";
    for b in blocks("broken.md", doc) {
        let err = check_toml(&b).unwrap_err();
        assert!(
            err.contains("did you mean") || err.contains("minuts"),
            "{err}"
        );
    }
}

/// A runnable line of a block: its text joined across `\` continuations.
struct Line {
    at: String,
    text: String,
}

/// The command lines of a `sh`/`console` block; `$ ` prompts dropped,
/// comment-only and blank lines left out.
fn command_lines(block: &Block) -> Vec<Line> {
    let mut out = Vec::new();
    let mut pending: Option<Line> = None;
    for (n, raw) in block.text.lines().enumerate() {
        let line = raw.strip_prefix("$ ").unwrap_or(raw);
        let (body, more) = match line.trim_end().strip_suffix('\\') {
            Some(b) => (b.to_owned(), true),
            None => (line.to_owned(), false),
        };
        let line = match pending.take() {
            Some(mut l) => {
                l.text.push(' ');
                l.text.push_str(body.trim());
                l
            }
            None => {
                let t = body.trim();
                if t.is_empty() || t.starts_with('#') {
                    continue;
                }
                let (file, start) = block.at.rsplit_once(':').unwrap();
                let start: usize = start.parse().unwrap();
                Line {
                    at: format!("{file}:{}", start + 1 + n),
                    text: t.to_owned(),
                }
            }
        };
        if more {
            pending = Some(line);
        } else {
            out.push(line);
        }
    }
    out.extend(pending);
    out
}

/// The programs a line starts: the first word of each pipeline or list
/// segment, after `VAR=value` assignments.
fn programs(line: &str) -> Vec<String> {
    let code = line.split(" #").next().unwrap_or(line);
    code.split(['|', ';', '&'])
        .filter_map(|seg| {
            seg.split_whitespace()
                .find(|w| !w.contains('='))
                .map(str::to_owned)
        })
        .collect()
}

/// What a line is: run, started by the farm (`proxywarden serve`), or
/// skipped under its block's name; an error when it is none of them.
enum Kind {
    Run,
    Serve,
    Skipped(String),
}

fn kind(block: &Block, line: &Line) -> Result<Kind, String> {
    let code = line.text.split(" #").next().unwrap().trim();
    if code == "proxywarden serve" {
        return Ok(Kind::Serve);
    }
    let progs = programs(&line.text);
    if progs.iter().any(|p| p == "proxywarden" || p == "curl") {
        if code.starts_with("proxywarden serve") {
            return Err(format!(
                "{}: `{code}`: only a bare `proxywarden serve` stands for the farm's daemon",
                line.at
            ));
        }
        return Ok(Kind::Run);
    }
    match block.skip_name() {
        Some(name) => Ok(Kind::Skipped(name.to_owned())),
        None => Err(format!(
            "{}: `{code}` runs neither proxywarden nor curl: mark its block `skip=NAME` \
             and count it in SKIPPED",
            line.at
        )),
    }
}

/// Where the farm answers, for the substitutions.
struct Farm {
    api: String,
    gateway: String,
    site: String,
    /// The crawl job's site (`POST /crawls` lines).
    slow_site: String,
    proxy_id: i64,
}

/// The guide's placeholders, replaced by the farm's addresses: the API's
/// default address, the gateway's, the example site (`URL` too; the slow
/// one for a crawl job's seeds), a proxy and a crawl job that exist, and a
/// completions file outside /etc.
fn substitute(line: &str, farm: &Farm) -> String {
    let site = if line.contains("/crawls") && line.contains("\"seeds\"") {
        farm.slow_site.trim_end_matches('/')
    } else {
        farm.site.trim_end_matches('/')
    };
    let mut out = line
        .replace("127.0.0.1:8080", &farm.api)
        .replace("localhost:8080", &farm.api)
        .replace("127.0.0.1:8081", &farm.gateway)
        .replace("https://example.com", site)
        .replace("http://example.com", site)
        .replace("/proxies/42/", &format!("/proxies/{}/", farm.proxy_id))
        .replace("/crawls/3", "/crawls/1")
        .replace("/etc/bash_completion.d/proxywarden", "completions.bash");
    if out.starts_with("proxywarden crawl URL ") {
        out = out.replacen(" URL ", &format!(" {site}/ "), 1);
    }
    // curl: bounded, quiet but for errors, and the answer's status on
    // stderr where the line's own output does not go.
    let curl_status = "curl --max-time 60 -sS -w '%{stderr}\\n[guide] http %{http_code}\\n'";
    out.split(" | ")
        .map(|seg| match seg.strip_prefix("curl ") {
            Some(rest) => format!("{curl_status} {rest}"),
            None => seg.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

/// Runs one line with bash in `work`: `proxywarden` is the built binary,
/// its config the farm's (`$PROXYWARDEN_CONFIG`). Ok, or what went wrong.
async fn run_line(
    work: &Path,
    bin_dir: &Path,
    config: &Path,
    at: &str,
    cmd: &str,
) -> Result<(), String> {
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let child = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .current_dir(work)
        .env("PATH", path)
        .env("PROXYWARDEN_CONFIG", config)
        .env("NO_COLOR", "1")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env_remove("RUST_LOG")
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("all_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), child)
        .await
        .map_err(|_| format!("{at}: `{cmd}` ran for more than 120 s"))?
        .map_err(|e| format!("{at}: bash: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = |s: &str| {
        s.chars()
            .rev()
            .take(1500)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
    };
    let failed = |why: String| {
        format!(
            "{at}: `{cmd}` {why}\n--- stdout\n{}\n--- stderr\n{}",
            tail(&stdout),
            tail(&stderr)
        )
    };
    if !out.status.success() {
        return Err(failed(format!("exited with {}", out.status)));
    }
    for status in stderr
        .lines()
        .filter_map(|l| l.strip_prefix("[guide] http "))
    {
        let ok = status.starts_with('2') || status == "404";
        if !ok {
            return Err(failed(format!("got HTTP {status}")));
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_line_runs_against_a_loopback_farm() {
    // Which lines run, and the count of those skipped by name, before any
    // server starts.
    let blocks = all_blocks();
    let mut to_run = Vec::new();
    let mut skipped: BTreeMap<String, usize> = BTreeMap::new();
    let mut serve_lines = 0;
    let mut problems = Vec::new();
    for b in blocks
        .iter()
        .filter(|b| b.lang == "sh" || b.lang == "console")
    {
        for line in command_lines(b) {
            match kind(b, &line) {
                Ok(Kind::Run) => to_run.push(line),
                Ok(Kind::Serve) => serve_lines += 1,
                Ok(Kind::Skipped(name)) => *skipped.entry(name).or_default() += 1,
                Err(e) => problems.push(e),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let expected: BTreeMap<String, usize> = SKIPPED
        .iter()
        .map(|(name, n, _)| ((*name).to_owned(), *n))
        .collect();
    assert_eq!(skipped, expected, "lines skipped by name (SKIPPED)");
    let total_skipped: usize = skipped.values().sum();
    eprintln!(
        "{} command lines to run, {serve_lines} `proxywarden serve` lines stood for by the farm's \
         daemon, {total_skipped} skipped by name: {skipped:?}",
        to_run.len()
    );
    assert!(to_run.len() >= 40, "only {} lines to run", to_run.len());

    // The farm: working HTTP and SOCKS5 proxies, each forwarding from an
    // address of its own, in the US and Germany by their list's hints.
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_proxywarden"),
        bin_dir.join("proxywarden"),
    )
    .unwrap();
    // The example site: a tree of pages with a title, an h1 and a price,
    // as the crawl lines' `--select` expects. The crawl job's seed is a
    // slow one, so the job is still running when its lines read and
    // cancel it.
    let site = Site::tree(12, 3, Duration::ZERO).await;
    let slow_site = Site::tree(10_000, 4, Duration::from_millis(500)).await;
    let mut http = Vec::new();
    for last in 2..6 {
        http.push(http_proxy(last).await);
    }
    let mut socks = Vec::new();
    for last in 6..8 {
        socks.push(
            FakeSocks5::start(SocksOpts {
                upstream_bind: Some(ip(last)),
                ..SocksOpts::default()
            })
            .await,
        );
    }
    let country = |i: usize| if i.is_multiple_of(2) { "US" } else { "DE" };
    let http_list: String = http
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{} {}-H +\n", p.addr(), country(i)))
        .collect();
    let socks_list: String = socks
        .iter()
        .enumerate()
        .map(|(i, p)| format!("{} {}-H +\n", p.addr(), country(i)))
        .collect();
    std::fs::write(dir.path().join("geonode.txt"), &http_list).unwrap();
    std::fs::write(dir.path().join("socks.txt"), &socks_list).unwrap();
    // The lists the `check --list` lines read.
    std::fs::write(work.join("mylist.txt"), &http_list).unwrap();
    std::fs::write(work.join("list.txt"), &socks_list).unwrap();
    let sources = format!(
        "[[sources]]\nname = \"geonode\"\nurl = \"{}\"\nscheme = \"http\"\n\n\
         [[sources]]\nname = \"socks\"\nurl = \"{}\"\nscheme = \"socks5\"\n",
        dir.path().join("geonode.txt").display(),
        dir.path().join("socks.txt").display()
    );
    let config = dir.path().join("proxywarden.toml");
    let (daemon, gateway) = Daemon::start_with_gateway(dir.path(), &sources, |c| {
        std::fs::write(&config, c.toml()).unwrap();
        c
    })
    .await;
    std::fs::copy(&config, work.join("my.toml")).unwrap();
    let proxies = http.len() + socks.len();
    daemon.until_servable(proxies as u64).await;
    let (_, listing) = daemon.json("/proxies?status=all&limit=1000").await;
    let proxy_id = listing["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["id"].as_i64())
        .max()
        .unwrap();
    let farm = Farm {
        api: daemon.addr.to_string(),
        gateway: gateway.to_string(),
        site: site.url("/"),
        slow_site: slow_site.url("/"),
        proxy_id,
    };

    let mut failures = Vec::new();
    for line in &to_run {
        let cmd = substitute(&line.text, &farm);
        if let Err(e) = run_line(&work, &bin_dir, &config, &line.at, &cmd).await {
            failures.push(e);
        }
    }
    daemon.stop().await;
    assert!(
        failures.is_empty(),
        "{} of {} command lines failed:\n{}",
        failures.len(),
        to_run.len(),
        failures.join("\n\n")
    );
}

#[tokio::test]
async fn a_broken_command_line_is_reported() {
    let doc = "```sh\nproxywarden stats --no-such-flag\nsystemctl status proxywarden\n```\n";
    let block = &blocks("broken.md", doc)[0];
    let lines = command_lines(block);
    assert!(matches!(kind(block, &lines[0]), Ok(Kind::Run)));
    let unmarked = kind(block, &lines[1]).err().unwrap();
    assert!(unmarked.contains("broken.md:3"), "{unmarked}");

    let dir = tempfile::tempdir().unwrap();
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_proxywarden"),
        bin_dir.join("proxywarden"),
    )
    .unwrap();
    let config = dir.path().join("none.toml");
    std::fs::write(&config, "").unwrap();
    let err = run_line(dir.path(), &bin_dir, &config, &lines[0].at, &lines[0].text)
        .await
        .unwrap_err();
    assert!(
        err.contains("broken.md:2") && err.contains("exited with"),
        "{err}"
    );
}

#[test]
fn command_lines_join_continuations_and_keep_their_place() {
    let doc = "text\n```console\n$ curl -X POST localhost:8080/crawls \\\n     -d '{}'\n# a comment\n\ncurl localhost:8080/stats   # counts\n```\n";
    let block = &blocks("doc.md", doc)[0];
    let lines = command_lines(block);
    let got: Vec<(&str, &str)> = lines
        .iter()
        .map(|l| (l.at.as_str(), l.text.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("doc.md:3", "curl -X POST localhost:8080/crawls -d '{}'"),
            ("doc.md:7", "curl localhost:8080/stats   # counts"),
        ]
    );
    assert_eq!(
        programs("cat list.txt | proxywarden check --list -"),
        ["cat", "proxywarden"]
    );
    assert_eq!(programs("A=1 cargo bench --bench check"), ["cargo"]);
}

/// The guide is where the README sends a newcomer: the README keeps the
/// two commands CI and the tests read, and links every chapter.
#[test]
fn the_readme_links_every_chapter_and_keeps_its_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    assert!(readme.contains("cargo run --release -- serve"));
    assert!(readme.contains("\ncargo test "));
    for (file, _) in documents().iter().skip(1) {
        if file.ends_with("introduction.md") {
            continue;
        }
        assert!(
            readme.contains(&format!("]({file}")),
            "the README does not link {file}"
        );
    }
}
