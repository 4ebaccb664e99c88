//! The charge with a scripted cycle counter: exact charges per tenant for known per-phase
//! costs.

use super::*;
use std::collections::VecDeque;
use std::sync::Mutex;

/// A counter that returns the scripted readings in order (and panics when they run out:
/// the test then read the counter more often than it expected).
struct Script(Arc<Mutex<VecDeque<u64>>>);

impl Cycles for Script {
    fn now(&mut self) -> u64 {
        self.0
            .lock()
            .expect("script lock")
            .pop_front()
            .expect("the charge read the counter more often than scripted")
    }
}

fn charge(readings: &[u64]) -> (Charge, Arc<Mutex<VecDeque<u64>>>) {
    let script = Arc::new(Mutex::new(readings.iter().copied().collect()));
    (Charge::new(Box::new(Script(Arc::clone(&script)))), script)
}

fn fold(c: &mut Charge, packets: u64) -> (Vec<(TenantSlot, u64, u64)>, Folded) {
    let mut v = Vec::new();
    let f = c.end(packets, |s, cycles, n| v.push((s, cycles, n)));
    v.sort_unstable();
    (v, f)
}

#[test]
fn two_tenants_with_known_costs_are_charged_exactly() {
    // Batch: receive 0..100 (4 packets: A A B plus one IKE datagram), graph pass: 100..130
    // unattributed (the IKE datagram), A's run 130..330, B's run 330..430, end of pass at
    // 430; seal phase: B 440..500, A 500..560, end 560 (440-430 unattributed: nothing known);
    // send 560..660.
    let (mut c, script) = charge(&[0, 100, 130, 330, 430, 440, 500, 560, 660, 660]);
    c.start();
    c.received();
    c.enter(0);
    c.enter(0);
    c.enter(1);
    c.phase();
    c.switch(1, 1);
    c.switch(0, 2);
    c.syscall(|| ());
    let (v, f) = fold(&mut c, 4);
    // Receive + send = 200 cycles over 4 packets: 50 each, A 2, B 1, 50 unattributed.
    // A: run 200 + seal 60 + 100 = 360; B: run 100 + seal 60 + 50 = 210.
    assert_eq!(v, vec![(0, 360, 2), (1, 210, 1)]);
    // Unattributed: 30 (IKE, before A) + 10 (between phases) + 50 (IKE's syscall share)
    // + 0 (after the send, the phase's end at 660).
    assert_eq!(
        f,
        Folded {
            unattributed: 90,
            capped: 0
        }
    );
    assert!(script.lock().expect("script").is_empty());
}

#[test]
fn the_counter_is_read_once_per_run_not_per_packet() {
    // 64 packets of one tenant, then 64 of another: 2 readings in the pass.
    let (mut c, script) = charge(&[0, 10, 10, 650, 1290]);
    c.start();
    c.received();
    for _ in 0..64 {
        c.enter(3);
    }
    for _ in 0..64 {
        c.enter(5);
    }
    let (v, f) = fold(&mut c, 128);
    // Receive: 10 cycles over 128 packets, 5 each (rounded down).
    assert_eq!(v, vec![(3, 640 + 5, 64), (5, 640 + 5, 64)]);
    assert_eq!(f.unattributed, 0);
    assert!(script.lock().expect("script").is_empty());
}

#[test]
fn a_phase_past_the_cap_is_split_by_packet_count() {
    // Alternating tenants 0,1,0,1,...: CAP_RUNS runs measured (each 10 cycles), then the rest
    // of the phase (12 more packets: 6 each, plus the run begun at the cap) is one interval.
    let mut readings = vec![0, 0];
    let mut t = 0;
    for _ in 0..=CAP_RUNS {
        readings.push(t);
        t += 10;
    }
    // The end of the phase: 130 cycles after the last reading, then the batch's end.
    readings.push(t - 10 + 130);
    let (mut c, script) = charge(&readings);
    c.start();
    c.received();
    let total = CAP_RUNS as usize + 1 + 12;
    for i in 0..total {
        c.enter((i % 2) as TenantSlot);
    }
    let (v, f) = fold(&mut c, total as u64);
    assert_eq!(f.capped, 1);
    assert!(script.lock().expect("script").is_empty());
    // Measured: runs 1..=8 (tenants 0,1,0,1,...) at 10 cycles each: 40 each. The tail: the
    // 9th run's packet (tenant 0) and 12 more (6 each): 7 of 13 packets for tenant 0.
    let tail0 = 130 * 7 / 13;
    assert_eq!(v[0].1, 40 + tail0);
    assert_eq!(v[1].1, 40 + (130 - tail0));
    assert_eq!(v[0].2 + v[1].2, total as u64);
}

#[test]
fn packets_without_a_tenant_leave_their_share_unattributed() {
    let (mut c, _script) = charge(&[0, 90, 90, 90]);
    c.start();
    c.received();
    c.enter(NO_TENANT);
    c.enter(2);
    let (v, f) = fold(&mut c, 3);
    // 90 cycles of receive over 3 packets: 30 for tenant 2.
    assert_eq!(v, vec![(2, 30, 1)]);
    assert_eq!(f.unattributed, 60);
}

#[test]
fn slots_are_given_once_and_kept() {
    let mut book = TenantBook::default();
    let a = TenantId::new("a").expect("tenant");
    let b = TenantId::new("b").expect("tenant");
    assert_eq!(book.slot(&a), 0);
    assert_eq!(book.slot(&b), 1);
    assert_eq!(book.slot(&a), 0);
    book.configure(&CpuFairnessConfig {
        mode: CpuFairness::Account,
        weights: vec![(b.clone(), 3)],
    });
    let c = TenantId::new("c").expect("tenant");
    let t = book.table([&b, &b, &a, &c].into_iter());
    assert_eq!(t.vnets, vec![1, 1, 0, NO_TENANT]);
    let t = book.table([&b, &b, &a].into_iter());
    assert_eq!(t.vnets, vec![1, 1, 0]);
    assert_eq!(t.weights, vec![1, 3]);
    assert_eq!(t.slot(&b), 1);
    assert_eq!(t.mode, CpuFairness::Account);
}
