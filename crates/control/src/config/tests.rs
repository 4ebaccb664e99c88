//! Tests of configuration loading: the checked-in example, and one test per validation rule
//! asserting that the error names the file, the line and the key.

use super::*;
use crate::error::{ConfigError, Error};
use ike::{DpdAction, StartAction, TunnelId};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

mod attachments;
mod fairness;
mod filters;
mod references;
mod sections;

fn example_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/example.toml")
}

/// A scratch directory with a few PSK files (mode 0600), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "protego-config-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, content) in [
            ("a.psk", "secret-a\n"),
            ("b.psk", "secret-b\r\n"),
            ("empty.psk", "\n"),
        ] {
            let p = dir.join(name);
            std::fs::write(&p, content).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        Self(dir)
    }

    fn parse(&self, text: &str) -> Result<Config, Error> {
        Config::parse(text, &self.0.join("protego.toml"))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const GATEWAY: &str = r#"[gateway]
listen = ["198.51.100.1", "2001:db8::1"]
"#;

const TENANTS: &str = r#"[[tenant]]
name = "acme"

[[tenant]]
name = "globex"

[[vnet]]
tenant = "acme"
name = "prod"
vni = 100
gateway_ip = "10.2.0.1"
vtep = "203.0.113.1"

[[vnet]]
tenant = "globex"
name = "main"
vni = 200
gateway_ip = "10.2.0.1"
vtep = "203.0.113.1"
"#;

/// A valid tunnel table; tests replace single lines of it.
const TUNNEL_A: &str = r#"[[tunnel]]
name = "a"
tenant = "acme"
vnet = "prod"
remote_addrs = "192.0.2.2"
local_id = "gw.example"
remote_id = "a.example"
psk_file = "a.psk"
local_ts = "10.2.0.0/24"
remote_ts = "10.1.0.0/24"
"#;

fn with_tunnel(tunnel: &str) -> String {
    format!("{GATEWAY}\n{TENANTS}\n{tunnel}")
}

/// 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("{needle:?} not in text"))
        + 1
}

/// Parses `text`, expects an error at the line containing `at`, naming `key`, whose message
/// contains `says`.
fn expect_error(text: &str, at: &str, key: &str, says: &str) -> Box<ConfigError> {
    expect_error_at(text, line_of(text, at), key, says)
}

/// 1-based line of the `n`th (0-based) line of `text` containing `needle`.
fn nth_line_of(text: &str, needle: &str, n: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(n)
        .expect("needle occurs often enough")
        .0
        + 1
}

/// As [`expect_error`], at an explicit line.
fn expect_error_at(text: &str, line: usize, key: &str, says: &str) -> Box<ConfigError> {
    let scratch = Scratch::new();
    let err = match scratch.parse(text) {
        Ok(_) => panic!("configuration was accepted; expected an error about {key}"),
        Err(Error::Config(e)) => e,
        Err(other) => panic!("unexpected error kind: {other}"),
    };
    let shown = err.to_string();
    assert_eq!(err.line, line, "wrong line in: {shown}");
    assert!(err.column >= 1, "no column in: {shown}");
    assert_eq!(err.key.as_deref(), Some(key), "wrong key in: {shown}");
    assert!(
        shown.contains(&format!("protego.toml:{}:", err.line)),
        "file and line missing in: {shown}"
    );
    assert!(
        shown.contains(&format!("`{key}`")),
        "key missing in: {shown}"
    );
    assert!(shown.contains(says), "{says:?} missing in: {shown}");
    let line_text = text.lines().nth(line - 1).expect("line exists");
    assert!(
        err.snippet().is_some_and(|s| s.contains(line_text)),
        "snippet lacks the line: {:?}",
        err.snippet()
    );
    err
}

