//! swanctl.conf generation (strongSwan 5.9 `swanctl.conf(5)`) from Rust structs:
//! IKEv2 (RFC 7296) site-to-site connections with PSK authentication and
//! UDP-encapsulated ESP (RFC 3948, forced with `encap = yes`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::error::{Error, Result};

/// The IKE proposal used throughout the tests unless a test says otherwise.
pub const DEFAULT_IKE_PROPOSAL: &str = "aes256gcm16-prfsha256-x25519";
/// The ESP proposal used throughout the tests unless a test says otherwise.
pub const DEFAULT_ESP_PROPOSAL: &str = "aes256gcm16";

/// What charon does with a CHILD_SA config once loaded (`start_action`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartAction {
    /// Wait for an explicit `swanctl --initiate` or for the peer.
    #[default]
    None,
    /// Initiate immediately after loading.
    Start,
    /// Install a trap policy and initiate on matching traffic.
    Trap,
}

/// What charon does when DPD declares the peer dead, or the peer closes the CHILD_SA.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerAction {
    /// Do nothing (strongSwan's default; `clear`).
    #[default]
    Clear,
    /// Install a trap policy to re-establish on demand.
    Trap,
    /// Re-initiate immediately.
    Start,
}

impl StartAction {
    fn as_str(self) -> &'static str {
        match self {
            StartAction::None => "none",
            StartAction::Start => "start",
            StartAction::Trap => "trap",
        }
    }
}

impl PeerAction {
    fn as_str(self) -> &'static str {
        match self {
            PeerAction::Clear => "clear",
            PeerAction::Trap => "trap",
            PeerAction::Start => "start",
        }
    }
}

/// A CHILD_SA configuration (`connections.<conn>.children.<child>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChildConfig {
    /// The child's name (used with `swanctl --initiate --child`).
    pub name: String,
    /// Local traffic selectors (`10.1.0.0/24`, ...).
    pub local_ts: Vec<String>,
    /// Remote traffic selectors.
    pub remote_ts: Vec<String>,
    /// ESP proposals (`aes256gcm16`, ...).
    pub esp_proposals: Vec<String>,
    /// What to do after loading.
    pub start_action: StartAction,
    /// What to do when DPD finds the peer dead.
    pub dpd_action: PeerAction,
    /// What to do when the peer closes the CHILD_SA.
    pub close_action: PeerAction,
    /// Rekey the CHILD_SA after this long (`rekey_time`).
    pub rekey_time: Option<Duration>,
    /// Hard lifetime (`life_time`).
    pub life_time: Option<Duration>,
    /// Random jitter subtracted from `rekey_time` (`rand_time`; 0 = exact).
    pub rand_time: Option<Duration>,
    /// Rekey after this many bytes (`rekey_bytes`).
    pub rekey_bytes: Option<u64>,
    /// Rekey after this many packets (`rekey_packets`).
    pub rekey_packets: Option<u64>,
}

/// An IKE connection (`connections.<name>`), authenticated by a pre-shared key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Connection name (used with `--ike`).
    pub name: String,
    /// Local addresses (`local_addrs`; `%any` allowed).
    pub local_addrs: Vec<String>,
    /// Remote addresses (`remote_addrs`; `%any` allowed for responders).
    pub remote_addrs: Vec<String>,
    /// Local IKE port (`local_port`; default 500).
    pub local_port: Option<u16>,
    /// Remote IKE port (`remote_port`; default 500).
    pub remote_port: Option<u16>,
    /// Local IKE identity.
    pub local_id: String,
    /// Remote IKE identity.
    pub remote_id: String,
    /// The pre-shared key (any bytes; written hex-encoded).
    pub psk: String,
    /// IKE proposals.
    pub proposals: Vec<String>,
    /// Force UDP encapsulation of ESP (`encap`); required with kernel-libipsec.
    pub encap: bool,
    /// Enable MOBIKE (RFC 4555).
    pub mobike: bool,
    /// Rekey the IKE SA after this long (`rekey_time`).
    pub rekey_time: Option<Duration>,
    /// Reauthenticate after this long (`reauth_time`).
    pub reauth_time: Option<Duration>,
    /// Random jitter for IKE rekeying (`rand_time`).
    pub rand_time: Option<Duration>,
    /// Hard IKE lifetime margin (`over_time`).
    pub over_time: Option<Duration>,
    /// Dead-peer-detection interval (`dpd_delay`).
    pub dpd_delay: Option<Duration>,
    /// Number of initiation attempts (`keyingtries`; 0 = forever).
    pub keyingtries: Option<u32>,
    /// Uniqueness policy (`unique`: `no`, `never`, `keep`, `replace`).
    pub unique: Option<String>,
    /// The CHILD_SAs.
    pub children: Vec<ChildConfig>,
}

