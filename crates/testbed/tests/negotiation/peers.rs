//! strongSwan set up for the COOKIE tests: cookie thresholds and a half-open IKE SA that puts
//! it over them (RFC 7296 §2.6), and waiting for an IKE SA rekey (§2.8) from its side.

use std::time::Duration;

use protego_testbed::strongswan::{summarize, Charon, CharonSettings, IkeSa};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Result, Topology};

/// A Python program (`python3 -c SCRIPT DST`) that sends a minimal IKE_SA_INIT request (RFC
/// 7296 §1.2: SA aes256gcm16-prfsha256-x25519, a random X25519 public value, a nonce) from an
/// ephemeral port to DST:500 and never continues. It prints `half-open <SPIr>` and exits 0 once
/// the responder answered with an SA payload, i.e. keeps a half-open IKE SA for it.
pub const HALF_OPEN_SCRIPT: &str = r#"
import os, socket, struct, sys
dst = sys.argv[1]
def payload(next_type, body):
    return struct.pack('!BBH', next_type, 0, 4 + len(body)) + body
def transform(last, ttype, tid, attrs=b''):
    body = struct.pack('!BBH', ttype, 0, tid) + attrs
    return struct.pack('!BBH', 0 if last else 3, 0, 4 + len(body)) + body
ts = (transform(False, 1, 20, struct.pack('!HH', 0x800e, 256))
      + transform(False, 2, 5) + transform(True, 4, 31))
prop = struct.pack('!BBHBBBB', 0, 0, 8 + len(ts), 1, 1, 0, 3) + ts
body = (payload(34, prop)
        + payload(40, struct.pack('!HH', 31, 0) + os.urandom(32))
        + payload(0, os.urandom(32)))
spi = os.urandom(8)
msg = spi + bytes(8) + struct.pack('!BBBBII', 33, 0x20, 34, 0x08, 0, 28 + len(body)) + body
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2.0)
for attempt in range(5):
    s.sendto(msg, (dst, 500))
    try:
        data, _ = s.recvfrom(4096)
    except socket.timeout:
        continue
    if data[:8] == spi and data[16] == 33 and data[8:16] != bytes(8):
        print('half-open', data[8:16].hex())
        sys.exit(0)
    print('unexpected answer, first payload', data[16])
    sys.exit(2)
sys.exit(1)
"#;

/// charon settings that demand a COOKIE as soon as one IKE SA from an address is half open.
pub fn cookie_demanding_settings() -> CharonSettings {
    CharonSettings {
        extra: vec![
            "dos_protection = yes".to_owned(),
            "cookie_threshold = 1".to_owned(),
            "cookie_threshold_ip = 1".to_owned(),
        ],
        ..CharonSettings::default()
    }
}

/// Leaves a half-open IKE SA from the gateway's address at `site`'s charon (strongSwan keeps
/// it for its `half_open_timeout`, 30 s), with [`HALF_OPEN_SCRIPT`] run in the gateway's
/// namespace. With [`cookie_demanding_settings`] the charon then demands a COOKIE from the
/// gateway's next IKE_SA_INIT.
pub fn open_half_open_sa(topo: &Topology, site: usize) -> Result<()> {
    let out = topo.gateway.ns.exec(
        Cmd::new("python3")
            .args([
                "-c",
                HALF_OPEN_SCRIPT,
                &topo.sites[site].addr.addr.to_string(),
            ])
            .timeout(Duration::from_secs(20)),
    )?;
    assert!(out.starts_with("half-open"), "{out}");
    Ok(())
}

/// Waits until `site` holds exactly one IKE SA, established, whose initiator SPI differs from
/// `old_ispi` (the IKE SA was rekeyed and the old one deleted), and, with `with_child`, with
/// an installed CHILD_SA `net`.
pub fn wait_ike_replaced(
    site: &Charon,
    old_ispi: &str,
    with_child: bool,
    timeout: Duration,
) -> Result<IkeSa> {
    wait_for(
        &format!("IKE SA {old_ispi} replaced by a rekey"),
        timeout,
        || {
            let sas = site.list_sas()?;
            let new = sas.iter().find(|sa| {
                sa.is_established()
                    && sa.initiator_spi != old_ispi
                    && (!with_child || sa.installed("net").next().is_some())
            });
            Ok(match new {
                Some(sa) if sas.len() == 1 => Probe::Ready(sa.clone()),
                _ => Probe::NotYet(summarize(&sas)),
            })
        },
    )
}
