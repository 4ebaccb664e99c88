//! Interop of Protego's negotiation details with real strongSwan 5.9, each checked on the wire
//! with tshark as an independent decoder:
//! - the key log (`key_log`, Wireshark's IKEv2 decryption table and ESP SA table) decrypts
//!   IKE (RFC 7296 §3.14) and ESP in UDP (RFC 4303, RFC 3948), across CHILD_SA and IKE SA
//!   rekeys (§2.8), for SAs either side created, and nothing is written with it off;
//! - COOKIE (§2.6) both ways: Protego demands one and strongSwan follows, strongSwan demands
//!   one and Protego follows;
//! - INVALID_KE_PAYLOAD (§1.2, §1.3, §2.7) both ways in IKE_SA_INIT and in PFS CHILD_SA rekeys;
//! - COOKIE followed by INVALID_KE_PAYLOAD in one IKE_SA_INIT (§2.6.1), both ways.

mod common;
mod negotiation;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use negotiation::*;

use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::strongswan::CharonSettings;
use protego_testbed::topology::GATEWAY_ID;
use protego_testbed::traffic::Tshark;
use protego_testbed::{Result, Testbed, Topology};

/// strongSwan initiates, rekeys the CHILD_SA, the IKE SA and the CHILD_SA again, pinging in
/// between, then deletes the IKE SA. With Protego's key log tshark decrypts every IKE message
/// (identities, selectors, REKEY_SA, the new SPIs, Delete payloads) of both IKE SAs and every
/// ESP packet of the three CHILD_SAs down to the inner ICMP. The files are private; a gateway
/// without `key_log` writes none.
#[test]
fn tshark_decodes_ike_and_esp_with_the_key_log() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let keys = bed.dir().join("keys");
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &[key_log_line(&keys)],
    )?;
    assert!(
        gw.log().contains("key_log"),
        "Protego must warn that the key log is on:\n{}",
        gw.log()
    );
    let cap = wan_capture(&topo, "keylog")?;
    let site = site_charon(&topo, &tun)?;
    let s = &topo.sites[0];

    // Three CHILD_SA generations, the last under the rekeyed IKE SA; 10 pings on each.
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    let old_ike = site.list_sas()?[0].clone();
    ping_all_vms(&topo, 0, 5)?;
    site.rekey_child("net")?;
    let second = site.wait_child_rekeyed("net", &first.spi_in, UP)?;
    ping_all_vms(&topo, 0, 5)?;
    site.rekey_ike(&old_ike.name)?;
    let new_ike = wait_ike_replaced(&site, &old_ike.initiator_spi, false, UP)?;
    site.rekey_child("net")?;
    let third = site.wait_child_rekeyed("net", &second.spi_in, UP)?;
    ping_all_vms(&topo, 0, 5)?;
    site.terminate_ike(&new_ike.name, UP)?;
    let pcap = cap.stop();
    let generations = [
        Generation::from(&first),
        Generation::from(&second),
        Generation::from(&third),
    ];

    // The key log: a private directory, one IKE line per IKE SA, two ESP lines per CHILD_SA.
    assert_eq!(mode(&keys), 0o700, "key log directory");
    for f in [IKE_TABLE, ESP_TABLE] {
        assert_eq!(mode(&keys.join(f)), 0o600, "{f}");
    }
    let ike_lines = read_lines(&keys.join(IKE_TABLE));
    assert_eq!(ike_lines.len(), 2, "{ike_lines:?}");
    for (sa, line) in [&old_ike, &new_ike].iter().zip(&ike_lines) {
        assert!(
            line.starts_with(&format!("{},{},", sa.initiator_spi, sa.responder_spi)),
            "IKE SA {}/{} vs {line}",
            sa.initiator_spi,
            sa.responder_spi
        );
    }
    let esp_lines = read_lines(&keys.join(ESP_TABLE));
    assert_eq!(esp_lines.len(), 6, "{esp_lines:?}");
    for g in &generations {
        for spi in [&g.site_in, &g.site_out] {
            assert!(
                esp_lines
                    .iter()
                    .any(|l| l.contains(&format!("\"0x{spi}\""))),
                "SPI {spi} missing from {esp_lines:?}"
            );
        }
    }

    // Without the keys tshark sees only ciphertext: the capture is worth checking.
    let plain = Tshark::new();
    assert_eq!(plain.count(&pcap, "isakmp.enc.decrypted || icmp")?, 0);

    let tshark = Tshark::with_keys(&keys);
    let msgs = ike_messages(&tshark, &pcap)?;
    let all = describe(&msgs);
    let site_addr = s.addr.addr.to_string();
    let gw_addr = topo.gateway.wan.addr.to_string();

    // Every encrypted message of both IKE SAs is decrypted with a correct ICV.
    let encrypted: Vec<&IkeMsg> = msgs.iter().filter(|m| m.exchange != IKE_SA_INIT).collect();
    assert!(encrypted.len() >= 16, "{all}");
    assert!(encrypted.iter().all(|m| m.decrypted), "{all}");
    assert_eq!(
        tshark.count(&pcap, "isakmp.ikev2.integrity_checksum")?,
        0,
        "an IKE ICV did not verify"
    );

    // IKE_AUTH: both identities and the configured selectors are visible.
    let auth_req = msgs
        .iter()
        .find(|m| m.exchange == IKE_AUTH && !m.response)
        .unwrap_or_else(|| panic!("no IKE_AUTH request:\n{all}"));
    let auth_resp = msgs
        .iter()
        .find(|m| m.exchange == IKE_AUTH && m.response)
        .unwrap_or_else(|| panic!("no IKE_AUTH response:\n{all}"));
    assert_eq!(auth_req.src, site_addr);
    assert_eq!(auth_req.ids, [topo.site_id(0), GATEWAY_ID.to_owned()]);
    assert_eq!(auth_resp.src, gw_addr);
    assert_eq!(auth_resp.ids, [GATEWAY_ID]);
    for m in [auth_req, auth_resp] {
        assert_ts(m);
    }
    // Protego's ESP SPI in its answer is the one the site sends with.
    assert_eq!(auth_req.spis, [first.spi_in.as_str()]);
    assert_eq!(auth_resp.spis, [first.spi_out.as_str()]);

    // CHILD_SA rekeys: REKEY_SA naming the old SA, the configured selectors, Protego's new SPI.
    let child_rekeys: Vec<&IkeMsg> = msgs
        .iter()
        .filter(|m| m.exchange == CREATE_CHILD_SA && m.proposal_protocols == [PROTO_ESP])
        .collect();
    assert_eq!(child_rekeys.len(), 4, "{all}");
    for (pair, (old, new)) in child_rekeys.chunks(2).zip([
        (&generations[0], &generations[1]),
        (&generations[1], &generations[2]),
    ]) {
        let (req, resp) = (pair[0], pair[1]);
        assert!(!req.response && resp.response, "{all}");
        // The REKEY_SA notify's SPI (the site's old inbound SPI), then the new proposal's.
        assert!(
            req.notifies.contains(&REKEY_SA),
            "frame {}: {req:?}",
            req.frame
        );
        assert_eq!(
            req.spis,
            [old.site_in.clone(), new.site_in.clone()],
            "frame {}",
            req.frame
        );
        assert_eq!(resp.spis, [new.site_out.as_str()], "frame {}", resp.frame);
        for m in [req, resp] {
            assert_ts(m);
        }
    }

    // The IKE SA rekey carries the new SPIs, and the new IKE SA's messages decrypt too.
    let ike_rekey: Vec<&IkeMsg> = msgs
        .iter()
        .filter(|m| m.exchange == CREATE_CHILD_SA && m.proposal_protocols == [PROTO_IKE])
        .collect();
    assert_eq!(ike_rekey.len(), 2, "{all}");
    assert_eq!(ike_rekey[0].ispi, old_ike.initiator_spi);
    assert_eq!(ike_rekey[0].spis, [new_ike.initiator_spi.as_str()]);
    assert_eq!(ike_rekey[1].spis, [new_ike.responder_spi.as_str()]);
    assert!(ike_rekey[0].ke_group.is_some() && ike_rekey[1].ke_group == ike_rekey[0].ke_group);
    let on_new: Vec<&IkeMsg> = msgs
        .iter()
        .filter(|m| m.ispi == new_ike.initiator_spi && m.rspi == new_ike.responder_spi)
        .collect();
    assert!(
        on_new
            .iter()
            .any(|m| m.exchange == CREATE_CHILD_SA && m.ts_start == TS_START),
        "no decrypted CREATE_CHILD_SA on the new IKE SA:\n{all}"
    );

    // INFORMATIONAL: the Delete payloads of both rekeys and of the final termination.
    let deletes: Vec<(&str, bool, Vec<u32>, Vec<String>)> = msgs
        .iter()
        .filter(|m| m.exchange == INFORMATIONAL && !m.deletes.is_empty())
        .map(|m| {
            (
                m.ispi.as_str(),
                m.response,
                m.deletes.clone(),
                m.delete_spis.clone(),
            )
        })
        .collect();
    for (old, ike) in [(&generations[0], &old_ike), (&generations[1], &new_ike)] {
        assert!(
            deletes.contains(&(
                ike.initiator_spi.as_str(),
                false,
                vec![PROTO_ESP],
                vec![old.site_in.clone()]
            )),
            "the site's delete of {} missing: {deletes:?}",
            old.site_in
        );
        assert!(
            deletes.contains(&(
                ike.initiator_spi.as_str(),
                true,
                vec![PROTO_ESP],
                vec![old.site_out.clone()]
            )),
            "Protego's delete of {} missing: {deletes:?}",
            old.site_out
        );
    }
    for ike in [&old_ike, &new_ike] {
        assert!(
            deletes.contains(&(ike.initiator_spi.as_str(), false, vec![PROTO_IKE], vec![])),
            "delete of IKE SA {} missing: {deletes:?}",
            ike.initiator_spi
        );
    }

    // ESP in UDP: every packet decrypts to ICMP with a good ICV, requests from the site's LAN
    // to the VMs and replies back, in both directions on every CHILD_SA generation.
    let esp = esp_packets(&tshark, &pcap)?;
    assert!(
        esp.iter().all(|p| p.icv_good && p.icmp_type.is_some()),
        "{esp:?}"
    );
    let lan = s.lan_addr.to_string();
    let vms: BTreeSet<String> = topo.tenants[0]
        .vms
        .iter()
        .map(|v| v.addr.addr.to_string())
        .collect();
    let requests: Vec<&EspPacket> = esp.iter().filter(|p| p.icmp_type == Some(8)).collect();
    let replies: Vec<&EspPacket> = esp.iter().filter(|p| p.icmp_type == Some(0)).collect();
    assert_eq!((requests.len(), replies.len()), (30, 30), "{esp:?}");
    for p in &requests {
        assert_eq!(
            (p.outer_src.as_str(), p.outer_dst.as_str()),
            (site_addr.as_str(), gw_addr.as_str())
        );
        assert_eq!(p.inner_src.as_deref(), Some(lan.as_str()));
        assert!(
            p.inner_dst.as_ref().is_some_and(|d| vms.contains(d)),
            "{p:?}"
        );
    }
    for p in &replies {
        assert_eq!(
            (p.outer_src.as_str(), p.outer_dst.as_str()),
            (gw_addr.as_str(), site_addr.as_str())
        );
        assert!(
            p.inner_src.as_ref().is_some_and(|d| vms.contains(d)),
            "{p:?}"
        );
        assert_eq!(p.inner_dst.as_deref(), Some(lan.as_str()));
    }
    for g in &generations {
        let on = |spi: &str, ps: &[&EspPacket]| {
            ps.iter().filter(|p| p.spi == format!("0x{spi}")).count()
        };
        assert!(
            on(&g.site_out, &requests) >= 1,
            "no decrypted request on {}: {esp:?}",
            g.site_out
        );
        assert!(
            on(&g.site_in, &replies) >= 1,
            "no decrypted reply on {}: {esp:?}",
            g.site_in
        );
    }
    assert_ike_drops(&gw, &[])?;
    site.stop();
    gw.stop();

    // With key_log off nothing is written: no table anywhere but in the first gateway's DIR,
    // and that one does not grow.
    let gw2 = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let site2 = site_charon_with(
        &topo,
        &tun,
        "site0-nokeys",
        &CharonSettings::default(),
        |_| {},
    )?;
    site2.initiate("net", UP)?;
    site2.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 3)?;
    assert!(!gw2.log().contains("key_log"), "{}", gw2.log());
    for f in [IKE_TABLE, ESP_TABLE] {
        assert_eq!(find_named(bed.dir(), f), [keys.join(f)], "{f}");
    }
    assert_eq!(read_lines(&keys.join(IKE_TABLE)), ike_lines);
    assert_eq!(read_lines(&keys.join(ESP_TABLE)), esp_lines);
    assert_ike_drops(&gw2, &[])?;
    bed.teardown()?;
    Ok(())
}

