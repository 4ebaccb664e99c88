//! A restart of Protego against real strongSwan 5.9 (kernel-libipsec, `encap = yes`).
//!
//! `protego up` keeps every IKE SA in its state store (`[store]`). Killed with SIGKILL and
//! started again on the same configuration file, it restores its IKE SA with the same SPIs and
//! message IDs, so the peer keeps it (no new IKE_SA_INIT / IKE_AUTH), and rekeys the CHILD_SA
//! at once with a CREATE_CHILD_SA over it (RFC 7296 §1.3.3): the ESP state (sequence numbers,
//! replay windows) died with the process. The restored IKE SA then takes further exchanges
//! both ways: an IKE SA rekey strongSwan starts (§1.3.2) and a CHILD_SA rekey Protego starts.
//! A graceful stop (SIGTERM) deletes the IKE SA with the peer and clears the store: the next
//! start restores nothing.
//!
//! The restarts use [`ProtegoGateway::restart`]: the same configuration file and directory, so
//! the same `[store]` path.

mod common;

use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant, SystemTime};

use common::*;

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::{summarize, Charon, IkeSa};
use protego_testbed::traffic;
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Result, Testbed, Topology};

/// Protego's log line for each IKE SA it restored at start-up.
const RESTORED: &str = "IKE_SA restored from the store";

/// How long traffic may be down after the kill: restart, restore and one CHILD_SA rekey.
const OUTAGE_LIMIT: Duration = Duration::from_secs(10);

/// The `tunnels` entry named `name` of a `protego status --json` document.
fn tunnel_of(status: &serde_json::Value, name: &str) -> serde_json::Value {
    status["tunnels"]
        .as_array()
        .and_then(|ts| ts.iter().find(|t| t["name"] == name).cloned())
        .unwrap_or_else(|| panic!("tunnel {name} missing from status: {status}"))
}

/// Waits until both sides show exactly one established IKE SA with the same SPIs and one
/// installed CHILD_SA, each the other's pair (our inbound SPI is the peer's outbound one);
/// returns charon's IKE SA. `status` reads Protego's `status --json`. strongSwan keeps the
/// inbound half of a CHILD_SA it rekeyed for a few seconds in state DELETED: tolerated.
fn wait_one_pair(
    status: impl Fn() -> Result<serde_json::Value>,
    site: &Charon,
    tunnel: &str,
) -> Result<IkeSa> {
    wait_for(
        "one matching IKE SA and CHILD_SA pair on both sides",
        Duration::from_secs(20),
        || {
            let st = tunnel_of(&status()?, tunnel);
            let sas = site.list_sas()?;
            let ours = st["ike_sas"].as_array().cloned().unwrap_or_default();
            let paired = ours.len() == 1
                && ours[0]["state"] == "established"
                && ours[0]["children"].as_array().map(Vec::len) == Some(1)
                && sas.len() == 1
                && sas[0].is_established()
                && ours[0]["spi_i"].as_str() == Some(&sas[0].initiator_spi)
                && ours[0]["spi_r"].as_str() == Some(&sas[0].responder_spi)
                && sas[0]
                    .children
                    .iter()
                    .all(|c| c.is_installed() || c.state == "DELETED")
                && {
                    let installed: Vec<_> = sas[0].installed("net").collect();
                    let child = &ours[0]["children"][0];
                    installed.len() == 1
                        && child["spi_in"].as_str() == Some(&installed[0].spi_out)
                        && child["spi_out"].as_str() == Some(&installed[0].spi_in)
                };
            Ok(if paired {
                Probe::Ready(sas[0].clone())
            } else {
                Probe::NotYet(format!("protego: {st}\nstrongSwan: {}", summarize(&sas)))
            })
        },
    )
}

/// The installed CHILD_SA `net` of charon's IKE SA (there is exactly one after
/// [`wait_one_pair`]).
fn installed_net(sa: &IkeSa) -> protego_testbed::strongswan::ChildSa {
    sa.installed("net")
        .next()
        .cloned()
        .unwrap_or_else(|| panic!("no installed CHILD_SA net: {sa:?}"))
}

/// The IKE requests charon parsed (the gateway's requests), in log order, as exchange type
/// and message ID: `parsed CREATE_CHILD_SA request 2 [ N(REKEY_SA) SA No TSi TSr ]`.
fn parsed_requests(log: &str) -> Vec<(String, u32)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split("parsed ").nth(1)?;
            let (exchange, rest) = rest.split_once(" request ")?;
            Some((
                exchange.to_owned(),
                rest.split_whitespace().next()?.parse().ok()?,
            ))
        })
        .collect()
}

