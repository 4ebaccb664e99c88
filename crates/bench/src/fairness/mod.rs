//! `protego bench fairness` (issue 18 §4): the offloading paper's experiment. One gateway
//! (`protego up`, one worker by default) serves several tenants, each through its own
//! tunnel(s) from the load generator, under more load than the worker can take:
//!
//! - tenant A: a TCP SYN flood, with the SYN-cookie proxy (`examples/filters/syncookie.c`,
//!   `syncookie_in` to_cloud and `syncookie_out` from_cloud; every SYN is answered with a
//!   cookie, XDP_TX back through the tunnel);
//! - tenant B: a DNS query flood, with the DNS rate limiter (`examples/filters/dns_ratelimit.c`,
//!   to_cloud; all but 1000 queries a second are dropped);
//! - tenant C: no program, UDP in the simple IMIX to a VM.
//!
//! Each case (a set of tenants, weights, programs) is run with `[gateway] cpu_fairness` off,
//! `account` (charged, nothing refused: the CPU shares without fairness) and `enforce`, the
//! modes alternating within each round, a fresh gateway for each run; the figures are the
//! medians over the rounds. Per tenant: the CPU share the gateway charged it (`protego status`
//! `tenants`), the packets it decrypted for it (its CHILD_SAs' `packets_in`), its weighted
//! fair share and the deviation from it; per case Jain's index of the shares over the fair
//! shares. The other cases check the rest of the issue's targets: an idle tenant (`idle`),
//! the cost of the charge at 64 B with the tenants' packets interleaved one by one
//! (`overhead`), 1 against 64 tenants (`scale1`, `scale64`), and a tenant whose program runs
//! to the instruction limit on every packet (`spin` against `spin-base`).
//!
//! ```text
//!  load generator: IKEv2 + ESP (peer ns)  ──WAN──  gw ns: protego up  ──underlay──  host ns: VXLAN
//!  tenants' packets interleaved in blocks          [[tenant]] cpu_weight             counts the marked
//!  (A SYN | B DNS | C IMIX | ...)                  [[filter]] per tenant             UDP packets
//! ```
//!
//! Benchmarks are programs: nothing here asserts a timing; the unit tests cover the pure parts
//! (the cases' configurations, the packets, the interleaving, fair shares and Jain's index,
//! the summaries and the targets).

mod config;
mod metrics;
mod run;
mod summary;
mod traffic;

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::error::{BenchError, Result};
use crate::options::Cipher;
use crate::report::{Machine, Target};

pub use run::run;
pub use summary::render;
pub use traffic::Traffic;

/// Version of the JSON document.
pub const FAIR_REPORT_VERSION: u32 = 1;

/// `[gateway] cpu_fairness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Nothing charged.
    Off,
    /// Charged, nothing refused.
    Account,
    /// Charged and shared by weight.
    Enforce,
    /// As `Enforce` with the kernel gate (`cpu_fairness_kernel = true`): floods refused in
    /// the kernel too. Not in any case's modes by default; `--modes` asks for it.
    EnforceKernel,
}

impl Mode {
    /// The mode's name in reports and `--modes`.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Off => "off",
            Mode::Account => "account",
            Mode::Enforce => "enforce",
            Mode::EnforceKernel => "enforce-kernel",
        }
    }

    /// The gateway configuration's lines for this mode.
    pub(crate) fn config_lines(self) -> &'static str {
        match self {
            Mode::Off => "cpu_fairness = \"off\"",
            Mode::Account => "cpu_fairness = \"account\"",
            Mode::Enforce => "cpu_fairness = \"enforce\"",
            Mode::EnforceKernel => "cpu_fairness = \"enforce\"\ncpu_fairness_kernel = true",
        }
    }

    /// Every mode, in report order.
    pub(crate) const ALL: [Mode; 4] =
        [Mode::Off, Mode::Account, Mode::Enforce, Mode::EnforceKernel];
}

/// A tenant's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Program {
    /// None.
    None,
    /// The SYN-cookie proxy (both directions).
    SynCookie,
    /// The DNS rate limiter (to_cloud).
    DnsLimit,
    /// A loop stopped by the instruction limit on every packet (to_cloud).
    Spin,
}

