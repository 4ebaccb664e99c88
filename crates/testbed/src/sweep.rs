//! The sweeper: removes namespaces, root-namespace interfaces and run
//! directories left behind by test-bed runs whose owning process is dead (a
//! killed `cargo test`, a SIGKILLed demo), so junk never accumulates.
//!
//! Ownership is read from the name (see [`crate::names`]); a process counts as
//! alive while `kill(pid, 0)` finds it. A recycled pid only delays the sweep of
//! that run's leftovers until the pid is free again.

use std::fs;

use crate::bed::{base_dir, kill_netns_pids};
use crate::cmd::Cmd;
use crate::names::RunId;

/// What a sweep removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Network namespaces deleted.
    pub namespaces: Vec<String>,
    /// Root-namespace interfaces deleted.
    pub links: Vec<String>,
    /// Run directories removed.
    pub dirs: Vec<String>,
}

impl SweepReport {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.namespaces.is_empty() && self.links.is_empty() && self.dirs.is_empty()
    }
}

/// Removes leftovers of dead runs (never those of this process).
pub fn sweep() -> SweepReport {
    sweep_stale(false)
}

/// Removes leftovers of dead runs; with `include_own`, also names carrying this
/// process's pid (only correct before this process created anything).
pub(crate) fn sweep_stale(include_own: bool) -> SweepReport {
    let own = std::process::id();
    let stale = |id: RunId| {
        if id.pid() == own {
            include_own
        } else {
            !pid_alive(id.pid())
        }
    };
    let mut report = SweepReport::default();

    if let Ok(out) = Cmd::new("ip").args(["netns", "list"]).output() {
        for line in out.stdout.lines() {
            let Some(name) = line.split_whitespace().next() else {
                continue;
            };
            if RunId::parse(name).is_some_and(stale) {
                kill_netns_pids(name);
                if Cmd::new("ip")
                    .args(["netns", "del", name])
                    .output()
                    .is_ok_and(|o| o.success())
                {
                    report.namespaces.push(name.to_owned());
                }
            }
        }
    }

    if let Ok(out) = Cmd::new("ip").args(["-o", "link", "show"]).output() {
        for line in out.stdout.lines() {
            // "12: name@peer: <FLAGS> ..." or "12: name: <FLAGS> ..."
            let Some(name) = line
                .split(": ")
                .nth(1)
                .map(|n| n.split('@').next().unwrap_or(n))
            else {
                continue;
            };
            if RunId::parse(name).is_some_and(stale)
                && Cmd::new("ip")
                    .args(["link", "del", name])
                    .output()
                    .is_ok_and(|o| o.success())
            {
                report.links.push(name.to_owned());
            }
        }
    }

    if let Ok(entries) = fs::read_dir(base_dir()) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if RunId::parse(&name).is_some_and(stale) && fs::remove_dir_all(entry.path()).is_ok() {
                report.dirs.push(name);
            }
        }
    }

    if !report.is_empty() {
        eprintln!(
            "testbed: swept leftovers of dead runs: namespaces {:?}, links {:?}, dirs {:?}",
            report.namespaces, report.links, report.dirs
        );
    }
    report
}

/// Whether a process with this pid exists.
fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_pid_is_alive_and_pid_max_plus_is_not() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(60_000_000));
    }
}
