//! `protego bench fairness` (issue 18 §4): its options, and its plot — each tenant's CPU
//! share without fairness (`account`) and enforcing, beside its weighted fair share, drawn
//! with the charts of `protego sim --plot` ([`crate::sim::plot`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bench::fairness::{self, FairOptions, FairReport, Mode};
use bench::{parse_duration, parse_list, BenchError, Cipher};

use super::run_scenario;
use crate::sim::plot::{Axis, Chart, Series, Style};
use crate::sim::{BLUE, GREY, RED};

/// Options of `protego bench fairness`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct FairArgs {
    /// Cases, comma-separated: equal, weighted, weighted-skew, idle, overhead, scale1,
    /// scale64, spin-base, spin. Default: all.
    #[arg(long, value_name = "LIST")]
    cases: Option<String>,
    /// Only these modes of each case: off, account, enforce, enforce-kernel (enforcing with
    /// `cpu_fairness_kernel = true`, wherever a case enforces). Default: each case's own.
    #[arg(long, value_name = "LIST")]
    modes: Option<String>,
    /// Rounds: every case in every mode once per round, the modes' order turned each round;
    /// the figures are medians. Default: 3.
    #[arg(long, value_name = "N")]
    rounds: Option<u32>,
    /// Length of each measured run, e.g. `2s`. Default: 1s.
    #[arg(long, value_name = "TIME")]
    duration: Option<String>,
    /// Offered load of all tenants together, packets per second. Default: 3000000.
    #[arg(long, value_name = "PPS")]
    rate: Option<f64>,
    /// Gateway workers. Default: 1.
    #[arg(long, value_name = "N")]
    workers: Option<u32>,
    /// ESP transform (as `protego bench --ciphers`). Default: aes256gcm.
    #[arg(long, value_name = "CIPHER")]
    cipher: Option<String>,
    /// Pre-built packets the load generator may hold per run, MiB. Default: 1024.
    #[arg(long, value_name = "MIB")]
    pool_mb: Option<usize>,
    /// Print one JSON object on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Also draw the CPU shares as an SVG chart into FILE.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// The protego binary to put under test (default: this one).
    #[arg(long, value_name = "PATH")]
    gateway_bin: Option<PathBuf>,
    /// Keep the run directory (configurations, programs, gateway logs at `info`).
    #[arg(long)]
    keep: bool,
    /// An extra `key = value` line for the gateway's `[gateway]` table (repeatable).
    #[arg(long, value_name = "LINE")]
    gateway_option: Vec<String>,
    /// Run the gateway's and the load generator's threads at this nice value (-20..19), so
    /// that other work on a shared machine takes less of their CPU (e.g. -10).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    nice: Option<i32>,
    /// Packets of one tenant in a row, in every case (default: 8 in the paper's cases, 1 in
    /// overhead and scale). A batch phase whose charge crosses more than 8 tenant runs is
    /// split by packet count, so this changes how exactly the charge sees each tenant.
    #[arg(long, value_name = "N")]
    block: Option<u32>,
}

impl FairArgs {
    /// The options these arguments ask for.
    fn options(&self) -> Result<FairOptions, BenchError> {
        let mut o = FairOptions::full()?;
        if let Some(s) = &self.cases {
            o.cases = parse_list(s, |c| Ok(c.to_owned()))?
                .iter()
                .map(|c| fairness::case(c))
                .collect::<Result<_, _>>()?;
        }
        if let Some(s) = &self.modes {
            o.modes = Some(parse_list(s, str::parse::<Mode>)?);
        }
        if let Some(n) = self.rounds {
            o.rounds = n;
        }
        if let Some(s) = &self.duration {
            o.duration = parse_duration(s)?;
        }
        if let Some(r) = self.rate {
            o.rate_pps = r;
        }
        if let Some(w) = self.workers {
            o.workers = w;
        }
        if let Some(c) = &self.cipher {
            o.cipher = c.parse::<Cipher>()?;
        }
        if let Some(mb) = self.pool_mb {
            o.pool_bytes = mb.saturating_mul(1 << 20);
        }
        o.protego_bin = self.gateway_bin.clone();
        o.keep = self.keep;
        o.gateway_options = self.gateway_option.clone();
        o.nice = self.nice;
        o.block = self.block;
        o.validate()?;
        Ok(o)
    }
}

