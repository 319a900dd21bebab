//! `[check]`: the judges and how proxies are checked and re-checked.

use std::path::PathBuf;
use std::time::Duration;

use toml::{Table, Value};
use url::Url;

use super::section::{Section, type_name};
use crate::model::RecheckPolicy;

/// `[check]`
#[derive(Clone, Debug, PartialEq)]
pub struct CheckConfig {
    /// Judges, used in rotation.
    pub judges: Vec<JudgeConfig>,
    /// Extra PEM roots for private judges.
    pub extra_ca_file: Option<PathBuf>,
    /// Checks in flight.
    pub concurrency: usize,
    /// Connect timeout per check.
    pub connect_timeout: Duration,
    /// Total timeout per check.
    pub timeout: Duration,
    /// Also test CONNECT + TLS.
    pub https: bool,
    /// How long a proxy's HTTPS result stands before it is tested again.
    pub https_recheck: Duration,
    /// Re-check interval for alive proxies.
    pub recheck_alive: Duration,
    /// Re-checks per second spent keeping served proxies fresh.
    pub serve_recheck_rate: u32,
    /// The shortest re-check cycle of served proxies.
    pub serve_recheck_min: Duration,
    /// First backoff for dead proxies.
    pub recheck_dead: Duration,
    /// Backoff cap.
    pub recheck_dead_max: Duration,
    /// Dead and unlisted this long → deleted.
    pub purge_after: Duration,
}

impl CheckConfig {
    /// How often the daemon re-checks each of `served` proxies: long enough
    /// to stay within `serve_recheck_rate`, at least `serve_recheck_min`,
    /// at most `recheck_alive`.
    pub fn serve_cycle(&self, served: usize) -> Duration {
        let rate = f64::from(self.serve_recheck_rate.max(1));
        Duration::from_secs_f64(served as f64 / rate)
            .max(self.serve_recheck_min)
            .min(self.recheck_alive)
    }

    /// When proxies are checked again while `served` proxies are served:
    /// an alive one between two thirds and four thirds of a
    /// [`serve_cycle`](Self::serve_cycle) after its last check. That is
    /// one cycle on average, so the re-checks spent are the
    /// `serve_recheck_rate` configured, and wide enough that proxies
    /// checked together (all of them, after a harvest or a burst) drift
    /// apart within a few cycles: checks in waves would leave stretches
    /// where few proxies are checked, and a mass death would go unseen
    /// for that long.
    pub fn serve_policy(&self, served: usize) -> RecheckPolicy {
        let alive = (self.serve_cycle(served) * 4 / 3).min(self.recheck_alive);
        RecheckPolicy {
            alive,
            alive_jitter: alive / 2,
            ..self.recheck_policy()
        }
    }

    /// How old a served proxy's last check may be while `served` proxies
    /// are served: two re-check cycles and a check's timeout. Past it the
    /// proxy is not served until it passes another check.
    pub fn fresh_window(&self, served: usize) -> Duration {
        2 * self.serve_cycle(served) + self.timeout
    }

    /// When a served proxy whose schedule this daemon did not make (one a
    /// `proxywarden check` beside it found alive, whose next check may be
    /// `recheck_alive` away) is to be checked, if sooner than
    /// its `next_check_at`: where [`serve_policy`](Self::serve_policy) would
    /// have put it after its last check (`spread` in 0..1 picks the place
    /// in the policy's range), and at once when that is already past or the
    /// last check is older than a cycle. Times are unix ms.
    pub fn served_check_at(
        &self,
        served: usize,
        last_checked: Option<i64>,
        next_check_at: i64,
        now: i64,
        spread: f64,
    ) -> Option<i64> {
        let cycle = ms(self.serve_cycle(served));
        let at = match last_checked {
            Some(t) if now - t <= cycle => {
                // Two thirds to four thirds of a cycle, as serve_policy.
                let after =
                    cycle * 2 / 3 + (spread.clamp(0.0, 1.0) * (cycle * 2 / 3) as f64) as i64;
                (t + after).max(now)
            }
            _ => now,
        };
        (at < next_check_at).then_some(at)
    }

    /// True when `checked` proxies checked (or adopted) together, while
    /// `served` are served, are a bulk check: more than `BULK_SPAN` of
    /// re-checks at the served cycle's pace, and at least `BULK_MIN`. The
    /// start-up re-check, a sweep after a burst, a `proxywarden check`
    /// beside the daemon and a harvest's first round all are; the rounds of
    /// a steady state, a second's re-checks each, are not.
    pub fn is_bulk(&self, served: usize, checked: usize) -> bool {
        let pace = served as f64 / self.serve_cycle(served).as_secs_f64();
        checked >= BULK_MIN && checked as f64 > pace * BULK_SPAN.as_secs_f64()
    }

