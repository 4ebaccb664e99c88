//! Protego's own account of a negotiation, cross-checked against the wire: the node-wide IKE
//! drop counters of `protego status --json` (`ike_drops`, docs/architecture.md, "Bad input and faults"), which count every
//! refused or dropped IKE datagram by reason (RFC 7296 §2.6 COOKIE demands, §1.2
//! INVALID_KE_PAYLOAD refusals, ...).

use protego_testbed::protego::ProtegoGateway;
use protego_testbed::Result;

/// Counters that may move in a healthy run on a loaded machine: retransmissions answered from
/// the cache (RFC 7296 §2.1) and NAT keepalives (RFC 3948 §2.3).
const BENIGN: &[&str] = &["retransmit_answered", "nat_keepalive"];

/// Asserts the gateway's IKE drop counters: each reason in `expected` is at least its
/// minimum, every other reason (but the benign ones) is zero, i.e. Protego refused nothing
/// strongSwan sent except what the test provoked. Returns the counters.
pub fn assert_ike_drops(
    gw: &ProtegoGateway,
    expected: &[(&str, u64)],
) -> Result<serde_json::Map<String, serde_json::Value>> {
    let status = gw.status_json()?;
    let drops = status["ike_drops"]
        .as_object()
        .cloned()
        .unwrap_or_else(|| panic!("no ike_drops in status: {status}"));
    for (name, min) in expected {
        let n = drops.get(*name).and_then(serde_json::Value::as_u64);
        assert!(
            n.is_some_and(|n| n >= *min),
            "ike_drops.{name} should be at least {min}: {drops:?}"
        );
    }
    for (name, n) in &drops {
        if expected.iter().any(|(e, _)| e == name) || BENIGN.contains(&name.as_str()) {
            continue;
        }
        assert_eq!(
            n.as_u64(),
            Some(0),
            "unexpected ike_drops.{name}: {drops:?}"
        );
    }
    Ok(drops)
}
