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
/// every TLS 1.3 server has), and sessions resumed, each configuration
/// from a `JudgeTickets` store of its own, so a tunnel to a judge seldom
/// verifies its certificate again.
#[derive(Clone, Debug)]
pub struct ProbeTls {
    /// TLS 1.3 or 1.2, as the judge prefers.
    pub any: Arc<rustls::ClientConfig>,
    /// TLS 1.2 only, for judges that speak it: a resumed TLS 1.2 session
    /// needs no key exchange at all, where every TLS 1.3 handshake, resumed
    /// or not, does one. A probe carries nothing secret but its nonce.
    pub tls12: Arc<rustls::ClientConfig>,
}

impl ProbeTls {
    /// These configurations with session stores of their own, for one
    /// judge. Stores are keyed by server name alone, and two judges on one
    /// host (different ports, different certificates) would otherwise take
    /// each other's sessions, which the other refuses: every probe then
    /// pays a full handshake, its certificate verified again.
    pub fn own_sessions(&self) -> ProbeTls {
        let with_store = |config: &Arc<rustls::ClientConfig>| {
            let mut config = rustls::ClientConfig::clone(config);
            config.resumption = sessions();
            Arc::new(config)
        };
        ProbeTls {
            any: with_store(&self.any),
            tls12: with_store(&self.tls12),
        }
    }
}

/// A session store of its own for one configuration. rustls resumes a
/// session only with the configuration (its certificate verifier) that
/// made it, and takes a TLS 1.3 ticket before looking for a TLS 1.2
/// session: in a store both configurations shared, every ticket of a TLS
/// 1.3 handshake would cost the next TLS 1.2 probe a full handshake.
fn sessions() -> rustls::client::Resumption {
    rustls::client::Resumption::store(Arc::new(JudgeTickets::default()))
}

/// Builds the [`ProbeTls`] configurations.
pub fn probe_configs(extra_ca: Option<&Path>) -> Result<ProbeTls, TlsSetupError> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|s| s.suite() != rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
    let roots = roots(extra_ca)?;
    let mut any = build(provider.clone(), roots.clone(), ALPN_H1)?;
    any.resumption = sessions();
    let mut tls12 = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .map_err(TlsSetupError::Protocol)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    tls12.alpn_protocols = any.alpn_protocols.clone();
    tls12.resumption = sessions();
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

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::{ClientConnection, HandshakeKind, ServerConfig, ServerConnection};

    /// A TLS server for 127.0.0.1 (its own CA, written into `dir`).
    fn server(dir: &Path, name: &str) -> (Arc<ServerConfig>, PathBuf) {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let ca_file = dir.join(name);
        std::fs::write(&ca_file, ca.pem()).unwrap();
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![leaf.der().clone()], key)
            .unwrap();
        (Arc::new(config), ca_file)
    }

    /// One handshake in memory; how the client ended it.
    fn handshake(client: &Arc<rustls::ClientConfig>, server: &Arc<ServerConfig>) -> HandshakeKind {
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut c = ClientConnection::new(client.clone(), name).unwrap();
        let mut s = ServerConnection::new(server.clone()).unwrap();
        let mut wire = Vec::new();
        while c.is_handshaking() || s.is_handshaking() || c.wants_write() || s.wants_write() {
            wire.clear();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            s.read_tls(&mut wire.as_slice()).unwrap();
            s.process_new_packets().unwrap();
            wire.clear();
            while s.wants_write() {
                s.write_tls(&mut wire).unwrap();
            }
            c.read_tls(&mut wire.as_slice()).unwrap();
            c.process_new_packets().unwrap();
        }
        c.handshake_kind().unwrap()
    }

    #[test]
    /// Two judges on one host name, each with its own certificate: with
    /// one store each takes the other's ticket and pays a full handshake;
    /// with a store each, both resume.
    fn judges_on_one_host_resume_their_own_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let (a, ca_a) = server(dir.path(), "a.pem");
        let (b, ca_b) = server(dir.path(), "b.pem");
        let both = dir.path().join("both.pem");
        let cas =
            std::fs::read_to_string(&ca_a).unwrap() + &std::fs::read_to_string(&ca_b).unwrap();
        std::fs::write(&both, cas).unwrap();
        let shared = probe_configs(Some(&both)).unwrap();
        // One store for both: each takes the other's ticket, refused.
        let kinds = [&a, &b, &a, &b].map(|server| handshake(&shared.any, server));
        assert_eq!(kinds, [HandshakeKind::Full; 4]);
        let (own_a, own_b) = (shared.own_sessions(), shared.own_sessions());
        {
            let (ca, cb) = (&own_a.any, &own_b.any);
            let kinds = [
                handshake(ca, &a),
                handshake(cb, &b),
                handshake(ca, &a),
                handshake(cb, &b),
            ];
            assert_eq!(
                kinds,
                [
                    HandshakeKind::Full,
                    HandshakeKind::Full,
                    HandshakeKind::Resumed,
                    HandshakeKind::Resumed
                ]
            );
        }
    }

    #[test]
    /// A judge that speaks both is first asked in TLS 1.3 (which leaves
    /// tickets), then probed in TLS 1.2: the probes resume from the second
    /// on, both with the configurations built and with a judge's own.
    fn tls12_probes_resume_after_a_tls13_handshake_with_the_judge() {
        let dir = tempfile::tempdir().unwrap();
        let (server, ca) = server(dir.path(), "ca.pem");
        let built = probe_configs(Some(&ca)).unwrap();
        for tls in [built.own_sessions(), built] {
            assert_eq!(handshake(&tls.any, &server), HandshakeKind::Full);
            let kinds = [0, 1, 2].map(|_| handshake(&tls.tls12, &server));
            let resumed = HandshakeKind::Resumed;
            assert_eq!(kinds, [HandshakeKind::Full, resumed, resumed]);
        }
    }
}
