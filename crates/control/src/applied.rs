//! The configuration applied with `protego ctl apply`, as the store keeps it.
//!
//! An apply replaces the running node's tenants, VNets and tunnels (see
//! [`Config::with_inventory`]). So that a restarted control node, or the standby that takes
//! over, runs the same tunnels under the same ids (ids key the stored IKE SAs), the applied
//! inventory is written to the store before anything changes: the text as given, where it came
//! from, every tunnel's id, the next free id, and the PSKs read from the `psk_file`s at apply
//! time. The record is as secret as the IKE SA snapshots next to it, and is handled in
//! [`Zeroizing`] buffers.
//!
//! At start ([`effective`]) a stored record wins over the configuration file's tenants, VNets
//! and tunnels: the node-wide sections still come from the file. A node whose file's
//! inventory differs says so in a warning; `protego ctl apply -f FILE` makes the file's
//! inventory the running one again.

use crate::config::{Config, StoredPsks};
use crate::error::Error;
use crate::store::Store;
use ike::TunnelId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use zeroize::Zeroizing;

/// Version of the record's encoding.
const VERSION: u32 = 1;

/// One applied configuration.
#[derive(Clone)]
pub struct AppliedConfig {
    /// 1 for the first apply, then one more for each.
    pub generation: u64,
    /// When it was applied (wall clock).
    pub applied_at: SystemTime,
    /// The file it was read from (on the host of `protego ctl apply`; for messages and for
    /// nothing else).
    pub source: PathBuf,
    /// The file's text.
    pub text: String,
    /// Every tunnel's id by name.
    pub ids: BTreeMap<String, TunnelId>,
    /// The next id a new tunnel gets.
    pub next_id: u32,
    /// Every tunnel's PSK by name (secret).
    pub psks: StoredPsks,
}

impl fmt::Debug for AppliedConfig {
    /// Everything but the PSKs, of which only the tunnel names are printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppliedConfig")
            .field("generation", &self.generation)
            .field("applied_at", &self.applied_at)
            .field("source", &self.source)
            .field("text", &format_args!("<{} bytes>", self.text.len()))
            .field("ids", &self.ids)
            .field("next_id", &self.next_id)
            .field("psks", &self.psks)
            .finish()
    }
}

/// Hex of secret bytes, written straight into the output (no intermediate string).
struct Hex<'a>(&'a [u8]);

impl Serialize for Hex<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[derive(Serialize)]
struct WireOut<'a> {
    version: u32,
    generation: u64,
    applied_at_ms: u64,
    source: String,
    text: &'a str,
    ids: BTreeMap<&'a str, u32>,
    next_id: u32,
    psks: BTreeMap<&'a str, Hex<'a>>,
}

#[derive(Deserialize)]
struct WireIn<'a> {
    version: u32,
    generation: u64,
    applied_at_ms: u64,
    source: String,
    text: String,
    ids: BTreeMap<String, u32>,
    next_id: u32,
    /// Borrowed (hex has nothing to unescape); a `Cow` so that a damaged record whose string
    /// has escapes fails in hex decoding, whose error quotes nothing, not in serde's.
    #[serde(borrow)]
    psks: BTreeMap<String, std::borrow::Cow<'a, str>>,
}

impl AppliedConfig {
    /// The record of `config` (whose tunnels carry their final ids), applied now from `text`
    /// read at `source`.
    pub fn new(
        config: &Config,
        text: String,
        source: PathBuf,
        generation: u64,
        next_id: u32,
    ) -> Self {
        Self {
            generation,
            applied_at: SystemTime::now(),
            source,
            text,
            ids: config.tunnel_ids(),
            next_id,
            psks: config
                .tunnels
                .iter()
                .map(|t| (t.peer.name.clone(), t.peer.psk.clone()))
                .collect(),
        }
    }

    /// The record's bytes (secret).
    pub fn encode(&self) -> Zeroizing<Vec<u8>> {
        let wire = WireOut {
            version: VERSION,
            generation: self.generation,
            applied_at_ms: self
                .applied_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            source: self.source.display().to_string(),
            text: &self.text,
            ids: self.ids.iter().map(|(n, id)| (n.as_str(), id.0)).collect(),
            next_id: self.next_id,
            psks: self
                .psks
                .iter()
                .map(|(n, psk)| (n.as_str(), Hex(psk)))
                .collect(),
        };
        // Sized up front so that no growing copy of the PSKs is left behind in freed memory.
        let psk_bytes: usize = self
            .psks
            .iter()
            .map(|(n, p)| n.len() + 2 * p.len() + 8)
            .sum();
        let ids: usize = self.ids.keys().map(|n| n.len() + 16).sum();
        let mut out = Zeroizing::new(Vec::with_capacity(
            2 * self.text.len() + psk_bytes + ids + self.source.as_os_str().len() + 256,
        ));
        // Serializing plain strings and maps into a Vec cannot fail.
        if serde_json::to_writer(&mut *out, &wire).is_err() {
            out.clear();
        }
        out
    }

