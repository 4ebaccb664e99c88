//! etcd 3.4 (Debian `etcd-server`) as the distributed store of a test, set up as
//! docs/operations.md tells operators to: a single-member cluster inside a namespace, data in
//! the run directory, TLS on its client and peer URLs with client certificates required
//! (`--client-cert-auth`, `--peer-client-cert-auth`), and, once [`Etcd::enable_auth`] ran,
//! etcd's authentication on, with a `root` user and one user per Protego cluster whose role may
//! read and write only that cluster's key prefix.
//!
//! The certificates ([`EtcdPki`]) come from `protego certs`, with a CA of their own (not the
//! CA of the cluster's nodes). Users are made with `etcdctl` (Debian `etcd-client`).

use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bed::Process;
use crate::cmd::{program_exists, Cmd};
use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::wait::{wait_for, Probe};

/// The name (CN) of the administrator's client certificate, which `etcdctl` uses.
pub const ADMIN: &str = "admin";
/// The name (CN, file stem) of etcd's own certificate (server and peer).
const SERVER: &str = "etcd";

/// The TLS files of an etcd, made with `protego certs` into one directory: `ca.pem` (the CA
/// etcd trusts for clients and peers, and clients trust for etcd), `etcd.pem`/`etcd.key`
/// (etcd's certificate, server and peer, naming its address), and `<client>.pem`/`.key` per
/// client (CN the client's name, which is never an etcd user name).
#[derive(Clone, Debug)]
pub struct EtcdPki {
    /// The directory.
    pub dir: PathBuf,
}