impl Program {
    /// A short label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Program::None => "-",
            Program::SynCookie => "syncookie",
            Program::DnsLimit => "dns_ratelimit",
            Program::Spin => "spin",
        }
    }
}

/// One tenant of a case.
#[derive(Debug, Clone, Serialize)]
pub struct TenantSpec {
    /// Its name.
    pub name: String,
    /// Its `cpu_weight`.
    pub weight: u16,
    /// What it sends.
    pub traffic: Traffic,
    /// Its program.
    pub program: Program,
    /// Its tunnels.
    pub tunnels: u32,
    /// Its part of the offered packets (0: it sends nothing).
    pub share: u32,
}

/// One configuration of tenants, run in each of its modes.
#[derive(Debug, Clone, Serialize)]
pub struct CaseSpec {
    /// Its name (`--cases`).
    pub name: &'static str,
    /// What it shows.
    pub purpose: &'static str,
    /// The tenants.
    pub tenants: Vec<TenantSpec>,
    /// The modes it runs in.
    pub modes: Vec<Mode>,
    /// Packets of one tenant in a row.
    pub block: u32,
}

impl CaseSpec {
    /// Tunnels of all tenants.
    pub fn tunnels(&self) -> u32 {
        self.tenants.iter().map(|t| t.tunnels).sum()
    }
}

/// Every case's name, in run order.
pub const CASES: [&str; 9] = [
    "equal",
    "weighted",
    "weighted-skew",
    "idle",
    "overhead",
    "scale1",
    "scale64",
    "spin-base",
    "spin",
];

/// Packets in a row of one tenant in the paper's cases (one UDP GSO train at the load
/// generator, one IMIX block).
const BLOCK: u32 = 8;

fn tenant(name: &str, weight: u16, traffic: Traffic, program: Program, share: u32) -> TenantSpec {
    TenantSpec {
        name: name.to_owned(),
        weight,
        traffic,
        program,
        tunnels: 1,
        share,
    }
}

/// The paper's three tenants with `weights`, offered packets in the proportion `shares`.
fn paper_tenants(weights: [u16; 3], shares: [u32; 3]) -> Vec<TenantSpec> {
    vec![
        tenant(
            "a-syn",
            weights[0],
            Traffic::SynFlood,
            Program::SynCookie,
            shares[0],
        ),
        tenant(
            "b-dns",
            weights[1],
            Traffic::DnsFlood,
            Program::DnsLimit,
            shares[1],
        ),
        tenant(
            "c-imix",
            weights[2],
            Traffic::Imix,
            Program::None,
            shares[2],
        ),
    ]
}

/// Offered packets of the weighted cases, A:B:C. The gateway reads its socket in arrival
/// order, so the kernel's drops under overload thin every tenant alike: a tenant's demand at
/// the gateway is its part of the packets times its cost. With 1:1:1 (and the tuning run's
/// costs, SYN ≈ 2.2 µs, DNS ≈ 1.7 µs, IMIX ≈ 1.2 µs charged per packet) the weight-3
/// tenant wanted less than its half; 1:2:4 makes every tenant want more than its share.
const WEIGHTED_SHARES: [u32; 3] = [1, 2, 4];

