//! The one builder of test configurations: a database in the test's
//! directory, fast timeouts, and whatever keys and sources a test adds.

use std::path::{Path, PathBuf};

use proxywarden::config::Config;

/// A config under construction. Keys are kept per section in the order
/// set; setting a key again replaces it.
#[derive(Clone, Debug)]
pub struct TestConfig {
    dir: PathBuf,
    sections: Vec<(String, Vec<(String, String)>)>,
    sources: Vec<String>,
}

impl TestConfig {
    /// `dir/test.db`, harvests with 1 s/2 s timeouts, one retry after
    /// 10 ms and a 1 MiB body cap, keeping loopback addresses (the fake
    /// proxies all listen on 127.0.0.1), checks with 1 s/2 s timeouts at
    /// concurrency 64; no sources yet.
    pub fn new(dir: &Path) -> TestConfig {
        TestConfig {
            dir: dir.to_path_buf(),
            sections: Vec::new(),
            sources: Vec::new(),
        }
        .db("test.db")
        .set("harvest", "connect_timeout", "\"1s\"")
        .set("harvest", "timeout", "\"2s\"")
        .set("harvest", "max_body", "\"1MiB\"")
        .set("harvest", "retries", "1")
        .set("harvest", "retry_backoff", "\"10ms\"")
        .set("harvest", "allow_private_addresses", "true")
        .set("check", "concurrency", "64")
        .set("check", "connect_timeout", "\"1s\"")
        .set("check", "timeout", "\"2s\"")
    }

    /// The database file, relative to the test's directory.
    pub fn db(self, file: &str) -> TestConfig {
        let path = format!("\"{}\"", self.dir.join(file).display());
        self.set("database", "path", &path)
    }

    /// Sets `[section] key = value` (`value` is TOML, e.g. `"\"2s\""`).
    pub fn set(mut self, section: &str, key: &str, value: &str) -> TestConfig {
        let keys = match self.sections.iter_mut().find(|(s, _)| s == section) {
            Some((_, keys)) => keys,
            None => {
                self.sections.push((section.to_owned(), Vec::new()));
                &mut self.sections.last_mut().expect("just pushed").1
            }
        };
        match keys.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value.to_owned(),
            None => keys.push((key.to_owned(), value.to_owned())),
        }
        self
    }

    /// Sets every `key = value` line of `lines` in `[section]`.
    pub fn lines(mut self, section: &str, lines: &str) -> TestConfig {
        for line in lines.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (k, v) = line
                .split_once('=')
                .unwrap_or_else(|| panic!("not a key = value line: {line:?}"));
            self = self.set(section, k.trim(), v.trim());
        }
        self
    }

    /// The judges, as a TOML array.
    pub fn judges(self, array: &str) -> TestConfig {
        self.set("check", "judges", array)
    }

    /// Adds a `[[sources]]` block: `name`, `url` and any extra TOML lines.
    pub fn source(mut self, name: &str, url: &str, extra: &str) -> TestConfig {
        self.sources.push(format!(
            "[[sources]]\nname = \"{name}\"\nurl = \"{url}\"\n{extra}\n"
        ));
        self
    }

    /// Adds `[[sources]]` blocks written out already.
    pub fn sources_toml(mut self, toml: &str) -> TestConfig {
        self.sources.push(toml.to_owned());
        self
    }

    /// The TOML text.
    pub fn toml(&self) -> String {
        let mut out = String::new();
        for (section, keys) in &self.sections {
            out.push_str(&format!("[{section}]\n"));
            for (k, v) in keys {
                out.push_str(&format!("{k} = {v}\n"));
            }
            out.push('\n');
        }
        for s in &self.sources {
            out.push_str(s);
            out.push('\n');
        }
        out
    }

    /// The validated config (panics with every problem if it is invalid).
    pub fn build(&self) -> Config {
        Config::from_toml(&self.toml(), "test.toml").unwrap_or_else(|e| panic!("{e}"))
    }

    /// Writes the TOML to `dir/proxywarden.toml` and returns the path.
    pub fn write(&self) -> PathBuf {
        let p = self.dir.join("proxywarden.toml");
        std::fs::write(&p, self.toml()).unwrap();
        p
    }
}
