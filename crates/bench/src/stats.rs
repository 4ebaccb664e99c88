//! Latency statistics: nearest-rank percentiles of one-way delays, and the "added latency"
//! (a percentile minus the median of the baseline path without the gateway's user space).

use serde::Serialize;

/// Percentiles of a latency distribution, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub samples: usize,
}

/// The nearest-rank `q`-quantile (0 < q <= 1) of sorted samples: the smallest value with at
/// least `q` of the samples at or below it. None for no samples.
pub(crate) fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = (q * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Percentiles of `samples_ns` (nanoseconds; sorted in place), in microseconds.
pub(crate) fn percentiles(samples_ns: &mut [u64]) -> Option<Percentiles> {
    samples_ns.sort_unstable();
    let us = |q: f64| quantile(samples_ns, q).map(|v| v as f64 / 1000.0);
    Some(Percentiles {
        p50: us(0.50)?,
        p99: us(0.99)?,
        p999: us(0.999)?,
        max: us(1.0)?,
        samples: samples_ns.len(),
    })
}

impl Percentiles {
    /// These percentiles minus `base_us` (clamped at zero): the latency added to a path whose
    /// typical delay is `base_us`.
    pub fn minus(&self, base_us: f64) -> Percentiles {
        let sub = |v: f64| (v - base_us).max(0.0);
        Percentiles {
            p50: sub(self.p50),
            p99: sub(self.p99),
            p999: sub(self.p999),
            max: sub(self.max),
            samples: self.samples,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&v, 0.5), Some(500));
        assert_eq!(quantile(&v, 0.99), Some(990));
        assert_eq!(quantile(&v, 0.999), Some(999));
        assert_eq!(quantile(&v, 1.0), Some(1000));
        assert_eq!(quantile(&[7], 0.999), Some(7));
        assert_eq!(quantile(&[], 0.5), None);
        // Small sets: the 99th percentile of 10 samples is the largest.
        let w: Vec<u64> = (1..=10).collect();
        assert_eq!(quantile(&w, 0.99), Some(10));
        assert_eq!(quantile(&w, 0.5), Some(5));
    }

    #[test]
    fn percentiles_in_microseconds() {
        let mut v: Vec<u64> = (1..=10_000).rev().map(|i| i * 1000).collect();
        let p = percentiles(&mut v).expect("samples");
        assert_eq!(p.p50, 5000.0);
        assert_eq!(p.p99, 9900.0);
        assert_eq!(p.p999, 9990.0);
        assert_eq!(p.max, 10_000.0);
        assert_eq!(p.samples, 10_000);
        let added = p.minus(6000.0);
        assert_eq!(added.p50, 0.0);
        assert_eq!(added.p99, 3900.0);
        assert!(percentiles(&mut []).is_none());
    }
}