/// The case called `name`.
pub fn case(name: &str) -> Result<CaseSpec> {
    let all = vec![Mode::Off, Mode::Account, Mode::Enforce];
    let charged = vec![Mode::Account, Mode::Enforce];
    let scale = |tenants: u32| {
        let per = 64 / tenants;
        (0..tenants)
            .map(|k| TenantSpec {
                tunnels: per,
                ..tenant(&format!("s{k}"), 1, Traffic::Udp(64), Program::None, 1)
            })
            .collect()
    };
    let spin = |program: Program| {
        let mut t = paper_tenants([1, 1, 1], [1, 1, 1]);
        t.push(tenant("d-spin", 1, Traffic::Udp(64), program, 1));
        t
    };
    Ok(match name {
        "equal" => CaseSpec {
            name: "equal",
            purpose: "the paper's three tenants, weights 1:1:1",
            tenants: paper_tenants([1, 1, 1], [1, 1, 1]),
            modes: all,
            block: BLOCK,
        },
        "weighted" => CaseSpec {
            name: "weighted",
            purpose: "the paper's three tenants, weights 1:2:3, offered packets 1:2:4",
            tenants: paper_tenants([1, 2, 3], WEIGHTED_SHARES),
            modes: all,
            block: BLOCK,
        },
        "weighted-skew" => CaseSpec {
            name: "weighted-skew",
            purpose: "the paper's three tenants, weights 1:2:3, offered packets 1:1:2 (shares without fairness far from the weights)",
            tenants: paper_tenants([1, 2, 3], [1, 1, 2]),
            modes: all,
            block: BLOCK,
        },
        "idle" => CaseSpec {
            name: "idle",
            purpose: "weights 1:2:3, the third tenant idle: its share used by the others",
            tenants: paper_tenants([1, 2, 3], [WEIGHTED_SHARES[0], WEIGHTED_SHARES[1], 0]),
            modes: all,
            block: BLOCK,
        },
        "overhead" => CaseSpec {
            name: "overhead",
            purpose: "the charge's cost: three tenants' 64 B packets interleaved one by one, no programs",
            tenants: vec![
                tenant("o0", 1, Traffic::Udp(64), Program::None, 1),
                tenant("o1", 1, Traffic::Udp(64), Program::None, 1),
                tenant("o2", 1, Traffic::Udp(64), Program::None, 1),
            ],
            modes: all,
            block: 1,
        },
        "scale1" => CaseSpec {
            name: "scale1",
            purpose: "64 tunnels of one tenant, 64 B, one packet per tunnel in turn",
            tenants: scale(1),
            modes: vec![Mode::Off, Mode::Enforce],
            block: 1,
        },
        "scale64" => CaseSpec {
            name: "scale64",
            purpose: "64 tunnels of 64 tenants, 64 B, one packet per tunnel in turn",
            tenants: scale(64),
            modes: vec![Mode::Off, Mode::Enforce],
            block: 1,
        },
        "spin-base" => CaseSpec {
            name: "spin-base",
            purpose: "the paper's tenants and a fourth flooding 64 B UDP without a program",
            tenants: spin(Program::None),
            modes: charged,
            block: BLOCK,
        },
        "spin" => CaseSpec {
            name: "spin",
            purpose: "as spin-base, the fourth tenant's program running to the instruction limit on every packet",
            tenants: spin(Program::Spin),
            modes: charged,
            block: BLOCK,
        },
        other => {
            return Err(BenchError::InvalidOption {
                option: "--cases",
                value: other.to_owned(),
                reason: format!("expected one of {}", CASES.join(", ")),
            })
        }
    })
}

/// Parses `--modes`' items.
impl FromStr for Mode {
    type Err = BenchError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "off" => Ok(Mode::Off),
            "account" => Ok(Mode::Account),
            "enforce" => Ok(Mode::Enforce),
            "enforce-kernel" => Ok(Mode::EnforceKernel),
            other => Err(BenchError::InvalidOption {
                option: "--modes",
                value: other.to_owned(),
                reason: "expected off, account, enforce or enforce-kernel".to_owned(),
            }),
        }
    }
}

/// What `protego bench fairness` runs.
#[derive(Debug, Clone)]
pub struct FairOptions {
    /// The cases, in run order.
    pub cases: Vec<CaseSpec>,
    /// Only these modes (None: each case's own).
    pub modes: Option<Vec<Mode>>,
    /// Rounds (every case in every mode once per round).
    pub rounds: u32,
    /// Length of each measured run.
    pub duration: Duration,
    /// Offered load, packets per second (all tenants together).
    pub rate_pps: f64,
    /// Gateway workers.
    pub workers: u32,
    /// ESP transform.
    pub cipher: Cipher,
    /// Bytes of pre-built packets per run at most.
    pub pool_bytes: usize,
    /// The `protego` binary under test (default: this one).
    pub protego_bin: Option<PathBuf>,
    /// Keep the run directory.
    pub keep: bool,
    /// Extra `[gateway]` lines.
    pub gateway_options: Vec<String>,
    /// Run the gateway's and the load generator's threads at this nice value (-20..=19;
    /// None: as started), so that other work on a shared machine takes less of their CPU.
    pub nice: Option<i32>,
    /// Packets of one tenant in a row in every case (None: each case's own).
    pub block: Option<u32>,
}

