//! The cycle counter the CPU charge reads (issue 18 §3, docs/architecture.md "CPU charge"):
//! the time-stamp counter (`rdtsc`) on x86-64, a monotonic nanosecond clock elsewhere, behind
//! the [`Cycles`] trait so tests script the readings. Cycles are converted to nanoseconds only
//! for display, with a frequency calibrated once against `CLOCK_MONOTONIC`
//! ([`cycles_per_ns`]).
//!
//! Why `rdtsc` and not `rdtscp` or `clock_gettime`: measured on the development VM (AMD EPYC,
//! `constant_tsc nonstop_tsc`), `rdtsc` costs 14–20 ns, `rdtscp` 24–35 ns and the vDSO's
//! `clock_gettime` 30–41 ns. The charge does not need the serialization `rdtscp` adds: an
//! interval of many packets tolerates a few reordered instructions at its ends.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A source of cycle counter readings (monotonic per thread, in arbitrary cycles).
pub(crate) trait Cycles: Send {
    /// The current reading.
    fn now(&mut self) -> u64;

    /// The CPU time the calling thread has run so far, in the same cycles, if this source can
    /// tell it (the charge compares it with the counter to find the time the thread was
    /// preempted; a source that cannot tell is taken to run all the time).
    fn cpu(&mut self) -> Option<u64> {
        None
    }
}

/// The CPU's time-stamp counter (x86-64), or nanoseconds since the process started elsewhere.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Tsc;

impl Cycles for Tsc {
    #[inline]
    fn now(&mut self) -> u64 {
        read()
    }

    /// `CLOCK_THREAD_CPUTIME_ID` (a system call, about 0.5 µs on the development VM: the
    /// charge reads it once per millisecond, not per batch), converted at the calibrated rate.
    fn cpu(&mut self) -> Option<u64> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
            return None;
        }
        let ns = u64::try_from(ts.tv_sec).ok()?.checked_mul(1_000_000_000)?;
        let ns = ns.checked_add(u64::try_from(ts.tv_nsec).ok()?)?;
        Some(from_ns(ns))
    }
}

/// One reading of the time-stamp counter.
#[cfg(target_arch = "x86_64")]
#[inline]
fn read() -> u64 {
    // SAFETY: `rdtsc` is part of x86-64's base instruction set; it reads a register and has
    // no memory effects.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Nanoseconds since the first reading (no portable cycle counter).
#[cfg(not(target_arch = "x86_64"))]
#[inline]
fn read() -> u64 {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The `/proc/cpuinfo` flags the charge needs of the counter: a rate that does not change
/// with the CPU's frequency (`constant_tsc`) and does not stop in idle states (`nonstop_tsc`).
const NEEDED_FLAGS: [&str; 2] = ["constant_tsc", "nonstop_tsc"];

/// Why this machine's cycle counter cannot measure the CPU charge, if it cannot: a flag of
/// [`NEEDED_FLAGS`] missing, or a calibrated rate outside 0.1–100 cycles per nanosecond.
pub(crate) fn unusable() -> Option<String> {
    if cfg!(target_arch = "x86_64") {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let missing = missing_flags(&cpuinfo);
        if !missing.is_empty() {
            return Some(format!(
                "this machine's time-stamp counter lacks {} in /proc/cpuinfo, so it cannot \
                 measure CPU time per tenant (use \"off\")",
                missing.join(" and ")
            ));
        }
    }
    let rate = cycles_per_ns();
    if !(0.1..=100.0).contains(&rate) {
        return Some(format!(
            "the cycle counter ran at {rate:.3} cycles per nanosecond when calibrated, which is \
             not a clock rate (use \"off\")"
        ));
    }
    None
}

/// The flags of [`NEEDED_FLAGS`] the first processor of `cpuinfo` (`/proc/cpuinfo`'s text)
/// does not list.
fn missing_flags(cpuinfo: &str) -> Vec<&'static str> {
    let flags: Vec<&str> = cpuinfo
        .lines()
        .find_map(|l| {
            let (key, value) = l.split_once(':')?;
            (key.trim() == "flags").then(|| value.split_whitespace().collect())
        })
        .unwrap_or_default();
    NEEDED_FLAGS
        .into_iter()
        .filter(|f| !flags.contains(f))
        .collect()
}

/// How long the calibration measures (twice, the faster rate of the two kept: the counter's
/// interval lies inside the clock's, so a preemption between a clock read and a counter read
/// only lowers the rate).
const CALIBRATION: Duration = Duration::from_millis(10);

/// Cycles of [`Tsc`] per nanosecond, measured once per process against `CLOCK_MONOTONIC`
/// (blocks for about 20 ms on the first call). Always positive.
pub(crate) fn cycles_per_ns() -> f64 {
    static RATE: OnceLock<f64> = OnceLock::new();
    *RATE.get_or_init(|| {
        let once = || {
            let (t0, c0) = (Instant::now(), read());
            std::thread::sleep(CALIBRATION);
            let (c1, t1) = (read(), Instant::now());
            let ns = t1.duration_since(t0).as_nanos() as f64;
            c1.saturating_sub(c0) as f64 / ns.max(1.0)
        };
        let rate = once().max(once());
        if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        }
    })
}

/// `cycles` in nanoseconds at the calibrated rate.
pub(crate) fn to_ns(cycles: u64) -> u64 {
    (cycles as f64 / cycles_per_ns()) as u64
}

/// `ns` nanoseconds in cycles at the calibrated rate.
pub(crate) fn from_ns(ns: u64) -> u64 {
    (ns as f64 * cycles_per_ns()) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_counter_advances_and_calibrates() {
        let mut tsc = Tsc;
        let a = tsc.now();
        std::thread::sleep(Duration::from_millis(1));
        let b = tsc.now();
        assert!(b > a);
        let rate = cycles_per_ns();
        assert!(rate > 0.0 && rate.is_finite());
        assert_eq!(to_ns(0), 0);
    }

    #[test]
    fn the_threads_cpu_time_advances_while_it_runs_not_while_it_sleeps() {
        let mut tsc = Tsc;
        let a = tsc.cpu().expect("thread CPU time");
        std::thread::sleep(Duration::from_millis(20));
        let b = tsc.cpu().expect("thread CPU time");
        // Asleep for 20 ms: far less than that of CPU time.
        assert!(b >= a && b - a < from_ns(10_000_000), "{a} → {b}");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let c = tsc.cpu().expect("thread CPU time");
        assert!(c > b, "{b} → {c}");
    }

    #[test]
    fn a_counter_without_a_constant_rate_is_named() {
        let ok = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc nonstop_tsc tsc_known_freq\n\n\
                  processor\t: 1\nflags\t\t: fpu\n";
        assert!(missing_flags(ok).is_empty());
        let old = "processor\t: 0\nflags\t\t: fpu tsc constant_tsc\n";
        assert_eq!(missing_flags(old), ["nonstop_tsc"]);
        assert_eq!(missing_flags(""), ["constant_tsc", "nonstop_tsc"]);
    }
}
