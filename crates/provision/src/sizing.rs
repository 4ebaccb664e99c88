//! How a tunnel is sized for placement: the α the planner packs, from the tunnel's
//! measurements (the usage histograms always get the measurements themselves).
//!
//! The paper packs each tunnel at its last measurement ([`Sizing::Measured`]). A tunnel that
//! just jumped is then packed at its old level for a whole τ, and one that just dipped is
//! packed at its dip, which the next step's rise turns into a hotspot. [`Sizing::Envelope`]
//! packs at the higher of the last two (Protego's default until issue 24);
//! [`Sizing::Adaptive`], the default ([`Defaults::PROTEGO`]), packs each tunnel at its
//! measurement with a headroom predicted from its own history, which the tunnels of a node
//! share ([`crate::forecast`], [`crate::Fill`]). See docs/provisioning.md for what each buys
//! and costs.

use std::collections::{HashMap, VecDeque};

use crate::error::ProvisionError;
use crate::forecast::{ForecastConfig, Forecaster, Prior, ReserveHint};
use crate::ids::TunnelId;
use crate::planner::PlannerConfig;

/// Protego's choices where the paper leaves the caller free, in one place: the simulator's
/// command line, [`crate::SimConfig::protego`] and the live autoscaler's configuration take
/// them from here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Defaults {
    /// How tunnels are sized for placement.
    pub sizing: Sizing,
    /// Whether nodes are drained between consolidations ([`PlannerConfig::drain`]).
    pub drain: bool,
}

impl Defaults {
    /// Adaptive sizing and drain (docs/provisioning.md, "Evaluation on the trace families":
    /// the one setting that keeps the guarantee on every family).
    pub const PROTEGO: Self = Self {
        sizing: Sizing::Adaptive,
        drain: true,
    };
}

/// The usage α a tunnel is given to the planner with, from its measurements (the usage
/// histograms always get the measurements themselves).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sizing {
    /// The last measurement, as the paper does.
    Measured,
    /// The highest of the last `steps` measurements.
    Envelope {
        /// How many measurements, at least 1.
        steps: usize,
    },
    /// The last measurement plus `z` times the tunnel's recent step-to-step variation (the
    /// root of an exponentially weighted mean of squared changes, with `half_life` steps),
    /// capped at the tunnel's cap.
    Headroom {
        /// Standard deviations of headroom, not negative.
        z: f64,
        /// Half-life of the weighting, in measurements (above zero).
        half_life: f64,
    },
    /// The measurement, with a headroom predicted from the tunnel's own rises and shared with
    /// the other tunnels of its node ([`Sizer::spread`]), scaled by a calibrator that aims at
    /// the guarantee target, with an aggregate forecast for the reserve and a prior for
    /// tunnels not measured yet ([`crate::forecast`]).
    Adaptive,
}

impl core::str::FromStr for Sizing {
    type Err = String;

    /// Parses `measured`, `envelope:N` (N ≥ 1), `headroom:Z,H` (Z ≥ 0, H > 0) or `adaptive`.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "sizing `{text}`: expected `measured`, `envelope:N` (N >= 1), `headroom:Z,H` \
                 (Z >= 0, H > 0) or `adaptive`"
            )
        };
        if text == "measured" {
            return Ok(Self::Measured);
        }
        if text == "adaptive" {
            return Ok(Self::Adaptive);
        }
        if let Some(n) = text.strip_prefix("envelope:") {
            let steps: usize = n.trim().parse().map_err(|_| bad())?;
            if steps == 0 {
                return Err(bad());
            }
            return Ok(Self::Envelope { steps });
        }
        if let Some(rest) = text.strip_prefix("headroom:") {
            let (z, h) = rest.split_once(',').ok_or_else(bad)?;
            let z: f64 = z.trim().parse().map_err(|_| bad())?;
            let half_life: f64 = h.trim().parse().map_err(|_| bad())?;
            if !(z.is_finite() && z >= 0.0 && half_life.is_finite() && half_life > 0.0) {
                return Err(bad());
            }
            return Ok(Self::Headroom { z, half_life });
        }
        Err(bad())
    }
}

impl core::fmt::Display for Sizing {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Measured => f.write_str("measured"),
            Self::Envelope { steps } => write!(f, "envelope:{steps}"),
            Self::Headroom { z, half_life } => write!(f, "headroom:{z},{half_life}"),
            Self::Adaptive => f.write_str("adaptive"),
        }
    }
}

/// Turns each tunnel's measurements into the α the planner packs.
///
/// Under every rule it learns the population prior from each tunnel's first measurement
/// ([`Sizer::prior`]: the size of a tunnel not measured yet, issue 24).
///
/// With [`Sizing::Adaptive`], call [`Sizer::observe_step`] once per τ before the step's
/// [`Sizer::size`] calls, and pass [`Sizer::hint`] to [`crate::Planner::plan_with`] (see
/// [`crate::forecast`] for the order); for the other rules those two do nothing.
#[derive(Debug, Clone)]
pub struct Sizer {
    sizing: Sizing,
    tunnels: HashMap<TunnelId, History>,
    forecaster: Option<Forecaster>,
    prior: Prior,
}

