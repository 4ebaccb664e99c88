//! `protego control`, `protego data`, `protego steer` (the distributed form's processes) and
//! `protego ctl` (operator commands to a running control node). Each process hooks the
//! signals first, starts its parts (see the `cluster` crate), and on SIGINT/SIGTERM stops
//! them in reverse order.

use crate::up::init_logging;
use cluster::control_node::ControlNode;

use cluster::data_node::DataNode;
use cluster::node_config::NodeConfig;
use cluster::steer_node::SteerNodeProcess;
use control::status::Request;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tracing::{error, info};

/// How long a stopping control node waits for the peers' answers to its DELETEs.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);
/// How often the main thread checks that the parts still run.
const WATCHDOG: Duration = Duration::from_millis(500);
/// How long `protego ctl` waits for an answer (moves wait for rekeys with the peers; the
/// control node gives up on a move after 30 s).
const CTL_TIMEOUT: Duration = Duration::from_secs(45);

/// Which node process.
#[derive(Debug, Clone, Copy)]
pub(crate) enum NodeKind {
    Data,
    Steer,
}

/// Hooks SIGINT/SIGTERM; the receiver yields once per signal.
fn signals() -> Result<crossbeam_channel::Receiver<()>, ExitCode> {
    let (tx, rx) = crossbeam_channel::bounded::<()>(1);
    ctrlc::set_handler(move || {
        let _ = tx.try_send(());
    })
    .map_err(|e| {
        eprintln!("error: cannot install the signal handler: {e}");
        ExitCode::FAILURE
    })?;
    Ok(rx)
}

/// Waits for a signal while `alive` holds.
fn wait(signal: &crossbeam_channel::Receiver<()>, alive: impl Fn() -> bool) -> bool {
    loop {
        match signal.recv_timeout(WATCHDOG) {
            Ok(()) => return true,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) if alive() => {}
            Err(_) => return false,
        }
    }
}

/// `protego control --config FILE`.
pub(crate) fn run_control(path: &Path, log_level: &str, discard_applied: bool) -> ExitCode {
    let config = match crate::up::load_and_log(path, log_level) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let signal = match signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let election = match cluster::control_node::elect(&config, &signal) {
        Ok(e) => e,
        Err(cluster::control_node::ControlNodeError::Cancelled) => return ExitCode::SUCCESS,
        Err(e) => {
            error!(error = %e, "protego control stopped");
            return ExitCode::FAILURE;
        }
    };
    let node = match ControlNode::start(&config, election, discard_applied) {
        Ok(n) => n,
        Err(e) => {
            error!(error = %e, "protego control stopped");
            return ExitCode::FAILURE;
        }
    };
    let clean = wait(&signal, || node.is_running());
    info!("shutting down");
    node.shutdown(SHUTDOWN_GRACE);
    info!("stopped");
    if clean {
        ExitCode::SUCCESS
    } else {
        error!("the control loop stopped unexpectedly");
        ExitCode::FAILURE
    }
}

/// `protego data --config FILE` and `protego steer --config FILE`.
pub(crate) fn run_node(kind: NodeKind, path: &Path, log_level: &str) -> ExitCode {
    let config = match NodeConfig::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = init_logging(config.node.log_format, log_level) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let signal = match signals() {
        Ok(s) => s,
        Err(code) => return code,
    };
    let result = match kind {
        NodeKind::Data => DataNode::start(&config).map(|n| {
            wait(&signal, || true);
            info!("shutting down");
            n.shutdown();
        }),
        NodeKind::Steer => SteerNodeProcess::start(&config).map(|n| {
            wait(&signal, || true);
            info!("shutting down");
            n.shutdown();
        }),
    };
    match result {
        Ok(()) => {
            info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = %e, "node stopped");
            ExitCode::FAILURE
        }
    }
}

