//! Health checks: probe every due proxy through a judge with short
//! timeouts, decide alive or dead (with a reason from a closed set), measure
//! latency, classify anonymity, test HTTPS tunnelling, and record the
//! results in batches. Judges are watched as closely as proxies: a failure
//! that could be the judge's kills a proxy that passed its last check only
//! once a second, healthy judge confirms it.

mod answer;
mod current;
pub mod geoip;
mod health;
pub mod judge;
pub mod probe;
mod runner;

pub use current::Current;
pub use runner::{
    CheckError, CheckLease, CheckOptions, CommitHook, JudgeHook, RoundProgress, RoundSummary,
    check_round,
};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::config::{Config, JudgeConfig};
use crate::model::{Outcome, Reason};
use crate::proxy::{Proxy, Scheme};
use health::{Health, Probe};
use judge::{Echo, OwnIdentity};
use probe::{Failure, Phase, Prober, Route, Target};

/// A judge ready for a round: its config, resolved address and health.
#[derive(Debug)]
struct ReadyJudge {
    config: JudgeConfig,
    target: Target,
    health: Health,
}

/// Everything a round needs, built once: the prober, the judges that
/// answered directly (and their health), our own identity, and the GeoIP
/// database.
pub struct Checker {
    prober: Prober,
    plain: Vec<ReadyJudge>,
    secure: Vec<ReadyJudge>,
    own: OwnIdentity,
    geoip: Option<Arc<geoip::Geoip>>,
    https: bool,
    next: AtomicUsize,
    on_judge: Option<runner::JudgeHook>,
}

impl fmt::Debug for Checker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checker")
            .field("plain_judges", &self.plain.len())
            .field("https_judges", &self.secure.len())
            .field("own_ips", &self.own.ips)
            .finish()
    }
}

/// What a round knows of a proxy before checking it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Prior {
    /// Its last check found it alive. A failure that may be the judge's
    /// (a wrong answer, a timeout after the request) then needs a second,
    /// healthy judge to confirm it before the proxy is marked dead.
    pub alive: bool,
    /// Its HTTPS support is due for a test (with `check.https` on and an
    /// https judge configured).
    pub https_due: bool,
}

/// What a check concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A verdict to record.
    Checked(Outcome),
    /// The proxy passed its last check and now failed in a way that may be
    /// the judge's, with no second healthy judge to confirm it: nothing is
    /// recorded, the proxy keeps its status and is checked again soon.
    Unconfirmed(Reason),
}

impl Verdict {
    /// The failure, if any.
    pub fn failure(&self) -> Option<Reason> {
        match self {
            Verdict::Checked(o) => o.failure,
            Verdict::Unconfirmed(r) => Some(*r),
        }
    }
}

/// How sure a failed main request is to be the proxy's fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Blame {
    /// Certainly the proxy's: it refused or dropped the connection, timed
    /// out connecting, garbled its handshake, or wants credentials.
    Proxy,
    /// The proxy refused the tunnel to the judge (a CONNECT answered with
    /// an error, a SOCKS rejection) or did not open it within the connect
    /// timeout. The proxy's, unless the judge itself was out of reach (the
    /// tunnel is opened to it): a proxy that passed its last check is asked
    /// of a second judge when one is healthy.
    Refusal,
    /// Possibly the judge's: a wrong status or page, a timeout or reset
    /// after the request was sent, TLS with the judge failing.
    Judge,
}

fn blame(f: Failure) -> Blame {
    match (f.phase, f.reason) {
        (Phase::Connect, _) => Blame::Proxy,
        (Phase::Handshake, Reason::BadStatus | Reason::Timeout) => Blame::Refusal,
        (Phase::Handshake, _) => Blame::Proxy,
        (Phase::Tls, _) => Blame::Judge,
        (Phase::Request, Reason::ProxyAuthRequired) => Blame::Proxy,
        (Phase::Request, _) => Blame::Judge,
    }
}

/// How a failed main request was settled.
enum Settled {
    /// Dead, for this reason.
    Dead(Reason),
    /// Not decided: see [`Verdict::Unconfirmed`].
    Unconfirmed(Reason),
}

type Pass = (Echo, Duration);

/// A fresh random nonce for one check.
fn nonce() -> String {
    format!("{:016x}", rand::random::<u64>())
}