/// `cookie_threshold = 0`: Protego answers every IKE_SA_INIT with a COOKIE (RFC 7296 §2.6);
/// strongSwan retries with it, the tunnel comes up and carries traffic.
#[test]
fn strongswan_follows_protegos_cookie() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &["cookie_threshold = 0".to_owned()],
    )?;
    let cap = wan_capture(&topo, "cookie")?;
    let site = site_charon(&topo, &tun)?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let init = init_exchange(&msgs, &topo.sites[0].addr.addr.to_string(), 500);
    assert_cookie_round(&init, &all);
    let sas = site.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(sas[0].initiator_spi, init[0].ispi);
    assert_eq!(tunnel_status(&gw, &tun.name)?["state"], "established");
    assert_ike_drops(&gw, &[("init_cookie_demanded", 1)])?;
    bed.teardown()?;
    Ok(())
}

/// strongSwan as responder with `cookie_threshold_ip = 1` and one half-open IKE SA from the
/// gateway's address demands a COOKIE from Protego; Protego retries with it (RFC 7296 §2.6).
#[test]
fn protego_follows_strongswans_cookie() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    let settings = cookie_demanding_settings();
    let site = site_charon_with(&topo, &tun, "site0-cookies", &settings, |_| {})?;
    let cap = wan_capture(&topo, "cookie-rev")?;
    // A half-open IKE SA from the gateway's address (strongSwan keeps it for 30 s) puts
    // strongSwan over its per-IP threshold.
    open_half_open_sa(&topo, 0)?;
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let init = init_exchange(&msgs, &topo.gateway.wan.addr.to_string(), 500);
    assert_cookie_round(&init, &all);
    assert!(
        site.log().contains("IKE_SA_INIT response 0 [ N(COOKIE) ]"),
        "strongSwan did not log its COOKIE"
    );
    let sas = site.list_sas()?;
    let ours: Vec<_> = sas.iter().filter(|sa| sa.is_established()).collect();
    assert_eq!(ours.len(), 1, "{sas:?}");
    assert_eq!(ours[0].initiator_spi, init[0].ispi);
    assert_eq!(tunnel_status(&gw, &tun.name)?["state"], "established");
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}

