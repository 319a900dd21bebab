//! Fetching source bodies with limits: one shared HTTP client (never a
//! system proxy), separate connect and total timeouts, a body-size cap that
//! stops reading, at most five redirects, and retries with backoff for
//! transient failures that honour `Retry-After`. Local files get the same
//! size cap. Redirects are followed here rather than by reqwest, so that a
//! source's own headers (often API keys) never reach another origin and no
//! `Referer` tells it the original URL, and so that a hop off the source's
//! own origin cannot lead to a private address (loopback, the LAN, the
//! cloud metadata service) unless `harvest.allow_private_addresses` says so.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{HeaderName, HeaderValue, LOCATION};
use tokio::io::AsyncReadExt;
use url::Url;

use super::addresses::special_kind;
use crate::config::HarvestConfig;

/// The longest `Retry-After` honoured; a source asking for more is treated
/// as failing this round rather than stalling the harvest.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Redirects followed per attempt.
const MAX_REDIRECTS: usize = 5;

/// A fetched body, decoded lossily as UTF-8 (lists are ASCII; stray bytes
/// must not reject the whole source).
#[derive(Debug)]
pub struct Fetched {
    /// The final HTTP status (`None` for files).
    pub status: Option<u16>,
    /// The body.
    pub body: String,
}

/// Why a fetch failed, with the last HTTP status seen if any. A timeout
/// says after how many attempts it gave up (`timed out after 3 attempts`),
/// so that a long wait on a source is explained.
#[derive(Debug, thiserror::Error)]
pub struct FetchError {
    /// The last HTTP status received.
    pub status: Option<u16>,
    /// What went wrong.
    pub kind: FetchErrorKind,
    /// Attempts made (1 + retries), once the fetch gave up; 0 until then.
    pub attempts: u32,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.kind)?;
        let timeout = matches!(
            self.kind,
            FetchErrorKind::Timeout | FetchErrorKind::ConnectTimeout
        );
        match self.attempts {
            n if !timeout || n == 0 => Ok(()),
            1 => f.write_str(" after 1 attempt"),
            n => write!(f, " after {n} attempts"),
        }
    }
}

/// What went wrong with a fetch; the messages are what users see per source.
#[derive(Debug, thiserror::Error)]
pub enum FetchErrorKind {
    /// A non-success status (after retries, for retryable ones).
    #[error("HTTP {0}")]
    Status(StatusCode),
    /// The body exceeded the limit.
    #[error("body larger than the {0} limit (harvest.max_body)")]
    TooLarge(String),
    /// A gzip body (recognised by its first bytes) exceeded the limit once
    /// decompressed.
    #[error("gzip body larger than the {0} limit (harvest.max_body) once decompressed")]
    GzipTooLarge(String),
    /// A body that starts like gzip but is not.
    #[error("{0}")]
    Gzip(String),
    /// Connecting took too long.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The whole fetch took too long.
    #[error("timed out")]
    Timeout,
    /// Any other network or protocol failure.
    #[error("{0}")]
    Network(String),
    /// A redirect to an address a source may not lead the harvest to;
    /// not retried, as asking again would lead there again.
    #[error("{0}")]
    Refused(String),
    /// A local file could not be read.
    #[error("cannot read {path}: {error}")]
    File {
        /// The file.
        path: String,
        /// What the OS said.
        error: std::io::Error,
    },
    /// The client could not be built.
    #[error("cannot build HTTP client: {0}")]
    Client(String),
}

/// The shared fetcher: cheap to clone.
#[derive(Clone, Debug)]
pub struct Fetcher {
    client: reqwest::Client,
    /// Fetches redirect hops off the source's own origin: its resolver
    /// leaves out private addresses, unless they are allowed (then it is
    /// `client`).
    hops: reqwest::Client,
    allow_private: bool,
    max_body: u64,
    retries: u32,
    retry_backoff: Duration,
}

/// Resolves names to their public addresses only: where a redirect leads
/// a source fetch is chosen by the source, which must not point it at
/// this host or its network. Resolving here, rather than checking a name
/// first and connecting later, leaves no gap for a name to change its
/// answer (DNS rebinding) in between.
struct PublicOnly;

