//! Health checks: probe every due proxy through a judge with short
//! timeouts, decide alive or dead (with a reason from a closed set), measure
//! latency, classify anonymity, test HTTPS tunnelling, and record the
//! results in batches.

pub mod geoip;
pub mod judge;
pub mod probe;
mod runner;

pub use runner::{CheckError, CheckOptions, CommitHook, RoundProgress, RoundSummary, check_round};

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::config::{Config, JudgeConfig};
use crate::model::{Outcome, Reason};
use crate::proxy::{Proxy, Scheme};
use judge::{Echo, OwnIdentity};
use probe::{Failure, Phase, Prober, Route, Target};

/// A judge ready for a round: its config, resolved address and what it
/// saw of our own direct request.
#[derive(Debug)]
struct ReadyJudge {
    config: JudgeConfig,
    target: Target,
}

/// Everything a round needs, built once: the prober, the judges that
/// answered directly, our own identity, and the GeoIP database.
pub struct Checker {
    prober: Prober,
    plain: Vec<ReadyJudge>,
    secure: Vec<ReadyJudge>,
    own: OwnIdentity,
    geoip: Option<Arc<geoip::Geoip>>,
    https: bool,
    next: AtomicUsize,
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
        let tls = crate::net::tls::client_config(
            config.check.extra_ca_file.as_deref(),
            crate::net::tls::ALPN_H1,
        )?;
        let prober = Prober::new(
            tls,
            opts.connect_timeout,
            opts.timeout,
            &config.harvest.user_agent,
        );
        let mut own = OwnIdentity::default();
        let mut plain = Vec::new();
        let mut secure = Vec::new();
        let mut problems = Vec::new();
        for jc in &config.check.judges {
            let target = match Target::resolve(&jc.url).await {
                Ok(t) => t,
                Err(e) => {
                    problems.push(format!("{}: {e}", jc.url));
                    continue;
                }
            };
            let n = nonce();
            match prober.fetch(Route::Direct, &target, &n).await {
                Ok(a) if (200..300).contains(&a.status) => {
                    let body = String::from_utf8_lossy(&a.body);
                    if judge::genuine(jc, &body, &n) {
                        own.learn(&Echo::parse(&body));
                        let ready = ReadyJudge {
                            config: jc.clone(),
                            target,
                        };
                        if ready.target.tls {
                            secure.push(ready);
                        } else {
                            plain.push(ready);
                        }
                    } else {
                        problems.push(format!("{}: answer lacks the nonce or marker", jc.url));
                    }
                }
                Ok(a) => problems.push(format!("{}: HTTP {}", jc.url, a.status)),
                Err(f) => problems.push(format!("{}: {f}", jc.url)),
            }
        }
        for p in &problems {
            tracing::warn!(problem = %p, "judge not usable this round");
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
        })
    }

    /// True when at least one of the round's judges still answers a direct
    /// request genuinely.
    pub async fn judge_reachable(&self) -> bool {
        for judge in self.plain.iter().chain(&self.secure) {
            let n = nonce();
            if let Ok(a) = self.prober.fetch(Route::Direct, &judge.target, &n).await
                && (200..300).contains(&a.status)
                && judge::genuine(&judge.config, &String::from_utf8_lossy(&a.body), &n)
            {
                return true;
            }
        }
        false
    }

    /// The next judge of a kind, in rotation.
    fn pick<'a>(&'a self, judges: &'a [ReadyJudge]) -> Option<&'a ReadyJudge> {
        if judges.is_empty() {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        judges.get(i % judges.len())
    }

    /// One request through `route` to `judge`, judged; a reset or refused
    /// connection is tried once more before it counts.
    async fn ask(&self, route: Route<'_>, judge: &ReadyJudge) -> Result<(Echo, Duration), Failure> {
        match self.ask_once(route, judge).await {
            Err(f) if f.retryable() => self.ask_once(route, judge).await,
            done => done,
        }
    }

    async fn ask_once(
        &self,
        route: Route<'_>,
        judge: &ReadyJudge,
    ) -> Result<(Echo, Duration), Failure> {
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

    /// Checks one proxy; for `detect` entries tries http, socks5, socks4.
    pub async fn check(&self, proxy: &Proxy, detect: bool) -> Outcome {
        if !detect {
            return self.check_as(proxy).await;
        }
        let mut first_failure = None;
        for scheme in Scheme::ALL {
            let candidate = Proxy {
                scheme,
                ..proxy.clone()
            };
            let mut out = self.check_as(&candidate).await;
            match out.failure {
                None => {
                    out.detected = Some(scheme);
                    return out;
                }
                Some(r) => {
                    let first = *first_failure.get_or_insert(r);
                    if first.unreachable() {
                        break;
                    }
                }
            }
        }
        Outcome::dead(first_failure.unwrap_or(Reason::ProtocolError))
    }

    /// The main request: absolute-form through HTTP proxies to a plain
    /// judge, a tunnel otherwise.
    async fn ask_main(&self, proxy: &Proxy, j: &ReadyJudge) -> Result<(Echo, Duration), Failure> {
        match proxy.scheme {
            Scheme::Http if !j.target.tls => self.ask(Route::Forward(proxy), j).await,
            _ => self.ask(Route::Tunnel(proxy), j).await,
        }
    }

    /// Checks `proxy` as its scheme says.
    async fn check_as(&self, proxy: &Proxy) -> Outcome {
        let plain_judge = self.pick(&self.plain);
        let secure_judge = self.pick(&self.secure);
        // The main request: plain HTTP when a plain judge exists (it shows
        // the headers the proxy adds), else through a tunnel over TLS.
        let Some(first) = plain_judge.or(secure_judge) else {
            return Outcome::dead(Reason::ProtocolError);
        };
        let mut main = self.ask_main(proxy, first).await;
        // A busy public judge answers 429 or 5xx to everyone: before calling
        // that the proxy's fault, ask the next judge of the same kind.
        if matches!(main, Err(f) if f.reason == Reason::BadStatus && f.phase == Phase::Request)
            && let Some(next) = self.next_of_kind(first)
        {
            main = self.ask_main(proxy, next).await;
        }
        let via_tls_only = plain_judge.is_none();
        // HTTPS is tested once the proxy works, when a TLS judge exists.
        let https_test = || self.https && !via_tls_only && secure_judge.is_some();
        match main {
            Ok((echo, latency)) => {
                let https = if via_tls_only {
                    Some(true)
                } else if https_test() {
                    self.tunnels_tls(proxy, secure_judge.expect("checked above"))
                        .await
                } else {
                    None
                };
                self.alive(proxy, &echo, latency, https)
            }
            // A proxy that fails plain requests is dead even if it would
            // tunnel: it is served for any URL, and a client asking for
            // http:// through it would get the failure (or an injected page).
            Err(f) => Outcome::dead(f.reason),
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
