//! Shared pieces of the Protego interop suites (`protego_interop.rs`, `interop_*.rs`): the
//! standard one-tenant topology, the site's charon matching a gateway tunnel, ping checks and
//! status look-ups. Each test file includes this module with `mod common;`.

#![allow(dead_code, unreachable_pub)] // every suite uses a different subset, from a test crate

pub mod ike_craft;

use std::time::Duration;

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::{Charon, CharonSettings, Connection, SwanctlConfig};
use protego_testbed::topology::{SiteSpec, TenantSpec, VmSpec};
use protego_testbed::traffic::{self, PingOptions};
use protego_testbed::{Result, Topology, TopologySpec};

pub const PSK: &str = "interop-test-psk-7f3a";
pub const UP: Duration = Duration::from_secs(20);

pub fn tenant(name: &str, vni: u32, behind_nat: bool, vms: Vec<VmSpec>) -> Result<TenantSpec> {
    Ok(TenantSpec {
        name: name.into(),
        vni,
        vnet: "10.2.0.0/24".parse()?,
        vnet6: None,
        vms,
        sites: vec![SiteSpec {
            lan: "10.1.0.0/24".parse()?,
            lan6: None,
            behind_nat,
        }],
    })
}

/// One tenant, one site, two VMs on two hosts.
pub fn one_tenant(behind_nat: bool) -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![tenant(
            "t1",
            4242,
            behind_nat,
            vec![VmSpec { host: 0 }, VmSpec { host: 1 }],
        )?],
        hosts: 2,
        ..TopologySpec::default()
    })
}

/// Starts the site's charon with the standard connection toward Protego, matching `tun`.
pub fn site_charon(topo: &Topology, tun: &GatewayTunnel) -> Result<Charon> {
    let label = format!("site{}", tun.site);
    site_charon_with(topo, tun, &label, &CharonSettings::default(), |_| {})
}

/// Starts a charon labelled `label` with `settings` on the site of `tun` and loads the
/// standard connection toward Protego, matching `tun`, after `edit` adjusted it (proposals,
/// rekey times...).
pub fn site_charon_with(
    topo: &Topology,
    tun: &GatewayTunnel,
    label: &str,
    settings: &CharonSettings,
    edit: impl FnOnce(&mut Connection),
) -> Result<Charon> {
    let (mut conn, _) = topo.site_connections(tun.site, &tun.psk);
    tun.apply_to_site(&mut conn);
    edit(&mut conn);
    let charon = Charon::start(&topo.sites[tun.site].ns, label, settings)?;
    charon.load(&SwanctlConfig::new(vec![conn]))?;
    Ok(charon)
}

/// Pings every VM of the site's tenant from the site's LAN address; asserts nothing is lost.
pub fn ping_all_vms(topo: &Topology, site: usize, count: u32) -> Result<()> {
    let s = &topo.sites[site];
    for vm in &topo.tenants[s.tenant].vms {
        let ping = traffic::ping(
            &s.ns,
            vm.addr.addr,
            &PingOptions::new(count, Duration::from_millis(10)).from(s.lan_addr),
        )?;
        assert!(
            ping.all_received(),
            "site {site} -> vm {}: {ping:?}",
            vm.addr
        );
    }
    Ok(())
}

/// The `tunnels` entry of `protego status --json` named `name`.
pub fn tunnel_status(gw: &ProtegoGateway, name: &str) -> Result<serde_json::Value> {
    let status = gw.status_json()?;
    let found = status["tunnels"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name).cloned());
    Ok(found.unwrap_or_else(|| panic!("tunnel {name} missing from status: {status}")))
}

/// SIGKILL, for killing a peer without letting it send a DELETE.
pub const SIGKILL: i32 = 9;