/// Runs `protego bench fairness`.
pub(crate) fn run(args: &FairArgs) -> ExitCode {
    let options = match args.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let plot = args.plot.clone();
    run_scenario(
        "bench fairness",
        args.json,
        |progress, on_start| {
            let report = fairness::run(&options, progress, on_start)?;
            if let Some(path) = &plot {
                match write_plot(path, &report) {
                    Ok(()) => progress(&format!("plot written to {}", path.display())),
                    Err(e) => progress(&format!("error: {e}")),
                }
            }
            Ok(report)
        },
        fairness::render,
        |r| r.errors.is_empty(),
    )
}

/// Writes the chart of `report` as SVG to `path`.
fn write_plot(path: &Path, report: &FairReport) -> Result<(), String> {
    std::fs::write(path, chart(report).svg())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Cases with more tenants than this are left out of the chart (64 tenants would crowd it).
const CHART_MAX_TENANTS: usize = 4;

/// The chart: for each case with CPU shares and a few tenants of different kinds (not the
/// overhead case's identical ones), its tenants side by side (a gap between cases), their
/// median CPU share without fairness (`account`), enforcing, and their weighted fair share.
fn chart(report: &FairReport) -> Chart {
    let mut account = Vec::new();
    let mut enforce = Vec::new();
    let mut fair = Vec::new();
    let mut fair_labels = Vec::new();
    let mut ticks = Vec::new();
    let mut x = 0.0;
    let mut seen: Vec<&str> = Vec::new();
    for s in &report.summaries {
        if seen.contains(&s.case.as_str())
            || s.jain.is_none()
            || s.tenants.len() > CHART_MAX_TENANTS
            || s.case == "overhead"
        {
            continue;
        }
        seen.push(&s.case);
        let of = |mode: Mode| {
            report
                .summaries
                .iter()
                .find(|c| c.case == s.case && c.mode == mode.name())
        };
        x += 1.0;
        for (k, t) in s.tenants.iter().enumerate() {
            x += 1.0;
            let share = |mode: Mode| {
                of(mode)
                    .and_then(|c| c.tenants.get(k))
                    .and_then(|t| t.cpu_share)
            };
            if let Some(v) = share(Mode::Account) {
                account.push((x, v * 100.0));
            }
            if let Some(v) = share(Mode::Enforce) {
                enforce.push((x, v * 100.0));
            }
            fair.push((x, t.fair_share * 100.0));
            fair_labels.push(if k == 0 {
                s.case.clone()
            } else {
                String::new()
            });
            let letter = t
                .tenant
                .chars()
                .next()
                .map_or_else(String::new, |c| c.to_uppercase().to_string());
            ticks.push((x, format!("{letter} w{}", t.weight)));
        }
    }
    let y_max = account
        .iter()
        .chain(&enforce)
        .chain(&fair)
        .map(|p| p.1)
        .fold(10.0, f64::max);
    let y = Axis::nice(0.0, y_max * 1.1, 8);
    Chart {
        title: "CPU share per tenant under overload: without fairness, enforcing, fair share".into(),
        x_label: "tenants (A SYN flood + SYN cookie, B DNS flood + limiter, C IMIX, D 64 B UDP; w = cpu_weight), by case".into(),
        y_label: "share of the charged CPU (%)".into(),
        x: Axis {
            min: 0.0,
            max: x + 1.0,
            ticks,
        },
        y,
        series: vec![
            Series::new("without fairness (account)", BLUE, account, Style::Markers, false),
            Series::new("enforce", RED, enforce, Style::Markers, false),
            Series {
                labels: fair_labels,
                ..Series::new("weighted fair share", GREY, fair, Style::Markers, false)
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: FairArgs,
    }

    #[test]
    fn arguments_choose_cases_and_refine_the_defaults() {
        let cli = Cli::try_parse_from([
            "x",
            "--cases",
            "weighted,idle",
            "--modes",
            "off,enforce",
            "--rounds",
            "5",
            "--rate",
            "2000000",
            "--duration",
            "2s",
            "--nice",
            "-10",
        ])
        .expect("parses");
        let o = cli.args.options().expect("valid");
        assert_eq!(
            o.cases.iter().map(|c| c.name).collect::<Vec<_>>(),
            ["weighted", "idle"]
        );
        assert_eq!(o.modes, Some(vec![Mode::Off, Mode::Enforce]));
        assert_eq!((o.rounds, o.rate_pps), (5, 2e6));
        assert_eq!(o.duration, std::time::Duration::from_secs(2));
        assert_eq!(o.nice, Some(-10));
        let bad = Cli::try_parse_from(["x", "--cases", "weighted,nope"]).expect("parses");
        assert!(bad.args.options().is_err());
        let bad = Cli::try_parse_from(["x", "--rounds", "0"]).expect("parses");
        assert!(bad.args.options().is_err());
    }

    #[test]
    fn the_chart_shows_each_tenant_of_each_case_with_shares() {
        let mut report = FairReport {
            version: fairness::FAIR_REPORT_VERSION,
            machine: bench::Machine {
                cpus: 2,
                kernel: String::new(),
                cpu_model: String::new(),
            },
            settings: fairness::FairSettings {
                rounds: 1,
                duration_s: 1.0,
                rate_pps: 1e6,
                workers: 1,
                cipher: "aes256gcm".into(),
                gateway_options: Vec::new(),
                nice: None,
                block: None,
                dns_rate: (1000, 100),
                notes: Vec::new(),
            },
            cases: Vec::new(),
            summaries: Vec::new(),
            targets: Vec::new(),
            runs: Vec::new(),
            errors: Vec::new(),
        };
        let tenant = |name: &str, share: Option<f64>, fair: f64| fairness::TenantSummary {
            tenant: name.into(),
            weight: 1,
            traffic: String::new(),
            program: String::new(),
            offered_pps: 0.0,
            decrypted_pps: 0.0,
            cpu_share: share,
            packet_share: 0.0,
            fair_share: fair,
            deviation: None,
            ns_per_packet: None,
            fair_drops_pps: None,
        };
        let summary = |mode: Mode, shares: [Option<f64>; 2]| fairness::CaseSummary {
            case: "equal".into(),
            mode: mode.name().into(),
            rounds: 1,
            offered_pps: 0.0,
            decrypted_pps: 0.0,
            host_pps: 0.0,
            cpu_ns_per_packet: 0.0,
            gateway_cores: 0.0,
            loadavg: None,
            capped_phases_per_s: None,
            jain: shares[0].map(|_| 1.0),
            max_deviation: None,
            tenants: vec![
                tenant("a-syn", shares[0], 0.5),
                tenant("b-dns", shares[1], 0.5),
            ],
        };
        report.summaries = vec![
            summary(Mode::Off, [None, None]),
            summary(Mode::Account, [Some(0.8), Some(0.2)]),
            summary(Mode::Enforce, [Some(0.49), Some(0.51)]),
        ];
        let c = chart(&report);
        assert_eq!(c.series.len(), 3);
        assert_eq!(c.series[0].points, vec![(2.0, 80.0), (3.0, 20.0)]);
        assert_eq!(c.series[1].points.len(), 2);
        assert_eq!(
            c.x.ticks.iter().map(|t| t.1.as_str()).collect::<Vec<_>>(),
            ["A w1", "B w1"]
        );
        let svg = c.svg();
        assert!(svg.contains("without fairness (account)") && svg.contains(">equal<"));
        assert_eq!(svg.matches("<circle").count(), 6);
    }
}
