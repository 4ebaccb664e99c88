//! Test support for control's own tests and for those of the crates above it (the leader
//! election's, in `cluster`): an etcd server per test ([`Etcd`], `etcd` on `PATH`, from
//! Debian's `etcd-server`; missing, it fails under `make test` and in CI and skips elsewhere, see
//! `testreq`), a plain etcd client to look at and tamper with what was written ([`Raw`]), an etcd
//! secured as docs/operations.md says ([`Secured`]), and a stored change ([`put`]). Compiled for
//! tests only: under `cfg(test)` or with the `testing` feature, which only dev-dependencies enable.

use crate::store::{Change, EtcdAccess, EtcdOptions, EtcdUser};
use etcd_client::{Client, Permission};
use rpc::certs::{self, NodeRole, SubjectAltName};
use std::fs::File;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// An etcd server started by one test: loopback ports and a data directory of its own.
/// Dropping it kills the process (by the PID it started) and removes the directory, whatever
/// the test's outcome.
pub struct Etcd {
    child: Option<Child>,
    name: String,
    client_port: u16,
    peer_port: u16,
    /// Holds `data/` (etcd's data directory) and `etcd.log`.
    dir: PathBuf,
    extra: Vec<String>,
    /// TLS on the client URL, with client certificates required (`etcd_tls_tests.rs`).
    tls: Option<ServerTls>,
    /// Where the health check is answered over plain HTTP: the client port, or with TLS a
    /// metrics port of its own.
    health_port: u16,
}

/// An etcd's TLS files: its certificate and key (naming 127.0.0.1), and the CA whose client
/// certificates it accepts (`--client-cert-auth`).
pub struct ServerTls {
    /// The CA whose client certificates etcd accepts.
    pub ca: PathBuf,
    /// etcd's certificate.
    pub cert: PathBuf,
    /// etcd's private key.
    pub key: PathBuf,
}

impl Etcd {
    /// Starts an etcd, or returns `None` (saying so) if it is not installed.
    pub fn start() -> Option<Etcd> {
        Self::start_with(&[])
    }

    /// Starts an etcd with extra command-line options.
    pub fn start_with(extra: &[&str]) -> Option<Etcd> {
        Self::start_secured(extra, None)
    }

    /// Starts an etcd with extra command-line options and, if given, TLS.
    pub fn start_secured(extra: &[&str], tls: Option<ServerTls>) -> Option<Etcd> {
        if !testreq::program(&testreq::this_test(), "etcd") {
            return None;
        }
        static N: AtomicUsize = AtomicUsize::new(0);
        let name = format!(
            "protego-etcd-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        );
        let dir = std::env::temp_dir().join(&name);
        std::fs::create_dir_all(&dir).unwrap();
        // The ports are picked before any is released, so they differ.
        let (client, peer, metrics) = (free_port(), free_port(), free_port());
        let client_port = client.local_addr().unwrap().port();
        let mut etcd = Etcd {
            child: None,
            name,
            client_port,
            peer_port: peer.local_addr().unwrap().port(),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            health_port: match tls {
                Some(_) => metrics.local_addr().unwrap().port(),
                None => client_port,
            },
            tls,
        };
        drop((client, peer, metrics));
        etcd.launch();
        Some(etcd)
    }

    /// The client URL, `http://` or (with TLS) `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("etcd is not running").id()
    }

