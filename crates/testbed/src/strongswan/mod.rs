//! strongSwan as a real IKEv2 (RFC 7296) / ESP-in-UDP (RFC 3948) peer: one
//! charon per network namespace with its own strongswan.conf, private VICI
//! socket and private `/run` (see `/work/shared/STRONGSWAN-PEER.md`), userspace
//! ESP via the kernel-libipsec plugin, driven with `swanctl`.
//!
//! Two strongSwans ([`Flavor`]): the host's (Debian 12, 5.9) and strongSwan 6 from Debian 13,
//! which `scripts/strongswan6.sh` installs into a root of its own; its charon runs chrooted
//! there inside the test's namespace, and the host's `swanctl` drives it over VICI.

pub mod config;
pub mod sas;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bed::Process;
use crate::cmd::{program_exists, Cmd};
use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::wait::{wait_for, Probe};

pub use config::{
    ChildConfig, Connection, PeerAction, StartAction, SwanctlConfig, DEFAULT_ESP_PROPOSAL,
    DEFAULT_IKE_PROPOSAL,
};
pub use sas::{parse_list_sas, ChildSa, IkeSa};

/// The systemd flavour of the daemon (preferred: no pid file).
pub const CHARON_SYSTEMD: &str = "/usr/sbin/charon-systemd";
/// The classic daemon (writes a pid file to /run, hence the private /run).
pub const CHARON_CLASSIC: &str = "/usr/lib/ipsec/charon";

/// Where the charon's directory appears inside the strongSwan 6 root (on a tmpfs over its
/// `/mnt`, private to the daemon's mount namespace).
const ROOT_PEER_DIR: &str = "/mnt/peer";

/// Which strongSwan runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Flavor {
    /// The host's: strongSwan 5.9 from Debian 12.
    #[default]
    Host,
    /// strongSwan 6 from Debian 13, chrooted into [`strongswan6_root`].
    Strongswan6,
}

pub use testreq::{strongswan6_daemon, strongswan6_root};

/// How long charon gets to open its VICI socket.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest usable path of a Unix socket (`sun_path` is 108 bytes with the NUL).
const SUN_PATH_MAX: usize = 107;

/// Daemon-wide settings written to the charon's strongswan.conf.
#[derive(Clone, Debug, PartialEq)]
pub struct CharonSettings {
    /// `retransmit_timeout` (seconds, default 4.0).
    pub retransmit_timeout: Option<f64>,
    /// `retransmit_tries` (default 5).
    pub retransmit_tries: Option<u32>,
    /// `retransmit_base` (default 1.8).
    pub retransmit_base: Option<f64>,
    /// Make-before-break reauthentication (`make_before_break`).
    pub make_before_break: bool,
    /// Default log level for all subsystems (-1..4).
    pub log_level: i32,
    /// Log level of the `ike` subsystem.
    pub ike_log_level: i32,
    /// Log level of the `esp` (libipsec) subsystem.
    pub esp_log_level: i32,
    /// Extra raw lines placed inside the daemon's section.
    pub extra: Vec<String>,
    /// Which strongSwan.
    pub flavor: Flavor,
}

impl Default for CharonSettings {
    fn default() -> Self {
        CharonSettings {
            retransmit_timeout: Some(1.0),
            retransmit_tries: Some(3),
            retransmit_base: None,
            make_before_break: true,
            log_level: 1,
            ike_log_level: 2,
            esp_log_level: 1,
            extra: Vec::new(),
            flavor: Flavor::Host,
        }
    }
}

/// A running charon inside a namespace.
#[derive(Clone, Debug)]
pub struct Charon {
    ns: Netns,
    dir: PathBuf,
    conf: PathBuf,
    vici: PathBuf,
    process: Process,
}

