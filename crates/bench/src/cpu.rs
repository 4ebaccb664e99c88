//! CPU and socket accounting of a process under test, read from `/proc`:
//!
//! - CPU time: the first field of `/proc/<pid>/task/<tid>/schedstat` is the time the thread
//!   has run on a CPU, in nanoseconds (the scheduler's `sum_exec_runtime`). Reading every
//!   thread's before and after a measurement gives the CPU the process spent on it, whatever
//!   else shares the machine: the sum over the threads alive at the end of their growth
//!   (a thread born in between counts whole; one that ended in between is not seen - the
//!   gateways' worker threads live for the whole run).
//! - UDP receive drops: `InErrors` and `NoPorts` of `/proc/<pid>/net/snmp` and `snmp6`, the
//!   counters of the network namespace `pid` lives in.
//! - Path drops: the receive and transmit `drop` columns of `/proc/<pid>/net/dev` (the
//!   interfaces of that namespace, veth included) plus the machine's input backlog drops
//!   (second column of `/proc/net/softnet_stat`, a veth delivers through that backlog).

use std::fs;
use std::io;

/// The run time in nanoseconds from the text of a `schedstat` file
/// (`<run ns> <wait ns> <timeslices>`).
pub(crate) fn parse_schedstat(text: &str) -> Option<u64> {
    text.split_whitespace().next()?.parse().ok()
}

/// The CPU time of each thread of process `pid` so far, nanoseconds by thread id.
pub(crate) fn thread_cpu_ns(pid: u32) -> io::Result<ThreadTimes> {
    let dir = format!("/proc/{pid}/task");
    let mut times = Vec::new();
    for entry in fs::read_dir(&dir)? {
        let entry = entry?;
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread may exit between the listing and the read: skip it.
        let Ok(text) = fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        let ns = parse_schedstat(&text).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "unexpected schedstat in {}: {text:?}",
                    entry.path().display()
                ),
            )
        })?;
        times.push((tid, ns));
    }
    times.sort_unstable();
    Ok(ThreadTimes(times))
}

/// Per-thread CPU times of a process at one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ThreadTimes(Vec<(u32, u64)>);

impl ThreadTimes {
    /// From `(thread id, ns)` pairs.
    #[cfg(test)]
    pub(crate) fn from_pairs(mut pairs: Vec<(u32, u64)>) -> ThreadTimes {
        pairs.sort_unstable();
        ThreadTimes(pairs)
    }

    /// CPU time spent between `before` and `self`: for every thread alive now, its time now
    /// minus its time then (all of it if it started since). A thread that ended in between
    /// is not counted (its last moments are not visible any more).
    pub(crate) fn since(&self, before: &ThreadTimes) -> u64 {
        self.0
            .iter()
            .map(|&(tid, now)| {
                let then = before
                    .0
                    .binary_search_by_key(&tid, |&(t, _)| t)
                    .map_or(0, |i| before.0[i].1);
                now.saturating_sub(then)
            })
            .sum()
    }
}

/// `InErrors + NoPorts` of the `Udp:` lines of a `/proc/net/snmp` text (datagrams dropped for
/// a full receive buffer or another error, or for lack of a socket).
pub(crate) fn parse_snmp_udp(text: &str) -> u64 {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (Some(head), Some(values)) = (lines.next(), lines.next()) else {
        return 0;
    };
    head.split_whitespace()
        .zip(values.split_whitespace())
        .filter(|(k, _)| matches!(*k, "InErrors" | "NoPorts"))
        .filter_map(|(_, v)| v.parse::<u64>().ok())
        .sum()
}

/// `Udp6InErrors + Udp6NoPorts` of a `/proc/net/snmp6` text.
pub(crate) fn parse_snmp6_udp(text: &str) -> u64 {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let k = f.next()?;
            matches!(k, "Udp6InErrors" | "Udp6NoPorts")
                .then(|| f.next()?.parse::<u64>().ok())
                .flatten()
        })
        .sum()
}

/// UDP datagrams the network namespace of `pid` dropped on receive: full socket buffers,
/// other errors, no socket bound (IPv4 and IPv6).
pub(crate) fn netns_udp_drops(pid: u32) -> u64 {
    let read = |f: &str| fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
    parse_snmp_udp(&read("snmp")) + parse_snmp6_udp(&read("snmp6"))
}

/// The sum of the receive and transmit `drop` columns of a `/proc/net/dev` text.
pub(crate) fn parse_dev_drops(text: &str) -> u64 {
    text.lines()
        .skip(2)
        .filter_map(|line| {
            let (_, stats) = line.split_once(':')?;
            let f: Vec<u64> = stats
                .split_whitespace()
                .map(|v| v.parse().unwrap_or(0))
                .collect();
            Some(f.get(3).copied().unwrap_or(0) + f.get(11).copied().unwrap_or(0))
        })
        .sum()
}