    /// Starts the process (on the same ports and data directory as before) and waits until it
    /// answers.
    pub fn launch(&mut self) {
        assert!(self.child.is_none());
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("etcd.log"))
            .unwrap();
        let client = self.url();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let program = testreq::find("etcd").expect("etcd was found when the test started");
        let mut command = Command::new(program);
        command
            .arg("--name")
            .arg(&self.name)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("{}={peer}", self.name)])
            .args(["--initial-cluster-state", "new"])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra);
        if let Some(tls) = &self.tls {
            command
                .arg("--trusted-ca-file")
                .arg(&tls.ca)
                .arg("--cert-file")
                .arg(&tls.cert)
                .arg("--key-file")
                .arg(&tls.key)
                .arg("--client-cert-auth")
                .arg("--listen-metrics-urls")
                .arg(format!("http://127.0.0.1:{}", self.health_port));
        }
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe. It kills etcd if this test's thread dies without
        // dropping the guard (e.g. the test binary is killed).
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(command.spawn().unwrap());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!("etcd exited with {status}: {}", self.log());
            }
            if self.healthy() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether etcd answers its health check (which needs a leader).
    fn healthy(&self) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.health_port));
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let mut answer = String::new();
        stream
            .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_ok()
            && stream.read_to_string(&mut answer).is_ok()
            && answer.contains("\"health\":\"true\"")
    }

    /// etcd's log; when it is empty, the free space where etcd writes, since a full disk is what
    /// stops etcd before it can log anything.
    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default();
        if !log.is_empty() {
            return log;
        }
        let path = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statvfs only writes the struct it is given; the path is NUL-terminated.
        let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
        match unsafe { libc::statvfs(path.as_ptr(), &mut fs) } {
            0 => format!(
                "etcd logged nothing; {} MiB free in {}",
                (fs.f_bavail as u64 * fs.f_frsize as u64) >> 20,
                self.dir.display()
            ),
            _ => format!("etcd logged nothing; {} is unreadable", self.dir.display()),
        }
    }

    /// Kills the process (SIGKILL: a crash; etcd has fsync'd what it acknowledged).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and starts it again, on the same ports and data directory.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Sends a signal to the process (SIGSTOP to freeze it, SIGCONT to resume it).
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.pid()).unwrap();
        // SAFETY: kill has no memory effects; the PID is our child's, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A listener on a free loopback port (the port stays taken while it lives).