/// strongSwan offers x25519 first and ECP-256 in a later proposal; Protego accepts only
/// ECP-256, answers INVALID_KE_PAYLOAD naming it, strongSwan retries and the SA uses it.
#[test]
fn strongswan_retries_with_the_group_protego_names() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.proposals = vec!["aes128gcm16-prfsha256-ecp256".into()];
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    let cap = wan_capture(&topo, "invalid-ke")?;
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-ke",
        &CharonSettings::default(),
        |conn| {
            conn.proposals = vec![
                "aes256gcm16-prfsha256-x25519".into(),
                "aes128gcm16-prfsha256-ecp256".into(),
            ];
        },
    )?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let sas = site.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("ECP_256"),
        "{sas:?}"
    );
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let site_addr = topo.sites[0].addr.addr.to_string();
    let init: Vec<&IkeMsg> = msgs.iter().filter(|m| m.exchange == IKE_SA_INIT).collect();
    assert_invalid_ke_round(&init, X25519, ECP_256, &all);
    assert_eq!(init[0].src, site_addr);
    eprintln!(
        "strongSwan's retry after INVALID_KE_PAYLOAD: SPI {} -> {} (same SPI: {})",
        init[0].ispi,
        init[2].ispi,
        init[0].ispi == init[2].ispi
    );
    assert_ike_drops(&gw, &[("init_invalid_ke", 1)])?;
    bed.teardown()?;
    Ok(())
}

