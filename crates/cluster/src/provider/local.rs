//! The `local` node provider: data nodes as `protego data -c FILE` processes on the control
//! node's host, each optionally in its own network namespace (`ip netns exec NAME`).
//!
//! Each configured node is known by the `[node] name` of its data node file. Starting it
//! runs `[ip netns exec NETNS] COMMAND data -c FILE` (COMMAND: `command`, or the running
//! `protego`) in a session of its own, with stdin from `/dev/null` and the control node's
//! environment, so that signals sent to the control node's process group never reach it and
//! it keeps running when the control node exits.
//!
//! Files in `run_dir` (created with mode 0700 if missing), per node:
//!
//! - `NAME.pid`: `PID STARTTIME` and a newline, while the provider believes the node runs
//!   (see [`pid_file`]). STARTTIME is field 22 of `/proc/PID/stat` (clock ticks after boot),
//!   so a PID the kernel has reused for another process is never taken for the node. The
//!   file is replaced atomically and removed once the node is gone.
//! - `NAME.log`: the node's standard output and error, appended across runs (see
//!   [`log_file`]).
//!
//! **Adoption.** Data nodes outlive the control node: dropping a [`LocalProvider`] stops
//! nothing. A new provider on the same `run_dir` (the next active control node) reads the pid
//! files: a node whose process still runs with the recorded start time is reported
//! [`ProvidedState::Running`] with `started_at: None`, and can be stopped like any other; a
//! stale pid file is removed and the node is [`ProvidedState::Stopped`].
//!
//! **Stopping.** `stop` sends SIGTERM and reports the node [`ProvidedState::Stopping`]; if it
//! has not exited `stop_timeout` later, the next `nodes` sends SIGKILL. Signals are sent only
//! while the PID still has the recorded start time. A node that exits while stopping is
//! `Stopped`; one that exits on its own is [`ProvidedState::Failed`] (with its exit status,
//! or "no longer running" for an adopted node) until it is started again.
//!
//! **Use.** In the control node's configuration (paths relative to that file):
//!
//! ```toml
//! [cluster.autoscale]
//! mode = "act"
//!
//! [cluster.autoscale.local]
//! run_dir = "/run/protego/nodes"       # pid files and logs
//! # command = "/usr/local/bin/protego"  # default: the running protego
//! stop_timeout = "10s"                 # SIGTERM, then SIGKILL after this
//!
//! [[cluster.autoscale.local.node]]
//! config = "data3.toml"                # its [node] name is the node's name
//! netns = "dn3"                        # optional: ip netns exec dn3 ...
//! ```
//!
//! An operator finds a node's PID in `run_dir/NAME.pid` and its output in
//! `run_dir/NAME.log`. To stop every data node for good, stop the control node (or set the
//! autoscaler to advise) first, then send SIGTERM to the PIDs in the pid files.

use super::{NodeProvider, ProvidedNode, ProvidedState, ProviderError};
use crate::node_config::NodeConfig;
use control::config::LocalProviderConfig;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// The pid file of node `name` in `run_dir`: `run_dir/NAME.pid`, holding `PID STARTTIME`
/// and a newline while the node runs, where STARTTIME is field 22 of `/proc/PID/stat`
/// (the process's start time in clock ticks after boot).
pub fn pid_file(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.pid"))
}

/// The log file of node `name` in `run_dir`: `run_dir/NAME.log`, the node's standard output
/// and error, appended across runs.
pub fn log_file(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.log"))
}

/// Runs data nodes as `protego data` processes on this host (see the module documentation).
///
/// Dropping it stops nothing: the data nodes outlive the control node, and a new provider on
/// the same `run_dir` adopts them.
pub struct LocalProvider {
    command: PathBuf,
    run_dir: PathBuf,
    stop_timeout: Duration,
    state: Mutex<State>,
}

struct State {
    /// In configuration order.
    nodes: Vec<Node>,
    /// Children killed because their start could not be completed, reaped by `nodes`.
    orphans: Vec<Child>,
}