impl FairOptions {
    /// Every case, three rounds of 1 s runs at 3 Mpps offered, one worker, AES-256-GCM.
    pub fn full() -> Result<FairOptions> {
        Ok(FairOptions {
            cases: CASES.iter().map(|c| case(c)).collect::<Result<_>>()?,
            modes: None,
            rounds: 3,
            duration: Duration::from_secs(1),
            rate_pps: 3e6,
            workers: 1,
            cipher: Cipher::Aes256Gcm,
            pool_bytes: 1 << 30,
            protego_bin: None,
            keep: false,
            gateway_options: Vec::new(),
            nice: None,
            block: None,
        })
    }

    /// Checks the options.
    pub fn validate(&self) -> Result<()> {
        let bad = |option: &'static str, value: String, reason: &str| BenchError::InvalidOption {
            option,
            value,
            reason: reason.to_owned(),
        };
        if self.cases.is_empty() {
            return Err(bad("--cases", String::new(), "the list is empty"));
        }
        if !(1..=50).contains(&self.rounds) {
            return Err(bad("--rounds", self.rounds.to_string(), "1 to 50"));
        }
        if !(1e4..=2e7).contains(&self.rate_pps) {
            return Err(bad(
                "--rate",
                self.rate_pps.to_string(),
                "10000 to 20000000 packets per second",
            ));
        }
        if !(1..=64).contains(&self.workers) {
            return Err(bad("--workers", self.workers.to_string(), "1 to 64"));
        }
        if self.pool_bytes < (16 << 20) {
            return Err(bad(
                "--pool-mb",
                (self.pool_bytes >> 20).to_string(),
                "at least 16 MiB",
            ));
        }
        if self.nice.is_some_and(|n| !(-20..=19).contains(&n)) {
            return Err(bad("--nice", format!("{:?}", self.nice), "-20 to 19"));
        }
        if self.block.is_some_and(|b| !(1..=4096).contains(&b)) {
            return Err(bad("--block", format!("{:?}", self.block), "1 to 4096"));
        }
        if self.modes.as_ref().is_some_and(|m| m.is_empty()) {
            return Err(bad("--modes", String::new(), "the list is empty"));
        }
        Ok(())
    }

    /// The modes `case` runs in: its own, or those of `--modes` among them (`enforce-kernel`
    /// wherever `enforce` is one of them).
    pub(crate) fn modes_of(&self, case: &CaseSpec) -> Vec<Mode> {
        match &self.modes {
            Some(only) => case
                .modes
                .iter()
                .copied()
                .flat_map(|m| match m {
                    Mode::Enforce => vec![Mode::Enforce, Mode::EnforceKernel],
                    m => vec![m],
                })
                .filter(|m| only.contains(m))
                .collect(),
            None => case.modes.clone(),
        }
    }
}

/// One tenant in one run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TenantRun {
    /// The tenant.
    pub tenant: String,
    /// Packets the load generator sent for it.
    pub offered: u64,
    /// Packets the gateway decrypted for it (its CHILD_SAs' `packets_in`).
    pub decrypted: u64,
    /// Packets the charge counted for it (None while off).
    pub counted: Option<u64>,
    /// CPU time charged to it, ns (None while off).
    pub cpu_ns: Option<u64>,
    /// Packets dropped for its fair share.
    pub fair_drops: Option<u64>,
    /// Packets its programs dropped (`XDP_DROP`).
    pub filter_drops: u64,
    /// Packets its programs aborted (`XDP_ABORTED`, the instruction limit among them).
    pub filter_aborted: u64,
    /// Its tokens after the run, ns (enforcing).
    pub tokens_ns: Option<i64>,
}

