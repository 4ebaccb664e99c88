//! Per-tunnel usage distributions U_i (the paper's §5.2, "Resource usage distribution of a
//! tunnel"): a histogram of the measured usage α_i over `[0, σ_i]`, fed one sample every τ and
//! kept over a sliding window of the last N samples so that it follows the tunnel.
//!
//! **Bins.** A histogram of `bins` bins is an even lattice on `[0, σ_i]` with both ends
//! included: bin `k` stands for the usage `k · σ_i / (bins − 1)`, and a sample is rounded to
//! the nearest bin. An idle tunnel (α = 0) and a tunnel at its cap (α = σ_i) thus land exactly on
//! their values, and no sample moves by more than half a bin width. A sample above σ_i (a
//! measurement taken while a rate limit was being lowered, or noise) counts as σ_i: the rate
//! limit caps the tunnel there.
//!
//! **Prior.** A histogram without samples (a new tunnel) puts all its mass at σ_i: until it has
//! been measured, a tunnel is assumed to use all it may. This is conservative: the aggregate Y
//! and so the reserve only shrink as measurements come in.
//!
//! Loads are in whatever unit the caller uses for the node capacity (the paper normalizes a
//! node to 1; a simulator may use Gbit/s): this module never looks at the unit.

use std::collections::{BTreeMap, VecDeque};

use crate::error::ProvisionError;
use crate::ids::TunnelId;

/// The default number of bins of a histogram.
pub const DEFAULT_BINS: usize = 100;

/// The default sliding window: one day of samples at τ = 1 minute.
pub const DEFAULT_WINDOW: usize = 1440;

/// The most bins a histogram may have (a sample's bin is kept in 16 bits).
pub const MAX_BINS: usize = 1 << 16;

/// How usage histograms are shaped.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UsageConfig {
    /// Number of bins of each histogram, 2 to [`MAX_BINS`] (default [`DEFAULT_BINS`]).
    pub bins: usize,
    /// Number of most recent samples a histogram holds, at least 1 (default
    /// [`DEFAULT_WINDOW`]). With one sample every τ the histogram covers `window · τ`.
    pub window: usize,
    /// σ for tunnels whose cap was never given (default 0.3, the paper's 1.5 Gbit/s tunnels
    /// on 5 Gbit/s nodes in normalized units).
    pub default_sigma: f64,
}

impl Default for UsageConfig {
    fn default() -> Self {
        Self {
            bins: DEFAULT_BINS,
            window: DEFAULT_WINDOW,
            default_sigma: 0.3,
        }
    }
}

impl UsageConfig {
    /// Checks every field, naming the first that is out of range.
    pub fn validate(&self) -> Result<(), ProvisionError> {
        validate_shape(self.bins, self.window)?;
        validate_sigma(None, self.default_sigma).map_err(|_| ProvisionError::InvalidConfig {
            field: "default_sigma",
            value: self.default_sigma.to_string(),
            reason: "must be finite and above zero",
        })
    }
}

fn validate_shape(bins: usize, window: usize) -> Result<(), ProvisionError> {
    if !(2..=MAX_BINS).contains(&bins) {
        return Err(ProvisionError::InvalidConfig {
            field: "bins",
            value: bins.to_string(),
            reason: "must be from 2 to 65536",
        });
    }
    if window == 0 {
        return Err(ProvisionError::InvalidConfig {
            field: "window",
            value: window.to_string(),
            reason: "must be at least 1 sample",
        });
    }
    Ok(())
}

fn validate_sigma(tunnel: Option<TunnelId>, sigma: f64) -> Result<(), ProvisionError> {
    if sigma.is_finite() && sigma > 0.0 {
        Ok(())
    } else {
        Err(ProvisionError::InvalidSigma {
            tunnel,
            value: sigma,
        })
    }
}

