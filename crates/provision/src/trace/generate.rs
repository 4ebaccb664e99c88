//! The trace generator ([`generate`]) and its seeded PRNG.

use super::params::{BurstHeight, BurstLength, Pareto};
use super::{Trace, TraceError, TraceParams};

/// Generates a trace from `params` and `seed` (see [`TraceParams`]). The same parameters and
/// seed always give the same trace. Each part of the model (weights, groups, variation,
/// bursts, and each optional part) draws from its own stream of the seed, so changing one
/// parameter does not reshuffle the others, and a part that is off draws nothing.
pub fn generate(params: &TraceParams, seed: u64) -> Result<Trace, TraceError> {
    params.validate()?;
    let n = params.tunnels;
    let minutes = params.minutes;
    let day = params.minutes_per_day;
    let caps = params.caps();

    // Per-tunnel mean weights, lognormal with mean 1 (times σ_i / mean σ with mixed caps).
    let mut rng = Rng::stream(seed, 1);
    let sd = params.mean_log_sd;
    let mut weights: Vec<f64> = (0..n)
        .map(|_| (sd * rng.normal() - sd * sd / 2.0).exp())
        .collect();
    if !params.cap_mix.is_empty() {
        let mean_cap = params.cap_total() / n as f64;
        for (w, cap) in weights.iter_mut().zip(&caps) {
            *w *= cap / mean_cap;
        }
    }

    // Tenant groups and their diurnal peaks; per-tunnel diurnal amplitudes.
    let mut rng = Rng::stream(seed, 2);
    let group_of: Vec<usize> = (0..n).map(|_| rng.below(params.groups)).collect();
    let peaks: Vec<f64> = (0..params.groups)
        .map(|_| params.peak_minute + params.peak_spread_minutes * (2.0 * rng.unit() - 1.0))
        .collect();
    let (a_lo, a_hi) = params.diurnal_amplitude;
    let amplitudes: Vec<f64> = (0..n).map(|_| a_lo + (a_hi - a_lo) * rng.unit()).collect();

    // Slow variation: AR(1) with unit variance, one per group and one per tunnel.
    let slow = Ar1::new(params.slow_minutes);
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
    let jsd = params.jitter_sd;
    let mut parts = Parts::new(params, seed, &group_of);

    let mut raw = vec![0.0; n * minutes];
    for t in 0..minutes {
        if t > 0 {
            for g in group_state.iter_mut() {
                *g = slow.next(*g, group_rng.normal());
            }
            for e in own_state.iter_mut() {
                *e = slow.next(*e, own_rng.normal());
            }
        }
        parts.step(t);
        for i in 0..n {
            let g = group_of[i];
            let angle = 2.0 * std::f64::consts::PI * (t as f64 - peaks[g]) / day;
            let diurnal = 1.0 + amplitudes[i] * angle.cos();
            let slow_log = slow_sd * (wg * group_state[g] + wo * own_state[i]);
            let slow = (slow_log - slow_sd * slow_sd / 2.0).exp();
            let jitter = (jsd * jitter_rng.normal() - jsd * jsd / 2.0).exp();
            let burst = &mut bursts[i];
            if burst.0 == 0 && burst_rng.unit() < start_p {
                burst.0 = burst_length(params, &mut burst_rng);
                burst.1 = burst_height(params, &mut burst_rng);
            }
            let factor = if burst.0 > 0 {
                burst.0 -= 1;
                burst.1
            } else {
                1.0
            };
            let mut x = weights[i] * diurnal * slow * jitter * factor;
            if let Some(part) = parts.factor(t, i) {
                x *= part;
            }
            raw[t * n + i] = x;
        }
    }

    let scale = find_scale(&raw, &caps, params.mean_total_gbps * minutes as f64)?;
    let demand: Vec<f64> = raw
        .iter()
        .enumerate()
        .map(|(k, &x)| (scale * x).min(caps[k % n]))
        .collect();
    let ids = (0..n)
        .map(|i| u32::try_from(i).map_err(|_| TraceError::Invalid("too many tunnels".into())))
        .collect::<Result<Vec<u32>, _>>()?;
    let trace = Trace::new(ids, caps, minutes, demand)?;
    match parts.arrivals {
        Some(arrivals) => trace.with_arrivals(arrivals),
        None => Ok(trace),
    }
}

/// The length of a new burst, minutes (at least 1).
fn burst_length(params: &TraceParams, rng: &mut Rng) -> u64 {
    match params.burst_length {
        BurstLength::Geometric => rng.geometric(1.0 / params.burst_minutes),
        BurstLength::Pareto(p) => (rng.pareto(&p).floor() as u64).max(1),
    }
}