/// An ESP SPI as charon prints it (`c13691fa`) or tshark does (`0xc13691fa`).
fn spi_value(text: &str) -> Option<u32> {
    let t = text.trim();
    u32::from_str_radix(t.strip_prefix("0x").unwrap_or(t), 16).ok()
}

/// charon's log from byte offset `from` on.
fn charon_log_since(site: &Charon, from: usize) -> String {
    site.log().get(from..).unwrap_or_default().to_owned()
}

/// SIGKILL to `protego up` with an established tunnel: the restarted gateway restores the IKE SA
/// (strongSwan keeps the same one: same SPIs, same unique id, no IKE_SA_INIT) and rekeys the
/// CHILD_SA over it; traffic flows again within [`OUTAGE_LIMIT`]. strongSwan then rekeys the
/// restored IKE SA and Protego rekeys the CHILD_SA, both succeed. After a graceful stop the
/// store is empty: the next start restores nothing.
#[test]
fn killed_gateway_restores_its_ike_sa_and_rekeys_the_child_sa() -> Result<()> {
    let test_started = Instant::now();
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let mut gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 5)?;
    // One CHILD_SA rekey from each side first, so that the message IDs of both directions
    // have moved on from what a fresh IKE SA would use: the restored ones must continue them.
    let first = wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    gw.control(&format!("rekey {}", tun.name))?;
    let second = site.wait_child_rekeyed("net", &installed_net(&first).spi_in, UP)?;
    wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    site.rekey_child("net")?;
    site.wait_child_rekeyed("net", &second.spi_in, UP)?;
    let before = wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    let child_before = installed_net(&before);
    // The message ID of Protego's next request on this IKE SA (charon's log holds no other).
    let protego_next_id = parsed_requests(&site.log())
        .iter()
        .map(|(_, id)| id + 1)
        .max()
        .unwrap_or(0);
    assert!(protego_next_id >= 2, "{}", site.log());

    // Kill -9 under a 100 Hz ping, start again on the same configuration (and store). The
    // site's WAN is captured to see which SPIs the gateway's ESP carries afterwards.
    let s = &topo.sites[0];
    let wan = traffic::capture(&s.ns, &s.wan_if, "udp port 4500", "site-wan")?;
    let pinger = OutagePing::start(&topo)?;
    wait_for("replies to the outage ping", UP, || {
        let n = pinger.replies().len();
        Ok(if n >= 20 {
            Probe::Ready(())
        } else {
            Probe::NotYet(format!("{n} replies: {}", pinger.process.log_tail(3)))
        })
    })?;
    let charon_seen = site.log().len();
    let killed_at = SystemTime::now();
    let killed = gw.process().stop_with(SIGKILL);
    let restart = Instant::now();
    assert!(
        killed.is_some_and(|s| s.signal() == Some(SIGKILL)),
        "protego did not die of SIGKILL: {killed:?}"
    );
    gw.restart(&topo, "protego-restarted")?;
    let socket_up = restart.elapsed();
    let outage = pinger.first_reply_after(killed_at, OUTAGE_LIMIT);
    pinger.process.stop();
    let outage = outage.unwrap_or_else(|e| {
        panic!(
            "no traffic within {OUTAGE_LIMIT:?} of the kill: {e}\nprotego:\n{}\ncharon:\n{}",
            gw.log(),
            charon_log_since(&site, charon_seen)
        )
    });

    // strongSwan kept its IKE SA; the CHILD_SA was rekeyed over it.
    let after = wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    let child_after = installed_net(&after);
    ping_all_vms(&topo, 0, 20)?;
    let pcap = wan.stop();
    assert_eq!(
        (
            &after.name,
            after.unique_id,
            &after.initiator_spi,
            &after.responder_spi
        ),
        (
            &before.name,
            before.unique_id,
            &before.initiator_spi,
            &before.responder_spi
        ),
        "strongSwan's IKE SA changed across the restart: {after:?}"
    );
    assert!(
        child_after.spi_in != child_before.spi_in && child_after.spi_out != child_before.spi_out,
        "CHILD_SA not rekeyed after the restart: before {child_before:?}, after {child_after:?}"
    );
    let charon_new = charon_log_since(&site, charon_seen);
    assert!(
        !charon_new.contains("IKE_SA_INIT") && !charon_new.contains("IKE_AUTH"),
        "strongSwan saw a new IKE SA negotiated after the restart:\n{charon_new}"
    );
    // Protego's first request after the restart continues its message IDs.
    let requests = parsed_requests(&charon_new);
    assert_eq!(
        requests.first(),
        Some(&("CREATE_CHILD_SA".to_owned(), protego_next_id)),
        "Protego's first request after the restart:\n{charon_new}"
    );
    // charon answered Protego's CREATE_CHILD_SA (a CHILD_SA rekey: SA and TSi/TSr payloads).
    assert!(
        charon_new.lines().any(|l| {
            l.contains("generating CREATE_CHILD_SA response")
                && l.contains(" SA ")
                && l.contains("TSi")
        }),
        "strongSwan answered no CHILD_SA rekey after the restart:\n{charon_new}"
    );
    let log2 = gw.log();
    let restored: Vec<&str> = log2.lines().filter(|l| l.contains(RESTORED)).collect();
    assert!(
        restored.len() == 1
            && restored[0].contains(&format!("tunnel={}", tun.name))
            && restored[0].contains(&before.initiator_spi)
            && restored[0].contains(&before.responder_spi),
        "expected one `{RESTORED}` line for tunnel {} and SPIs {}/{}:\n{log2}",
        tun.name,
        before.initiator_spi,
        before.responder_spi
    );
    // The gateway's ESP after the kill: only on the new CHILD_SA, never on the old keys (their
    // sequence numbers, hence AES-GCM nonces, died with the process).
    let esp = traffic::tshark_fields(&pcap, "esp", &["frame.time_epoch", "ip.src", "esp.spi"])?;
    let gateway = topo.gateway.wan.addr.to_string();
    let killed_secs = epoch_secs(killed_at);
    let from_gateway_after: Vec<Option<u32>> = esp
        .iter()
        .filter(|r| r.get(1) == Some(&gateway))
        .filter(|r| r.first().and_then(|t| t.parse::<f64>().ok()) > Some(killed_secs))
        .map(|r| r.get(2).and_then(|spi| spi_value(spi)))
        .collect();
    let (old_out, new_out) = (
        spi_value(&child_before.spi_in),
        spi_value(&child_after.spi_in),
    );
    assert!(
        !from_gateway_after.is_empty() && from_gateway_after.iter().all(|spi| *spi == new_out),
        "ESP from the gateway after the kill must all use the new SPI {new_out:x?} (old \
         {old_out:x?}): {from_gateway_after:x?}"
    );

    // The restored IKE SA takes a rekey strongSwan starts: a new IKE SA on both sides.
    site.rekey_ike(&before.name)?;
    let rekeyed = wait_for("strongSwan's IKE SA rekeyed", UP, || {
        let sas = site.list_sas()?;
        Ok(
            match sas.iter().find(|s| {
                s.is_established()
                    && s.initiator_spi != before.initiator_spi
                    && s.installed("net").next().is_some()
            }) {
                Some(sa) => Probe::Ready(sa.clone()),
                None => Probe::NotYet(summarize(&sas)),
            },
        )
    })?;
    let new_ike = wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    assert_eq!(
        (&new_ike.initiator_spi, &new_ike.responder_spi),
        (&rekeyed.initiator_spi, &rekeyed.responder_spi),
        "{new_ike:?}"
    );
    ping_all_vms(&topo, 0, 10)?;

    // And a CHILD_SA rekey Protego starts, over the new IKE SA.
    let child = installed_net(&new_ike);
    gw.control(&format!("rekey {}", tun.name))?;
    site.wait_child_rekeyed("net", &child.spi_in, UP)?;
    let last = wait_one_pair(|| gw.status_json(), &site, &tun.name)?;
    assert_eq!(last.initiator_spi, new_ike.initiator_spi, "{last:?}");
    ping_all_vms(&topo, 0, 10)?;
    let charon_new = charon_log_since(&site, charon_seen);
    assert!(
        !charon_new.contains("IKE_SA_INIT"),
        "strongSwan saw a new IKE_SA_INIT after the restart:\n{charon_new}"
    );

    // A graceful stop deletes the IKE SA with the peer and clears the store.
    let stopped = gw.stop();
    assert!(
        stopped.is_some_and(|s| s.success()),
        "protego did not stop cleanly on SIGTERM: {stopped:?}\n{}",
        gw.log()
    );
    site.wait_ike_gone(&before.name, Duration::from_secs(5))?;
    gw.restart(&topo, "protego-after-stop")?;
    let log3 = gw.log();
    assert!(
        !log3.contains(RESTORED),
        "an IKE SA was restored after a graceful stop:\n{log3}"
    );
    let st = tunnel_of(&gw.status_json()?, &tun.name);
    assert!(
        st["ike_sas"].as_array().is_some_and(Vec::is_empty),
        "IKE SAs after a graceful stop and a start: {st}"
    );
    gw.stop();

    eprintln!(
        "restart: status socket up {:.0} ms after the kill; ping outage {:.0} ms \
         (kill to first reply); whole test {:.1} s",
        socket_up.as_secs_f64() * 1e3,
        outage.as_secs_f64() * 1e3,
        test_started.elapsed().as_secs_f64()
    );
    bed.teardown()?;
    Ok(())
}