/// Options of `protego ctl`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CtlArgs {
    /// Control socket of the control node (default: the configuration's `control_socket`).
    #[arg(short, long, value_name = "PATH", global = true)]
    socket: Option<PathBuf>,
    /// Read the socket path from this configuration file.
    #[arg(
        short,
        long,
        value_name = "FILE",
        global = true,
        conflicts_with = "socket"
    )]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: CtlCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum CtlCommand {
    /// The data and steer nodes: role, address, liveness, tunnels, load.
    Nodes,
    /// The autoscaler (the provisioning model on the data nodes' load reports): used and
    /// predicted capacity, the reserve, hotspots, and its decisions with their reasons; with
    /// `[cluster.autoscale] mode = "act"` whether each was carried out.
    Capacity,
    /// Self-dispatch (`[cluster.dispatch] mode = "self"`): the ring of data nodes, how many
    /// virtual MACs each owns per VNet, their loads, and the last moves along the ring.
    Dispatch {
        #[command(subcommand)]
        command: DispatchCommand,
    },
    /// Move a tunnel to another data node without loss: rekey with the peer, install the new
    /// SA on the target, steer it there, delete the old SA once the peer uses the new one. Or
    /// move a customer attachment: the steer nodes send its CE's frames and its prefixes'
    /// VXLAN to the target (which already holds it), answered once they all confirmed.
    Migrate {
        /// The tunnel's or the attachment's name.
        tunnel: String,
        /// The data node to move it to.
        #[arg(long, value_name = "NODE")]
        to: String,
    },
    /// Move every tunnel and attachment off a data node without loss and place nothing new on
    /// it (maintenance). `undrain` ends it.
    Drain {
        /// The data node.
        node: String,
    },
    /// Let a drained data node take tunnels again.
    Undrain {
        /// The data node.
        node: String,
    },
    /// The state store: `rotate-key` makes a new encryption key current (works on `protego up` and on
    /// the active control node).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// The per-VM overlay routes (VM address -> host VTEP, per VNet; they win over the VNet's
    /// prefix routes): add, move, delete, or load a file. Works on `protego up`; kept across
    /// restarts beside its state store.
    Route {
        #[command(subcommand)]
        command: RouteCommand,
    },
    /// The tenants' eBPF filters (works on `protego up`): load, unload, show, and a map's
    /// entries (dump, update, delete). Changes are kept in the store.
    Filter {
        #[command(subcommand)]
        command: crate::filterctl::FilterCommand,
    },
    /// Replace the running tenants, VNets and tunnels with FILE's, validated whole first
    /// (nothing changes on an error). Works on `protego up` and on the active control node.
    /// FILE may be a whole configuration file (its [gateway], [store] and [cluster] are
    /// ignored: they change only with a restart) or only [[tenant]], [[vnet]] and [[tunnel]]
    /// tables. The node reads the `psk_file`s (relative ones from FILE's directory) and keeps
    /// the result in its store, so a restart or a takeover runs it too.
    Apply {
        /// The configuration file.
        #[arg(short = 'f', long = "file", value_name = "FILE")]
        file: PathBuf,
        /// Only show what would change.
        #[arg(long)]
        dry_run: bool,
        /// Print the node's JSON answer instead of the summary.
        #[arg(long)]
        json: bool,
    },
}

/// `protego ctl dispatch ...`.
#[derive(Debug, Clone, clap::Subcommand)]
enum DispatchCommand {
    /// Owners, loads and the last moves.
    Show {
        /// Print the node's JSON answer instead of the table.
        #[arg(long)]
        json: bool,
    },
}