#[test]
fn example_file_is_valid() {
    let config = Config::load(&example_path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        config.gateway.listen,
        [
            "198.51.100.1".parse::<IpAddr>().unwrap(),
            "2001:db8::1".parse().unwrap()
        ]
    );
    assert_eq!(
        config.gateway.control_socket,
        PathBuf::from("/run/protego/protego.sock")
    );
    assert_eq!(config.gateway.log_format, LogFormat::Text);
    assert_eq!(config.gateway.key_log, None);
    assert!(!config.endpoint.key_log);
    assert_eq!(
        (config.gateway.ike_port, config.gateway.natt_port),
        (500, 4500)
    );
    assert_eq!(config.tenants, ["acme", "globex", "lab"]);

    let names: Vec<&str> = config
        .tunnels
        .iter()
        .map(|t| t.peer.name.as_str())
        .collect();
    assert_eq!(names, ["acme-hq", "acme-branch", "globex-dc", "lab"]);
    for (i, t) in config.tunnels.iter().enumerate() {
        assert_eq!(t.peer.id, TunnelId(i as u32 + 1));
        assert_eq!(
            config.tunnel(t.peer.id).map(|t| t.peer.name.as_str()),
            Some(t.peer.name.as_str())
        );
    }

    let hq = &config.tunnels[0];
    assert_eq!(hq.tenant, "acme");
    assert_eq!(hq.inside, TunnelInside::Vnet("prod".into()));
    assert_eq!(
        hq.peer.remote_addrs,
        ["192.0.2.2".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        hq.peer.local_id,
        ike::Identity::Fqdn("gw.example.net".into())
    );
    assert_eq!(
        hq.peer.psk.as_slice(),
        b"correct horse battery staple acme hq"
    );
    assert_eq!(hq.peer.ike_proposals.len(), 2);
    assert_eq!(hq.peer.esp_proposals.len(), 2);
    assert_eq!(hq.peer.start_action, StartAction::Start);
    assert_eq!(hq.peer.dpd_action, DpdAction::Restart);
    assert_eq!(hq.peer.dpd_delay, Some(Duration::from_secs(30)));
    assert_eq!(hq.peer.ike_rekey_time, Duration::from_secs(4 * 3600));
    assert_eq!(hq.peer.child_rekey_time, Duration::from_secs(3600));
    assert_eq!(hq.peer.child_life_time, Duration::from_secs(66 * 60));
    assert_eq!(hq.peer.rand_time, Duration::from_secs(6 * 60));
    assert_eq!(hq.peer.replay_window, 1024);

    let branch = &config.tunnels[1];
    assert!(branch.peer.remote_addrs.is_empty(), "%any means any");
    assert_eq!(branch.peer.start_action, StartAction::None);
    assert_eq!(branch.peer.dpd_delay, None);
    assert_eq!(
        branch.proposals.len(),
        validate::DEFAULT_IKE_PROPOSALS.len()
    );
    assert_eq!(
        branch.peer.child_life_time,
        Duration::from_secs(3960),
        "110 % of 1h"
    );

    let globex = &config.tunnels[2];
    assert_eq!(
        globex.peer.local_addrs,
        ["198.51.100.1".parse::<IpAddr>().unwrap()]
    );
    assert_eq!(
        globex.peer.local_id,
        ike::Identity::Ipv4("198.51.100.1".parse().unwrap())
    );
    assert_eq!(
        globex.peer.remote_id,
        ike::Identity::Rfc822("dc@globex.example".into())
    );
    assert_eq!(globex.peer.psk.len(), 32, "0x-prefixed PSK is hex");
    assert_eq!(
        globex.proposals.len(),
        1 + validate::DEFAULT_IKE_PROPOSALS.len(),
        "default expands in place"
    );
    assert_eq!(globex.peer.esp_proposals[0].dh, [crypto::DhGroup::Ecp256]);
    assert_eq!(globex.peer.replay_window, 128);

    let lab = &config.tunnels[3];
    assert_eq!(lab.inside, TunnelInside::Tun);
    assert_eq!(lab.peer.remote_ts[0].ip_proto, 6);
    assert_eq!(
        (
            lab.peer.remote_ts[0].start_port,
            lab.peer.remote_ts[0].end_port
        ),
        (1024, 65535)
    );

    let dp = &config.dataplane;
    assert_eq!(dp.listen, config.gateway.listen);
    assert_eq!(dp.vnets.len(), 2);
    assert_eq!(dp.vnets[0].routes.len(), 2);
    assert_eq!(dp.vnets[0].routes[1].len, 25);
    assert_eq!(dp.tunnels.len(), 4);
    assert_eq!(dp.tunnels[0].inside, datapath::Inside::Vnet(0));
    assert_eq!(dp.tunnels[2].inside, datapath::Inside::Vnet(1));
    assert_eq!(dp.tunnels[3].inside, datapath::Inside::Tun);
    assert_eq!(dp.tun_name.as_deref(), Some("protego0"));
    assert_eq!(dp.vxlan_port, 4789);
}

#[test]
fn tunnel_debug_hides_the_psk() {
    let config = Config::load(&example_path()).unwrap();
    let shown = format!("{:?}", config.tunnels[0]);
    assert!(shown.contains("<redacted>"));
    assert!(
        !shown.contains("99, 111, 114, 114"),
        "PSK bytes leaked: {shown}"
    ); // "corr"
}

#[test]
fn minimal_file_gets_swanctl_defaults() {
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(TUNNEL_A)).unwrap();
    let t = &config.tunnels[0];
    assert_eq!(
        t.peer.psk.as_slice(),
        b"secret-a",
        "trailing newline removed"
    );
    assert_eq!(t.peer.ike_rekey_time, Duration::from_secs(14_400));
    assert_eq!(t.peer.child_rekey_time, Duration::from_secs(3_600));
    assert_eq!(t.peer.child_life_time, Duration::from_secs(3_960));
    assert_eq!(t.peer.rand_time, Duration::from_secs(360));
    assert_eq!(
        t.peer.replay_window, 1024,
        "Protego's default, larger than swanctl's 32"
    );
    assert_eq!(t.peer.dpd_delay, None);
    assert_eq!(t.peer.dpd_action, DpdAction::Clear);
    assert_eq!(
        config.dataplane.tun_name, None,
        "no TUN without inside = \"tun\""
    );
    assert!(config.warnings.is_empty(), "{:?}", config.warnings);
    assert_eq!(
        config.gateway.control_socket,
        PathBuf::from(DEFAULT_CONTROL_SOCKET)
    );
}