/// The factor of a new burst (at least 1).
fn burst_height(params: &TraceParams, rng: &mut Rng) -> f64 {
    match params.burst_height {
        BurstHeight::Uniform => {
            let (lo, hi) = params.burst_factor;
            lo + (hi - lo) * rng.unit()
        }
        BurstHeight::Pareto(p) => 1.0 + rng.pareto(&p),
    }
}

/// An AR(1) process with unit variance and correlation time `minutes`.
#[derive(Debug, Clone, Copy)]
struct Ar1 {
    phi: f64,
    innovation: f64,
}

impl Ar1 {
    fn new(minutes: f64) -> Self {
        let phi = (-1.0 / minutes).exp();
        Self {
            phi,
            innovation: (1.0 - phi * phi).sqrt(),
        }
    }

    /// The next value after `x`, given a standard normal draw.
    fn next(self, x: f64, normal: f64) -> f64 {
        self.phi * x + self.innovation * normal
    }
}

/// A burst in progress: minutes left and its factor.
#[derive(Debug, Clone, Copy)]
struct Burst {
    left: u64,
    factor: f64,
}

/// The state of the optional parts of the model (see [`TraceParams`]); each part that is off
/// is `None` and draws nothing.
struct Parts<'a> {
    params: &'a TraceParams,
    group_of: &'a [usize],
    /// Per tunnel: `Some(on)` for a tunnel that switches on and off.
    on_off: Option<(Rng, Vec<Option<bool>>)>,
    /// Per group: its current burst.
    group_bursts: Option<(Rng, Vec<Burst>)>,
    /// The shared variation (AR(1) state) and its factor this minute.
    global: Option<(Rng, Ar1, f64, f64)>,
    /// Per tunnel: its current level.
    levels: Option<(Rng, Vec<f64>)>,
    /// Per tunnel: its points, one every `HourlyBase::minutes` (tunnel-major).
    hourly: Option<(usize, Vec<f64>)>,
    /// Per tunnel: the minute it arrives (`None`: every tunnel is there from the start).
    arrivals: Option<Vec<usize>>,
}

impl<'a> Parts<'a> {
    fn new(params: &'a TraceParams, seed: u64, group_of: &'a [usize]) -> Self {
        let n = params.tunnels;
        let on_off = params.on_off.map(|o| {
            let mut rng = Rng::stream(seed, 7);
            let chosen = rng.choose(n, o.fraction);
            let p_on = o.on_minutes / (o.on_minutes + o.off_minutes);
            let states = (0..n)
                .map(|i| chosen[i].then(|| rng.unit() < p_on))
                .collect();
            (rng, states)
        });
        let group_bursts = params.group_bursts.map(|_| {
            let idle = Burst {
                left: 0,
                factor: 1.0,
            };
            (Rng::stream(seed, 8), vec![idle; params.groups])
        });
        let global = params.global_shock.map(|g| {
            let mut rng = Rng::stream(seed, 9);
            let x = rng.normal();
            (rng, Ar1::new(g.minutes), x, 1.0)
        });
        let levels = params
            .level_shifts
            .map(|_| (Rng::stream(seed, 10), vec![1.0; n]));
        let hourly = params.hourly_base.map(|h| {
            let mut rng = Rng::stream(seed, 11);
            let points = params.minutes / h.minutes + 2;
            let values = (0..n * points)
                .map(|_| (h.sd * rng.normal() - h.sd * h.sd / 2.0).exp())
                .collect();
            (points, values)
        });
        let arrivals = params.arrivals.map(|a| {
            let mut rng = Rng::stream(seed, 12);
            let chosen = rng.choose(n, a.fraction);
            (0..n)
                .map(|i| {
                    if chosen[i] {
                        1 + rng.below(params.minutes - 1)
                    } else {
                        0
                    }
                })
                .collect()
        });
        Self {
            params,
            group_of,
            on_off,
            group_bursts,
            global,
            levels,
            hourly,
            arrivals,
        }
    }