/// A whole swanctl.conf: connections plus the PSK secrets they use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SwanctlConfig {
    /// The connections.
    pub connections: Vec<Connection>,
}

impl ChildConfig {
    /// A tunnel-mode child between `local_ts` and `remote_ts` with the default
    /// ESP proposal and `start_action = none`.
    pub fn new(name: &str, local_ts: &[&str], remote_ts: &[&str]) -> ChildConfig {
        ChildConfig {
            name: name.to_owned(),
            local_ts: local_ts.iter().map(|s| (*s).to_owned()).collect(),
            remote_ts: remote_ts.iter().map(|s| (*s).to_owned()).collect(),
            esp_proposals: vec![DEFAULT_ESP_PROPOSAL.to_owned()],
            start_action: StartAction::None,
            dpd_action: PeerAction::Clear,
            close_action: PeerAction::Clear,
            rekey_time: None,
            life_time: None,
            rand_time: None,
            rekey_bytes: None,
            rekey_packets: None,
        }
    }

    /// The same child seen from the other side (selectors swapped).
    pub fn mirrored(&self) -> ChildConfig {
        ChildConfig {
            local_ts: self.remote_ts.clone(),
            remote_ts: self.local_ts.clone(),
            start_action: StartAction::None,
            ..self.clone()
        }
    }
}

impl Connection {
    /// A site-to-site connection with the default proposals, `encap = yes`,
    /// MOBIKE off, and one child.
    #[allow(clippy::too_many_arguments)]
    pub fn site_to_site(
        name: &str,
        local_addr: &str,
        remote_addr: &str,
        local_id: &str,
        remote_id: &str,
        psk: &str,
        child: ChildConfig,
    ) -> Connection {
        Connection {
            name: name.to_owned(),
            local_addrs: vec![local_addr.to_owned()],
            remote_addrs: vec![remote_addr.to_owned()],
            local_port: None,
            remote_port: None,
            local_id: local_id.to_owned(),
            remote_id: remote_id.to_owned(),
            psk: psk.to_owned(),
            proposals: vec![DEFAULT_IKE_PROPOSAL.to_owned()],
            encap: true,
            mobike: false,
            rekey_time: None,
            reauth_time: None,
            rand_time: None,
            over_time: None,
            dpd_delay: None,
            keyingtries: Some(1),
            unique: None,
            children: vec![child],
        }
    }

    /// The responder's view of this connection: addresses, identities and
    /// selectors swapped, `remote_addrs` set to `remote_addrs` (e.g. `%any` when
    /// the initiator is behind NAT).
    pub fn mirrored(&self, local_addrs: &[&str], remote_addrs: &[&str]) -> Connection {
        Connection {
            local_addrs: local_addrs.iter().map(|s| (*s).to_owned()).collect(),
            remote_addrs: remote_addrs.iter().map(|s| (*s).to_owned()).collect(),
            local_port: self.remote_port,
            remote_port: self.local_port,
            local_id: self.remote_id.clone(),
            remote_id: self.local_id.clone(),
            children: self.children.iter().map(ChildConfig::mirrored).collect(),
            ..self.clone()
        }
    }

