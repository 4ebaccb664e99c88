//! Tests of `[[attachment]]` tables: customers attached at L2 over Q-in-Q or one VLAN tag.

use super::*;
use datapath::AttachmentTags;

/// Two valid attachments of two customers with the same address plan on one interface.
const ATTACHMENTS: &str = r#"[[attachment]]
name = "acme-prod"
tenant = "acme"
vnet = "prod"
interface = "eth1"
kind = "qinq"
s_tag = 100
c_tag = 10
gateway_ip = "10.99.0.1"
ce_ip = "10.99.0.2"
routes = ["10.99.0.0/24", "192.168.0.0/16"]

[[attachment]]
name = "globex-main"
tenant = "globex"
vnet = "main"
interface = "eth1"
kind = "qinq"
s_tag = 200
c_tag = 10
gateway_ip = "10.99.0.1"
routes = "10.99.0.0/24"
"#;

fn with_attachments(attachments: &str) -> String {
    format!("{GATEWAY}\n{TENANTS}\n{attachments}")
}

#[test]
fn valid_attachments_reach_the_data_plane() {
    let scratch = Scratch::new();
    let cfg = scratch
        .parse(&with_attachments(ATTACHMENTS))
        .expect("valid");
    let a = &cfg.dataplane.attachments;
    assert_eq!(a.len(), 2);
    assert_eq!(a[0].name, "acme-prod");
    assert_eq!(a[0].vnet, "prod");
    assert_eq!(a[0].tenant.as_str(), "acme");
    assert_eq!(
        a[0].port,
        datapath::AttachmentPort::Interface("eth1".into())
    );
    assert_eq!(
        a[0].tags,
        AttachmentTags::QinQ {
            s_tag: 100,
            c_tag: 10
        }
    );
    assert_eq!(a[0].ce_ip, Some("10.99.0.2".parse().expect("ip")));
    // The CE's own address is behind it too.
    assert!(a[0]
        .routes
        .contains(&("10.99.0.2".parse().expect("ip"), 32)));
    assert!(a[0]
        .routes
        .contains(&("192.168.0.0".parse().expect("ip"), 16)));
    assert_eq!(a[1].routes, vec![("10.99.0.0".parse().expect("ip"), 24)]);
    let summary = cfg.summary();
    assert!(
        summary.contains(
            "attachment acme-prod (tenant acme, vnet prod): eth1 Q-in-Q s_tag 100 c_tag 10, \
             gateway 10.99.0.1, behind the CE 10.99.0.0/24 192.168.0.0/16 10.99.0.2/32"
        ),
        "{summary}"
    );
}

#[test]
fn single_vlan_attachment() {
    let text = with_attachments(&ATTACHMENTS.replacen(
        "kind = \"qinq\"\ns_tag = 100\n",
        "kind = \"vlan\"\n",
        1,
    ));
    let cfg = Scratch::new().parse(&text).expect("valid");
    assert_eq!(
        cfg.dataplane.attachments[0].tags,
        AttachmentTags::Vlan { c_tag: 10 }
    );
}

#[test]
fn duplicate_tag_pair_on_one_interface_is_refused() {
    let text = with_attachments(&ATTACHMENTS.replace("s_tag = 200", "s_tag = 100"));
    // The second definition is the one named, with the line of the first.
    expect_error_at(
        &text,
        nth_line_of(&text, "s_tag = 100", 1),
        "s_tag",
        "already attachment \"acme-prod\"",
    );
}

#[test]
fn the_same_tags_on_another_interface_are_fine() {
    let text = with_attachments(&ATTACHMENTS.replace("s_tag = 200", "s_tag = 100").replacen(
        "interface = \"eth1\"",
        "interface = \"eth2\"",
        1,
    ));
    assert!(Scratch::new().parse(&text).is_ok());
}

#[test]
fn vnet_must_exist_and_be_the_tenants() {
    let text = with_attachments(&ATTACHMENTS.replacen("vnet = \"prod\"", "vnet = \"main\"", 1));
    expect_error(
        &text,
        "vnet = \"main\"",
        "vnet",
        "belongs to tenant \"globex\"",
    );
    let text = with_attachments(&ATTACHMENTS.replacen("vnet = \"prod\"", "vnet = \"qa\"", 1));
    expect_error(&text, "vnet = \"qa\"", "vnet", "unknown vnet \"qa\"");
    let text = with_attachments(&ATTACHMENTS.replacen("tenant = \"acme\"", "tenant = \"x\"", 1));
    expect_error(&text, "tenant = \"x\"", "tenant", "unknown tenant");
}