struct Node {
    name: String,
    config: PathBuf,
    netns: Option<String>,
    run: Run,
}

enum Run {
    Stopped,
    Failed(String),
    Running {
        process: Process,
        started_at: Option<Instant>,
    },
    Stopping {
        process: Process,
        since: Instant,
        killed: bool,
    },
}

impl Run {
    fn provided(&self) -> ProvidedState {
        match self {
            Run::Stopped => ProvidedState::Stopped,
            Run::Failed(reason) => ProvidedState::Failed {
                reason: reason.clone(),
            },
            Run::Running { started_at, .. } => ProvidedState::Running {
                started_at: *started_at,
            },
            Run::Stopping { .. } => ProvidedState::Stopping,
        }
    }
}

/// A data node's process: started by this provider (`child`) or adopted.
struct Process {
    pid: libc::pid_t,
    start_time: u64,
    child: Option<Child>,
}

/// How a process ended.
enum Exit {
    Status(ExitStatus),
    Gone,
}

impl Process {
    /// Whether it has ended, without blocking (reaps it if it is this provider's child).
    fn poll(&mut self) -> Option<Exit> {
        if let Some(child) = &mut self.child {
            match child.try_wait() {
                Ok(Some(status)) => return Some(Exit::Status(status)),
                Ok(None) => return None,
                // Reaped elsewhere (e.g. SIGCHLD ignored): look at /proc instead.
                Err(_) => {}
            }
        }
        if is_running(self.pid, self.start_time) {
            None
        } else {
            Some(Exit::Gone)
        }
    }

    /// Sends `signal` if the PID is still this process; `Ok(false)` if it is gone.
    fn signal(&self, signal: libc::c_int) -> io::Result<bool> {
        // Never 0 or negative: those would signal process groups.
        if self.pid <= 0 {
            return Ok(false);
        }
        match proc_stat(self.pid) {
            Some(stat) if stat.start_time == self.start_time => {}
            _ => return Ok(false),
        }
        // SAFETY: kill has no memory-safety preconditions.
        if unsafe { libc::kill(self.pid, signal) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(false)
        } else {
            Err(e)
        }
    }
}

/// What this provider reads from `/proc/PID/stat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ProcStat {
    /// Field 3 (`R`, `S`, `Z`, …).
    state: char,
    /// Field 22, clock ticks after boot.
    start_time: u64,
}

/// Parses a `/proc/PID/stat` line. The command name (field 2) is in parentheses and may
/// itself contain spaces and parentheses, so the fields are counted after the last `)`.
fn parse_stat(text: &str) -> Option<ProcStat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 21 lie between the state (3) and the start time (22).
    let start_time = fields.nth(22 - 4)?.parse().ok()?;
    Some(ProcStat { state, start_time })
}

