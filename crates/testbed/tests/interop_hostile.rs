//! Hostile packets against a live Protego gateway (docs/architecture.md, "Bad input and faults"): with a real tunnel to a
//! strongSwan site up, an attacker on the WAN (and the site's own namespace, from a port charon
//! does not use) sends truncated and random IKE datagrams, messages with bad lengths and payload
//! chains, IKE_SA_INIT requests with garbage or unacceptable contents, replays of captured IKE
//! requests, forged SK payloads (RFC 7296 §2.1, §2.2, §2.5, §2.21, §3.14), and truncated,
//! unknown-SPI, replayed and forged ESP plus NAT keepalives (RFC 4303 §3.4.3, RFC 3948 §2).
//! Every datagram must be dropped and counted exactly where `protego status --json` says
//! (`ike_drops`, `drops`), the process must live on, the IKE SA and CHILD_SA must be untouched on
//! both ends, and the tunnel must still carry every ping.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

use common::ike_craft::*;
use common::*;

use protego_testbed::inject::{self, PcapUdp};
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::CharonSettings;
use protego_testbed::traffic;
use protego_testbed::{Result, Testbed, Topology};

/// The notify type of a one-notify IKE answer (header, generic header, protocol, SPI size).
fn notify_type(m: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*m.get(34)?, *m.get(35)?]))
}