#[test]
fn bad_values_name_their_key() {
    for (from, to, key, says) in [
        (
            "kind = \"qinq\"",
            "kind = \"mpls\"",
            "kind",
            "not an attachment kind",
        ),
        ("s_tag = 100", "s_tag = 4095", "s_tag", "not a VLAN id"),
        ("c_tag = 10", "c_tag = 0", "c_tag", "not a VLAN id"),
        (
            "gateway_ip = \"10.99.0.1\"",
            "gateway_ip = \"10.99.0\"",
            "gateway_ip",
            "not an IP address",
        ),
        (
            "ce_ip = \"10.99.0.2\"",
            "ce_ip = \"fd00::2\"",
            "ce_ip",
            "IP version",
        ),
        (
            "interface = \"eth1\"",
            "interface = \"a/b\"",
            "interface",
            "not a network interface",
        ),
        (
            "routes = [\"10.99.0.0/24\"",
            "routes = [\"10.99.0.1/24\"",
            "routes",
            "host bits",
        ),
    ] {
        let text = with_attachments(&ATTACHMENTS.replacen(from, to, 1));
        expect_error(&text, to, key, says);
    }
    // qinq without s_tag; vlan with one.
    let text = with_attachments(&ATTACHMENTS.replacen("s_tag = 100\n", "", 1));
    expect_error(&text, "kind = \"qinq\"", "s_tag", "needs s_tag");
    let text = with_attachments(&ATTACHMENTS.replacen("kind = \"qinq\"", "kind = \"vlan\"", 1));
    expect_error(&text, "s_tag = 100", "s_tag", "s_tag is for");
    // Neither routes nor ce_ip.
    let text = with_attachments(&ATTACHMENTS.replace("routes = \"10.99.0.0/24\"\n", ""));
    expect_error(&text, "name = \"globex-main\"", "routes", "needs routes");
    // Unknown keys are refused like everywhere else.
    let text = with_attachments(&ATTACHMENTS.replacen("c_tag = 10", "c_tag = 10\nvid = 3", 1));
    assert!(Scratch::new().parse(&text).is_err());
}

#[test]
fn duplicate_name() {
    let text = with_attachments(&ATTACHMENTS.replace("globex-main", "acme-prod"));
    expect_error_at(
        &text,
        nth_line_of(&text, "name = \"acme-prod\"", 1),
        "name",
        "already defined on line",
    );
}

#[test]
fn apply_keeps_attachments_and_refuses_to_remove_their_vnet() {
    let s = Scratch::new();
    let node = s.parse(&with_attachments(ATTACHMENTS)).expect("valid");
    // An applied file may carry [[attachment]] tables: they are ignored (fixed at start).
    let same = node
        .with_inventory(&with_attachments(ATTACHMENTS), &s.0.join("same.toml"), None)
        .expect("applied");
    assert_eq!(same.dataplane.attachments, node.dataplane.attachments);
    // Removing globex's VNet would leave its attachment without one.
    let without_main = TENANTS.replace(
        "[[vnet]]\ntenant = \"globex\"\nname = \"main\"\nvni = 200\ngateway_ip = \"10.2.0.1\"\nvtep = \"203.0.113.1\"\n",
        "",
    );
    assert!(!without_main.contains("name = \"main\""));
    match node.with_inventory(&without_main, &s.0.join("less.toml"), None) {
        Err(Error::Config(e)) => {
            let shown = e.to_string();
            assert!(shown.contains("globex-main"), "{shown}");
            assert_eq!(e.key.as_deref(), Some("vnet"));
        }
        Err(e) => panic!("unexpected error: {e}"),
        Ok(_) => panic!("an attachment's VNet was removed"),
    }
}

const CLUSTER: &str = "[cluster]\nname = \"control1\"\ngrpc = \"10.0.0.1:7300\"\n\
     geneve = \"10.0.0.1:6081\"\nca = \"pki/ca.pem\"\ncert = \"pki/c1.pem\"\nkey = \"pki/c1.key\"\n";