/// What a [`Sizer`] keeps of one tunnel.
#[derive(Debug, Clone, Default)]
struct History {
    /// The recent measurements (newest last), for `Envelope`.
    recent: VecDeque<f64>,
    /// The last measurement and the mean squared change, for `Headroom`.
    last: Option<f64>,
    var: f64,
}

impl Sizer {
    /// A sizer that sizes every tunnel by `sizing`; [`Sizing::Adaptive`] gets the parameters
    /// of the default [`PlannerConfig`] (use [`Sizer::for_planner`] for a planner's own).
    pub fn new(sizing: Sizing) -> Self {
        let config = ForecastConfig::from_planner(&PlannerConfig::default())
            .expect("the default planner configuration is valid");
        Self::with_forecast(sizing, config)
    }

    /// A sizer for a planner with `config` (its capacity, T_H, ε, τ, start latency and
    /// guarantee target set [`Sizing::Adaptive`]'s parameters). Errors: with
    /// [`Sizing::Adaptive`], those of [`ForecastConfig::from_planner`]; the other rules use no
    /// forecast and take any configuration.
    pub fn for_planner(sizing: Sizing, config: &PlannerConfig) -> Result<Self, ProvisionError> {
        if sizing != Sizing::Adaptive {
            return Ok(Self::new(sizing));
        }
        Ok(Self::with_forecast(
            sizing,
            ForecastConfig::from_planner(config)?,
        ))
    }

    fn with_forecast(sizing: Sizing, config: ForecastConfig) -> Self {
        Self {
            sizing,
            tunnels: HashMap::new(),
            forecaster: (sizing == Sizing::Adaptive).then(|| Forecaster::new(config)),
            prior: Prior::new(),
        }
    }

    /// The adaptive forecaster, with [`Sizing::Adaptive`].
    pub fn forecaster(&self) -> Option<&Forecaster> {
        self.forecaster.as_ref()
    }

    /// Starts a step with the loads of the active nodes over the step just served and the
    /// tunnels that were on no active node in it ([`Forecaster::observe_step`]); nothing for
    /// the other rules.
    pub fn observe_step(&mut self, loads: impl IntoIterator<Item = f64>, stranded: usize) {
        if let Some(f) = &mut self.forecaster {
            f.observe_step(loads, stranded);
        }
    }

    /// The size of a tunnel with cap `cap` before its first measurement, under every rule:
    /// the population prior ([`Prior::size`]), learned from earlier tunnels' first
    /// measurements.
    pub fn prior(&self, cap: f64) -> f64 {
        self.prior.size(cap)
    }

    /// The nodes the aggregate forecast asks the reserve for ([`Forecaster::hint`]); `None`
    /// for the other rules.
    pub fn hint(&self) -> Option<ReserveHint> {
        self.forecaster.as_ref().and_then(Forecaster::hint)
    }

    /// Its sizing.
    pub fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// Forgets `tunnel` (it was removed).
    pub fn forget(&mut self, tunnel: TunnelId) {
        self.tunnels.remove(&tunnel);
        if let Some(f) = &mut self.forecaster {
            f.forget(tunnel);
        }
    }

    /// Counts a tunnel not measured this step at its last size `size` (cap `cap`) in the
    /// step's aggregate ([`Forecaster::carry`]); nothing for the other rules.
    pub fn carry(&mut self, size: f64, cap: f64) {
        if let Some(f) = &mut self.forecaster {
            f.carry(size, cap);
        }
    }

    /// The headroom the planner adds to `tunnel`'s last size, shared with the other tunnels of
    /// its node ([`Forecaster::spread`], set with [`crate::Cluster::set_spread`]); 0 under the
    /// rules other than [`Sizing::Adaptive`].
    pub fn spread(&self, tunnel: TunnelId) -> f64 {
        self.forecaster.as_ref().map_or(0.0, |f| f.spread(tunnel))
    }

