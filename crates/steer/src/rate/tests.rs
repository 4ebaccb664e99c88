//! Token bucket arithmetic with exact expectations, and the per-tunnel map.

use super::*;
use proptest::prelude::*;
use std::time::Duration;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Admits 1-byte packets until one is refused; returns how many passed.
fn drain_bytes(b: &mut TokenBucket, now: Instant) -> u64 {
    let mut n = 0;
    while b.admit(now, 1) {
        n += 1;
        assert!(n <= 10_000_000, "bucket never empties");
    }
    n
}

#[test]
fn eight_mbit_refills_exactly_one_kilobyte_per_millisecond() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::mbit(8, 1500));
    assert!(b.admit(t0, 1500));
    assert!(!b.admit(t0, 1));
    assert_eq!(drain_bytes(&mut b, t0 + ms(1)), 1000);
    assert_eq!(drain_bytes(&mut b, t0 + Duration::from_micros(1500)), 500);
    // One 1000-byte packet fits after another millisecond, a 1001-byte one does not.
    assert!(!b.admit(t0 + Duration::from_micros(2500), 1001));
    assert!(b.admit(t0 + Duration::from_micros(2500), 1000));
    assert_eq!(b.available_bytes(t0 + Duration::from_micros(2500)), 0);
}

#[test]
fn refill_stops_at_the_burst() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::mbit(8, 1500));
    assert!(b.admit(t0, 1500));
    assert_eq!(b.available_bytes(t0 + Duration::from_secs(10)), 1500);
    assert!(!b.admit(t0 + Duration::from_secs(10), 1501));
    assert!(b.admit(t0 + Duration::from_secs(10), 1500));
    assert!(!b.admit(t0 + Duration::from_secs(10), 1));
}

#[test]
fn sub_byte_credit_carries_over() {
    // 1 bit/s: one byte per 8 s, no matter how the time is cut.
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::new(1, 1));
    assert!(b.admit(t0, 1));
    for step in 1..8_000u64 {
        assert!(!b.admit(t0 + ms(step), 1), "at {step} ms");
    }
    assert!(b.admit(t0 + ms(8_000), 1));
    assert!(!b.admit(t0 + ms(8_000), 1));
}

#[test]
fn zero_rate_admits_nothing() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::new(0, 1_000_000));
    assert!(!b.admit(t0, 1));
    assert!(!b.admit(t0, 0));
    assert!(!b.admit(t0 + Duration::from_secs(3600), 1));
    assert_eq!(b.available_bytes(t0 + Duration::from_secs(3600)), 0);
}

#[test]
fn zero_burst_admits_only_empty_packets() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::mbit(1000, 0));
    assert!(!b.admit(t0 + ms(5), 1));
    assert!(b.admit(t0 + ms(5), 0));
}

#[test]
fn huge_rates_and_bursts_do_not_overflow() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::new(u64::MAX, u64::MAX));
    assert!(b.admit(t0, usize::MAX));
    assert_eq!(b.available_bytes(t0), u64::MAX - usize::MAX as u64);
    let far = t0 + Duration::from_secs(100 * 365 * 24 * 3600);
    assert_eq!(b.available_bytes(far), u64::MAX);
    assert!(b.admit(far, usize::MAX));

    // u64::MAX bit/s refills 2.3 GB per nanosecond, capped at the burst.
    let mut b = TokenBucket::new(RateLimit::new(u64::MAX, 9000));
    assert!(b.admit(t0, 9000));
    assert!(!b.admit(t0, 1));
    assert_eq!(b.available_bytes(t0 + Duration::from_nanos(1)), 9000);
    assert!(RateLimit::mbit(u64::MAX, 1).bits_per_second == u64::MAX);
}

#[test]
fn time_going_backwards_refills_nothing() {
    let t0 = Instant::now();
    let t1 = t0 + ms(1);
    let mut b = TokenBucket::new(RateLimit::mbit(8, 1500));
    assert!(b.admit(t1, 1500));
    // An earlier instant: no panic, no credit, and the clock stays at t1.
    assert!(!b.admit(t0, 1));
    assert_eq!(b.available_bytes(t0), 0);
    assert_eq!(b.available_bytes(t1), 0);
    assert_eq!(drain_bytes(&mut b, t1 + ms(1)), 1000);
}

