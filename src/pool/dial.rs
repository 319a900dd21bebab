//! Dialing through a leased proxy, and the one rule that turns a failed
//! dial into what the attempt showed: whose fault it is, told by how far
//! the dial got (see [`DialStage`]).

use super::*;
use crate::net::{self, DialError, DialOptions, DialStage, Dialed, Target};

impl Lease {
    /// A stream to `target` through the leased proxy (see [`net::dial`]).
    pub(crate) async fn dial(
        &self,
        target: &Target,
        opts: &DialOptions,
    ) -> Result<Dialed, DialError> {
        net::dial(Some(&self.entry.proxy), target, opts).await
    }
}

/// What a failed dial shows, for every use of the pool (a fetch, a
/// gateway request, a tunnel set-up): `proxied` is false for a fetch sent
/// directly.
pub(crate) fn dial_failed<A>(e: DialError, proxied: bool) -> Tried<A> {
    match (e.stage, e.reason) {
        // Direct: the target itself cannot be reached.
        (DialStage::Connect, r) if !proxied && r.unreachable() => {
            Tried::ended(UseVerdict::Unreached)
        }
        // Before the target was named: the proxy's own failure.
        (DialStage::Connect, r) => Tried::ended(UseVerdict::failed(r)),
        // The proxy answered its handshake but would not or could not reach
        // the target: the target's fault until others agree.
        (DialStage::Handshake, Reason::BadStatus) => Tried::ended(UseVerdict::Unreached),
        // It wants credentials it was not given: its own.
        (DialStage::Handshake, r @ Reason::ProxyAuthRequired) => {
            Tried::ended(UseVerdict::failed(r))
        }
        // Once the target was named (a proxy that hangs or resets on it):
        // the proxy's, or the target's when others fail alike.
        (DialStage::Handshake, r) => Tried::failed_after_sending(r),
        // A TLS handshake the site is slow to answer: the site's when
        // others time out alike.
        (DialStage::Tls, r @ Reason::Timeout) => Tried::failed_after_sending(r),
        // A certificate that does not verify: a proxy that intercepts.
        (DialStage::Tls, r) => Tried::ended(UseVerdict::failed(r)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The verdict, and whether it waits for others to agree.
    fn shown(e: DialError, proxied: bool) -> (UseVerdict, bool) {
        let t: Tried<()> = dial_failed(e, proxied);
        (t.verdict, t.after_sending)
    }

    #[test]
    fn a_dial_failure_is_charged_by_how_far_the_dial_got() {
        use Reason::*;
        let failed = UseVerdict::failed;
        for (e, proxied, want) in [
            (DialError::connect(Refused), true, (failed(Refused), false)),
            (DialError::connect(Reset), true, (failed(Reset), false)),
            (
                DialError::connect(ConnectTimeout),
                true,
                (failed(ConnectTimeout), false),
            ),
            (
                DialError::connect(Refused),
                false,
                (UseVerdict::Unreached, false),
            ),
            (DialError::connect(Reset), false, (failed(Reset), false)),
            (
                DialError::handshake(BadStatus),
                true,
                (UseVerdict::Unreached, false),
            ),
            (
                DialError::handshake(ProxyAuthRequired),
                true,
                (failed(ProxyAuthRequired), false),
            ),
            (DialError::handshake(Timeout), true, (failed(Timeout), true)),
            (DialError::handshake(Reset), true, (failed(Reset), true)),
            (
                DialError::handshake(ProtocolError),
                true,
                (failed(ProtocolError), true),
            ),
            (DialError::tls(Timeout), true, (failed(Timeout), true)),
            (DialError::tls(TlsError), true, (failed(TlsError), false)),
        ] {
            assert_eq!(shown(e, proxied), want, "{e} (proxied: {proxied})");
        }
    }
}