fn proc_stat(pid: libc::pid_t) -> Option<ProcStat> {
    if pid <= 0 {
        return None;
    }
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Whether `pid` is a live (not zombie) process that started at `start_time`.
fn is_running(pid: libc::pid_t, start_time: u64) -> bool {
    proc_stat(pid).is_some_and(|s| s.start_time == start_time && !matches!(s.state, 'Z' | 'X'))
}

/// Parses a pid file's `PID STARTTIME`.
fn parse_pid_file(text: &str) -> Option<(libc::pid_t, u64)> {
    let mut fields = text.split_whitespace();
    let pid: libc::pid_t = fields.next()?.parse().ok()?;
    let start_time = fields.next()?.parse().ok()?;
    (pid > 0 && fields.next().is_none()).then_some((pid, start_time))
}

/// Writes `name`'s pid file through a temporary file and a rename.
fn write_pid_file(run_dir: &Path, name: &str, pid: libc::pid_t, start_time: u64) -> io::Result<()> {
    let tmp = run_dir.join(format!(".{name}.pid.tmp"));
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(&tmp)?;
    file.write_all(format!("{pid} {start_time}\n").as_bytes())?;
    drop(file);
    fs::rename(&tmp, pid_file(run_dir, name))
}

/// Removes `name`'s pid file if it still names this process (not a later one's).
fn remove_pid_file(run_dir: &Path, name: &str, pid: libc::pid_t, start_time: u64) {
    let path = pid_file(run_dir, name);
    match fs::read_to_string(&path) {
        Ok(text) if parse_pid_file(&text) == Some((pid, start_time)) => {
            if let Err(e) = fs::remove_file(&path) {
                warn!(node = %name, file = %path.display(), error = %e, "cannot remove the pid file");
            }
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            warn!(node = %name, file = %path.display(), error = %e, "cannot read the pid file")
        }
    }
}

/// Finds `program` in the directories of `PATH`.
fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Reads `name`'s pid file: the node's process if it still runs; removes a stale file.
fn adopt(run_dir: &Path, name: &str) -> Result<Run, ProviderError> {
    let path = pid_file(run_dir, name);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Run::Stopped),
        Err(e) => {
            return Err(ProviderError::Config(format!(
                "cannot read the pid file {}: {e}",
                path.display()
            )))
        }
    };
    if let Some((pid, start_time)) = parse_pid_file(&text) {
        if is_running(pid, start_time) {
            info!(node = %name, pid, "adopted running data node");
            return Ok(Run::Running {
                process: Process {
                    pid,
                    start_time,
                    child: None,
                },
                started_at: None,
            });
        }
    }
    info!(node = %name, file = %path.display(), "removing stale pid file: the data node is not running");
    if let Err(e) = fs::remove_file(&path) {
        warn!(node = %name, file = %path.display(), error = %e, "cannot remove the stale pid file");
    }
    Ok(Run::Stopped)
}

