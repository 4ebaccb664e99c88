//! Protego's distributed form on a [`Topology`]: control and data nodes in namespaces of their
//! own on the underlay ([`Topology::add_underlay_node`]), one or two steer nodes owning the VIP
//! the sites talk to and the VTEP address the cloud hosts' VXLAN flood entries point at, and
//! optionally etcd as the control nodes' shared store.
//!
//! [`ProtegoCluster::start`] makes a development PKI with `protego certs` (one CA, one
//! certificate per node), writes every configuration, starts `protego control`, `protego data`
//! and `protego steer`, and waits until a control node reports every data and steer node
//! alive. Every namespace and process belongs to the [`Testbed`] and goes with its teardown,
//! also when a start fails half-way.
//!
//! The files of the `n`-th cluster of a test process, in the run directory:
//!
//! ```text
//! cluster<n>/pki/ca.pem ca.key <node>.pem <node>.key   protego certs init / issue
//! cluster<n>/store.keys                                 the control nodes' store key file
//! cluster<n>/control1/protego.toml                      [gateway] ... [store] [cluster]
//! cluster<n>/control1/protego.sock                      its control socket
//! cluster<n>/control1/state.redb, <tunnel>.psk          file store, PSKs
//! cluster<n>/data1.toml, steer1.toml                    [node] [[node.control]] [data]/[steer]
//! ```
//!
//! Every control node seals its store's records with the key of `store.keys` (`[store]
//! encryption_key_file`, mode 0600, one file shared by the cluster's control nodes, as
//! docs/operations.md has every control node hold the same keys), so a takeover reads records
//! another node sealed; [`ProtegoCluster::store_key_file`] names it.
//!
//! Namespaces are `<run tag>-cl<n>-<node>` (and `-cl<n>-etcd`), process logs
//! `logs/cl<n>-<node>.log` (`cl<n>-<node>-r<k>` after the `k`-th restart).
//!
//! # One or two steer nodes
//!
//! With one steer node ([`ClusterSpec::steers`] = 1) it runs in the topology's gateway
//! namespace and owns the VIP (`gateway.wan`, and `gateway.wan6`) and the VTEP address
//! (`gateway.underlay`) on the gateway's own WAN and underlay interfaces; its Geneve socket is
//! on the VTEP address too.
//!
//! With two, the gateway namespace becomes an ECMP router ([`crate::router::EcmpRouter`]), as
//! a real deployment puts the VIP behind a router that spreads flows over the hosts
//! announcing it (BGP anycast): each steer node gets a namespace of its own on the underlay
//! (`<run tag>-cl<n>-steer<i>`, attached after the data nodes and before etcd) with its own
//! underlay address (its Geneve address, which it announces in its Hello and which data and
//! control nodes send to), the VIP, VIP6 and the VTEP address on `lo`, and a link to the
//! router, which routes those three addresses with one multipath route over both links
//! (flows hashed on L4 ports). [`ProtegoCluster::withdraw_steer`] takes a steer node's
//! nexthop out of the routes, as the router does when BGP or BFD notices the node died, and
//! [`ProtegoCluster::restore_steer`] puts it back. The cloud hosts and the sites are unchanged:
//! the router answers ARP for the VIP and the VTEP address.

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::etcd::{Etcd, EtcdPki};
use crate::protego::socket_request;
use crate::protego::{render_config_with_store, GatewayTunnel};
use crate::router::EcmpRouter;
use crate::topology::{Topology, UnderlayNode};
use crate::wait::{wait_for, Probe};
use crate::{workspace_bin, Cmd, Error, IfAddr, Netns, Process, Result, Testbed, VXLAN_PORT};

/// TCP port of a control node's gRPC server (on its underlay address).
pub const GRPC_PORT: u16 = 7300;
/// UDP port of every node's Geneve socket (RFC 8926's port).
pub const GENEVE_PORT: u16 = 6081;
/// Client port of the etcd store ([`ClusterStore::Etcd`]); its peer port is the next one.
pub const ETCD_CLIENT_PORT: u16 = 2379;
/// The etcd user of the control nodes ([`ClusterStore::Etcd`]): its role may read and write
/// the cluster's key prefix only.
pub const ETCD_USER: &str = "protego";
/// Most control nodes a cluster may have.
pub const MAX_CONTROLS: usize = 2;
/// Most steer nodes a cluster may have (two share the VIP behind an ECMP router, see the
/// module documentation).
pub const MAX_STEERS: usize = 2;
/// Most data nodes a cluster may have (they share the underlay /24 with the cloud hosts).
pub const MAX_DATA: usize = 32;

/// How long one control-socket request may take (moves wait up to 30 s for the peer's rekey).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one poll of a control socket may take while waiting.
const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// Lines of each node's log that errors carry.
const TAIL_LINES: usize = 30;

/// Counts cluster starts in this process (directory, namespace and log names).
static STARTS: AtomicUsize = AtomicUsize::new(0);

/// Where the control nodes keep their durable state (`[store]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterStore {
    /// The embedded file store, one per control node beside its control socket (as
    /// [`crate::protego::render_config`] writes it); two control nodes then share nothing.
    File,
    /// One etcd ([`crate::etcd::Etcd`]) in a namespace of its own on the underlay, shared by
    /// every control node, set up as docs/operations.md says: TLS on its client and peer URLs,
    /// client certificates required (each control node has its own, from a CA of etcd's, in
    /// `cluster<n>/etcd-pki/`), and authentication on, the control nodes logging in as
    /// [`ETCD_USER`], whose role may read and write `/protego/cl<n>/` only.
    Etcd,
}

/// How the steer node probes the data nodes (`[steer] probe_*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSettings {
    /// Probe 1 of this many forwarded packets per data node.
    pub sample: u32,
    /// At least one probe per interval per data node.
    pub interval: Duration,
    /// A probe unanswered this long is missed.
    pub timeout: Duration,
    /// Misses in a row that mark a data node dead.
    pub misses: u32,
}

impl Default for ProbeSettings {
    /// The steer node's own defaults: 1 in 1000, every 10 ms, 30 ms timeout, 3 misses.
    fn default() -> Self {
        ProbeSettings {
            sample: 1000,
            interval: Duration::from_millis(10),
            timeout: Duration::from_millis(30),
            misses: 3,
        }
    }
}

/// What cluster to run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Control nodes (`control1`, `control2`), 1..=[`MAX_CONTROLS`]. Data and steer nodes
    /// list them in this order and try them in turn.
    pub controls: usize,
    /// Data nodes (`data1`, ...), 0..=[`MAX_DATA`].
    pub data: usize,
    /// Steer nodes (`steer1`, `steer2`), 1..=[`MAX_STEERS`]: one in the gateway namespace,
    /// or two behind an ECMP router (see the module documentation).
    pub steers: usize,
    /// The steer node's probing of the data nodes.
    pub probe: ProbeSettings,
    /// How often data and steer nodes report their load (`[cluster] report_interval`).
    pub report_interval: Duration,
    /// The control nodes' store.
    pub store: ClusterStore,
    /// Extra lines for the control nodes' `[store]` table, verbatim, after the etcd backend's
    /// (e.g. `timeout = "100ms"`); [`ClusterStore::Etcd`] only.
    pub extra_store: Vec<String>,
    /// Extra lines for the control nodes' `[gateway]` table, verbatim.
    pub extra_gateway: Vec<String>,
    /// Extra lines for the control nodes' `[cluster]` table, verbatim (e.g.
    /// `directive_timeout = "2s"`).
    pub extra_control: Vec<String>,
    /// Extra lines for the data nodes' `[data]` table, verbatim (e.g. `workers = 1`).
    pub extra_data: Vec<String>,
    /// Extra lines for the steer node's `[steer]` table, verbatim.
    pub extra_steer: Vec<String>,
    /// Data nodes the control nodes' `local` node provider starts and stops
    /// (`[cluster.autoscale.local]`), named after the [`ClusterSpec::data`] ones: each gets
    /// its namespace, certificate and configuration, and runs only when the autoscaler
    /// starts it. [`ProtegoCluster`] kills those still running when it is dropped (by the
    /// PIDs in the provider's pid files).
    pub provided_data: usize,
    /// Extra lines for the control nodes' `[cluster.autoscale]` table, verbatim (e.g.
    /// `mode = "act"`); the table is written when this or
    /// [`ClusterSpec::provided_data`] is not empty.
    pub extra_autoscale: Vec<String>,
    /// Top-level tables appended to every control node's configuration, verbatim (e.g.
    /// `[[attachment]]`s).
    pub extra_tables: String,
    /// Log filter of every node: `--log-level` of `protego control`, `RUST_LOG` of
    /// `protego data` and `protego steer`.
    pub log_level: String,
    /// How long [`ProtegoCluster::start`] and [`ProtegoCluster::restart`] wait for the nodes
    /// to be alive.
    pub ready_timeout: Duration,
}

impl Default for ClusterSpec {
    /// One control node, two data nodes, one steer node, file store, 1 s reports.
    fn default() -> Self {
        ClusterSpec {
            controls: 1,
            data: 2,
            steers: 1,
            probe: ProbeSettings::default(),
            report_interval: Duration::from_secs(1),
            store: ClusterStore::File,
            extra_store: Vec::new(),
            extra_gateway: Vec::new(),
            extra_control: Vec::new(),
            extra_data: Vec::new(),
            extra_steer: Vec::new(),
            provided_data: 0,
            extra_autoscale: Vec::new(),
            extra_tables: String::new(),
            log_level: "info,protego_ike=debug".to_owned(),
            ready_timeout: Duration::from_secs(30),
        }
    }
}