/// The sum of the `dropped` column (the second, hexadecimal) of `/proc/net/softnet_stat`.
pub(crate) fn parse_softnet_drops(text: &str) -> u64 {
    text.lines()
        .filter_map(|line| u64::from_str_radix(line.split_whitespace().nth(1)?, 16).ok())
        .sum()
}

/// Packets dropped on the way: interface drops in the namespace of `pid`, plus the
/// machine's input backlog drops.
pub(crate) fn path_drops(pid: u32) -> u64 {
    let dev = fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .map(|t| parse_dev_drops(&t))
        .unwrap_or(0);
    let backlog = fs::read_to_string("/proc/net/softnet_stat")
        .map(|t| parse_softnet_drops(&t))
        .unwrap_or(0);
    dev + backlog
}

/// The sum of `rx.dropped + tx.dropped` over the interfaces of an `ip -s -j link show` text.
pub(crate) fn parse_ip_link_drops(json: &str) -> u64 {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
        return 0;
    };
    v.as_array()
        .map(|links| {
            links
                .iter()
                .map(|l| {
                    let d = |dir: &str| l["stats64"][dir]["dropped"].as_u64().unwrap_or(0);
                    d("rx") + d("tx")
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Interface drops in namespace `ns` (`ip -s -j link show`); 0 if it cannot be read.
pub(crate) fn netns_link_drops(ns: &testbed::Netns) -> u64 {
    ns.ip(["-s", "-j", "link", "show"])
        .map(|out| parse_ip_link_drops(&out))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_first_field() {
        assert_eq!(parse_schedstat("123456789 2345 17\n"), Some(123_456_789));
        assert_eq!(parse_schedstat("0 0 0"), Some(0));
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("x 1 2"), None);
    }

    #[test]
    fn own_cpu_time_grows() {
        let pid = std::process::id();
        let before = thread_cpu_ns(pid).expect("own schedstat");
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        // A running thread's run time is brought up to date when it is descheduled (or at a
        // scheduler tick): sleep once so the busy loop is surely accounted.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let after = thread_cpu_ns(pid).expect("own schedstat");
        assert!(after.since(&before) > 0);
    }

    #[test]
    fn per_thread_deltas_survive_exits_and_births() {
        let before = ThreadTimes::from_pairs(vec![(10, 1000), (11, 500), (12, 9000)]);
        // 11 ran 200 more, 12 exited (its 9000 must not make the total go negative), 13 is new.
        let after = ThreadTimes::from_pairs(vec![(13, 300), (10, 1000), (11, 700)]);
        assert_eq!(after.since(&before), 500);
        assert_eq!(before.since(&before), 0);
    }

    #[test]
    fn dev_and_backlog_drops() {
        let dev = "Inter-|   Receive                                                |  Transmit\n \
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n\
    lo:     100       2    0    0    0     0          0         0      100       2    0    0    0     0       0          0\n\
pt1v0: 9999999   12345    0   17    0     0          0         0  8888888   54321    0    5    0     0       0          0\n";
        assert_eq!(parse_dev_drops(dev), 22);
        let softnet = "0001e240 0000000a 00000003 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n\
000f4240 00000010 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001\n";
        assert_eq!(parse_softnet_drops(softnet), 26);
        let _ = path_drops(std::process::id());
    }

    #[test]
    fn ip_link_drops() {
        let json = r#"[{"ifname":"lo","stats64":{"rx":{"dropped":1},"tx":{"dropped":2}}},
                       {"ifname":"v0","stats64":{"rx":{"dropped":30},"tx":{"dropped":0}}},
                       {"ifname":"v1"}]"#;
        assert_eq!(parse_ip_link_drops(json), 33);
        assert_eq!(parse_ip_link_drops("not json"), 0);
    }

    #[test]
    fn udp_error_counters() {
        let snmp = "Ip: Forwarding DefaultTTL\nIp: 1 64\n\
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n\
Udp: 471732 51 108057 336039 108057 0 0 0 0\n\
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n\
UdpLite: 0 7 7 0 0 0 0 0 0\n";
        assert_eq!(parse_snmp_udp(snmp), 108_108);
        assert_eq!(parse_snmp_udp(""), 0);
        let snmp6 = "Udp6InDatagrams                 \t12\nUdp6NoPorts                     \t3\nUdp6InErrors                    \t4\nUdp6RcvbufErrors                \t4\n";
        assert_eq!(parse_snmp6_udp(snmp6), 7);
        let _ = netns_udp_drops(std::process::id());
    }
}