impl reqwest::dns::Resolve for PublicOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let all: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let public: Vec<std::net::SocketAddr> = all
                .iter()
                .filter(|a| special_kind(a.ip()).is_none())
                .copied()
                .collect();
            match (public.is_empty(), all.first()) {
                (true, Some(first)) => Err(format!(
                    "redirect refused: {host} resolves to {} ({}), not a public address \
                     (harvest.allow_private_addresses = true allows it)",
                    first.ip(),
                    special_kind(first.ip()).unwrap_or("private")
                )
                .into()),
                _ => Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs),
            }
        })
    }
}

impl Fetcher {
    /// Builds the client every source fetch uses (and the one for redirect
    /// hops off a source's origin). `allow_private` is
    /// `harvest.allow_private_addresses`: redirects may then lead anywhere.
    pub fn new(cfg: &HarvestConfig, allow_private: bool) -> Result<Fetcher, FetchError> {
        let client = Fetcher::client(cfg, false)?;
        let hops = if allow_private {
            client.clone()
        } else {
            Fetcher::client(cfg, true)?
        };
        Ok(Fetcher {
            client,
            hops,
            allow_private,
            max_body: cfg.max_body,
            retries: cfg.retries,
            retry_backoff: cfg.retry_backoff,
        })
    }

    fn client(cfg: &HarvestConfig, public_only: bool) -> Result<reqwest::Client, FetchError> {
        let tls =
            crate::net::tls::client_config(None, crate::net::tls::ALPN_H2_H1).map_err(|e| {
                FetchError {
                    attempts: 0,
                    status: None,
                    kind: FetchErrorKind::Client(e.to_string()),
                }
            })?;
        let mut builder = reqwest::Client::builder();
        if public_only {
            builder = builder.dns_resolver(PublicOnly);
        }
        builder
            .tls_backend_preconfigured(Arc::unwrap_or_clone(tls))
            .user_agent(cfg.user_agent.clone())
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.timeout)
            // Followed by `attempt`, which decides per hop what is sent.
            .redirect(reqwest::redirect::Policy::none())
            .referer(false)
            // Sources are fetched directly: a system HTTP_PROXY must not
            // silently route them elsewhere.
            .no_proxy()
            .build()
            .map_err(|e| FetchError {
                attempts: 0,
                status: None,
                kind: FetchErrorKind::Client(error_chain(&e)),
            })
    }

    /// Reads a local file, refusing one larger than the body limit.
    pub async fn fetch_file(&self, path: &Path) -> Result<Fetched, FetchError> {
        let file_err = |error| FetchError {
            attempts: 0,
            status: None,
            kind: FetchErrorKind::File {
                path: path.display().to_string(),
                error,
            },
        };
        let file = tokio::fs::File::open(path).await.map_err(file_err)?;
        let mut buf = Vec::new();
        // Read one byte past the limit to tell "exactly at" from "over".
        file.take(self.max_body + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(file_err)?;
        if buf.len() as u64 > self.max_body {
            return Err(FetchError {
                attempts: 0,
                status: None,
                kind: FetchErrorKind::TooLarge(self.limit_text()),
            });
        }
        let buf = self.decompressed(buf, None).await?;
        Ok(Fetched {
            status: None,
            body: into_text(buf),
        })
    }

    /// `buf` itself, or what it decompresses to when it is gzip that no
    /// `Content-Encoding` announced (decompressed off the async runtime).
    async fn decompressed(&self, buf: Vec<u8>, status: Option<u16>) -> Result<Vec<u8>, FetchError> {
        if !super::gzip::is_gzip(&buf) {
            return Ok(buf);
        }
        let max = self.max_body;
        let done = tokio::task::spawn_blocking(move || super::gzip::gunzip(&buf, max)).await;
        let kind = match done {
            Ok(Ok(plain)) => return Ok(plain),
            Ok(Err(super::gzip::GunzipError::TooLarge)) => {
                FetchErrorKind::GzipTooLarge(self.limit_text())
            }
            Ok(Err(e)) => FetchErrorKind::Gzip(e.to_string()),
            Err(e) => FetchErrorKind::Gzip(format!("gzip body could not be decompressed: {e}")),
        };
        Err(FetchError {
            attempts: 0,
            status,
            kind,
        })
    }

    /// GETs `url` with retries for timeouts, connection errors, 429 and 5xx.
    pub async fn fetch_url(
        &self,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<Fetched, FetchError> {
        let mut attempt = 0;
        loop {
            let (result, retry_after) = self.attempt(url, headers).await;
            let err = match result {
                Ok(f) => return Ok(f),
                Err(e) => e,
            };
            let transient = match &err.kind {
                FetchErrorKind::Status(s) => {
                    s.is_server_error() || *s == StatusCode::TOO_MANY_REQUESTS
                }
                FetchErrorKind::ConnectTimeout
                | FetchErrorKind::Timeout
                | FetchErrorKind::Network(_) => true,
                _ => false,
            };
            let gave_up = |mut err: FetchError| {
                err.attempts = attempt + 1;
                Err(err)
            };
            if !transient || attempt >= self.retries {
                return gave_up(err);
            }
            let backoff = self.retry_backoff.saturating_mul(1 << attempt.min(16));
            let wait = match retry_after {
                Some(ra) if ra > MAX_RETRY_AFTER => return gave_up(err),
                Some(ra) => ra,
                None => backoff,
            };
            tracing::debug!(url, error = %err, attempt, wait_ms = wait.as_millis() as u64, "retrying source");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// One request. Returns the `Retry-After` delay alongside a failure.
    async fn attempt(
        &self,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
    ) -> (Result<Fetched, FetchError>, Option<Duration>) {
        let mut resp = match self.follow(url, headers).await {
            Ok(r) => r,
            Err(e) => return (Err(e), None),
        };
        let status = resp.status();
        let code = Some(status.as_u16());
        if !status.is_success() {
            let retry_after = crate::net::retry_after(resp.headers(), std::time::SystemTime::now());
            return (
                Err(FetchError {
                    attempts: 0,
                    status: code,
                    kind: FetchErrorKind::Status(status),
                }),
                retry_after,
            );
        }
        let too_large = || FetchError {
            attempts: 0,
            status: code,
            kind: FetchErrorKind::TooLarge(self.limit_text()),
        };
        // The declared length is only trusted to refuse early; compressed or
        // lying bodies are still counted as they are read.
        if resp.content_length().is_some_and(|n| n > self.max_body) {
            return (Err(too_large()), None);
        }
        let mut buf: Vec<u8> = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if (buf.len() + chunk.len()) as u64 > self.max_body {
                        return (Err(too_large()), None);
                    }
                    buf.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return (Err(request_error(code, &e)), None),
            }
        }
        let buf = match self.decompressed(buf, code).await {
            Ok(buf) => buf,
            Err(e) => return (Err(e), None),
        };
        (
            Ok(Fetched {
                status: code,
                body: into_text(buf),
            }),
            None,
        )
    }

    /// GETs `url`, following up to [`MAX_REDIRECTS`] redirects. The
    /// source's `headers` go to the source's own origin (scheme, host and
    /// port) only, and no hop carries a `Referer`.
    async fn follow(
        &self,
        url: &str,
        headers: &[(HeaderName, HeaderValue)],
    ) -> Result<reqwest::Response, FetchError> {
        let network = |msg: String| FetchError {
            attempts: 0,
            status: None,
            kind: FetchErrorKind::Network(msg),
        };
        let first = Url::parse(url).map_err(|e| network(format!("invalid URL {url:?}: {e}")))?;
        let origin = first.origin();
        let mut current = first;
        let mut hops = 0;
        loop {
            let home = current.origin() == origin;
            let mut req = if home {
                self.client.get(current.clone())
            } else {
                self.hops.get(current.clone())
            };
            if home {
                for (n, v) in headers {
                    req = req.header(n.clone(), v.clone());
                }
            }
            let resp = req.send().await.map_err(|e| request_error(None, &e))?;
            let status = resp.status();
            let location = resp.headers().get(LOCATION);
            let (true, Some(location)) = (status.is_redirection(), location) else {
                return Ok(resp);
            };
            let code = Some(status.as_u16());
            if hops >= MAX_REDIRECTS {
                return Err(FetchError {
                    attempts: 0,
                    status: code,
                    kind: FetchErrorKind::Network(format!(
                        "too many redirects (at most {MAX_REDIRECTS} are followed)"
                    )),
                });
            }
            let next = location
                .to_str()
                .ok()
                .and_then(|l| current.join(l).ok())
                .filter(|u| matches!(u.scheme(), "http" | "https"));
            current = next.ok_or_else(|| FetchError {
                attempts: 0,
                status: code,
                kind: FetchErrorKind::Network(format!(
                    "redirect to an unusable location {:?}",
                    String::from_utf8_lossy(location.as_bytes())
                )),
            })?;
            if !self.allow_private
                && current.origin() != origin
                && let Some(why) = private_host(&current)
            {
                return Err(FetchError {
                    attempts: 0,
                    status: code,
                    kind: FetchErrorKind::Refused(format!(
                        "redirect to {} refused: {why}, not a public address \
                         (harvest.allow_private_addresses = true allows it)",
                        current.host_str().unwrap_or("")
                    )),
                });
            }
            hops += 1;
        }
    }

    fn limit_text(&self) -> String {
        crate::config::size_text(self.max_body)
    }
}

/// Why the host of `url` is not a public address, when it is written as
/// one (an IP literal, `localhost`); names are left to [`PublicOnly`].
pub(crate) fn private_host(url: &Url) -> Option<&'static str> {
    match url.host()? {
        url::Host::Ipv4(ip) => special_kind(ip.into()),
        url::Host::Ipv6(ip) => special_kind(ip.into()),
        url::Host::Domain(d) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            (d == "localhost" || d.ends_with(".localhost")).then_some("loopback")
        }
    }
}

