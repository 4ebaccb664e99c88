//! Node-wide counters of the IKE messages an [`Endpoint`](crate::Endpoint) dropped or refused,
//! by reason (docs/architecture.md, "Bad input and faults": every bad packet is dropped *and counted*). Each received datagram
//! that is not processed as a valid message is counted under exactly one reason. The reasons
//! follow RFC 7296: §2.1 (retransmissions answered from the cache), §2.2 (message IDs and the
//! window), §2.5 (version and syntax), §2.6 (cookies), §2.7 and §1.2 (IKE_SA_INIT refusals),
//! §2.15 (authentication) and §2.21 (error handling: ICV failures are dropped silently).

macro_rules! ike_drops {
    ($($(#[$doc:meta])* $name:ident = $text:literal,)*) => {
        /// Why the endpoint dropped or refused an IKE datagram. The names
        /// ([`IkeDrop::name`]) are stable: they are the keys of `ike_drops` in
        /// `protego status --json`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(usize)]
        pub enum IkeDrop {
            $($(#[$doc])* $name,)*
        }

        impl IkeDrop {
            /// Every reason, in index order.
            pub const ALL: &'static [IkeDrop] = &[$(IkeDrop::$name,)*];

            /// The stable name shown in status documents.
            pub fn name(self) -> &'static str {
                match self { $(IkeDrop::$name => $text,)* }
            }
        }
    };
}

ike_drops! {
    /// Shorter than the 28-byte IKE header, or shorter than the header's Length field says.
    Truncated = "truncated",
    /// Undecodable or ill-formed: a major version other than 2, a Length beyond the datagram,
    /// a broken payload chain, unsupported critical payloads, header flags or SPIs that do not
    /// fit the exchange, and authentic requests or responses whose decrypted payloads are
    /// undecodable or violate the exchange's payload rules (requests are answered
    /// INVALID_SYNTAX / UNSUPPORTED_CRITICAL_PAYLOAD, RFC 7296 §2.21.2).
    Malformed = "malformed",
    /// Addressed to an IKE SPI of ours that names no live IKE SA (and not a retransmission
    /// of the last request of an SA that just ended).
    UnknownSpi = "unknown_spi",
    /// The Encrypted payload's integrity check failed or it could not be decrypted: dropped
    /// silently (RFC 7296 §2.21.1). Forged and corrupted messages end here.
    IcvFailed = "icv_failed",
    /// A request whose message ID is neither the next one expected nor that of the last request
    /// answered (a replay of an older request, RFC 7296 §2.2), a request before the SA has
    /// keys, or an IKE_SA_INIT request for an SA already past IKE_SA_INIT.
    OutsideWindow = "outside_window",
    /// A response while no request of ours is outstanding, or whose message ID or exchange
    /// does not match the outstanding request (RFC 7296 §2.2).
    UnexpectedResponse = "unexpected_response",
    /// A retransmitted request answered with the cached response without processing it again
    /// (RFC 7296 §2.1): IKE_SA_INIT, requests of a live SA (after its ICV verified) and the last
    /// request of an SA that just ended.
    RetransmitAnswered = "retransmit_answered",
    /// IKE_SA_INIT request refused with NO_PROPOSAL_CHOSEN: no configured tunnel for the
    /// addresses accepts any of its proposals (RFC 7296 §2.7).
    InitNoProposal = "init_no_proposal",
    /// IKE_SA_INIT request refused with INVALID_KE_PAYLOAD: its KE payload is of another group
    /// than the selected proposal's (RFC 7296 §1.2).
    InitInvalidKe = "init_invalid_ke",
    /// IKE_SA_INIT request answered with a COOKIE demand (too many half-open SAs) because it
    /// carried no valid cookie (RFC 7296 §2.6).
    InitCookieDemanded = "init_cookie_demanded",
    /// IKE_SA_INIT request or response that is unusable: missing, repeated or misplaced
    /// payloads, a bad Diffie-Hellman public value, a response that picks what we did not
    /// offer; requests are answered INVALID_SYNTAX where the RFC says so.
    InitInvalid = "init_invalid",
    /// IKE_AUTH failed: the peer's AUTH payload, identity or authentication method matches no
    /// configured tunnel (as responder, answered AUTHENTICATION_FAILED), or the responder's AUTH
    /// does not verify or it refused ours (as initiator). The IKE SA is deleted.
    AuthFailed = "auth_failed",
    /// A one-byte NAT keepalive (RFC 3948 §2.3) handed to the engine: consumed by design. The
    /// data plane counts keepalives on the NAT-T port itself; this counts any that reach IKE.
    NatKeepalive = "nat_keepalive",
}

/// Number of reasons.
const REASONS: usize = IkeDrop::ALL.len();

/// The counters of an endpoint, read with [`Endpoint::stats`](crate::Endpoint::stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IkeStats {
    counts: [u64; REASONS],
}

impl Default for IkeStats {
    fn default() -> Self {
        Self {
            counts: [0; REASONS],
        }
    }
}

impl IkeStats {
    /// The count of one reason.
    pub fn get(&self, reason: IkeDrop) -> u64 {
        self.counts[reason as usize]
    }

    /// Every reason's stable name and count, in [`IkeDrop::ALL`] order (zeros included).
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        IkeDrop::ALL.iter().map(|r| (r.name(), self.get(*r)))
    }

    /// The sum over all reasons.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Counts one datagram under `reason`.
    pub(crate) fn count(&mut self, reason: IkeDrop) {
        self.counts[reason as usize] = self.counts[reason as usize].saturating_add(1);
    }
}

/// The reason for a failure of `IkeSa::unprotect`: a crypto failure is an ICV mismatch (or a
/// ciphertext that cannot be decrypted), anything else is a message that is malformed.
pub(crate) fn unprotect_failure(e: &crate::Error) -> IkeDrop {
    match e {
        crate::Error::Crypto { .. } => IkeDrop::IcvFailed,
        _ => IkeDrop::Malformed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_indices_dense() {
        for (i, r) in IkeDrop::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
        let mut names: Vec<&str> = IkeDrop::ALL.iter().map(|r| r.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), IkeDrop::ALL.len());
    }

    #[test]
    fn counts_and_iterates() {
        let mut s = IkeStats::default();
        s.count(IkeDrop::IcvFailed);
        s.count(IkeDrop::IcvFailed);
        s.count(IkeDrop::Truncated);
        assert_eq!(s.get(IkeDrop::IcvFailed), 2);
        assert_eq!(s.total(), 3);
        let m: Vec<(&str, u64)> = s.iter().filter(|(_, n)| *n > 0).collect();
        assert_eq!(m, vec![("truncated", 1), ("icv_failed", 2)]);
    }
}
