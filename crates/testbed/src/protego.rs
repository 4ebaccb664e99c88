//! Runs Protego (`protego up`) as the gateway of a [`Topology`]: writes its TOML configuration
//! and PSK files from the topology, starts it in the gateway namespace, and reads its state
//! through `protego status --json`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::strongswan::Connection;
use crate::topology::{Topology, GATEWAY_ID};
use crate::{workspace_bin, Cmd, Error, Process, Result, Testbed};

/// One `[[tunnel]]` of the gateway, toward one site of the topology.
#[derive(Debug, Clone)]
pub struct GatewayTunnel {
    /// Index of the site in [`Topology::sites`].
    pub site: usize,
    /// The tunnel's name (also used in `protego status`).
    pub name: String,
    /// The PSK shared with the site.
    pub psk: String,
    /// IKE proposals (strongSwan keywords).
    pub proposals: Vec<String>,
    /// ESP proposals (strongSwan keywords).
    pub esp_proposals: Vec<String>,
    /// `"none"` (the site initiates) or `"start"` (Protego initiates).
    pub start_action: &'static str,
    /// IKE and ESP between the gateway and the site over IPv6 (the WAN's IPv6 addresses; the
    /// gateway then also listens on its IPv6 WAN address). Not for sites behind NAT.
    pub outer_ipv6: bool,
    /// Extra `key = value` lines appended to the `[[tunnel]]` table verbatim
    /// (e.g. `rekey_time = "10s"`, `dpd_delay = "2s"`).
    pub extra: Vec<String>,
    /// Local traffic selectors besides the VNet's prefixes (`10.99.0.0/24`: a segment behind
    /// a customer's edge router attached to the VNet).
    pub extra_local_ts: Vec<String>,
}

impl GatewayTunnel {
    /// The tunnel toward `site` with the names the standard site connections use
    /// ([`Topology::site_connections`]) and modern default proposals.
    pub fn for_site(topo: &Topology, site: usize, psk: &str) -> GatewayTunnel {
        let s = &topo.sites[site];
        GatewayTunnel {
            site,
            name: format!("{}-site{}", topo.tenants[s.tenant].name, s.index),
            psk: psk.to_owned(),
            proposals: vec!["aes256gcm16-prfsha256-x25519".to_owned()],
            esp_proposals: vec!["aes256gcm16".to_owned()],
            start_action: "none",
            outer_ipv6: false,
            extra: Vec::new(),
            extra_local_ts: Vec::new(),
        }
    }

    /// Makes `conn` (a site's side from [`Topology::site_connections`]) offer exactly this
    /// tunnel's proposals, so both ends agree.
    pub fn apply_to_site(&self, conn: &mut Connection) {
        conn.proposals = self.proposals.clone();
        for child in &mut conn.children {
            child.esp_proposals = self.esp_proposals.clone();
        }
    }
}

/// One `[[filter]]` of the gateway: a tenant's eBPF program (docs/configuration.md).
#[derive(Debug, Clone)]
pub struct GatewayFilter {
    /// The tenant whose traffic it sees.
    pub tenant: String,
    /// `"to_cloud"` or `"from_cloud"`.
    pub direction: &'static str,
    /// The ELF object (absolute, or relative to the configuration file).
    pub object: PathBuf,
    /// The program: `"xdp"` or `"xdp:FUNCTION"`.
    pub section: String,
    /// Order among the tenant's filters of one direction (lower first).
    pub weight: u32,
}

impl GatewayFilter {
    /// The `[[filter]]` table, for [`ProtegoGateway::start_with_tables`].
    pub fn to_toml(&self) -> String {
        format!(
            "[[filter]]\ntenant = {:?}\ndirection = {:?}\nobject = {:?}\nsection = {:?}\nweight = {}\n",
            self.tenant,
            self.direction,
            self.object.display().to_string(),
            self.section,
            self.weight
        )
    }

