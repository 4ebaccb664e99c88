//! AF_XDP input (`[gateway] xdp`, issue 23 §2) with a real strongSwan 5.9 site and Linux
//! VXLAN hosts, in network namespaces: the XDP program steers the NAT-T and VXLAN datagrams
//! of the gateway's addresses into AF_XDP sockets on its veth links (native mode), the tunnel
//! carries ping and TCP both ways, and `protego status` shows what was steered; an interface
//! that already has someone else's XDP program is left alone (`native` refuses to start,
//! `auto` keeps that input on its UDP socket); the data nodes of the distributed form receive
//! the steer node's Geneve through AF_XDP sockets too.
//!
//! Needs root and the tools from `scripts/setup.sh`, and the `protego` binary built in the
//! same profile (`make test` does both).

mod common;

use std::net::SocketAddr;

use common::*;

use netio::xdp::{interface_of, XdpAttach, XdpSteering};
use protego_testbed::cluster::{ClusterSpec, ProtegoCluster};
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::{Result, Testbed, Topology};

/// One interface of the status's AF_XDP input.
#[derive(Debug)]
struct Steered {
    interface: String,
    attach: String,
    addresses: Vec<String>,
    frames: u64,
}

/// The status's AF_XDP interfaces.
fn xdp_status(gw: &ProtegoGateway) -> Result<Vec<Steered>> {
    let st = gw.status_json()?;
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    Ok(st["xdp"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| Steered {
                    interface: text(&x["interface"]),
                    attach: text(&x["attach"]),
                    addresses: x["addresses"]
                        .as_array()
                        .map(|v| v.iter().map(text).collect())
                        .unwrap_or_default(),
                    frames: x["frames"].as_u64().unwrap_or(0),
                })
                .collect()
        })
        .unwrap_or_default())
}

fn drop_count(gw: &ProtegoGateway, reason: &str) -> Result<u64> {
    Ok(gw.status_json()?["drops"][reason].as_u64().unwrap_or(0))
}

#[test]
fn esp_and_vxlan_arrive_through_af_xdp_sockets() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &["xdp = \"native\"".into()],
    )?;
    // Both links are steered before any traffic: the WAN's NAT-T socket and the underlay's
    // VTEP socket, each on its own interface.
    let xdp = xdp_status(&gw)?;
    let wan = format!("{}:4500", topo.gateway.wan.addr);
    let vtep = format!("{}:4789", topo.gateway.underlay.addr);
    let on = |iface: &str, addr: &str| {
        xdp.iter().any(|x| {
            x.interface == iface && x.attach == "native" && x.addresses == [addr.to_owned()]
        })
    };
    assert!(on(&topo.gateway.wan_if, &wan), "{xdp:?}");
    assert!(on(&topo.gateway.underlay_if, &vtep), "{xdp:?}");

    let _site = site_up(&topo, &tun)?;
    ping_all_vms(&topo, 0, 30)?;
    let perf = back_and_tcp(&topo, 0)?;

    // The ESP (pings, TCP data) and the VXLAN (replies, ACKs) came through the sockets: at
    // least the 60 + 10 pings' packets each way, and every frame was a well-formed datagram.
    let xdp = xdp_status(&gw)?;
    for x in &xdp {
        assert!(x.frames >= 70, "{x:?} ({xdp:?})");
    }
    assert_eq!(drop_count(&gw, "xdp_malformed")?, 0);
    let text = gw.status_text()?;
    assert!(
        text.contains(&format!(
            "AF_XDP input on {} (native, copy",
            topo.gateway.wan_if
        )),
        "{text}"
    );
    eprintln!(
        "protego (AF_XDP): iperf3 {:.0} Mbit/s site -> VM\n{text}",
        perf.received_bps / 1e6
    );
    bed.teardown()?;
    Ok(())
}

#[test]
fn an_interface_with_another_program_is_left_alone() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    // Someone else's XDP program on the WAN link (here: a steering of an unrelated port).
    let wan_ip = topo.gateway.wan.addr;
    let other = topo.gateway.ns.socket_in("attach XDP", "wan", move || {
        let ifindex = interface_of(wan_ip)?;
        XdpSteering::open(ifindex, &[SocketAddr::new(wan_ip, 9)], &[XdpAttach::Native])
    })?;

    // `native` insists: the gateway refuses to start and says why.
    let refused = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &["xdp = \"native\"".into()],
    );
    let err = match refused {
        Ok(_) => panic!("the gateway replaced another XDP program"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("xdp = \"native\"") && err.contains(&topo.gateway.wan_if),
        "{err}"
    );

    // `auto` keeps the WAN on its UDP socket and steers the underlay; the tunnel works.
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &["xdp = \"auto\"".into()],
    )?;
    let xdp = xdp_status(&gw)?;
    assert_eq!(xdp.len(), 1, "{xdp:?}");
    assert_eq!(xdp[0].interface, topo.gateway.underlay_if, "{xdp:?}");
    let _site = site_up(&topo, &tun)?;
    ping_all_vms(&topo, 0, 20)?;
    assert!(gw.log().contains("stays on its UDP socket"), "{}", gw.log());
    drop(other);
    bed.teardown()?;
    Ok(())
}

/// The distributed form: the data nodes' `[data] xdp` steers the Geneve datagrams the steer
/// node relays into AF_XDP sockets; the tunnel carries ping through either data node.
#[test]
fn data_nodes_receive_the_relayed_traffic_through_af_xdp() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let spec = ClusterSpec {
        extra_data: vec!["xdp = \"native\"".into()],
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    let result = (|| -> Result<()> {
        for name in cluster.data_node_names() {
            let log = cluster.log(&name)?;
            assert!(
                log.contains("AF_XDP input up") && log.contains("6081"),
                "{name}: {log}"
            );
        }
        let _site = site_up(&topo, &tun)?;
        ping_all_vms(&topo, 0, 20)?;
        // Moved to the other data node, the tunnel goes on through its AF_XDP socket.
        let first = cluster.sa_holder()?.expect("a data node holds the tunnel");
        let other = cluster
            .data_node_names()
            .into_iter()
            .find(|n| *n != first)
            .expect("two data nodes");
        let answer = cluster.control(&format!("migrate {} {other}", tun.name))?;
        assert_eq!(answer["ok"], true, "{answer}");
        ping_all_vms(&topo, 0, 20)?;
        Ok(())
    })();
    cluster.finish(result)
}
