//! strongSwan 5.9 (charon with kernel-libipsec, userspace ESP over its `ipsec0` TUN device)
//! as the gateway under test, started as the test bed's `strongswan::Charon` starts it (see
//! /work/shared/STRONGSWAN-PEER.md): one connection per bench tunnel, PSK, `encap = yes`
//! (ESP-in-UDP, RFC 3948), the load generator initiating.
//!
//! strongSwan has no VXLAN: decrypted packets leave `ipsec0` and the gateway namespace's
//! kernel routes them to the VM address on the host; outbound, the host sends plain UDP that
//! the kernel routes into `ipsec0` (charon installs routes for each `remote_ts`).

use std::time::Duration;

use testbed::strongswan::{Charon, CharonSettings, ChildConfig, Connection, SwanctlConfig};
use testbed::Netns;

use crate::error::{BenchError, Result};
use crate::gateway::{peer_id, GatewayCounters, GATEWAY_ID, IKE_PROPOSAL, PSK};
use crate::load::UnderTest;
use crate::net;
use crate::options::Cipher;

/// A running charon configured for a group.
pub(crate) struct CharonUnderTest {
    charon: Charon,
}

/// The swanctl configuration: connection `t<i>` with child `c<i>` per tunnel.
pub(crate) fn swanctl_config(tunnels: u32, cipher: Cipher) -> SwanctlConfig {
    let connections = (0..tunnels)
        .map(|i| {
            let remote_ts = format!("{}/32", net::tunnel_addr(i));
            let mut child = ChildConfig::new(&format!("c{i}"), &[net::VNET], &[remote_ts.as_str()]);
            child.esp_proposals = vec![cipher.esp_proposal().to_owned()];
            let mut c = Connection::site_to_site(
                &format!("t{i}"),
                &net::GW_WAN.to_string(),
                &net::PEER.to_string(),
                GATEWAY_ID,
                &peer_id(i),
                PSK,
                child,
            );
            c.proposals = vec![IKE_PROPOSAL.to_owned()];
            c
        })
        .collect();
    SwanctlConfig::new(connections)
}

impl CharonUnderTest {
    /// Starts charon in `ns` (files under `<run dir>/<label>/`) and loads the configuration.
    /// With `verbose`, charon logs IKE in detail (for a kept run directory); else it logs
    /// little, so that logging costs it no CPU during the measurement.
    pub(crate) fn start(
        ns: &Netns,
        label: &str,
        tunnels: u32,
        cipher: Cipher,
        verbose: bool,
    ) -> Result<CharonUnderTest> {
        // Every tunnel's IKE_SA_INIT arrives at once from one address: no COOKIE round trips
        // and no per-address half-open limit (charon's defaults are 10 and 5), as the Protego
        // configuration of the bench does.
        let burst = vec![
            format!("cookie_threshold = {}", tunnels.saturating_mul(2) + 64),
            format!("block_threshold = {}", tunnels.saturating_mul(2) + 64),
        ];
        let settings = if verbose {
            CharonSettings {
                extra: burst,
                ..CharonSettings::default()
            }
        } else {
            CharonSettings {
                log_level: 0,
                ike_log_level: 0,
                esp_log_level: 0,
                extra: burst,
                ..CharonSettings::default()
            }
        };
        let charon = Charon::start(ns, label, &settings)?;
        if let Err(e) = charon.load(&swanctl_config(tunnels, cipher)) {
            let tail = charon.process().log_tail(30);
            charon.stop();
            return Err(BenchError::Gateway {
                gateway: "strongswan",
                reason: format!("loading the swanctl configuration failed: {e}"),
                log_tail: tail,
            });
        }
        // kernel-libipsec creates ipsec0 at start; give the routes a moment after each
        // CHILD_SA (the establish loop waits for the SAs themselves).
        std::thread::sleep(Duration::from_millis(50));
        Ok(CharonUnderTest { charon })
    }
}

impl UnderTest for CharonUnderTest {
    fn name(&self) -> &'static str {
        "strongswan"
    }

    fn pid(&self) -> u32 {
        self.charon.process().pid()
    }

    fn counters(&self) -> Option<GatewayCounters> {
        None
    }

    fn check_running(&self) -> Result<()> {
        self.charon
            .process()
            .check_running()
            .map_err(|e| BenchError::Gateway {
                gateway: "strongswan",
                reason: e.to_string(),
                log_tail: self.charon.process().log_tail(30),
            })
    }

    fn stop(&self) {
        self.charon.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_connection_per_tunnel() {
        let text = swanctl_config(3, Cipher::ChaCha20Poly1305)
            .render()
            .expect("valid configuration");
        assert_eq!(text.matches("encap = yes").count(), 3);
        assert!(text.contains("remote_ts = 10.128.0.3/32"));
        assert!(text.contains("esp_proposals = chacha20poly1305"));
        assert!(text.contains("id = peer2.bench"));
    }
}