impl Charon {
    /// Starts a charon in `ns` with files under `<run dir>/<label>/`, waits until
    /// its VICI socket answers.
    pub fn start(ns: &Netns, label: &str, settings: &CharonSettings) -> Result<Charon> {
        let (daemon, section) = match settings.flavor {
            Flavor::Strongswan6 => match strongswan6_daemon() {
                Some(_) => (CHARON_SYSTEMD, "charon-systemd"),
                None => {
                    return Err(Error::MissingProgram {
                        program: format!(
                            "{} (strongSwan 6: scripts/setup.sh installs it)",
                            strongswan6_root().join("usr/sbin/charon-systemd").display()
                        ),
                    })
                }
            },
            Flavor::Host if program_exists(CHARON_SYSTEMD) => (CHARON_SYSTEMD, "charon-systemd"),
            Flavor::Host if program_exists(CHARON_CLASSIC) => (CHARON_CLASSIC, "charon"),
            Flavor::Host => {
                return Err(Error::MissingProgram {
                    program: CHARON_SYSTEMD.to_owned(),
                })
            }
        };
        if !program_exists("swanctl") {
            return Err(Error::MissingProgram {
                program: "swanctl".to_owned(),
            });
        }
        if label.is_empty()
            || !label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(Error::InvalidName {
                name: label.to_owned(),
                reason: "charon label must be [A-Za-z0-9_-]+",
            });
        }
        let dir = ns.run_dir().join(label);
        // create_dir (not _all): a second charon with the same label would share
        // the VICI socket, so a reused label fails here.
        fs::create_dir(&dir).map_err(|e| {
            Error::io(
                "create charon directory (labels must be unique per test bed)",
                &dir,
                e,
            )
        })?;
        let vici = dir.join("charon.vici");
        if vici.as_os_str().len() > SUN_PATH_MAX {
            return Err(Error::InvalidName {
                name: vici.display().to_string(),
                reason: "VICI socket path too long for a Unix socket (set TMPDIR shorter)",
            });
        }
        let conf = dir.join("strongswan.conf");
        // `unshare -m` gives charon a private mount namespace (propagation
        // private, so nothing leaks back) with its own tmpfs on /run: the pid
        // file and the stroke/lookip/error-notify sockets stay private.
        // Where the daemon finds this directory: here, or (strongSwan 6) inside its root.
        let inner = match settings.flavor {
            Flavor::Host => dir.clone(),
            Flavor::Strongswan6 => PathBuf::from(ROOT_PEER_DIR),
        };
        let text = render_strongswan_conf(section, &inner.join("charon.vici"), settings);
        fs::write(&conf, text).map_err(|e| Error::io("write", &conf, e))?;
        let cmd = match settings.flavor {
            Flavor::Host => {
                let script = "mount -t tmpfs -o size=4m,mode=0755 protego-run /run && exec \"$0\"";
                Cmd::new("unshare")
                    .args(["-m", "--propagation", "private", "sh", "-c", script, daemon])
                    .env("STRONGSWAN_CONF", conf.to_string_lossy())
            }
            Flavor::Strongswan6 => {
                // Chrooted into the strongSwan 6 root, in the same private mount namespace: its
                // own /run, /proc, the host's /dev (TUN for kernel-libipsec), and this
                // directory at ROOT_PEER_DIR, where the daemon reads its strongswan.conf and
                // makes its VICI socket (which the host's swanctl reaches at `vici`).
                let script = "set -e; R=$1; D=$2; P=$3; \
                    mount -t tmpfs -o size=4m,mode=0755 protego-run \"$R/run\"; \
                    mount -t tmpfs -o size=1m,mode=0755 protego-mnt \"$R/mnt\"; \
                    mkdir -p \"$R$P\"; mount --bind \"$D\" \"$R$P\"; \
                    mount -t proc proc \"$R/proc\"; mount --bind /dev \"$R/dev\"; \
                    exec chroot \"$R\" \"$0\"";
                let root = strongswan6_root();
                Cmd::new("unshare")
                    .args(["-m", "--propagation", "private", "sh", "-c", script, daemon])
                    .arg(root.to_string_lossy())
                    .arg(dir.to_string_lossy())
                    .arg(ROOT_PEER_DIR)
                    .env(
                        "STRONGSWAN_CONF",
                        inner.join("strongswan.conf").to_string_lossy(),
                    )
            }
        };
        let process = ns.spawn(&format!("charon-{label}"), cmd)?;
        let charon = Charon {
            ns: ns.clone(),
            dir,
            conf,
            vici,
            process,
        };
        wait_for(
            &format!("charon {label} to open its VICI socket"),
            STARTUP_TIMEOUT,
            || {
                charon.process.check_running()?;
                if !charon.vici.exists() {
                    return Ok(Probe::NotYet("no socket yet".to_owned()));
                }
                let out = charon.swanctl_cmd(["--stats"]).output()?;
                Ok(if out.success() {
                    Probe::Ready(())
                } else {
                    Probe::NotYet(out.stderr.trim().to_owned())
                })
            },
        )?;
        Ok(charon)
    }

    /// The namespace it runs in.
    pub fn netns(&self) -> &Netns {
        &self.ns
    }

    /// Its directory (strongswan.conf, swanctl.conf, VICI socket).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its strongswan.conf.
    pub fn conf_path(&self) -> &Path {
        &self.conf
    }

    /// The VICI URI (`unix://...`) for `swanctl --uri`.
    pub fn vici_uri(&self) -> String {
        format!("unix://{}", self.vici.display())
    }

    /// The daemon process (its log holds charon's log).
    pub fn process(&self) -> &Process {
        &self.process
    }

    /// charon's log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// A `swanctl` command against this charon (run it with `.run()`).
    pub fn swanctl_cmd<I, S>(&self, args: I) -> Cmd
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        // The VICI socket is a file-system socket, reachable from any network
        // namespace, so swanctl runs directly (no `ip netns exec`).
        Cmd::new("swanctl")
            .args(args)
            .args(["--uri".to_owned(), self.vici_uri()])
            .env("STRONGSWAN_CONF", self.conf.to_string_lossy())
    }

    /// Runs `swanctl <args> --uri <vici>` and requires success.
    pub fn swanctl<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.swanctl_cmd(args).run()
    }

    /// Writes `config` to `swanctl.conf` in its directory and loads it
    /// (`--load-all`: connections and secrets; replaces what was loaded).
    pub fn load(&self, config: &SwanctlConfig) -> Result<()> {
        let text = config.render()?;
        let path = self.dir.join("swanctl.conf");
        fs::write(&path, text).map_err(|e| Error::io("write", &path, e))?;
        self.swanctl(["--load-all", "--clear", "--file", &path.to_string_lossy()])
            .map(drop)
    }

    /// Initiates CHILD_SA `child` (and its IKE SA if needed); blocks until it is
    /// up or failed, at most `timeout`.
    pub fn initiate(&self, child: &str, timeout: Duration) -> Result<()> {
        let secs = timeout.as_secs().max(1);
        self.swanctl_cmd([
            "--initiate",
            "--child",
            child,
            "--timeout",
            &secs.to_string(),
        ])
        .timeout(timeout + Duration::from_secs(5))
        .run()
        .map(drop)
    }

    /// Initiates only the IKE SA of connection `ike`.
    pub fn initiate_ike(&self, ike: &str, timeout: Duration) -> Result<()> {
        let secs = timeout.as_secs().max(1);
        self.swanctl_cmd(["--initiate", "--ike", ike, "--timeout", &secs.to_string()])
            .timeout(timeout + Duration::from_secs(5))
            .run()
            .map(drop)
    }

    /// Starts a rekey of CHILD_SA `child` (returns once triggered).
    pub fn rekey_child(&self, child: &str) -> Result<()> {
        self.swanctl(["--rekey", "--child", child]).map(drop)
    }

    /// Starts a rekey of IKE SA `ike` (returns once triggered).
    pub fn rekey_ike(&self, ike: &str) -> Result<()> {
        self.swanctl(["--rekey", "--ike", ike]).map(drop)
    }

    /// Terminates IKE SA `ike` (and its children), waiting at most `timeout`.
    pub fn terminate_ike(&self, ike: &str, timeout: Duration) -> Result<()> {
        let secs = timeout.as_secs().max(1);
        self.swanctl_cmd(["--terminate", "--ike", ike, "--timeout", &secs.to_string()])
            .timeout(timeout + Duration::from_secs(5))
            .run()
            .map(drop)
    }

    /// Terminates CHILD_SA `child`, waiting at most `timeout`.
    pub fn terminate_child(&self, child: &str, timeout: Duration) -> Result<()> {
        let secs = timeout.as_secs().max(1);
        self.swanctl_cmd([
            "--terminate",
            "--child",
            child,
            "--timeout",
            &secs.to_string(),
        ])
        .timeout(timeout + Duration::from_secs(5))
        .run()
        .map(drop)
    }

    /// The current IKE SAs with their CHILD_SAs.
    pub fn list_sas(&self) -> Result<Vec<IkeSa>> {
        self.process.check_running()?;
        let out = self.swanctl(["--list-sas", "--pretty", "--noblock"])?;
        parse_list_sas(&out)
    }

    /// Waits until IKE SA `ike` is ESTABLISHED; returns it.
    pub fn wait_ike_established(&self, ike: &str, timeout: Duration) -> Result<IkeSa> {
        wait_for(&format!("IKE SA {ike} established"), timeout, || {
            let sas = self.list_sas()?;
            Ok(
                match sas.iter().find(|s| s.name == ike && s.is_established()) {
                    Some(sa) => Probe::Ready(sa.clone()),
                    None => Probe::NotYet(summarize(&sas)),
                },
            )
        })
    }

    /// Waits until a CHILD_SA named `child` is INSTALLED under an established IKE
    /// SA; returns it.
    pub fn wait_child_installed(&self, child: &str, timeout: Duration) -> Result<ChildSa> {
        wait_for(&format!("CHILD_SA {child} installed"), timeout, || {
            let sas = self.list_sas()?;
            let found = sas
                .iter()
                .filter(|s| s.is_established())
                .find_map(|s| s.installed(child).next().cloned());
            Ok(match found {
                Some(c) => Probe::Ready(c),
                None => Probe::NotYet(summarize(&sas)),
            })
        })
    }

    /// Waits until an installed CHILD_SA named `child` has an inbound SPI other
    /// than `old_spi_in` (a rekey finished); returns the new one.
    pub fn wait_child_rekeyed(
        &self,
        child: &str,
        old_spi_in: &str,
        timeout: Duration,
    ) -> Result<ChildSa> {
        wait_for(
            &format!("CHILD_SA {child} rekeyed away from {old_spi_in}"),
            timeout,
            || {
                let sas = self.list_sas()?;
                let found = sas
                    .iter()
                    .flat_map(|s| s.installed(child))
                    .find(|c| c.spi_in != old_spi_in)
                    .cloned();
                Ok(match found {
                    Some(c) => Probe::Ready(c),
                    None => Probe::NotYet(summarize(&sas)),
                })
            },
        )
    }

    /// Waits until no IKE SA named `ike` exists any more.
    pub fn wait_ike_gone(&self, ike: &str, timeout: Duration) -> Result<()> {
        wait_for(&format!("IKE SA {ike} gone"), timeout, || {
            let sas = self.list_sas()?;
            Ok(if sas.iter().any(|s| s.name == ike) {
                Probe::NotYet(summarize(&sas))
            } else {
                Probe::Ready(())
            })
        })
    }

    /// Stops the daemon (SIGTERM, then SIGKILL after a grace period).
    pub fn stop(&self) {
        self.process.stop();
    }
}