/// Lossy UTF-8 without copying when the bytes are already valid.
fn into_text(buf: Vec<u8>) -> String {
    match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

fn request_error(status: Option<u16>, e: &reqwest::Error) -> FetchError {
    let kind = if e.is_timeout() {
        if e.is_connect() {
            FetchErrorKind::ConnectTimeout
        } else {
            FetchErrorKind::Timeout
        }
    } else {
        FetchErrorKind::Network(error_chain(e))
    };
    FetchError {
        status,
        kind,
        attempts: 0,
    }
}

/// reqwest's top-level message is often just "error sending request"; the
/// cause chain says what actually happened (refused, DNS, TLS, …).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let part = s.to_string();
        if !msg.contains(&part) {
            msg.push_str(": ");
            msg.push_str(&part);
        }
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn redirect_hops_resolve_names_to_public_addresses_only() {
        use reqwest::dns::Resolve;
        // /etc/hosts answers this one; no DNS server is asked.
        let refused = PublicOnly
            .resolve("localhost".parse().unwrap())
            .await
            .err()
            .expect("localhost is refused");
        let message = refused.to_string();
        assert!(message.contains("loopback"), "{message}");
        assert!(
            message.contains("harvest.allow_private_addresses"),
            "{message}"
        );
    }

    #[test]
    fn private_hosts_written_as_such_are_known_before_any_lookup() {
        let why = |u: &str| private_host(&Url::parse(u).unwrap());
        assert_eq!(why("http://127.0.0.1:8080/"), Some("loopback"));
        assert_eq!(why("http://[::1]/"), Some("loopback"));
        assert_eq!(why("http://169.254.169.254/latest"), Some("link-local"));
        // The URL parser reads every spelling of an address.
        assert_eq!(why("http://2130706433/"), Some("loopback"));
        assert_eq!(why("http://0x7f.1/"), Some("loopback"));
        assert_eq!(why("http://LocalHost./"), Some("loopback"));
        assert_eq!(why("http://api.localhost/"), Some("loopback"));
        assert_eq!(why("http://example.com/"), None);
        assert_eq!(why("http://8.8.8.8/"), None);
    }
}
