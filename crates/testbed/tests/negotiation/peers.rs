//! strongSwan set up for the COOKIE tests: cookie thresholds and a half-open IKE SA that puts
//! it over them (RFC 7296 §2.6), and waiting for an IKE SA rekey (§2.8) from its side.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use crate::common::ike_craft::{init_request, SA};

use protego_testbed::strongswan::{summarize, Charon, CharonSettings, IkeSa};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Result, Topology};

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
/// it for its `half_open_timeout`, 30 s): a minimal IKE_SA_INIT request (SA
/// aes256gcm16-prfsha256-x25519, an X25519 public value, a nonce) sent from the gateway's
/// namespace, never continued once strongSwan answered with its SA. With
/// [`cookie_demanding_settings`] the charon then demands a COOKIE from the gateway's next
/// IKE_SA_INIT.
pub fn open_half_open_sa(topo: &Topology, site: usize) -> Result<()> {
    let sock = topo
        .gateway
        .ns
        .udp_socket(SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0))?;
    sock.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("read timeout");
    // Any non-zero SPI will do; unique per run so captures tell the runs apart.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.subsec_nanos());
    let ispi = (u64::from(std::process::id()) << 32) | u64::from(nanos) | 1;
    let transforms = [(1, 20, Some(256)), (2, 5, None), (4, 31, None)];
    let request = init_request(ispi, &transforms, 31, 32);
    let dst = SocketAddr::new(topo.sites[site].addr.addr, 500);
    let mut buf = vec![0u8; 4096];
    for _ in 0..5 {
        sock.send_to(&request, dst).expect("send IKE_SA_INIT");
        let Ok((n, _)) = sock.recv_from(&mut buf) else {
            continue;
        };
        let answer = &buf[..n];
        assert!(
            answer.len() > 28 && answer[..8] == ispi.to_be_bytes(),
            "not an answer to our IKE_SA_INIT: {answer:02x?}"
        );
        assert_eq!(
            answer[16], SA,
            "strongSwan did not answer with an SA: {answer:02x?}"
        );
        assert_ne!(answer[8..16], [0; 8], "no responder SPI: {answer:02x?}");
        return Ok(());
    }
    panic!("strongSwan never answered the IKE_SA_INIT to {dst}");
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