/// A one-line summary of SAs for timeout messages.
pub fn summarize(sas: &[IkeSa]) -> String {
    if sas.is_empty() {
        return "no IKE SAs".to_owned();
    }
    let mut s = String::new();
    for sa in sas {
        let _ = write!(s, "{}#{}={} [", sa.name, sa.unique_id, sa.state);
        for c in &sa.children {
            let _ = write!(
                s,
                " {}#{}={} in={} out={}",
                c.name, c.unique_id, c.state, c.spi_in, c.spi_out
            );
        }
        s.push_str(" ] ");
    }
    s.trim_end().to_owned()
}

fn render_strongswan_conf(section: &str, vici: &Path, s: &CharonSettings) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# generated by protego-testbed");
    let _ = writeln!(out, "{section} {{");
    let _ = writeln!(out, "  load_modular = yes");
    let _ = writeln!(out, "  install_virtual_ip = no");
    let _ = writeln!(
        out,
        "  make_before_break = {}",
        if s.make_before_break { "yes" } else { "no" }
    );
    if let Some(v) = s.retransmit_timeout {
        let _ = writeln!(out, "  retransmit_timeout = {v}");
    }
    if let Some(v) = s.retransmit_tries {
        let _ = writeln!(out, "  retransmit_tries = {v}");
    }
    if let Some(v) = s.retransmit_base {
        let _ = writeln!(out, "  retransmit_base = {v}");
    }
    for line in &s.extra {
        let _ = writeln!(out, "  {line}");
    }
    let _ = writeln!(out, "  plugins {{");
    let _ = writeln!(out, "    include /etc/strongswan.d/charon/*.conf");
    let _ = writeln!(
        out,
        "    vici {{\n      socket = unix://{}\n    }}",
        vici.display()
    );
    let _ = writeln!(out, "    kernel-libipsec {{\n      load = yes\n    }}");
    // Plugins that would act on the host outside our namespace/mount sandbox
    // or just add noise.
    for p in ["ha", "farp", "dhcp", "eap-radius", "led", "resolve"] {
        let _ = writeln!(out, "    {p} {{\n      load = no\n    }}");
    }
    let _ = writeln!(out, "  }}");
    let _ = writeln!(out, "  filelog {{");
    let _ = writeln!(out, "    stderr {{");
    let _ = writeln!(out, "      time_format = %H:%M:%S");
    let _ = writeln!(out, "      ike_name = yes");
    let _ = writeln!(out, "      flush_line = yes");
    let _ = writeln!(out, "      default = {}", s.log_level);
    let _ = writeln!(out, "      ike = {}", s.ike_log_level);
    let _ = writeln!(out, "      esp = {}", s.esp_log_level);
    let _ = writeln!(out, "    }}");
    let _ = writeln!(out, "  }}");
    if section == "charon-systemd" {
        // There is no journal to write to in a test bed.
        let _ = writeln!(out, "  journal {{\n    default = -1\n  }}");
    }
    let _ = writeln!(out, "}}");
    // swanctl only needs a handful of plugins for PSK configs; listing them
    // avoids warnings about plugins Debian does not ship.
    let _ = writeln!(out, "swanctl {{\n  load = pem pkcs1 pkcs8 x509 revocation constraints pubkey openssl random\n}}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strongswan_conf_has_private_vici_and_libipsec() {
        let text = render_strongswan_conf(
            "charon-systemd",
            Path::new("/tmp/x/charon.vici"),
            &CharonSettings::default(),
        );
        assert!(text.contains("charon-systemd {"));
        assert!(text.contains("socket = unix:///tmp/x/charon.vici"));
        assert!(text.contains("kernel-libipsec {\n      load = yes"));
        assert!(text.contains("retransmit_tries = 3"));
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }
}