#[test]
fn world_readable_psk_and_key_log_warn() {
    let scratch = Scratch::new();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        scratch.0.join("a.psk"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\nkey_log = \"keys\"\n");
    let config = scratch.parse(&text).unwrap();
    assert_eq!(config.gateway.key_log, Some(scratch.0.join("keys")));
    assert!(config.endpoint.key_log);
    assert!(
        config
            .warnings
            .iter()
            .any(|w| w.contains("world-readable") && w.contains("a.psk")),
        "{:?}",
        config.warnings
    );
    assert!(
        config.warnings.iter().any(|w| w.contains("key_log")),
        "{:?}",
        config.warnings
    );
}

#[test]
fn unknown_key() {
    let text = with_tunnel(&TUNNEL_A.replace("remote_addrs", "remote_adrs"));
    let err = expect_error(
        &text,
        "remote_adrs",
        "remote_adrs",
        "did you mean `remote_addrs`?",
    );
    assert_eq!(err.column, 1);
}

#[test]
fn unknown_key_in_gateway() {
    let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\nlisten_port = 500\n");
    expect_error(
        &text,
        "listen_port",
        "listen_port",
        "unknown key `listen_port`",
    );
}

#[test]
fn wrong_type() {
    let text = with_tunnel(TUNNEL_A).replace("vni = 100", "vni = \"100\"");
    expect_error(&text, "vni = \"100\"", "vni", "expected an integer");
}

#[test]
fn toml_syntax_error() {
    let text = with_tunnel(TUNNEL_A).replace("name = \"a\"", "name = \"a");
    let scratch = Scratch::new();
    let Err(Error::Config(err)) = scratch.parse(&text) else {
        panic!("accepted")
    };
    let broken = text
        .lines()
        .position(|l| l == "name = \"a")
        .expect("broken line present")
        + 1;
    assert_eq!(err.line, broken, "{err}");
}

#[test]
fn missing_psk_file_names_the_path() {
    let text = with_tunnel(&TUNNEL_A.replace("a.psk", "nope.psk"));
    let err = expect_error(&text, "psk_file", "psk_file", "cannot read PSK file");
    assert!(err.message.contains("nope.psk"), "{}", err.message);
}