/// What `protego ctl dispatch show` prints.
fn dispatch_summary(answer: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let mode = answer["mode"].as_str().unwrap_or("?");
    if mode != "self" {
        let _ = writeln!(
            out,
            "mode {mode}: the hosts send VXLAN to the steer nodes (no virtual MACs)"
        );
        return out;
    }
    let ring: Vec<&str> = answer["ring"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str())
        .collect();
    let _ = writeln!(
        out,
        "mode self, {} virtual MACs per VNet; ring: {}",
        answer["vmacs"],
        if ring.is_empty() {
            "(no data node)".to_owned()
        } else {
            ring.join(" -> ")
        }
    );
    let nodes = answer["nodes"].as_array().cloned().unwrap_or_default();
    let mut vnis: Vec<String> = nodes
        .iter()
        .filter_map(|n| n["owned"].as_object())
        .flat_map(|o| o.keys().cloned())
        .collect();
    vnis.sort_by_key(|v| v.parse::<u32>().unwrap_or(u32::MAX));
    vnis.dedup();
    let _ = write!(out, "{:<16} {:<16} {:>5}", "NODE", "VTEP", "BUSY");
    for v in &vnis {
        let _ = write!(out, "  {:>16}", format!("VNI {v}"));
    }
    let _ = writeln!(out);
    for n in &nodes {
        let busy = n["utilization"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |u| format!("{:.0}%", u * 100.0));
        let _ = write!(
            out,
            "{:<16} {:<16} {:>5}",
            n["name"].as_str().unwrap_or("?"),
            n["vtep"].as_str().unwrap_or("-"),
            busy
        );
        for v in &vnis {
            let owned = n["owned"][v].as_u64().unwrap_or(0);
            let load = n["loads"][v]
                .as_f64()
                .map_or_else(String::new, |l| format!(" ({:.0}%)", l * 100.0));
            let _ = write!(out, "  {:>16}", format!("{owned}{load}"));
        }
        if n["confirmed"] == serde_json::Value::Bool(false) {
            let _ = write!(out, "  (table not confirmed yet)");
        }
        let _ = writeln!(out);
    }
    let moves = answer["moves"].as_array().cloned().unwrap_or_default();
    if moves.is_empty() {
        let _ = writeln!(out, "no moves yet");
    } else {
        let _ = writeln!(out, "last moves (newest first):");
    }
    for m in &moves {
        let ago = m["ago_ms"].as_u64().unwrap_or(0) as f64 / 1000.0;
        let from = m["from"].as_str().unwrap_or("every node");
        let loads = match m["loads"].as_array().map(Vec::as_slice) {
            Some([a, b]) => match (a.as_f64(), b.as_f64()) {
                (Some(a), Some(b)) => format!(", loads {:.0}% and {:.0}%", a * 100.0, b * 100.0),
                _ => String::new(),
            },
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  {ago:>8.1}s ago  VNI {}  {from} -> {}  {} virtual MAC(s)  ({}{loads})",
            m["vni"],
            m["to"].as_str().unwrap_or("?"),
            m["vmacs"],
            m["why"].as_str().unwrap_or("?"),
        );
    }
    out
}

/// `protego ctl route ...`.
#[derive(Debug, Clone, clap::Subcommand)]
enum RouteCommand {
    /// Point VM ADDRESS of VNET (of TENANT) at HOST's VTEP: adds the entry, or moves the VM
    /// (its next packet goes to HOST).
    Add {
        /// The VNet's tenant.
        tenant: String,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: String,
        /// The underlay address of the VTEP of the host the VM runs on.
        host: String,
    },
    /// Remove the entry of VM ADDRESS (the VNet's prefix routes apply to it again).
    Del {
        /// The VNet's tenant.
        tenant: String,
        /// The VNet's name.
        vnet: String,
        /// The VM's address.
        address: String,
    },
    /// Add or replace every entry of FILE: one `tenant,vnet,address,host` per line (CSV,
    /// header optional, `#` comments) or JSON lines
    /// (`{"tenant":..,"vnet":..,"address":..,"host":..}`), checked whole first (an error names
    /// the line and field; nothing changes then). The node reads FILE.
    Load {
        /// The route file.
        file: PathBuf,
    },
}

/// `protego ctl store ...`.
#[derive(Debug, Clone, clap::Subcommand)]
enum StoreCommand {
    /// Make a new key current for new records. In the distributed form, first append the new
    /// key's line to `[store] encryption_key_file` on every control node (`printf '%u %s\n'
    /// "0x$(openssl rand -hex 4)" "$(openssl rand -hex 32)"` makes one), then run this on the
    /// active node: it re-reads its key file and makes the file's last key current. If that is
    /// already current (`protego up`, one node), it generates a key under a random id and
    /// appends it to the file (replaced atomically, mode 0600). Records under older keys are
    /// re-encrypted in the background (`protego status` shows the progress).
    RotateKey {
        /// Print the node's JSON answer instead of the instructions.
        #[arg(long)]
        json: bool,
    },
}

/// What `protego ctl store rotate-key` prints: the new key id and what the operator must do.
fn rotation_summary(answer: &serde_json::Value) -> String {
    let id = answer["key_id"].as_u64().unwrap_or(0);
    let file = answer["key_file"].as_str().unwrap_or("the key file");
    let pending = answer["reencrypt_pending"].as_u64().unwrap_or(0);
    let generated = answer["generated"].as_bool().unwrap_or(false);
    let mut out = if generated {
        format!(
            "generated store encryption key {id} and appended it to {file}; new records are \
             sealed with it now.\n\
             With other control nodes, append the line of key {id} from {file} to their key \
             files now: a node without it cannot read the store when it takes over. (Next \
             time, add the new key to every node's key file first, then run rotate-key: see \
             docs/operations.md.)\n"
        )
    } else {
        format!(
            "key {id}, the last line of {file}, is now the current store encryption key; new \
             records are sealed with it now.\n\
             Every other control node's key file must hold key {id} as well.\n"
        )
    };
    out.push_str(&format!(
        "{pending} record(s) under older keys are being re-encrypted in the background; \
         `protego status` shows the progress.\n\
         Remove an older key from the key files (on every node) only once `protego status` \
         shows no record under it.\n"
    ));
    out
}