    /// Takes `tunnel`'s new measurement `alpha` (once per τ); returns its size, at most `cap`
    /// (and never below the measurement). A tunnel's first measurement (since it was last
    /// forgotten) also teaches the prior.
    pub fn size(&mut self, tunnel: TunnelId, alpha: f64, cap: f64) -> f64 {
        if let Some(f) = &mut self.forecaster {
            if !f.is_measured(tunnel) {
                self.prior.observe(alpha, cap);
            }
            return f.size(tunnel, alpha, cap);
        }
        let h = self.tunnels.entry(tunnel).or_insert_with(|| {
            self.prior.observe(alpha, cap);
            History::default()
        });
        let sized = match self.sizing {
            Sizing::Measured => alpha,
            Sizing::Envelope { steps } => {
                let recent = &mut h.recent;
                recent.push_back(alpha);
                while recent.len() > steps.max(1) {
                    recent.pop_front();
                }
                recent.iter().copied().fold(alpha, f64::max)
            }
            Sizing::Headroom { z, half_life } => {
                let keep = 0.5f64.powf(1.0 / half_life);
                if let Some(previous) = h.last {
                    let change = alpha - previous;
                    h.var = keep * h.var + (1.0 - keep) * change * change;
                }
                h.last = Some(alpha);
                alpha + z * h.var.sqrt()
            }
            // Sized by the forecaster above.
            Sizing::Adaptive => alpha,
        };
        sized.min(cap).max(alpha.min(cap))
    }
}

/// One of each sizing rule, for the tests that must hold under every rule.
#[cfg(test)]
pub(crate) fn every_rule() -> [Sizing; 4] {
    [
        Sizing::Measured,
        Sizing::Envelope { steps: 2 },
        Sizing::Headroom {
            z: 1.0,
            half_life: 2.0,
        },
        Sizing::Adaptive,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_dips_caps_and_forgetting() {
        let mut s = Sizer::new("envelope:2".parse().unwrap());
        let t = TunnelId(1);
        assert_eq!(s.size(t, 0.2, 1.0), 0.2);
        assert_eq!(s.size(t, 2.0, 1.0), 1.0);
        assert_eq!(s.size(TunnelId(2), 0.3, 1.0), 0.3);
        s.forget(t);
        assert_eq!(s.size(t, 0.05, 1.0), 0.05);
    }

    #[test]
    fn sizing_rules() {
        let mut s = Sizer::new(Sizing::Envelope { steps: 2 });
        assert_eq!(s.size(TunnelId(0), 0.5, 1.5), 0.5);
        assert_eq!(s.size(TunnelId(0), 0.2, 1.5), 0.5);
        assert_eq!(s.size(TunnelId(0), 0.1, 1.5), 0.2);
        let mut s = Sizer::new(Sizing::Headroom {
            z: 2.0,
            half_life: 1.0,
        });
        assert_eq!(s.size(TunnelId(0), 0.5, 1.5), 0.5);
        // One change of 0.5, half weight: variance 0.125, headroom 2 · 0.354.
        let v: f64 = s.size(TunnelId(0), 1.0, 1.5);
        assert!(
            (v - 1.5f64.min(1.0 + 2.0 * 0.125f64.sqrt())).abs() < 1e-12,
            "{v}"
        );
        let mut s = Sizer::new(Sizing::Measured);
        assert_eq!(s.size(TunnelId(0), 0.7, 1.5), 0.7);
    }

    #[test]
    fn every_rule_learns_the_prior_from_first_measurements() {
        // Issue 24: a new tunnel gets the population prior under every rule, not 0.
        for sizing in every_rule() {
            let mut s = Sizer::new(sizing);
            // Before enough tunnels were seen: the cap.
            assert_eq!(s.prior(2.0), 2.0, "{sizing}");
            // 40 tunnels whose first measurements are 0, 0.01, …, 0.39 of their cap: the 95 %
            // quantile is near 0.37.
            for t in 0..40 {
                s.size(TunnelId(t), f64::from(t) * 0.01 * 1.5, 1.5);
            }
            let prior = s.prior(2.0);
            assert!((prior - 0.37 * 2.0).abs() < 0.06, "{sizing}: {prior}");
            // Only first measurements count: later ones of the same tunnels change nothing.
            for t in 0..40 {
                s.size(TunnelId(t), 1.5, 1.5);
            }
            assert_eq!(s.prior(2.0), prior, "{sizing}");
            // A forgotten tunnel that comes back is new again: ten at their caps.
            for t in 0..10 {
                s.forget(TunnelId(t));
                s.size(TunnelId(t), 1.5, 1.5);
            }
            assert!(s.prior(2.0) > prior + 0.2, "{sizing}: {}", s.prior(2.0));
        }
    }

    #[test]
    fn sizing_rules_parse_and_print() {
        for text in ["measured", "envelope:3", "headroom:1.5,4", "adaptive"] {
            let sizing: Sizing = text.parse().unwrap();
            assert_eq!(sizing.to_string(), text);
        }
        assert_eq!(
            " headroom:1.5, 4 ".parse::<Sizing>(),
            Ok(Sizing::Headroom {
                z: 1.5,
                half_life: 4.0
            })
        );
        for bad in [
            "",
            "envelope:0",
            "envelope:x",
            "headroom:1",
            "headroom:-1,2",
            "headroom:1,0",
            "max",
        ] {
            let err = bad.parse::<Sizing>().unwrap_err();
            assert!(err.starts_with("sizing `"), "{bad}: {err}");
        }
    }
}
