//! Configuration in two steps: TOML is read into a table, overlaid on the
//! example's (where every default is defined), then every key is validated
//! into a [`Config`] of real types. All problems are reported together, each
//! naming the file, the key and what was expected. A file per section.

mod api;
mod check;
mod crawls;
mod database;
mod duration;
mod files;
mod gateway;
mod geoip;
mod harvest;
mod live;
mod log;
mod node;
mod pool;
mod schedule;
mod section;
mod sources;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use toml::Table;

pub use api::{ApiConfig, MIN_PUBLIC_TOKEN, Secret};
pub use check::{CheckConfig, JudgeConfig, without_userinfo};
pub use crawls::CrawlsConfig;
pub use database::{DatabaseConfig, PostgresUrl, redact_password};
pub use duration::{MAX_DURATION, parse_duration};
pub use gateway::GatewayConfig;
pub use geoip::GeoipConfig;
pub use harvest::HarvestConfig;
pub use live::Live;
pub use log::{LEVELS, LogConfig};
pub use node::NodeConfig;
pub use pool::PoolConfig;
pub use schedule::Schedule;
pub use sources::{
    HtmlColumns, HtmlOptions, JsonOptions, ListPattern, RegexOptions, SourceConfig, SourceFormat,
    SourceLocation, TextOptions,
};

use section::Section;

/// The fully commented example configuration, which is also where every
/// default is defined (so the two can never disagree): a user's file is
/// read over it.
pub const EXAMPLE: &str = include_str!("../../config.example.toml");

/// [`EXAMPLE`] parsed once: the defaults every load overlays the user's
/// table on.
static DEFAULTS: LazyLock<Table> = LazyLock::new(|| {
    // The example is part of the binary and covered by tests, so a failure
    // here is a build defect, not a user error.
    EXAMPLE
        .parse()
        .expect("the built-in example config is valid TOML")
});

/// The environment variable naming a config file.
pub const CONFIG_ENV: &str = "PROXYWARDEN_CONFIG";

/// The file used when neither `--config` nor the environment names one.
pub const DEFAULT_FILE: &str = "proxywarden.toml";

/// A validated configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where the database lives.
    pub database: DatabaseConfig,
    /// How sources are fetched.
    pub harvest: HarvestConfig,
    /// The sources, in config order.
    pub sources: Vec<SourceConfig>,
    /// How proxies are checked.
    pub check: CheckConfig,
    /// Country lookups.
    pub geoip: GeoipConfig,
    /// The HTTP API.
    pub api: ApiConfig,
    /// The local rotating gateway.
    pub gateway: GatewayConfig,
    /// Crawl jobs run by the daemon.
    pub crawls: CrawlsConfig,
    /// The daemon's one fetch pool, shared by the gateway and crawl jobs.
    pub pool: PoolConfig,
    /// This process as one of several nodes sharing a database.
    pub node: NodeConfig,
    /// How much the daemon logs.
    pub log: LogConfig,
}

/// Every problem found in a config file.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError {
    /// The file, or `<built-in>` for the defaults.
    pub file: String,
    /// Every problem, in the order found.
    pub problems: Vec<Problem>,
}

/// One problem in a config file: the key it concerns (dotted, with array
/// indices, e.g. `sources[2].url`; empty for the file as a whole) and what
/// is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// The key, e.g. `harvest.timeout`.
    pub key: String,
    /// What was expected or found.
    pub message: String,
}

impl Problem {
    fn file(message: String) -> Problem {
        Problem {
            key: String::new(),
            message,
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.key.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.key, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.problems.len();
        write!(
            f,
            "{}: {n} problem{}",
            self.file,
            if n == 1 { "" } else { "s" }
        )?;
        for p in &self.problems {
            write!(f, "\n  {}: {p}", self.file)?;
        }
        Ok(())
    }
}

/// Which file a config came from, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigOrigin {
    /// Built-in defaults.
    Defaults,
    /// A file on disk.
    File(PathBuf),
}

impl fmt::Display for ConfigOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigOrigin::Defaults => f.write_str("built-in defaults"),
            ConfigOrigin::File(p) => write!(f, "{}", p.display()),
        }
    }
}