impl ClusterSpec {
    /// Checks the counts and settings; the error names the offending field.
    pub fn validate(&self) -> Result<()> {
        let bad = |field: &str, reason: String| {
            Err(Error::InvalidSpec {
                field: format!("cluster.{field}"),
                reason,
            })
        };
        if !(1..=MAX_CONTROLS).contains(&self.controls) {
            return bad("controls", format!("must be within 1..={MAX_CONTROLS}"));
        }
        if !(1..=MAX_STEERS).contains(&self.steers) {
            return bad(
                "steers",
                format!(
                    "must be within 1..={MAX_STEERS} (one steer node owns the VIP, two share it \
                     behind an ECMP router)"
                ),
            );
        }
        if self.store == ClusterStore::File && !self.extra_store.is_empty() {
            return bad(
                "extra_store",
                "only the etcd store takes extra [store] lines".to_owned(),
            );
        }
        if self.data + self.provided_data > MAX_DATA {
            return bad(
                "data",
                format!("at most {MAX_DATA} data nodes, provided ones included"),
            );
        }
        for (field, d) in [
            ("report_interval", self.report_interval),
            ("probe.interval", self.probe.interval),
            ("probe.timeout", self.probe.timeout),
        ] {
            if d.is_zero() {
                return bad(field, "must not be zero".to_owned());
            }
        }
        if self.probe.sample == 0 || self.probe.misses == 0 {
            return bad("probe", "sample and misses must be at least 1".to_owned());
        }
        if self.log_level.trim().is_empty() {
            return bad("log_level", "must not be empty".to_owned());
        }
        Ok(())
    }
}

/// What a node of the cluster does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterRole {
    /// `protego control`: IKE, placement, the control socket.
    Control,
    /// `protego data`: ESP and VXLAN.
    Data,
    /// `protego steer`: the VIP and the VTEP address, steering to data nodes.
    Steer,
}

impl ClusterRole {
    /// The role as `protego certs issue --role` and the subcommand spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterRole::Control => "control",
            ClusterRole::Data => "data",
            ClusterRole::Steer => "steer",
        }
    }
}

impl std::fmt::Display for ClusterRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One node of a [`ProtegoCluster`]: where it runs and its current process.
#[derive(Debug)]
pub struct ClusterNode {
    name: String,
    role: ClusterRole,
    ns: Netns,
    underlay_if: String,
    underlay: IfAddr,
    config: PathBuf,
    socket: Option<PathBuf>,
    command: Cmd,
    process: Process,
    starts: usize,
    /// Set when the cluster stopped or killed it on request: it is not expected to run.
    stopped: AtomicBool,
}

impl ClusterNode {
    /// Its name (its certificate's CN): `control1`, `data2`, `steer1`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its role.
    pub fn role(&self) -> ClusterRole {
        self.role
    }

    /// The namespace it runs in (a single steer node runs in the gateway namespace, each of
    /// two in its own).
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// Its underlay interface.
    pub fn underlay_if(&self) -> &str {
        &self.underlay_if
    }

    /// Its underlay address: the gRPC and Geneve address of control and data nodes, the Geneve
    /// address of a steer node (a single steer node's is the gateway's underlay address, also
    /// its VTEP address; each of two has its own, the shared VTEP address being on `lo`).
    pub fn underlay(&self) -> IfAddr {
        self.underlay
    }

    /// Its configuration file.
    pub fn config_path(&self) -> &Path {
        &self.config
    }

    /// Its control socket (control nodes only).
    pub fn control_socket(&self) -> Option<&Path> {
        self.socket.as_deref()
    }

    /// Its current process (the latest start).
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// Everything its current process logged so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// Whether its current process runs.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// Whether it is expected to run: started and not stopped or killed through the cluster.
    fn expected(&self) -> bool {
        !self.stopped.load(Ordering::Relaxed)
    }
}

/// A running distributed Protego on a [`Topology`] (see the module documentation).
#[derive(Debug)]
pub struct ProtegoCluster {
    label: String,
    dir: PathBuf,
    pki: PathBuf,
    nodes: Vec<ClusterNode>,
    etcd: Option<Etcd>,
    etcd_node: Option<UnderlayNode>,
    /// The router in front of two steer nodes.
    router: Option<EcmpRouter>,
    ready_timeout: Duration,
    /// Data nodes the control nodes' `local` provider starts: name and namespace.
    provided: Vec<(String, Netns)>,
    /// The provider's `run_dir` (pid files and logs).
    provider_dir: PathBuf,
    /// The control nodes' `[store] encryption_key_file`.
    store_keys: PathBuf,
}

/// Where a node runs and how it is named, before it starts.
struct Placement {
    name: String,
    role: ClusterRole,
    place: UnderlayNode,
}

impl ProtegoCluster {
    /// Creates the namespaces (with two steer nodes, theirs and the ECMP router in the gateway
    /// namespace), the PKI and every configuration for `tunnels` over `topo`, starts
    /// the etcd store (if [`ClusterStore::Etcd`]), the control nodes, the data nodes and the
    /// steer nodes (in this order, without waiting in between: the nodes reconnect with backoff,
    /// the control node waits up to 10 s for them), then waits up to
    /// [`ClusterSpec::ready_timeout`] until a control node's `nodes` answer shows every data
    /// and steer node alive. Fails early if a node exits; the error then carries the tails of
    /// every node's log.
    pub fn start(
        bed: &Testbed,
        topo: &Topology,
        tunnels: &[GatewayTunnel],
        spec: &ClusterSpec,
    ) -> Result<ProtegoCluster> {
        let bin = workspace_bin("protego")?;
        Self::start_with(bed, topo, tunnels, spec, &bin)
    }