/// Protego offers x25519 first and ECP-384 in its second proposal; strongSwan accepts only
/// ECP-384 and answers INVALID_KE_PAYLOAD; Protego retries with ECP-384 (same SPI).
#[test]
fn protego_retries_with_the_group_strongswan_names() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    tun.proposals = vec![
        "aes256gcm16-prfsha256-x25519".into(),
        "aes256gcm16-prfsha384-ecp384".into(),
    ];
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-ke",
        &CharonSettings::default(),
        |conn| {
            conn.proposals = vec!["aes256gcm16-prfsha384-ecp384".into()];
        },
    )?;
    let cap = wan_capture(&topo, "invalid-ke-rev")?;
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let sas = site.list_sas()?;
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("ECP_384"),
        "{sas:?}"
    );
    assert_eq!(
        sas[0].fields.get("prf-alg").map(String::as_str),
        Some("PRF_HMAC_SHA2_384"),
        "{sas:?}"
    );
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let init: Vec<&IkeMsg> = msgs.iter().filter(|m| m.exchange == IKE_SA_INIT).collect();
    assert_invalid_ke_round(&init, X25519, ECP_384, &all);
    assert_eq!(init[0].src, topo.gateway.wan.addr.to_string());
    assert_eq!(init[2].ispi, init[0].ispi, "Protego keeps its SPI:\n{all}");
    assert_eq!(sas[0].initiator_spi, init[0].ispi);
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}