impl Checker {
    /// Calls every judge directly to learn our own address and the headers
    /// a direct request carries. Judges that do not answer genuinely are
    /// left out of the round; if none answers, the round must not run
    /// (every proxy would look dead).
    pub async fn prepare(
        config: &Config,
        opts: &CheckOptions,
        geoip: Option<Arc<geoip::Geoip>>,
    ) -> Result<Checker, CheckError> {
        let tls = crate::net::tls::probe_configs(config.check.extra_ca_file.as_deref())?;
        let prober = Prober::new(
            tls,
            opts.connect_timeout,
            opts.timeout,
            &config.harvest.user_agent,
        );
        let mut own = OwnIdentity::default();
        let mut plain = Vec::new();
        let mut secure = Vec::new();
        let mut failed = Vec::new();
        for jc in &config.check.judges {
            let target = match Target::resolve(&jc.url).await {
                Ok(t) => prober.own_sessions(t),
                Err(e) => {
                    failed.push((jc, e.to_string()));
                    continue;
                }
            };
            let n = nonce();
            let started = std::time::Instant::now();
            let fetched = prober.fetch(Route::Direct, &target, &n).await;
            let took = started.elapsed();
            match fetched {
                Ok(a) if (200..300).contains(&a.status) => {
                    let body = String::from_utf8_lossy(&a.body);
                    if judge::genuine(jc, &body, &n) {
                        if let Some(hook) = &opts.on_judge {
                            hook(&jc.shown(), Ok(took));
                        }
                        own.learn(&Echo::parse(&body));
                        let target = match target.tls {
                            true => with_tls12_if_spoken(&prober, jc, target).await,
                            false => target,
                        };
                        let ready = ReadyJudge {
                            config: jc.clone(),
                            target,
                            health: Health::new(),
                        };
                        if ready.target.tls {
                            secure.push(ready);
                        } else {
                            plain.push(ready);
                        }
                    } else {
                        failed.push((jc, "answer lacks the nonce or marker".into()));
                    }
                }
                Ok(a) => failed.push((jc, format!("HTTP {}", a.status))),
                Err(f) => failed.push((jc, f.to_string())),
            }
        }
        let mut problems = Vec::with_capacity(failed.len());
        for (jc, why) in failed {
            if let Some(hook) = &opts.on_judge {
                hook(&jc.shown(), Err(why.as_str()));
            }
            let p = format!("{}: {why}", jc.shown());
            tracing::warn!(problem = %p, "judge not usable this round");
            problems.push(p);
        }
        if plain.is_empty() && secure.is_empty() {
            return Err(CheckError::NoJudge(problems));
        }
        Ok(Checker {
            prober,
            plain,
            secure,
            own,
            geoip,
            https: opts.https,
            next: AtomicUsize::new(0),
            on_judge: opts.on_judge.clone(),
        })
    }

    /// How many judges the round has.
    fn judge_count(&self) -> usize {
        self.plain.len() + self.secure.len()
    }

    /// Judge `i` of [`Checker::judge_count`].
    fn judge_at(&self, i: usize) -> &ReadyJudge {
        self.plain
            .get(i)
            .unwrap_or_else(|| &self.secure[i - self.plain.len()])
    }

    /// Since when every judge has been out of reach, if they all are.
    fn judges_out_of_reach_since(&self) -> Option<std::time::Instant> {
        let mut since = None;
        for j in self.plain.iter().chain(&self.secure) {
            let s = j.health.out_of_reach_since()?;
            since = Some(since.map_or(s, |t: std::time::Instant| t.max(s)));
        }
        since
    }

    /// Asks judge `i` directly and notes the answer in its health.
    async fn probe(&self, i: usize) -> Probe {
        self.probe_judge(self.judge_at(i)).await
    }

    async fn probe_judge(&self, judge: &ReadyJudge) -> Probe {
        let started = std::time::Instant::now();
        let n = nonce();
        let probe = match self.prober.fetch(Route::Direct, &judge.target, &n).await {
            Ok(a)
                if (200..300).contains(&a.status)
                    && judge::genuine(&judge.config, &String::from_utf8_lossy(&a.body), &n) =>
            {
                Probe::Genuine
            }
            Ok(_) => Probe::Wrong,
            // Bytes that are not HTTP are an answer too, a wrong one.
            Err(f) if f.reason == Reason::ProtocolError => Probe::Wrong,
            Err(_) => Probe::Silent,
        };
        if let Some(hook) = &self.on_judge {
            let url = &judge.config.shown();
            match probe {
                Probe::Genuine => hook(url, Ok(started.elapsed())),
                Probe::Wrong => hook(url, Err("wrong answer")),
                Probe::Silent => hook(url, Err("no answer")),
            }
        }
        if judge.health.probed(probe, started) {
            self.log_standing(judge, &format!("{probe:?} direct answer"));
        }
        probe
    }