    /// [`ProtegoCluster::start`] with the `protego` binary given.
    pub fn start_with(
        bed: &Testbed,
        topo: &Topology,
        tunnels: &[GatewayTunnel],
        spec: &ClusterSpec,
        bin: &Path,
    ) -> Result<ProtegoCluster> {
        spec.validate()?;
        let n = STARTS.fetch_add(1, Ordering::Relaxed);
        let label = format!("cl{n}");
        let dir = bed.dir().join(format!("cluster{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;

        // Where each node runs.
        let mut plan = Vec::new();
        for (role, count) in [
            (ClusterRole::Control, spec.controls),
            (ClusterRole::Data, spec.data),
        ] {
            for i in 1..=count {
                let name = format!("{role}{i}");
                let place = topo.add_underlay_node(bed, &format!("{label}-{name}"))?;
                plan.push(Placement { name, role, place });
            }
        }
        let mut provided = Vec::with_capacity(spec.provided_data);
        for i in spec.data + 1..=spec.data + spec.provided_data {
            let name = format!("data{i}");
            let place = topo.add_underlay_node(bed, &format!("{label}-{name}"))?;
            provided.push(Placement {
                name,
                role: ClusterRole::Data,
                place,
            });
        }
        let router = if spec.steers == 1 {
            let gw = &topo.gateway;
            plan.push(Placement {
                name: "steer1".to_owned(),
                role: ClusterRole::Steer,
                place: UnderlayNode {
                    ns: gw.ns.clone(),
                    underlay_if: gw.underlay_if.clone(),
                    underlay: gw.underlay,
                },
            });
            None
        } else {
            let mut steers = Vec::with_capacity(spec.steers);
            for i in 1..=spec.steers {
                let name = format!("steer{i}");
                let place = topo.add_underlay_node(bed, &format!("{label}-{name}"))?;
                steers.push((name.clone(), place.clone()));
                plan.push(Placement {
                    name,
                    role: ClusterRole::Steer,
                    place,
                });
            }
            Some(EcmpRouter::build(topo, &steers)?)
        };

        // One CA, one certificate per node naming it (CN, DNS) and its underlay address (IP).
        let pki = Pki::new(dir.join("pki"));
        pki.init(bin)?;
        for p in plan.iter().chain(&provided) {
            pki.issue(bin, &p.name, p.role, p.place.underlay.addr)?;
        }

        // The store: etcd with TLS, client certificates and authentication.
        let etcd_prefix = format!("/protego/{label}");
        let (etcd, etcd_node) = match spec.store {
            ClusterStore::File => (None, None),
            ClusterStore::Etcd => {
                let node = topo.add_underlay_node(bed, &format!("{label}-etcd"))?;
                let clients: Vec<&str> = plan
                    .iter()
                    .filter(|p| p.role == ClusterRole::Control)
                    .map(|p| p.name.as_str())
                    .collect();
                let etcd_pki =
                    EtcdPki::create(bin, &dir.join("etcd-pki"), node.underlay.addr, &clients)?;
                let mut etcd = Etcd::start(
                    &node.ns,
                    &label,
                    node.underlay.addr,
                    ETCD_CLIENT_PORT,
                    &etcd_pki,
                )?;
                etcd.enable_auth(&[(ETCD_USER, &format!("{etcd_prefix}/"))])?;
                (Some(etcd), Some(node))
            }
        };
        // One store key file for the cluster's control nodes.
        let store_keys = dir.join("store.keys");
        write_store_key_file(&store_keys)?;
        // A control node's [store] lines (with etcd, its own client certificate); every one
        // seals its records with the cluster's key.
        let store = |name: &str| {
            let mut lines = match &etcd {
                Some(e) => etcd_store_lines(&e.client_url, &etcd_prefix, &e.pki, name),
                // The file store beside the control socket, as `render_config` puts it.
                None => vec![format!(
                    "path = {:?}",
                    dir.join(name).join("state.redb").display().to_string()
                )],
            };
            lines.extend(spec.extra_store.iter().cloned());
            lines.push(format!(
                "encryption_key_file = {:?}",
                store_keys.display().to_string()
            ));
            lines
        };

        // Every configuration and command line.
        let controls: Vec<(String, SocketAddr)> = plan
            .iter()
            .filter(|p| p.role == ClusterRole::Control)
            .map(|p| {
                (
                    p.name.clone(),
                    SocketAddr::new(p.place.underlay.addr, GRPC_PORT),
                )
            })
            .collect();
        let mut vips = vec![topo.gateway.wan.addr];
        if tunnels.iter().any(|t| t.outer_ipv6) {
            vips.push(topo.gateway.wan6.addr);
        }
        // The provider's nodes: configurations only; the control node runs them.
        let provider_dir = dir.join("provider");
        let mut autoscale = String::new();
        if spec.provided_data > 0 || !spec.extra_autoscale.is_empty() {
            let _ = writeln!(autoscale, "\n[cluster.autoscale]");
            for line in &spec.extra_autoscale {
                let _ = writeln!(autoscale, "{line}");
            }
        }
        if !provided.is_empty() {
            let _ = writeln!(autoscale, "\n[cluster.autoscale.local]");
            let _ = writeln!(autoscale, "command = {:?}", bin.display().to_string());
            let _ = writeln!(
                autoscale,
                "run_dir = {:?}",
                provider_dir.display().to_string()
            );
            for p in &provided {
                let config = dir.join(format!("{}.toml", p.name));
                let geneve = SocketAddr::new(p.place.underlay.addr, GENEVE_PORT);
                let text = data_config(&p.name, &pki, &controls, geneve, &spec.extra_data);
                std::fs::write(&config, text).map_err(|e| Error::io("write config", &config, e))?;
                let _ = writeln!(autoscale, "\n[[cluster.autoscale.local.node]]");
                let _ = writeln!(autoscale, "config = {:?}", config.display().to_string());
                let _ = writeln!(autoscale, "netns = {:?}", p.place.ns.name());
            }
        }
        let mut prepared = Vec::with_capacity(plan.len());
        for p in plan {
            let addr = p.place.underlay.addr;
            let geneve = SocketAddr::new(addr, GENEVE_PORT);
            let (config, socket, text) = match p.role {
                ClusterRole::Control => {
                    let own = dir.join(&p.name);
                    std::fs::create_dir_all(&own)
                        .map_err(|e| Error::io("create directory", &own, e))?;
                    let socket = own.join("protego.sock");
                    let mut text = render_config_with_store(
                        topo,
                        tunnels,
                        &socket,
                        &own,
                        &spec.extra_gateway,
                        Some(&store(&p.name)),
                    )?;
                    text.push_str(&cluster_section(
                        &p.name,
                        SocketAddr::new(addr, GRPC_PORT),
                        geneve,
                        &pki,
                        spec.report_interval,
                        &spec.extra_control,
                    ));
                    text.push_str(&autoscale);
                    text.push('\n');
                    text.push_str(&spec.extra_tables);
                    (own.join("protego.toml"), Some(socket), text)
                }
                ClusterRole::Data => (
                    dir.join(format!("{}.toml", p.name)),
                    None,
                    data_config(&p.name, &pki, &controls, geneve, &spec.extra_data),
                ),
                ClusterRole::Steer => (
                    dir.join(format!("{}.toml", p.name)),
                    None,
                    steer_config(
                        &p.name,
                        &pki,
                        &controls,
                        &SteerAddrs {
                            vips: &vips,
                            vxlan: SocketAddr::new(topo.gateway.underlay.addr, VXLAN_PORT),
                            geneve,
                        },
                        &spec.probe,
                        &spec.extra_steer,
                    ),
                ),
            };
            std::fs::write(&config, text).map_err(|e| Error::io("write config", &config, e))?;
            let command = node_command(bin, p.role, &config, &spec.log_level);
            prepared.push((p, config, socket, command));
        }

        // Start them: controls, data, steer (the plan's order).
        let mut nodes = Vec::with_capacity(prepared.len());
        for (p, config, socket, command) in prepared {
            let process = p
                .place
                .ns
                .spawn(&format!("{label}-{}", p.name), command.clone())?;
            nodes.push(ClusterNode {
                name: p.name,
                role: p.role,
                ns: p.place.ns,
                underlay_if: p.place.underlay_if,
                underlay: p.place.underlay,
                config,
                socket,
                command,
                process,
                starts: 1,
                stopped: AtomicBool::new(false),
            });
        }
        let cluster = ProtegoCluster {
            label,
            dir,
            pki: pki.dir,
            nodes,
            etcd,
            etcd_node,
            router,
            ready_timeout: spec.ready_timeout,
            provided: provided.into_iter().map(|p| (p.name, p.place.ns)).collect(),
            provider_dir,
            store_keys,
        };
        cluster.wait_ready()?;
        Ok(cluster)
    }

    /// The control nodes' store key file (`[store] encryption_key_file`, shared by them): a
    /// test rotating the key appends to it, or gives a node a file of its own.
    pub fn store_key_file(&self) -> &Path {
        &self.store_keys
    }

    /// The data nodes the control nodes' `local` provider may start
    /// ([`ClusterSpec::provided_data`]).
    pub fn provided_data_names(&self) -> Vec<String> {
        self.provided.iter().map(|(n, _)| n.clone()).collect()
    }

    /// The PID of provided data node `name` if the provider's pid file names a process that
    /// runs (with the recorded start time).
    pub fn provided_pid(&self, name: &str) -> Option<i32> {
        let text = std::fs::read_to_string(self.provider_dir.join(format!("{name}.pid"))).ok()?;
        let mut fields = text.split_whitespace();
        let pid: i32 = fields.next()?.parse().ok()?;
        let start: u64 = fields.next()?.parse().ok()?;
        (pid > 0 && process_start_time(pid) == Some(start)).then_some(pid)
    }

    /// The log of provided data node `name` (the provider appends every run's output to it).
    pub fn provided_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.provider_dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// The cluster's directory (configurations, PKI, control sockets).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The PKI directory (`ca.pem`, `<node>.pem`, `<node>.key`; `ca.key` too).
    pub fn pki_dir(&self) -> &Path {
        &self.pki
    }

    /// Every node, control nodes first, then data nodes, then the steer nodes.
    pub fn members(&self) -> &[ClusterNode] {
        &self.nodes
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Result<&ClusterNode> {
        self.index_of(name).map(|i| &self.nodes[i])
    }

    /// The namespace node `name` runs in.
    pub fn netns(&self, name: &str) -> Result<&Netns> {
        self.node(name).map(ClusterNode::netns)
    }

    /// The underlay address of node `name`.
    pub fn underlay(&self, name: &str) -> Result<IfAddr> {
        self.node(name).map(ClusterNode::underlay)
    }

    /// The data node holding CHILD_SAs, if exactly one does (from `nodes`): where a
    /// one-tunnel test's tunnel lives.
    pub fn sa_holder(&self) -> Result<Option<String>> {
        let nodes = self.nodes()?;
        let holders: Vec<String> = nodes["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|n| n["role"] == "data")
            .filter(|n| n["child_sas"].as_array().is_some_and(|c| !c.is_empty()))
            .filter_map(|n| n["name"].as_str().map(str::to_owned))
            .collect();
        Ok(match holders.as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        })
    }

    /// The names of the data nodes (`data1`, ...).
    pub fn data_node_names(&self) -> Vec<String> {
        self.names_of(ClusterRole::Data)
    }

    /// The names of the control nodes (`control1`, ...).
    pub fn control_node_names(&self) -> Vec<String> {
        self.names_of(ClusterRole::Control)
    }

    /// The names of the steer nodes (`steer1`, `steer2`).
    pub fn steer_node_names(&self) -> Vec<String> {
        self.names_of(ClusterRole::Steer)
    }

    /// The etcd store and the underlay node it runs on ([`ClusterStore::Etcd`] only).
    pub fn etcd(&self) -> Option<(&Etcd, &UnderlayNode)> {
        self.etcd.as_ref().zip(self.etcd_node.as_ref())
    }

    /// The ECMP router in front of the steer nodes (two steer nodes only).
    pub fn router(&self) -> Option<&EcmpRouter> {
        self.router.as_ref()
    }

    /// Withdraws steer node `name`'s nexthop from the router's routes of the VIP, VIP6 and the
    /// VTEP address, as a router does when BGP or BFD notices a dead steer node: new packets
    /// go to the other steer node. Fails with a single steer node (it owns the VIP itself) or
    /// if the nexthop is withdrawn already. The process is left alone (see
    /// [`ProtegoCluster::kill`]).
    pub fn withdraw_steer(&self, name: &str) -> Result<()> {
        self.steer_router(name)?.withdraw(name)
    }

    /// Puts steer node `name`'s nexthop back into the router's routes (after
    /// [`ProtegoCluster::withdraw_steer`]).
    pub fn restore_steer(&self, name: &str) -> Result<()> {
        self.steer_router(name)?.restore(name)
    }

    /// The router, for steer node `name`.
    fn steer_router(&self, name: &str) -> Result<&EcmpRouter> {
        let node = self.node(name)?;
        if node.role != ClusterRole::Steer {
            return Err(Error::InvalidSpec {
                field: format!("cluster node {name:?}"),
                reason: format!("a {} node has no nexthop at the router", node.role),
            });
        }
        self.router.as_ref().ok_or_else(|| Error::InvalidSpec {
            field: format!("cluster {}", self.label),
            reason: "a single steer node owns the VIP itself: there is no router to withdraw \
                     it from (start two steer nodes)"
                .to_owned(),
        })
    }

    /// Everything node `name`'s current process logged so far.
    pub fn log(&self, name: &str) -> Result<String> {
        self.node(name).map(ClusterNode::log)
    }

    /// The last `lines` lines of every node's current log, each under a header naming the node,
    /// its pid and its log file.
    pub fn log_tails(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in &self.nodes {
            let p = &node.process;
            let _ = writeln!(
                out,
                "---- {} ({}, pid {}, {}) ----\n{}",
                node.name,
                node.role,
                p.pid(),
                p.log_path().display(),
                p.log_tail(lines)
            );
        }
        for (name, _) in &self.provided {
            let log = self.provided_log(name);
            let tail: Vec<&str> = log.lines().rev().take(lines).collect();
            let _ = writeln!(
                out,
                "---- {name} (data, started by the local provider) ----\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        out
    }

    /// The control node whose control socket [`ProtegoCluster::control`] uses: the only running
    /// one, or of several the one whose `nodes` answer shows the most nodes alive (the one the
    /// data and steer nodes are connected to; the first on a tie).
    pub fn active_control(&self) -> Result<&str> {
        let running: Vec<&ClusterNode> = self.running_controls().collect();
        match running.as_slice() {
            [] => Err(self.no_control()),
            [only] => Ok(&only.name),
            _ => {
                let mut best: Option<(&ClusterNode, usize)> = None;
                for node in running {
                    let alive = node
                        .socket
                        .as_deref()
                        .and_then(|s| socket_request(s, "nodes", POLL_TIMEOUT).ok())
                        .map_or(0, |v| alive_names(&v).len());
                    if best.is_none_or(|(_, n)| alive > n) {
                        best = Some((node, alive));
                    }
                }
                best.map(|(node, _)| node.name.as_str())
                    .ok_or_else(|| self.no_control())
            }
        }
    }

    /// The active control node ([`ProtegoCluster::active_control`]) and a standby: another
    /// control node of the cluster. Fails if the cluster has a single control node.
    pub fn active_and_standby(&self) -> Result<(String, String)> {
        let active = self.active_control()?.to_owned();
        let standby = self
            .control_node_names()
            .into_iter()
            .find(|n| *n != active)
            .ok_or_else(|| Error::InvalidSpec {
                field: format!("cluster {}", self.label),
                reason: "a standby needs two control nodes".to_owned(),
            })?;
        Ok((active, standby))
    }

    /// Sends one request line to the control socket of the active control node (see
    /// [`ProtegoCluster::active_control`]): `status`, `nodes`, `migrate TUNNEL NODE`,
    /// `drain NODE`, `undrain NODE`, or any request of `protego up`'s socket. Returns its JSON
    /// answer; an `{"error": ...}` answer is an [`Error::Command`]. Waits up to 60 s for the
    /// answer (moves wait for the peer's rekey).
    pub fn control(&self, request: &str) -> Result<serde_json::Value> {
        let name = self.active_control()?;
        self.control_on(name, request)
    }

    /// Runs `protego ctl apply -f` with `text` (written into the cluster's directory) against
    /// the active control node; returns what the command printed.
    pub fn apply(&self, text: &str) -> Result<String> {
        let name = self.active_control()?;
        let node = self.node(name)?;
        let socket = node.socket.as_deref().ok_or_else(|| Error::InvalidSpec {
            field: format!("cluster node {name:?}"),
            reason: "a control node without a control socket".to_owned(),
        })?;
        crate::protego::ctl_apply(&workspace_bin("protego")?, socket, &self.dir, text, false)
    }

    /// Runs `protego ctl --socket SOCKET ARGS...` against the active control node (e.g.
    /// `filter load t1 --direction to_cloud --object F --json`); returns what it printed. A
    /// non-zero exit is an [`Error::Command`] with its stderr.
    pub fn ctl(&self, args: &[&str]) -> Result<String> {
        let name = self.active_control()?;
        let socket = self
            .node(name)?
            .socket
            .as_deref()
            .ok_or_else(|| Error::InvalidSpec {
                field: format!("cluster node {name:?}"),
                reason: "a control node without a control socket".to_owned(),
            })?
            .display()
            .to_string();
        let mut all = vec!["ctl", "--socket", socket.as_str()];
        all.extend_from_slice(args);
        Cmd::new(workspace_bin("protego")?.display().to_string())
            .args(all)
            .timeout(REQUEST_TIMEOUT)
            .run()
    }

    /// [`ProtegoCluster::control`] on the control socket of control node `name`.
    pub fn control_on(&self, name: &str, request: &str) -> Result<serde_json::Value> {
        let node = self.node(name)?;
        let socket = node.socket.as_deref().ok_or_else(|| Error::InvalidSpec {
            field: format!("cluster node {name:?}"),
            reason: format!("a {} node has no control socket", node.role),
        })?;
        socket_request(socket, request, REQUEST_TIMEOUT)
    }

    /// The active control node's `nodes` answer: `{"control": NAME, "nodes": [{"name",
    /// "role", "alive", "draining", "tunnels", ...}]}`.
    pub fn nodes(&self) -> Result<serde_json::Value> {
        self.control("nodes")
    }

    /// Waits up to `timeout` until a running control node's `nodes` answer shows every node of
    /// `names` alive, and returns that answer. Fails early if a node that should run exited;
    /// errors carry the tails of every node's log.
    pub fn wait_alive(&self, names: &[&str], timeout: Duration) -> Result<serde_json::Value> {
        for name in names {
            self.node(name)?;
        }
        let what = format!("{} alive at a control node", names.join(", "));
        wait_for(&what, timeout, || {
            self.check_processes()?;
            let mut states = Vec::new();
            for node in self.running_controls() {
                let Some(socket) = node.socket.as_deref() else {
                    continue;
                };
                match socket_request(socket, "nodes", POLL_TIMEOUT) {
                    Ok(answer) => {
                        let alive = alive_names(&answer);
                        let missing: Vec<&str> = names
                            .iter()
                            .copied()
                            .filter(|n| !alive.iter().any(|a| a == n))
                            .collect();
                        if missing.is_empty() {
                            return Ok(Probe::Ready(answer));
                        }
                        states.push(format!("{}: not alive: {}", node.name, missing.join(", ")));
                    }
                    Err(e) => states.push(format!("{}: {e}", node.name)),
                }
            }
            if states.is_empty() {
                return Err(self.no_control());
            }
            Ok(Probe::NotYet(states.join("; ")))
        })
        .map_err(|e| self.with_tails(e))
    }

    /// Waits up to `timeout` until every running control node that answers reports node `name`
    /// not alive (or does not list it), and at least one answers; returns the last answer. A
    /// control node that does not answer (a standby has no control socket) is not waited for.
    pub fn wait_not_alive(&self, name: &str, timeout: Duration) -> Result<serde_json::Value> {
        self.node(name)?;
        wait_for(
            &format!("{name} not alive at the control nodes"),
            timeout,
            || {
                let mut answered = None;
                let mut states = Vec::new();
                for node in self.running_controls() {
                    let Some(socket) = node.socket.as_deref() else {
                        continue;
                    };
                    match socket_request(socket, "nodes", POLL_TIMEOUT) {
                        Ok(answer) => {
                            if alive_names(&answer).iter().any(|a| a == name) {
                                states.push(format!("{}: still alive", node.name));
                            }
                            answered = Some(answer);
                        }
                        Err(e) => states.push(format!("{}: {e}", node.name)),
                    }
                }
                let still_alive = states.iter().any(|s| s.ends_with(": still alive"));
                match answered {
                    Some(answer) if !still_alive => Ok(Probe::Ready(answer)),
                    None if states.is_empty() => Err(self.no_control()),
                    _ => Ok(Probe::NotYet(states.join("; "))),
                }
            },
        )
        .map_err(|e| self.with_tails(e))
    }

    /// Kills node `name` with SIGKILL (by the pid of the process this cluster started) and
    /// reaps it. Fails if it does not run (the error carries its log tail if it exited).
    pub fn kill(&self, name: &str) -> Result<()> {
        let node = self.node(name)?;
        node.process.check_running()?;
        node.stopped.store(true, Ordering::Relaxed);
        node.process.stop_with(libc::SIGKILL);
        Ok(())
    }

    /// Waits up to `timeout` for node `name` to exit on its own (e.g. an active control node
    /// that lost its etcd lease stops) and from then on expects it not to run, as after
    /// [`ProtegoCluster::kill`]; returns how it ended. Fails if it still runs at the timeout.
    pub fn wait_exit(&self, name: &str, timeout: Duration) -> Result<ExitStatus> {
        let node = self.node(name)?;
        let status = node.process.wait(timeout)?;
        node.stopped.store(true, Ordering::Relaxed);
        Ok(status)
    }

    /// Stops node `name` gracefully (SIGTERM, up to 3 s, then SIGKILL); returns how it ended,
    /// `None` if it was already stopped.
    pub fn stop(&self, name: &str) -> Result<Option<ExitStatus>> {
        let node = self.node(name)?;
        node.stopped.store(true, Ordering::Relaxed);
        Ok(node.process.stop())
    }

    /// Ends a test's run on the cluster: on an error, prints the last 80 lines of every
    /// node's log; then stops every node ([`stop_all`](Self::stop_all)) and hands `result`
    /// back.
    pub fn finish<T>(&self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            eprintln!("{}", self.log_tails(80));
        }
        self.stop_all();
        result
    }

    /// Stops every node gracefully: the control nodes first (they delete their IKE SAs with
    /// the peers through the steer nodes), then the data nodes, then the steer nodes, then etcd.
    /// Returns how each node ended (`None`: already stopped).
    pub fn stop_all(&self) -> Vec<(String, Option<ExitStatus>)> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for role in [ClusterRole::Control, ClusterRole::Data, ClusterRole::Steer] {
            for node in self.nodes.iter().filter(|n| n.role == role) {
                node.stopped.store(true, Ordering::Relaxed);
                out.push((node.name.clone(), node.process.stop()));
            }
        }
        if let Some(etcd) = &self.etcd {
            etcd.process.stop();
        }
        out
    }

    /// Starts node `name` again with the same command line, configuration and namespace (a
    /// control node: the same store), after it was killed, stopped or exited, and waits up to
    /// [`ClusterSpec::ready_timeout`]: for a data or steer node until a control node reports
    /// it alive, for a control node until its control socket answers and every running data and
    /// steer node is alive at a control node. Returns the previous process (its log stays
    /// readable).
    pub fn restart(&mut self, name: &str) -> Result<Process> {
        let i = self.index_of(name)?;
        let label = format!("{}-{name}-r{}", self.label, self.nodes[i].starts);
        let node = &mut self.nodes[i];
        if node.process.check_running().is_ok() {
            return Err(Error::InvalidSpec {
                field: format!("restart of cluster node {name:?}"),
                reason: "it is still running: kill or stop it first".to_owned(),
            });
        }
        let process = node.ns.spawn(&label, node.command.clone())?;
        let old = std::mem::replace(&mut node.process, process);
        node.starts += 1;
        node.stopped.store(false, Ordering::Relaxed);
        let node = &self.nodes[i];
        match node.role {
            ClusterRole::Control => {
                let socket = node.socket.clone().unwrap_or_default();
                wait_for(
                    &format!("the control socket of {name}"),
                    self.ready_timeout,
                    || {
                        self.check_processes()?;
                        Ok(match socket_request(&socket, "nodes", POLL_TIMEOUT) {
                            Ok(_) => Probe::Ready(()),
                            Err(e) => Probe::NotYet(e.to_string()),
                        })
                    },
                )
                .map_err(|e| self.with_tails(e))?;
                self.wait_ready()?;
            }
            ClusterRole::Data | ClusterRole::Steer => {
                self.wait_alive(&[name], self.ready_timeout)?;
            }
        }
        Ok(old)
    }

    /// Waits until every data and steer node that should run is alive at a control node.
    fn wait_ready(&self) -> Result<()> {
        let expected: Vec<&str> = self
            .nodes
            .iter()
            .filter(|n| n.role != ClusterRole::Control && n.expected())
            .map(|n| n.name.as_str())
            .collect();
        self.wait_alive(&expected, self.ready_timeout).map(drop)
    }

    /// Fails if a node that should run has exited.
    fn check_processes(&self) -> Result<()> {
        for node in self.nodes.iter().filter(|n| n.expected()) {
            node.process.check_running()?;
        }
        Ok(())
    }

    /// `e` with the tails of every node's log added (process exits and timeouts).
    fn with_tails(&self, e: Error) -> Error {
        match e {
            Error::ProcessExited {
                label,
                pid,
                status,
                log_tail: _,
            } => Error::ProcessExited {
                label,
                pid,
                status,
                log_tail: self.log_tails(TAIL_LINES),
            },
            Error::WaitTimeout {
                what,
                timeout,
                last,
            } => Error::WaitTimeout {
                what,
                timeout,
                last: format!("{last}\n{}", self.log_tails(TAIL_LINES)),
            },
            other => other,
        }
    }

    /// Control nodes that should run and do.
    fn running_controls(&self) -> impl Iterator<Item = &ClusterNode> {
        self.nodes
            .iter()
            .filter(|n| n.role == ClusterRole::Control && n.expected() && n.is_running())
    }

    fn no_control(&self) -> Error {
        Error::InvalidSpec {
            field: format!("cluster {}", self.label),
            reason: "no control node is running".to_owned(),
        }
    }

    fn names_of(&self, role: ClusterRole) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.role == role)
            .map(|n| n.name.clone())
            .collect()
    }

    fn index_of(&self, name: &str) -> Result<usize> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| Error::InvalidSpec {
                field: format!("cluster node {name:?}"),
                reason: format!(
                    "no such node (nodes: {})",
                    self.nodes
                        .iter()
                        .map(|n| n.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
}

impl Drop for ProtegoCluster {
    /// Stops the control nodes (so that no provider starts another data node), then kills
    /// the data nodes their `local` provider started, by the PIDs of its pid files; the other
    /// processes stop when their handles drop.
    fn drop(&mut self) {
        if self.provided.is_empty() {
            return;
        }
        for node in self.nodes.iter().filter(|n| n.role == ClusterRole::Control) {
            node.stopped.store(true, Ordering::Relaxed);
            node.process.stop();
        }
        for (name, _) in &self.provided {
            if let Some(pid) = self.provided_pid(name) {
                // SAFETY: kill(2) with a PID our provider started and recorded, whose start
                // time was just checked; no memory is involved.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                for _ in 0..100 {
                    if process_start_time(pid).is_none() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
}

/// The start time of process `pid` (field 22 of `/proc/PID/stat`, clock ticks since boot),
/// `None` if it does not run (a zombie counts as gone).
fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: fields after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    if fields.next()? == "Z" {
        return None;
    }
    // Field 3 was the state; the start time is field 22.
    fields.nth(18)?.parse().ok()
}

/// The development PKI of a cluster: `protego certs` writes `ca.pem`, `ca.key`, `<node>.pem`
/// and `<node>.key` into one directory.
#[derive(Clone, Debug)]
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: PathBuf) -> Pki {
        Pki { dir }
    }

    /// The CA certificate.
    fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Node `name`'s certificate.
    fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// Node `name`'s private key.
    fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// `protego certs init --dir DIR`.
    fn init(&self, bin: &Path) -> Result<()> {
        Cmd::new(bin.display().to_string())
            .args(["certs", "init", "--dir", &self.dir.display().to_string()])
            .run()
            .map(drop)
    }

    /// `protego certs issue`: CN `name`, OU `role`, subjectAltNames DNS `name` (the name the
    /// nodes check a control node's certificate against) and IP `addr`.
    fn issue(&self, bin: &Path, name: &str, role: ClusterRole, addr: IpAddr) -> Result<()> {
        Cmd::new(bin.display().to_string())
            .args(["certs", "issue", "--dir", &self.dir.display().to_string()])
            .args(["--name", name, "--role", role.as_str()])
            .args(["--ip".to_owned(), addr.to_string(), "--dns".to_owned()])
            .arg(name)
            .run()
            .map(drop)
    }
}

/// The command line of a node: `protego control --config FILE --log-level FILTER`, or
/// `protego data|steer --config FILE` with `RUST_LOG=FILTER`.
fn node_command(bin: &Path, role: ClusterRole, config: &Path, log_level: &str) -> Cmd {
    let cmd = Cmd::new(bin.display().to_string()).args([
        role.as_str(),
        "--config",
        &config.display().to_string(),
    ]);
    match role {
        ClusterRole::Control => cmd.args(["--log-level", log_level]),
        ClusterRole::Data | ClusterRole::Steer => cmd.env("RUST_LOG", log_level),
    }
}

/// A duration as the configuration files write it, in the largest exact unit of `s`, `ms` and
/// `us` (sub-microsecond parts are dropped).
fn toml_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}us", d.as_micros())
    }
}

/// A TOML array of strings.
fn toml_strings<T: std::fmt::Display>(items: &[T]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|s| format!("{:?}", s.to_string()))
        .collect();
    format!("[{}]", quoted.join(", "))
}