/// The request of `protego ctl apply -f FILE`: the file's text and absolute path (the node
/// reads relative `psk_file`s from its directory).
fn apply_request(file: &Path, dry_run: bool) -> Result<Request, String> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let file =
        std::path::absolute(file).map_err(|e| format!("cannot resolve {}: {e}", file.display()))?;
    Ok(Request::Apply {
        file,
        text,
        dry_run,
    })
}

/// The request of `protego ctl route ...`: fields checked here first (errors name the
/// field); a file's path made absolute, as the node reads it.
fn route_request(command: &RouteCommand) -> Result<Request, String> {
    Ok(match command {
        RouteCommand::Add {
            tenant,
            vnet,
            address,
            host,
        } => {
            control::status::vm_route(tenant, vnet, address, Some(host))?;
            Request::RouteAdd {
                tenant: tenant.clone(),
                vnet: vnet.clone(),
                address: address.clone(),
                host: host.clone(),
            }
        }
        RouteCommand::Del {
            tenant,
            vnet,
            address,
        } => {
            control::status::vm_route(tenant, vnet, address, None)?;
            Request::RouteDel {
                tenant: tenant.clone(),
                vnet: vnet.clone(),
                address: address.clone(),
            }
        }
        RouteCommand::Load { file } => Request::RouteLoad {
            file: std::path::absolute(file)
                .map_err(|e| format!("cannot resolve {}: {e}", file.display()))?,
        },
    })
}