    /// Advances every part to minute `t` (their state changes once a minute; `t = 0` keeps
    /// the initial state but may start bursts and jumps).
    fn step(&mut self, t: usize) {
        let day = self.params.minutes_per_day;
        if let (Some((rng, states)), Some(o)) = (&mut self.on_off, &self.params.on_off) {
            if t > 0 {
                for on in states.iter_mut().flatten() {
                    let p = if *on {
                        1.0 / o.on_minutes
                    } else {
                        1.0 / o.off_minutes
                    };
                    if rng.unit() < p {
                        *on = !*on;
                    }
                }
            }
        }
        if let (Some((rng, bursts)), Some(g)) = (&mut self.group_bursts, &self.params.group_bursts)
        {
            let start_p = (g.per_day / day).min(1.0);
            let (lo, hi) = g.factor;
            for b in bursts.iter_mut() {
                if b.left > 0 {
                    b.left -= 1;
                }
                if b.left == 0 && rng.unit() < start_p {
                    b.left = rng.geometric(1.0 / g.minutes);
                    b.factor = lo + (hi - lo) * rng.unit();
                }
            }
        }
        if let (Some((rng, ar, x, factor)), Some(g)) = (&mut self.global, &self.params.global_shock)
        {
            if t > 0 {
                *x = ar.next(*x, rng.normal());
            }
            *factor = (g.sd * *x - g.sd * g.sd / 2.0).exp();
        }
        if let (Some((rng, levels)), Some(l)) = (&mut self.levels, &self.params.level_shifts) {
            let jump_p = (l.per_day / day).min(1.0);
            let (lo, hi) = (l.factor.0.ln(), l.factor.1.ln());
            for level in levels.iter_mut() {
                if rng.unit() < jump_p {
                    *level = (lo + (hi - lo) * rng.unit()).exp();
                }
            }
        }
    }

    /// The product of the optional parts for tunnel `i` in minute `t` (after [`Self::step`]),
    /// or `None` when every part is off.
    fn factor(&self, t: usize, i: usize) -> Option<f64> {
        let mut x = None::<f64>;
        let mut times = |f: f64| x = Some(x.unwrap_or(1.0) * f);
        if let Some((_, states)) = &self.on_off {
            if states[i] == Some(false) {
                times(0.0);
            }
        }
        if let Some((_, bursts)) = &self.group_bursts {
            let b = bursts[self.group_of[i]];
            times(if b.left > 0 { b.factor } else { 1.0 });
        }
        if let Some((_, _, _, factor)) = &self.global {
            times(*factor);
        }
        if let Some((_, levels)) = &self.levels {
            times(levels[i]);
        }
        if let (Some((points, values)), Some(h)) = (&self.hourly, &self.params.hourly_base) {
            let (k, into) = (t / h.minutes, (t % h.minutes) as f64 / h.minutes as f64);
            let v = &values[i * points..(i + 1) * points];
            times(v[k] * (1.0 - into) + v[k + 1] * into);
        }
        if let Some(arrivals) = &self.arrivals {
            if t < arrivals[i] {
                times(0.0);
            }
        }
        x
    }
}

/// The scale `s` with `Σ min(cap, s · x) = target` (the sum is continuous and increasing in
/// `s` up to where every value is capped), by bisection; `raw` is minute-major and `caps`
/// has one cap per tunnel.
fn find_scale(raw: &[f64], caps: &[f64], target: f64) -> Result<f64, TraceError> {
    let n = caps.len();
    let total = |s: f64| {
        raw.iter()
            .enumerate()
            .map(|(k, &x)| (s * x).min(caps[k % n]))
            .sum::<f64>()
    };
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

/// The increment of SplitMix64's state.
const SPLITMIX_GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// One output of SplitMix64 (Steele, Lea and Flood) from state `x`: the state advanced by its
/// increment, then mixed. A bijection of `u64`, so distinct inputs give distinct outputs.
pub(crate) fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
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
            let z = splitmix64(x);
            x = x.wrapping_add(SPLITMIX_GAMMA);
            z
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

    /// A draw of a cut Pareto law (see [`Pareto`]).
    pub(crate) fn pareto(&mut self, p: &Pareto) -> f64 {
        let u = 1.0 - self.unit(); // in (0, 1]
        (p.scale * u.powf(-1.0 / p.shape)).min(p.max)
    }

    /// Which of `n` items to take: `round(fraction · n)` of them, chosen uniformly at random
    /// (a partial Fisher–Yates shuffle).
    pub(crate) fn choose(&mut self, n: usize, fraction: f64) -> Vec<bool> {
        let take = ((fraction * n as f64).round() as usize).min(n);
        let mut order: Vec<usize> = (0..n).collect();
        for k in 0..take {
            let j = k + self.below(n - k);
            order.swap(k, j);
        }
        let mut chosen = vec![false; n];
        for &i in &order[..take] {
            chosen[i] = true;
        }
        chosen
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

#[cfg(test)]
mod tests;
