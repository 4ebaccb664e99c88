//! `protego ctl filter ...`: the tenants' eBPF filters (issue 18 §1) on a running `protego up`,
//! or on the active control node of the distributed form (which acts on every data node):
//! load, unload, show, and a map's entries (dump, update, delete) so that a tenant can tune
//! its program at run time.

use control::status::{FilterLoad, Request};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::PathBuf;

/// `protego ctl filter ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum FilterCommand {
    /// Run a program of an eBPF object (`clang -O2 -target bpf -c`) on TENANT's traffic,
    /// beside the tenant's others, or in place of the program in the same place (tenant,
    /// direction, object file name, section: a new version of the file): batches in flight
    /// finish with the old program, the next runs the new one, and maps whose declaration did
    /// not change keep their contents. The program is verified first;
    /// nothing changes if it is refused. Kept in the store: a restart runs it.
    Load {
        /// The tenant.
        tenant: String,
        /// `to_cloud` (decrypted traffic toward the VNet) or `from_cloud` (before encryption).
        #[arg(long)]
        direction: String,
        /// The object file (this command reads it).
        #[arg(long, value_name = "FILE")]
        object: PathBuf,
        /// The program's section: `xdp`, or `xdp:FUNCTION` when it holds several.
        #[arg(long)]
        section: Option<String>,
        /// Order among the tenant's filters of the direction, 0..=1000, lower first
        /// (default: the replaced program's, else 0).
        #[arg(long)]
        weight: Option<u32>,
        /// Print the node's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Stop TENANT's filters (all of them, or those of a direction and/or section).
    Unload {
        /// The tenant.
        tenant: String,
        /// Only this direction.
        #[arg(long)]
        direction: Option<String>,
        /// Only this section.
        #[arg(long)]
        section: Option<String>,
        /// Print the node's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// TENANT's filters (verdicts, metered instructions, CPU time) and their maps.
    Show {
        /// The tenant.
        tenant: String,
        /// Print the node's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// A map of TENANT's filters: dump, update or delete entries.
    Map {
        #[command(subcommand)]
        command: MapCommand,
    },
}

/// `protego ctl filter map ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub(crate) enum MapCommand {
    /// Every entry of MAP (keys and values in hex; a per-CPU map's value per worker).
    Dump {
        /// The tenant.
        tenant: String,
        /// The map's name (`OBJECT:NAME` when two of the tenant's objects declare one).
        map: String,
        /// Print the node's JSON answer.
        #[arg(long)]
        json: bool,
    },
    /// Set one entry of MAP (a per-CPU map takes every worker's value, one after the other).
    Update {
        /// The tenant.
        tenant: String,
        /// The map's name (`OBJECT:NAME` when two of the tenant's objects declare one).
        map: String,
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        value: ValueArgs,
        /// `any` (default), `noexist` (only a new key) or `exist` (only an existing key).
        #[arg(long)]
        flags: Option<String>,
    },
    /// Delete one entry of MAP (hash maps).
    Delete {
        /// The tenant.
        tenant: String,
        /// The map's name.
        map: String,
        #[command(flatten)]
        key: KeyArgs,
    },
}

/// A map key: bytes in hex, or a number as the machine stores it (little-endian).
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct KeyArgs {
    /// The key's bytes in hex (`0a000001`, `"0a 00 00 01"`).
    #[arg(long, value_name = "HEX")]
    key: Option<String>,
    /// The key as a 32-bit number (an array's index).
    #[arg(long, value_name = "N")]
    key_u32: Option<u32>,
    /// The key as a 64-bit number.
    #[arg(long, value_name = "N")]
    key_u64: Option<u64>,
}

/// A map value: bytes in hex, or a number as the machine stores it (little-endian).
#[derive(Debug, Clone, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct ValueArgs {
    /// The value's bytes in hex.
    #[arg(long, value_name = "HEX")]
    value: Option<String>,
    /// The value as a 32-bit number.
    #[arg(long, value_name = "N")]
    value_u32: Option<u32>,
    /// The value as a 64-bit number.
    #[arg(long, value_name = "N")]
    value_u64: Option<u64>,
}

/// Hex of a number's little-endian bytes, or the hex given.
fn hex_of(text: &Option<String>, n32: Option<u32>, n64: Option<u64>) -> Option<String> {
    text.clone()
        .or_else(|| n32.map(|n| hex::encode(n.to_le_bytes())))
        .or_else(|| n64.map(|n| hex::encode(n.to_le_bytes())))
}

/// How to print an answer instead of its JSON.
pub(crate) type Summary = Option<fn(&Value) -> String>;