/// The summary `protego ctl apply` prints: one line per change, `+` added, `-` removed, `~`
/// changed in place, `!` renegotiated.
fn apply_summary(answer: &serde_json::Value) -> String {
    let list = |key: &str| -> Vec<String> {
        answer["changes"][key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let dry = answer["dry_run"].as_bool().unwrap_or(false);
    let mut out = String::new();
    let lines = [
        ("+", "tenant", "tenants_added", ""),
        ("-", "tenant", "tenants_removed", ""),
        ("+", "vnet", "vnets_added", ""),
        (
            "~",
            "vnet",
            "vnets_changed",
            " (its tunnels follow, no rekey)",
        ),
        ("-", "vnet", "vnets_removed", ""),
        ("+", "tunnel", "tunnels_added", ""),
        ("~", "tunnel", "tunnels_updated", " (updated in place)"),
        (
            "!",
            "tunnel",
            "tunnels_replaced",
            " (SAs deleted and negotiated again)",
        ),
        ("-", "tunnel", "tunnels_removed", " (SAs deleted)"),
    ];
    for (mark, kind, key, note) in lines {
        for name in list(key) {
            out.push_str(&format!("  {mark} {kind} {name}{note}\n"));
        }
    }
    let unchanged = answer["changes"]["tunnels_unchanged"].as_u64().unwrap_or(0);
    let head = if out.is_empty() {
        "nothing to change".to_owned()
    } else if dry {
        "dry run, nothing changed; applying would:".to_owned()
    } else {
        format!(
            "applied (generation {}):",
            answer["generation"].as_u64().unwrap_or(0)
        )
    };
    format!("{head}\n{out}  {unchanged} tunnel(s) unchanged\n")
}

/// `protego ctl ...`: one request on the control socket; prints its JSON answer (`apply`: a
/// summary unless `--json`). An `{"error":..}` answer goes to stderr and fails the command
/// (`query_with_timeout` turns it into an error).
pub(crate) fn run_ctl(args: &CtlArgs) -> ExitCode {
    let socket = match crate::socket_path(args.socket.clone(), args.config.as_deref()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // How to print the answer instead of its JSON.
    let mut summary: Option<fn(&serde_json::Value) -> String> = None;
    let request = match &args.command {
        CtlCommand::Apply {
            file,
            dry_run,
            json,
        } => {
            if !json {
                summary = Some(apply_summary);
            }
            match apply_request(file, *dry_run) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        CtlCommand::Store {
            command: StoreCommand::RotateKey { json },
        } => {
            if !json {
                summary = Some(rotation_summary);
            }
            Request::RotateStoreKey
        }
        CtlCommand::Route { command } => match route_request(command) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        CtlCommand::Filter { command } => match crate::filterctl::request(command) {
            Ok((request, text)) => {
                summary = text;
                request
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        CtlCommand::Nodes => Request::Nodes,
        CtlCommand::Capacity => Request::Capacity,
        CtlCommand::Dispatch {
            command: DispatchCommand::Show { json },
        } => {
            if !json {
                summary = Some(dispatch_summary);
            }
            Request::Dispatch
        }
        CtlCommand::Migrate { tunnel, to } => Request::Migrate {
            tunnel: tunnel.clone(),
            to: to.clone(),
        },
        CtlCommand::Drain { node } => Request::Drain { node: node.clone() },
        CtlCommand::Undrain { node } => Request::Undrain { node: node.clone() },
    };
    // Moves wait for the peer's rekey: allow them time.
    match control::status::query_with_timeout(&socket, &request, CTL_TIMEOUT) {
        Ok(answer) if summary.is_some() => {
            print!("{}", summary.map_or_else(String::new, |f| f(&answer)));
            ExitCode::SUCCESS
        }
        Ok(answer) => {
            match serde_json::to_string_pretty(&answer) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("error: cannot format the answer: {e}");
                    return ExitCode::FAILURE;
                }
            }
            ExitCode::SUCCESS
        }
        Err(e @ control::Error::Socket { .. }) => {
            eprintln!("error: {e}");
            eprintln!(
                "hint: is `protego up` or `protego control` running, and is this its control_socket?"
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{dispatch_summary, rotation_summary};
    use serde_json::json;

    #[test]
    fn rotation_summary_says_what_to_do_on_the_other_nodes() {
        let answer = |generated: bool| {
            json!({"ok": true, "key_id": 3_054_198_966_u32, "key_file": "/etc/protego/store.keys",
                "generated": generated, "reencrypt_pending": 12})
        };
        let taken = rotation_summary(&answer(false));
        assert!(
            taken.starts_with("key 3054198966, the last line of /etc/protego/store.keys, is now")
                && taken.contains("12 record(s)"),
            "{taken}"
        );
        let generated = rotation_summary(&answer(true));
        assert!(
            generated.starts_with("generated store encryption key 3054198966")
                && generated.contains("append the line of key 3054198966")
                && generated.contains("docs/operations.md"),
            "{generated}"
        );
    }

    #[test]
    fn dispatch_summary_lists_nodes_owners_and_moves() {
        let answer = json!({
            "mode": "self", "vmacs": 1024, "ring": ["data1", "data2"],
            "nodes": [
                {"name": "data1", "id": 1, "vtep": "10.0.0.21", "utilization": 0.42,
                 "owned": {"1001": 600}, "loads": {"1001": 0.4}, "confirmed": true},
                {"name": "data2", "id": 2, "vtep": "10.0.0.22", "utilization": null,
                 "owned": {"1001": 424}, "loads": {}, "confirmed": false},
            ],
            "moves": [{"ago_ms": 3200, "vni": 1001, "from": "data1", "to": "data2",
                       "vmacs": 4, "why": "load", "loads": [0.45, 0.2]},
                      {"ago_ms": 9000, "vni": 1001, "from": null, "to": "data2",
                       "vmacs": 512, "why": "join", "loads": null}],
        });
        let text = dispatch_summary(&answer);
        assert!(
            text.starts_with("mode self, 1024 virtual MACs per VNet; ring: data1 -> data2\n"),
            "{text}"
        );
        assert!(text.contains("VNI 1001"), "{text}");
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .to_owned()
        };
        assert!(
            line("data1").contains("10.0.0.21")
                && line("data1").contains("42%")
                && line("data1").contains("600 (40%)"),
            "{text}"
        );
        assert!(
            line("data2").contains("424") && line("data2").contains("not confirmed"),
            "{text}"
        );
        assert!(
            text.contains(
                "3.2s ago  VNI 1001  data1 -> data2  4 virtual MAC(s)  (load, loads 45% and 20%)"
            ),
            "{text}"
        );
        assert!(
            text.contains("every node -> data2  512 virtual MAC(s)  (join)"),
            "{text}"
        );
        let steer = dispatch_summary(
            &json!({"mode": "steer", "vmacs": 0, "ring": [], "nodes": [], "moves": []}),
        );
        assert!(steer.starts_with("mode steer"), "{steer}");
    }
}