/// strongSwan rekeys the CHILD_SA with PFS, its first ESP proposal naming MODP-2048 while
/// Protego accepts only x25519: Protego answers INVALID_KE_PAYLOAD inside CREATE_CHILD_SA
/// (RFC 7296 §1.3), strongSwan retries with x25519. The key log lets tshark see it all.
#[test]
fn child_rekey_invalid_ke_protego_responder() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.esp_proposals = vec!["aes256gcm16-x25519".into()];
    let keys = bed.dir().join("keys");
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &[key_log_line(&keys)],
    )?;
    let cap = wan_capture(&topo, "child-ke")?;
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-pfs",
        &CharonSettings::default(),
        |conn| {
            conn.children[0].esp_proposals =
                vec!["aes256gcm16-modp2048".into(), "aes256gcm16-x25519".into()];
        },
    )?;
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    site.rekey_child("net")?;
    let second = site.wait_child_rekeyed("net", &first.spi_in, UP)?;
    assert_eq!(
        second.fields.get("dh-group").map(String::as_str),
        Some("CURVE_25519"),
        "{second:?}"
    );
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let msgs = ike_messages(&Tshark::with_keys(&keys), &pcap)?;
    let all = describe(&msgs);
    assert_child_invalid_ke(&msgs, MODP_2048, X25519, &all);
    let (req, _) = child_rekey_pairs(&msgs)[0];
    assert_eq!(req.src, topo.sites[0].addr.addr.to_string(), "{all}");
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}

