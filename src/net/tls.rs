//! rustls client configurations, built once and shared: one for fetching
//! sources (HTTP/2 and HTTP/1.1) and one for every check's TLS to a judge
//! (HTTP/1.1 only, with any extra roots for private judges, and sessions
//! resumed); and TLS over a dialed stream, certificates always verified.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustls::NamedGroup;
use rustls::client::{ClientSessionStore, Tls12ClientSessionValue, Tls13ClientSessionValue};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::model::Reason;

/// Why a TLS client configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    /// The extra CA file could not be opened or read.
    #[error("cannot read check.extra_ca_file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: rustls_pki_types::pem::Error,
    },
    /// A PEM section of the extra CA file is malformed.
    #[error("invalid PEM in check.extra_ca_file {}: {source}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: rustls_pki_types::pem::Error,
    },
    /// The extra CA file holds no certificate.
    #[error("check.extra_ca_file {} holds no certificates", path.display())]
    NoCertificates {
        /// The file.
        path: PathBuf,
    },
    /// A certificate of the extra CA file is not a usable root.
    #[error("bad certificate in check.extra_ca_file {}: {source}", path.display())]
    BadCertificate {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
    /// rustls refused the protocol versions.
    #[error("TLS setup failed: {0}")]
    Protocol(rustls::Error),
}

/// Builds a client configuration: ring as the crypto provider, Mozilla's
/// roots from `webpki-roots` (the same on every machine, systemd sandbox
/// included) plus the PEM certificates in `extra_ca`, offering `alpn`.
pub fn client_config(
    extra_ca: Option<&Path>,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let provider = rustls::crypto::ring::default_provider();
    build(provider, roots(extra_ca)?, alpn).map(Arc::new)
}

/// Mozilla's roots plus the PEM certificates in `extra_ca`.
fn roots(extra_ca: Option<&Path>) -> Result<rustls::RootCertStore, TlsSetupError> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(path) = extra_ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|source| TlsSetupError::Read {
                path: path.to_path_buf(),
                source,
            })?
            .collect::<Result<_, _>>()
            .map_err(|source| TlsSetupError::Pem {
                path: path.to_path_buf(),
                source,
            })?;
        if certs.is_empty() {
            return Err(TlsSetupError::NoCertificates {
                path: path.to_path_buf(),
            });
        }
        for cert in certs {
            roots
                .add(cert)
                .map_err(|source| TlsSetupError::BadCertificate {
                    path: path.to_path_buf(),
                    source,
                })?;
        }
    }
    Ok(roots)
}

/// A configuration on `provider` trusting `roots`, offering `alpn`.
fn build(
    provider: rustls::crypto::CryptoProvider,
    roots: rustls::RootCertStore,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, TlsSetupError> {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Protocol)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// TLS 1.3 tickets kept per judge. rustls's own store keeps 8, far fewer
/// than the tunnels a round opens to one judge at once: every tunnel that
/// finds none pays a full handshake, its certificate chain verified again.
const TICKETS_PER_JUDGE: usize = 1024;
/// Servers remembered: the judges of a round, with room to spare.
const MAX_SERVERS: usize = 64;

/// The session store of [`probe_config`]: rustls's in-memory store with
/// room for [`TICKETS_PER_JUDGE`] tickets per server.
#[derive(Debug, Default)]
struct JudgeTickets {
    servers: Mutex<HashMap<ServerName<'static>, Sessions>>,
}

/// What is kept of one server.
#[derive(Debug, Default)]
struct Sessions {
    kx_hint: Option<NamedGroup>,
    tls12: Option<Tls12ClientSessionValue>,
    /// Oldest first; the newest is taken, the oldest dropped.
    tls13: VecDeque<Tls13ClientSessionValue>,
}

impl JudgeTickets {
    /// Runs `f` on `name`'s sessions, made room for when new.
    fn edit(&self, name: ServerName<'static>, f: impl FnOnce(&mut Sessions)) {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        if servers.len() >= MAX_SERVERS && !servers.contains_key(&name) {
            servers.clear();
        }
        f(servers.entry(name).or_default());
    }

    /// `f` of `name`'s sessions, if any are kept.
    fn with<T>(
        &self,
        name: &ServerName<'_>,
        f: impl FnOnce(&mut Sessions) -> Option<T>,
    ) -> Option<T> {
        let mut servers = self.servers.lock().unwrap_or_else(|e| e.into_inner());
        // The map is keyed by owned names; a borrowed one is copied to look.
        servers.get_mut(&name.to_owned()).and_then(f)
    }
}

