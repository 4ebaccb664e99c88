//! Customer attachments in the distributed form over in-memory links: steered once their
//! steer node announces the port, moved by migrate, drain and loss as steering flips, CE MACs
//! passed on.

use super::*;

const PORT_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x11];

/// Attachment "acme" on steer1's eth2, Q-in-Q 100/20, in the test VNet.
fn acme() -> datapath::AttachmentConfig {
    datapath::AttachmentConfig {
        name: "acme".into(),
        tenant: ids::TenantId::new("a").unwrap(),
        vnet: "vnet".into(),
        port: datapath::AttachmentPort::Interface("eth2".into()),
        tags: datapath::AttachmentTags::QinQ {
            s_tag: 100,
            c_tag: 20,
        },
        gateway_ip: "10.99.0.1".parse().unwrap(),
        ce_ip: Some("10.99.0.2".parse().unwrap()),
        routes: vec![
            ("10.99.0.0".parse().unwrap(), 24),
            ("192.168.50.0".parse().unwrap(), 24),
        ],
        ce_mac: None,
    }
}

impl Bed {
    /// Registers a steer node announcing customer port 1 on `interface`.
    fn join_steer_with_port(&mut self, name: &str, interface: &str) -> u32 {
        let link = Arc::new(FakeLink::default());
        self.links.insert(name.into(), Arc::clone(&link));
        let addr = format!("10.0.0.{}:6081", 20 + self.links.len())
            .parse()
            .unwrap();
        let mut r = registration(name, Role::Steer, addr, 1, Vec::new());
        r.ports = vec![PortInfo {
            id: 1,
            interface: interface.into(),
            mac: PORT_MAC,
        }];
        self.cluster.register(r, link)
    }
}

/// The attachments of the last `set_attachments` in `ops`.
fn last_attachments(ops: &[Op]) -> Option<pb::Attachments> {
    ops.iter().rev().find_map(|op| match op {
        Op::SetAttachments(a) => Some(a.clone()),
        _ => None,
    })
}

/// The port tags set in `ops`: (port, s_tag, c_tag, node).
fn port_tags(ops: &[Op]) -> Vec<(u32, u32, u32, u32)> {
    ops.iter()
        .filter_map(|op| match op {
            Op::SetPortTag(t) => Some((t.port, t.s_tag, t.c_tag, t.node)),
            _ => None,
        })
        .collect()
}

/// The (attachment, node, dst) of the attachment selectors that lead the last selector update
/// of `ops`.
fn attachment_selectors(ops: &[Op]) -> Vec<(u32, u32, String)> {
    let last = ops
        .iter()
        .rev()
        .find_map(|op| match op {
            Op::SetSelectors(v) => Some(v.clone()),
            _ => None,
        })
        .expect("a selector update");
    last.selectors
        .iter()
        .map_while(|s| Some((s.attachment?, s.node, s.dst_start.clone())))
        .collect()
}

/// A bed with steer1 (port eth2) and steer2 (no ports), data1 and data2, and "acme"
/// configured; returns (steer1, data1, data2) ids and the serving node.
fn attached_bed() -> (Bed, u32, u32, u32, u32) {
    let mut b = bed();
    b.cluster.set_attachments(
        &[acme()],
        &[("acme".to_string(), "steer1".to_string())].into(),
    );
    let d1 = b.join("data1", Role::Data, 1);
    let d2 = b.join("data2", Role::Data, 1);
    // Not steerable yet: the data nodes hold nothing of it, and status says so.
    let ops = b.ops("data1");
    assert!(matches!(&ops[0], Op::DataConfig(_)));
    assert!(matches!(&ops[1], Op::SetAttachments(a) if a.attachments.is_empty()));
    assert_eq!(b.cluster.describe()["attachments"][0]["steered"], false);
    assert!(matches!(
        b.cluster.migrate_attachment("acme", "data1"),
        Err(ClusterError::Unsteered { .. })
    ));
    b.join("steer2", Role::Steer, 1);
    let s1 = b.join_steer_with_port("steer1", "eth2");
    let serving = b.cluster.state().core.attachments()[&1]
        .node
        .expect("placed once its port is known");
    assert!(serving == d1 || serving == d2);
    (b, s1, d1, d2, serving)
}