/// The usage distribution U_i of one tunnel (see the module docs for the bins and the prior).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageHistogram {
    /// The tunnel's cap σ_i: the top of the lattice.
    sigma: f64,
    /// Samples per bin within the window; their sum is `recent.len()`.
    counts: Vec<u32>,
    /// The bins of the samples in the window, oldest first.
    recent: VecDeque<u16>,
    /// Most samples kept.
    window: usize,
}

impl UsageHistogram {
    /// An empty histogram (the prior: all mass at σ) for a tunnel capped at `sigma`.
    pub fn new(sigma: f64, bins: usize, window: usize) -> Result<Self, ProvisionError> {
        validate_shape(bins, window)?;
        validate_sigma(None, sigma)?;
        Ok(Self {
            sigma,
            counts: vec![0; bins],
            recent: VecDeque::with_capacity(window.min(4096)),
            window,
        })
    }

    /// An empty histogram shaped by `config`, for a tunnel capped at `sigma`.
    pub fn with_config(sigma: f64, config: &UsageConfig) -> Result<Self, ProvisionError> {
        Self::new(sigma, config.bins, config.window)
    }

    /// The tunnel's cap σ_i.
    pub fn sigma(&self) -> f64 {
        self.sigma
    }

    /// Number of bins.
    pub fn bins(&self) -> usize {
        self.counts.len()
    }

    /// Most samples kept.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Number of samples now in the window (0: the prior is in force).
    pub fn samples(&self) -> usize {
        self.recent.len()
    }

    /// The distance between two bins: `σ_i / (bins − 1)`.
    pub fn step(&self) -> f64 {
        self.sigma / (self.counts.len() - 1) as f64
    }

    /// The usage bin `bin` stands for (`bin · step`, σ_i exactly for the last bin).
    pub fn value(&self, bin: usize) -> f64 {
        if bin + 1 >= self.counts.len() {
            self.sigma
        } else {
            bin as f64 * self.step()
        }
    }

    /// The bin a sample falls in (callers have checked it is finite and not negative).
    fn bin_of(&self, alpha: f64) -> usize {
        let last = self.counts.len() - 1;
        if alpha >= self.sigma {
            return last;
        }
        // Cannot overflow: alpha / step < bins - 1 here.
        ((alpha / self.step()).round() as usize).min(last)
    }

    /// Adds one measured usage α_i, dropping the oldest sample once the window is full.
    /// Rejects a sample that is not finite or is negative; a sample above σ_i counts as σ_i.
    pub fn record(&mut self, alpha: f64) -> Result<(), ProvisionError> {
        check_sample(None, alpha)?;
        let bin = self.bin_of(alpha);
        if self.recent.len() == self.window {
            if let Some(old) = self.recent.pop_front() {
                let count = &mut self.counts[usize::from(old)];
                *count = count.saturating_sub(1);
            }
        }
        // `bin < bins <= MAX_BINS`, so it fits in 16 bits.
        self.recent.push_back(bin as u16);
        self.counts[bin] = self.counts[bin].saturating_add(1);
        Ok(())
    }

    /// Forgets every sample: the prior is in force again.
    pub fn clear(&mut self) {
        self.recent.clear();
        self.counts.iter_mut().for_each(|c| *c = 0);
    }

    /// Changes σ_i (the tunnel's rate limit changed). The samples in the window are kept and
    /// moved to the bin nearest to the usage they stood for on the old lattice (clamped to the
    /// new σ_i).
    pub fn set_sigma(&mut self, sigma: f64) -> Result<(), ProvisionError> {
        validate_sigma(None, sigma)?;
        if sigma == self.sigma {
            return Ok(());
        }
        let old = self.clone();
        self.sigma = sigma;
        self.counts.iter_mut().for_each(|c| *c = 0);
        for slot in self.recent.iter_mut() {
            let bin = {
                let alpha = old.value(usize::from(*slot));
                let last = self.counts.len() - 1;
                if alpha >= sigma {
                    last
                } else {
                    ((alpha / (sigma / last as f64)).round() as usize).min(last)
                }
            };
            *slot = bin as u16;
            self.counts[bin] = self.counts[bin].saturating_add(1);
        }
        Ok(())
    }