/// The counters of one map of the status document.
fn counters(status: &serde_json::Value, key: &str) -> BTreeMap<String, u64> {
    status[key]
        .as_object()
        .unwrap_or_else(|| panic!("status has no {key}: {status}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or_default()))
        .collect()
}

fn delta(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// Every datagram that arrives on `sock` within `wait` of the last one.
fn answers(sock: &UdpSocket, wait: Duration) -> Vec<Vec<u8>> {
    sock.set_read_timeout(Some(wait)).expect("timeout");
    let mut out = Vec::new();
    let mut buf = vec![0u8; 65536];
    while let Ok((n, _)) = sock.recv_from(&mut buf) {
        out.push(buf[..n].to_vec());
    }
    out
}

#[test]
fn hostile_ike_and_esp_are_dropped_counted_and_harmless() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    // The site sends no NAT keepalives of its own, so that every one the gateway counts is ours.
    let settings = CharonSettings {
        extra: vec!["keep_alive = 0s".into()],
        ..CharonSettings::default()
    };
    let site = site_charon_with(&topo, &tun, "site0", &settings, |_| {})?;
    let gwa = topo.gateway.wan.addr;
    let (gw500, gw4500) = (SocketAddr::new(gwa, 500), SocketAddr::new(gwa, 4500));
    let site_addr = topo.sites[0].addr.addr;
    let wan_if = &topo.gateway.wan_if;

    // A real tunnel, recorded on the wire: the handshake, ESP both ways, and a CHILD_SA rekey
    // by strongSwan (requests with message IDs 0..=3 toward the gateway).
    let cap = traffic::capture(
        &topo.gateway.ns,
        wan_if,
        "udp port 500 or udp port 4500",
        "setup",
    )?;
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 5)?;
    site.rekey_child("net")?;
    site.wait_child_rekeyed("net", &first.spi_in, UP)?;
    let deadline = Instant::now() + UP;
    let st = loop {
        let st = tunnel_status(&gw, &tun.name)?;
        let swan = site.list_sas()?;
        let swan_children = swan.iter().map(|s| s.children.len()).sum::<usize>();
        if st["ike_sas"][0]["children"].as_array().map(Vec::len) == Some(1) && swan_children == 1 {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "old CHILD_SA not gone: {st}\n{swan:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    ping_all_vms(&topo, 0, 5)?;
    let recorded = inject::pcap_udp(&cap.stop())?;
    let spi_in = st["ike_sas"][0]["children"][0]["spi_in"]
        .as_str()
        .expect("spi_in")
        .to_owned();

    // The site's IKE requests to the gateway, by message ID, and its last ESP packet on the
    // live CHILD_SA.
    let from_site = |d: &&PcapUdp| d.src.ip() == site_addr && d.dst.ip() == gwa;
    let mut requests: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    let mut last_esp = None;
    for d in recorded.iter().filter(from_site) {
        let ike = match (d.dst.port(), d.payload.as_slice()) {
            (500, p) => Some(p),
            (4500, [0, 0, 0, 0, p @ ..]) => Some(p),
            (4500, [0xff]) => None,
            (4500, p) => {
                if p.len() > 16
                    && format!("{:08x}", u32::from_be_bytes([p[0], p[1], p[2], p[3]])) == spi_in
                {
                    last_esp = Some(p.to_vec());
                }
                None
            }
            _ => None,
        };
        if let Some(h) = ike.and_then(hdr) {
            if h.flags & FLAG_R == 0 {
                requests.insert(h.id, ike.expect("ike").to_vec());
            }
        }
    }
    let req = |id: u32| {
        requests
            .get(&id)
            .cloned()
            .unwrap_or_else(|| panic!("no request {id} captured: {:?}", requests.keys()))
    };
    let (init, auth, rekey, delete) = (req(0), req(1), req(2), req(3));
    assert_eq!(hdr(&init).map(|h| h.exchange), Some(IKE_SA_INIT));
    assert_eq!(hdr(&rekey).map(|h| h.exchange), Some(CREATE_CHILD_SA));
    assert_eq!(hdr(&delete).map(|h| h.exchange), Some(INFORMATIONAL));
    let esp = last_esp.expect("an ESP packet of the live CHILD_SA was captured");

    // The state to preserve.
    let before = gw.status_json()?;
    let swan_before = site.list_sas()?;
    assert_eq!(swan_before.len(), 1, "{swan_before:?}");
    let swan_log_len = site.log().len();

    // The attacker: a host on the WAN, and a socket in the site's namespace on a port charon
    // does not use (the gateway accepts IKE_SA_INIT only from the site's address).
    let attacker = inject::attach_wan_host(&bed, &topo, "atk", 200)?;
    let atk = attacker
        .ns
        .udp_socket(SocketAddr::new(attacker.addr.addr, 0))?;
    let neighbour = topo.sites[0].ns.udp_socket(SocketAddr::new(site_addr, 0))?;
    let send = |sock: &UdpSocket, to: SocketAddr, d: &[u8]| {
        sock.send_to(d, to).expect("send");
        // Pace the datagrams: the point is the gateway's handling, not its receive queue.
        std::thread::sleep(Duration::from_millis(20));
    };

    // IKE: truncated, random, bad lengths and chains.
    send(&atk, gw500, &[0x21; 10]);
    send(&atk, gw4500, &marked(&[0x21; 10]));
    send(&atk, gw4500, &marked(&auth[..auth.len() / 2]));
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut random: Vec<u8> = (0..64)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    random[17] = 0x70; // IKE major version 7
    send(&atk, gw500, &random);
    let mut short_len = auth.clone();
    let n = u32::try_from(auth.len() - 1).expect("small");
    short_len[24..28].copy_from_slice(&n.to_be_bytes());
    send(&atk, gw4500, &marked(&short_len));
    let mut bad_chain = delete.clone();
    bad_chain[30..32].copy_from_slice(&3u16.to_be_bytes()); // SK payload length 3 < 4
    send(&atk, gw4500, &marked(&bad_chain));
    // IKE_SA_INIT: garbage inside the SA payload; an unacceptable proposal; a replay of the
    // site's request from another address; a KE payload of the wrong group from the site.
    let garbage = message(
        0x0a0b_0c0d_0e0f_1011,
        0,
        SA,
        IKE_SA_INIT,
        FLAG_I,
        0,
        &payload(0, &[0xee; 12]),
    );
    send(&atk, gw500, &garbage);
    let des = init_request(
        0x1111,
        &[(1, 3, None), (2, 2, None), (3, 2, None), (4, 14, None)],
        14,
        256,
    );
    send(&atk, gw500, &des);
    send(&atk, gw500, &init);
    let wrong_ke = init_request(
        0x2222,
        &[(1, 20, Some(256)), (2, 5, None), (4, 31, None)],
        19,
        64,
    );
    send(&neighbour, gw500, &wrong_ke);
    // Replays of the site's requests, forged SK payloads, an unknown SPI, a keepalive on 500.
    send(&atk, gw4500, &marked(&auth));
    send(&atk, gw4500, &marked(&rekey));
    send(&atk, gw4500, &marked(&delete));
    let mut forged = delete.clone();
    let last = forged.len() - 1;
    forged[last] ^= 0x01;
    send(&atk, gw4500, &marked(&forged));
    let mut next_id = delete.clone();
    next_id[20..24].copy_from_slice(&4u32.to_be_bytes());
    send(&atk, gw4500, &marked(&next_id));
    let mut unknown = auth.clone();
    unknown[8..16].copy_from_slice(&0x0bad_0bad_0bad_0badu64.to_be_bytes());
    send(&atk, gw4500, &marked(&unknown));
    send(&atk, gw500, &[0xff]);

    // ESP: truncated (with a fresh sequence number), unknown SPI, random bytes, too short to be
    // anything, a replay, a forgery with a fresh sequence number, keepalives.
    let seq = u32::from_be_bytes([esp[4], esp[5], esp[6], esp[7]]);
    let mut short = esp[..16].to_vec();
    short[4..8].copy_from_slice(&(seq + 200_000).to_be_bytes());
    send(&atk, gw4500, &short);
    let mut stranger = vec![0x0b, 0xad, 0xc0, 0xde, 0, 0, 0, 1];
    stranger.extend_from_slice(&[0x5a; 60]);
    send(&atk, gw4500, &stranger);
    send(&atk, gw4500, &random);
    send(&atk, gw4500, &[1, 2, 3]);
    send(&atk, gw4500, &esp);
    let mut forged_esp = esp.clone();
    forged_esp[4..8].copy_from_slice(&(seq + 100_000).to_be_bytes());
    forged_esp[20] ^= 0x80;
    send(&atk, gw4500, &forged_esp);
    send(&atk, gw4500, &[0xff]);
    send(&atk, gw4500, &[0xff]);

    // The gateway answered the IKE_SA_INIT requests with the RFC's notifies, and nothing else.
    let got: Vec<Option<u16>> = answers(&atk, Duration::from_secs(5))
        .iter()
        .map(|a| notify_type(a))
        .collect();
    assert_eq!(
        got,
        vec![
            Some(INVALID_SYNTAX),
            Some(NO_PROPOSAL_CHOSEN),
            Some(NO_PROPOSAL_CHOSEN)
        ],
        "answers to the attacker"
    );
    let got = answers(&neighbour, Duration::from_secs(5));
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(notify_type(&got[0]), Some(INVALID_KE_PAYLOAD));
    assert_eq!(
        &got[0][36..],
        &31u16.to_be_bytes(),
        "the group the gateway wants"
    );

    // Exactly the expected counters moved.
    let want_ike: BTreeMap<String, u64> = [
        ("truncated", 3),
        ("malformed", 4),
        ("init_no_proposal", 2),
        ("init_invalid_ke", 1),
        ("outside_window", 2),
        ("retransmit_answered", 1),
        ("icv_failed", 2),
        ("unknown_spi", 1),
        ("nat_keepalive", 1),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let ike0 = counters(&before, "ike_drops");
    let esp0 = counters(&before, "drops");
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let now = gw.status_json()?;
        if delta(&counters(&now, "ike_drops"), &ike0) == want_ike || Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    std::thread::sleep(Duration::from_millis(500));
    let after = {
        let again = gw.status_json()?;
        assert_eq!(
            counters(&again, "ike_drops"),
            counters(&after, "ike_drops"),
            "IKE counters still moving"
        );
        again
    };
    assert_eq!(
        delta(&counters(&after, "ike_drops"), &ike0),
        want_ike,
        "ike_drops moved"
    );
    let esp_delta = delta(&counters(&after, "drops"), &esp0);
    let want_esp: BTreeMap<String, u64> = [
        ("esp_malformed", 1),
        ("esp_unknown_spi", 2),
        ("malformed_udp", 1),
        ("esp_replay", 1),
        ("esp_auth", 1),
        ("natt_keepalive", 2),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    // Only the reasons of the outer (UDP/ESP) path: the VXLAN side may count neighbour
    // discovery chatter of the cloud hosts meanwhile.
    let outer: BTreeMap<String, u64> = esp_delta
        .into_iter()
        .filter(|(k, _)| {
            !k.starts_with("vxlan_") && !k.starts_with("arp_") && !k.starts_with("neigh_")
        })
        .collect();
    assert_eq!(outer, want_esp, "drops moved");

    // Nothing else changed: the process runs, the same SAs are up on both ends, no half-open
    // SA was left, strongSwan noticed nothing, and every ping still passes.
    gw.process().check_running()?;
    assert_eq!(after["tunnels"][0]["state"], "established", "{after}");
    assert_eq!(identity(&after), identity(&before));
    // The live CHILD_SA counted the truncated, replayed and forged packets it was sent, and
    // decrypted nothing in between.
    assert_eq!(
        child_counter(&after, "drops_in") - child_counter(&before, "drops_in"),
        3
    );
    assert_eq!(
        child_counter(&after, "packets_in"),
        child_counter(&before, "packets_in")
    );
    assert_eq!(after["unmatched_ike_sas"], 0, "{after}");
    let swan_after = site.list_sas()?;
    assert_eq!(swan_after.len(), 1, "{swan_after:?}");
    let (b, a) = (&swan_before[0], &swan_after[0]);
    assert!(a.is_established(), "{a:?}");
    assert_eq!(
        (&a.initiator_spi, &a.responder_spi, a.unique_id),
        (&b.initiator_spi, &b.responder_spi, b.unique_id)
    );
    let spis = |s: &protego_testbed::strongswan::IkeSa| {
        s.children
            .iter()
            .map(|c| (c.spi_in.clone(), c.spi_out.clone(), c.state.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(spis(a), spis(b));
    let swan_log = site.log();
    let news = &swan_log[swan_log_len.min(swan_log.len())..];
    for bad in [
        "AUTHENTICATION_FAILED",
        "INVALID_SYNTAX",
        "NO_PROPOSAL_CHOSEN",
        "deleting IKE_SA",
        "closing CHILD_SA",
        "retransmit 1 of request",
        "failed",
        "invalid",
        "sending keep alive",
    ] {
        assert!(!news.contains(bad), "strongSwan logged {bad:?}:\n{news}");
    }
    ping_all_vms(&topo, 0, 20)?;
    let last = gw.status_json()?;
    assert_eq!(
        delta(
            &counters(&last, "ike_drops"),
            &counters(&after, "ike_drops")
        ),
        BTreeMap::new(),
        "valid traffic after the attack is not dropped"
    );
    eprintln!("{}", gw.status_text()?);
    bed.teardown()?;
    Ok(())
}

/// What identifies the tunnel's IKE SAs and CHILD_SAs in a status document (not counters or
/// ages): SPIs, state, addresses, proposals and selectors.
fn identity(status: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for sa in status["tunnels"][0]["ike_sas"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for k in [
            "spi_i",
            "spi_r",
            "state",
            "local",
            "remote",
            "proposal",
            "initiator",
        ] {
            out.push(format!("{k}={}", sa[k]));
        }
        for c in sa["children"].as_array().into_iter().flatten() {
            for k in ["spi_in", "spi_out", "proposal", "local_ts", "remote_ts"] {
                out.push(format!("child {k}={}", c[k]));
            }
        }
    }
    out
}

/// A counter of the tunnel's only CHILD_SA.
fn child_counter(status: &serde_json::Value, key: &str) -> u64 {
    status["tunnels"][0]["ike_sas"][0]["children"][0][key]
        .as_u64()
        .unwrap_or_else(|| panic!("no child {key} in {status}"))
}