#[test]
fn an_attachment_is_steered_once_its_steer_node_announces_the_port() {
    let (b, s1, d1, _d2, serving) = attached_bed();
    // Every data node holds it, on steer1's port.
    for data in ["data1", "data2"] {
        let a = last_attachments(&b.ops(data)).expect("set_attachments");
        assert_eq!(a.attachments.len(), 1);
        let a = &a.attachments[0];
        assert_eq!(
            (a.name.as_str(), a.port, a.s_tag, a.c_tag),
            ("acme", 1, Some(100), 20)
        );
        assert_eq!(a.port_mac, PORT_MAC);
        let steer1 = b.cluster.state().core.node(s1).unwrap().geneve;
        assert_eq!(a.steer_geneve, steer1.to_string());
    }
    // steer1's tables tag its port; both steer nodes send the CE's prefixes to the serving
    // node, first in the VNI's list.
    let t1 = b.last_tables("steer1");
    let tags: Vec<_> = t1
        .attachments
        .iter()
        .map(|t| (t.port, t.s_tag, t.c_tag, t.node, t.attachment))
        .collect();
    assert_eq!(tags, [(1, 100, 20, serving, 1)]);
    let first: Vec<_> = t1.vnis[0]
        .selectors
        .iter()
        .map_while(|s| Some((s.attachment?, s.node, s.dst_start.clone(), s.tunnel)))
        .collect();
    assert_eq!(
        first,
        [
            (1, serving, "10.99.0.0".to_string(), 0),
            (1, serving, "192.168.50.0".to_string(), 0)
        ]
    );
    let s2 = b.ops("steer2");
    assert!(port_tags(&s2).is_empty(), "steer2 owns no port");
    assert_eq!(attachment_selectors(&s2).len(), 2);
    let status = b.cluster.describe();
    let a = &status["attachments"][0];
    assert_eq!(
        (a["steered"].as_bool(), a["port"].as_u64()),
        (Some(true), Some(1))
    );
    let name = if serving == d1 { "data1" } else { "data2" };
    assert_eq!(a["node"], name);
    assert_eq!(
        (a["s_tag"].as_u64(), a["c_tag"].as_u64()),
        (Some(100), Some(20))
    );
    assert_eq!(a["from_ce_frames"], 0, "nothing reported yet");
}

#[test]
fn an_attachments_frames_as_its_steer_node_reports_them_show_in_status() {
    let (b, s1, _d1, _d2, _serving) = attached_bed();
    let traffic = |attachment, c_tag| AttachmentTraffic {
        attachment,
        port: 1,
        s_tag: 100,
        c_tag,
        from_ce_frames: 7,
        from_ce_bytes: 700,
        to_ce_frames: 5,
        to_ce_bytes: 420,
        dropped: 2,
    };
    b.cluster.report(
        s1,
        NodeLoad {
            interval_ms: 1000,
            // Acme's, and a stale pair of another id (e.g. from before a control restart).
            attachments: vec![traffic(1, 20), traffic(9, 21)],
            ..NodeLoad::default()
        },
    );
    let status = b.cluster.describe();
    let a = &status["attachments"][0];
    assert_eq!(a["name"], "acme");
    let got: Vec<_> = [
        "from_ce_frames",
        "from_ce_bytes",
        "to_ce_frames",
        "to_ce_bytes",
        "dropped",
    ]
    .iter()
    .map(|f| a[f].as_u64())
    .collect();
    assert_eq!(got, [Some(7), Some(700), Some(5), Some(420), Some(2)]);
    // The steer node's own load lists what it reported, by id and tag pair.
    let steer1 = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "steer1")
        .unwrap();
    let listed = &steer1["load"]["attachments"];
    assert_eq!(listed.as_array().map(Vec::len), Some(2));
    assert_eq!(
        (
            listed[0]["attachment"].as_u64(),
            listed[0]["c_tag"].as_u64()
        ),
        (Some(1), Some(20))
    );
    // A report without acme's pair: back to zero.
    b.cluster.report(s1, NodeLoad::default());
    assert_eq!(b.cluster.describe()["attachments"][0]["from_ce_frames"], 0);
}