impl LocalProvider {
    /// Loads the data node files of `config` for their names, creates `run_dir` if needed
    /// and adopts the nodes that already run (see the module documentation).
    ///
    /// A node file that cannot be loaded, has no `[data]` section or repeats another's name
    /// is a [`ProviderError::Config`] naming the file.
    pub fn new(config: &LocalProviderConfig) -> Result<Self, ProviderError> {
        let command = match &config.command {
            Some(command) => command.clone(),
            None => std::env::current_exe().map_err(|e| {
                ProviderError::Config(format!(
                    "cannot find the running protego executable (set command): {e}"
                ))
            })?,
        };
        let mut nodes: Vec<Node> = Vec::with_capacity(config.nodes.len());
        for n in &config.nodes {
            let file = NodeConfig::load(&n.config)
                .map_err(|e| ProviderError::Config(format!("data node file: {e}")))?;
            if file.data.is_none() {
                return Err(ProviderError::Config(format!(
                    "{}: has no [data] section (the local provider runs data nodes only)",
                    n.config.display()
                )));
            }
            if let Some(other) = nodes.iter().find(|o| o.name == file.node.name) {
                return Err(ProviderError::Config(format!(
                    "{}: node name {:?} is also the name in {}",
                    n.config.display(),
                    file.node.name,
                    other.config.display()
                )));
            }
            nodes.push(Node {
                name: file.node.name,
                config: n.config.clone(),
                netns: n.netns.clone(),
                run: Run::Stopped,
            });
        }
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&config.run_dir)
            .map_err(|e| {
                ProviderError::Config(format!(
                    "cannot create run_dir {}: {e}",
                    config.run_dir.display()
                ))
            })?;
        for node in &mut nodes {
            node.run = adopt(&config.run_dir, &node.name)?;
        }
        Ok(Self {
            command,
            run_dir: config.run_dir.clone(),
            stop_timeout: config.stop_timeout,
            state: Mutex::new(State {
                nodes,
                orphans: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Brings `node`'s state up to date: reaps an exited process, escalates a stop.
    fn refresh(&self, node: &mut Node, now: Instant) {
        node.run = match std::mem::replace(&mut node.run, Run::Stopped) {
            Run::Running {
                mut process,
                started_at,
            } => match process.poll() {
                None => Run::Running {
                    process,
                    started_at,
                },
                Some(exit) => {
                    let what = match exit {
                        Exit::Status(status) => describe(status),
                        Exit::Gone => "no longer running".to_owned(),
                    };
                    let log = log_file(&self.run_dir, &node.name);
                    let reason = format!("{what} (its output is in {})", log.display());
                    warn!(node = %node.name, pid = process.pid, reason = %what, "data node exited");
                    remove_pid_file(&self.run_dir, &node.name, process.pid, process.start_time);
                    Run::Failed(reason)
                }
            },
            Run::Stopping {
                mut process,
                since,
                mut killed,
            } => match process.poll() {
                Some(_) => {
                    info!(node = %node.name, pid = process.pid, "data node stopped");
                    remove_pid_file(&self.run_dir, &node.name, process.pid, process.start_time);
                    Run::Stopped
                }
                None => {
                    if !killed && now.saturating_duration_since(since) >= self.stop_timeout {
                        killed = true;
                        match process.signal(libc::SIGKILL) {
                            Ok(_) => warn!(
                                node = %node.name,
                                pid = process.pid,
                                timeout = ?self.stop_timeout,
                                "data node did not exit after SIGTERM; sent SIGKILL"
                            ),
                            Err(e) => warn!(
                                node = %node.name,
                                pid = process.pid,
                                error = %e,
                                "data node did not exit after SIGTERM and cannot be killed"
                            ),
                        }
                    }
                    Run::Stopping {
                        process,
                        since,
                        killed,
                    }
                }
            },
            other => other,
        };
    }

    /// Runs `node`'s process and writes its pid file.
    fn spawn(&self, node: &Node, orphans: &mut Vec<Child>) -> Result<Process, ProviderError> {
        let failed = |reason: String| ProviderError::Failed {
            action: "start",
            node: node.name.clone(),
            reason,
        };
        let log_path = log_file(&self.run_dir, &node.name);
        let stdout = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&log_path)
            .map_err(|e| failed(format!("cannot open its log {}: {e}", log_path.display())))?;
        let stderr = stdout
            .try_clone()
            .map_err(|e| failed(format!("cannot open its log {}: {e}", log_path.display())))?;
        let mut command = match &node.netns {
            Some(netns) => {
                let ip = find_on_path("ip").ok_or_else(|| {
                    failed(format!(
                        "`ip` (iproute2) is not on PATH; it is needed to run in network namespace {netns:?}"
                    ))
                })?;
                let mut c = Command::new(ip);
                // `ip netns exec` execs the command, so the PID is the data node's.
                c.args(["netns", "exec", netns.as_str()]).arg(&self.command);
                c
            }
            None => Command::new(&self.command),
        };
        command
            .arg("data")
            .arg("-c")
            .arg(&node.config)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr);
        // SAFETY: the closure runs in the forked child before exec and only calls setsid,
        // which is async-signal-safe; it allocates nothing and touches no locks.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() == -1 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().map_err(|e| {
            let program = if node.netns.is_some() {
                Path::new("ip")
            } else {
                self.command.as_path()
            };
            failed(format!("cannot run {}: {e}", program.display()))
        })?;
        let Ok(pid) = libc::pid_t::try_from(child.id()) else {
            let reason = format!("PID {} is out of range", child.id());
            abandon(child, orphans);
            return Err(failed(reason));
        };
        // The child is not reaped yet, so its /proc entry exists even if it already exited.
        let Some(stat) = proc_stat(pid) else {
            abandon(child, orphans);
            return Err(failed(format!("cannot read /proc/{pid}/stat")));
        };
        if let Err(e) = write_pid_file(&self.run_dir, &node.name, pid, stat.start_time) {
            abandon(child, orphans);
            return Err(failed(format!(
                "cannot write its pid file {} (the process was killed): {e}",
                pid_file(&self.run_dir, &node.name).display()
            )));
        }
        info!(
            node = %node.name,
            pid,
            netns = node.netns.as_deref().unwrap_or("-"),
            log = %log_path.display(),
            "started data node"
        );
        Ok(Process {
            pid,
            start_time: stat.start_time,
            child: Some(child),
        })
    }
}

