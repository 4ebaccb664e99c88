//! How a tunnel is sized for placement: the α the planner packs, from the tunnel's
//! measurements (the usage histograms always get the measurements themselves).
//!
//! The paper packs each tunnel at its last measurement ([`Sizing::Measured`]). A tunnel that
//! just jumped is then packed at its old level for a whole τ, and one that just dipped is
//! packed at its dip, which the next step's rise turns into a hotspot. Protego's default
//! ([`Sizing::Envelope`] of the last two measurements) packs at the higher of the two; see
//! docs/provisioning.md for what it buys and costs.

use std::collections::{HashMap, VecDeque};

use crate::ids::TunnelId;

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
}

impl core::str::FromStr for Sizing {
    type Err = String;

    /// Parses `measured`, `envelope:N` (N ≥ 1) or `headroom:Z,H` (Z ≥ 0, H > 0).
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let bad = || {
            format!(
                "sizing `{text}`: expected `measured`, `envelope:N` (N >= 1) or `headroom:Z,H` \
                 (Z >= 0, H > 0)"
            )
        };
        if text == "measured" {
            return Ok(Self::Measured);
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
        }
    }
}

/// Turns each tunnel's measurements into the α the planner packs.
#[derive(Debug, Clone)]
pub struct Sizer {
    sizing: Sizing,
    tunnels: HashMap<TunnelId, History>,
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
    /// A sizer that sizes every tunnel by `sizing`.
    pub fn new(sizing: Sizing) -> Self {
        Self {
            sizing,
            tunnels: HashMap::new(),
        }
    }

    /// Its sizing.
    pub fn sizing(&self) -> Sizing {
        self.sizing
    }

    /// Forgets `tunnel` (it was removed).
    pub fn forget(&mut self, tunnel: TunnelId) {
        self.tunnels.remove(&tunnel);
    }

    /// Takes `tunnel`'s new measurement `alpha` (once per τ); returns its size, at most `cap`
    /// (and never below the measurement).
    pub fn size(&mut self, tunnel: TunnelId, alpha: f64, cap: f64) -> f64 {
        let h = self.tunnels.entry(tunnel).or_default();
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
        };
        sized.min(cap).max(alpha.min(cap))
    }
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
    fn sizing_rules_parse_and_print() {
        for text in ["measured", "envelope:3", "headroom:1.5,4"] {
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