impl EtcdPki {
    /// Makes a CA in `dir`, etcd's certificate for `etcd_addr`, and a client certificate for
    /// each of `clients` and for [`ADMIN`], with the `protego` binary `bin`.
    pub fn create(bin: &Path, dir: &Path, etcd_addr: IpAddr, clients: &[&str]) -> Result<EtcdPki> {
        let certs = |args: &[&str]| {
            Cmd::new(bin.display().to_string())
                .arg("certs")
                .args(args.iter().copied())
                .args(["--dir".to_owned(), dir.display().to_string()])
                .run()
                .map(drop)
        };
        certs(&["init", "--ca-name", "Protego test etcd CA"])?;
        let addr = etcd_addr.to_string();
        certs(&[
            "issue", "--name", SERVER, "--role", "control", "--ip", &addr,
        ])?;
        for client in clients.iter().copied().chain([ADMIN]) {
            certs(&["issue", "--name", client, "--role", "control"])?;
        }
        Ok(EtcdPki {
            dir: dir.to_owned(),
        })
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Client (or etcd's) certificate `name`.
    pub fn cert(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pem"))
    }

    /// Its private key.
    pub fn key(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.key"))
    }

    /// The password file of etcd user `user` (mode 0600), written by [`Etcd::enable_auth`].
    pub fn password_file(&self, user: &str) -> PathBuf {
        self.dir.join(format!("{user}.password"))
    }
}

/// A running single-member etcd.
#[derive(Clone, Debug)]
pub struct Etcd {
    /// The etcd process.
    pub process: Process,
    /// The client endpoint (`https://<addr>:<port>`).
    pub client_url: String,
    /// The client address.
    pub client_addr: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its TLS files (and, once authentication is on, the users' password files).
    pub pki: EtcdPki,
    /// The namespace it runs in (where `etcdctl` runs too).
    ns: Netns,
    /// Whether authentication is on.
    auth: bool,
}

impl Etcd {
    /// Starts etcd in `ns` listening for clients on `https://addr:client_port` (peers on
    /// `https://addr:client_port + 1`), with `pki`'s certificates and client certificates
    /// required on both, and waits until the client port accepts connections. `name` must be
    /// unique within the test bed (`[a-z0-9-]`). Authentication is off until
    /// [`Etcd::enable_auth`].
    pub fn start(
        ns: &Netns,
        name: &str,
        addr: IpAddr,
        client_port: u16,
        pki: &EtcdPki,
    ) -> Result<Etcd> {
        for program in ["etcd", "etcdctl"] {
            if !program_exists(program) {
                return Err(Error::MissingProgram {
                    program: format!("{program} (Debian etcd-server and etcd-client)"),
                });
            }
        }
        let peer_port = client_port
            .checked_add(1)
            .ok_or_else(|| Error::InvalidSpec {
                field: "etcd client_port".to_owned(),
                reason: "must leave room for the peer port (client_port + 1)".to_owned(),
            })?;
        let host = match addr {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        };
        let client_url = format!("https://{host}:{client_port}");
        let peer_url = format!("https://{host}:{peer_port}");
        let data_dir = ns.run_dir().join(format!("etcd-{name}"));
        let path = |p: PathBuf| p.display().to_string();
        let (ca, cert, key) = (
            path(pki.ca()),
            path(pki.cert(SERVER)),
            path(pki.key(SERVER)),
        );
        let cmd = Cmd::new("etcd").args([
            "--name".to_owned(),
            name.to_owned(),
            "--data-dir".to_owned(),
            data_dir.to_string_lossy().into_owned(),
            "--listen-client-urls".to_owned(),
            client_url.clone(),
            "--advertise-client-urls".to_owned(),
            client_url.clone(),
            "--listen-peer-urls".to_owned(),
            peer_url.clone(),
            "--initial-advertise-peer-urls".to_owned(),
            peer_url.clone(),
            "--initial-cluster".to_owned(),
            format!("{name}={peer_url}"),
            "--initial-cluster-state".to_owned(),
            "new".to_owned(),
            // TLS for clients and peers; both must show a certificate of the CA.
            "--trusted-ca-file".to_owned(),
            ca.clone(),
            "--cert-file".to_owned(),
            cert.clone(),
            "--key-file".to_owned(),
            key.clone(),
            "--client-cert-auth".to_owned(),
            "--peer-trusted-ca-file".to_owned(),
            ca,
            "--peer-cert-file".to_owned(),
            cert,
            "--peer-key-file".to_owned(),
            key,
            "--peer-client-cert-auth".to_owned(),
            "--logger".to_owned(),
            "zap".to_owned(),
            "--log-outputs".to_owned(),
            "stderr".to_owned(),
            // etcd raises a lease's TTL to its election timeout (default 1 s, so 2 s leases
            // for 1 s requests): short timeouts keep the control nodes' 1 s election leases.
            "--heartbeat-interval".to_owned(),
            "100".to_owned(),
            "--election-timeout".to_owned(),
            "500".to_owned(),
        ]);
        let process = ns.spawn(&format!("etcd-{name}"), cmd)?;
        let port = client_port.to_string();
        wait_for(
            &format!("etcd {name} on {client_url}"),
            Duration::from_secs(20),
            || {
                process.check_running()?;
                let out =
                    ns.exec(Cmd::new("ss").args(["-Hltn", "sport", "=", &format!(":{port}")]))?;
                // zap logs "serving client traffic (securely)", capnslog "ready to serve
                // client requests".
                let log = process.log();
                let serving = log.contains("serving client traffic")
                    || log.contains("ready to serve client requests");
                Ok(if out.trim().is_empty() || !serving {
                    Probe::NotYet("not serving yet".to_owned())
                } else {
                    Probe::Ready(())
                })
            },
        )?;
        Ok(Etcd {
            process,
            client_url,
            client_addr: SocketAddr::new(addr, client_port),
            data_dir,
            pki: pki.clone(),
            ns: ns.clone(),
            auth: false,
        })
    }

    /// Turns etcd's authentication on: a `root` user (with the `root` role) and, for each
    /// `(user, prefix)`, a user and a role of that name allowed to read and write the keys
    /// under `prefix` only. Each user's random password is written to
    /// [`EtcdPki::password_file`] (mode 0600) and given to `etcdctl` on its standard input.
    pub fn enable_auth(&mut self, users: &[(&str, &str)]) -> Result<()> {
        self.add_user("root")?;
        self.etcdctl(&["user", "grant-role", "root", "root"])?;
        for (user, prefix) in users {
            self.etcdctl(&["role", "add", user])?;
            self.etcdctl(&[
                "role",
                "grant-permission",
                user,
                "--prefix=true",
                "readwrite",
                prefix,
            ])?;
            self.add_user(user)?;
            self.etcdctl(&["user", "grant-role", user, user])?;
        }
        self.etcdctl(&["auth", "enable"])?;
        self.auth = true;
        Ok(())
    }

    /// Creates etcd user `user` with a new random password, written to its password file.
    fn add_user(&self, user: &str) -> Result<()> {
        let file = self.pki.password_file(user);
        let mut bytes = [0u8; 16];
        let urandom = Path::new("/dev/urandom");
        std::io::Read::read_exact(
            &mut std::fs::File::open(urandom).map_err(|e| Error::io("open", urandom, e))?,
            &mut bytes,
        )
        .map_err(|e| Error::io("read", urandom, e))?;
        let password: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&file, format!("{password}\n"))
            .map_err(|e| Error::io("write password file", &file, e))?;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| Error::io("restrict password file", &file, e))?;
        // `--interactive=false` reads the password from the standard input.
        self.ns
            .exec(
                self.etcdctl_cmd(None, ADMIN)
                    .args(["user", "add", user, "--interactive=false"])
                    .env("ETCD_STDIN", file.display().to_string()),
            )
            .map(drop)
    }

    /// Runs `etcdctl ARGS` against this etcd as the administrator: its client certificate
    /// and, once authentication is on, the `root` user. Returns the standard output.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        let root = self.auth.then(|| self.pki.password_file("root"));
        let user = root.as_ref().map(|file| ("root", file.as_path()));
        self.etcdctl_as(user, ADMIN, args)
    }