/// Kills a child whose start could not be completed; `nodes` reaps it later.
fn abandon(mut child: Child, orphans: &mut Vec<Child>) {
    let _ = child.kill();
    if let Ok(None) = child.try_wait() {
        orphans.push(child);
    }
}

/// "exited with status N" or "killed by signal N".
fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => format!("exited ({status})"),
    }
}

impl NodeProvider for LocalProvider {
    fn kind(&self) -> &'static str {
        "local"
    }

    /// Every configured node in configuration order. Reaps exited processes and sends
    /// SIGKILL to nodes still running `stop_timeout` after SIGTERM; never waits.
    fn nodes(&self) -> Vec<ProvidedNode> {
        let mut state = self.lock();
        let State { nodes, orphans } = &mut *state;
        orphans.retain_mut(|child| matches!(child.try_wait(), Ok(None)));
        let now = Instant::now();
        nodes
            .iter_mut()
            .map(|node| {
                self.refresh(node, now);
                ProvidedNode {
                    name: node.name.clone(),
                    state: node.run.provided(),
                }
            })
            .collect()
    }

    /// Runs the node unless it runs already (then nothing changes). A node that is still
    /// stopping is not started: the call fails with "still stopping", and the autoscaler's
    /// next attempt after the process has exited starts it. Nothing is queued, so a start
    /// never outlives the autoscaler's wish.
    fn start(&self, name: &str) -> Result<(), ProviderError> {
        let mut state = self.lock();
        let State { nodes, orphans } = &mut *state;
        let node = nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| ProviderError::UnknownNode(name.to_owned()))?;
        let now = Instant::now();
        self.refresh(node, now);
        match &node.run {
            Run::Running { .. } => Ok(()),
            Run::Stopping { since, .. } => Err(ProviderError::Failed {
                action: "start",
                node: node.name.clone(),
                reason: format!(
                    "it is still stopping (SIGTERM sent {:.1?} ago); it can start once it has exited",
                    now.saturating_duration_since(*since)
                ),
            }),
            Run::Stopped | Run::Failed(_) => match self.spawn(node, orphans) {
                Ok(process) => {
                    node.run = Run::Running {
                        process,
                        started_at: Some(now),
                    };
                    Ok(())
                }
                Err(e) => {
                    if let ProviderError::Failed { reason, .. } = &e {
                        node.run = Run::Failed(reason.clone());
                    }
                    Err(e)
                }
            },
        }
    }

    /// Sends SIGTERM to a running node (the node is then stopping; `nodes` escalates to
    /// SIGKILL after `stop_timeout`). A node that is not running is left as it is.
    fn stop(&self, name: &str) -> Result<(), ProviderError> {
        let mut state = self.lock();
        let node = state
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .ok_or_else(|| ProviderError::UnknownNode(name.to_owned()))?;
        let now = Instant::now();
        self.refresh(node, now);
        match std::mem::replace(&mut node.run, Run::Stopped) {
            Run::Running {
                process,
                started_at,
            } => match process.signal(libc::SIGTERM) {
                Ok(_) => {
                    info!(node = %node.name, pid = process.pid, "stopping data node (SIGTERM)");
                    node.run = Run::Stopping {
                        process,
                        since: now,
                        killed: false,
                    };
                    Ok(())
                }
                Err(e) => {
                    let pid = process.pid;
                    node.run = Run::Running {
                        process,
                        started_at,
                    };
                    Err(ProviderError::Failed {
                        action: "stop",
                        node: node.name.clone(),
                        reason: format!("cannot send SIGTERM to PID {pid}: {e}"),
                    })
                }
            },
            other => {
                node.run = other;
                Ok(())
            }
        }
    }
}

#[cfg(test)]
#[path = "local_tests.rs"]
mod tests;
