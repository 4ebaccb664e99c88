//! Tests of what refers to what in a file: tenants, VNets and tunnels by name, duplicates, VNIs,
//! routes, selectors that overlap or leave the responder guessing, lifetimes.

use super::*;

#[test]
fn unknown_tenant() {
    let text = with_tunnel(&TUNNEL_A.replace("tenant = \"acme\"", "tenant = \"initech\""));
    expect_error(
        &text,
        "tenant = \"initech\"",
        "tenant",
        "unknown tenant \"initech\"",
    );
}

#[test]
fn vnet_of_unknown_tenant() {
    let text = with_tunnel(TUNNEL_A).replace(
        "tenant = \"globex\"\nname = \"main\"",
        "tenant = \"hooli\"\nname = \"main\"",
    );
    expect_error(&text, "tenant = \"hooli\"", "tenant", "unknown tenant");
}

#[test]
fn unknown_vnet() {
    let text = with_tunnel(&TUNNEL_A.replace("vnet = \"prod\"", "vnet = \"staging\""));
    expect_error(
        &text,
        "vnet = \"staging\"",
        "vnet",
        "unknown vnet \"staging\"",
    );
}

#[test]
fn vnet_of_another_tenant() {
    let text = with_tunnel(&TUNNEL_A.replace("vnet = \"prod\"", "vnet = \"main\""));
    expect_error(
        &text,
        "vnet = \"main\"",
        "vnet",
        "belongs to tenant \"globex\"",
    );
}

#[test]
fn vnet_and_tun_together() {
    let text = with_tunnel(&format!("{TUNNEL_A}inside = \"tun\"\n"));
    expect_error(&text, "inside = ", "inside", "not both");
}

#[test]
fn duplicate_tunnel_name() {
    let second = TUNNEL_A
        .replace("10.1.0.0/24", "10.9.0.0/24")
        .replace("a.example", "other.example");
    let text = with_tunnel(&format!("{TUNNEL_A}\n{second}"));
    // The error points at the second definition.
    let err = expect_error_at(
        &text,
        nth_line_of(&text, "name = \"a\"", 1),
        "name",
        "already defined on line",
    );
    assert!(
        err.message
            .contains(&format!("line {}", line_of(&text, "[[tunnel]]"))),
        "{err}"
    );
}

#[test]
fn duplicate_tenant() {
    let text = with_tunnel(TUNNEL_A).replace("name = \"globex\"", "name = \"acme\"");
    let scratch = Scratch::new();
    let Err(Error::Config(err)) = scratch.parse(&text) else {
        panic!("accepted")
    };
    assert_eq!(err.key.as_deref(), Some("name"));
    assert!(err.message.contains("already defined on line 5"), "{err}");
    assert_eq!(err.line, 8);
}

#[test]
fn duplicate_vni() {
    let text = with_tunnel(TUNNEL_A).replace("vni = 200", "vni = 100");
    expect_error_at(
        &text,
        nth_line_of(&text, "vni = 100", 1),
        "vni",
        "VNI 100 is already used by vnet \"prod\"",
    );
}

#[test]
fn vni_out_of_range() {
    let text = with_tunnel(TUNNEL_A).replace("vni = 200", "vni = 16777216");
    expect_error(&text, "vni = 16777216", "vni", "24-bit");
}

#[test]
fn route_with_host_bits() {
    let text = with_tunnel(TUNNEL_A).replace(
        "vni = 100\n",
        "vni = 100\nroutes = [{ prefix = \"10.2.0.1/24\", host = \"192.0.2.10\" }]\n",
    );
    expect_error(&text, "routes = ", "routes.prefix", "host bits");
}

#[test]
fn overlapping_remote_selectors_in_one_tenant() {
    let second = TUNNEL_A
        .replace("name = \"a\"", "name = \"b\"")
        .replace("a.example", "b.example")
        .replace("a.psk", "b.psk")
        .replace(
            "remote_ts = \"10.1.0.0/24\"",
            "remote_ts = [\"10.9.0.0/16\", \"10.1.0.128/25\"]",
        );
    let text = with_tunnel(&format!("{TUNNEL_A}\n{second}"));
    expect_error(
        &text,
        "remote_ts = [",
        "remote_ts",
        "overlaps 10.1.0.0/24 of tunnel \"a\"",
    );
}

#[test]
fn same_selectors_in_different_tenants_are_fine() {
    let second = TUNNEL_A
        .replace("name = \"a\"", "name = \"b\"")
        .replace("tenant = \"acme\"", "tenant = \"globex\"")
        .replace("vnet = \"prod\"", "vnet = \"main\"")
        .replace("a.example", "b.example")
        .replace("a.psk", "b.psk");
    let scratch = Scratch::new();
    let config = scratch
        .parse(&with_tunnel(&format!("{TUNNEL_A}\n{second}")))
        .unwrap();
    assert_eq!(
        config.tunnels[1].peer.psk.as_slice(),
        b"secret-b",
        "CRLF trimmed"
    );
}

#[test]
fn ambiguous_responder_match() {
    let second = TUNNEL_A
        .replace("name = \"a\"", "name = \"b\"")
        .replace("tenant = \"acme\"", "tenant = \"globex\"")
        .replace("vnet = \"prod\"", "vnet = \"main\"");
    let text = with_tunnel(&format!("{TUNNEL_A}\n{second}"));
    expect_error_at(
        &text,
        nth_line_of(&text, "remote_id", 1),
        "remote_id",
        "already accepts remote_id",
    );
}

#[test]
fn child_rekey_not_below_life_time() {
    let text = with_tunnel(&format!(
        "{TUNNEL_A}child_rekey_time = \"2h\"\nlife_time = \"1h\"\n"
    ));
    expect_error(
        &text,
        "life_time",
        "life_time",
        "must be longer than its child_rekey_time (2h)",
    );
}

#[test]
fn child_rekey_equal_to_life_time() {
    let text = with_tunnel(&format!("{TUNNEL_A}life_time = \"60m\"\n"));
    expect_error(&text, "life_time", "life_time", "life_time (1h)");
}

#[test]
fn rand_time_must_be_shorter_than_rekey() {
    let text = with_tunnel(&format!("{TUNNEL_A}rand_time = \"2h\"\n"));
    expect_error(
        &text,
        "rand_time",
        "rand_time",
        "shorter than the rekey times",
    );
}
