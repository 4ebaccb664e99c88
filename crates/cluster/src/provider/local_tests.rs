//! The `local` node provider against real processes: pid files, start, stop, SIGKILL, adoption, network namespaces.

use super::*;
use control::config::LocalNodeConfig;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::atomic::{AtomicU32, Ordering};

/// Held while writing a script and while forking: a script being written in one thread
/// while another forks would make exec fail with "text file busy".
static FORK: Mutex<()> = Mutex::new(());

fn fork_lock() -> MutexGuard<'static, ()> {
    FORK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temporary directory; on drop, kills the processes the test started (by PID and
/// start time) and removes the directory.
struct TestDir {
    path: PathBuf,
    started: Mutex<Vec<(libc::pid_t, u64)>>,
}

impl TestDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let path = std::env::temp_dir().join(format!(
            "protego-local-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&path);
        fs::create_dir_all(&path).unwrap();
        Self {
            path,
            started: Mutex::new(Vec::new()),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.path.join("run")
    }

    /// Writes an executable shell script.
    fn script(&self, name: &str, body: &str) -> PathBuf {
        let path = self.path.join(name);
        let _fork = fork_lock();
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// Writes a data node file for `name` (`data = false`: without `[data]`).
    fn node_file(&self, file: &str, name: &str, data: bool) -> PathBuf {
        let path = self.path.join(file);
        let mut text = format!(
            "[node]\nname = \"{name}\"\nca = \"ca.pem\"\ncert = \"{name}.pem\"\nkey = \"{name}.key\"\n\
             [[node.control]]\nname = \"control1\"\naddress = \"10.255.0.10:7300\"\n"
        );
        if data {
            text.push_str("[data]\ngeneve = \"10.255.0.21:6081\"\n");
        }
        fs::write(&path, text).unwrap();
        path
    }

    fn config(&self, command: &Path, nodes: Nodes, stop_timeout: Duration) -> LocalProviderConfig {
        LocalProviderConfig {
            command: Some(command.to_owned()),
            run_dir: self.run_dir(),
            stop_timeout,
            nodes: nodes
                .iter()
                .map(|(config, netns)| LocalNodeConfig {
                    config: config.to_path_buf(),
                    netns: netns.map(str::to_owned),
                })
                .collect(),
        }
    }

    /// Starts `name` and records its process for the cleanup.
    fn start(&self, provider: &LocalProvider, name: &str) -> Result<(), ProviderError> {
        let result = {
            let _fork = fork_lock();
            provider.start(name)
        };
        if let Some((pid, start_time)) = self.pid_of(name) {
            self.started.lock().unwrap().push((pid, start_time));
        }
        result
    }

    fn pid_of(&self, name: &str) -> Option<(libc::pid_t, u64)> {
        parse_pid_file(&fs::read_to_string(pid_file(&self.run_dir(), name)).ok()?)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let started = self.started.lock().unwrap_or_else(|e| e.into_inner());
        for &(pid, start_time) in started.iter() {
            let process = Process {
                pid,
                start_time,
                child: None,
            };
            let _ = process.signal(libc::SIGKILL);
        }
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn state_of(provider: &LocalProvider, name: &str) -> ProvidedState {
    provider
        .nodes()
        .into_iter()
        .find(|n| n.name == name)
        .map(|n| n.state)
        .unwrap()
}

/// Polls `nodes()` until `name`'s state satisfies `want` (10 s at most).
fn wait_for(
    provider: &LocalProvider,
    name: &str,
    want: impl Fn(&ProvidedState) -> bool,
) -> ProvidedState {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let state = state_of(provider, name);
        if want(&state) {
            return state;
        }
        assert!(Instant::now() < deadline, "{name} still {state:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `pid` runs `sleep` (the script has set itself up and exec'd).
fn wait_exec(pid: libc::pid_t) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "sleep\n" {
        assert!(Instant::now() < deadline, "PID {pid} never ran sleep");
        std::thread::sleep(Duration::from_millis(10));
    }
}

const LONG: Duration = Duration::from_secs(30);

/// Data node files and their network namespaces.
type Nodes<'a> = &'a [(&'a Path, Option<&'a str>)];

#[test]
fn provider_parses_proc_stat_and_pid_files() {
    let line =
        "4242 (a) b (c)) S 1 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 200";
    assert_eq!(
        parse_stat(line),
        Some(ProcStat {
            state: 'S',
            start_time: 987654
        })
    );
    assert_eq!(parse_stat("1 (x) S 1 2"), None);
    assert_eq!(parse_stat("garbage"), None);
    let own = proc_stat(std::process::id() as libc::pid_t).unwrap();
    assert!(own.start_time > 0);
    assert!(is_running(
        std::process::id() as libc::pid_t,
        own.start_time
    ));
    assert!(!is_running(
        std::process::id() as libc::pid_t,
        own.start_time + 1
    ));
    assert_eq!(parse_pid_file("12 345\n"), Some((12, 345)));
    for bad in ["", "12", "0 5", "-1 5", "12 x", "12 5 6"] {
        assert_eq!(parse_pid_file(bad), None, "{bad:?}");
    }
    assert_eq!(
        pid_file(Path::new("/run/p"), "data1"),
        Path::new("/run/p/data1.pid")
    );
}

#[test]
fn provider_starts_and_stops_a_node() {
    let dir = TestDir::new("start");
    let command = dir.script("protego", "echo \"args: $*\"\nexec sleep 600");
    let file = dir.node_file("data1.toml", "data1", true);
    let provider = LocalProvider::new(&dir.config(&command, &[(&file, None)], LONG)).unwrap();
    assert_eq!(provider.kind(), "local");
    assert_eq!(
        provider.nodes(),
        vec![ProvidedNode {
            name: "data1".into(),
            state: ProvidedState::Stopped
        }]
    );
    let mode = fs::metadata(dir.run_dir()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700);

    dir.start(&provider, "data1").unwrap();
    assert!(matches!(
        state_of(&provider, "data1"),
        ProvidedState::Running {
            started_at: Some(_)
        }
    ));
    let (pid, start_time) = dir.pid_of("data1").unwrap();
    assert_eq!(proc_stat(pid).unwrap().start_time, start_time);
    // SAFETY: getsid has no preconditions.
    assert_eq!(unsafe { libc::getsid(pid) }, pid, "runs in its own session");
    wait_exec(pid);

    // Starting a running node changes nothing.
    dir.start(&provider, "data1").unwrap();
    assert_eq!(dir.pid_of("data1"), Some((pid, start_time)));

    let log = fs::read_to_string(log_file(&dir.run_dir(), "data1")).unwrap();
    assert!(
        log.contains(&format!("args: data -c {}", file.display())),
        "{log}"
    );

    provider.stop("data1").unwrap();
    // `sleep` exits at once on SIGTERM: it may be gone by the time we look.
    let state = state_of(&provider, "data1");
    assert!(
        matches!(state, ProvidedState::Stopping | ProvidedState::Stopped),
        "{state:?}"
    );
    provider.stop("data1").unwrap();
    wait_for(&provider, "data1", |s| *s == ProvidedState::Stopped);
    assert!(!pid_file(&dir.run_dir(), "data1").exists());
    provider.stop("data1").unwrap();
    assert_eq!(state_of(&provider, "data1"), ProvidedState::Stopped);
}

#[test]
fn provider_kills_a_node_that_ignores_sigterm() {
    let dir = TestDir::new("kill");
    let command = dir.script("protego", "trap '' TERM\nexec sleep 600");
    let file = dir.node_file("data1.toml", "data1", true);
    let timeout = Duration::from_millis(300);
    let provider = LocalProvider::new(&dir.config(&command, &[(&file, None)], timeout)).unwrap();
    dir.start(&provider, "data1").unwrap();
    let (pid, start_time) = dir.pid_of("data1").unwrap();
    wait_exec(pid);

    let asked = Instant::now();
    provider.stop("data1").unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(state_of(&provider, "data1"), ProvidedState::Stopping);
    assert!(is_running(pid, start_time), "SIGTERM is ignored");
    match dir.start(&provider, "data1") {
        Err(ProviderError::Failed { action, reason, .. }) => {
            assert_eq!(action, "start");
            assert!(reason.contains("still stopping"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    wait_for(&provider, "data1", |s| *s == ProvidedState::Stopped);
    assert!(asked.elapsed() >= timeout);
    assert!(!is_running(pid, start_time));
}

#[test]
fn provider_reports_a_node_that_exits_and_restarts_it() {
    let dir = TestDir::new("exit");
    let ok = dir.path.join("ok");
    let command = dir.script(
        "protego",
        &format!(
            "if [ -e {} ]; then exec sleep 600; fi\nexit 3",
            ok.display()
        ),
    );
    let file = dir.node_file("data1.toml", "data1", true);
    let provider = LocalProvider::new(&dir.config(&command, &[(&file, None)], LONG)).unwrap();
    dir.start(&provider, "data1").unwrap();
    let state = wait_for(&provider, "data1", |s| {
        matches!(s, ProvidedState::Failed { .. })
    });
    let ProvidedState::Failed { reason } = state else {
        unreachable!()
    };
    assert!(reason.starts_with("exited with status 3"), "{reason}");
    assert!(!pid_file(&dir.run_dir(), "data1").exists());
    // It stays failed until started again; stopping it changes nothing.
    provider.stop("data1").unwrap();
    assert!(matches!(
        state_of(&provider, "data1"),
        ProvidedState::Failed { .. }
    ));

    fs::write(&ok, "").unwrap();
    dir.start(&provider, "data1").unwrap();
    let (pid, _) = dir.pid_of("data1").unwrap();
    wait_exec(pid);
    assert!(matches!(
        state_of(&provider, "data1"),
        ProvidedState::Running { .. }
    ));
    provider.stop("data1").unwrap();
    wait_for(&provider, "data1", |s| *s == ProvidedState::Stopped);
}

#[test]
fn provider_adopts_running_nodes() {
    let dir = TestDir::new("adopt");
    let command = dir.script("protego", "exec sleep 600");
    let file1 = dir.node_file("data1.toml", "data1", true);
    let file2 = dir.node_file("data2.toml", "data2", true);
    let config = dir.config(&command, &[(&file1, None), (&file2, None)], LONG);
    let first = LocalProvider::new(&config).unwrap();
    dir.start(&first, "data1").unwrap();
    dir.start(&first, "data2").unwrap();
    let (pid1, _) = dir.pid_of("data1").unwrap();
    let (pid2, _) = dir.pid_of("data2").unwrap();
    wait_exec(pid1);
    wait_exec(pid2);

    // A second provider (the next control node) finds both running.
    let second = LocalProvider::new(&config).unwrap();
    let adopted = ProvidedState::Running { started_at: None };
    assert_eq!(
        second.nodes(),
        vec![
            ProvidedNode {
                name: "data1".into(),
                state: adopted.clone()
            },
            ProvidedNode {
                name: "data2".into(),
                state: adopted.clone()
            }
        ]
    );
    second.start("data1").unwrap();
    assert_eq!(state_of(&second, "data1"), adopted);

    // It stops an adopted node.
    second.stop("data1").unwrap();
    let state = state_of(&second, "data1");
    assert!(
        matches!(state, ProvidedState::Stopping | ProvidedState::Stopped),
        "{state:?}"
    );
    wait_for(&second, "data1", |s| *s == ProvidedState::Stopped);
    assert!(!pid_file(&dir.run_dir(), "data1").exists());

    // An adopted node killed behind its back is no longer running.
    // SAFETY: kill has no memory-safety preconditions; pid2 is this test's process.
    assert_eq!(unsafe { libc::kill(pid2, libc::SIGKILL) }, 0);
    let state = wait_for(&second, "data2", |s| {
        matches!(s, ProvidedState::Failed { .. })
    });
    assert!(
        matches!(&state, ProvidedState::Failed { reason } if reason.starts_with("no longer running")),
        "{state:?}"
    );
    assert!(!pid_file(&dir.run_dir(), "data2").exists());

    // The first provider (their parent) sees them killed.
    let state = wait_for(&first, "data1", |s| {
        matches!(s, ProvidedState::Failed { .. })
    });
    assert!(
        matches!(&state, ProvidedState::Failed { reason } if reason.starts_with("killed by signal 15")),
        "{state:?}"
    );
}

#[test]
fn provider_removes_stale_pid_files() {
    let dir = TestDir::new("stale");
    let command = dir.script("protego", "exec sleep 600");
    let files: Vec<PathBuf> = (1..=3)
        .map(|i| dir.node_file(&format!("data{i}.toml"), &format!("data{i}"), true))
        .collect();
    let nodes: Vec<(&Path, Option<&str>)> = files.iter().map(|f| (f.as_path(), None)).collect();
    let config = dir.config(&command, &nodes, LONG);
    fs::create_dir_all(dir.run_dir()).unwrap();
    let own = std::process::id() as libc::pid_t;
    let own_start = proc_stat(own).unwrap().start_time;
    let run_dir = dir.run_dir();
    // A PID above any pid_max, this test's PID with another start time, garbage.
    fs::write(pid_file(&run_dir, "data1"), "1073741823 5\n").unwrap();
    fs::write(
        pid_file(&run_dir, "data2"),
        format!("{own} {}\n", own_start + 1),
    )
    .unwrap();
    fs::write(pid_file(&run_dir, "data3"), "not a pid file").unwrap();
    let provider = LocalProvider::new(&config).unwrap();
    for node in provider.nodes() {
        assert_eq!(node.state, ProvidedState::Stopped, "{}", node.name);
        assert!(!pid_file(&run_dir, &node.name).exists(), "{}", node.name);
    }
    // The provider treats a stale node as stopped: it starts normally.
    dir.start(&provider, "data2").unwrap();
    let (pid, _) = dir.pid_of("data2").unwrap();
    assert_ne!(pid, own);
    wait_exec(pid);
    provider.stop("data2").unwrap();
    wait_for(&provider, "data2", |s| *s == ProvidedState::Stopped);
}

#[test]
fn provider_rejects_unknown_nodes_and_bad_configs() {
    let dir = TestDir::new("config");
    let command = dir.script("protego", "exec sleep 600");
    let file1 = dir.node_file("data1.toml", "data1", true);
    let provider = LocalProvider::new(&dir.config(&command, &[(&file1, None)], LONG)).unwrap();
    assert!(matches!(provider.start("data9"), Err(ProviderError::UnknownNode(n)) if n == "data9"));
    assert!(matches!(provider.stop("data9"), Err(ProviderError::UnknownNode(n)) if n == "data9"));

    let steer = dir.node_file("steer1.toml", "steer1", false);
    let twin = dir.node_file("twin.toml", "data1", true);
    let missing = dir.path.join("missing.toml");
    let cases: [(Nodes, &Path); 3] = [
        (&[(&file1, None), (&steer, None)], &steer),
        (&[(&file1, None), (&twin, None)], &twin),
        (&[(&missing, None)], &missing),
    ];
    for (nodes, culprit) in cases {
        match LocalProvider::new(&dir.config(&command, nodes, LONG)) {
            Err(ProviderError::Config(message)) => assert!(
                message.contains(&culprit.display().to_string()),
                "{message}"
            ),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("{} accepted", culprit.display()),
        }
    }
}

/// Deletes a network namespace on drop.
struct Netns(String);

impl Drop for Netns {
    fn drop(&mut self) {
        let _fork = fork_lock();
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn provider_runs_nodes_in_their_netns() {
    if !testreq::program("provider_runs_nodes_in_their_netns", "ip") {
        return;
    }
    let dir = TestDir::new("netns");
    let command = dir.script("protego", "exec sleep 600");
    let file1 = dir.node_file("data1.toml", "data1", true);
    let file2 = dir.node_file("data2.toml", "data2", true);
    let missing = format!("protego-lp-missing-{}", std::process::id());
    assert!(!Path::new("/run/netns").join(&missing).exists());
    let ns = Netns(format!("protego-lp-{}", std::process::id()));
    {
        let _fork = fork_lock();
        let status = Command::new("ip")
            .args(["netns", "add", &ns.0])
            .status()
            .unwrap();
        assert!(status.success(), "ip netns add {}", ns.0);
    }
    let provider = LocalProvider::new(&dir.config(
        &command,
        &[
            (&file1, Some(ns.0.as_str())),
            (&file2, Some(missing.as_str())),
        ],
        LONG,
    ))
    .unwrap();

    // The PID is the data node's, inside the namespace.
    dir.start(&provider, "data1").unwrap();
    let (pid, _) = dir.pid_of("data1").unwrap();
    wait_exec(pid);
    let inside = fs::metadata(format!("/proc/{pid}/ns/net")).unwrap().ino();
    let netns = fs::metadata(Path::new("/run/netns").join(&ns.0))
        .unwrap()
        .ino();
    assert_eq!(inside, netns);

    // `ip netns exec` of a namespace that does not exist fails.
    dir.start(&provider, "data2").unwrap();
    let state = wait_for(&provider, "data2", |s| {
        matches!(s, ProvidedState::Failed { .. })
    });
    assert!(
        matches!(&state, ProvidedState::Failed { reason } if reason.starts_with("exited with status")),
        "{state:?}"
    );

    provider.stop("data1").unwrap();
    wait_for(&provider, "data1", |s| *s == ProvidedState::Stopped);
}