    /// The re-check policy after a bulk check while `served` proxies are
    /// served: a pass is checked again anywhere in the next
    /// [`serve_cycle`](Self::serve_cycle), evenly. After
    /// [`serve_policy`](Self::serve_policy) proxies checked together would
    /// all come back between two thirds and four thirds of a cycle later,
    /// and until then nothing would be re-checked: a mass death in that
    /// stretch would go unseen. Spread over the cycle they come back at
    /// the configured rate from the first second.
    pub fn bulk_policy(&self, served: usize) -> RecheckPolicy {
        let alive = self.serve_cycle(served);
        RecheckPolicy {
            alive,
            alive_jitter: alive,
            ..self.recheck_policy()
        }
    }

    /// When a proxy adopted in bulk (see [`is_bulk`](Self::is_bulk)) is to
    /// be checked, if sooner than its `next_check_at`: at `spread` (0..1)
    /// of the cycle from `now`, as [`bulk_policy`](Self::bulk_policy) puts
    /// a proxy it checked. Times are unix ms.
    pub fn bulk_check_at(
        &self,
        served: usize,
        next_check_at: i64,
        now: i64,
        spread: f64,
    ) -> Option<i64> {
        let cycle = ms(self.serve_cycle(served));
        let at = now + (spread.clamp(0.0, 1.0) * cycle as f64) as i64;
        (at < next_check_at).then_some(at)
    }

    /// When proxies are checked again, as `[check]` sets it.
    pub fn recheck_policy(&self) -> RecheckPolicy {
        RecheckPolicy {
            alive: self.recheck_alive,
            alive_jitter: self.recheck_alive / 4,
            dead: self.recheck_dead,
            dead_max: self.recheck_dead_max,
        }
    }
}

/// See [`CheckConfig::is_bulk`]: proxies checked together that would come
/// back in a wave longer than this make a bulk check.
pub const BULK_SPAN: Duration = Duration::from_secs(5);
/// See [`CheckConfig::is_bulk`]: fewer proxies are never a bulk check.
pub const BULK_MIN: usize = 4;

/// One judge: a URL that answers with the request it received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JudgeConfig {
    /// The http(s) URL asked through each proxy.
    pub url: Url,
    /// Text the judge's answer always contains, if required.
    pub marker: Option<String>,
    /// True when the judge echoes the request URL, so that the per-check
    /// nonce must come back (defeats caches and captive portals).
    pub echo: bool,
}

impl JudgeConfig {
    /// The URL as `/healthz`, `/stats` and logs show it: without its user
    /// name and password.
    pub fn shown(&self) -> String {
        without_userinfo(&self.url)
    }
}

/// `url` without user name and password, for showing.
pub fn without_userinfo(url: &Url) -> String {
    let mut u = url.clone();
    let _ = u.set_username("");
    let _ = u.set_password(None);
    u.to_string()
}

/// Whether a judge echoes the request URL unless its entry says `echo`.
/// Judges are array entries, which the example cannot give defaults to, so
/// this one default lives here (the example's comment states it).
pub(super) const JUDGE_ECHO: bool = true;

/// Validates `[check]`.
pub(super) fn read(c: &mut Section) -> Option<CheckConfig> {
    // The user's `judges` replaces the example's list whole, like any value.
    let judges = judges(c, "judges");
    let extra_ca_file = c.optional_path("extra_ca_file");
    let concurrency = c.int("concurrency", 1, 100_000);
    let connect_timeout = c.duration("connect_timeout");
    let timeout = c.duration("timeout");
    let https = c.boolean("https");
    let https_recheck = c.duration("https_recheck");
    let recheck_alive = c.duration("recheck_alive");
    let serve_recheck_rate = c.int("serve_recheck_rate", 1, 1_000_000);
    let serve_recheck_min = c.duration("serve_recheck_min");
    let recheck_dead = c.duration("recheck_dead");
    let recheck_dead_max = c.duration("recheck_dead_max");
    let purge_after = c.duration("purge_after");
    if let (Some(connect), Some(total)) = (connect_timeout, timeout)
        && connect > total
    {
        c.problem("connect_timeout", "must not be longer than check.timeout");
    }
    if let (Some(dead), Some(max)) = (recheck_dead, recheck_dead_max)
        && dead > max
    {
        c.problem(
            "recheck_dead",
            "must not be longer than check.recheck_dead_max",
        );
    }
    Some(CheckConfig {
        judges: judges?,
        extra_ca_file,
        // The range was checked, so the cast cannot truncate.
        concurrency: concurrency? as usize,
        connect_timeout: connect_timeout?,
        timeout: timeout?,
        https: https?,
        https_recheck: https_recheck?,
        recheck_alive: recheck_alive?,
        // The range was checked, so the cast cannot truncate.
        serve_recheck_rate: serve_recheck_rate? as u32,
        serve_recheck_min: serve_recheck_min?,
        recheck_dead: recheck_dead?,
        recheck_dead_max: recheck_dead_max?,
        purge_after: purge_after?,
    })
}