/// The attachments of [`ATTACHMENTS`] on steer nodes' ports, for a `[cluster]` control node.
fn on_steer_nodes(first: &str, second: &str) -> String {
    let attachments = ATTACHMENTS
        .replacen(
            "interface = \"eth1\"",
            &format!("interface = \"eth1\"\nsteer = {first:?}"),
            1,
        )
        .replacen(
            "interface = \"eth1\"\nkind",
            &format!("interface = \"eth1\"\nsteer = {second:?}\nkind"),
            1,
        );
    format!("{}\n{CLUSTER}", with_attachments(&attachments))
}

#[test]
fn a_control_node_takes_attachments_on_steer_nodes_ports() {
    let text = on_steer_nodes("steer1", "steer2");
    let cfg = Scratch::new().parse(&text).expect("valid");
    let a = &cfg.dataplane.attachments;
    assert_eq!(a.len(), 2);
    // The interface is the steer node's, named as is: nothing is opened here.
    assert_eq!(
        a[1].port,
        datapath::AttachmentPort::Interface("eth1".into())
    );
    assert!(
        cfg.summary().contains("eth1 of steer node steer2"),
        "{}",
        cfg.summary()
    );
    let steers = &cfg.cluster.expect("[cluster]").attachment_steers;
    assert_eq!(steers.get("acme-prod").map(String::as_str), Some("steer1"));
    assert_eq!(
        steers.get("globex-main").map(String::as_str),
        Some("steer2")
    );
}

#[test]
fn steer_is_required_with_cluster_and_refused_without() {
    let text = format!("{}\n{CLUSTER}", with_attachments(ATTACHMENTS));
    expect_error(&text, "name = \"acme-prod\"", "steer", "needs steer = ");
    let text = with_attachments(&ATTACHMENTS.replacen(
        "kind = \"qinq\"",
        "steer = \"steer1\"\nkind = \"qinq\"",
        1,
    ));
    expect_error(&text, "steer = \"steer1\"", "steer", "distributed form");
    let text = on_steer_nodes("steer 1", "steer2");
    expect_error(
        &text,
        "steer = \"steer 1\"",
        "steer",
        "not a steer node's name",
    );
}

#[test]
fn a_tag_pair_is_used_once_per_port_of_a_steer_node() {
    let same_tags = |text: String| text.replace("s_tag = 200", "s_tag = 100");
    // The same interface name on two steer nodes is two ports.
    let text = same_tags(on_steer_nodes("steer1", "steer2"));
    assert!(Scratch::new().parse(&text).is_ok());
    let text = same_tags(on_steer_nodes("steer1", "steer1"));
    expect_error_at(
        &text,
        nth_line_of(&text, "s_tag = 100", 1),
        "s_tag",
        "on eth1 of steer node \"steer1\" is already attachment \"acme-prod\"",
    );
}

#[test]
fn an_attachment_is_not_named_like_a_tunnel() {
    // `ctl migrate NAME` takes either.
    let text = format!(
        "{}\n{}",
        with_tunnel(TUNNEL_A),
        ATTACHMENTS.replace("acme-prod", "a")
    );
    expect_error_at(
        &text,
        nth_line_of(&text, "name = \"a\"", 1),
        "name",
        "also the name of the tunnel on line",
    );
}

#[test]
fn routes_of_one_vnets_attachments_must_not_overlap() {
    // A second attachment of acme's prod VNet whose routes reach into the first one's.
    let second = r#"
[[attachment]]
name = "acme-branch"
tenant = "acme"
vnet = "prod"
interface = "eth1"
kind = "vlan"
c_tag = 30
gateway_ip = "10.98.0.1"
routes = ["10.98.0.0/24", "192.168.7.0/24"]
"#;
    let text = with_attachments(&format!("{ATTACHMENTS}{second}"));
    expect_error(
        &text,
        "routes = [\"10.98.0.0/24\"",
        "routes",
        "192.168.7.0/24 overlaps 192.168.0.0/16 of attachment \"acme-prod\"",
    );
    // Apart, they are fine; and the same prefixes in another tenant's VNet always were.
    let text = with_attachments(&format!(
        "{ATTACHMENTS}{}",
        second.replace(", \"192.168.7.0/24\"", "")
    ));
    assert!(Scratch::new().parse(&text).is_ok());
}