    /// The probability of bin `bin` (0 past the last bin). Without samples, the prior: 1 for
    /// the last bin, 0 elsewhere.
    pub fn probability(&self, bin: usize) -> f64 {
        let last = self.counts.len() - 1;
        if bin > last {
            return 0.0;
        }
        if self.recent.is_empty() {
            return if bin == last { 1.0 } else { 0.0 };
        }
        f64::from(self.counts[bin]) / self.recent.len() as f64
    }

    /// The probabilities of all bins, in bin order; they add up to 1.
    pub fn probabilities(&self) -> Vec<f64> {
        (0..self.counts.len())
            .map(|bin| self.probability(bin))
            .collect()
    }

    /// The expected usage `E[U_i]` (σ_i under the prior).
    pub fn mean(&self) -> f64 {
        if self.recent.is_empty() {
            return self.sigma;
        }
        let total: f64 = self
            .counts
            .iter()
            .enumerate()
            .map(|(bin, &count)| f64::from(count) * self.value(bin))
            .sum();
        total / self.recent.len() as f64
    }

    /// The least bin value `v` with `Pr(U_i <= v) >= q` (`q` is clamped to `[0, 1]`; NaN counts
    /// as 1, giving the largest value with mass).
    pub fn quantile(&self, q: f64) -> f64 {
        let q = if q.is_nan() { 1.0 } else { q.clamp(0.0, 1.0) };
        let mut below = 0.0;
        let mut last_with_mass = self.counts.len() - 1;
        for bin in 0..self.counts.len() {
            let p = self.probability(bin);
            if p > 0.0 {
                last_with_mass = bin;
            }
            below += p;
            if p > 0.0 && below >= q - 1e-12 {
                return self.value(bin);
            }
        }
        self.value(last_with_mass)
    }
}

/// Checks that a usage value is finite and not negative, naming the tunnel when known.
pub(crate) fn check_sample(tunnel: Option<TunnelId>, alpha: f64) -> Result<(), ProvisionError> {
    if alpha.is_nan() || alpha.is_infinite() {
        return Err(ProvisionError::InvalidUsage {
            tunnel,
            value: alpha,
            reason: "not a finite number",
        });
    }
    if alpha < 0.0 {
        return Err(ProvisionError::InvalidUsage {
            tunnel,
            value: alpha,
            reason: "negative",
        });
    }
    Ok(())
}

/// The usage histograms of all tunnels, keyed by tunnel, all shaped by one [`UsageConfig`].
///
/// Feed it every τ with [`UsageBook::record`]; give each tunnel its cap with
/// [`UsageBook::set_sigma`] (from its rate limit), or it gets
/// [`UsageConfig::default_sigma`].
#[derive(Debug, Clone)]
pub struct UsageBook {
    config: UsageConfig,
    histograms: BTreeMap<TunnelId, UsageHistogram>,
}

impl UsageBook {
    /// An empty book; rejects an invalid `config`.
    pub fn new(config: UsageConfig) -> Result<Self, ProvisionError> {
        config.validate()?;
        Ok(Self {
            config,
            histograms: BTreeMap::new(),
        })
    }

    /// The shape of the histograms.
    pub fn config(&self) -> &UsageConfig {
        &self.config
    }

    /// Sets the cap σ_i of `tunnel`, creating its histogram (with no samples) if needed.
    pub fn set_sigma(&mut self, tunnel: TunnelId, sigma: f64) -> Result<(), ProvisionError> {
        validate_sigma(Some(tunnel), sigma)?;
        match self.histograms.get_mut(&tunnel) {
            Some(histogram) => {
                histogram
                    .set_sigma(sigma)
                    .map_err(|_| ProvisionError::InvalidSigma {
                        tunnel: Some(tunnel),
                        value: sigma,
                    })
            }
            None => {
                let histogram = UsageHistogram::with_config(sigma, &self.config)?;
                self.histograms.insert(tunnel, histogram);
                Ok(())
            }
        }
    }