impl Config {
    /// The file [`Config::discover`] reads, if any.
    fn locate(explicit: Option<&Path>) -> Option<PathBuf> {
        let env = std::env::var_os(CONFIG_ENV).filter(|v| !v.is_empty());
        match (explicit, env) {
            (Some(p), _) => Some(p.to_path_buf()),
            (None, Some(e)) => Some(PathBuf::from(e)),
            (None, None) => {
                let p = PathBuf::from(DEFAULT_FILE);
                p.exists().then_some(p)
            }
        }
    }

    /// [`Config::discover`] and [`Config::check_files`] together, as
    /// `config check` runs them: a file with mistakes in its text also has
    /// the files it names checked, so that every problem is reported at
    /// once.
    pub fn discover_checked(
        explicit: Option<&Path>,
    ) -> Result<(Config, ConfigOrigin), ConfigError> {
        match Config::discover(explicit) {
            Ok((config, origin)) => {
                config.check_files(&origin.to_string())?;
                Ok((config, origin))
            }
            Err(mut e) => {
                let table = Config::locate(explicit)
                    .and_then(|p| std::fs::read_to_string(p).ok())
                    .and_then(|text| text.parse::<Table>().ok());
                if let Some(table) = table {
                    for p in files::FileRefs::of_table(&table).problems(true) {
                        if !e.problems.iter().any(|q| q.key == p.key) {
                            e.problems.push(p);
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// The built-in defaults: the example configuration.
    pub fn defaults() -> Config {
        // The example is part of the binary and covered by tests, so a
        // failure here is a build defect, not a user error. It is read as a
        // user's file (over itself), so a key in it that nothing reads fails
        // as unknown instead of being silently ignored.
        Config::from_toml(EXAMPLE, "<built-in>").expect("the built-in example config is valid")
    }

    /// Finds and loads the config: `explicit` (from `--config`), else
    /// `$PROXYWARDEN_CONFIG`, else `./proxywarden.toml` if present, else the
    /// built-in defaults.
    pub fn discover(explicit: Option<&Path>) -> Result<(Config, ConfigOrigin), ConfigError> {
        match Config::locate(explicit) {
            Some(p) => Ok((Config::load(&p)?, ConfigOrigin::File(p))),
            None => Ok((Config::defaults(), ConfigOrigin::Defaults)),
        }
    }

    /// Reads and validates one file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            problems: vec![Problem::file(format!("cannot read the file: {e}"))],
        })?;
        Config::from_toml(&text, &file)
    }

    /// Validates TOML text over the defaults; `file` names it in messages.
    pub fn from_toml(text: &str, file: &str) -> Result<Config, ConfigError> {
        let user: Table = text.parse().map_err(|e: toml::de::Error| ConfigError {
            file: file.to_owned(),
            problems: vec![Problem::file(format!(
                "not valid TOML: {}",
                e.to_string().trim_end()
            ))],
        })?;
        let mut root = Section::new("", user, DEFAULTS.clone());
        let config = build(&mut root);
        let problems = root.finish();
        // Every reader that gives up records why; an error without problems
        // would tell the user nothing.
        debug_assert!(config.is_some() || !problems.is_empty());
        match config {
            Some(c) if problems.is_empty() => Ok(c),
            _ => Err(ConfigError {
                file: file.to_owned(),
                problems,
            }),
        }
    }
}

impl Config {
    /// Checks the files the config names, as `config check` does: the
    /// extra CA file, the GeoIP database and every enabled local source
    /// must be readable files. Kept apart from [`Config::from_toml`] so that
    /// validating text stays pure (and testable with paths that do not
    /// exist); `file` names the config in messages.
    pub fn check_files(&self, file: &str) -> Result<(), ConfigError> {
        self.file_problems(file, true)
    }

    /// The files a running `serve` or `check` reads at start-up (the extra
    /// CA file and the GeoIP database, which must be a MaxMind database). A
    /// missing local source only fails that source, as at every harvest.
    pub fn check_runtime_files(&self, file: &str) -> Result<(), ConfigError> {
        self.file_problems(file, false)
    }

    fn file_problems(&self, file: &str, sources: bool) -> Result<(), ConfigError> {
        let problems = files::FileRefs::of(self).problems(sources);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                file: file.to_owned(),
                problems,
            })
        }
    }
}