/// Protego rekeys the CHILD_SA with PFS (`child_rekey_time`), offering x25519 first and ECP-384
/// second; strongSwan accepts only ECP-384 and answers INVALID_KE_PAYLOAD; Protego retries.
#[test]
fn child_rekey_invalid_ke_protego_initiator() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.esp_proposals = vec!["aes256gcm16-x25519".into(), "aes256gcm16-ecp384".into()];
    tun.extra = vec![
        "child_rekey_time = \"5s\"".into(),
        "life_time = \"60s\"".into(),
        "rand_time = \"0s\"".into(),
    ];
    let keys = bed.dir().join("keys");
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &[key_log_line(&keys)],
    )?;
    let cap = wan_capture(&topo, "child-ke-rev")?;
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-pfs",
        &CharonSettings::default(),
        |conn| {
            conn.children[0].esp_proposals = vec!["aes256gcm16-ecp384".into()];
        },
    )?;
    site.initiate("net", UP)?;
    let first = site.wait_child_installed("net", UP)?;
    let second = site.wait_child_rekeyed("net", &first.spi_in, Duration::from_secs(30))?;
    assert_eq!(
        second.fields.get("dh-group").map(String::as_str),
        Some("ECP_384"),
        "{second:?}"
    );
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let msgs = ike_messages(&Tshark::with_keys(&keys), &pcap)?;
    let all = describe(&msgs);
    assert_child_invalid_ke(&msgs, X25519, ECP_384, &all);
    let (req, _) = child_rekey_pairs(&msgs)[0];
    assert_eq!(req.src, topo.gateway.wan.addr.to_string(), "{all}");
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}

/// Protego initiates and then rekeys on its own (short `rekey_time` and `child_rekey_time`):
/// the key log lines of IKE SAs and CHILD_SAs that Protego created as initiator, and of the
/// IKE SA it created by rekeying, decrypt everything too.
#[test]
fn tshark_decodes_protego_initiated_sas_with_the_key_log() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    tun.extra = vec![
        "rekey_time = \"6s\"".into(),
        // The default hard limit (10 % of rekey_time) would be 0.6 s: room for a slow rekey.
        "over_time = \"30s\"".into(),
        "child_rekey_time = \"4s\"".into(),
        "life_time = \"60s\"".into(),
        "rand_time = \"0s\"".into(),
    ];
    let site = site_charon(&topo, &tun)?;
    let cap = wan_capture(&topo, "keylog-init")?;
    let keys = bed.dir().join("keys");
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &[key_log_line(&keys)],
    )?;
    let first = site.wait_child_installed("net", UP)?;
    let original = site.list_sas()?[0].clone();
    ping_all_vms(&topo, 0, 5)?;
    site.wait_child_rekeyed("net", &first.spi_in, UP)?;
    let rekeyed = wait_ike_replaced(&site, &original.initiator_spi, true, UP)?;
    // One more CHILD_SA rekey, now under the rekeyed IKE SA.
    let current = rekeyed
        .installed("net")
        .next()
        .expect("checked above")
        .spi_in
        .clone();
    site.wait_child_rekeyed("net", &current, UP)?;
    ping_all_vms(&topo, 0, 5)?;
    let pcap = cap.stop();
    // Protego was the initiator of both IKE SAs (RFC 7296 §2.18: the rekey's initiator is the
    // new SA's initiator).
    assert!(
        !original.initiator && !rekeyed.initiator,
        "{original:?} {rekeyed:?}"
    );
    let tshark = Tshark::with_keys(&keys);
    let msgs = ike_messages(&tshark, &pcap)?;
    let all = describe(&msgs);
    let gw_addr = topo.gateway.wan.addr.to_string();
    assert!(
        msgs.iter().any(|m| m.exchange == CREATE_CHILD_SA
            && !m.response
            && m.src == gw_addr
            && m.proposal_protocols == [PROTO_IKE]
            && m.decrypted),
        "no decrypted IKE rekey from Protego:\n{all}"
    );
    assert!(
        msgs.iter()
            .any(|m| m.ispi == rekeyed.initiator_spi && m.decrypted),
        "nothing decrypted on the rekeyed IKE SA:\n{all}"
    );
    assert!(
        msgs.iter()
            .filter(|m| m.exchange != IKE_SA_INIT)
            .all(|m| m.decrypted),
        "{all}"
    );
    assert_eq!(tshark.count(&pcap, "isakmp.ikev2.integrity_checksum")?, 0);
    let esp = esp_packets(&tshark, &pcap)?;
    assert!(esp.len() >= 40, "{esp:?}");
    assert!(
        esp.iter().all(|p| p.icv_good && p.icmp_type.is_some()),
        "{esp:?}"
    );
    let spis: BTreeSet<&str> = esp.iter().map(|p| p.spi.as_str()).collect();
    assert!(
        spis.len() >= 4,
        "two CHILD_SA generations carried traffic: {spis:?}"
    );
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}