#[test]
fn migrate_drain_and_loss_flip_the_steering() {
    let (b, _s1, d1, d2, serving) = attached_bed();
    let (other, other_name, serving_name) = if serving == d1 {
        (d2, "data2", "data1")
    } else {
        (d1, "data1", "data2")
    };
    b.clear();
    // migrate: the owning steer node's port tag and every steer node's selectors flip; the
    // data nodes are told nothing (they hold it already).
    assert_eq!(
        b.cluster.migrate_attachment("acme", other_name).unwrap(),
        other
    );
    let s1 = b.ops("steer1");
    assert_eq!(port_tags(&s1), [(1, 100, 20, other)]);
    assert!(attachment_selectors(&s1).iter().all(|s| s.1 == other));
    let s2 = b.ops("steer2");
    assert!(port_tags(&s2).is_empty());
    assert!(attachment_selectors(&s2).iter().all(|s| s.1 == other));
    assert!(b.ops("data1").is_empty() && b.ops("data2").is_empty());
    assert!(b.cluster.is_attachment("acme") && !b.cluster.is_attachment("t1"));
    assert!(matches!(
        b.cluster.migrate_attachment("nope", "data1"),
        Err(ClusterError::UnknownAttachment(_))
    ));
    assert!(matches!(
        b.cluster.migrate_attachment("acme", "steer2"),
        Err(ClusterError::Unsuitable { .. })
    ));

    // drain: it moves back.
    assert_eq!(b.cluster.attachments_served_by(other_name), ["acme"]);
    b.cluster.drain(other_name).unwrap();
    assert_eq!(port_tags(&b.ops("steer1")), [(1, 100, 20, serving)]);
    b.cluster.undrain(other_name).unwrap();

    // loss of the serving node (its probes missed): steered to the other one.
    b.clear();
    b.cluster.node_dead(serving, "steer1");
    let s1 = b.ops("steer1");
    assert_eq!(port_tags(&s1), [(1, 100, 20, other)]);
    assert!(attachment_selectors(&s1).iter().all(|s| s.1 == other));
    // With no data node left it is untagged rather than sent to a dead node.
    b.cluster.node_dead(other, "steer1");
    assert!(b
        .ops("steer1")
        .iter()
        .any(|op| matches!(op, Op::RemovePortTag(t) if t.port == 1 && t.c_tag == 20)));
    assert_eq!(b.cluster.describe()["attachments"][0]["steered"], false);
    let _ = serving_name;
}

#[test]
fn a_learned_ce_mac_is_passed_on_and_given_to_later_nodes() {
    let (mut b, _s1, d1, _d2, _serving) = attached_bed();
    b.clear();
    let mac = [0x02, 0xce, 0, 0, 0, 1];
    let learned = pb::NodeEvent {
        event: Some(pb::node_event::Event::CeLearned(pb::CeMac {
            attachment: "acme".into(),
            mac: mac.to_vec(),
        })),
    };
    b.cluster.event(d1, "data1", learned.clone());
    // To every data node, the one that learned it too (a set_attachments sent before the
    // report may have set the MAC it held until then there).
    for node in ["data1", "data2"] {
        assert!(
            matches!(&b.ops(node)[..], [Op::SetCeMac(m)] if m.attachment == "acme" && m.mac == mac),
            "{node}"
        );
    }
    // The same MAC again changes nothing; a steer node may not say it.
    b.cluster.event(d1, "data1", learned.clone());
    assert!(b.ops("data2").is_empty());
    let s1 = b.cluster.node_id("steer1");
    b.cluster.event(s1, "steer1", learned);
    // A data node joining later holds it with the MAC.
    b.join("data3", Role::Data, 1);
    let a = last_attachments(&b.ops("data3")).expect("set_attachments");
    assert_eq!(a.attachments[0].ce_mac.as_deref(), Some(&mac[..]));
    assert_eq!(
        b.cluster.describe()["attachments"][0]["ce_mac"],
        "02:ce:00:00:00:01"
    );
}

