//! etcd 3.4 (Debian `etcd-server`) as the distributed store of a test: a
//! single-member cluster inside a namespace, data in the run directory.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::bed::Process;
use crate::cmd::{program_exists, Cmd};
use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::wait::{wait_for, Probe};

/// A running single-member etcd.
#[derive(Clone, Debug)]
pub struct Etcd {
    /// The etcd process.
    pub process: Process,
    /// The client endpoint (`http://<addr>:<port>`).
    pub client_url: String,
    /// The client address.
    pub client_addr: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
}

impl Etcd {
    /// Starts etcd in `ns` listening for clients on `addr:client_port` (peers on
    /// `client_port + 1`) and waits until the client port accepts connections.
    /// `name` must be unique within the test bed (`[a-z0-9-]`).
    pub fn start(ns: &Netns, name: &str, addr: IpAddr, client_port: u16) -> Result<Etcd> {
        if !program_exists("etcd") {
            return Err(Error::MissingProgram {
                program: "etcd".to_owned(),
            });
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
        let client_url = format!("http://{host}:{client_port}");
        let peer_url = format!("http://{host}:{peer_port}");
        let data_dir = ns.run_dir().join(format!("etcd-{name}"));
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
                // zap logs "serving client traffic ...", capnslog "ready to serve client requests".
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
        })
    }
}
