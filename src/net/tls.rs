//! rustls client configurations, built once and shared: one for fetching
//! sources (HTTP/2 and HTTP/1.1) and one for every check's TLS to a judge
//! (HTTP/1.1 only, with any extra roots for private judges); and TLS over a
//! dialed stream, certificates always verified.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsSetupError::Protocol)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
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