#[test]
fn empty_psk() {
    let text = with_tunnel(&TUNNEL_A.replace("a.psk", "empty.psk"));
    expect_error(&text, "psk_file", "psk_file", "is empty");
}

#[test]
fn unknown_proposal_keyword() {
    let text = with_tunnel(&format!(
        "{TUNNEL_A}proposals = \"aes256gcm16-prfsha256-x25519, aes256-sha256-modp1024\"\n"
    ));
    expect_error(&text, "proposals = ", "proposals", "modp1024");
}

#[test]
fn unknown_esp_proposal_keyword() {
    let text = with_tunnel(&format!(
        "{TUNNEL_A}esp_proposals = [\"aes256gcm16\", \"3des-md5\"]\n"
    ));
    expect_error(&text, "esp_proposals", "esp_proposals", "3des");
}

#[test]
fn invalid_identity() {
    let text = with_tunnel(&TUNNEL_A.replace(
        "remote_id = \"a.example\"",
        "remote_id = \"C=CH, O=strongSwan, CN=peer\"",
    ));
    expect_error(&text, "remote_id", "remote_id", "identity");
}

#[test]
fn invalid_traffic_selector() {
    let text = with_tunnel(
        &TUNNEL_A.replace("remote_ts = \"10.1.0.0/24\"", "remote_ts = \"10.1.0.0/33\""),
    );
    expect_error(&text, "remote_ts", "remote_ts", "10.1.0.0/33");
}

#[test]
fn invalid_remote_address() {
    let text = with_tunnel(&TUNNEL_A.replace("\"192.0.2.2\"", "\"vpn.example.com\""));
    expect_error(&text, "remote_addrs", "remote_addrs", "not an IP address");
}

#[test]
fn invalid_listen_address() {
    let text = with_tunnel(TUNNEL_A).replace("\"2001:db8::1\"", "\"2001:db8::zz\"");
    expect_error(&text, "listen", "listen", "2001:db8::zz");
}

#[test]
fn local_addr_must_be_a_listen_address() {
    let text = with_tunnel(&format!("{TUNNEL_A}local_addrs = \"198.51.100.7\"\n"));
    expect_error(
        &text,
        "local_addrs",
        "local_addrs",
        "not one of the [gateway] listen addresses",
    );
}

#[test]
fn invalid_duration() {
    let text = with_tunnel(&format!("{TUNNEL_A}dpd_delay = \"30 seconds\"\n"));
    expect_error(&text, "dpd_delay", "dpd_delay", "unknown unit");
}

#[test]
fn durations_accept_integers() {
    let scratch = Scratch::new();
    let config = scratch
        .parse(&with_tunnel(&format!(
            "{TUNNEL_A}dpd_delay = 10\nrekey_time = \"1d\"\n"
        )))
        .unwrap();
    assert_eq!(
        config.tunnels[0].peer.dpd_delay,
        Some(Duration::from_secs(10))
    );
    assert_eq!(
        config.tunnels[0].peer.ike_rekey_time,
        Duration::from_secs(86_400)
    );
    // swanctl's default hard lifetime margin: 10 % of the IKE rekey time.
    assert_eq!(
        config.tunnels[0].peer.ike_over_time,
        Duration::from_secs(8_640)
    );
}

#[test]
fn over_time_is_the_ike_sa_hard_lifetime_margin() {
    let scratch = Scratch::new();
    let config = scratch
        .parse(&with_tunnel(&format!(
            "{TUNNEL_A}rekey_time = \"10m\"\nover_time = \"30s\"\n"
        )))
        .unwrap();
    assert_eq!(
        config.tunnels[0].peer.ike_over_time,
        Duration::from_secs(30)
    );
    assert!(
        config.summary().contains("over_time 30s"),
        "{}",
        config.summary()
    );
    let config = scratch
        .parse(&with_tunnel(&format!("{TUNNEL_A}over_time = 0\n")))
        .unwrap();
    assert!(
        config.tunnels[0].peer.ike_over_time.is_zero(),
        "0 disables it"
    );
    let text = with_tunnel(&format!("{TUNNEL_A}over_time = \"soon\"\n"));
    expect_error(&text, "over_time", "over_time", "");
}

