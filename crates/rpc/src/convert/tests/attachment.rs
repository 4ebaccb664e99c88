//! Attachments in the distributed form: round trips and errors naming the field.

use super::*;
use datapath::{AttachmentConfig, AttachmentPort, AttachmentTags};
use steer::{AttachEntry, AttachmentId, PortId, PortKey};

fn good() -> AttachmentConfig {
    AttachmentConfig {
        name: "acme-prod".into(),
        tenant: TenantId::new("acme").expect("tenant"),
        vnet: "prod".into(),
        port: AttachmentPort::Steer {
            geneve: "10.255.0.1:6081".parse().expect("addr"),
            port: 2,
            mac: [0x02, 0, 0, 0, 0, 9],
        },
        tags: AttachmentTags::QinQ {
            s_tag: 100,
            c_tag: 20,
        },
        gateway_ip: "192.168.50.1".parse().expect("ip"),
        ce_ip: Some("192.168.50.2".parse().expect("ip")),
        routes: vec![
            ("192.168.50.0".parse().expect("ip"), 24),
            ("172.16.0.0".parse().expect("ip"), 12),
        ],
        ce_mac: None,
    }
}

#[test]
fn attachments_round_trip() {
    let a = good();
    let mut b = good();
    b.name = "beta".into();
    b.tags = AttachmentTags::Vlan { c_tag: 7 };
    b.ce_ip = None;
    b.ce_mac = Some([0x02, 1, 2, 3, 4, 5]);
    let all = vec![a, b];
    assert_eq!(attachments_from_pb(&attachments_to_pb(&all)), Ok(all));
    let mut local = good();
    local.port = AttachmentPort::Interface("eth1".into());
    assert!(
        attachment_to_pb(&local).is_none(),
        "the embedded form is not carried"
    );
}

#[test]
fn attachment_errors_name_the_field() {
    let pb = attachment_to_pb(&good()).expect("steer port");
    let fails = |f: &dyn Fn(&mut pb::Attachment), field: &str| {
        let mut a = pb.clone();
        f(&mut a);
        let e = attachment_from_pb(&a).expect_err(field);
        assert_eq!(e.field, field, "{e}");
    };
    fails(&|a| a.name.clear(), "name");
    fails(&|a| a.tenant = "no such tenant!".into(), "tenant");
    fails(&|a| a.steer_geneve = "10.0.0.1".into(), "steer_geneve");
    fails(&|a| a.port = 0, "port");
    fails(&|a| a.port_mac = vec![1, 0, 0, 0, 0, 1], "port_mac");
    fails(&|a| a.s_tag = Some(0), "s_tag");
    fails(&|a| a.c_tag = 4095, "c_tag");
    fails(&|a| a.gateway_ip = "224.0.0.1".into(), "gateway_ip");
    fails(&|a| a.ce_ip = Some("2001:db8::1".into()), "ce_ip");
    fails(&|a| a.routes[1] = "172.16.0.1/12".into(), "routes[1]");
    fails(&|a| a.routes[0] = "2001:db8::/32".into(), "routes[0]");
    fails(&|a| a.ce_mac = Some(vec![0; 6]), "ce_mac");

    let twice = pb::Attachments {
        attachments: vec![pb.clone(), pb.clone()],
    };
    assert_eq!(
        attachments_from_pb(&twice).expect_err("twice").field,
        "attachments[1].name"
    );
    let same_tags = pb::Attachments {
        attachments: vec![
            pb.clone(),
            pb::Attachment {
                name: "other".into(),
                ..pb.clone()
            },
        ],
    };
    assert_eq!(
        attachments_from_pb(&same_tags)
            .expect_err("same tags")
            .field,
        "attachments[1].c_tag"
    );
}

#[test]
fn ports_tags_and_ce_macs() {
    let port = SteerPort {
        id: PortId(1),
        interface: "eth2".into(),
        mac: [0x02, 0, 0, 0, 0, 1],
    };
    assert_eq!(
        steer_port_from_pb(&steer_port_to_pb(&port)),
        Ok(port.clone())
    );
    let mut bad = steer_port_to_pb(&port);
    bad.mac.pop();
    assert_eq!(steer_port_from_pb(&bad).expect_err("mac").field, "mac");
    bad = steer_port_to_pb(&port);
    bad.id = 0;
    assert_eq!(steer_port_from_pb(&bad).expect_err("id").field, "id");

    let key = PortKey {
        port: PortId(1),
        s_tag: 0,
        c_tag: 30,
    };
    let entry = AttachEntry {
        node: NodeId(3),
        attachment: AttachmentId(4),
        vni: None,
    };
    assert_eq!(
        port_tag_from_pb(&port_tag_to_pb(key, entry)),
        Ok((key, entry))
    );
    assert_eq!(
        remove_port_tag_from_pb(&remove_port_tag_to_pb(key)),
        Ok(key)
    );
    let mut t = port_tag_to_pb(key, entry);
    t.s_tag = 70_000;
    assert_eq!(port_tag_from_pb(&t).expect_err("s_tag").field, "s_tag");
    t = port_tag_to_pb(key, entry);
    t.c_tag = 0;
    assert_eq!(port_tag_from_pb(&t).expect_err("c_tag").field, "c_tag");
    t.port = 0;
    assert_eq!(port_tag_from_pb(&t).expect_err("port").field, "port");

    let mac = [0x02, 9, 9, 9, 9, 9];
    assert_eq!(
        ce_mac_from_pb(&ce_mac_to_pb("acme", mac)),
        Ok(("acme".to_string(), mac))
    );
    assert_eq!(
        ce_mac_from_pb(&ce_mac_to_pb("acme", [0xff; 6]))
            .expect_err("broadcast")
            .field,
        "mac"
    );
}