#[test]
fn set_limit_accrues_old_rate_then_cuts_to_new_burst() {
    let t0 = Instant::now();
    let mut b = TokenBucket::new(RateLimit::mbit(8, 10_000));
    assert!(b.admit(t0, 10_000));
    // 2 ms at 8 Mbit/s = 2000 bytes, then the burst shrinks to 1500.
    b.set_limit(t0 + ms(2), RateLimit::mbit(80, 1500));
    assert_eq!(b.limit(), RateLimit::mbit(80, 1500));
    assert_eq!(b.available_bytes(t0 + ms(2)), 1500);
    assert!(b.admit(t0 + ms(2), 1500));
    // Now 10 kB per ms, up to 1500.
    assert_eq!(
        b.available_bytes(t0 + ms(2) + Duration::from_micros(100)),
        1000
    );
    // Blocking takes effect at once.
    b.set_limit(t0 + ms(3), RateLimit::new(0, 1500));
    assert!(!b.admit(t0 + ms(4), 1));
}

proptest! {
    /// Draining greedily at arbitrary instants admits exactly the burst plus
    /// floor(elapsed · rate / 8e9) bytes: no credit is lost or invented by rounding.
    #[test]
    fn no_drift(rate in 1u64..10_000_000_000, steps in prop::collection::vec(0u64..1_000_000, 1..200)) {
        let t0 = Instant::now();
        let burst = 1_000_000_000;
        let mut b = TokenBucket::new(RateLimit::new(rate, burst));
        prop_assert!(b.admit(t0, burst as usize));
        let (mut t, mut elapsed, mut total) = (t0, 0u128, 0u128);
        for step in steps {
            t += Duration::from_nanos(step);
            elapsed += u128::from(step);
            let n = b.available_bytes(t);
            prop_assert!(b.admit(t, n as usize));
            prop_assert!(!b.admit(t, 1));
            total += u128::from(n);
        }
        prop_assert_eq!(total, elapsed * u128::from(rate) / 8_000_000_000);
    }
}

#[test]
fn limiters_count_per_tunnel() {
    let t0 = Instant::now();
    let mut l = RateLimiters::new();
    let (a, b, free) = (TunnelId(1), TunnelId(2), TunnelId(3));
    l.set_limit(a, t0, RateLimit::mbit(8, 1500));
    l.set_limit(b, t0, RateLimit::new(0, 1500));
    assert_eq!(l.len(), 2);
    assert!(l.admit(a, t0, 1000));
    assert!(!l.admit(a, t0, 1000));
    assert!(l.admit(a, t0 + ms(1), 1000));
    assert!(!l.admit(b, t0, 64));
    assert!(l.admit(free, t0, 9000));
    assert!(l.admit(free, t0, 9000));
    assert_eq!(
        l.counters(a),
        Some(TunnelCounters {
            admitted_packets: 2,
            admitted_bytes: 2000,
            dropped_packets: 1,
            dropped_bytes: 1000
        })
    );
    assert_eq!(
        l.counters(b),
        Some(TunnelCounters {
            admitted_packets: 0,
            admitted_bytes: 0,
            dropped_packets: 1,
            dropped_bytes: 64
        })
    );
    assert_eq!(l.counters(free), None);
    assert_eq!(l.unlimited().admitted_packets, 2);
    assert_eq!(l.unlimited().admitted_bytes, 18_000);

    // Changing a limit keeps counters and credit.
    l.set_limit(a, t0 + ms(1), RateLimit::mbit(16, 3000));
    assert_eq!(l.limit(a), Some(RateLimit::mbit(16, 3000)));
    assert_eq!(l.counters(a).unwrap().admitted_packets, 2);
    // 500 bytes were left at 1 ms; 2000 more accrue by 2 ms.
    assert!(!l.admit(a, t0 + ms(1), 501));
    assert!(l.admit(a, t0 + ms(2), 2500));

    let mut seen: Vec<_> = l.iter().map(|(t, _, _)| t).collect();
    seen.sort();
    assert_eq!(seen, vec![a, b]);
    assert_eq!(l.remove(b).unwrap().dropped_packets, 1);
    assert_eq!(l.remove(b), None);
    assert!(!l.is_empty());
}