#[test]
fn start_action_trap_is_refused() {
    let text = with_tunnel(&format!("{TUNNEL_A}start_action = \"trap\"\n"));
    expect_error(&text, "start_action", "start_action", "not supported");
}

#[test]
fn start_needs_a_remote_address() {
    let text = with_tunnel(&format!(
        "{}start_action = \"start\"\n",
        TUNNEL_A.replace("\"192.0.2.2\"", "\"%any\"")
    ));
    expect_error(&text, "start_action", "start_action", "needs remote_addrs");
}

#[test]
fn unknown_log_format() {
    let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\nlog_format = \"xml\"\n");
    expect_error(&text, "log_format", "log_format", "unknown log format");
}

#[test]
fn ike_and_natt_ports_differ() {
    let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", "[gateway]\nike_port = 4500\n");
    expect_error(&text, "ike_port", "natt_port", "must differ");
}

#[test]
fn missing_required_key() {
    let text = with_tunnel(&TUNNEL_A.replace("psk_file = \"a.psk\"\n", ""));
    let scratch = Scratch::new();
    let Err(Error::Config(err)) = scratch.parse(&text) else {
        panic!("accepted")
    };
    assert!(err.message.contains("missing field `psk_file`"), "{err}");
    assert!(err.line >= line_of(&text, "[[tunnel]]"), "{err}");
}

#[test]
fn missing_file() {
    let err = Config::load(Path::new("/nonexistent/protego.toml")).unwrap_err();
    let shown = err.to_string();
    assert!(
        shown.starts_with("/nonexistent/protego.toml: cannot read"),
        "{shown}"
    );
}

#[test]
fn snippet_points_at_the_value() {
    let text = with_tunnel(&TUNNEL_A.replace("a.psk", "nope.psk"));
    let scratch = Scratch::new();
    let Err(Error::Config(err)) = scratch.parse(&text) else {
        panic!("accepted")
    };
    let snippet = err.snippet().unwrap();
    let lines: Vec<&str> = snippet.lines().collect();
    assert!(lines[1].ends_with("psk_file = \"nope.psk\""), "{snippet}");
    let caret_col = lines[2].find('^').unwrap();
    let value_col = lines[1].find("\"nope.psk\"").unwrap();
    assert_eq!(caret_col, value_col, "{snippet}");
}

#[test]
fn summary_lists_every_tunnel_without_secrets() {
    let config = Config::load(&example_path()).unwrap();
    let summary = config.summary();
    for t in &config.tunnels {
        assert!(
            summary.contains(&format!("tunnel {} (tenant {}", t.peer.name, t.tenant)),
            "{summary}"
        );
    }
    assert!(
        summary.contains("10.2.0.0/24 'gw.example.net' === 10.1.0.0/24 'hq.acme.example'"),
        "{summary}"
    );
    assert!(summary.contains("fd00:2::/64[tcp/1024-65535]"), "{summary}");
    assert!(summary.contains("life_time 66m"), "{summary}");
    assert!(!summary.contains("correct horse"), "PSK leaked: {summary}");
}

#[test]
fn unrelated_unknown_key_lists_the_known_ones() {
    let text = with_tunnel(&format!("{TUNNEL_A}mobike = true\n"));
    expect_error(&text, "mobike", "mobike", "known keys here: name, tenant");
}

#[test]
fn edit_distances() {
    assert_eq!(super::edit_distance("remote_adrs", "remote_addrs"), 1);
    assert_eq!(super::edit_distance("", "abc"), 3);
    assert_eq!(super::edit_distance("kitten", "sitting"), 3);
}

#[test]
fn ipv6_catch_all_selector() {
    // `::/0` must parse (it once overflowed a shift in the selector parser).
    let tunnel = TUNNEL_A
        .replace(
            "local_ts = \"10.2.0.0/24\"",
            "local_ts = \"10.2.0.0/24, ::/0\"",
        )
        .replace(
            "remote_ts = \"10.1.0.0/24\"",
            "remote_ts = \"0.0.0.0/0, ::/0\"",
        );
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(&tunnel)).unwrap();
    assert_eq!(config.tunnels[0].peer.remote_ts.len(), 2);
    assert_eq!(
        crate::status::format_ts(&config.tunnels[0].peer.remote_ts[1]),
        "::/0"
    );
}

