//! The test-bed guard: owns everything a run creates (network namespaces,
//! interfaces in the root namespace, background processes, the temp directory)
//! and removes it on drop, on panic and on request from a signal handler.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once};
use std::thread;
use std::time::{Duration, Instant};

use crate::cmd::{describe_status, program_exists, Cmd};
use crate::error::{Error, Result};
use crate::names::RunId;
use crate::netns::Netns;
use crate::sweep;

/// Environment variable: when set (to anything but `0`), the run directory with
/// all logs, configs and captures is kept after teardown.
pub const KEEP_ENV: &str = "PROTEGO_TESTBED_KEEP";

/// How long a stopped process gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Programs every test bed needs.
const REQUIRED_PROGRAMS: &[&str] = &["ip", "unshare", "sysctl"];

static FIRST_SWEEP: Once = Once::new();

/// One test-bed instance. Everything created through it is torn down when it is
/// dropped (also while a test panics), or by [`CleanupHandle::cleanup`].
pub struct Testbed {
    inner: Arc<Inner>,
}

/// A handle that tears a test bed down from elsewhere, e.g. a Ctrl-C handler.
/// After cleanup, creating new resources through the test bed fails with
/// [`Error::TornDown`] and removes the new resource again.
#[derive(Clone)]
pub struct CleanupHandle {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    run: RunId,
    dir: PathBuf,
    state: Mutex<State>,
    /// Held for the whole of a cleanup, so that a second caller (e.g. `Drop`
    /// racing a Ctrl-C handler) returns only once everything is gone.
    cleanup_lock: Mutex<()>,
    keep: AtomicBool,
    next_id: AtomicU64,
    next_if: AtomicU32,
}

#[derive(Default)]
struct State {
    closed: bool,
    resources: Vec<Resource>,
    log_names: HashSet<String>,
}

enum Resource {
    Process(ProcRecord),
    Netns(String),
    RootLink(String),
}

struct ProcRecord {
    id: u64,
    pid: u32,
    label: String,
    log: PathBuf,
    child: Child,
}

/// A background process started by the test bed, with its output in a log file.
/// It is stopped (SIGTERM, then SIGKILL) at teardown unless stopped earlier.
#[derive(Clone)]
pub struct Process {
    inner: Arc<Inner>,
    id: u64,
    pid: u32,
    label: String,
    log: PathBuf,
}

impl Testbed {
    /// Creates a test bed: checks for root and the basic tools, sweeps leftovers
    /// of dead earlier runs, and creates the run directory
    /// `$TMPDIR/protego-testbed/<tag>`.
    pub fn new() -> Result<Testbed> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if euid != 0 {
            return Err(Error::NotRoot { euid });
        }
        for program in REQUIRED_PROGRAMS {
            if !program_exists(program) {
                return Err(Error::MissingProgram {
                    program: (*program).to_owned(),
                });
            }
        }
        // The first test bed of a process also removes names carrying its own pid:
        // they can only be leftovers of an earlier process that had the same pid.
        // Concurrent callers (parallel test threads) block in call_once until
        // that sweep is over, so it can never remove a sibling's fresh names.
        let mut first = false;
        FIRST_SWEEP.call_once(|| {
            first = true;
            sweep::sweep_stale(true);
        });
        if !first {
            sweep::sweep_stale(false);
        }

