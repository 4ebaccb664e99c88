//! What Protego's tests need from the machine, and what happens when it is missing.
//!
//! Some tests drive real programs (strongSwan, etcd, iperf3, tshark, openssl...) or kernel
//! features (network namespaces, TUN). `scripts/requirements.tsv` ([`requirements`]) lists every
//! program a test runs, with the Debian package that brings it; `scripts/setup.sh` installs
//! those packages, and the `protego-preflight` binary (run by `make test` before the tests)
//! prints what it found.
//!
//! A test asks with [`program`] or [`need`] before using a requirement. When it is missing:
//! - under `make test` (which sets `PROTEGO_TEST_STRICT=1`) and whenever `CI` is set, the test
//!   **fails**, with a message naming the requirement and how to install it: a suite never
//!   passes by skipping what it was written to check;
//! - otherwise (a developer's plain `cargo test` on a machine without, say, tshark) the test
//!   prints `SKIPPED <test>: <why>` and returns early.
//!
//! Where the product itself adapts to the machine (a kernel that refuses TUN offloads), the
//! test does not skip: it asserts the fallback path instead.

pub mod bpf;

use std::path::{Path, PathBuf};

/// `scripts/requirements.tsv`: every program (or file) the build, the demo and the tests use,
/// with the Debian package that installs it; `scripts/setup.sh` installs the same list.
pub const REQUIREMENTS_TSV: &str = include_str!("../../../scripts/requirements.tsv");

/// One line of [`REQUIREMENTS_TSV`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Requirement {
    /// The command name (looked up on `PATH`) or an absolute path; `None` for a package with
    /// no single program to check (e.g. header files).
    pub program: Option<&'static str>,
    /// The Debian 12 package that installs it.
    pub package: &'static str,
    /// What uses it.
    pub used_by: &'static str,
}

/// The lines of [`REQUIREMENTS_TSV`] (comments and blank lines left out).
pub fn requirements() -> impl Iterator<Item = Requirement> {
    REQUIREMENTS_TSV
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let mut cols = l.split('\t');
            let program = cols.next().unwrap_or("-");
            Requirement {
                program: (program != "-").then_some(program),
                package: cols.next().unwrap_or(""),
                used_by: cols.next().unwrap_or(""),
            }
        })
}

/// Whether missing requirements fail the test (under `make test`, which sets
/// `PROTEGO_TEST_STRICT=1`, or whenever `CI` is set) rather than skip it.
pub fn strict() -> bool {
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty() && v != "0");
    set("PROTEGO_TEST_STRICT") || set("CI")
}

/// Where `name` is: itself if it is a path to an existing file (executable, unless it is a
/// shared object or a header), else its first match on `PATH`, as `std::process::Command`
/// would find it.
pub fn find(name: &str) -> Option<PathBuf> {
    let usable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        p.metadata().is_ok_and(|m| {
            m.is_file()
                && (name.ends_with(".so")
                    || name.ends_with(".h")
                    || m.permissions().mode() & 0o111 != 0)
        })
    };
    if name.contains('/') {
        let p = PathBuf::from(name);
        return usable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| std::ffi::OsString::from("/usr/sbin:/usr/bin:/sbin:/bin"));
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| usable(p))
}

/// The package that installs `program`, from [`requirements`].
pub fn package_of(program: &str) -> Option<&'static str> {
    requirements()
        .find(|r| {
            r.program
                .is_some_and(|p| p == program || p.ends_with(&format!("/{program}")))
        })
        .map(|r| r.package)
}

/// True if `program` is installed. If it is not: fails the test under [`strict`] (panics with a
/// message naming the program and its package), otherwise prints `SKIPPED test: ...` and
/// returns false, and the test returns early.
pub fn program(test: &str, program: &str) -> bool {
    let how = match package_of(program) {
        Some(pkg) => format!("scripts/setup.sh installs it (Debian package {pkg})"),
        None => "install it".to_owned(),
    };
    need(
        test,
        find(program).is_some(),
        &format!("`{program}` is not installed"),
        &how,
    )
}