/// The `[store]` lines of the etcd backend at `client_url`, under `prefix`, for control node
/// `name`: the etcd CA, the node's client certificate and key, and the [`ETCD_USER`] with its
/// password file.
fn etcd_store_lines(client_url: &str, prefix: &str, pki: &EtcdPki, name: &str) -> Vec<String> {
    let path = |p: PathBuf| format!("{:?}", p.display().to_string());
    vec![
        "backend = \"etcd\"".to_owned(),
        format!("endpoints = {}", toml_strings(&[client_url])),
        format!("prefix = {prefix:?}"),
        format!("ca = {}", path(pki.ca())),
        format!("cert = {}", path(pki.cert(name))),
        format!("key = {}", path(pki.key(name))),
        format!("username = {ETCD_USER:?}"),
        format!("password_file = {}", path(pki.password_file(ETCD_USER))),
    ]
}

/// Writes a store key file at `path` (mode 0600): one key, id 1, from the system's random
/// generator.
fn write_store_key_file(path: &Path) -> Result<()> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let mut key = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut key))
        .map_err(|e| Error::io("read", Path::new("/dev/urandom"), e))?;
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| writeln!(f, "# the cluster's store key (ID HEX)\n1 {hex}"))
        .map_err(|e| Error::io("write store key file", path, e))
}

