//! The [`Section`] reader: takes keys out of a TOML table as they are read,
//! converts each to a real type or records a [`Problem`] naming the key, and
//! reports whatever is left over as unknown.

use std::path::PathBuf;
use std::time::Duration;

use toml::{Table, Value};

use super::{Problem, size_text};

pub(super) fn type_name(v: &Value) -> &'static str {
    v.type_str()
}

/// A table being validated: keys are taken out as they are read, so that
/// whatever is left at the end is unknown.
pub(super) struct Section {
    prefix: String,
    table: Table,
    problems: Vec<Problem>,
}

impl Section {
    pub(super) fn new(prefix: &str, table: Table) -> Section {
        Section {
            prefix: prefix.to_owned(),
            table,
            problems: Vec::new(),
        }
    }

    /// The full key path of `k` in this section, as problems name it.
    pub(super) fn key(&self, k: &str) -> String {
        if self.prefix.is_empty() {
            k.to_owned()
        } else {
            format!("{}.{k}", self.prefix)
        }
    }

    pub(super) fn problem(&mut self, k: &str, msg: &str) {
        let key = self.key(k);
        self.problems.push(Problem {
            key,
            message: msg.to_owned(),
        });
    }

    pub(super) fn take(&mut self, k: &str) -> Option<Value> {
        self.table.remove(k)
    }

    /// The keys not read yet, in file order.
    pub(super) fn keys(&self) -> Vec<String> {
        self.table.keys().cloned().collect()
    }

    /// A nested table (missing = empty). Merge it back with `absorb`.
    pub(super) fn section(&mut self, k: &str) -> Section {
        let key = self.key(k);
        match self.take(k) {
            None => Section::new(&key, Table::new()),
            Some(Value::Table(t)) => Section::new(&key, t),
            Some(other) => {
                self.problem(k, &format!("expected a table, found {}", type_name(&other)));
                Section::new(&key, Table::new())
            }
        }
    }

    /// Reads the nested table `k` with `read` and collects its problems.
    pub(super) fn read_section<T>(&mut self, k: &str, read: impl FnOnce(&mut Section) -> T) -> T {
        let mut child = self.section(k);
        let value = read(&mut child);
        self.absorb(child);
        value
    }

    /// Collects a finished child's problems, including its unknown keys.
    pub(super) fn absorb(&mut self, child: Section) {
        let problems = child.finish();
        self.problems.extend(problems);
    }

    /// All problems, with leftover keys reported as unknown.
    pub(super) fn finish(mut self) -> Vec<Problem> {
        let leftover: Vec<String> = self.table.keys().cloned().collect();
        for k in leftover {
            self.problem(&k, "unknown key");
        }
        self.problems
    }

    pub(super) fn string(&mut self, k: &str) -> Option<String> {
        match self.take(k)? {
            Value::String(s) => Some(s),
            other => {
                self.problem(
                    k,
                    &format!("expected a string, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    pub(super) fn required_string(&mut self, k: &str) -> Option<String> {
        if !self.table.contains_key(k) {
            self.problem(k, "is required");
            return None;
        }
        self.string(k)
    }

    pub(super) fn parsed<T: std::str::FromStr>(&mut self, k: &str, expected: &str) -> Option<T> {
        let s = self.string(k)?;
        match s.parse() {
            Ok(v) => Some(v),
            Err(_) => {
                self.problem(k, &format!("expected {expected}, found {s:?}"));
                None
            }
        }
    }

    pub(super) fn path(&mut self, k: &str) -> Option<PathBuf> {
        self.string(k).filter(|s| !s.is_empty()).map(PathBuf::from)
    }

    pub(super) fn duration(&mut self, k: &str) -> Option<Duration> {
        let s = self.string(k)?;
        match humantime::parse_duration(&s) {
            Ok(d) if !d.is_zero() => Some(d),
            Ok(_) => {
                self.problem(k, "must be longer than zero");
                None
            }
            Err(e) => {
                self.problem(
                    k,
                    &format!("expected a duration like \"30s\" or \"10m\", found {s:?} ({e})"),
                );
                None
            }
        }
    }

    pub(super) fn size(&mut self, k: &str, min: u64, max: u64) -> Option<u64> {
        let v = self.take(k)?;
        let bytes = match &v {
            Value::Integer(i) if *i >= 0 => Some(*i as u64),
            Value::String(s) => s.trim().parse::<bytesize::ByteSize>().ok().map(|b| b.0),
            _ => None,
        };
        match bytes {
            Some(b) if (min..=max).contains(&b) => Some(b),
            Some(b) => {
                self.problem(
                    k,
                    &format!(
                        "must be between {} and {}, found {}",
                        size_text(min),
                        size_text(max),
                        size_text(b)
                    ),
                );
                None
            }
            None => {
                self.problem(k, &format!("expected a size like \"10MiB\", found {v}"));
                None
            }
        }
    }

    pub(super) fn int(&mut self, k: &str, min: i64, max: i64) -> Option<i64> {
        match self.take(k)? {
            Value::Integer(i) if (min..=max).contains(&i) => Some(i),
            Value::Integer(i) => {
                self.problem(k, &format!("must be between {min} and {max}, found {i}"));
                None
            }
            other => {
                self.problem(
                    k,
                    &format!("expected a whole number, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, k: &str) -> Option<bool> {
        match self.take(k)? {
            Value::Boolean(b) => Some(b),
            other => {
                self.problem(
                    k,
                    &format!("expected true or false, found {}", type_name(&other)),
                );
                None
            }
        }
    }

    pub(super) fn cron(&mut self, k: &str) -> Option<String> {
        let s = self.string(k)?;
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse(&s);
        match parsed {
            Ok(_) => Some(s),
            Err(e) => {
                self.problem(
                    k,
                    &format!(
                        "expected a cron expression with seconds like \"0 */30 * * * *\", found {s:?} ({e})"
                    ),
                );
                None
            }
        }
    }
}
