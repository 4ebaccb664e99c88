//! Adaptive polling (`busy_poll`, `busy_poll_budget`; issue 23 §2) with real sockets on
//! loopback: a worker that polls without sleeping after traffic reports the time its idle polls
//! took (`WorkerStats::spin_ns`), and one with `busy_poll` zero never spins. Only loopback
//! addresses are used; no figure is asserted (the policy's bounds are unit-tested in
//! `src/spin.rs` on its own clock).

mod common;
#[path = "../src/testutil.rs"]
mod testutil;

use common::{start_beside_host, wait_stats, Started};
use protego_dataplane::{DataPath, DataplaneConfig};
use std::time::Duration;

/// Sends `n` junk datagrams to the data plane's NAT-T socket, a little apart: each wakes the
/// worker (it drops them as malformed).
fn trickle(started: &Started, n: usize) {
    let natt = started.dp.local_addrs().natt[0];
    let from = common::bind("127.0.0.1:0");
    for _ in 0..n {
        from.send_to(&[0xff; 3], natt).expect("send");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn spin_ns(started: &Started) -> u64 {
    started.dp.stats().workers.iter().map(|w| w.spin_ns).sum()
}

#[test]
fn a_polling_worker_reports_its_idle_polls_and_a_sleeping_one_none() {
    let polling = start_beside_host(|port| DataplaneConfig {
        workers: 1,
        busy_poll: Duration::from_millis(2),
        busy_poll_budget: 50,
        xdp: Default::default(),
        ..common::config(port)
    });
    trickle(&polling, 200);
    wait_stats(&polling.dp, "idle polls after traffic", |s| {
        s.workers.iter().map(|w| w.spin_ns).sum::<u64>() > 0
    });

    let sleeping = start_beside_host(|port| DataplaneConfig {
        workers: 1,
        ..common::config(port)
    });
    trickle(&sleeping, 200);
    wait_stats(&sleeping.dp, "the datagrams taken", |s| {
        s.workers.iter().map(|w| w.packets).sum::<u64>() >= 200
    });
    assert_eq!(spin_ns(&sleeping), 0, "busy_poll = 0 never spins");
}