    /// Reads a record written by [`AppliedConfig::encode`].
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let wire: WireIn<'_> =
            serde_json::from_slice(bytes).map_err(|e| format!("unreadable record: {e}"))?;
        if wire.version != VERSION {
            return Err(format!(
                "record version {} (this Protego reads version {VERSION})",
                wire.version
            ));
        }
        let mut psks = StoredPsks::new();
        for (name, hex_text) in wire.psks {
            let psk = Zeroizing::new(
                hex::decode(hex_text.as_bytes())
                    .map_err(|_| format!("the PSK of tunnel {name:?} is not hex"))?,
            );
            psks.insert(name, psk);
        }
        Ok(Self {
            generation: wire.generation,
            applied_at: UNIX_EPOCH + Duration::from_millis(wire.applied_at_ms),
            source: PathBuf::from(wire.source),
            text: wire.text,
            ids: wire
                .ids
                .into_iter()
                .map(|(n, id)| (n, TunnelId(id)))
                .collect(),
            next_id: wire.next_id,
            psks,
        })
    }

    /// The configuration to run: `node`'s own sections with this record's tenants, VNets and
    /// tunnels, under their recorded ids.
    pub fn config(&self, node: &Config) -> Result<Config, Error> {
        let mut config = node.with_inventory(&self.text, &self.source, Some(&self.psks))?;
        let mut next = self.next_id;
        config.keep_ids(&self.ids, &mut next);
        Ok(config)
    }
}

/// The configuration a starting control node runs: `file`, or, once a configuration was
/// applied with `protego ctl apply`, `file`'s node-wide sections with the applied tenants,
/// VNets and tunnels (the stored record is returned too; a warning says when the file's own
/// differ). A record that cannot be read or no longer validates against `file`'s sections
/// fails the start with an error that says so: silently running the file's older tunnels would
/// drop the IKE SAs of the applied ones. With `discard` the record is deleted first and `file`
/// runs as it is (`--discard-applied`).
pub fn effective(
    file: Config,
    store: &mut dyn Store,
    discard: bool,
) -> Result<(Config, Option<AppliedConfig>), Error> {
    if discard {
        store.commit(&[crate::store::Change::DeleteConfig])?;
        tracing::warn!(store = %store.describe(), config = %file.path.display(),
            "applied configuration discarded; running the file's tenants, VNets and tunnels");
        return Ok((file, None));
    }
    let Some(bytes) = store.applied_config()? else {
        return Ok((file, None));
    };
    let applied_error = |detail: String| Error::Applied {
        store: store.describe(),
        detail,
    };
    let record = AppliedConfig::decode(&bytes).map_err(applied_error)?;
    let config = record.config(&file).map_err(|e| {
        applied_error(format!(
            "{e} (applied from {} does not fit the node-wide sections of {}: fix those, or \
             start once with --discard-applied to run the file's tenants, VNets and tunnels)",
            record.source.display(),
            file.path.display()
        ))
    })?;
    if same_inventory(&file, &config) {
        tracing::info!(generation = record.generation, source = %record.source.display(),
            "running the applied configuration (the same tenants, VNets and tunnels as the file)");
    } else {
        tracing::warn!(generation = record.generation, source = %record.source.display(),
            config = %file.path.display(),
            "running the tenants, VNets and tunnels applied with `protego ctl apply`, not the file's \
             (apply the file to make it the running one, or start with --discard-applied)");
    }
    Ok((config, Some(record)))
}

/// True if `a` and `b` have the same tenants, VNets and tunnels (names, settings, PSKs).
pub fn same_inventory(a: &Config, b: &Config) -> bool {
    a.tenants == b.tenants
        && a.dataplane.vnets == b.dataplane.vnets
        && a.tunnels.len() == b.tunnels.len()
        && a.tunnels.iter().zip(&b.tunnels).all(|(x, y)| {
            x.peer.name == y.peer.name
                && crate::config::tunnel_change(x, y) == crate::config::TunnelChange::Same
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_encoding_and_never_prints_its_psks() {
        let mut psks = StoredPsks::new();
        psks.insert("a".into(), Zeroizing::new(b"secret-psk\n\"x".to_vec()));
        let record = AppliedConfig {
            generation: 3,
            applied_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            source: PathBuf::from("/etc/protego/new.toml"),
            text: "[[tenant]]\nname = \"acme\"\n# \"quoted\" \\ text\n".into(),
            ids: [("a".to_owned(), TunnelId(7))].into_iter().collect(),
            next_id: 9,
            psks,
        };
        let bytes = record.encode();
        let back = AppliedConfig::decode(&bytes).expect("decode");
        assert_eq!(back.generation, 3);
        assert_eq!(back.applied_at, record.applied_at);
        assert_eq!(back.source, record.source);
        assert_eq!(back.text, record.text);
        assert_eq!(back.ids, record.ids);
        assert_eq!(back.next_id, 9);
        assert_eq!(back.psks.get("a").unwrap().as_slice(), b"secret-psk\n\"x");
        let debug = format!("{back:?}");
        assert!(!debug.contains("secret"), "{debug}");
    }

    #[test]
    fn a_bad_record_is_refused_with_a_reason() {
        assert!(AppliedConfig::decode(b"{")
            .unwrap_err()
            .contains("unreadable"));
        let other = br#"{"version":99,"generation":1,"applied_at_ms":0,"source":"x","text":"","ids":{},"next_id":1,"psks":{}}"#;
        assert!(AppliedConfig::decode(other)
            .unwrap_err()
            .contains("version 99"));
        let bad_hex = br#"{"version":1,"generation":1,"applied_at_ms":0,"source":"x","text":"","ids":{},"next_id":1,"psks":{"t":"zz"}}"#;
        assert!(AppliedConfig::decode(bad_hex)
            .unwrap_err()
            .contains("\"t\""));
    }
}