/// True if `ok`. If not: fails the test under [`strict`] (panics with `what` and `how`),
/// otherwise prints `SKIPPED test: what (how)` and returns false.
#[track_caller]
pub fn need(test: &str, ok: bool, what: &str, how: &str) -> bool {
    if ok {
        return true;
    }
    if strict() {
        panic!(
            "{test}: missing requirement: {what}; {how}. \
             (Under `make test` and in CI a test never passes by skipping.)"
        );
    }
    eprintln!("SKIPPED {test}: {what}; {how}");
    false
}

/// Where `scripts/strongswan6.sh` installs strongSwan 6 (Debian 13, the second strongSwan peer)
/// unless `PROTEGO_STRONGSWAN6_ROOT` says otherwise (the script reads the same variable).
pub const STRONGSWAN6_ROOT: &str = "/var/lib/protego-test/strongswan6";

/// The root holding strongSwan 6 (`PROTEGO_STRONGSWAN6_ROOT`, else [`STRONGSWAN6_ROOT`]).
pub fn strongswan6_root() -> PathBuf {
    std::env::var_os("PROTEGO_STRONGSWAN6_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(STRONGSWAN6_ROOT))
}

/// The strongSwan 6 daemon in its root, if installed.
pub fn strongswan6_daemon() -> Option<PathBuf> {
    let d = strongswan6_root().join("usr/sbin/charon-systemd");
    d.exists().then_some(d)
}

/// The name of the running test: the test harness names each test's thread after it.
pub fn this_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_owned()
}

/// Whether this process may create network namespaces: tries `unshare(CLONE_NEWNET)` on a
/// throw-away thread (the namespace dies with it). `Err` says why not.
pub fn netns_allowed() -> Result<(), String> {
    std::thread::spawn(|| {
        // SAFETY: unshare(2) changes only the calling thread's namespaces; the thread ends here.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().to_string())
        }
    })
    .join()
    .unwrap_or_else(|_| Err("the probe thread panicked".into()))
}

/// Like [`need`], for the ability to create network namespaces (root, or CAP_SYS_ADMIN and
/// CAP_NET_ADMIN).
pub fn netns(test: &str) -> bool {
    match netns_allowed() {
        Ok(()) => true,
        Err(why) => netns_refused(test, &why),
    }
}

/// For a test whose own `unshare(CLONE_NEWNET)` failed with `why`: fails it under [`strict`],
/// else prints why it skips. Always returns false.
pub fn netns_refused(test: &str, why: &dyn std::fmt::Display) -> bool {
    need(
        test,
        false,
        &format!("cannot create a network namespace ({why})"),
        "run the tests as root (make test)",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_of_the_list_names_a_package_and_its_use() {
        let lines: Vec<_> = requirements().collect();
        assert!(lines.len() > 10, "{lines:?}");
        for r in &lines {
            assert!(!r.package.is_empty() && !r.package.contains(' '), "{r:?}");
            assert!(!r.used_by.is_empty(), "{r:?}");
        }
        for line in REQUIREMENTS_TSV
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            assert_eq!(
                line.split('\t').count(),
                3,
                "three tab-separated columns: {line:?}"
            );
        }
    }

    #[test]
    fn packages_are_found_by_command_name_and_by_file_name() {
        assert_eq!(package_of("etcd"), Some("etcd-server"));
        assert_eq!(
            package_of("libstrongswan-openssl.so"),
            Some("libstrongswan-standard-plugins")
        );
        assert_eq!(package_of("charon-systemd"), Some("charon-systemd"));
        assert_eq!(package_of("clang-14"), Some("clang-14"));
        assert_eq!(package_of("bpf_helpers.h"), Some("libbpf-dev"));
        assert_eq!(package_of("no-such-program"), None);
    }

    #[test]
    fn a_met_requirement_passes_and_programs_are_found() {
        assert!(need("t", true, "x", "y"));
        assert!(find("sh").is_some());
        assert!(find("/nonexistent/program").is_none());
        assert!(find("no-such-program-protego").is_none());
    }
}