    /// Runs `etcdctl ARGS` with client certificate `cert` and, if given, as etcd user `user`
    /// with the password in its file (read by the shell, so it shows on no command line).
    pub fn etcdctl_as(
        &self,
        user: Option<(&str, &Path)>,
        cert: &str,
        args: &[&str],
    ) -> Result<String> {
        self.ns
            .exec(self.etcdctl_cmd(user, cert).args(args.iter().copied()))
    }

    /// `etcdctl` with the endpoint, the CA and client certificate `cert`, through `sh`, which
    /// sets `ETCDCTL_USER` from a password file (`ETCD_USER`, `ETCD_PASSWORD_FILE`) and feeds
    /// the file `ETCD_STDIN` (if set) to its standard input.
    fn etcdctl_cmd(&self, user: Option<(&str, &Path)>, cert: &str) -> Cmd {
        const SCRIPT: &str = r#"if [ -n "$ETCD_USER" ]; then
    ETCDCTL_USER="$ETCD_USER:$(cat "$ETCD_PASSWORD_FILE")"; export ETCDCTL_USER
fi
exec etcdctl "$@" < "${ETCD_STDIN:-/dev/null}""#;
        let path = |p: PathBuf| p.display().to_string();
        let mut cmd = Cmd::new("sh")
            .args(["-c", SCRIPT, "etcdctl"])
            .args([
                format!("--endpoints={}", self.client_url),
                format!("--cacert={}", path(self.pki.ca())),
                format!("--cert={}", path(self.pki.cert(cert))),
                format!("--key={}", path(self.pki.key(cert))),
            ])
            .env("ETCDCTL_API", "3");
        if let Some((name, file)) = user {
            cmd = cmd
                .env("ETCD_USER", name)
                .env("ETCD_PASSWORD_FILE", file.display().to_string());
        }
        cmd
    }
}