/// The `[cluster]` table appended to a control node's gateway configuration.
fn cluster_section(
    name: &str,
    grpc: SocketAddr,
    geneve: SocketAddr,
    pki: &Pki,
    report_interval: Duration,
    extra: &[String],
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\n[cluster]");
    let _ = writeln!(out, "name = {name:?}");
    let _ = writeln!(out, "grpc = {:?}", grpc.to_string());
    let _ = writeln!(out, "geneve = {:?}", geneve.to_string());
    let _ = writeln!(out, "ca = {:?}", pki.ca().display().to_string());
    let _ = writeln!(out, "cert = {:?}", pki.cert(name).display().to_string());
    let _ = writeln!(out, "key = {:?}", pki.key(name).display().to_string());
    let _ = writeln!(
        out,
        "report_interval = {:?}",
        toml_duration(report_interval)
    );
    for line in extra {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// `[node]` and one `[[node.control]]` per control node: the start of a data or steer node's
/// configuration.
fn node_section(name: &str, pki: &Pki, controls: &[(String, SocketAddr)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "[node]");
    let _ = writeln!(out, "name = {name:?}");
    let _ = writeln!(out, "ca = {:?}", pki.ca().display().to_string());
    let _ = writeln!(out, "cert = {:?}", pki.cert(name).display().to_string());
    let _ = writeln!(out, "key = {:?}", pki.key(name).display().to_string());
    for (control, addr) in controls {
        let _ = writeln!(out, "\n[[node.control]]");
        let _ = writeln!(out, "name = {control:?}");
        let _ = writeln!(out, "address = {:?}", addr.to_string());
    }
    out
}

/// A data node's configuration.
fn data_config(
    name: &str,
    pki: &Pki,
    controls: &[(String, SocketAddr)],
    geneve: SocketAddr,
    extra: &[String],
) -> String {
    let mut out = node_section(name, pki, controls);
    let _ = writeln!(out, "\n[data]");
    let _ = writeln!(out, "geneve = {:?}", geneve.to_string());
    for line in extra {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The addresses of a steer node.
struct SteerAddrs<'a> {
    /// The public addresses the peers use.
    vips: &'a [IpAddr],
    /// Where the cloud hosts send VXLAN.
    vxlan: SocketAddr,
    /// Its Geneve socket.
    geneve: SocketAddr,
}

/// A steer node's configuration.
fn steer_config(
    name: &str,
    pki: &Pki,
    controls: &[(String, SocketAddr)],
    addrs: &SteerAddrs<'_>,
    probe: &ProbeSettings,
    extra: &[String],
) -> String {
    let mut out = node_section(name, pki, controls);
    let _ = writeln!(out, "\n[steer]");
    let _ = writeln!(out, "vips = {}", toml_strings(addrs.vips));
    let _ = writeln!(out, "vxlan = {:?}", addrs.vxlan.to_string());
    let _ = writeln!(out, "geneve = {:?}", addrs.geneve.to_string());
    let _ = writeln!(out, "probe_sample = {}", probe.sample);
    let _ = writeln!(out, "probe_interval = {:?}", toml_duration(probe.interval));
    let _ = writeln!(out, "probe_timeout = {:?}", toml_duration(probe.timeout));
    let _ = writeln!(out, "probe_misses = {}", probe.misses);
    for line in extra {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The names of the nodes a `nodes` answer shows alive.
fn alive_names(answer: &serde_json::Value) -> Vec<String> {
    answer["nodes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n["alive"].as_bool() == Some(true))
        .filter_map(|n| n["name"].as_str().map(str::to_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::{self, PingOptions};
    use crate::TopologySpec;
    use std::io::{BufRead, BufReader, Write as _};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;
    use std::sync::Arc;

    fn pki() -> Pki {
        Pki::new(PathBuf::from("/run/t/pki"))
    }

    fn controls() -> Vec<(String, SocketAddr)> {
        vec![
            ("control1".to_owned(), "10.255.0.50:7300".parse().unwrap()),
            ("control2".to_owned(), "10.255.0.51:7300".parse().unwrap()),
        ]
    }

    #[test]
    fn cluster_section_names_the_node_its_addresses_and_files() {
        let text = cluster_section(
            "control1",
            "10.255.0.50:7300".parse().unwrap(),
            "10.255.0.50:6081".parse().unwrap(),
            &pki(),
            Duration::from_millis(500),
            &["directive_timeout = \"2s\"".to_owned()],
        );
        assert_eq!(
            text,
            "\n[cluster]\n\
             name = \"control1\"\n\
             grpc = \"10.255.0.50:7300\"\n\
             geneve = \"10.255.0.50:6081\"\n\
             ca = \"/run/t/pki/ca.pem\"\n\
             cert = \"/run/t/pki/control1.pem\"\n\
             key = \"/run/t/pki/control1.key\"\n\
             report_interval = \"500ms\"\n\
             directive_timeout = \"2s\"\n"
        );
    }

    #[test]
    fn data_config_lists_every_control_node_in_order() {
        let text = data_config(
            "data2",
            &pki(),
            &controls(),
            "10.255.0.53:6081".parse().unwrap(),
            &["workers = 1".to_owned()],
        );
        assert_eq!(
            text,
            "[node]\n\
             name = \"data2\"\n\
             ca = \"/run/t/pki/ca.pem\"\n\
             cert = \"/run/t/pki/data2.pem\"\n\
             key = \"/run/t/pki/data2.key\"\n\
             \n[[node.control]]\n\
             name = \"control1\"\n\
             address = \"10.255.0.50:7300\"\n\
             \n[[node.control]]\n\
             name = \"control2\"\n\
             address = \"10.255.0.51:7300\"\n\
             \n[data]\n\
             geneve = \"10.255.0.53:6081\"\n\
             workers = 1\n"
        );
    }

    #[test]
    fn steer_config_has_the_vips_vtep_and_probe_settings() {
        let vips: Vec<IpAddr> = vec!["198.51.100.1".parse().unwrap()];
        let probe = ProbeSettings {
            sample: 10,
            interval: Duration::from_millis(5),
            timeout: Duration::from_millis(20),
            misses: 2,
        };
        let text = steer_config(
            "steer1",
            &pki(),
            &controls()[..1],
            &SteerAddrs {
                vips: &vips,
                vxlan: "10.255.0.1:4789".parse().unwrap(),
                geneve: "10.255.0.1:6081".parse().unwrap(),
            },
            &probe,
            &[],
        );
        assert!(text.starts_with("[node]\nname = \"steer1\"\n"), "{text}");
        assert!(
            text.contains("cert = \"/run/t/pki/steer1.pem\"\nkey = \"/run/t/pki/steer1.key\"\n"),
            "{text}"
        );
        assert!(!text.contains("control2"), "{text}");
        assert!(
            text.ends_with(
                "\n[steer]\n\
                 vips = [\"198.51.100.1\"]\n\
                 vxlan = \"10.255.0.1:4789\"\n\
                 geneve = \"10.255.0.1:6081\"\n\
                 probe_sample = 10\n\
                 probe_interval = \"5ms\"\n\
                 probe_timeout = \"20ms\"\n\
                 probe_misses = 2\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn durations_use_the_largest_exact_unit() {
        assert_eq!(toml_duration(Duration::from_secs(1)), "1s");
        assert_eq!(toml_duration(Duration::from_secs(90)), "90s");
        assert_eq!(toml_duration(Duration::from_millis(10)), "10ms");
        assert_eq!(toml_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(toml_duration(Duration::from_micros(250)), "250us");
        assert_eq!(toml_duration(Duration::from_nanos(2_000_500)), "2000us");
    }

    #[test]
    fn etcd_store_and_commands() {
        let pki = EtcdPki {
            dir: PathBuf::from("/run/t/etcd-pki"),
        };
        assert_eq!(
            etcd_store_lines("https://10.255.0.54:2379", "/protego/cl0", &pki, "control1"),
            vec![
                "backend = \"etcd\"",
                "endpoints = [\"https://10.255.0.54:2379\"]",
                "prefix = \"/protego/cl0\"",
                "ca = \"/run/t/etcd-pki/ca.pem\"",
                "cert = \"/run/t/etcd-pki/control1.pem\"",
                "key = \"/run/t/etcd-pki/control1.key\"",
                "username = \"protego\"",
                "password_file = \"/run/t/etcd-pki/protego.password\"",
            ]
        );
        let config = Path::new("/run/t/c.toml");
        let bin = Path::new("/bin/protego");
        assert_eq!(
            node_command(bin, ClusterRole::Control, config, "debug").display(),
            "/bin/protego control --config /run/t/c.toml --log-level debug"
        );
        assert_eq!(
            node_command(bin, ClusterRole::Data, config, "info,x=debug").display(),
            "RUST_LOG=info,x=debug /bin/protego data --config /run/t/c.toml"
        );
        assert_eq!(
            node_command(bin, ClusterRole::Steer, config, "info").display(),
            "RUST_LOG=info /bin/protego steer --config /run/t/c.toml"
        );
    }

    #[test]
    fn spec_validation_names_the_field() {
        assert!(ClusterSpec::default().validate().is_ok());
        let bad = |edit: fn(&mut ClusterSpec)| {
            let mut s = ClusterSpec::default();
            edit(&mut s);
            s.validate().unwrap_err().to_string()
        };
        assert!(bad(|s| s.controls = 0).contains("cluster.controls"));
        assert!(bad(|s| s.controls = 3).contains("cluster.controls"));
        let two = ClusterSpec {
            steers: 2,
            ..ClusterSpec::default()
        };
        assert!(two.validate().is_ok());
        let e = bad(|s| s.steers = 3);
        assert!(e.contains("cluster.steers") && e.contains("1..=2"), "{e}");
        assert!(bad(|s| s.steers = 0).contains("cluster.steers"));
        let e = bad(|s| s.extra_store = vec!["timeout = \"1s\"".into()]);
        assert!(e.contains("cluster.extra_store"), "{e}");
        assert!(bad(|s| s.data = MAX_DATA + 1).contains("cluster.data"));
        assert!(bad(|s| s.probe.interval = Duration::ZERO).contains("probe.interval"));
        assert!(bad(|s| s.log_level = " ".into()).contains("log_level"));
    }

    #[test]
    fn alive_names_reads_a_nodes_answer() {
        let answer = serde_json::json!({
            "control": "control1",
            "nodes": [
                {"name": "data1", "role": "data", "alive": true},
                {"name": "data2", "role": "data", "alive": false},
                {"name": "steer1", "role": "steer", "alive": true},
            ]
        });
        assert_eq!(alive_names(&answer), vec!["data1", "steer1"]);
        assert!(alive_names(&serde_json::json!({"error": "x"})).is_empty());
    }

    // The tests below build namespaces: they need root, like every test-bed test.

    fn small_topology(bed: &Testbed) -> Topology {
        Topology::build(
            bed,
            TopologySpec {
                hosts: 1,
                ..TopologySpec::default()
            },
        )
        .expect("topology")
    }

    #[test]
    fn underlay_nodes_get_fresh_addresses_and_reach_the_underlay() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let a = topo.add_underlay_node(&bed, "ula").expect("node a");
        let b = topo.add_underlay_node(&bed, "ulb").expect("node b");
        assert_eq!(a.underlay.to_string(), "10.255.0.50/24");
        assert_eq!(b.underlay.to_string(), "10.255.0.51/24");
        let once = PingOptions::new(2, Duration::from_millis(10));
        for dst in [
            topo.gateway.underlay.addr,
            topo.hosts[0].underlay.addr,
            b.underlay.addr,
        ] {
            let stats = traffic::ping(&a.ns, dst, &once).expect("ping");
            assert!(stats.all_received(), "{dst}: {stats:?}");
        }
        // A second label that exists already fails without taking an address.
        assert!(topo.add_underlay_node(&bed, "ula").is_err());
        let c = topo.add_underlay_node(&bed, "ulc").expect("node c");
        assert_eq!(c.underlay.to_string(), "10.255.0.52/24");
        bed.teardown().expect("teardown");
    }

    /// A stand-in for `protego`: `certs` writes empty files, the nodes log one line and sleep
    /// (`data_branch` replaces what `data` does).
    /// A stand-in `protego` binary: `certs` makes real certificates with `openssl` (etcd needs
    /// them), `data` runs `data_branch`, `control` and `steer` print and sleep.
    fn fake_protego(dir: &Path, data_branch: &str) -> PathBuf {
        let path = dir.join("fake-protego");
        let script = format!(
            "#!/bin/sh\n\
             echo \"$*\" >> \"$(dirname \"$0\")/calls\"\n\
             case \"$1\" in\n\
             certs)\n\
               sub=$2; shift 2; ip=\n\
               while [ $# -gt 0 ]; do case \"$1\" in --dir) dir=$2; shift 2;; --name) name=$2; shift 2;; --ip) ip=$2; shift 2;; *) shift;; esac; done\n\
               mkdir -p \"$dir\"\n\
               new=\"openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -config /dev/null\"\n\
               if [ \"$sub\" = init ]; then $new -keyout \"$dir/ca.key\" -out \"$dir/ca.pem\" -subj /CN=fake-ca -addext basicConstraints=critical,CA:TRUE -addext keyUsage=keyCertSign 2>/dev/null\n\
               else $new -keyout \"$dir/$name.key\" -out \"$dir/$name.pem\" -subj \"/CN=$name\" -CA \"$dir/ca.pem\" -CAkey \"$dir/ca.key\" -addext extendedKeyUsage=serverAuth,clientAuth ${{ip:+-addext subjectAltName=IP:$ip}} 2>/dev/null; fi;;\n\
             data) {data_branch};;\n\
             control|steer) echo \"fake $1 up\"; exec sleep 600;;\n\
             *) echo \"unknown command $1\" >&2; exit 2;;\n\
             esac\n"
        );
        std::fs::write(&path, script).expect("write fake protego");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        path
    }

    /// Serves the control socket of `control1` of the cluster that appears under `bed_dir`:
    /// `nodes` answers `answer`, anything else an error.
    /// A stand-in cluster: the fake binary (nodes print and sleep) and a fake control socket
    /// of control1 whose `nodes` answer shows `alive` as connected.
    struct StandIn {
        bin: PathBuf,
        stop: Arc<AtomicBool>,
        server: std::thread::JoinHandle<()>,
    }

    impl StandIn {
        fn start(bed: &Testbed, alive: &[&str]) -> Self {
            let bin = fake_protego(bed.dir(), "echo \"fake data up\"; exec sleep 600");
            let stop = Arc::new(AtomicBool::new(false));
            let nodes: Vec<serde_json::Value> = alive
                .iter()
                .map(|n| serde_json::json!({"name": n, "alive": true}))
                .collect();
            let server = fake_control_socket(
                bed.dir().to_owned(),
                serde_json::json!({ "control": "control1", "nodes": nodes }),
                Arc::clone(&stop),
            );
            Self { bin, stop, server }
        }

        /// Stops the fake control socket and tears the bed down.
        fn finish(self, bed: Testbed) {
            self.stop.store(true, Ordering::Relaxed);
            self.server.join().unwrap();
            bed.teardown().expect("teardown");
        }
    }

    fn fake_control_socket(
        bed_dir: PathBuf,
        answer: serde_json::Value,
        stop: Arc<AtomicBool>,
    ) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || {
            let socket = loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let found = std::fs::read_dir(&bed_dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path().join("control1"))
                    .find(|d| d.join("protego.toml").exists());
                if let Some(d) = found {
                    break d.join("protego.sock");
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let listener = UnixListener::bind(&socket).expect("bind fake control socket");
            listener.set_nonblocking(true).expect("nonblocking");
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).expect("blocking");
                        let mut line = String::new();
                        let _ = BufReader::new(&stream).read_line(&mut line);
                        let reply = if line.trim() == "nodes" {
                            answer.clone()
                        } else {
                            serde_json::json!({ "error": format!("unsupported: {}", line.trim()) })
                        };
                        let _ = writeln!(&stream, "{reply}");
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    }

    fn fast_spec() -> ClusterSpec {
        ClusterSpec {
            data: 2,
            log_level: "info".to_owned(),
            ready_timeout: Duration::from_secs(10),
            ..ClusterSpec::default()
        }
    }

    #[test]
    fn start_kill_restart_with_a_stand_in_binary() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let stand_in = StandIn::start(&bed, &["data1", "data2", "steer1"]);
        let bin = stand_in.bin.clone();
        let spec = fast_spec();
        let result = ProtegoCluster::start_with(&bed, &topo, &[], &spec, &bin);
        let mut cluster = result.expect("cluster starts");

        assert_eq!(cluster.data_node_names(), vec!["data1", "data2"]);
        assert_eq!(cluster.control_node_names(), vec!["control1"]);
        assert_eq!(cluster.steer_node_names(), vec!["steer1"]);
        assert_eq!(
            cluster.underlay("control1").unwrap().to_string(),
            "10.255.0.50/24"
        );
        assert_eq!(
            cluster.underlay("data2").unwrap().to_string(),
            "10.255.0.52/24"
        );
        assert_eq!(cluster.underlay("steer1").unwrap(), topo.gateway.underlay);
        assert_eq!(
            cluster.netns("steer1").unwrap().name(),
            topo.gateway.ns.name()
        );
        assert!(cluster.node("data9").is_err());

        // Each process runs in its node's namespace; data and steer get RUST_LOG.
        for node in cluster.members() {
            let pid = node.process().pid().to_string();
            let ns = Cmd::new("ip")
                .args(["netns", "identify", &pid])
                .run()
                .unwrap();
            assert_eq!(ns.trim(), node.netns().name(), "{}", node.name());
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
            let has_rust_log = environ.split(|&b| b == 0).any(|v| v == b"RUST_LOG=info");
            assert_eq!(
                has_rust_log,
                node.role() != ClusterRole::Control,
                "{}",
                node.name()
            );
        }

        // The PKI calls and the files.
        let calls = std::fs::read_to_string(bed.dir().join("calls")).unwrap();
        let pki = cluster.pki_dir().display().to_string();
        assert!(
            calls.contains(&format!("certs init --dir {pki}\n")),
            "{calls}"
        );
        assert!(
            calls.contains(&format!(
                "certs issue --dir {pki} --name data1 --role data --ip 10.255.0.51 --dns data1\n"
            )),
            "{calls}"
        );
        assert!(
            calls.contains("--name steer1 --role steer --ip 10.255.0.1 --dns steer1\n"),
            "{calls}"
        );
        let control = cluster.node("control1").unwrap();
        let text = std::fs::read_to_string(control.config_path()).unwrap();
        assert!(
            text.starts_with("[gateway]\nlisten = [\"198.51.100.1\"]\n"),
            "{text}"
        );
        assert!(text.contains("\n[store]\npath = "), "{text}");
        assert!(text.contains("\n[cluster]\nname = \"control1\"\ngrpc = \"10.255.0.50:7300\"\n"));
        let steer = std::fs::read_to_string(cluster.node("steer1").unwrap().config_path()).unwrap();
        assert!(steer.contains("vxlan = \"10.255.0.1:4789\""), "{steer}");
        assert!(steer.contains("address = \"10.255.0.50:7300\""), "{steer}");

        // The control socket.
        assert_eq!(cluster.active_control().unwrap(), "control1");
        assert_eq!(cluster.nodes().unwrap()["control"], "control1");
        let e = cluster.control("status").unwrap_err().to_string();
        assert!(e.contains("unsupported: status"), "{e}");
        assert!(cluster.control_on("data1", "nodes").is_err());

        // A node that keeps running has not exited on its own.
        assert!(cluster
            .wait_exit("data2", Duration::from_millis(50))
            .is_err());
        assert!(cluster.node("data2").unwrap().expected());

        // Kill and restart a data node; a running node cannot be restarted.
        let first = cluster.node("data1").unwrap().process().pid();
        assert!(cluster.restart("data1").is_err());
        cluster.kill("data1").unwrap();
        assert!(!cluster.node("data1").unwrap().is_running());
        assert!(cluster.kill("data1").is_err());
        let old = cluster.restart("data1").unwrap();
        assert_eq!(old.pid(), first);
        let node = cluster.node("data1").unwrap();
        assert!(node.is_running() && node.process().pid() != first);
        let log = format!("{}-data1-r1.log", cluster.label);
        assert!(node.process().log_path().ends_with(&log), "{node:?}");

        // And the control node (its socket is the stand-in's, so it answers at once).
        cluster.kill("control1").unwrap();
        assert!(cluster.control("nodes").is_err());
        cluster.restart("control1").unwrap();
        assert!(cluster.nodes().is_ok());

        let stopped = cluster.stop_all();
        let names: Vec<&str> = stopped.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, vec!["control1", "data1", "data2", "steer1"]);
        assert!(cluster.members().iter().all(|n| !n.is_running()));
        stand_in.finish(bed);
    }

    #[test]
    fn two_control_nodes_share_an_etcd_store() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let stand_in = StandIn::start(&bed, &["data1", "steer1"]);
        let bin = stand_in.bin.clone();
        let spec = ClusterSpec {
            controls: 2,
            data: 1,
            store: ClusterStore::Etcd,
            ..fast_spec()
        };
        let cluster = ProtegoCluster::start_with(&bed, &topo, &[], &spec, &bin).expect("start");
        let (etcd, node) = cluster.etcd().expect("etcd");
        etcd.process.check_running().expect("etcd runs");
        // control1 .50, control2 .51, data1 .52, then etcd.
        assert_eq!(node.underlay.to_string(), "10.255.0.53/24");
        assert_eq!(etcd.client_url, "https://10.255.0.53:2379");
        // TLS with client certificates, and authentication on: the control nodes' user may
        // write their prefix only, a client without the user nothing.
        let pw = etcd.pki.password_file(ETCD_USER);
        let user = Some((ETCD_USER, pw.as_path()));
        let cluster_dir = cluster.dir().file_name().unwrap().to_string_lossy();
        let key = format!("/protego/cl{}/x", cluster_dir.trim_start_matches("cluster"));
        etcd.etcdctl_as(user, "control1", &["put", &key, "1"])
            .expect("the user writes its prefix");
        assert!(etcd
            .etcdctl_as(user, "control1", &["put", "/x", "1"])
            .is_err());
        assert!(etcd.etcdctl_as(None, "control1", &["get", &key]).is_err());
        assert!(etcd.etcdctl(&["get", &key]).unwrap().contains(&key));
        for name in ["control1", "control2"] {
            let text = std::fs::read_to_string(cluster.node(name).unwrap().config_path()).unwrap();
            assert!(
                text.contains(
                    "\n[store]\nbackend = \"etcd\"\nendpoints = [\"https://10.255.0.53:2379\"]\n"
                ),
                "{text}"
            );
            assert!(
                text.contains(&format!("/etcd-pki/{name}.key\"\n")),
                "{text}"
            );
            assert!(!text.contains("state.redb"), "{text}");
            assert!(
                text.contains(&format!("\n[cluster]\nname = \"{name}\"\n")),
                "{text}"
            );
        }
        let data = std::fs::read_to_string(cluster.node("data1").unwrap().config_path()).unwrap();
        assert!(data.contains("address = \"10.255.0.51:7300\""), "{data}");
        assert_eq!(cluster.active_control().unwrap(), "control1");
        cluster.kill("control1").unwrap();
        assert_eq!(cluster.active_control().unwrap(), "control2");
        cluster.stop_all();
        stand_in.finish(bed);
    }

    /// Datagrams each of `sockets` has waiting (non-blocking reads until empty).
    fn drain_counts(sockets: &[std::net::UdpSocket]) -> Vec<usize> {
        sockets
            .iter()
            .map(|s| {
                s.set_nonblocking(true).unwrap();
                let mut buf = [0u8; 64];
                std::iter::from_fn(|| s.recv(&mut buf).ok()).count()
            })
            .collect()
    }

    #[test]
    fn two_steer_nodes_share_the_vip_behind_an_ecmp_router() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let stand_in = StandIn::start(&bed, &["data1", "data2", "steer1", "steer2"]);
        let bin = stand_in.bin.clone();
        let spec = ClusterSpec {
            steers: 2,
            ..fast_spec()
        };
        let cluster = ProtegoCluster::start_with(&bed, &topo, &[], &spec, &bin).expect("start");
        assert_eq!(cluster.steer_node_names(), vec!["steer1", "steer2"]);
        let gw = &topo.gateway;
        let (vip, vtep) = (gw.wan.addr, gw.underlay.addr);
        // Each steer node: its own namespace and underlay address (its Geneve address), the
        // VTEP address for VXLAN.
        for (name, addr) in [("steer1", "10.255.0.53"), ("steer2", "10.255.0.54")] {
            let node = cluster.node(name).unwrap();
            assert_ne!(node.netns().name(), gw.ns.name());
            assert_eq!(node.underlay().addr.to_string(), addr);
            let text = std::fs::read_to_string(node.config_path()).unwrap();
            assert!(text.contains("vips = [\"198.51.100.1\"]"), "{text}");
            assert!(text.contains("vxlan = \"10.255.0.1:4789\""), "{text}");
            assert!(
                text.contains(&format!("geneve = \"{addr}:6081\"")),
                "{text}"
            );
            let lo = node
                .netns()
                .ip(["-4", "addr", "show", "dev", "lo"])
                .unwrap();
            assert!(
                lo.contains("198.51.100.1/32") && lo.contains("10.255.0.1/32"),
                "{lo}"
            );
        }
        let calls = std::fs::read_to_string(bed.dir().join("calls")).unwrap();
        assert!(
            calls.contains("--name steer2 --role steer --ip 10.255.0.54 --dns steer2\n"),
            "{calls}"
        );
        let router = cluster.router().expect("a router");
        assert_eq!(router.active(), vec!["steer1", "steer2"]);
        let routes = router.describe().unwrap();
        assert_eq!(routes.matches("nexthop via 100.64.").count(), 4, "{routes}");

        // Flows from many source ports spread over both steer nodes, from the WAN to the VIP
        // and from a cloud host to the VTEP address.
        let wan = crate::inject::attach_wan_host(&bed, &topo, "ecmpw", 200).unwrap();
        let bind = |ns: &Netns, ip: IpAddr, port: u16| {
            ns.udp_socket(SocketAddr::new(ip, port)).expect("bind")
        };
        let spread = |from: &Netns, src: IpAddr, dst: SocketAddr| -> Vec<usize> {
            let sinks: Vec<_> = ["steer1", "steer2"]
                .iter()
                .map(|n| bind(cluster.netns(n).unwrap(), dst.ip(), dst.port()))
                .collect();
            for _ in 0..32 {
                let s = bind(from, src, 0);
                s.send_to(b"flow", dst).expect("send");
            }
            std::thread::sleep(Duration::from_millis(300));
            drain_counts(&sinks)
        };
        let to_vip = SocketAddr::new(vip, 4500);
        let to_vtep = SocketAddr::new(vtep, VXLAN_PORT);
        let host = &topo.hosts[0];
        for (from, src, dst) in [
            (&wan.ns, wan.addr.addr, to_vip),
            (&host.ns, host.underlay.addr, to_vtep),
        ] {
            let counts = spread(from, src, dst);
            assert_eq!(counts.iter().sum::<usize>(), 32, "{dst}: {counts:?}");
            assert!(counts.iter().all(|&c| c > 0), "{dst}: {counts:?}");
        }

        // Withdrawn: everything goes to the other steer node; none left: nothing arrives.
        cluster.withdraw_steer("steer1").unwrap();
        assert!(cluster.withdraw_steer("steer1").is_err());
        assert_eq!(router.active(), vec!["steer2"]);
        assert_eq!(spread(&wan.ns, wan.addr.addr, to_vip), vec![0, 32]);
        assert_eq!(spread(&host.ns, host.underlay.addr, to_vtep), vec![0, 32]);
        cluster.withdraw_steer("steer2").unwrap();
        assert!(router.describe().unwrap().contains("blackhole"));
        assert_eq!(spread(&wan.ns, wan.addr.addr, to_vip), vec![0, 0]);
        cluster.restore_steer("steer1").unwrap();
        cluster.restore_steer("steer2").unwrap();
        assert!(cluster.restore_steer("steer2").is_err());
        let counts = spread(&wan.ns, wan.addr.addr, to_vip);
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
        assert!(cluster.withdraw_steer("data1").is_err());

        cluster.stop_all();
        stand_in.finish(bed);
    }

    #[test]
    fn a_single_steer_node_has_no_nexthop_to_withdraw() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let stand_in = StandIn::start(&bed, &["data1", "data2", "steer1"]);
        let bin = stand_in.bin.clone();
        let cluster =
            ProtegoCluster::start_with(&bed, &topo, &[], &fast_spec(), &bin).expect("start");
        assert!(cluster.router().is_none());
        let e = cluster.withdraw_steer("steer1").unwrap_err().to_string();
        assert!(e.contains("single steer node"), "{e}");
        cluster.stop_all();
        stand_in.finish(bed);
    }

    #[test]
    fn a_node_that_exits_fails_the_start_with_every_log_tail() {
        let bed = Testbed::new().expect("test bed");
        let topo = small_topology(&bed);
        let bin = fake_protego(bed.dir(), "echo \"fake data: cannot bind\"; exit 3");
        let err = ProtegoCluster::start_with(&bed, &topo, &[], &fast_spec(), &bin)
            .expect_err("a data node exits");
        let text = err.to_string();
        assert!(matches!(err, Error::ProcessExited { .. }), "{text}");
        assert!(
            text.contains("exit code 3") && text.contains("fake data: cannot bind"),
            "{text}"
        );
        for node in ["control1", "data1", "data2", "steer1"] {
            assert!(text.contains(&format!("---- {node} (")), "{node}: {text}");
        }
        bed.teardown().expect("teardown");
    }
}