    fn validate(&self) -> Result<()> {
        let field = |f: &str| format!("connections.{}.{f}", self.name);
        if !is_identifier(&self.name) {
            return Err(Error::InvalidSpec {
                field: "connections[].name".to_owned(),
                reason: format!("`{}` must be [A-Za-z0-9_-]+", self.name),
            });
        }
        if self.children.is_empty() {
            return Err(Error::InvalidSpec {
                field: field("children"),
                reason: "at least one child is required".to_owned(),
            });
        }
        if self.psk.is_empty() {
            return Err(Error::InvalidSpec {
                field: field("psk"),
                reason: "the pre-shared key must not be empty".to_owned(),
            });
        }
        for c in &self.children {
            if !is_identifier(&c.name) {
                return Err(Error::InvalidSpec {
                    field: field("children[].name"),
                    reason: format!("`{}` must be [A-Za-z0-9_-]+", c.name),
                });
            }
            if c.local_ts.is_empty() || c.remote_ts.is_empty() {
                return Err(Error::InvalidSpec {
                    field: field(&format!("children.{}", c.name)),
                    reason: "local_ts and remote_ts are required".to_owned(),
                });
            }
        }
        Ok(())
    }
}

impl SwanctlConfig {
    /// A configuration holding `connections`.
    pub fn new(connections: Vec<Connection>) -> SwanctlConfig {
        SwanctlConfig { connections }
    }

    /// Renders the swanctl.conf text (connections and `secrets`).
    pub fn render(&self) -> Result<String> {
        let mut out = String::from("# generated by protego-testbed\nconnections {\n");
        for c in &self.connections {
            c.validate()?;
            render_connection(&mut out, c);
        }
        out.push_str("}\n\nsecrets {\n");
        for c in &self.connections {
            let _ = writeln!(out, "  ike-{} {{", c.name);
            let _ = writeln!(out, "    id-1 = {}", quote(&c.local_id));
            let _ = writeln!(out, "    id-2 = {}", quote(&c.remote_id));
            let _ = writeln!(out, "    secret = 0x{}", hex(c.psk.as_bytes()));
            out.push_str("  }\n");
        }
        out.push_str("}\n");
        Ok(out)
    }
}

fn render_connection(out: &mut String, c: &Connection) {
    let _ = writeln!(out, "  {} {{", c.name);
    let kv = |out: &mut String, indent: usize, k: &str, v: &str| {
        let _ = writeln!(out, "{:indent$}{k} = {v}", "");
    };
    kv(out, 4, "version", "2");
    kv(out, 4, "local_addrs", &list(&c.local_addrs));
    kv(out, 4, "remote_addrs", &list(&c.remote_addrs));
    if let Some(p) = c.local_port {
        kv(out, 4, "local_port", &p.to_string());
    }
    if let Some(p) = c.remote_port {
        kv(out, 4, "remote_port", &p.to_string());
    }
    kv(out, 4, "proposals", &list(&c.proposals));
    kv(out, 4, "encap", yes_no(c.encap));
    kv(out, 4, "mobike", yes_no(c.mobike));
    for (k, v) in [
        ("rekey_time", c.rekey_time),
        ("reauth_time", c.reauth_time),
        ("rand_time", c.rand_time),
        ("over_time", c.over_time),
        ("dpd_delay", c.dpd_delay),
    ] {
        if let Some(d) = v {
            kv(out, 4, k, &secs(d));
        }
    }
    if let Some(k) = c.keyingtries {
        kv(out, 4, "keyingtries", &k.to_string());
    }
    if let Some(u) = &c.unique {
        kv(out, 4, "unique", &quote(u));
    }
    out.push_str("    local {\n      auth = psk\n");
    kv(out, 6, "id", &quote(&c.local_id));
    out.push_str("    }\n    remote {\n      auth = psk\n");
    kv(out, 6, "id", &quote(&c.remote_id));
    out.push_str("    }\n    children {\n");
    for ch in &c.children {
        let _ = writeln!(out, "      {} {{", ch.name);
        kv(out, 8, "mode", "tunnel");
        kv(out, 8, "local_ts", &list(&ch.local_ts));
        kv(out, 8, "remote_ts", &list(&ch.remote_ts));
        kv(out, 8, "esp_proposals", &list(&ch.esp_proposals));
        kv(out, 8, "start_action", ch.start_action.as_str());
        kv(out, 8, "dpd_action", ch.dpd_action.as_str());
        kv(out, 8, "close_action", ch.close_action.as_str());
        for (k, v) in [
            ("rekey_time", ch.rekey_time),
            ("life_time", ch.life_time),
            ("rand_time", ch.rand_time),
        ] {
            if let Some(d) = v {
                kv(out, 8, k, &secs(d));
            }
        }
        if let Some(b) = ch.rekey_bytes {
            kv(out, 8, "rekey_bytes", &b.to_string());
        }
        if let Some(p) = ch.rekey_packets {
            kv(out, 8, "rekey_packets", &p.to_string());
        }
        out.push_str("      }\n");
    }
    out.push_str("    }\n  }\n");
}

