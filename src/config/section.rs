//! The [`Section`] reader: the user's table overlaid on the example's, read
//! key by key into real types. Each bad key becomes a [`Problem`] naming it,
//! and the user's keys left over at the end are reported as unknown.

use std::path::PathBuf;
use std::time::Duration;

use toml::{Table, Value};

use super::schedule::Schedule;
use super::{Problem, size_text};

/// The TOML type of a value, for messages.
pub(super) fn type_name(v: &Value) -> &'static str {
    v.type_str()
}

/// The known key closest to `unknown`, if one is close enough to be a
/// typo of it (`judge` for `judges`, `tokn` for `token`).
fn nearest<'a>(unknown: &str, known: &'a [String]) -> Option<&'a str> {
    let lower = unknown.to_ascii_lowercase();
    known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(&lower, k), k))
        .filter(|(d, k)| *d <= (k.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

/// A table being validated. A key is read from the user's table, else from
/// the example's (the defaults). Keys are taken out as they are read, so the
/// user's keys left at the end are unknown; the example's leftovers are keys
/// the user simply did not set.
///
/// The overlay happens as each key is read rather than by merging the two
/// tables first, so that unknown keys are found in the user's table alone and
/// a section the user gives the wrong type still gets the example's keys.
pub(super) struct Section {
    prefix: String,
    user: Table,
    defaults: Table,
    problems: Vec<Problem>,
    /// Every key this section knows (the example's and those read), for
    /// suggesting the nearest one to an unknown key.
    known: Vec<String>,
}

impl Section {
    /// The table at `prefix` (e.g. `harvest`, `sources[2]`): the user's keys
    /// over `defaults`, which is empty where the example has no counterpart
    /// (the entries of an array the user wrote).
    pub(super) fn new(prefix: &str, user: Table, defaults: Table) -> Section {
        Section {
            prefix: prefix.to_owned(),
            known: defaults.keys().cloned().collect(),
            user,
            defaults,
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

    /// Records a problem with key `k` of this section.
    pub(super) fn problem(&mut self, k: &str, msg: &str) {
        let key = self.key(k);
        self.problems.push(Problem {
            key,
            message: msg.to_owned(),
        });
    }

    /// Whether a problem was recorded for key `k` of this section.
    pub(super) fn has_problem(&self, k: &str) -> bool {
        let key = self.key(k);
        self.problems.iter().any(|p| p.key == key)
    }

    /// Takes `k` out: the user's value if set (replacing the default whole,
    /// arrays included), else the default, else `None`.
    pub(super) fn take(&mut self, k: &str) -> Option<Value> {
        if !self.known.iter().any(|known| known == k) {
            self.known.push(k.to_owned());
        }
        let default = self.defaults.remove(k);
        self.user.remove(k).or(default)
    }

    /// Whether `k` has a value, from the user or the defaults.
    fn has(&mut self, k: &str) -> bool {
        if !self.known.iter().any(|known| known == k) {
            self.known.push(k.to_owned());
        }
        self.user.contains_key(k) || self.defaults.contains_key(k)
    }

    /// Takes `k` out, recording "is required" when neither the user nor the
    /// defaults set it.
    pub(super) fn required(&mut self, k: &str) -> Option<Value> {
        let v = self.take(k);
        if v.is_none() {
            self.problem(k, "is required");
        }
        v
    }

    /// Reads `k` with `read` if it is set; an unset key is `None` without a
    /// problem. For keys that have no default.
    pub(super) fn optional<T>(
        &mut self,
        k: &str,
        read: impl FnOnce(&mut Section, &str) -> Option<T>,
    ) -> Option<T> {
        if self.has(k) { read(self, k) } else { None }
    }

    /// The keys not read yet, the user's first, in file order.
    pub(super) fn keys(&self) -> Vec<String> {
        let defaults = self.defaults.keys().filter(|k| !self.user.contains_key(*k));
        self.user.keys().chain(defaults).cloned().collect()
    }

    /// A nested table, its keys overlaid on the default table of the same
    /// name (missing = empty). Merge it back with `absorb`.
    pub(super) fn section(&mut self, k: &str) -> Section {
        let key = self.key(k);
        let defaults = match self.defaults.remove(k) {
            Some(Value::Table(t)) => t,
            _ => Table::new(),
        };
        let user = match self.user.remove(k) {
            None => Table::new(),
            Some(Value::Table(t)) => t,
            Some(other) => {
                self.problem(k, &format!("expected a table, found {}", type_name(&other)));
                Table::new()
            }
        };
        Section::new(&key, user, defaults)
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

    /// All problems, with the user's leftover keys reported as unknown.
    pub(super) fn finish(mut self) -> Vec<Problem> {
        let leftover: Vec<String> = self.user.keys().cloned().collect();
        for k in leftover {
            let message = match nearest(&k, &self.known) {
                Some(near) => format!("unknown key (did you mean `{near}`?)"),
                None => "unknown key".to_owned(),
            };
            self.problem(&k, &message);
        }
        self.problems
    }

    /// A string.
    pub(super) fn string(&mut self, k: &str) -> Option<String> {
        match self.required(k)? {
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

    /// A string parsed with `FromStr`; `expected` describes the form.
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

    /// A non-empty file path.
    pub(super) fn path(&mut self, k: &str) -> Option<PathBuf> {
        let s = self.string(k)?;
        if s.is_empty() {
            self.problem(k, "must not be empty");
            return None;
        }
        Some(PathBuf::from(s))
    }

    /// An optional file path. `""` also means none: example files before
    /// these keys were commented out wrote `""` for "not set".
    pub(super) fn optional_path(&mut self, k: &str) -> Option<PathBuf> {
        self.optional(k, Section::string)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from)
    }

    /// A duration longer than zero, written like `"30s"`.
    pub(super) fn duration(&mut self, k: &str) -> Option<Duration> {
        let parsed = match self.required(k)? {
            Value::String(s) => super::parse_duration(&s),
            // `timeout = 5`: the unit is what is missing, not the quotes.
            Value::Integer(n) => Err(format!(
                "{n} has no unit: write \"{n}s\" for seconds or \"{n}m\" for minutes, in quotes"
            )),
            other => Err(format!(
                "expected a duration like \"30s\" or \"10m\", found {}",
                type_name(&other)
            )),
        };
        match parsed {
            Ok(d) => Some(d),
            Err(e) => {
                self.problem(k, &e);
                None
            }
        }
    }

    /// A byte count in `min..=max`, written as bytes or like `"10MiB"`.
    pub(super) fn size(&mut self, k: &str, min: u64, max: u64) -> Option<u64> {
        let v = self.required(k)?;
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

    /// A whole number in `min..=max`.
    pub(super) fn int(&mut self, k: &str, min: i64, max: i64) -> Option<i64> {
        match self.required(k)? {
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

    /// `true` or `false`.
    pub(super) fn boolean(&mut self, k: &str) -> Option<bool> {
        match self.required(k)? {
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

    /// A cron expression with seconds.
    pub(super) fn schedule(&mut self, k: &str) -> Option<Schedule> {
        let s = self.string(k)?;
        match Schedule::parse(&s) {
            Ok(schedule) => Some(schedule),
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