/// Validates every section. A key the user leaves out is read from the
/// example, so a missing section is the same as an empty one. Every section
/// is read before giving up, so that all problems are found at once.
fn build(root: &mut Section) -> Option<Config> {
    let database = root.read_section("database", database::read);
    let harvest = root.read_section("harvest", harvest::read);
    let sources = sources::read(root);
    let check = root.read_section("check", check::read);
    let geoip = root.read_section("geoip", geoip::read);
    let api = root.read_section("api", api::read);
    let gateway = root.read_section("gateway", gateway::read);
    let crawls = root.read_section("crawls", crawls::read);
    let pool = root.read_section("pool", pool::read);
    let node = root.read_section("node", node::read);
    let log = root.read_section("log", log::read);
    Some(Config {
        database: database?,
        harvest: harvest?,
        sources,
        check: check?,
        geoip,
        api: api?,
        gateway: gateway?,
        crawls: crawls?,
        pool: pool?,
        node: node?,
        log: log?,
    })
}

/// A byte count the way config files write it: `10 MiB`, `512 KiB`, `100 B`.
pub fn size_text(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * 1024;
    const GIB: u64 = 1024 * 1024 * 1024;
    match bytes {
        0 => "0 B".into(),
        b if b % GIB == 0 => format!("{} GiB", b / GIB),
        b if b % MIB == 0 => format!("{} MiB", b / MIB),
        b if b % KIB == 0 => format!("{} KiB", b / KIB),
        b => format!("{b} B"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use super::*;
    use crate::model::SourceScheme;
    use crate::proxy::Scheme;

    #[test]
    fn example_is_the_default() {
        let from_example = Config::from_toml(EXAMPLE, "example").unwrap();
        let empty = Config::from_toml("", "empty").unwrap();
        assert_eq!(from_example, empty);
        assert!(empty.sources.len() >= 12);
        let formats: BTreeSet<&str> = empty.sources.iter().map(|s| s.format.name()).collect();
        assert_eq!(formats, BTreeSet::from(["html", "json", "text"]));
    }

    #[test]
    fn every_problem_is_reported_with_its_key() {
        let text = r#"
            bogus = 1
            [harvest]
            timeout = "soon"
            max_body = "lots"
            concurrency = 0
            colour = "red"
            schedule = "every day"
            [[sources]]
            url = "ftp://example.com/list"
            format = "xml"
            [[sources]]
            name = "a"
            url = "https://example.com/{page}"
            table = "table"
            [check]
            judges = ["not a url"]
            [api]
            listen = "everywhere"
        "#;
        let err = Config::from_toml(text, "my.toml").unwrap_err();
        let all = err.to_string();
        for needle in [
            "bogus: unknown key",
            "harvest.timeout: expected a duration",
            "harvest.max_body: expected a size",
            "harvest.concurrency: must be between 1 and 256, found 0",
            "harvest.colour: unknown key",
            "harvest.schedule: expected a cron expression",
            "sources[0].name: is required",
            "sources[0].url: unsupported URL scheme \"ftp\"",
            "sources[0].format: expected \"text\", \"regex\", \"html\" or \"json\", found \"xml\"",
            "sources[1].url: contains {page} but the source has no `pages`",
            "sources[1].table: is not an option of format = \"text\"",
            "check.judges[0]: invalid URL",
            "api.listen: expected an address",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
        }
        assert!(all.starts_with("my.toml: 13 problems"), "{all}");
    }

    #[test]
    fn a_user_key_overrides_its_default_and_siblings_keep_theirs() {
        let defaults = Config::defaults();
        let c = Config::from_toml("[harvest]\ntimeout = \"45s\"\n", "t").unwrap();
        let expected = HarvestConfig {
            timeout: Duration::from_secs(45),
            ..defaults.harvest.clone()
        };
        assert_eq!(c.harvest, expected);
        assert_ne!(c.harvest.timeout, defaults.harvest.timeout);
        assert_eq!(c.sources, defaults.sources);
        assert_eq!(c.check, defaults.check);
    }

    #[test]
    fn user_sources_and_judges_replace_the_built_in_lists() {
        let defaults = Config::defaults();
        let text = r#"
            [[sources]]
            name = "mine"
            url = "https://example.com/list.txt"
            [check]
            judges = ["http://judge.example/"]
        "#;
        let c = Config::from_toml(text, "t").unwrap();
        assert_eq!(c.sources.len(), 1);
        let mine = &c.sources[0];
        assert_eq!(mine.name, "mine");
        // Per-source keys left out take their defaults.
        assert_eq!(mine.format, SourceFormat::Text(Default::default()));
        assert_eq!(mine.scheme, SourceScheme::Fixed(Scheme::Http));
        assert!(mine.enabled);
        let judges: Vec<&str> = c.check.judges.iter().map(|j| j.url.as_str()).collect();
        assert_eq!(judges, ["http://judge.example/"]);
        assert!(c.check.judges[0].echo);
        // The rest of [check] keeps its defaults.
        assert_eq!(c.check.concurrency, defaults.check.concurrency);
        assert_eq!(c.check.timeout, defaults.check.timeout);
    }

    #[test]
    fn unknown_keys_are_the_users_only() {
        // Keys that exist only in the example are defaults, not unknown.
        assert!(Config::from_toml("[harvest]\n[check]\n", "t").is_ok());
        let text = r#"
            [harvest]
            timout = "5s"
            [[sources]]
            name = "a"
            url = "https://example.com/"
            enabeld = false
        "#;
        let err = Config::from_toml(text, "my.toml").unwrap_err();
        let keys: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            keys,
            [
                "harvest.timout: unknown key (did you mean `timeout`?)",
                "sources[0].enabeld: unknown key (did you mean `enabled`?)"
            ]
        );
        assert!(err.to_string().starts_with("my.toml: 2 problems"), "{err}");
    }

    #[test]
    fn a_duplicate_source_name_is_reported_with_the_entrys_other_problems() {
        let text = r#"
            [[sources]]
            name = "x"
            url = "a.txt"
            [[sources]]
            name = "x"
            url = "b.txt"
            scheme = "ftp"
        "#;
        let err = Config::from_toml(text, "t").unwrap_err();
        let problems: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(
            problems,
            [
                "sources[1].name: duplicate source name \"x\"",
                "sources[1].scheme: expected \"http\", \"socks4\", \"socks5\" or \"detect\", found \"ftp\"",
            ]
        );
    }

    #[test]
    fn a_section_of_the_wrong_type_is_one_problem() {
        let err = Config::from_toml("harvest = 5\n", "t").unwrap_err();
        let problems: Vec<String> = err.problems.iter().map(|p| p.to_string()).collect();
        assert_eq!(problems, ["harvest: expected a table, found integer"]);
    }

    #[test]
    fn keys_without_a_default_are_unset_and_empty_means_unset() {
        let c = Config::defaults();
        assert_eq!(c.api.token, None);
        assert_eq!(c.check.extra_ca_file, None);
        assert_eq!(c.geoip.database, None);
        // (A blank api.token is an error instead: see tokens_are_taken_as_written.)
        let text = "[check]\nextra_ca_file = \"\"\n[geoip]\ndatabase = \"\"\n";
        assert_eq!(Config::from_toml(text, "old.toml").unwrap(), c);
        // A key with a default cannot be emptied into nothing.
        let err = Config::from_toml("[database]\npath = \"\"\n", "t").unwrap_err();
        assert_eq!(
            err.problems[0].to_string(),
            "database.path: must not be empty"
        );
    }

    #[test]
    fn database_url_picks_the_backend_and_names_a_bad_one() {
        let db = |url: &str| Config::from_toml(&format!("[database]\nurl = {url:?}\n"), "t");
        let c = db("sqlite:/var/lib/pw/store.db").unwrap();
        assert_eq!(c.database.path, PathBuf::from("/var/lib/pw/store.db"));
        assert_eq!(c.database.postgres, None);
        assert_eq!(
            db("store.db").unwrap().database.path,
            PathBuf::from("store.db")
        );
        let c = db("postgres://pw:s3cret@db.example:5432/pw").unwrap();
        let url = c.database.postgres.clone().expect("a PostgreSQL URL");
        assert_eq!(url.as_str(), "postgres://pw:s3cret@db.example:5432/pw");
        assert!(!format!("{url:?}").contains("s3cret"), "{url:?}");
        assert_eq!(c.database.shown(), "postgres://pw:***@db.example:5432/pw");
        for (bad, says) in [
            (
                "postgres://db.example:notaport/pw",
                "not a usable PostgreSQL URL",
            ),
            (
                "mysql://db.example/pw",
                "expected a file path, a sqlite: URL or a postgres:// URL",
            ),
            ("sqlite:", "expected a file path"),
        ] {
            let err = db(bad).unwrap_err();
            let shown = err.problems[0].to_string();
            assert!(shown.starts_with("database.url: "), "{bad}: {shown}");
            assert!(shown.contains(says), "{bad}: {shown}");
        }
    }

    #[test]
    fn defaults_of_array_entries_are_the_ones_the_example_states() {
        // Array entries have no counterpart in the example to be read over,
        // so their defaults are constants; the example's comments must agree.
        for stated in [
            format!("(default {:?})", sources::DEFAULT_FORMAT),
            format!("(default {:?})", sources::DEFAULT_SCHEME),
            format!("skips the source (default {})", sources::DEFAULT_ENABLED),
            format!(
                "echo = {} (default {})",
                !check::JUDGE_ECHO,
                check::JUDGE_ECHO
            ),
        ] {
            assert!(
                EXAMPLE.contains(&stated),
                "the example does not say {stated:?}"
            );
        }
    }

    #[test]
    fn tokens_are_taken_as_written_and_must_be_long_off_loopback() {
        let problems = |text: &str| -> Vec<String> {
            match Config::from_toml(text, "t") {
                Ok(_) => Vec::new(),
                Err(e) => e.problems.iter().map(|p| p.to_string()).collect(),
            }
        };
        for blank in ["", " ", "\t"] {
            assert_eq!(
                problems(&format!("[api]\ntoken = {blank:?}\n")),
                ["api.token: must not be blank (leave the key out to run without a token)"],
                "{blank:?}"
            );
        }
        assert_eq!(
            problems("[api]\ntoken = \" x \"\n"),
            [
                "api.token: must not start or end with blanks: HTTP strips them from headers, so it could never match"
            ]
        );
        // Loopback takes any token; another address needs 16 characters.
        assert!(problems("[api]\ntoken = \"short\"\n").is_empty());
        assert_eq!(
            problems("[api]\nlisten = \"0.0.0.0:8080\"\ntoken = \"fifteen-chars-x\"\n"),
            [
                "api.token: must be at least 16 characters when api.listen (0.0.0.0:8080) is not a loopback address, found 15"
            ]
        );
        assert!(
            problems("[api]\nlisten = \"[::]:8080\"\ntoken = \"sixteen-chars-xy\"\n").is_empty()
        );
        // A blank token off loopback is one problem, not two.
        assert_eq!(
            problems("[api]\nlisten = \"0.0.0.0:8080\"\ntoken = \"\"\n").len(),
            1
        );
        // Inner blanks are part of the token, kept as written.
        let c = Config::from_toml("[api]\ntoken = \"a b\"\n", "t").unwrap();
        assert_eq!(c.api.token, Some(Secret("a b".into())));
    }

    #[test]
    fn secrets_are_redacted() {
        let text = r#"
            [api]
            token = "hunter2"
            [[sources]]
            name = "a"
            url = "https://example.com/"
            headers = { Authorization = "Bearer hunter2" }
        "#;
        let c = Config::from_toml(text, "t").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.sources[0].headers.len(), 1);
    }
}