#[test]
fn replay_window_bounds() {
    let text = with_tunnel(&format!("{TUNNEL_A}replay_window = 0\n"));
    expect_error(
        &text,
        "replay_window",
        "replay_window",
        "cannot be disabled",
    );
    let text = with_tunnel(&format!("{TUNNEL_A}replay_window = 100000\n"));
    expect_error(
        &text,
        "replay_window",
        "replay_window",
        "between 32 and 65536",
    );
}

#[test]
fn resource_sas_default_bounds_and_off() {
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(
        config.tunnels[0].peer.resource_sas,
        ike::DEFAULT_RESOURCE_SAS
    );
    let off = scratch
        .parse(&with_tunnel(&format!("{TUNNEL_A}resource_sas = 0\n")))
        .unwrap();
    assert_eq!(off.tunnels[0].peer.resource_sas, 0);
    // Changed in place by `ctl apply` (the next request reads it; no SA is renegotiated).
    assert_eq!(
        inventory::tunnel_change(&config.tunnels[0], &off.tunnels[0]),
        inventory::TunnelChange::Update
    );
    for bad in ["-1", "1025"] {
        let text = with_tunnel(&format!("{TUNNEL_A}resource_sas = {bad}\n"));
        expect_error(
            &text,
            "resource_sas",
            "resource_sas",
            "between 0 (RFC 9611 off) and 1024",
        );
    }
}

#[test]
fn route_host_family_must_match_the_vtep() {
    let text = with_tunnel(TUNNEL_A).replace(
        "vni = 100\n",
        "vni = 100\nroutes = [{ prefix = \"10.2.0.0/24\", host = \"2001:db8::10\" }]\n",
    );
    expect_error(
        &text,
        "routes = ",
        "routes.host",
        "same IP version as the vtep",
    );
}

#[test]
fn router_mac_is_read_and_must_be_a_unicast_mac() {
    let scratch = Scratch::new();
    let text = with_tunnel(TUNNEL_A).replacen(
        "vni = 100\n",
        "vni = 100\nrouter_mac = \"02:00:5e:00:01:fe\"\n",
        1,
    );
    let config = scratch.parse(&text).expect("valid");
    assert_eq!(
        config.dataplane.vnets[0].router_mac,
        Some([2, 0, 0x5e, 0, 1, 0xfe])
    );
    assert_eq!(config.dataplane.vnets[1].router_mac, None);
    for (mac, says) in [
        ("02:00:5e:00:01", "not a MAC address"),
        ("01:00:5e:00:00:01", "not a unicast MAC address"),
        ("00:00:00:00:00:00", "not a unicast MAC address"),
    ] {
        let text = with_tunnel(TUNNEL_A).replacen(
            "vni = 100\n",
            &format!("vni = 100\nrouter_mac = \"{mac}\"\n"),
            1,
        );
        expect_error(&text, "router_mac", "router_mac", says);
    }
}

#[test]
fn vtep_must_be_unicast() {
    let text = with_tunnel(TUNNEL_A).replacen("vtep = \"203.0.113.1\"", "vtep = \"0.0.0.0\"", 1);
    expect_error(&text, "vtep = \"0.0.0.0\"", "vtep", "not a unicast address");
}

#[test]
fn dual_stack_vnet_has_one_gateway_address_per_version() {
    let text = with_tunnel(TUNNEL_A).replacen(
        "gateway_ip = \"10.2.0.1\"",
        "gateway_ip = [\"10.2.0.1\", \"fd00:2::1\"]",
        1,
    );
    let scratch = Scratch::new();
    let config = scratch.parse(&text).expect("valid");
    let ips: Vec<String> = config.dataplane.vnets[0]
        .gateway_ips
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(ips, ["10.2.0.1", "fd00:2::1"]);
}