/// Judges: each a URL string or `{ url, marker, echo }`.
fn judges(s: &mut Section, k: &str) -> Option<Vec<JudgeConfig>> {
    let v = s.required(k)?;
    let Value::Array(items) = v else {
        s.problem(
            k,
            &format!("expected an array of judge URLs, found {}", type_name(&v)),
        );
        return None;
    };
    if items.is_empty() {
        s.problem(k, "needs at least one judge");
    }
    let mut out = Vec::new();
    for (i, item) in items.into_iter().enumerate() {
        let key = format!("{k}[{i}]");
        let (url, marker, echo) = match item {
            Value::String(u) => (Some(u), None, JUDGE_ECHO),
            Value::Table(t) => {
                let mut j = Section::new(&s.key(&key), t, Table::new());
                let url = j.string("url");
                let marker = j
                    .optional("marker", Section::string)
                    .filter(|m| !m.is_empty());
                let echo = j.optional("echo", Section::boolean).unwrap_or(JUDGE_ECHO);
                if !echo && marker.is_none() {
                    j.problem(
                        "marker",
                        "is required when echo = false (otherwise any page would pass)",
                    );
                }
                s.absorb(j);
                (url, marker, echo)
            }
            other => {
                s.problem(
                    &key,
                    &format!(
                        "expected a URL or {{ url = ..., marker = ... }}, found {}",
                        type_name(&other)
                    ),
                );
                continue;
            }
        };
        let Some(u) = url else { continue };
        match Url::parse(&u) {
            Ok(url) if matches!(url.scheme(), "http" | "https") && url.host().is_some() => {
                out.push(JudgeConfig { url, marker, echo })
            }
            Ok(_) => s.problem(&key, &format!("expected an http(s) URL, found {u:?}")),
            Err(e) => s.problem(&key, &format!("invalid URL {u:?}: {e}")),
        }
    }
    Some(out)
}

/// A duration in whole milliseconds, saturating.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use crate::config::Config;

    #[test]
    fn a_proxy_another_process_checked_comes_onto_the_served_cycle() {
        let config = Config::from_toml("", "t.toml").unwrap();
        let check = &config.check;
        // 100 served at 20 a second: the shortest cycle, 10 s.
        let cycle = 10_000;
        let now = 1_000_000;
        let ten_min = now + 600_000;
        // Checked a moment ago: two thirds to four thirds of a cycle later.
        let early = check.served_check_at(100, Some(now - 1_000), ten_min, now, 0.0);
        let late = check.served_check_at(100, Some(now - 1_000), ten_min, now, 1.0);
        assert_eq!(early, Some(now - 1_000 + cycle * 2 / 3));
        assert_eq!(late, Some(now - 1_000 + 2 * (cycle * 2 / 3)));
        // Older than a cycle, or never checked: at once.
        assert_eq!(
            check.served_check_at(100, Some(now - 2 * cycle), ten_min, now, 0.5),
            Some(now)
        );
        assert_eq!(
            check.served_check_at(100, None, ten_min, now, 0.5),
            Some(now)
        );
        // A check due sooner already stays.
        assert_eq!(
            check.served_check_at(100, Some(now - 1_000), now + 1_000, now, 0.5),
            None
        );
        assert_eq!(check.fresh_window(100).as_millis(), 2 * 10_000 + 8_000);
    }

    /// At the defaults (20 re-checks a second), 1,100 served proxies come
    /// round every 55 s: the start-up re-check of all of them is a bulk
    /// check and puts the next ones anywhere in the coming 55 s; a round
    /// of a second's re-checks keeps two thirds to four thirds of a cycle.
    #[test]
    fn proxies_checked_in_bulk_come_back_over_one_cycle() {
        let config = Config::from_toml("", "t.toml").unwrap();
        let check = &config.check;
        assert_eq!(check.serve_cycle(1_100).as_secs(), 55);
        assert!(check.is_bulk(1_100, 1_100));
        assert!(check.is_bulk(1_100, 101));
        assert!(!check.is_bulk(1_100, 100));
        assert!(!check.is_bulk(1_100, 20));
        // A first harvest (nothing served yet) and a few proxies.
        assert!(check.is_bulk(0, 500));
        assert!(!check.is_bulk(0, 3));
        let bulk = check.bulk_policy(1_100);
        assert_eq!(
            (bulk.alive.as_secs(), bulk.alive_jitter.as_secs()),
            (55, 55)
        );
        let steady = check.serve_policy(1_100);
        assert!(steady.alive - steady.alive_jitter > bulk.alive / 2);
        let now = 1_000_000;
        let ten_min = now + 600_000;
        assert_eq!(check.bulk_check_at(1_100, ten_min, now, 0.0), Some(now));
        assert_eq!(
            check.bulk_check_at(1_100, ten_min, now, 1.0),
            Some(now + 55_000)
        );
        assert_eq!(check.bulk_check_at(1_100, now + 10, now, 0.5), None);
    }
}