/// RFC 7296 §2.6.1, Protego responding: it demands a COOKIE (`cookie_threshold = 0`) and
/// accepts only ECP-256 while strongSwan starts with x25519. Both retries happen and the SA
/// comes up with ECP-256; every retry after the COOKIE carries it.
#[test]
fn cookie_then_invalid_ke_protego_responder() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.proposals = vec!["aes128gcm16-prfsha256-ecp256".into()];
    let gw = ProtegoGateway::start(
        &bed,
        &topo,
        std::slice::from_ref(&tun),
        &["cookie_threshold = 0".to_owned()],
    )?;
    let cap = wan_capture(&topo, "cookie-ke")?;
    let site = site_charon_with(
        &topo,
        &tun,
        "site0-ck",
        &CharonSettings::default(),
        |conn| {
            conn.proposals = vec![
                "aes256gcm16-prfsha256-x25519".into(),
                "aes128gcm16-prfsha256-ecp256".into(),
            ];
        },
    )?;
    site.initiate("net", UP)?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let sas = site.list_sas()?;
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("ECP_256"),
        "{sas:?}"
    );
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let init: Vec<&IkeMsg> = msgs.iter().filter(|m| m.exchange == IKE_SA_INIT).collect();
    assert_cookie_then_invalid_ke(&init, X25519, ECP_256, &all);
    assert_ike_drops(&gw, &[("init_cookie_demanded", 1), ("init_invalid_ke", 1)])?;
    bed.teardown()?;
    Ok(())
}

/// RFC 7296 §2.6.1, Protego initiating: strongSwan demands a COOKIE and accepts only
/// ECP-384 while Protego starts with x25519. Protego keeps the cookie in its INVALID_KE retry.
#[test]
fn cookie_then_invalid_ke_protego_initiator() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let mut tun = GatewayTunnel::for_site(&topo, 0, PSK);
    tun.start_action = "start";
    tun.proposals = vec![
        "aes256gcm16-prfsha256-x25519".into(),
        "aes256gcm16-prfsha384-ecp384".into(),
    ];
    let settings = cookie_demanding_settings();
    let site = site_charon_with(&topo, &tun, "site0-ck", &settings, |conn| {
        conn.proposals = vec![
            "aes256gcm16-prfsha384-ecp384".into(),
            "aes256gcm16-prfsha256-x25519".into(),
        ];
    })?;
    let cap = wan_capture(&topo, "cookie-ke-rev")?;
    open_half_open_sa(&topo, 0)?;
    let gw = ProtegoGateway::start(&bed, &topo, std::slice::from_ref(&tun), &[])?;
    site.wait_child_installed("net", UP)?;
    ping_all_vms(&topo, 0, 10)?;
    let pcap = cap.stop();
    let sas: Vec<_> = site
        .list_sas()?
        .into_iter()
        .filter(|sa| sa.is_established())
        .collect();
    assert_eq!(sas.len(), 1, "{sas:?}");
    assert_eq!(
        sas[0].fields.get("dh-group").map(String::as_str),
        Some("ECP_384"),
        "{sas:?}"
    );
    let msgs = ike_messages(&Tshark::new(), &pcap)?;
    let all = describe(&msgs);
    let init = init_exchange(&msgs, &topo.gateway.wan.addr.to_string(), 500);
    assert_cookie_then_invalid_ke(&init, X25519, ECP_384, &all);
    assert_ike_drops(&gw, &[])?;
    bed.teardown()?;
    Ok(())
}
