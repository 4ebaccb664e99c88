//! What the generated code cannot say: [`pb::ChildSa`] keeps its keys out of `Debug` and wipes
//! them when dropped.

use crate::pb;
use std::fmt;
use zeroize::Zeroize;

impl fmt::Debug for pb::ChildSa {
    /// Every field but the four keys, which show as their lengths.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |key: &[u8]| format!("<{} bytes redacted>", key.len());
        f.debug_struct("ChildSa")
            .field("tunnel", &self.tunnel)
            .field(
                "ike_initiator_spi",
                &format_args!("{:016x}", self.ike_initiator_spi),
            )
            .field(
                "ike_responder_spi",
                &format_args!("{:016x}", self.ike_responder_spi),
            )
            .field("inbound_spi", &format_args!("{:08x}", self.inbound_spi))
            .field("outbound_spi", &format_args!("{:08x}", self.outbound_spi))
            .field("encr", &self.encr)
            .field("encr_key_bits", &self.encr_key_bits)
            .field("integ", &self.integ)
            .field("esn", &self.esn)
            .field("pfs", &self.pfs)
            .field("inbound_encr_key", &redacted(&self.inbound_encr_key))
            .field("inbound_integ_key", &redacted(&self.inbound_integ_key))
            .field("outbound_encr_key", &redacted(&self.outbound_encr_key))
            .field("outbound_integ_key", &redacted(&self.outbound_integ_key))
            .field("local_ts", &self.local_ts)
            .field("remote_ts", &self.remote_ts)
            .field("local", &self.local)
            .field("remote", &self.remote)
            .field("replay_window", &self.replay_window)
            .field("replaces", &self.replaces)
            .field("outbound_active", &self.outbound_active)
            .field("proposal", &self.proposal)
            .finish()
    }
}

impl Drop for pb::ChildSa {
    /// Wipes the keys. (Copies made by `Clone`, and the bytes of the encoded message in
    /// tonic's and the kernel's buffers, are beyond its reach.)
    fn drop(&mut self) {
        self.inbound_encr_key.zeroize();
        self.inbound_integ_key.zeroize();
        self.outbound_encr_key.zeroize();
        self.outbound_integ_key.zeroize();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_keys() {
        // (No struct update syntax: a type with `Drop` cannot be taken apart.)
        let mut sa = pb::ChildSa::default();
        sa.inbound_encr_key = vec![0xab; 20];
        sa.outbound_integ_key = vec![0xcd; 32];
        sa.local = "192.0.2.1:4500".into();
        let text = format!("{sa:?}");
        assert!(text.contains("<20 bytes redacted>"), "{text}");
        assert!(text.contains("<32 bytes redacted>"), "{text}");
        assert!(text.contains("192.0.2.1:4500"), "{text}");
        assert!(!text.contains("171") && !text.contains("ab, ab"), "{text}");
        let directive = pb::Directive {
            id: 1,
            op: Some(pb::directive::Op::InstallChild(sa)),
        };
        assert!(format!("{directive:?}").contains("redacted"));
    }
}
