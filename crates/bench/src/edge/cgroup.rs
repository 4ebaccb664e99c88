//! A CPU share for the gateway under test (`protego bench edge --gateway-cpu PERCENT`): a
//! child group of the cgroup v1 `cpu` controller with CFS bandwidth control
//! (`cpu.cfs_period_us`, `cpu.cfs_quota_us`, Documentation/scheduler/sched-bwc.rst), holding
//! only the gateway process the bench started. The gateway then runs at most PERCENT of one
//! CPU, so that it, not the load generator or the veth pair, limits the rate and every batch
//! it takes is as full as its ring allows: CPU per packet compares table sizes at saturation.
//!
//! The group is named after the bench's process id and a counter, created when the gateway
//! has started and removed when the [`CpuShare`] is dropped (its tasks moved back to the
//! parent first). Groups left by a bench that was killed are removed at the next start
//! ([`sweep_stale`]) when their owner is gone and they are empty.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::error::{BenchError, Result};

/// Where the cgroup v1 `cpu` controller is mounted.
const CPU_CONTROLLER: &str = "/sys/fs/cgroup/cpu";
/// Prefix of the groups this bench creates (`<prefix><bench pid>-<n>`).
const PREFIX: &str = "protego-bench-edge-";
/// The CFS period, µs: short enough that the ring (4 MiB) holds what arrives while the
/// gateway waits for its next quota, long enough that the smallest share's quota is at least
/// the kernel's minimum of 1 ms.
pub(crate) const PERIOD_US: u64 = 20_000;
/// Shares accepted, percent of one CPU (5 % of the period is the 1 ms minimum quota).
pub const SHARES: std::ops::RangeInclusive<u32> = 5..=100;

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A CPU share a process is confined to; removed on drop.
#[derive(Debug)]
pub(crate) struct CpuShare {
    dir: PathBuf,
}

/// The quota, µs per [`PERIOD_US`], of `percent` of one CPU.
pub(crate) fn quota_us(percent: u32) -> u64 {
    PERIOD_US * u64::from(percent) / 100
}

impl CpuShare {
    /// Confines process `pid` (all its threads) to `percent` of one CPU.
    pub(crate) fn confine(pid: u32, percent: u32) -> Result<CpuShare> {
        Self::confine_under(Path::new(CPU_CONTROLLER), pid, percent)
    }

    fn confine_under(root: &Path, pid: u32, percent: u32) -> Result<CpuShare> {
        if !SHARES.contains(&percent) {
            return Err(BenchError::InvalidOption {
                option: "--gateway-cpu",
                value: percent.to_string(),
                reason: format!("must be {} ..= {} percent", SHARES.start(), SHARES.end()),
            });
        }
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = root.join(format!("{PREFIX}{}-{n}", std::process::id()));
        fs::create_dir(&dir).map_err(|e| {
            BenchError::io(
                format!(
                    "create {} (needs the cgroup v1 cpu controller at {CPU_CONTROLLER})",
                    dir.display()
                ),
                e,
            )
        })?;
        // From here on, dropping the share removes the group whatever fails below.
        let share = CpuShare { dir };
        share.write("cpu.cfs_period_us", &PERIOD_US.to_string())?;
        share.write("cpu.cfs_quota_us", &quota_us(percent).to_string())?;
        share.write("cgroup.procs", &pid.to_string())?;
        Ok(share)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        fs::write(&path, value)
            .map_err(|e| BenchError::io(format!("write {value} to {}", path.display()), e))
    }

    /// Times the group's tasks were throttled and for how long (ns), from `cpu.stat`.
    pub(crate) fn throttled(&self) -> Option<(u64, u64)> {
        let text = fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
        Some((
            stat_field(&text, "nr_throttled")?,
            stat_field(&text, "throttled_time")?,
        ))
    }
}

/// A `name value` line of a `cpu.stat` text.
fn stat_field(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok())?
    })
}

impl Drop for CpuShare {
    fn drop(&mut self) {
        if let Err(e) = remove(&self.dir) {
            eprintln!("bench edge: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// Moves the group's remaining tasks to its parent and removes it.
fn remove(dir: &Path) -> io::Result<()> {
    if let (Some(parent), Ok(procs)) = (dir.parent(), fs::read_to_string(dir.join("cgroup.procs")))
    {
        for pid in procs.split_whitespace() {
            // A task that exited meanwhile cannot be moved; rmdir below says if any is left.
            let _ = fs::write(parent.join("cgroup.procs"), pid);
        }
    }
    fs::remove_dir(dir)
}

/// Removes the groups of earlier benches whose process is gone (e.g. killed before they
/// could clean up); a group with tasks in it is left alone.
pub(crate) fn sweep_stale() {
    sweep_stale_under(
        Path::new(CPU_CONTROLLER),
        |pid| Path::new(&format!("/proc/{pid}")).exists(),
        |dir| {
            let _ = fs::remove_dir(dir);
        },
    );
}

fn sweep_stale_under(root: &Path, alive: impl Fn(u32) -> bool, mut remove: impl FnMut(&Path)) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(owner) = name
            .to_str()
            .and_then(|n| n.strip_prefix(PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let empty =
            fs::read_to_string(e.path().join("cgroup.procs")).is_ok_and(|p| p.trim().is_empty());
        if owner != std::process::id() && !alive(owner) && empty {
            remove(&e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas_and_cpu_stat() {
        assert_eq!(quota_us(5), 1_000);
        assert_eq!(quota_us(50), 10_000);
        assert_eq!(quota_us(100), PERIOD_US);
        let stat = "nr_periods 120\nnr_throttled 97\nthrottled_time 1830000000\n";
        assert_eq!(stat_field(stat, "nr_throttled"), Some(97));
        assert_eq!(stat_field(stat, "throttled_time"), Some(1_830_000_000));
        assert_eq!(stat_field(stat, "nr_bursts"), None);
    }

    #[test]
    fn a_share_outside_the_range_is_refused_before_anything_is_created() {
        let root = std::env::temp_dir().join(format!("cg-test-{}", std::process::id()));
        for p in [0, 4, 101] {
            let e = CpuShare::confine_under(&root, 1, p).expect_err("refused");
            assert!(e.to_string().contains("--gateway-cpu"), "{e}");
        }
        assert!(!root.exists());
    }

    #[test]
    fn stale_groups_of_dead_benches_are_swept() {
        // A plain directory stands in for the controller: its "groups" are directories
        // with a cgroup.procs file.
        let root = std::env::temp_dir().join(format!("cg-sweep-{}", std::process::id()));
        let group = |name: &str, procs: &str| {
            let d = root.join(name);
            fs::create_dir_all(&d).expect("mkdir");
            fs::write(d.join("cgroup.procs"), procs).expect("procs");
            d
        };
        let dead_empty = group(&format!("{PREFIX}4000000-0"), "");
        let dead_busy = group(&format!("{PREFIX}4000001-0"), "77\n");
        let alive = group(&format!("{PREFIX}4000002-3"), "");
        let other = group("someone-else-1", "");
        let mut removed = Vec::new();
        sweep_stale_under(
            &root,
            |pid| pid == 4_000_002,
            |d| removed.push(d.to_owned()),
        );
        let _ = fs::remove_dir_all(&root);
        assert_eq!(removed, vec![dead_empty]);
        let _ = (dead_busy, alive, other);
    }
}