pub fn free_port() -> TcpListener {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// A plain etcd client, to look at and tamper with what the store wrote.
pub struct Raw {
    /// The runtime its requests run on.
    pub runtime: tokio::runtime::Runtime,
    /// The client (clone it to make a request).
    pub client: etcd_client::Client,
}

impl Raw {
    /// Connects to `etcd` (plain `http://`).
    pub fn new(etcd: &Etcd) -> Raw {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(etcd_client::Client::connect([etcd.url()], None))
            .unwrap();
        Raw { runtime, client }
    }

    /// Puts `value` under `key`.
    pub fn put(&self, key: &str, value: &[u8]) {
        let mut client = self.client.clone();
        self.runtime.block_on(client.put(key, value, None)).unwrap();
    }

    /// Deletes `key`.
    pub fn delete(&self, key: &str) {
        let mut client = self.client.clone();
        self.runtime.block_on(client.delete(key, None)).unwrap();
    }

    /// Every key and value under `prefix`, in key order.
    pub fn dump(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let mut client = self.client.clone();
        let options = etcd_client::GetOptions::new().with_prefix();
        let response = self
            .runtime
            .block_on(client.get(prefix, Some(options)))
            .unwrap();
        response
            .kvs()
            .iter()
            .map(|kv| (kv.key_str().unwrap().to_owned(), kv.value().to_vec()))
            .collect()
    }
}

/// A change that stores `bytes` as the snapshot of the IKE SA with SPI `spi`.
pub fn put(spi: u64, bytes: &[u8]) -> Change {
    Change::PutIkeSa {
        spi,
        snapshot: Zeroizing::new(bytes.to_vec()),
    }
}

/// The Protego cluster's prefix, the only one the `protego` user may touch.
pub const PREFIX: &str = "/protego/t";
/// The request timeout of the stores connecting to it.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// The password of etcd's `root` user.
pub const ROOT_PASSWORD: &str = "root-secret";
/// The password of the `protego` user.
pub const PASSWORD: &str = "protego-secret";

/// A secured etcd and its PKI: a CA, etcd's certificate for 127.0.0.1, and client
/// certificates `node` (for Protego) and `admin`, none named like an etcd user.
pub struct Secured {
    /// The etcd server.
    pub etcd: Etcd,
    /// The PKI's directory (`ca.pem`, `<name>.pem`, `<name>.key`), removed on drop.
    pub dir: PathBuf,
}

impl Drop for Secured {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Secured {
    /// Starts etcd with TLS and `extra` options, and turns authentication on with a `root`
    /// user and the `protego` user and role (read and write under `/protego/t/`), using the
    /// etcd client's auth API. Puts `/outside` first, a key the user must not read.
    pub fn start(extra: &[&str]) -> Option<Secured> {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "protego-etcd-tls-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let ca = certs::generate_ca(&dir, "etcd test CA").unwrap();
        let loopback = [SubjectAltName::Ip(IpAddr::V4(Ipv4Addr::LOCALHOST))];
        let server = certs::issue(&dir, &ca, "etcd", NodeRole::Control, &loopback).unwrap();
        for client in ["node", "admin"] {
            certs::issue(&dir, &ca, client, NodeRole::Control, &[]).unwrap();
        }
        let tls = ServerTls {
            ca: ca.cert_path(),
            cert: server.cert_path,
            key: server.key_path,
        };
        let Some(etcd) = Etcd::start_secured(extra, Some(tls)) else {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        };
        let secured = Secured { etcd, dir };
        let admin = secured.access(Some("admin"), None);
        let (runtime, mut client) = secured.raw(&admin).expect("the admin connects");
        runtime.block_on(async {
            client
                .put("/outside", "not for protego", None)
                .await
                .unwrap();
            client.user_add("root", ROOT_PASSWORD, None).await.unwrap();
            client.user_grant_role("root", "root").await.unwrap();
            client.role_add("protego").await.unwrap();
            let scope = Permission::read_write(format!("{PREFIX}/")).with_prefix();
            client
                .role_grant_permission("protego", scope)
                .await
                .unwrap();
            client.user_add("protego", PASSWORD, None).await.unwrap();
            client.user_grant_role("protego", "protego").await.unwrap();
            client.auth_enable().await.unwrap();
        });
        Some(secured)
    }

    /// TLS with client certificate `cert` (none if `None`) and etcd user `user`.
    pub fn access(&self, cert: Option<&str>, user: Option<(&str, &str)>) -> EtcdAccess {
        let ca = self.dir.join("ca.pem");
        let identity = cert.map(|c| {
            (
                self.dir.join(format!("{c}.pem")),
                self.dir.join(format!("{c}.key")),
            )
        });
        let identity = identity.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        EtcdAccess {
            tls: Some(certs::load_client_tls(&ca, identity).unwrap()),
            user: user.map(|(name, password)| EtcdUser {
                name: name.into(),
                password: Zeroizing::new(password.into()),
            }),
        }
    }

    /// The store's options for `prefix` on this etcd, with `access`.
    pub fn options(&self, prefix: &str, access: EtcdAccess) -> EtcdOptions {
        EtcdOptions {
            endpoints: vec![self.etcd.url()],
            prefix: prefix.into(),
            timeout: TIMEOUT,
            connect_timeout: TIMEOUT,
            access,
        }
    }

    /// A plain etcd client with `access`, on a runtime of its own.
    pub fn raw(
        &self,
        access: &EtcdAccess,
    ) -> Result<(tokio::runtime::Runtime, Client), etcd_client::Error> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let options = access.connect_options(TIMEOUT);
        let client = runtime.block_on(async {
            tokio::time::timeout(TIMEOUT, Client::connect([self.etcd.url()], Some(options)))
                .await
                .unwrap_or_else(|_| panic!("connecting took over {TIMEOUT:?}"))
        })?;
        Ok((runtime, client))
    }

    /// Reads `key` with `access`: the value, or the error (connecting or reading).
    pub fn read(&self, access: &EtcdAccess, key: &str) -> Result<Option<Vec<u8>>, String> {
        let (runtime, mut client) = self.raw(access).map_err(|e| e.to_string())?;
        runtime
            .block_on(async {
                tokio::time::timeout(TIMEOUT, client.get(key, None))
                    .await
                    .map_err(|_| "no answer".to_owned())?
                    .map_err(|e| e.to_string())
            })
            .map(|r| r.kvs().first().map(|kv| kv.value().to_vec()))
    }
}