#[test]
fn two_gateway_addresses_of_one_version() {
    let text = with_tunnel(TUNNEL_A).replacen(
        "gateway_ip = \"10.2.0.1\"",
        "gateway_ip = [\"10.2.0.1\", \"10.2.0.2\"]",
        1,
    );
    expect_error(
        &text,
        "10.2.0.2",
        "gateway_ip",
        "at most one gateway address per IP version",
    );
}

#[test]
fn gateway_address_list_must_not_be_empty() {
    let text = with_tunnel(TUNNEL_A).replacen("gateway_ip = \"10.2.0.1\"", "gateway_ip = []", 1);
    expect_error(&text, "gateway_ip = []", "gateway_ip", "required");
}

#[test]
fn workers_and_pinning() {
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(
        (
            config.dataplane.workers,
            config.dataplane.cpus.as_slice(),
            config.dataplane.pin_workers
        ),
        (0, &[][..], true),
        "defaults: one worker per allowed CPU, pinned to them"
    );
    let text = with_tunnel(TUNNEL_A).replace(
        "[gateway]\n",
        "[gateway]\nworkers = 3\ncpus = [1, 0]\npin_workers = false\n",
    );
    let config = scratch.parse(&text).unwrap();
    assert_eq!(config.dataplane.workers, 3);
    assert_eq!(config.dataplane.cpus, vec![1, 0]);
    assert!(!config.dataplane.pin_workers);
}

#[test]
fn bad_workers_and_cpus_name_the_key() {
    for (line, key, says) in [
        ("workers = 0", "workers", "between 1 and 1024"),
        ("workers = 5000", "workers", "between 1 and 1024"),
        ("cpus = []", "cpus", "at least one CPU"),
        ("cpus = [0, -1]", "cpus", "-1 is not a CPU number"),
        ("cpus = [2, 2]", "cpus", "CPU 2 is listed twice"),
    ] {
        let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", &format!("[gateway]\n{line}\n"));
        expect_error(&text, line, key, says);
    }
}

#[test]
fn busy_polling_and_its_budget() {
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(
        (
            config.dataplane.busy_poll,
            config.dataplane.busy_poll_budget
        ),
        (Duration::ZERO, 25),
        "defaults: no busy polling; a quarter of a worker's time if turned on"
    );
    let text = with_tunnel(TUNNEL_A).replace(
        "[gateway]\n",
        "[gateway]\nbusy_poll = \"200us\"\nbusy_poll_budget = 10\n",
    );
    let config = scratch.parse(&text).unwrap();
    assert_eq!(config.dataplane.busy_poll, Duration::from_micros(200));
    assert_eq!(config.dataplane.busy_poll_budget, 10);
    for (line, key, says) in [
        (
            "busy_poll_budget = 0",
            "busy_poll_budget",
            "between 1 and 100",
        ),
        (
            "busy_poll_budget = 101",
            "busy_poll_budget",
            "between 1 and 100",
        ),
        ("busy_poll = \"11ms\"", "busy_poll", "at most 10ms"),
    ] {
        let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", &format!("[gateway]\n{line}\n"));
        expect_error(&text, line, key, says);
    }
}

#[test]
fn xdp_names_a_mode_and_defaults_to_off() {
    let scratch = Scratch::new();
    let config = scratch.parse(&with_tunnel(TUNNEL_A)).unwrap();
    assert_eq!(config.dataplane.xdp, datapath::XdpMode::Off);
    for (word, mode) in [
        ("off", datapath::XdpMode::Off),
        ("auto", datapath::XdpMode::Auto),
        ("native", datapath::XdpMode::Native),
        ("generic", datapath::XdpMode::Generic),
    ] {
        let text =
            with_tunnel(TUNNEL_A).replace("[gateway]\n", &format!("[gateway]\nxdp = \"{word}\"\n"));
        assert_eq!(scratch.parse(&text).unwrap().dataplane.xdp, mode, "{word}");
    }
    let line = "xdp = \"on\"";
    let text = with_tunnel(TUNNEL_A).replace("[gateway]\n", &format!("[gateway]\n{line}\n"));
    expect_error(
        &text,
        line,
        "xdp",
        "\"off\", \"auto\", \"native\" or \"generic\"",
    );
}