    fn log_standing(&self, judge: &ReadyJudge, why: &str) {
        if judge.health.is_healthy() {
            tracing::info!(judge = %judge.config.shown(), "judge out of quarantine");
        } else {
            tracing::warn!(judge = %judge.config.shown(), why, "judge quarantined");
        }
    }

    /// The next judge of a kind, in rotation, skipping quarantined ones
    /// while a healthy one is left.
    fn pick<'a>(&'a self, judges: &'a [ReadyJudge]) -> Option<&'a ReadyJudge> {
        if judges.is_empty() {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..judges.len())
            .map(|k| &judges[(start + k) % judges.len()])
            .find(|j| j.health.is_healthy())
            .or_else(|| judges.get(start % judges.len()))
    }

    /// A healthy judge other than `failed` that `proxy` reaches the same
    /// way (through an HTTP proxy, absolute-form to plain judges and a
    /// CONNECT tunnel to https ones are different ways), to confirm a
    /// failure seen through `failed`.
    fn confirmer<'a>(&'a self, proxy: &Proxy, failed: &ReadyJudge) -> Option<&'a ReadyJudge> {
        let forward = |j: &ReadyJudge| proxy.scheme == Scheme::Http && !j.target.tls;
        let n = self.judge_count();
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        (0..n).map(|k| self.judge_at((start + k) % n)).find(|j| {
            !std::ptr::eq(*j, failed) && j.health.is_healthy() && forward(j) == forward(failed)
        })
    }

    /// One request through `route` to `judge`, judged. For a proxy that
    /// passed its last check (`was_alive`), a reset or refused connection
    /// is tried once more before it counts: a working proxy's hiccup. Any
    /// other proxy would refuse again: the retry would double the cost of
    /// every refusing address in a list for no verdict that differs.
    async fn ask(
        &self,
        route: Route<'_>,
        judge: &ReadyJudge,
        was_alive: bool,
    ) -> Result<Pass, Failure> {
        match self.ask_once(route, judge).await {
            Err(f) if was_alive && f.retryable() => self.ask_once(route, judge).await,
            done => done,
        }
    }

    async fn ask_once(&self, route: Route<'_>, judge: &ReadyJudge) -> Result<Pass, Failure> {
        let n = nonce();
        let answer = self.prober.fetch(route, &judge.target, &n).await?;
        let wrong = |reason| Failure {
            reason,
            phase: Phase::Request,
        };
        if !(200..300).contains(&answer.status) {
            return Err(wrong(Reason::BadStatus));
        }
        let body = String::from_utf8_lossy(&answer.body);
        if !judge::genuine(&judge.config, &body, &n) {
            return Err(wrong(Reason::ContentMismatch));
        }
        Ok((Echo::parse(&body), answer.latency))
    }

    /// Checks one proxy with no knowledge of its past (as `verify=true`
    /// does): a failure is taken as it comes, even one a second judge could
    /// not confirm. For `detect` entries tries http, socks5, socks4.
    pub async fn check(&self, proxy: &Proxy, detect: bool) -> Outcome {
        let prior = Prior {
            alive: false,
            https_due: true,
        };
        match self.check_with(proxy, detect, prior).await {
            Verdict::Checked(o) => o,
            Verdict::Unconfirmed(r) => Outcome::dead(r),
        }
    }

    /// Checks one proxy knowing what its last check found; for `detect`
    /// entries tries http, socks5, socks4.
    pub async fn check_with(&self, proxy: &Proxy, detect: bool, prior: Prior) -> Verdict {
        if !detect {
            return self.check_as(proxy, prior).await;
        }
        let mut first: Option<Verdict> = None;
        for scheme in Scheme::ALL {
            let candidate = Proxy {
                scheme,
                ..proxy.clone()
            };
            match self.check_as(&candidate, prior).await {
                Verdict::Checked(mut out) if out.alive() => {
                    out.detected = Some(scheme);
                    return Verdict::Checked(out);
                }
                failed => {
                    let first = first.get_or_insert(failed);
                    if first.failure().is_some_and(Reason::unreachable) {
                        break;
                    }
                }
            }
        }
        first.unwrap_or(Verdict::Checked(Outcome::dead(Reason::ProtocolError)))
    }

    /// The main request: absolute-form through HTTP proxies to a plain
    /// judge, a tunnel otherwise.
    async fn ask_main(
        &self,
        proxy: &Proxy,
        j: &ReadyJudge,
        was_alive: bool,
    ) -> Result<Pass, Failure> {
        let route = match proxy.scheme {
            Scheme::Http if !j.target.tls => Route::Forward(proxy),
            _ => Route::Tunnel(proxy),
        };
        let asked = self.ask(route, j, was_alive).await;
        if asked.is_ok() {
            j.health.passed();
        }
        asked
    }

    /// Checks `proxy` as its scheme says.
    async fn check_as(&self, proxy: &Proxy, prior: Prior) -> Verdict {
        // The main request goes to a plain judge when one exists (it shows
        // the headers the proxy adds), else through a tunnel over TLS.
        let via_tls_only = self.plain.is_empty();
        let kind = if via_tls_only {
            &self.secure
        } else {
            &self.plain
        };
        let Some(first) = self.pick(kind) else {
            return Verdict::Checked(Outcome::dead(Reason::ProtocolError));
        };
        let main = match self.ask_main(proxy, first, prior.alive).await {
            Ok(pass) => Ok(pass),
            Err(f) => self.settle(proxy, first, f, prior.alive).await,
        };
        match main {
            Ok((echo, latency)) => {
                let https = if via_tls_only {
                    Some(true)
                } else if self.https && prior.https_due {
                    // HTTPS is tested once the proxy works, when a TLS
                    // judge exists.
                    match self.pick(&self.secure) {
                        Some(j) => self.tunnels_tls(proxy, j).await,
                        None => None,
                    }
                } else {
                    None
                };
                Verdict::Checked(self.alive(proxy, &echo, latency, https))
            }
            // A proxy that fails plain requests is dead even if it would
            // tunnel: it is served for any URL, and a client asking for
            // http:// through it would get the failure (or an injected page).
            Err(Settled::Dead(reason)) => Verdict::Checked(Outcome::dead(reason)),
            Err(Settled::Unconfirmed(reason)) => Verdict::Unconfirmed(reason),
        }
    }

    /// Decides a failed main request through `judge`. Certain failures
    /// stand. One that may be the judge's is put to a second, healthy judge
    /// reached the same way: for a proxy that passed its last check always,
    /// for others unless it is a timeout (a second timeout would double the
    /// cost of every silent proxy in a list) from a healthy judge. A pass
    /// there clears the proxy and counts against `judge`; a failure there
    /// confirms. With no second judge, a proxy that passed its last check
    /// keeps its status (unconfirmed) unless `judge` is healthy, the failure
    /// was silence (a timeout or reset) and `judge` still answers a direct
    /// request: silence from a proxy while the judge talks is the proxy's.
    /// A wrong page or status could be a judge that lies only some of the
    /// time, so it stays unconfirmed.
    async fn settle(
        &self,
        proxy: &Proxy,
        judge: &ReadyJudge,
        f: Failure,
        was_alive: bool,
    ) -> Result<Pass, Settled> {
        let blame = blame(f);
        let confirm = match blame {
            Blame::Proxy => false,
            Blame::Refusal => was_alive,
            Blame::Judge => was_alive || f.reason != Reason::Timeout || !judge.health.is_healthy(),
        };
        if !confirm {
            return Err(Settled::Dead(f.reason));
        }
        if let Some(other) = self.confirmer(proxy, judge) {
            return match self.ask_main(proxy, other, was_alive).await {
                Ok(pass) => {
                    if blame == Blame::Judge && judge.health.wrong() {
                        self.log_standing(judge, "answers contradicted by another judge");
                    }
                    Ok(pass)
                }
                Err(g) => Err(Settled::Dead(g.reason)),
            };
        }
        let healthy = judge.health.is_healthy();
        match blame {
            Blame::Proxy | Blame::Refusal => Err(Settled::Dead(f.reason)),
            Blame::Judge if !was_alive && healthy => Err(Settled::Dead(f.reason)),
            Blame::Judge
                if healthy
                    && matches!(f.reason, Reason::Timeout | Reason::Reset)
                    && self.probe_judge(judge).await == Probe::Genuine =>
            {
                Err(Settled::Dead(f.reason))
            }
            Blame::Judge => {
                let wrong_answer = matches!(
                    f.reason,
                    Reason::BadStatus | Reason::ContentMismatch | Reason::ProtocolError
                );
                if was_alive && wrong_answer && judge.health.wrong() {
                    self.log_standing(judge, "wrong answers for proxies that passed before");
                }
                Err(Settled::Unconfirmed(f.reason))
            }
        }
    }

    /// The next judge after `judge` among those of its kind, if there is
    /// another.
    fn next_of_kind(&self, judge: &ReadyJudge) -> Option<&ReadyJudge> {
        let kind = if judge.target.tls {
            &self.secure
        } else {
            &self.plain
        };
        let i = kind.iter().position(|j| std::ptr::eq(j, judge))?;
        (kind.len() > 1).then(|| &kind[(i + 1) % kind.len()])
    }

    /// The HTTPS test: a request to a TLS judge through a CONNECT tunnel
    /// (or the SOCKS one). Only a refused tunnel (the CONNECT or SOCKS
    /// request answered with a refusal or with something that is not a
    /// tunnel) or a failed TLS handshake makes the flag false. A wrong
    /// status or page inside the tunnel comes from the judge itself (TLS
    /// proves who answered), so the next TLS judge is asked; resets (after
    /// one more try) and timeouts prove nothing either way. Whatever proves
    /// nothing leaves the flag unknown (`None`): the stored one stays.
    async fn tunnels_tls(&self, proxy: &Proxy, judge: &ReadyJudge) -> Option<bool> {
        for j in std::iter::once(judge).chain(self.next_of_kind(judge)) {
            let mut tried = 0;
            let failure = loop {
                tried += 1;
                let n = nonce();
                match self.prober.fetch(Route::Tunnel(proxy), &j.target, &n).await {
                    Ok(answer) => {
                        let body = String::from_utf8_lossy(&answer.body);
                        if (200..300).contains(&answer.status)
                            && judge::genuine(&j.config, &body, &n)
                        {
                            return Some(true);
                        }
                        break None;
                    }
                    Err(f) if f.retryable() && tried == 1 => continue,
                    Err(f) => break Some(f),
                }
            };
            match failure {
                // The judge's own answer was wrong: ask the next one.
                None => continue,
                Some(f) if refuses_tunnel(f) => return Some(false),
                Some(_) => return None,
            }
        }
        None
    }

    fn alive(&self, proxy: &Proxy, echo: &Echo, latency: Duration, https: Option<bool>) -> Outcome {
        let exit_ip = echo.remote;
        let country = self.geoip.as_ref().and_then(|g| {
            exit_ip
                .and_then(|ip| g.country(ip))
                .or_else(|| g.country(proxy.host))
        });
        Outcome {
            failure: None,
            latency: Some(latency),
            anonymity: Some(self.own.classify(echo)),
            https,
            exit_ip,
            country,
            detected: None,
        }
    }
}