/// One measured run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunFigures {
    /// The case.
    pub case: String,
    /// The mode.
    pub mode: String,
    /// The round (from 1).
    pub round: u32,
    /// Packets sent.
    pub sent: u64,
    /// Time the sending took, s.
    pub span_s: f64,
    /// Offered rate, packets per second.
    pub offered_pps: f64,
    /// The gateway process's CPU time over the run, ns.
    pub gateway_cpu_ns: u64,
    /// Marked packets that arrived at the host.
    pub host_delivered: u64,
    /// Datagrams the gateway's sockets dropped (the kernel, for lack of buffer).
    pub socket_drops: u64,
    /// CPU time charged to no tenant, ns (None while off).
    pub unattributed_ns: Option<u64>,
    /// Batch phases of the gateway whose charge was split by packet count after 8 tenant
    /// runs (`cpu_capped_phases`; None while off).
    pub capped_phases: Option<u64>,
    /// The machine's 1-minute load average after the run (`/proc/loadavg`): other work on
    /// the machine competes with the gateway and the load generator.
    pub loadavg: Option<f64>,
    /// Per tenant, in the case's order.
    pub tenants: Vec<TenantRun>,
}

/// One tenant's medians in one case and mode.
#[derive(Debug, Clone, Serialize)]
pub struct TenantSummary {
    /// The tenant.
    pub tenant: String,
    /// Its weight.
    pub weight: u16,
    /// What it sends.
    pub traffic: String,
    /// Its program.
    pub program: String,
    /// Offered, packets per second.
    pub offered_pps: f64,
    /// Decrypted for it, packets per second.
    pub decrypted_pps: f64,
    /// Its share of the charged CPU (None while off).
    pub cpu_share: Option<f64>,
    /// Its share of the decrypted packets.
    pub packet_share: f64,
    /// Its weighted fair share of the CPU.
    pub fair_share: f64,
    /// `cpu_share / fair_share - 1`.
    pub deviation: Option<f64>,
    /// CPU charged per packet counted, ns.
    pub ns_per_packet: Option<f64>,
    /// Packets dropped for its fair share, per second.
    pub fair_drops_pps: Option<f64>,
}

/// A case in one mode: medians over the rounds.
#[derive(Debug, Clone, Serialize)]
pub struct CaseSummary {
    /// The case.
    pub case: String,
    /// The mode.
    pub mode: String,
    /// Rounds measured.
    pub rounds: usize,
    /// Offered, packets per second.
    pub offered_pps: f64,
    /// Decrypted, all tenants, packets per second.
    pub decrypted_pps: f64,
    /// Arrived at the host (marked UDP only), packets per second.
    pub host_pps: f64,
    /// Gateway CPU time per decrypted packet, ns.
    pub cpu_ns_per_packet: f64,
    /// Gateway CPU, cores.
    pub gateway_cores: f64,
    /// Charge phases split by packet count (capped), per second.
    pub capped_phases_per_s: Option<f64>,
    /// The machine's load average after the runs.
    pub loadavg: Option<f64>,
    /// Jain's index of the CPU shares over the fair shares (None while off).
    pub jain: Option<f64>,
    /// The largest |deviation| of a tenant's CPU share from its fair share.
    pub max_deviation: Option<f64>,
    /// Per tenant.
    pub tenants: Vec<TenantSummary>,
}

/// The settings of the run.
#[derive(Debug, Clone, Serialize)]
pub struct FairSettings {
    /// Rounds.
    pub rounds: u32,
    /// Seconds per run.
    pub duration_s: f64,
    /// Offered packets per second.
    pub rate_pps: f64,
    /// Gateway workers.
    pub workers: u32,
    /// ESP transform.
    pub cipher: String,
    /// Extra `[gateway]` lines.
    pub gateway_options: Vec<String>,
    /// The nice value of the gateway's and the load generator's threads.
    pub nice: Option<i32>,
    /// Packets of one tenant in a row, if set for every case (`--block`).
    pub block: Option<u32>,
    /// The DNS limiter's rate per source (queries/s) and burst.
    pub dns_rate: (u64, u64),
    /// How to read the figures.
    pub notes: Vec<String>,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct FairReport {
    /// [`FAIR_REPORT_VERSION`].
    pub version: u32,
    /// The machine.
    pub machine: Machine,
    /// The settings.
    pub settings: FairSettings,
    /// The cases.
    pub cases: Vec<CaseSpec>,
    /// Medians per case and mode.
    pub summaries: Vec<CaseSummary>,
    /// The issue's targets.
    pub targets: Vec<Target>,
    /// Every run.
    pub runs: Vec<RunFigures>,
    /// Runs that failed.
    pub errors: Vec<String>,
}

#[cfg(test)]
mod tests;
