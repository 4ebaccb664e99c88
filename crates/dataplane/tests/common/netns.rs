//! Private network namespaces for the tests that need a real kernel beside the data plane
//! (kernel VXLAN hosts, bridges, VMs): anonymous namespaces held by file descriptors (gone
//! when the test ends), threads inside them, and commands that must succeed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Command;

/// Runs a command (`args[0]` with the rest as arguments) and fails the test if it fails.
pub(crate) fn run(args: &[&str]) {
    output(args);
}

/// Runs each line of `script` as a command (words split on spaces) with [`run`].
pub(crate) fn run_lines(script: &[&str]) {
    for line in script {
        run(&line.split(' ').collect::<Vec<_>>());
    }
}

/// A command's standard output (the command must succeed).
pub(crate) fn output(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run command");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new network namespace, held open by the returned file.
pub(crate) fn new_netns() -> File {
    std::thread::spawn(|| {
        // SAFETY: unshare(2) affects only this short-lived thread.
        assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
        File::open("/proc/thread-self/ns/net").expect("open netns")
    })
    .join()
    .expect("netns thread")
}

/// Runs `f` on a thread inside namespace `ns`.
pub(crate) fn in_netns<T: Send + 'static>(ns: &File, f: impl FnOnce() -> T + Send + 'static) -> T {
    let fd = ns.try_clone().expect("dup netns fd");
    std::thread::spawn(move || {
        // SAFETY: setns(2) affects only this thread; `fd` is a network namespace.
        assert_eq!(
            unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns"
        );
        f()
    })
    .join()
    .expect("namespace thread")
}

/// A path naming the namespace for `ip link set ... netns PATH`.
pub(crate) fn ns_path(ns: &File) -> String {
    format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd())
}