        let run = RunId::next();
        let dir = base_dir().join(run.tag());
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(|e| Error::io("remove stale directory", &dir, e))?;
        }
        fs::create_dir_all(dir.join("logs")).map_err(|e| Error::io("create directory", &dir, e))?;
        Ok(Testbed {
            inner: Arc::new(Inner {
                run,
                dir,
                state: Mutex::new(State::default()),
                cleanup_lock: Mutex::new(()),
                keep: AtomicBool::new(std::env::var(KEEP_ENV).is_ok_and(|v| v != "0")),
                next_id: AtomicU64::new(1),
                next_if: AtomicU32::new(0),
            }),
        })
    }

    /// The run id all names of this test bed derive from.
    pub fn run_id(&self) -> RunId {
        self.inner.run
    }

    /// The run directory (configs, logs under `logs/`, captures).
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// A unique interface name of this run (`<tag><suffix>`, at most 15 characters).
    pub fn ifname(&self, suffix: &str) -> Result<String> {
        self.inner.run.ifname(suffix)
    }

    /// Whether teardown keeps the run directory (logs, configs, captures);
    /// defaults to whether [`KEEP_ENV`] is set.
    pub fn keep_files(&self, keep: bool) {
        self.inner.keep.store(keep, Ordering::Relaxed);
    }

    /// A fresh interface name of this run (`<tag><kind><counter>`).
    pub fn fresh_ifname(&self, kind: char) -> Result<String> {
        self.inner.fresh_ifname(kind)
    }

    /// Creates a network namespace `<tag>-<role>` with loopback up, IPv6
    /// duplicate-address detection off (addresses are usable at once) and
    /// forwarding off.
    pub fn netns(&self, role: &str) -> Result<Netns> {
        let name = self.inner.run.netns_name(role)?;
        Cmd::new("ip").args(["netns", "add", &name]).run()?;
        self.inner.register(Resource::Netns(name.clone()), &name)?;
        let ns = Netns::new(name, Arc::clone(&self.inner));
        ns.sysctl("net.ipv6.conf.all.accept_dad", "0")?;
        ns.sysctl("net.ipv6.conf.default.accept_dad", "0")?;
        ns.ip(["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// Registers an interface created in the root namespace so that teardown
    /// deletes it (the test bed itself creates interfaces only inside namespaces).
    pub fn adopt_root_link(&self, name: &str) -> Result<()> {
        self.inner
            .register(Resource::RootLink(name.to_owned()), name)
    }

    /// Starts `cmd` in the background with stdout and stderr going to
    /// `logs/<label>.log`; it is stopped at teardown.
    pub fn spawn(&self, label: &str, cmd: &Cmd) -> Result<Process> {
        spawn_process(&self.inner, label, cmd)
    }

    /// A handle that can tear this test bed down from another thread.
    pub fn cleanup_handle(&self) -> CleanupHandle {
        CleanupHandle {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Tears everything down now and reports what could not be removed.
    pub fn teardown(self) -> Result<()> {
        let problems = self.inner.cleanup();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::Teardown {
                run: self.inner.run.tag(),
                problems: problems.join("; "),
            })
        }
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        for p in self.inner.cleanup() {
            eprintln!("testbed {}: teardown: {p}", self.inner.run);
        }
    }
}

impl CleanupHandle {
    /// Stops every process, deletes every namespace and interface, removes the
    /// run directory; returns what could not be removed. Idempotent.
    pub fn cleanup(&self) -> Vec<String> {
        self.inner.cleanup()
    }
}

impl Inner {
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn fresh_ifname(&self, kind: char) -> Result<String> {
        let n = self.next_if.fetch_add(1, Ordering::Relaxed);
        self.run.ifname_numbered(kind, n)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the registry consistent (every
        // operation is a single push/remove), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, resource: Resource, what: &str) -> Result<()> {
        let mut state = self.lock();
        if state.closed {
            drop(state);
            let mut late = vec![resource];
            let problems = teardown_resources(&mut late);
            for p in problems {
                eprintln!("testbed {}: {p}", self.run);
            }
            return Err(Error::TornDown {
                run: self.run.tag(),
                what: what.to_owned(),
            });
        }
        state.resources.push(resource);
        Ok(())
    }

    /// Allocates a unique log file path for `label`.
    fn log_path(&self, label: &str) -> PathBuf {
        let mut state = self.lock();
        let mut name = sanitize_label(label);
        let base = name.clone();
        let mut n = 1;
        while !state.log_names.insert(name.clone()) {
            n += 1;
            name = format!("{base}-{n}");
        }
        self.dir.join("logs").join(format!("{name}.log"))
    }
    fn take_process(&self, id: u64) -> Option<ProcRecord> {
        let mut state = self.lock();
        let pos = state
            .resources
            .iter()
            .position(|r| matches!(r, Resource::Process(p) if p.id == id))?;
        match state.resources.remove(pos) {
            Resource::Process(p) => Some(p),
            _ => None,
        }
    }

    fn with_process<T>(&self, id: u64, f: impl FnOnce(&mut ProcRecord) -> T) -> Option<T> {
        let mut state = self.lock();
        let rec = state.resources.iter_mut().find_map(|r| match r {
            Resource::Process(p) if p.id == id => Some(p),
            _ => None,
        })?;
        Some(f(rec))
    }

    fn cleanup(&self) -> Vec<String> {
        let _serial = self.cleanup_lock.lock().unwrap_or_else(|e| e.into_inner());
        let (mut resources, first) = {
            let mut state = self.lock();
            let first = !state.closed;
            state.closed = true;
            (std::mem::take(&mut state.resources), first)
        };
        let panicking = thread::panicking();
        if panicking {
            dump_logs(self.run, &resources);
        }
        let mut problems = teardown_resources(&mut resources);
        if first {
            if self.keep.load(Ordering::Relaxed) {
                eprintln!(
                    "testbed {}: kept run directory {}",
                    self.run,
                    self.dir.display()
                );
            } else if let Err(e) = fs::remove_dir_all(&self.dir) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    problems.push(format!("remove {}: {e}", self.dir.display()));
                }
            }
        }
        problems
    }
}

/// Starts `cmd` in the background with its output in a log file and registers it.
pub(crate) fn spawn_process(inner: &Arc<Inner>, label: &str, cmd: &Cmd) -> Result<Process> {
    let log = inner.log_path(label);
    let file = File::create(&log).map_err(|e| Error::io("create log", &log, e))?;
    let file2 = file
        .try_clone()
        .map_err(|e| Error::io("duplicate log handle", &log, e))?;
    let mut command = cmd.to_command();
    command.stdout(Stdio::from(file)).stderr(Stdio::from(file2));
    let child = command.spawn().map_err(|source| Error::Spawn {
        command: cmd.display(),
        source,
    })?;
    let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
    let pid = child.id();
    inner.register(
        Resource::Process(ProcRecord {
            id,
            pid,
            label: label.to_owned(),
            log: log.clone(),
            child,
        }),
        label,
    )?;
    Ok(Process {
        inner: Arc::clone(inner),
        id,
        pid,
        label: label.to_owned(),
        log,
    })
}

/// Removes resources: processes first (all signalled at once), then namespaces
/// (killing anything still inside by pid), then root-namespace links.
fn teardown_resources(resources: &mut Vec<Resource>) -> Vec<String> {
    let mut problems = Vec::new();
    let mut procs = Vec::new();
    let mut namespaces = Vec::new();
    let mut links = Vec::new();
    for r in resources.drain(..).rev() {
        match r {
            Resource::Process(p) => procs.push(p),
            Resource::Netns(n) => namespaces.push(n),
            Resource::RootLink(l) => links.push(l),
        }
    }
    stop_processes(&mut procs, &mut problems);
    for ns in namespaces {
        kill_netns_pids(&ns);
        let out = Cmd::new("ip").args(["netns", "del", &ns]).output();
        match out {
            Ok(o) if o.success() => {}
            Ok(o) if o.stderr.contains("No such file") => {}
            Ok(o) => problems.push(format!("ip netns del {ns}: {}", o.stderr.trim())),
            Err(e) => problems.push(e.to_string()),
        }
    }
    for link in links {
        if let Ok(o) = Cmd::new("ip").args(["link", "del", &link]).output() {
            if !o.success() && !o.stderr.contains("Cannot find device") {
                problems.push(format!("ip link del {link}: {}", o.stderr.trim()));
            }
        }
    }
    problems
}

/// SIGTERM to all, wait up to [`STOP_GRACE`], SIGKILL the rest, reap all.
fn stop_processes(procs: &mut [ProcRecord], problems: &mut Vec<String>) {
    for p in procs.iter_mut() {
        if matches!(p.child.try_wait(), Ok(None)) {
            send_signal(p.pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    loop {
        let mut running = 0;
        for p in procs.iter_mut() {
            if matches!(p.child.try_wait(), Ok(None)) {
                running += 1;
            }
        }
        if running == 0 || Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    for p in procs.iter_mut() {
        if matches!(p.child.try_wait(), Ok(None)) {
            // Child::kill sends SIGKILL to this pid only.
            if let Err(e) = p.child.kill() {
                problems.push(format!("kill {} (pid {}): {e}", p.label, p.pid));
            }
            let _ = p.child.wait();
        }
    }
}

/// Kills, by pid, any process still living in namespace `ns` (it can only be
/// one we started there, or a child of one).
pub(crate) fn kill_netns_pids(ns: &str) {
    let Ok(out) = Cmd::new("ip").args(["netns", "pids", ns]).output() else {
        return;
    };
    let pids: Vec<i32> = out
        .stdout
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|&p| p > 1)
        .collect();
    for &pid in &pids {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    // Give the kernel a moment to release them so the namespace can go.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline
        && pids
            .iter()
            .any(|&p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(p))
    {
        thread::sleep(Duration::from_millis(10));
    }
}

fn is_zombie(pid: i32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn send_signal(pid: u32, sig: i32) {
    if let Ok(pid) = i32::try_from(pid) {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, sig) };
    }
}

fn dump_logs(run: RunId, resources: &[Resource]) {
    for r in resources {
        if let Resource::Process(p) = r {
            let tail = tail_file(&p.log, 40);
            if !tail.trim().is_empty() {
                eprintln!(
                    "---- testbed {run}: last lines of {} (pid {}, {}) ----\n{tail}",
                    p.label,
                    p.pid,
                    p.log.display()
                );
            }
        }
    }
}

/// The last `lines` lines of a file (reads at most the last 64 KiB).
pub(crate) fn tail_file(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

fn sanitize_label(label: &str) -> String {
    let s: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "process".to_owned()
    } else {
        s
    }
}

/// Directory under which every run keeps its files.
pub fn base_dir() -> PathBuf {
    std::env::temp_dir().join("protego-testbed")
}

impl Process {
    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The label it was started with.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Path of its log (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything it logged so far.
    pub fn log(&self) -> String {
        fs::read(&self.log)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_file(&self.log, lines)
    }

    /// Whether it is still running (false once stopped or exited).
    pub fn is_running(&self) -> bool {
        self.inner
            .with_process(self.id, |p| matches!(p.child.try_wait(), Ok(None)))
            .unwrap_or(false)
    }

    /// `Ok` while it runs; [`Error::ProcessExited`] with its log tail otherwise.
    pub fn check_running(&self) -> Result<()> {
        let status = self
            .inner
            .with_process(self.id, |p| p.child.try_wait().ok().flatten());
        match status {
            Some(None) => Ok(()),
            Some(Some(status)) => Err(self.exited(describe_status(status))),
            None => Err(self.exited("stopped".to_owned())),
        }
    }

    fn exited(&self, status: String) -> Error {
        Error::ProcessExited {
            label: self.label.clone(),
            pid: self.pid,
            status,
            log_tail: self.log_tail(20),
        }
    }

    /// Sends `signal` (e.g. `libc::SIGINT`) to it, if it still runs.
    pub fn signal(&self, signal: i32) {
        let running = self
            .inner
            .with_process(self.id, |p| matches!(p.child.try_wait(), Ok(None)))
            .unwrap_or(false);
        if running {
            send_signal(self.pid, signal);
        }
    }

    /// Waits up to `timeout` for it to exit on its own; returns its status.
    pub fn wait(&self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let status = self
                .inner
                .with_process(self.id, |p| p.child.try_wait().ok().flatten());
            match status {
                Some(Some(status)) => return Ok(status),
                Some(None) => {}
                None => return Err(self.exited("stopped".to_owned())),
            }
            if Instant::now() >= deadline {
                return Err(Error::WaitTimeout {
                    what: format!("process {} (pid {}) to exit", self.label, self.pid),
                    timeout,
                    last: "still running".to_owned(),
                });
            }
            thread::sleep(Duration::from_millis(10));
        }
    }

    /// Stops it: `signal` (SIGTERM for most tools, SIGINT for capture tools), up to
    /// 3 s grace, then SIGKILL. Returns how it ended; `None` if already stopped.
    pub fn stop_with(&self, signal: i32) -> Option<ExitStatus> {
        let mut rec = self.inner.take_process(self.id)?;
        if matches!(rec.child.try_wait(), Ok(None)) {
            send_signal(rec.pid, signal);
            let deadline = Instant::now() + STOP_GRACE;
            while matches!(rec.child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(5));
            }
            if matches!(rec.child.try_wait(), Ok(None)) {
                let _ = rec.child.kill();
            }
        }
        rec.child.wait().ok()
    }

    /// Stops it with SIGTERM (see [`Process::stop_with`]).
    pub fn stop(&self) -> Option<ExitStatus> {
        self.stop_with(libc::SIGTERM)
    }
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("label", &self.label)
            .field("pid", &self.pid)
            .field("log", &self.log)
            .finish()
    }
}
