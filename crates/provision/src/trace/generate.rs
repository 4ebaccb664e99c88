//! The trace generator ([`generate`]) and its seeded PRNG.

use super::{Trace, TraceError, TraceParams};

/// Generates a trace from `params` and `seed` (see [`TraceParams`]). The same parameters and
/// seed always give the same trace. Each part of the model (weights, groups, variation,
/// bursts) draws from its own stream of the seed, so changing one parameter does not reshuffle
/// the others.
pub fn generate(params: &TraceParams, seed: u64) -> Result<Trace, TraceError> {
    params.validate()?;
    let n = params.tunnels;
    let minutes = params.minutes;
    let day = params.minutes_per_day;

    // Per-tunnel mean weights, lognormal with mean 1.
    let mut rng = Rng::stream(seed, 1);
    let sd = params.mean_log_sd;
    let weights: Vec<f64> = (0..n)
        .map(|_| (sd * rng.normal() - sd * sd / 2.0).exp())
        .collect();

    // Tenant groups and their diurnal peaks; per-tunnel diurnal amplitudes.
    let mut rng = Rng::stream(seed, 2);
    let group_of: Vec<usize> = (0..n).map(|_| rng.below(params.groups)).collect();
    let peaks: Vec<f64> = (0..params.groups)
        .map(|_| params.peak_minute + params.peak_spread_minutes * (2.0 * rng.unit() - 1.0))
        .collect();
    let (a_lo, a_hi) = params.diurnal_amplitude;
    let amplitudes: Vec<f64> = (0..n).map(|_| a_lo + (a_hi - a_lo) * rng.unit()).collect();

    // Slow variation: AR(1) with unit variance, one per group and one per tunnel.
    let phi = (-1.0 / params.slow_minutes).exp();
    let innovation = (1.0 - phi * phi).sqrt();
    let c = params.group_correlation;
    let (wg, wo) = (c.sqrt(), (1.0 - c).sqrt());
    let slow_sd = params.slow_sd;
    let mut group_rng = Rng::stream(seed, 3);
    let mut own_rng = Rng::stream(seed, 4);
    let mut jitter_rng = Rng::stream(seed, 5);
    let mut burst_rng = Rng::stream(seed, 6);
    let mut group_state: Vec<f64> = (0..params.groups).map(|_| group_rng.normal()).collect();
    let mut own_state: Vec<f64> = (0..n).map(|_| own_rng.normal()).collect();
    // Remaining minutes and factor of each tunnel's current burst.
    let mut bursts: Vec<(u64, f64)> = vec![(0, 1.0); n];
    let start_p = (params.bursts_per_day / day).min(1.0);
    let end_p = 1.0 / params.burst_minutes;
    let (b_lo, b_hi) = params.burst_factor;
    let jsd = params.jitter_sd;

    let mut raw = vec![0.0; n * minutes];
    for t in 0..minutes {
        if t > 0 {
            for g in group_state.iter_mut() {
                *g = phi * *g + innovation * group_rng.normal();
            }
            for e in own_state.iter_mut() {
                *e = phi * *e + innovation * own_rng.normal();
            }
        }
        for i in 0..n {
            let g = group_of[i];
            let angle = 2.0 * std::f64::consts::PI * (t as f64 - peaks[g]) / day;
            let diurnal = 1.0 + amplitudes[i] * angle.cos();
            let slow_log = slow_sd * (wg * group_state[g] + wo * own_state[i]);
            let slow = (slow_log - slow_sd * slow_sd / 2.0).exp();
            let jitter = (jsd * jitter_rng.normal() - jsd * jsd / 2.0).exp();
            let burst = &mut bursts[i];
            if burst.0 == 0 && burst_rng.unit() < start_p {
                burst.0 = burst_rng.geometric(end_p);
                burst.1 = b_lo + (b_hi - b_lo) * burst_rng.unit();
            }
            let factor = if burst.0 > 0 {
                burst.0 -= 1;
                burst.1
            } else {
                1.0
            };
            raw[t * n + i] = weights[i] * diurnal * slow * jitter * factor;
        }
    }

    let cap = params.cap_gbps;
    let scale = find_scale(&raw, cap, params.mean_total_gbps * minutes as f64)?;
    let demand: Vec<f64> = raw.iter().map(|&x| (scale * x).min(cap)).collect();
    let ids = (0..n)
        .map(|i| u32::try_from(i).map_err(|_| TraceError::Invalid("too many tunnels".into())))
        .collect::<Result<Vec<u32>, _>>()?;
    Trace::new(ids, vec![cap; n], minutes, demand)
}

/// The scale `s` with `Σ min(cap, s · x) = target` (the sum is continuous and increasing in
/// `s` up to where every value is capped), by bisection.
fn find_scale(raw: &[f64], cap: f64, target: f64) -> Result<f64, TraceError> {
    let total = |s: f64| raw.iter().map(|&x| (s * x).min(cap)).sum::<f64>();
    let mut hi = 1.0;
    let mut grown = 0;
    while total(hi) < target {
        hi *= 2.0;
        grown += 1;
        if grown > 200 {
            return Err(TraceError::Invalid(
                "the mean aggregate cannot be reached under the caps".into(),
            ));
        }
    }
    let mut lo = 0.0;
    for _ in 0..100 {
        let mid = 0.5 * (lo + hi);
        if total(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok(hi)
}

/// xoshiro256\*\* (Blackman and Vigna), seeded by SplitMix64: small, fast and of good
/// statistical quality; not for cryptography.
#[derive(Debug, Clone)]
pub(crate) struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator seeded from `seed` through SplitMix64.
    pub(crate) fn new(seed: u64) -> Self {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// Stream `stream` of `seed`: an independent generator per purpose.
    pub(crate) fn stream(seed: u64, stream: u64) -> Self {
        Self::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub(crate) fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (0 for `n = 0`).
    pub(crate) fn below(&mut self, n: usize) -> usize {
        ((self.unit() * n as f64) as usize).min(n.saturating_sub(1))
    }

    /// Standard normal (Box–Muller).
    pub(crate) fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // in (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    /// Geometric on `1, 2, …` with success probability `p` in `(0, 1]` (mean `1 / p`).
    pub(crate) fn geometric(&mut self, p: f64) -> u64 {
        if p >= 1.0 || p.is_nan() || p <= 0.0 {
            return 1;
        }
        let u = 1.0 - self.unit(); // in (0, 1]
        let k = (u.ln() / (1.0 - p).ln()).floor();
        1 + (k.min(1e12) as u64)
    }
}
