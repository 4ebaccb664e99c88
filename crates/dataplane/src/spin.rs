//! Adaptive polling (`[gateway] busy_poll`, `busy_poll_budget`; issue 23 §2): whether a worker
//! looks at its inputs again without sleeping.
//!
//! A sleeping worker pays a wake-up for the next packet (a context switch, `poll`, on a virtual
//! CPU up to a millisecond of latency); a spinning one pays for the polls that find nothing.
//! Spinning is worth it only while traffic comes faster than a wake-up costs, so the worker
//! spins after it last found traffic for twice the mean gap between its wake-ups that found
//! some (at most `busy_poll`): at a high rate the next packet comes within that and no wake-up
//! is paid; at a low one (gaps longer than `busy_poll`) it sleeps at once, so a tunnel at 1 %
//! load does not keep a core busy. The polls that find nothing are counted
//! ([`Spin::spun`], `WorkerStats::spin_ns`) and bounded: in every period of [`PERIOD`] they may
//! take at most `busy_poll_budget` percent of it; past that the worker stops spinning until
//! the next period (it sleeps in `poll` and still wakes for traffic). Pure state over the instants it is given, so the tests drive it with their own
//! clock.

use std::time::{Duration, Instant};

/// The period over which the spin budget is counted.
pub(crate) const PERIOD: Duration = Duration::from_millis(100);
/// Weight of the newest gap in the mean (an exponentially weighted mean over about 8 gaps).
const GAP_WEIGHT: f64 = 0.125;

/// One worker's spinning state.
#[derive(Debug)]
pub(crate) struct Spin {
    /// `busy_poll`: the longest spin (zero: never spin).
    max: Duration,
    /// The most idle polling per [`PERIOD`].
    budget: Duration,
    /// When the worker last found traffic.
    last_work: Option<Instant>,
    /// Mean time between wake-ups that found traffic, ns (None before the second one).
    gap_ns: Option<f64>,
    /// Start of the current budget period.
    period: Instant,
    /// Idle polling in the current period.
    spent: Duration,
}

impl Spin {
    /// A worker's state at `now`: spins at most `max` after traffic, idle polls taking at most
    /// `budget_pct` percent (1..=100) of every period.
    pub(crate) fn new(max: Duration, budget_pct: u8, now: Instant) -> Self {
        let pct = u32::from(budget_pct.clamp(1, 100));
        Self {
            max,
            budget: PERIOD * pct / 100,
            last_work: None,
            gap_ns: None,
            period: now,
            spent: Duration::ZERO,
        }
    }

    /// The worker found traffic at `now`.
    pub(crate) fn worked(&mut self, now: Instant) {
        if let Some(last) = self.last_work {
            let gap = now.saturating_duration_since(last).as_nanos() as f64;
            self.gap_ns = Some(match self.gap_ns {
                Some(mean) => mean + GAP_WEIGHT * (gap - mean),
                None => gap,
            });
        }
        self.last_work = Some(now);
    }

    /// How long to spin after the last traffic: twice the mean gap, at most `busy_poll`; not
    /// at all when the mean gap is longer than `busy_poll` (the next packet would not come
    /// within it).
    fn window(&self) -> Duration {
        match self.gap_ns {
            Some(g) if Duration::from_nanos(g as u64) > self.max => Duration::ZERO,
            Some(g) => Duration::from_nanos((2.0 * g) as u64).min(self.max),
            // Until a gap is known: as configured.
            None => self.max,
        }
    }

    /// Whether the worker should poll again without sleeping at `now`.
    pub(crate) fn spin(&mut self, now: Instant) -> bool {
        if self.max.is_zero() {
            return false;
        }
        if now.saturating_duration_since(self.period) >= PERIOD {
            self.period = now;
            self.spent = Duration::ZERO;
        }
        let Some(last) = self.last_work else {
            return false;
        };
        self.spent < self.budget && now.saturating_duration_since(last) < self.window()
    }

    /// A poll without sleeping that found nothing took `took`: counted against the budget.
    pub(crate) fn spun(&mut self, took: Duration) {
        self.spent += took;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn never_spins_when_off() {
        let t0 = Instant::now();
        let mut s = Spin::new(Duration::ZERO, 100, t0);
        s.worked(t0);
        assert!(!s.spin(t0 + US));
    }

    #[test]
    fn spins_for_twice_the_mean_gap_at_most_busy_poll() {
        let t0 = Instant::now();
        let mut s = Spin::new(200 * US, 100, t0);
        assert!(!s.spin(t0), "no traffic yet: sleep");
        // Traffic every 10 µs: spin up to 20 µs after the last.
        let mut t = t0;
        for _ in 0..32 {
            t += 10 * US;
            s.worked(t);
        }
        assert!(s.spin(t + 15 * US));
        assert!(!s.spin(t + 25 * US), "past twice the gap: sleep");
        // Traffic every 2 ms: the gaps are longer than busy_poll, spinning would not catch
        // the next packet.
        for _ in 0..64 {
            t += 2000 * US;
            s.worked(t);
        }
        assert!(!s.spin(t + US), "a low rate sleeps at once");
    }

    #[test]
    fn idle_polling_stays_within_its_budget_per_period() {
        let t0 = Instant::now();
        // 10 % of 100 ms: 10 ms of idle polling per period.
        let mut s = Spin::new(Duration::from_millis(5), 10, t0);
        let mut t = t0;
        for _ in 0..8 {
            t += 100 * US;
            s.worked(t);
        }
        let mut spun = Duration::ZERO;
        // Traffic keeps coming, each time after 90 µs of fruitless polling.
        while t < t0 + PERIOD / 2 {
            if s.spin(t + 50 * US) {
                s.spun(90 * US);
                spun += 90 * US;
            }
            t += 100 * US;
            s.worked(t);
        }
        assert!(spun <= PERIOD / 10 + 90 * US, "{spun:?}");
        assert!(!s.spin(t + 50 * US), "budget spent: sleep");
        // The next period has a budget again.
        while t < t0 + PERIOD {
            t += 100 * US;
            s.worked(t);
        }
        assert!(s.spin(t + 50 * US));
    }
}