#[test]
fn a_data_node_says_the_ce_macs_it_knows_in_its_hello() {
    // As after a control takeover: the nodes know the MAC, the new control node does not.
    let (mut b, _s1, _d1, _d2, _serving) = attached_bed();
    b.clear();
    let mac = [0x02, 0xce, 0, 0, 0, 2];
    let link = std::sync::Arc::new(FakeLink::default());
    b.links.insert("data3".into(), std::sync::Arc::clone(&link));
    let mut hello = registration(
        "data3",
        Role::Data,
        "10.0.0.99:6081".parse().unwrap(),
        1,
        Vec::new(),
    );
    hello.ce_macs = vec![("acme".into(), mac), ("nobody".into(), mac)];
    b.cluster.register(hello, link);
    assert_eq!(
        b.cluster.describe()["attachments"][0]["ce_mac"],
        "02:ce:00:00:00:02"
    );
    assert!(b
        .ops("data1")
        .iter()
        .any(|op| matches!(op, Op::SetCeMac(m) if m.attachment == "acme" && m.mac == mac)));
}

#[test]
fn attachments_count_in_placement() {
    // One attachment on a node, one tunnel placed: it goes to the other node.
    let (b, _s1, d1, d2, serving) = attached_bed();
    b.clear();
    b.cluster
        .install_child(&child(1, 0x1000, None, true))
        .unwrap();
    let other = if serving == d1 { "data2" } else { "data1" };
    assert!(b
        .ops(other)
        .iter()
        .any(|op| matches!(op, Op::InstallChild(c) if c.inbound_spi == 0x1000)));
    let _ = d2;
}

#[test]
fn a_data_node_that_refuses_the_attachments_is_no_migration_target() {
    let (b, _s1, d1, _d2, serving) = attached_bed();
    let other = if serving == d1 { "data2" } else { "data1" };
    // Its data plane refuses set_attachments (e.g. one that predates them).
    *b.links[other].refuse.lock().unwrap() = Some("set_attachments: unsupported".into());
    // A new version of the attachments: it does not take it.
    let mut changed = acme();
    changed.routes.push(("192.168.51.0".parse().unwrap(), 24));
    b.cluster.set_attachments(
        &[changed],
        &[("acme".to_string(), "steer1".to_string())].into(),
    );
    b.clear();
    match b.cluster.migrate_attachment("acme", other) {
        Err(ClusterError::Unsuitable { reason, .. }) => {
            assert!(reason.contains("set_attachments"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(b.ops("steer1").is_empty(), "nothing flipped");
}

#[test]
fn a_new_control_node_places_and_steers_attachments_once_it_reconciled() {
    // A takeover: until the control loop reconciled, a VNI's list may lack the tunnels of
    // data nodes yet to register; the steer nodes keep theirs until the whole tables come.
    let mut b = fresh_bed();
    b.cluster.set_attachments(
        &[acme()],
        &[("acme".to_string(), "steer1".to_string())].into(),
    );
    b.join("steer2", Role::Steer, 1);
    b.join("data1", Role::Data, 1);
    b.join_steer_with_port("steer1", "eth2");
    assert!(!b
        .ops("steer2")
        .iter()
        .any(|op| matches!(op, Op::SetSelectors(_) | Op::SteerTables(_))));
    // Nor is it placed yet: the steer nodes keep the old control node's placement; and the
    // data nodes keep the attachments they hold.
    assert_eq!(b.cluster.state().core.attachments()[&1].node, None);
    assert!(last_attachments(&b.ops("data1")).is_none());
    assert!(b.cluster.reconcile(&[]).is_empty());
    assert!(b.cluster.state().core.attachments()[&1].node.is_some());
    let held = last_attachments(&b.ops("data1")).expect("at reconcile");
    assert_eq!(held.attachments.len(), 1);
    let t = b.last_tables("steer2");
    assert_eq!(t.vnis[0].selectors[0].attachment, Some(1));
    assert_eq!(b.last_tables("steer1").attachments.len(), 1);
}