/// The request of `command`, and how to print its answer.
pub(crate) fn request(command: &FilterCommand) -> Result<(Request, Summary), String> {
    let text = |json: bool, f: fn(&Value) -> String| (!json).then_some(f);
    Ok(match command {
        FilterCommand::Load {
            tenant,
            direction,
            object,
            section,
            weight,
            json,
        } => {
            use base64ct::{Base64, Encoding};
            let limit = control::config::MAX_OBJECT_BYTES;
            let size = std::fs::metadata(object)
                .map_err(|e| format!("cannot read {}: {e}", object.display()))?
                .len();
            if size > limit {
                return Err(format!(
                    "{} has {size} bytes; an object may have at most {limit}",
                    object.display()
                ));
            }
            let bytes = std::fs::read(object)
                .map_err(|e| format!("cannot read {}: {e}", object.display()))?;
            let name = object.file_name().map_or_else(
                || object.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            (
                FilterLoad {
                    direction: direction.clone(),
                    object_name: name,
                    object: Base64::encode_string(&bytes),
                    section: section.clone(),
                    weight: *weight,
                }
                .request(tenant.clone()),
                text(*json, changed_summary),
            )
        }
        FilterCommand::Unload {
            tenant,
            direction,
            section,
            json,
        } => (
            Request::FilterUnload {
                tenant: tenant.clone(),
                direction: direction.clone(),
                section: section.clone(),
            },
            text(*json, changed_summary),
        ),
        FilterCommand::Show { tenant, json } => (
            Request::FilterShow {
                tenant: tenant.clone(),
            },
            text(*json, show_summary),
        ),
        FilterCommand::Map { command } => match command {
            MapCommand::Dump { tenant, map, json } => (
                map_request(tenant, map, "dump", None, None, None),
                text(*json, dump_summary),
            ),
            MapCommand::Update {
                tenant,
                map,
                key,
                value,
                flags,
            } => (
                map_request(
                    tenant,
                    map,
                    "update",
                    hex_of(&key.key, key.key_u32, key.key_u64),
                    hex_of(&value.value, value.value_u32, value.value_u64),
                    flags.clone(),
                ),
                None,
            ),
            MapCommand::Delete { tenant, map, key } => (
                map_request(
                    tenant,
                    map,
                    "delete",
                    hex_of(&key.key, key.key_u32, key.key_u64),
                    None,
                    None,
                ),
                None,
            ),
        },
    })
}

fn map_request(
    tenant: &str,
    map: &str,
    op: &str,
    key: Option<String>,
    value: Option<String>,
    flags: Option<String>,
) -> Request {
    Request::FilterMap {
        tenant: tenant.to_owned(),
        map: map.to_owned(),
        op: op.to_owned(),
        key,
        value,
        flags,
    }
}

/// One filter's place as the answers give it: `SECTION of OBJECT DIRECTION (weight W)`.
fn place(v: &Value) -> String {
    let s = |k: &str| v[k].as_str().unwrap_or("?").to_owned();
    format!(
        "{} of {} {} (weight {})",
        s("section"),
        s("object"),
        s("direction"),
        v["weight"].as_u64().unwrap_or(0)
    )
}

/// `load` and `unload`: what changed, and the stored set's generation.
fn changed_summary(answer: &Value) -> String {
    let mut out = String::new();
    let list = |key: &str| answer[key].as_array().cloned().unwrap_or_default();
    if !answer["loaded"].is_null() {
        let _ = writeln!(out, "loaded {}", place(&answer["loaded"]));
        for r in list("replaced") {
            let _ = writeln!(out, "  in place of {}", place(&r));
        }
    }
    for r in list("removed") {
        let _ = writeln!(out, "unloaded {}", place(&r));
    }
    let _ = writeln!(
        out,
        "stored as filter set generation {}",
        answer["generation"].as_u64().unwrap_or(0)
    );
    out
}

/// `show`: the filters as `protego status` lists them, then the maps.
fn show_summary(answer: &Value) -> String {
    let mut out = String::new();
    let tenant = answer["tenant"].as_str().unwrap_or("?");
    let filters: Vec<control::status::FilterStatus> =
        serde_json::from_value(answer["filters"].clone()).unwrap_or_default();
    if filters.is_empty() {
        let _ = writeln!(out, "tenant {tenant} runs no filter");
        return out;
    }
    control::status::render_filters(&mut out, &filters);
    let maps: Vec<control::status::FilterMapStatus> =
        serde_json::from_value(answer["maps"].clone()).unwrap_or_default();
    if !maps.is_empty() {
        let _ = writeln!(out, "maps:");
        for m in maps {
            let per_cpu = if m.copies > 1 {
                format!(", {} values per key", m.copies)
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "  {}:{} ({}, key {} B, value {} B{per_cpu}): {} of {} entries",
                m.object, m.name, m.kind, m.key_size, m.value_size, m.entries, m.max_entries
            );
        }
    }
    out
}

/// `map dump`: one `key: value` line per entry (a per-CPU map's values separated by ` | `);
/// on a control node of the distributed form, each data node's entries under its name.
fn dump_summary(answer: &Value) -> String {
    let mut out = String::new();
    let map = format!(
        "{}:{}",
        answer["map"]["object"].as_str().unwrap_or("?"),
        answer["map"]["name"].as_str().unwrap_or("?")
    );
    let lines = |out: &mut String, entries: &[Value], indent: &str| {
        for e in entries {
            let value = match e["values"].as_array() {
                Some(values) => values
                    .iter()
                    .map(|v| v.as_str().unwrap_or("?"))
                    .collect::<Vec<_>>()
                    .join(" | "),
                None => e["value"].as_str().unwrap_or("?").to_owned(),
            };
            let _ = writeln!(out, "{indent}{}: {value}", e["key"].as_str().unwrap_or("?"));
        }
    };
    if let Some(nodes) = answer["nodes"].as_array() {
        let _ = writeln!(out, "{map} on {} data nodes", nodes.len());
        for n in nodes {
            let entries = n["entries"].as_array().cloned().unwrap_or_default();
            let _ = writeln!(
                out,
                "  {} ({} entries)",
                n["node"].as_str().unwrap_or("?"),
                entries.len()
            );
            lines(&mut out, &entries, "    ");
        }
        return out;
    }
    let entries = answer["entries"].as_array().cloned().unwrap_or_default();
    let _ = writeln!(out, "{map} ({} entries)", entries.len());
    lines(&mut out, &entries, "  ");
    out
}