fn is_identifier(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs())
}

/// A comma-separated list value, quoted as a whole if any item needs it.
fn list(items: &[String]) -> String {
    let joined = items.join(",");
    if items.iter().all(|s| is_bare(s)) {
        joined
    } else {
        quote_always(&joined)
    }
}

fn is_bare(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@%*".contains(&b))
}

/// Quotes a value unless it consists only of characters swanctl.conf takes bare.
fn quote(s: &str) -> String {
    if is_bare(s) {
        s.to_owned()
    } else {
        quote_always(s)
    }
}

fn quote_always(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Connection {
        let mut c = Connection::site_to_site(
            "s2s",
            "198.51.100.2",
            "198.51.100.1",
            "hq.example",
            "gw.example",
            "sekrit",
            ChildConfig::new("net", &["10.1.0.0/24"], &["10.2.0.0/24", "fd00:2::/64"]),
        );
        c.dpd_delay = Some(Duration::from_secs(5));
        c
    }

    #[test]
    fn renders_connection_and_secret() {
        let text = SwanctlConfig::new(vec![sample()])
            .render()
            .expect("valid config");
        for needle in [
            "  s2s {",
            "local_addrs = 198.51.100.2",
            "proposals = aes256gcm16-prfsha256-x25519",
            "encap = yes",
            "dpd_delay = 5s",
            "remote_ts = 10.2.0.0/24,fd00:2::/64",
            "esp_proposals = aes256gcm16",
            "start_action = none",
            "id-1 = hq.example",
            "secret = 0x73656b726974",
        ] {
            assert!(text.contains(needle), "missing `{needle}` in\n{text}");
        }
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }

    #[test]
    fn mirrored_swaps_sides() {
        let m = sample().mirrored(&["198.51.100.1"], &["%any"]);
        assert_eq!(m.local_id, "gw.example");
        assert_eq!(m.remote_addrs, vec!["%any".to_owned()]);
        assert_eq!(m.children[0].local_ts, vec!["10.2.0.0/24", "fd00:2::/64"]);
    }

    #[test]
    fn rejects_invalid() {
        let mut c = sample();
        c.name = "bad name".to_owned();
        assert!(SwanctlConfig::new(vec![c]).render().is_err());
        let mut c = sample();
        c.children.clear();
        assert!(SwanctlConfig::new(vec![c]).render().is_err());
    }

    #[test]
    fn quotes_odd_values() {
        assert_eq!(quote("C=CH, O=x"), "\"C=CH, O=x\"");
        assert_eq!(quote("a\"b"), "\"a\\\"b\"");
        assert_eq!(quote("%any"), "%any");
    }
}
