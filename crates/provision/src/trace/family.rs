//! Trace families ([`TraceFamily`]): the generator presets the provisioning simulator is
//! evaluated on, and the seeds each may be run with ([`Role`], [`TraceFamily::seed`]).
//!
//! A policy tuned on one generator may only have learnt that generator. So the simulator is
//! judged on several families that stress different things, all with the paper's load (a mean
//! aggregate of 57.5 / 255 of the sum of the caps, [`LOAD_RATIO`], so savings compare), and
//! all but `paper` with about 10 % of the tunnels arriving during the trace. The seeds are
//! split by role so that the seeds a setting is tuned on are never the ones it is reported
//! on, and the held-out family has no seed to tune on at all.
//!
//! Every family is one day long (1440 minutes); for an evaluation that warms up on day 1 and
//! scores day 2, set [`TraceParams::minutes`] to 2880 (every family supports it).

use core::fmt;
use core::str::FromStr;

use super::params::{
    Arrivals, BurstHeight, BurstLength, GlobalShock, GroupBursts, HourlyBase, LevelShifts, OnOff,
    Pareto,
};
use super::{generate::splitmix64, TraceError, TraceParams};

/// The paper's load: its mean aggregate (57.5 Gbit/s) over the sum of its caps (170 tunnels
/// of 1.5 Gbit/s, 255 Gbit/s). Every family has this ratio.
pub const LOAD_RATIO: f64 = 57.5 / 255.0;

/// Share of the tunnels that arrive during the trace, in every family but `paper`.
const ARRIVING: f64 = 0.1;

/// A family of generated traces (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TraceFamily {
    /// [`TraceParams::paper`], unchanged: the paper's statistics with the project's own
    /// assumptions for the rest. The baseline every result so far was measured on.
    Paper,
    /// Heavy tails and fast change: per-minute jitter of log-sd 0.35 (0.1 in `paper`); 12
    /// bursts a day per tunnel whose length is Pareto (1 minute and up, shape 1.5, cut at 120)
    /// and whose factor is 1 + Pareto (0.5 and up, shape 1.3, cut at 20), so most bursts are
    /// short and mild and a few are long or reach the cap; slow variation of log-sd 0.5 with
    /// a 5-minute correlation time; 20 % of the tunnels switch on and off (on 30 minutes, off
    /// 90 minutes on average). It stresses sizing by the last measurement: the next minute is
    /// often far from the last one.
    Bursty,
    /// Tunnels that move together: 4 tenant groups (12 in `paper`) whose slow variation is
    /// correlated 0.9 (0.5), peaks within ±30 minutes of 14:00 (±3 h), diurnal amplitudes of
    /// 0.5–0.9 (0.1–0.5); every group bursts as one 3 times a day (15 minutes on average,
    /// ×2–3), and one slow variation of log-sd 0.2 and 60-minute correlation time moves every
    /// tunnel. It stresses the reserve: an aggregate that rises all at once, which a sum of
    /// independent tunnels underestimates.
    Together,
    /// Mechanisms absent from the others, for one final run: 240 tunnels with mixed caps
    /// (0.5, 1.25 and 1.5 Gbit/s in turn); levels that jump 4 times a day per tunnel to
    /// ×0.3–3 (log-uniform) and stay; a base interpolated between random hourly points
    /// (log-sd 0.4), as the paper describes its trace by hourly means, under per-minute
    /// jitter of log-sd 0.15; 8 groups correlated 0.6, diurnal amplitudes 0.2–0.6 peaking
    /// around 10:00 ± 4 h; slow variation of log-sd 0.2 over 30 minutes; 3 bursts a day of 5
    /// minutes at ×1.5–3. Its seeds exist only for [`Role::HeldOut`].
    HeldOut,
}

/// What a seed is for (see [`TraceFamily::seed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Choosing settings: the only seeds a setting may be tried on.
    Tune = 1,
    /// Reporting the chosen settings, never used while choosing them.
    Report = 2,
    /// The held-out family's single final run.
    HeldOut = 3,
}

impl TraceFamily {
    /// Every family, in the order above.
    pub const ALL: [TraceFamily; 4] = [
        TraceFamily::Paper,
        TraceFamily::Bursty,
        TraceFamily::Together,
        TraceFamily::HeldOut,
    ];

