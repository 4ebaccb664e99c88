//! `protego ctl apply -f FILE` against real strongSwan: the tenants, VNets and tunnels of a
//! running `protego up` change without a restart, and what was applied survives one.
//!
//! Two tenants with one site each. The gateway starts with both tenants but only the first
//! site's tunnel; the applies then remove the second tenant (tenant and VNet), add it back
//! with its tunnel (its site connects and reaches its VMs), remove the first tunnel (its
//! site's IKE SA is deleted by Protego's DELETE), and refuse an invalid file without changing
//! anything. Killed with SIGKILL and started again on its unchanged configuration file, the
//! gateway runs the applied tunnels, not the file's, and restores the applied tunnel's IKE SA
//! (same SPIs: the peer does not re-authenticate).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::*;

use protego_testbed::protego::{render_inventory, GatewayTunnel, ProtegoGateway};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Result, Testbed, Topology};

/// The names of the tunnels `protego status --json` lists.
fn tunnel_names(gw: &ProtegoGateway) -> Result<Vec<String>> {
    Ok(gw.status_json()?["tunnels"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default())
}

/// The (initiator, responder) SPIs of the tunnel's established IKE SA in Protego's status.
fn ike_spis(gw: &ProtegoGateway, tunnel: &str) -> Result<Option<(String, String)>> {
    let t = tunnel_status(gw, tunnel)?;
    Ok(t["ike_sas"].as_array().and_then(|sas| {
        sas.iter().find(|s| s["state"] == "established").map(|s| {
            (
                s["spi_i"].as_str().unwrap_or_default().to_owned(),
                s["spi_r"].as_str().unwrap_or_default().to_owned(),
            )
        })
    }))
}

#[test]
fn applied_tenants_and_tunnels_change_live_and_survive_a_restart() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, numbered_tenants(&[("t1", 4242), ("t2", 4343)])?)?;
    let first = GatewayTunnel::for_site(&topo, 0, PSK);
    let mut second = GatewayTunnel::for_site(&topo, 1, PSK);
    second.psk = format!("{PSK}-second");
    let mut gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&first), &[])?;
    let result = (|| -> Result<()> {
        let site0 = site_charon(&topo, &first)?;
        site0.initiate("net", UP)?;
        site0.wait_child_installed("net", UP)?;
        warm_up(&topo, 0)?;
        ping_all_vms(&topo, 0, 5)?;
        let first_spis = ike_spis(&gw, &first.name)?;
        assert!(first_spis.is_some());
        let dir = bed.dir().to_owned();

        // 1. Without the second tenant: its tenant and VNet go; the first tunnel is untouched.
        let only_first = render_inventory(&topo, &[0], std::slice::from_ref(&first), &dir)?;
        let dry = gw.apply(&only_first, true)?;
        assert!(
            dry.contains("dry run") && dry.contains("- tenant t2"),
            "{dry}"
        );
        let out = gw.apply(&only_first, false)?;
        eprintln!("apply 1:\n{out}");
        assert!(
            out.contains("- tenant t2") && out.contains("- vnet t2/vnet"),
            "{out}"
        );
        assert!(out.contains("1 tunnel(s) unchanged"), "{out}");
        assert_eq!(
            ike_spis(&gw, &first.name)?,
            first_spis,
            "the first tunnel kept its SA"
        );
        ping_all_vms(&topo, 0, 5)?;
        // The same file again changes nothing.
        assert!(gw.apply(&only_first, false)?.contains("nothing to change"));

        // 2. The second tenant back, with its tunnel: its site connects and reaches its VMs.
        let both = render_inventory(&topo, &[0, 1], &[first.clone(), second.clone()], &dir)?;
        let out = gw.apply(&both, false)?;
        eprintln!("apply 2:\n{out}");
        for line in [
            "+ tenant t2",
            "+ vnet t2/vnet",
            &format!("+ tunnel {}", second.name),
        ] {
            assert!(out.contains(line), "{line:?} missing from {out}");
        }
        let site1 = site_charon(&topo, &second)?;
        site1.initiate("net", UP)?;
        site1.wait_child_installed("net", UP)?;
        warm_up(&topo, 1)?;
        ping_all_vms(&topo, 1, 5)?;
        ping_all_vms(&topo, 0, 5)?;

        // 3. A file with an error changes nothing, and says where the error is.
        let broken = both.replace(
            "esp_proposals = [\"aes256gcm16\"]",
            "esp_proposals = [\"nonsense\"]",
        );
        let e = gw
            .apply(&broken, false)
            .expect_err("an invalid file is refused");
        let e = e.to_string();
        assert!(e.contains("esp_proposals") && e.contains("apply-"), "{e}");
        assert_eq!(tunnel_names(&gw)?.len(), 2);

        // 4. The first tunnel removed: Protego deletes its IKE SA with the peer.
        let only_second = render_inventory(&topo, &[0, 1], std::slice::from_ref(&second), &dir)?;
        let out = gw.apply(&only_second, false)?;
        eprintln!("apply 4:\n{out}");
        assert!(out.contains(&format!("- tunnel {}", first.name)), "{out}");
        wait_for(
            "the first site's IKE SA deleted",
            Duration::from_secs(10),
            || {
                let sas = site0.list_sas()?;
                Ok(if sas.is_empty() {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(format!("{sas:?}"))
                })
            },
        )?;
        assert!(
            site0.log().contains("received DELETE for IKE_SA"),
            "the peer was told"
        );
        assert_eq!(tunnel_names(&gw)?, vec![second.name.clone()]);
        ping_all_vms(&topo, 1, 5)?;

        // 5. kill -9 and a start on the unchanged file (which has only the first tunnel): the
        // applied configuration runs, and the second tunnel's IKE SA is restored.
        let before = ike_spis(&gw, &second.name)?;
        assert!(before.is_some());
        let killed = gw.process().stop_with(SIGKILL);
        assert!(
            killed.is_some_and(|s| s.signal() == Some(SIGKILL)),
            "{killed:?}"
        );
        let _old = gw.restart(&topo, "protego-restarted")?;
        assert_eq!(tunnel_names(&gw)?, vec![second.name.clone()]);
        assert!(gw
            .log()
            .contains("running the tenants, VNets and tunnels applied"));
        // The restored tunnel carries traffic once its CHILD_SA is rekeyed over it.
        warm_up_within(&topo, 1, Duration::from_secs(20))?;
        assert_eq!(
            ike_spis(&gw, &second.name)?,
            before,
            "the same IKE SA, not a new one"
        );
        let inits = site1.log().matches("IKE_SA_INIT").count();
        ping_all_vms(&topo, 1, 5)?;
        assert_eq!(site1.log().matches("IKE_SA_INIT").count(), inits);
        Ok(())
    })();
    if result.is_err() {
        eprintln!("--- protego log ---\n{}", gw.log());
    }
    result
}