    /// Adds one measured usage α_i of `tunnel`, creating its histogram with the default σ if
    /// needed.
    pub fn record(&mut self, tunnel: TunnelId, alpha: f64) -> Result<(), ProvisionError> {
        check_sample(Some(tunnel), alpha)?;
        if !self.histograms.contains_key(&tunnel) {
            let histogram = UsageHistogram::with_config(self.config.default_sigma, &self.config)?;
            self.histograms.insert(tunnel, histogram);
        }
        match self.histograms.get_mut(&tunnel) {
            Some(histogram) => histogram.record(alpha),
            None => Ok(()),
        }
    }

    /// Forgets `tunnel` (it was deleted); returns its histogram.
    pub fn remove(&mut self, tunnel: TunnelId) -> Option<UsageHistogram> {
        self.histograms.remove(&tunnel)
    }

    /// The histogram of `tunnel`, if it has one.
    pub fn get(&self, tunnel: TunnelId) -> Option<&UsageHistogram> {
        self.histograms.get(&tunnel)
    }

    /// All histograms in tunnel order.
    pub fn iter(&self) -> impl Iterator<Item = (TunnelId, &UsageHistogram)> + '_ {
        self.histograms.iter().map(|(&id, h)| (id, h))
    }

    /// Number of tunnels with a histogram.
    pub fn len(&self) -> usize {
        self.histograms.len()
    }

    /// Whether no tunnel has a histogram.
    pub fn is_empty(&self) -> bool {
        self.histograms.is_empty()
    }

    /// The histogram a tunnel without one is assumed to have: no samples, the default σ (so all
    /// mass at the default σ).
    pub fn prior(&self) -> UsageHistogram {
        UsageHistogram {
            sigma: self.config.default_sigma,
            counts: vec![0; self.config.bins],
            recent: VecDeque::new(),
            window: self.config.window,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hist(sigma: f64, bins: usize, window: usize) -> UsageHistogram {
        UsageHistogram::new(sigma, bins, window).unwrap()
    }

    #[test]
    fn prior_puts_all_mass_at_sigma() {
        let h = hist(0.3, 100, 10);
        assert_eq!(h.samples(), 0);
        assert_eq!(h.probability(99), 1.0);
        assert_eq!(h.probabilities().iter().sum::<f64>(), 1.0);
        assert_eq!(h.mean(), 0.3);
        assert_eq!(h.quantile(0.5), 0.3);
    }

    #[test]
    fn samples_round_to_the_nearest_bin_and_clamp_at_sigma() {
        let mut h = hist(1.0, 11, 100);
        h.record(0.0).unwrap();
        h.record(0.04).unwrap();
        h.record(0.06).unwrap();
        h.record(1.0).unwrap();
        h.record(7.5).unwrap();
        assert_eq!(h.probability(0), 0.4);
        assert_eq!(h.probability(1), 0.2);
        assert_eq!(h.probability(10), 0.4);
        assert_eq!(h.value(10), 1.0);
        assert!((h.value(3) - 0.3).abs() < 1e-12);
    }

    #[test]
    fn bad_samples_are_rejected_and_leave_the_histogram_as_it_was() {
        let mut h = hist(0.3, 100, 10);
        for bad in [f64::NAN, f64::INFINITY, -0.01] {
            let err = h.record(bad).unwrap_err();
            assert!(matches!(err, ProvisionError::InvalidUsage { .. }), "{err}");
        }
        assert_eq!(h.samples(), 0);
        let mut book = UsageBook::new(UsageConfig::default()).unwrap();
        let err = book.record(TunnelId(7), -1.0).unwrap_err();
        assert_eq!(err.to_string(), "tunnel7: usage sample -1: negative");
    }

    #[test]
    fn window_slides() {
        let mut h = hist(1.0, 3, 2);
        h.record(0.0).unwrap();
        h.record(0.5).unwrap();
        h.record(1.0).unwrap();
        assert_eq!(h.samples(), 2);
        assert_eq!(h.probabilities(), vec![0.0, 0.5, 0.5]);
        h.record(1.0).unwrap();
        assert_eq!(h.probabilities(), vec![0.0, 0.0, 1.0]);
        h.clear();
        assert_eq!(h.samples(), 0);
        assert_eq!(h.probabilities(), vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn mean_and_quantile() {
        let mut h = hist(1.0, 5, 100);
        for alpha in [0.0, 0.25, 0.25, 1.0] {
            h.record(alpha).unwrap();
        }
        assert!((h.mean() - 0.375).abs() < 1e-12);
        assert_eq!(h.quantile(0.0), 0.0);
        assert_eq!(h.quantile(0.25), 0.0);
        assert_eq!(h.quantile(0.5), 0.25);
        assert_eq!(h.quantile(0.75), 0.25);
        assert_eq!(h.quantile(0.76), 1.0);
        assert_eq!(h.quantile(f64::NAN), 1.0);
    }

    #[test]
    fn set_sigma_rebins_the_window() {
        let mut h = hist(1.0, 11, 10);
        h.record(0.2).unwrap();
        h.record(0.9).unwrap();
        h.set_sigma(0.5).unwrap();
        assert_eq!(h.sigma(), 0.5);
        assert_eq!(h.samples(), 2);
        assert_eq!(h.probability(4), 0.5);
        assert_eq!(h.probability(10), 0.5);
        assert!(h.set_sigma(0.0).is_err());
        assert!(h.set_sigma(f64::NAN).is_err());
    }

    #[test]
    fn config_is_validated() {
        let bad_bins = UsageConfig {
            bins: 1,
            ..UsageConfig::default()
        };
        assert!(matches!(
            bad_bins.validate(),
            Err(ProvisionError::InvalidConfig { field: "bins", .. })
        ));
        let bad_window = UsageConfig {
            window: 0,
            ..UsageConfig::default()
        };
        assert!(matches!(
            bad_window.validate(),
            Err(ProvisionError::InvalidConfig {
                field: "window",
                ..
            })
        ));
        let bad_sigma = UsageConfig {
            default_sigma: -1.0,
            ..UsageConfig::default()
        };
        assert!(matches!(
            bad_sigma.validate(),
            Err(ProvisionError::InvalidConfig {
                field: "default_sigma",
                ..
            })
        ));
        assert!(UsageHistogram::new(0.3, MAX_BINS + 1, 1).is_err());
        assert!(UsageHistogram::new(0.3, MAX_BINS, 1).is_ok());
    }

    #[test]
    fn book_creates_histograms_on_demand() {
        let mut book = UsageBook::new(UsageConfig {
            bins: 4,
            window: 8,
            default_sigma: 0.3,
        })
        .unwrap();
        book.record(TunnelId(1), 0.1).unwrap();
        book.set_sigma(TunnelId(2), 0.6).unwrap();
        assert_eq!(book.len(), 2);
        assert_eq!(book.get(TunnelId(1)).unwrap().sigma(), 0.3);
        assert_eq!(book.get(TunnelId(1)).unwrap().samples(), 1);
        assert_eq!(book.get(TunnelId(2)).unwrap().sigma(), 0.6);
        assert!(book.set_sigma(TunnelId(2), f64::INFINITY).is_err());
        assert_eq!(book.prior().probability(3), 1.0);
        assert!(book.remove(TunnelId(1)).is_some());
        assert!(book.get(TunnelId(1)).is_none());
    }
}