    /// The `[[filter]]` tables of `filters`, one after the other.
    pub fn tables(filters: &[GatewayFilter]) -> String {
        filters
            .iter()
            .map(GatewayFilter::to_toml)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A running `protego up` in the gateway namespace.
#[derive(Debug)]
pub struct ProtegoGateway {
    process: Process,
    config: PathBuf,
    socket: PathBuf,
    bin: PathBuf,
    netns: String,
}

/// Counts gateway starts in this process (directory and log names).
static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|s| format!("{s:?}")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Renders the gateway configuration for `tunnels` over `topo`: one `[[tenant]]` and one
/// `[[vnet]]` per tenant of the topology (a /32 or /128 route per VM to its host's VTEP), and
/// one `[[tunnel]]` per entry. `extra_gateway` lines go into `[gateway]` verbatim.
pub fn render_config(
    topo: &Topology,
    tunnels: &[GatewayTunnel],
    socket: &std::path::Path,
    psk_dir: &std::path::Path,
    extra_gateway: &[String],
) -> Result<String> {
    render_config_with_store(topo, tunnels, socket, psk_dir, extra_gateway, None)
}

/// [`render_config`] with the lines of its `[store]` table given: `None` writes the file store
/// beside the control socket, as [`render_config`] does.
pub(crate) fn render_config_with_store(
    topo: &Topology,
    tunnels: &[GatewayTunnel],
    socket: &std::path::Path,
    psk_dir: &std::path::Path,
    extra_gateway: &[String],
    store: Option<&[String]>,
) -> Result<String> {
    let mut out = String::new();
    let gw = &topo.gateway;
    let _ = writeln!(out, "[gateway]");
    let mut listen = vec![gw.wan.addr.to_string()];
    if tunnels.iter().any(|t| t.outer_ipv6) {
        listen.push(gw.wan6.addr.to_string());
    }
    let _ = writeln!(out, "listen = {}", toml_list(&listen));
    let _ = writeln!(out, "control_socket = {:?}", socket.display().to_string());
    for line in extra_gateway {
        let _ = writeln!(out, "{line}");
    }
    write_inventory(&mut out, topo, None, tunnels, psk_dir)?;
    match store {
        Some(lines) => {
            let _ = writeln!(out, "\n[store]");
            for line in lines {
                let _ = writeln!(out, "{line}");
            }
        }
        None => {
            // The IKE state store beside the control socket: per run, so runs never share it,
            // and kept across a restart of the gateway within the run.
            let store = socket.with_file_name("state.redb");
            let _ = writeln!(out, "\n[store]\npath = {:?}", store.display().to_string());
        }
    }
    Ok(out)
}

/// Renders the `[[tenant]]`, `[[vnet]]` and `[[tunnel]]` tables of [`render_config`] for the
/// tenants with indexes `only` (all with None) and `tunnels` (whose sites must belong to
/// them), writing the PSK files into `psk_dir`: a file for `protego ctl apply`.
pub fn render_inventory(
    topo: &Topology,
    only: &[usize],
    tunnels: &[GatewayTunnel],
    psk_dir: &std::path::Path,
) -> Result<String> {
    let mut out = String::new();
    write_inventory(&mut out, topo, Some(only), tunnels, psk_dir)?;
    Ok(out)
}

fn write_inventory(
    out: &mut String,
    topo: &Topology,
    only: Option<&[usize]>,
    tunnels: &[GatewayTunnel],
    psk_dir: &std::path::Path,
) -> Result<()> {
    let gw = &topo.gateway;
    let tenants = topo
        .tenants
        .iter()
        .enumerate()
        .filter(|(i, _)| only.is_none_or(|o| o.contains(i)))
        .map(|(_, t)| t);
    for t in tenants.clone() {
        let _ = writeln!(out, "\n[[tenant]]\nname = {:?}", t.name);
    }
    for t in tenants {
        let _ = writeln!(out, "\n[[vnet]]");
        let _ = writeln!(out, "tenant = {:?}", t.name);
        let _ = writeln!(out, "name = \"vnet\"");
        let _ = writeln!(out, "vni = {}", t.vni);
        let gateway_ips: Vec<String> = std::iter::once(t.gateway_ip)
            .chain(t.gateway_ip6)
            .map(|ip| ip.to_string())
            .collect();
        let _ = writeln!(out, "gateway_ip = {}", toml_list(&gateway_ips));
        let _ = writeln!(out, "vtep = {:?}", gw.underlay.addr.to_string());
        // One host route per VM address (IPv4, and IPv6 when the VNet has it).
        let routes: Vec<String> = t
            .vms
            .iter()
            .flat_map(|vm| {
                let host = topo.hosts[vm.host].underlay.addr.to_string();
                std::iter::once(vm.addr).chain(vm.addr6).map(move |a| {
                    format!(
                        "{{ prefix = {:?}, host = {host:?} }}",
                        a.host_prefix().to_string()
                    )
                })
            })
            .collect();
        let _ = writeln!(out, "routes = [{}]", routes.join(", "));
    }
    for tun in tunnels {
        let site = topo.sites.get(tun.site).ok_or_else(|| Error::InvalidSpec {
            field: format!("tunnel {}.site", tun.name),
            reason: format!("no site {}", tun.site),
        })?;
        let tenant = &topo.tenants[site.tenant];
        let psk_file = psk_dir.join(format!("{}.psk", tun.name));
        std::fs::write(&psk_file, format!("{}\n", tun.psk))
            .map_err(|e| Error::io("write PSK file", &psk_file, e))?;
        let mut local_ts = vec![tenant.vnet.to_string()];
        local_ts.extend(tenant.vnet6.map(|p| p.to_string()));
        local_ts.extend(tun.extra_local_ts.iter().cloned());
        let mut remote_ts = vec![site.lan.to_string()];
        remote_ts.extend(site.lan6.map(|p| p.to_string()));
        let _ = writeln!(out, "\n[[tunnel]]");
        let _ = writeln!(out, "name = {:?}", tun.name);
        let _ = writeln!(out, "tenant = {:?}", tenant.name);
        let _ = writeln!(out, "vnet = \"vnet\"");
        let remote = if tun.outer_ipv6 {
            site.addr6.addr
        } else {
            site.public_addr
        };
        let _ = writeln!(out, "remote_addrs = {:?}", remote.to_string());
        let _ = writeln!(out, "local_id = {GATEWAY_ID:?}");
        let _ = writeln!(out, "remote_id = {:?}", topo.site_id(tun.site));
        let _ = writeln!(out, "psk_file = {:?}", psk_file.display().to_string());
        let _ = writeln!(out, "proposals = {}", toml_list(&tun.proposals));
        let _ = writeln!(out, "esp_proposals = {}", toml_list(&tun.esp_proposals));
        let _ = writeln!(out, "local_ts = {}", toml_list(&local_ts));
        let _ = writeln!(out, "remote_ts = {}", toml_list(&remote_ts));
        let _ = writeln!(out, "start_action = {:?}", tun.start_action);
        for line in &tun.extra {
            let _ = writeln!(out, "{line}");
        }
    }
    Ok(())
}

/// `protego up` on `config`, logging what the interop tests read.
fn up_command(bin: &std::path::Path, config: &std::path::Path) -> Cmd {
    Cmd::new(bin.display().to_string())
        .args(["up", "--config", &config.display().to_string()])
        .args(["--log-level", "info,protego_ike=debug"])
}

impl ProtegoGateway {
    /// Writes the configuration, starts `protego up` in the gateway namespace and waits until its
    /// status socket answers.
    pub fn start(
        bed: &Testbed,
        topo: &Topology,
        tunnels: &[GatewayTunnel],
        extra_gateway: &[String],
    ) -> Result<ProtegoGateway> {
        Self::start_with_tables(bed, topo, tunnels, extra_gateway, "")
    }

    /// [`start`](Self::start) with `extra_tables` appended to the configuration verbatim
    /// (whole TOML tables, such as `[[attachment]]`).
    pub fn start_with_tables(
        bed: &Testbed,
        topo: &Topology,
        tunnels: &[GatewayTunnel],
        extra_gateway: &[String],
        extra_tables: &str,
    ) -> Result<ProtegoGateway> {
        Self::start_binary(bed, topo, tunnels, extra_gateway, extra_tables, None)
    }

    /// [`start_with_tables`](Self::start_with_tables) running `bin` (None: the workspace's
    /// `protego`, or `PROTEGO_BIN`).
    pub fn start_binary(
        bed: &Testbed,
        topo: &Topology,
        tunnels: &[GatewayTunnel],
        extra_gateway: &[String],
        extra_tables: &str,
        bin: Option<&std::path::Path>,
    ) -> Result<ProtegoGateway> {
        // A fresh directory per start, so a test may run several gateways one after another.
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = bed.dir().join(format!("protego{n}"));
        std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
        let socket = dir.join("protego.sock");
        let config = dir.join("protego.toml");
        let mut text = render_config(topo, tunnels, &socket, &dir, extra_gateway)?;
        text.push('\n');
        text.push_str(extra_tables);
        std::fs::write(&config, text).map_err(|e| Error::io("write config", &config, e))?;
        let bin = match bin {
            Some(b) => b.to_owned(),
            None => workspace_bin("protego")?,
        };
        let process = topo
            .gateway
            .ns
            .spawn(&format!("protego{n}"), up_command(&bin, &config))?;
        let gw = ProtegoGateway {
            process,
            config,
            socket,
            bin,
            netns: topo.gateway.ns.name().to_owned(),
        };
        gw.wait_ready()?;
        Ok(gw)
    }

    /// Starts `protego up` again on the same configuration file and directory, so on the same
    /// state store (`[store]`), as an operator restarting the service, and waits until its
    /// status socket answers. The previous process must have exited (stopped or killed); it is
    /// returned so that its log stays readable.
    pub fn restart(&mut self, topo: &Topology, label: &str) -> Result<Process> {
        if self.process.check_running().is_ok() {
            return Err(Error::InvalidSpec {
                field: "protego restart".to_owned(),
                reason: "the previous protego up is still running".to_owned(),
            });
        }
        let process = topo
            .gateway
            .ns
            .spawn(label, up_command(&self.bin, &self.config))?;
        let old = std::mem::replace(&mut self.process, process);
        self.wait_ready()?;
        Ok(old)
    }

    /// Waits until the status socket answers (at most 20 s; fails early if the process exits).
    fn wait_ready(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            self.process.check_running()?;
            if self.status_json().is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::WaitTimeout {
                    what: format!("protego status socket {}", self.socket.display()),
                    timeout: Duration::from_secs(20),
                    last: self.process.log_tail(40),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process.
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// The configuration file written.
    pub fn config_path(&self) -> &std::path::Path {
        &self.config
    }

    /// `protego status --json`, parsed.
    pub fn status_json(&self) -> Result<serde_json::Value> {
        let out = Cmd::new(self.bin.display().to_string())
            .args([
                "status",
                "--json",
                "--socket",
                &self.socket.display().to_string(),
            ])
            .timeout(Duration::from_secs(5))
            .in_netns(&self.netns)
            .run()?;
        serde_json::from_str(&out).map_err(|e| Error::Parse {
            what: "protego status --json",
            detail: e.to_string(),
            input: out.chars().take(400).collect(),
        })
    }

    /// `protego status` as an operator sees it.
    pub fn status_text(&self) -> Result<String> {
        Cmd::new(self.bin.display().to_string())
            .args(["status", "--socket", &self.socket.display().to_string()])
            .timeout(Duration::from_secs(5))
            .in_netns(&self.netns)
            .run()
    }

    /// Sends one request line to the control socket (`rekey NAME`, `rekey-ike NAME`,
    /// `initiate NAME`, or a JSON object) and returns its JSON answer; an `{"error": ...}`
    /// answer is an [`Error::Command`]. The socket is a file, so no namespace is entered: the
    /// request reaches the gateway within a millisecond (for timing-sensitive tests).
    pub fn control(&self, request: &str) -> Result<serde_json::Value> {
        socket_request(&self.socket, request, Duration::from_secs(10))
    }

    /// Writes `text` into the gateway's directory and runs `protego ctl apply -f` with it
    /// (`--dry-run` if asked); returns what the command printed. A refused apply is an error
    /// carrying the command's message.
    pub fn apply(&self, text: &str, dry_run: bool) -> Result<String> {
        let dir = self.config.parent().unwrap_or(std::path::Path::new("."));
        ctl_apply(&self.bin, &self.socket, dir, text, dry_run)
    }

    /// Runs `protego ctl --socket SOCKET ARGS...` (the socket is a file: no namespace needed)
    /// and returns what it printed; a command that fails is an error carrying its message.
    pub fn ctl<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Cmd::new(self.bin.display().to_string())
            .args(["ctl", "--socket", &self.socket.display().to_string()])
            .args(args)
            .timeout(Duration::from_secs(20))
            .run()
    }

    /// Stops the gateway with SIGTERM (it deletes its IKE SAs) and waits for it to exit.
    pub fn stop(&self) -> Option<std::process::ExitStatus> {
        self.process.stop()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Writes `text` to a new file in `dir` and runs `protego ctl --socket SOCKET apply -f FILE`
/// (the socket is a file: no namespace needed); returns its output.
pub(crate) fn ctl_apply(
    bin: &std::path::Path,
    socket: &std::path::Path,
    dir: &std::path::Path,
    text: &str,
    dry_run: bool,
) -> Result<String> {
    static APPLIES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = APPLIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir.join(format!("apply-{n}.toml"));
    std::fs::write(&file, text).map_err(|e| Error::io("write config", &file, e))?;
    let socket = socket.display().to_string();
    let file = file.display().to_string();
    let mut args = vec!["ctl", "--socket", &socket, "apply", "-f", &file];
    if dry_run {
        args.push("--dry-run");
    }
    Cmd::new(bin.display().to_string())
        .args(args)
        .timeout(Duration::from_secs(20))
        .run()
}

/// Sends one request line to the control socket at `socket` and reads its one-line JSON
/// answer within `timeout`; an `{"error": ...}` answer is an [`Error::Command`]. The socket is
/// a file: no namespace is entered.
pub(crate) fn socket_request(
    socket: &std::path::Path,
    request: &str,
    timeout: Duration,
) -> Result<serde_json::Value> {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let io = |what: &'static str| {
        let path = socket.to_owned();
        move |e: std::io::Error| Error::io(what, &path, e)
    };
    let mut stream = UnixStream::connect(socket).map_err(io("connect to control socket"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(io("set timeout on control socket"))?;
    stream
        .set_write_timeout(Some(timeout))
        .map_err(io("set timeout on control socket"))?;
    writeln!(stream, "{}", request.trim()).map_err(io("write to control socket"))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(io("read from control socket"))?;
    let value: serde_json::Value = serde_json::from_str(&line).map_err(|e| Error::Parse {
        what: "control socket answer",
        detail: e.to_string(),
        input: line.chars().take(400).collect(),
    })?;
    if let Some(err) = value.get("error") {
        return Err(Error::Command {
            command: format!(
                "control socket request `{}` on {}",
                request.trim(),
                socket.display()
            ),
            status: "error answer".to_owned(),
            stderr: err.to_string(),
        });
    }
    Ok(value)
}