/// `target`, to be probed with TLS 1.2 when the judge answers a direct
/// request so (see [`crate::net::tls::ProbeTls`]); as it was otherwise.
async fn with_tls12_if_spoken(prober: &Prober, judge: &JudgeConfig, target: Target) -> Target {
    let mut tls12 = target.clone();
    tls12.tls12 = true;
    let n = nonce();
    match prober.fetch(Route::Direct, &tls12, &n).await {
        Ok(a)
            if (200..300).contains(&a.status)
                && judge::genuine(judge, &String::from_utf8_lossy(&a.body), &n) =>
        {
            tls12
        }
        _ => target,
    }
}

/// True when a failure of the HTTPS test shows the proxy does not tunnel
/// TLS: it refused or garbled the CONNECT (or SOCKS request), or the TLS
/// handshake with the judge failed through the tunnel.
fn refuses_tunnel(f: Failure) -> bool {
    match f.phase {
        Phase::Handshake => matches!(
            f.reason,
            Reason::BadStatus | Reason::ProxyAuthRequired | Reason::ProtocolError
        ),
        Phase::Tls => f.reason == Reason::TlsError,
        Phase::Connect | Phase::Request => false,
    }
}

/// Raises the open-file limit as far as allowed and returns the largest
/// concurrency it supports (each check holds one socket; some descriptors
/// stay free for the database, listeners and logs).
pub fn clamp_concurrency(wanted: usize) -> usize {
    const RESERVED: u64 = 256;
    let limit = rlimit::increase_nofile_limit(u64::MAX).unwrap_or(1024);
    let allowed = limit.saturating_sub(RESERVED).max(1) as usize;
    if wanted > allowed {
        tracing::warn!(
            wanted,
            allowed,
            open_file_limit = limit,
            "check concurrency clamped to the open-file limit (raise LimitNOFILE / ulimit -n)"
        );
        allowed
    } else {
        wanted
    }
}

/// Opens the configured GeoIP database, if any.
pub fn open_geoip(config: &Config) -> Result<Option<Arc<geoip::Geoip>>, CheckError> {
    match &config.geoip.database {
        None => Ok(None),
        Some(path) => geoip::Geoip::open(path)
            .map(|g| Some(Arc::new(g)))
            .map_err(CheckError::from),
    }
}
