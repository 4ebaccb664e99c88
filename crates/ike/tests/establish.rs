//! Establishment of IKE SAs and their first CHILD_SA through the two-engine harness:
//! both directions, every group, AEAD and CBC+HMAC, failures (PSK, identity, proposals, TS).

mod harness;
use harness::*;
use protego_ike::*;
use std::time::Duration;

#[test]
fn establish_a_to_b() {
    let mut p = Pair::with_tunnel(1);
    p.connect();
    p.assert_children_consistent();
    p.assert_one_ike_sa();
    assert_eq!(p.a.established(), 1);
    assert_eq!(p.b.established(), 1);
    let a = p.a.children.values().next().expect("child");
    assert_eq!(a.proposal, "AES_GCM_16_256/NO_EXT_SEQ");
    assert_eq!(a.local_ts, vec![ts("10.1.0.0/24")]);
    assert_eq!(a.remote.port(), 4500, "force_encap floats to port 4500");
    assert_eq!(a.keys.inbound_encr.len(), 36);
}