impl ClientSessionStore for JudgeTickets {
    fn set_kx_hint(&self, name: ServerName<'static>, group: NamedGroup) {
        self.edit(name, |s| s.kx_hint = Some(group));
    }

    fn kx_hint(&self, name: &ServerName<'_>) -> Option<NamedGroup> {
        self.with(name, |s| s.kx_hint)
    }

    fn set_tls12_session(&self, name: ServerName<'static>, value: Tls12ClientSessionValue) {
        self.edit(name, |s| s.tls12 = Some(value));
    }

    fn tls12_session(&self, name: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        self.with(name, |s| s.tls12.clone())
    }

    fn remove_tls12_session(&self, name: &ServerName<'static>) {
        self.with(name, |s| s.tls12.take());
    }

    fn insert_tls13_ticket(&self, name: ServerName<'static>, value: Tls13ClientSessionValue) {
        self.edit(name, |s| {
            if s.tls13.len() == TICKETS_PER_JUDGE {
                s.tls13.pop_front();
            }
            s.tls13.push_back(value);
        });
    }

    fn take_tls13_ticket(&self, name: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.with(name, |s| s.tls13.pop_back())
    }
}

/// The configurations of every check's TLS to a judge: [`client_config`]
/// with HTTP/1.1 only, AES-128 with SHA-256 preferred (the cheapest suite
/// every TLS 1.3 server has), and sessions resumed from one
/// [`JudgeTickets`] store, so a tunnel to a judge seldom verifies its
/// certificate again.
#[derive(Clone, Debug)]
pub struct ProbeTls {
    /// TLS 1.3 or 1.2, as the judge prefers.
    pub any: Arc<rustls::ClientConfig>,
    /// TLS 1.2 only, for judges that speak it: a resumed TLS 1.2 session
    /// needs no key exchange at all, where every TLS 1.3 handshake, resumed
    /// or not, does one. A probe carries nothing secret but its nonce.
    pub tls12: Arc<rustls::ClientConfig>,
}

/// Builds the [`ProbeTls`] configurations.
pub fn probe_configs(extra_ca: Option<&Path>) -> Result<ProbeTls, TlsSetupError> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let roots = roots(extra_ca)?;
    let tickets = Arc::new(JudgeTickets::default());
    let resumption = || rustls::client::Resumption::store(tickets.clone());
    let mut any = build(provider.clone(), roots.clone(), ALPN_H1)?;
    any.resumption = resumption();
    let mut tls12 = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .map_err(TlsSetupError::Protocol)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls12.alpn_protocols = any.alpn_protocols.clone();
    tls12.resumption = resumption();
    Ok(ProbeTls {
        any: Arc::new(any),
        tls12: Arc::new(tls12),
    })
}

/// ALPN for source fetching.
pub const ALPN_H2_H1: &[&[u8]] = &[b"h2", b"http/1.1"];

/// ALPN for probes, which speak HTTP/1.1 only.
pub const ALPN_H1: &[&[u8]] = &[b"http/1.1"];

/// Runs the TLS handshake with `server_name` (a domain name or an IP
/// literal, verified against the certificate) over `stream`, typically a
/// tunnel from [`super::dial()`]. Resets and timeouts keep their own reason;
/// any other failure, a bad certificate included, is [`Reason::TlsError`].
pub async fn connect<S>(
    config: &Arc<rustls::ClientConfig>,
    server_name: &str,
    stream: S,
) -> Result<TlsStream<S>, Reason>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let name = ServerName::try_from(server_name.to_owned()).map_err(|_| Reason::TlsError)?;
    TlsConnector::from(Arc::clone(config))
        .connect(name, stream)
        .await
        .map_err(|e| super::io_reason(&e).unwrap_or(Reason::TlsError))
}