    /// The family's name: `paper`, `bursty`, `together` or `heldout`.
    pub fn name(self) -> &'static str {
        match self {
            TraceFamily::Paper => "paper",
            TraceFamily::Bursty => "bursty",
            TraceFamily::Together => "together",
            TraceFamily::HeldOut => "heldout",
        }
    }

    /// The family's number in its seeds (never reused).
    fn id(self) -> u64 {
        match self {
            TraceFamily::Paper => 1,
            TraceFamily::Bursty => 2,
            TraceFamily::Together => 3,
            TraceFamily::HeldOut => 4,
        }
    }

    /// The family's generator parameters (one day; see the variants).
    pub fn params(self) -> TraceParams {
        let paper = TraceParams::paper();
        let arrivals = Some(Arrivals { fraction: ARRIVING });
        let mut params = match self {
            TraceFamily::Paper => return paper,
            TraceFamily::Bursty => TraceParams {
                jitter_sd: 0.35,
                bursts_per_day: 12.0,
                burst_length: BurstLength::Pareto(Pareto {
                    scale: 1.0,
                    shape: 1.5,
                    max: 120.0,
                }),
                burst_height: BurstHeight::Pareto(Pareto {
                    scale: 0.5,
                    shape: 1.3,
                    max: 20.0,
                }),
                slow_sd: 0.5,
                slow_minutes: 5.0,
                on_off: Some(OnOff {
                    fraction: 0.2,
                    on_minutes: 30.0,
                    off_minutes: 90.0,
                }),
                arrivals,
                ..paper
            },
            TraceFamily::Together => TraceParams {
                groups: 4,
                group_correlation: 0.9,
                peak_spread_minutes: 30.0,
                diurnal_amplitude: (0.5, 0.9),
                group_bursts: Some(GroupBursts {
                    per_day: 3.0,
                    minutes: 15.0,
                    factor: (2.0, 3.0),
                }),
                global_shock: Some(GlobalShock {
                    sd: 0.2,
                    minutes: 60.0,
                }),
                arrivals,
                ..paper
            },
            TraceFamily::HeldOut => TraceParams {
                tunnels: 240,
                cap_mix: vec![0.5, 1.25, 1.5],
                groups: 8,
                group_correlation: 0.6,
                diurnal_amplitude: (0.2, 0.6),
                peak_minute: 600.0,
                peak_spread_minutes: 240.0,
                slow_sd: 0.2,
                slow_minutes: 30.0,
                jitter_sd: 0.15,
                bursts_per_day: 3.0,
                burst_minutes: 5.0,
                burst_factor: (1.5, 3.0),
                level_shifts: Some(LevelShifts {
                    per_day: 4.0,
                    factor: (0.3, 3.0),
                }),
                hourly_base: Some(HourlyBase {
                    sd: 0.4,
                    minutes: 60,
                }),
                arrivals,
                ..paper
            },
        };
        params.mean_total_gbps = LOAD_RATIO * params.cap_total();
        params
    }

    /// Whether the family has seeds for `role`: the held-out family only for
    /// [`Role::HeldOut`], every other family for every role but that one.
    pub fn has_role(self, role: Role) -> bool {
        (self == TraceFamily::HeldOut) == (role == Role::HeldOut)
    }

    /// The `k`-th seed of this family for `role`: SplitMix64 of
    /// `family << 40 | role << 32 | k`. SplitMix64 is a bijection, so two different
    /// (family, role, k) never give the same seed: a tuning seed is never a report seed.
    /// Errors: a role the family has no seeds for (see [`Self::has_role`]).
    pub fn seed(self, role: Role, k: u32) -> Result<u64, TraceError> {
        if !self.has_role(role) {
            return Err(TraceError::NoSeeds {
                family: self.name(),
                role: role.name(),
            });
        }
        Ok(splitmix64(
            self.id() << 40 | (role as u64) << 32 | u64::from(k),
        ))
    }
}

impl Role {
    /// The role's name: `tune`, `report` or `heldout`.
    pub fn name(self) -> &'static str {
        match self {
            Role::Tune => "tune",
            Role::Report => "report",
            Role::HeldOut => "heldout",
        }
    }
}

impl fmt::Display for TraceFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceFamily {
    type Err = TraceError;

    /// A family by its name ([`TraceFamily::name`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceFamily::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| TraceError::UnknownFamily(s.to_owned()))
    }
}

impl FromStr for Role {
    type Err = TraceError;

    /// A role by its name ([`Role::name`]).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Role::Tune, Role::Report, Role::HeldOut]
            .into_iter()
            .find(|r| r.name() == s)
            .ok_or_else(|| TraceError::UnknownRole(s.to_owned()))
    }
}

#[cfg(test)]
mod tests;
