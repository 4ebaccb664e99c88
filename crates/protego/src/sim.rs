//! `protego sim`: replays a day of tunnel demand through the elastic provisioning model (the
//! `provision` crate's planner, the paper's §5) and its baselines, and prints what it costs
//! and what tenants get: active capacity, violations, the daily bandwidth guarantee of §7.4 and
//! the saving against a dedicated VM pair per tunnel; with `--intervals`, a table in the shape
//! of the paper's Table 2; with `--plot`, charts in the shape of its Figure 11 (SVG and PNG).
//!
//! The trace is a CSV file (`minute,tunnel,gbps`) or generated (`--generate FAMILY --seed S`,
//! one of the families of `provision::trace::TraceFamily`, `paper` being the paper's
//! statistics). The definitions (timing, violations, guarantee, baselines) are those of
//! `provision::sim`. Protego runs with its defaults (`provision::Defaults::PROTEGO`: adaptive
//! sizing, each tunnel at its measurement with a calibrated headroom its node shares, and
//! drain between consolidations) unless told otherwise (`--sizing measured --no-drain` is the planner
//! driven exactly as the paper drives its algorithm); the paper's algorithm runs as
//! published.

mod font;
pub(crate) mod plot;
mod png;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use provision::sim::{Policy, Progress, Run, SimConfig, Summary};
use provision::trace::TraceFamily;
use provision::{generate, run_policy, Trace, TraceParams};
use serde_json::{json, Value};

use plot::{Axis, Chart, Series, Style};

/// The paper's Table 2 (interval, active capacity, guarantee, saving).
const PUBLISHED: [(u64, f64, f64, f64); 5] = provision::sim::PAPER_TABLE2;

/// A CSV trace's cap σ when `--cap` is not given (the paper's 1.5 Gbit/s).
const DEFAULT_CAP_GBPS: f64 = 1.5;

/// How many nodes one tunnel's cap may span at most (`--node-capacity` sanity bound).
const MAX_NODES_PER_CAP: f64 = 100.0;

/// Options of `protego sim`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["trace", "generate"])))]
pub(crate) struct SimArgs {
    /// The trace to replay: CSV with the header `minute,tunnel,gbps` (each tunnel's
    /// throughput in Gbit/s, minute by minute; a missing row is an idle minute).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Generate the trace instead, from a family (`provision::trace::TraceFamily`): `paper`
    /// is the paper's statistics (170 tunnels, 24 h at 1-minute steps, 1.5 Gbit/s caps, a
    /// mean aggregate of 57.5 Gbit/s); `bursty` adds heavy-tailed bursts, strong per-minute
    /// jitter and on/off tunnels; `together` has few tenant groups that move together and a
    /// shock shared by all; `heldout` has level shifts, an hourly interpolated base and mixed
    /// caps (keep it for a final run). Every family has the paper's load (mean aggregate
    /// 57.5/255 of the sum of the caps), and all but `paper` have 10 % of the tunnels arrive
    /// during the trace.
    #[arg(long, value_name = "FAMILY", value_parser = ["paper", "bursty", "together", "heldout"])]
    generate: Option<String>,
    /// Seed of the generated trace (default 1; the seeds meant for tuning and for reports
    /// are `TraceFamily::seed`'s, printed by the provision crate's `families` example).
    #[arg(long, value_name = "S", conflicts_with = "trace")]
    seed: Option<u64>,
    /// Length of the generated trace, minutes (default 1440, one day; 2880 for two).
    #[arg(long, value_name = "N", conflicts_with = "trace")]
    minutes: Option<usize>,
    /// Also write the generated trace to this file as CSV. The CSV holds the demand only:
    /// read back with --trace, every tunnel gets the --cap and exists from minute 0.
    #[arg(long, value_name = "FILE", conflicts_with = "trace")]
    write_trace: Option<PathBuf>,
    /// Every tunnel's cap σ (its rate limit) for a CSV trace, Gbit/s (default 1.5; a generated
    /// trace has the preset's caps).
    #[arg(long, value_name = "GBPS", conflicts_with = "generate")]
    cap: Option<f64>,
    /// Consolidation interval, minutes.
    #[arg(long, value_name = "N", default_value_t = 10)]
    consolidation_minutes: u64,
    /// Also run these consolidation intervals (minutes, comma-separated, e.g. 3,5,10,30,60)
    /// and print the trade-off as the paper's Table 2.
    #[arg(long, value_name = "LIST")]
    intervals: Option<String>,
    /// Write the plots to this directory: figure11.svg/.png (demand and capacity over the
    /// day) and, with --intervals, tradeoff.svg/.png (guarantee against saving).
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// Print one JSON object on stdout instead of the tables.
    #[arg(long)]
    json: bool,
    /// Capacity of one data node, Gbit/s.
    #[arg(long, value_name = "GBPS", default_value_t = 5.0)]
    node_capacity: f64,
    /// Hotspot threshold T_H (fill limit), as a fraction of a node.
    #[arg(long, value_name = "T_H", default_value_t = 0.9)]
    threshold: f64,
    /// Violation tolerance ε of the reserve, Pr(Y > C) <= ε.
    #[arg(long, value_name = "E", default_value_t = 0.05)]
    epsilon: f64,
    /// Measurement interval τ, minutes.
    #[arg(long, value_name = "M", default_value_t = 1)]
    tau_minutes: u64,
    /// Time a shut-down node takes to start, minutes.
    #[arg(long, value_name = "M", default_value_t = 3)]
    start_latency_minutes: u64,
    /// How Protego sizes tunnels for the planner: `measured` (the last measurement, as the
    /// paper), `envelope:N` (the highest of the last N measurements), `headroom:Z,H` (the
    /// last measurement plus Z times its recent variation, half-life H measurements) or
    /// `adaptive` (the default: each tunnel at its measurement with a headroom predicted
    /// from its own history and shared with the other tunnels of its node, calibrated to the
    /// guarantee target, with an aggregate forecast for the reserve). The paper's algorithm
    /// always uses `measured`.
    #[arg(long, value_name = "RULE", default_value_t = provision::Defaults::PROTEGO.sizing.to_string())]
    sizing: String,
    /// Do not give back nodes between consolidations (Protego drains a node as soon as its
    /// tunnels fit elsewhere under T_H).
    #[arg(long)]
    no_drain: bool,
    /// Start the usage histograms empty instead of primed with the trace as the previous
    /// day's history (with `--score-from-minute` nothing is primed: the warm-up is the history).
    #[arg(long)]
    cold_start: bool,
    /// Judge only from this minute on: the minutes before run normally as a warm-up (every
    /// learner and histogram follows them) but count in no figure.
    #[arg(long, value_name = "N", default_value_t = 0)]
    score_from_minute: usize,
    /// No progress on stderr.
    #[arg(long)]
    quiet: bool,
}

/// Everything one invocation computed.
struct Outcome {
    source: String,
    trace: Trace,
    config: SimConfig,
    /// The main interval: the planner and the baselines.
    protego: Run,
    baselines: Vec<Run>,
    /// `--intervals`: per interval, Protego and the paper's algorithm.
    intervals: Vec<(Run, Run)>,
    plots: Vec<PathBuf>,
}

impl Outcome {
    fn baseline(&self, policy: Policy) -> Option<&Run> {
        self.baselines.iter().find(|r| r.policy == policy)
    }
}

/// Parses `--intervals`: whole minutes, at least 1, comma-separated.
fn parse_intervals(text: &str) -> Result<Vec<u64>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        match part.parse::<u64>() {
            Ok(n) if (1..=1_000_000).contains(&n) => {
                if !out.contains(&n) {
                    out.push(n);
                }
            }
            _ => {
                return Err(format!(
                    "--intervals: `{part}` is not a number of minutes from 1 to 1000000"
                ))
            }
        }
    }
    Ok(out)
}

impl SimArgs {
    /// The tunnels' cap σ, Gbit/s.
    fn cap(&self) -> f64 {
        self.cap.unwrap_or(DEFAULT_CAP_GBPS)
    }

    /// The simulator settings these options ask for.
    fn config(&self) -> Result<SimConfig, String> {
        let mut config =
            SimConfig::protego(self.cap()).with_consolidation_minutes(self.consolidation_minutes);
        if self.consolidation_minutes == 0 {
            return Err("--consolidation-minutes: must be at least 1".into());
        }
        config.planner.node_capacity = self.node_capacity;
        config.planner.hotspot_threshold = self.threshold;
        config.planner.epsilon = self.epsilon;
        config.planner.tau = Duration::from_secs(self.tau_minutes.saturating_mul(60));
        config.planner.start_latency =
            Duration::from_secs(self.start_latency_minutes.saturating_mul(60));
        config.sizing = self.sizing.parse().map_err(|e| format!("--{e}"))?;
        if self.no_drain {
            config.drain = false;
        }
        config.warm_start = !self.cold_start;
        config.score_from_minute = self.score_from_minute;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// The trace: read and parsed, or generated (and written when asked).
    fn trace(&self) -> Result<(String, Trace), String> {
        if let Some(path) = &self.trace {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read the trace {}: {e}", path.display()))?;
            let trace = Trace::from_csv(&text, self.cap())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            return Ok((path.display().to_string(), trace));
        }
        let family: TraceFamily = self
            .generate
            .as_deref()
            .unwrap_or("paper")
            .parse()
            .map_err(|e| format!("--generate: {e}"))?;
        let mut params = family.params();
        if let Some(minutes) = self.minutes {
            params = TraceParams { minutes, ..params };
        }
        let seed = self.seed.unwrap_or(1);
        let trace = generate(&params, seed).map_err(|e| e.to_string())?;
        if let Some(path) = &self.write_trace {
            std::fs::write(path, trace.to_csv())
                .map_err(|e| format!("cannot write the trace to {}: {e}", path.display()))?;
        }
        let source = format!(
            "generated: {family} family, seed {seed}, {} minutes",
            trace.minutes()
        );
        Ok((source, trace))
    }
}

/// Prints progress on stderr: at most every two seconds, and when a run ends.
struct Reporter {
    quiet: bool,
    last: Instant,
    started: Instant,
}

impl Reporter {
    fn report(&mut self, p: Progress<'_>) {
        if self.quiet {
            return;
        }
        if p.minute == p.minutes {
            eprintln!(
                "sim: {} done ({:.1} s)",
                p.run,
                self.started.elapsed().as_secs_f64()
            );
            self.started = Instant::now();
            self.last = Instant::now();
        } else if self.last.elapsed() >= Duration::from_secs(2) {
            eprintln!("sim: {}: minute {}/{}", p.run, p.minute, p.minutes);
            self.last = Instant::now();
        }
    }
}

/// Runs `protego sim`.
pub(crate) fn run(args: &SimArgs) -> ExitCode {
    let config = match args.config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let intervals = match args.intervals.as_deref().map(parse_intervals).transpose() {
        Ok(i) => i.unwrap_or_default(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let (source, trace) = match args.trace() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Nodes far smaller than a tunnel's cap would need an unbounded number of them.
    let largest_cap = trace.caps().iter().copied().fold(0.0, f64::max);
    if config.planner.node_capacity * MAX_NODES_PER_CAP < largest_cap {
        eprintln!(
            "error: --node-capacity {} Gbit/s: at least 1/{MAX_NODES_PER_CAP} of the largest \
             tunnel cap ({largest_cap} Gbit/s)",
            config.planner.node_capacity
        );
        return ExitCode::from(2);
    }
    let mut reporter = Reporter {
        quiet: args.quiet,
        last: Instant::now(),
        started: Instant::now(),
    };
    if !args.quiet {
        eprintln!("sim: trace {source}: {trace}");
    }
    let mut outcome = match simulate(&trace, &config, &intervals, &mut |p| reporter.report(p)) {
        Ok((protego, baselines, intervals)) => Outcome {
            source,
            trace,
            config,
            protego,
            baselines,
            intervals,
            plots: Vec::new(),
        },
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(dir) = &args.plot {
        match write_plots(dir, &outcome) {
            Ok(paths) => outcome.plots = paths,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&to_json(&outcome)) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("error: cannot format the report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print!("{}", render_text(&outcome));
    }
    ExitCode::SUCCESS
}

/// The planner and the baselines at the configured interval, and Protego and the paper's
/// algorithm at every extra interval (reusing the runs of the configured one).
#[allow(clippy::type_complexity)]
fn simulate(
    trace: &Trace,
    config: &SimConfig,
    intervals: &[u64],
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<(Run, Vec<Run>, Vec<(Run, Run)>), provision::SimError> {
    let origin = Instant::now();
    let protego = run_policy(trace, config, Policy::Protego, origin, progress)?;
    let mut baselines = Vec::new();
    for policy in [
        Policy::Dedicated,
        Policy::StaticPeak,
        Policy::Paper,
        Policy::LowerBound,
    ] {
        baselines.push(run_policy(trace, config, policy, origin, progress)?);
    }
    let mut rows = Vec::new();
    for &minutes in intervals {
        if minutes == config.consolidation_minutes() {
            let paper = baselines
                .iter()
                .find(|r| r.policy == Policy::Paper)
                .cloned();
            if let Some(paper) = paper {
                rows.push((protego.clone(), paper));
                continue;
            }
        }
        let c = config.clone().with_consolidation_minutes(minutes);
        let p = run_policy(trace, &c, Policy::Protego, origin, progress)?;
        let q = run_policy(trace, &c, Policy::Paper, origin, progress)?;
        rows.push((p, q));
    }
    Ok((protego, baselines, rows))
}

fn summary_json(s: &Summary) -> Value {
    json!({
        "active_capacity_gbps": s.active_capacity_gbps,
        "saving_pct": s.saving_pct,
        "guarantee_pct": s.guarantee_pct,
        "violation_minutes": s.violation_minutes,
        "overload_minutes": s.overload_minutes,
        "overloaded_node_minutes": s.overloaded_node_minutes,
        "tunnel_guarantee_pct": s.tunnel_guarantee_pct,
        "unserved_pct": s.unserved_pct,
        "migrations": s.migrations,
        "peak_active_capacity_gbps": s.peak_active_capacity_gbps,
        "reserved_capacity_gbps": s.reserved_capacity_gbps,
        "mean_demand_gbps": s.mean_demand_gbps,
        "minutes": s.minutes,
    })
}

/// The `--json` document: Protego's figures at the top level, the baselines under
/// `baselines`, the interval sweep under `intervals`.
fn to_json(o: &Outcome) -> Value {
    let c = &o.config;
    let mut doc = summary_json(&o.protego.summary);
    let mut baselines = serde_json::Map::new();
    for run in &o.baselines {
        let mut entry = summary_json(&run.summary);
        if run.consolidation_minutes > 0 {
            entry["consolidation_minutes"] = json!(run.consolidation_minutes);
        }
        baselines.insert(run.policy.name().to_string(), entry);
    }
    let intervals: Vec<Value> = o
        .intervals
        .iter()
        .map(|(p, q)| {
            json!({
                "consolidation_minutes": p.consolidation_minutes,
                "protego": summary_json(&p.summary),
                "paper": summary_json(&q.summary),
            })
        })
        .collect();
    let extra = json!({
        "consolidation_minutes": o.protego.consolidation_minutes,
        "trace": {
            "source": o.source,
            "tunnels": o.trace.tunnels(),
            "minutes": o.trace.minutes(),
            "mean_total_gbps": o.trace.mean_total(),
            "peak_total_gbps": o.trace.peak_total(),
            "dedicated_capacity_gbps": o.trace.dedicated_capacity(),
        },
        "model": {
            "node_capacity_gbps": c.planner.node_capacity,
            "hotspot_threshold": c.planner.hotspot_threshold,
            "epsilon": c.planner.epsilon,
            "tau_minutes": c.planner.tau.as_secs() / 60,
            "start_latency_minutes": c.planner.start_latency.as_secs() / 60,
            "guarantee_fraction": c.guarantee_fraction,
            "sizing": c.sizing.to_string(),
            "drain": c.drain,
            "warm_start": c.warm_start,
            "score_from_minute": c.score_from_minute,
        },
        "baselines": baselines,
        "intervals": intervals,
        "plots": o.plots.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
    });
    if let (Some(doc), Some(extra)) = (doc.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            doc.insert(k.clone(), v.clone());
        }
    }
    doc
}

/// The report as text: the model, every policy's figures, the day hour by hour and, with
/// intervals, the Table 2 shaped trade-off.
fn render_text(o: &Outcome) -> String {
    let c = &o.config;
    let mut s = String::new();
    let _ = writeln!(s, "trace: {} ({})", o.source, o.trace);
    let _ = writeln!(
        s,
        "model: nodes of {} Gbit/s, T_H = {}, ε = {}, τ = {} min, consolidation every {} min, \
         node start {} min; Protego sizing {}, drain {}; {} start, judged from minute {}",
        c.planner.node_capacity,
        c.planner.hotspot_threshold,
        c.planner.epsilon,
        c.planner.tau.as_secs() / 60,
        c.consolidation_minutes(),
        c.planner.start_latency.as_secs() / 60,
        c.sizing,
        if c.drain { "on" } else { "off" },
        if c.warm_start { "warm" } else { "cold" },
        c.score_from_minute,
    );
    let _ = writeln!(
        s,
        "guarantee: a minute counts when at least {} % of the tunnels are served in full \
         (fair share on overloaded nodes); dedicated VM pairs: {:.2} Gbit/s",
        100.0 * c.guarantee_fraction,
        o.trace.dedicated_capacity()
    );
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "{:<12} {:>9} {:>8} {:>10} {:>6} {:>6} {:>9} {:>9} {:>10} {:>9}",
        "policy",
        "active",
        "saving",
        "guarantee",
        "viol.",
        "over.",
        "tunnel",
        "unserved",
        "migrations",
        "reserved"
    );
    let _ = writeln!(
        s,
        "{:<12} {:>9} {:>8} {:>10} {:>6} {:>6} {:>9} {:>9} {:>10} {:>9}",
        "", "Gbit/s", "%", "%", "min", "min", "p99 %", "%", "", "Gbit/s"
    );
    let mut runs: Vec<&Run> = vec![&o.protego];
    runs.extend(o.baselines.iter());
    for run in runs {
        let m = &run.summary;
        let name = if run.consolidation_minutes > 0 {
            format!("{} {}m", run.policy.name(), run.consolidation_minutes)
        } else {
            run.policy.name().to_string()
        };
        let _ = writeln!(
            s,
            "{:<12} {:>9.2} {:>8.2} {:>10.2} {:>6} {:>6} {:>9.2} {:>9.3} {:>10} {:>9.2}",
            name,
            m.active_capacity_gbps,
            m.saving_pct,
            m.guarantee_pct,
            m.violation_minutes,
            m.overload_minutes,
            m.tunnel_guarantee_pct,
            m.unserved_pct,
            m.migrations,
            m.reserved_capacity_gbps
        );
    }
    let _ = writeln!(
        s,
        "(viol.: minutes with more than the tolerated share of tunnels under-served; over.: \
         minutes with any node over capacity; tunnel p99: the share of minutes the 99th-percentile \
         tunnel was served in full)"
    );

    if let (Some(paper), Some(bound)) = (o.baseline(Policy::Paper), o.baseline(Policy::LowerBound))
    {
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "hour  demand  bound  protego viol.  paper viol.   (mean Gbit/s, violation minutes)"
        );
        let hours = o.trace.minutes().div_ceil(60);
        for h in 0..hours {
            let range = h * 60..((h + 1) * 60).min(o.trace.minutes());
            let mean = |run: &Run, f: fn(&provision::MinuteStats) -> f64| {
                let slice = &run.minutes[range.clone()];
                slice.iter().map(f).sum::<f64>() / slice.len().max(1) as f64
            };
            let tolerated = tolerated(o);
            let viol = |run: &Run| {
                run.minutes[range.clone()]
                    .iter()
                    .filter(|m| m.underserved_tunnels as usize > tolerated)
                    .count()
            };
            let _ = writeln!(
                s,
                "{h:>4} {:>7.2} {:>6.1} {:>7.1} {:>5} {:>6.1} {:>5}",
                mean(&o.protego, |m| m.demand_gbps),
                mean(bound, |m| m.active_gbps),
                mean(&o.protego, |m| m.active_gbps),
                viol(&o.protego),
                mean(paper, |m| m.active_gbps),
                viol(paper),
            );
        }
    }

    if !o.intervals.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "Table 2 (same trace):");
        let mut header = format!("{:<36}", "consolidation interval");
        for (p, _) in &o.intervals {
            let _ = write!(header, " {:>8}", format!("{} min", p.consolidation_minutes));
        }
        let _ = writeln!(s, "{header}");
        type Field = (&'static str, fn(&Summary) -> f64, usize);
        let fields: [Field; 4] = [
            (
                "  active VM capacity (Gbit/s)",
                |m| m.active_capacity_gbps,
                2,
            ),
            ("  99th-percentile guarantee (%)", |m| m.guarantee_pct, 2),
            ("  resource saving (%)", |m| m.saving_pct, 2),
            ("  migrations", |m| m.migrations as f64, 0),
        ];
        for (title, pick) in [
            ("Protego", 0usize),
            ("paper's algorithm (same trace)", 1usize),
        ] {
            let _ = writeln!(s, "{title}");
            for (name, f, decimals) in &fields {
                let mut line = format!("{name:<36}");
                for pair in &o.intervals {
                    let run = if pick == 0 { &pair.0 } else { &pair.1 };
                    let _ = write!(line, " {:>8.decimals$}", f(&run.summary));
                }
                let _ = writeln!(s, "{line}");
            }
        }
        let _ = writeln!(s, "paper, as published (its own trace)");
        for (name, k) in [
            ("  active VM capacity (Gbit/s)", 1usize),
            ("  99th-percentile guarantee (%)", 2),
            ("  resource saving (%)", 3),
        ] {
            let mut line = format!("{name:<36}");
            for (p, _) in &o.intervals {
                let value = PUBLISHED
                    .iter()
                    .find(|r| r.0 == p.consolidation_minutes)
                    .map(|r| [r.1, r.2, r.3][k - 1]);
                match value {
                    Some(v) => {
                        let _ = write!(line, " {v:>8.2}");
                    }
                    None => {
                        let _ = write!(line, " {:>8}", "-");
                    }
                }
            }
            let _ = writeln!(s, "{line}");
        }
    }
    for path in &o.plots {
        let _ = writeln!(s, "plot: {}", path.display());
    }
    s
}

/// Under-served tunnels a minute may have and still count as available.
fn tolerated(o: &Outcome) -> usize {
    let n = o.trace.tunnels();
    let needed = ((o.config.guarantee_fraction * n as f64) - 1e-9)
        .ceil()
        .clamp(1.0, n as f64) as usize;
    n - needed
}

const BLACK: [u8; 3] = [0, 0, 0];
pub(crate) const GREY: [u8; 3] = [150, 150, 150];
const GREEN: [u8; 3] = [0, 140, 60];
pub(crate) const RED: [u8; 3] = [210, 40, 30];
pub(crate) const BLUE: [u8; 3] = [30, 80, 200];
const ORANGE: [u8; 3] = [230, 140, 0];

/// A run's per-minute values as (hour, value) points.
fn hourly_points(run: &Run, f: fn(&provision::MinuteStats) -> f64) -> Vec<(f64, f64)> {
    run.minutes
        .iter()
        .enumerate()
        .map(|(m, s)| (m as f64 / 60.0, f(s)))
        .collect()
}

/// The Figure 11 shaped chart: demand, reserve and active capacity over the day.
fn figure11(o: &Outcome) -> Chart {
    let main = o.protego.consolidation_minutes;
    let mut series = vec![Series::new(
        "aggregate demand",
        BLACK,
        hourly_points(&o.protego, |m| m.demand_gbps),
        Style::Line,
        false,
    )];
    if let Some(bound) = o.baseline(Policy::LowerBound) {
        series.push(Series::new(
            "lower bound",
            GREY,
            hourly_points(bound, |m| m.active_gbps),
            Style::Step,
            true,
        ));
    }
    series.push(Series::new(
        "reserved (Protego)",
        GREEN,
        hourly_points(&o.protego, |m| m.reserved_gbps),
        Style::Step,
        true,
    ));
    series.push(Series::new(
        format!("active, Protego {main} min"),
        RED,
        hourly_points(&o.protego, |m| m.active_gbps),
        Style::Step,
        false,
    ));
    if let Some(paper) = o.baseline(Policy::Paper) {
        series.push(Series::new(
            format!("active, paper's algorithm {main} min"),
            BLUE,
            hourly_points(paper, |m| m.active_gbps),
            Style::Step,
            false,
        ));
    }
    let other = o
        .intervals
        .iter()
        .filter(|(p, _)| p.consolidation_minutes != main)
        .max_by_key(|(p, _)| p.consolidation_minutes);
    if let Some((p, _)) = other {
        series.push(Series::new(
            format!("active, Protego {} min", p.consolidation_minutes),
            ORANGE,
            hourly_points(p, |m| m.active_gbps),
            Style::Step,
            false,
        ));
    }
    let top = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0, f64::max);
    let hours = o.trace.minutes() as f64 / 60.0;
    Chart {
        title: "Resource provisioning over the day (Figure 11)".into(),
        x_label: "time (hours)".into(),
        y_label: "Gbit/s".into(),
        x: Axis::nice(0.0, hours, 12),
        y: Axis::nice(0.0, top * 1.05, 8),
        series,
    }
}

/// The trade-off chart: guarantee against saving, one point per interval.
fn tradeoff(o: &Outcome) -> Chart {
    let point = |s: &Summary| (s.saving_pct, s.guarantee_pct);
    let labels: Vec<String> = o
        .intervals
        .iter()
        .map(|(p, _)| format!("{} min", p.consolidation_minutes))
        .collect();
    let mut series = vec![
        Series {
            name: "Protego".into(),
            color: RED,
            points: o.intervals.iter().map(|(p, _)| point(&p.summary)).collect(),
            style: Style::LineMarkers,
            dashed: false,
            labels: labels.clone(),
        },
        Series {
            name: "paper's algorithm (same trace)".into(),
            color: BLUE,
            points: o.intervals.iter().map(|(_, q)| point(&q.summary)).collect(),
            style: Style::LineMarkers,
            dashed: false,
            labels,
        },
    ];
    let published: Vec<&(u64, f64, f64, f64)> = o
        .intervals
        .iter()
        .filter_map(|(p, _)| PUBLISHED.iter().find(|r| r.0 == p.consolidation_minutes))
        .collect();
    if !published.is_empty() {
        series.push(Series {
            name: "paper, published (its trace)".into(),
            color: GREY,
            points: published.iter().map(|r| (r.3, r.2)).collect(),
            style: Style::LineMarkers,
            dashed: true,
            labels: published.iter().map(|r| format!("{} min", r.0)).collect(),
        });
    }
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (x_lo, x_hi) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let (y_lo, y_hi) = ys.fold((f64::MAX, f64::MIN), |(a, b), y| (a.min(y), b.max(y)));
    Chart {
        title: "Guarantee against saving by consolidation interval (Table 2)".into(),
        x_label: "resource saving against dedicated VM pairs (%)".into(),
        y_label: "99th-percentile guarantee (%)".into(),
        x: Axis::nice(x_lo - 0.5, x_hi + 0.5, 8),
        y: Axis::nice(y_lo - 1.0, (y_hi + 0.5).min(100.0), 8),
        series,
    }
}

/// Writes the charts as SVG and PNG into `dir` (created if needed); returns the files.
fn write_plots(dir: &Path, o: &Outcome) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir)
        .map_err(|e| format!("cannot create the plot directory {}: {e}", dir.display()))?;
    let mut charts = vec![("figure11", figure11(o))];
    if !o.intervals.is_empty() {
        charts.push(("tradeoff", tradeoff(o)));
    }
    let mut written = Vec::new();
    for (name, chart) in charts {
        let svg = dir.join(format!("{name}.svg"));
        std::fs::write(&svg, chart.svg())
            .map_err(|e| format!("cannot write {}: {e}", svg.display()))?;
        written.push(svg);
        let png = dir.join(format!("{name}.png"));
        let bytes = chart.png()?;
        std::fs::write(&png, bytes).map_err(|e| format!("cannot write {}: {e}", png.display()))?;
        written.push(png);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use provision::sim::Sizing;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn args(list: &[&str]) -> Result<SimArgs, clap::Error> {
        let mut all = vec!["sim"];
        all.extend_from_slice(list);
        Cli::try_parse_from(all).map(|c| c.sim)
    }

    fn small_outcome(intervals: &[u64]) -> Outcome {
        let params = TraceParams {
            tunnels: 30,
            minutes: 180,
            mean_total_gbps: 10.0,
            ..TraceParams::paper()
        };
        let trace = generate(&params, 3).unwrap();
        let config = SimConfig::protego(1.5);
        let (protego, baselines, intervals) =
            simulate(&trace, &config, intervals, &mut |_| {}).unwrap();
        Outcome {
            source: "test".into(),
            trace,
            config,
            protego,
            baselines,
            intervals,
            plots: Vec::new(),
        }
    }

    #[test]
    fn options_parse_and_are_checked() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
        let a = args(&["--generate", "paper", "--seed", "7", "--json"]).unwrap();
        assert_eq!(a.seed, Some(7));
        let c = a.config().unwrap();
        assert_eq!(c.consolidation_minutes(), 10);
        assert_eq!(c.sizing, provision::Defaults::PROTEGO.sizing);
        assert_eq!(c.sizing, Sizing::Adaptive);
        assert!(c.drain && c.warm_start);
        assert_eq!(c.score_from_minute, 0);
        assert!(args(&[]).is_err(), "a trace or --generate is required");
        assert!(args(&["--trace", "x.csv", "--generate", "paper"]).is_err());
        assert!(args(&["--generate", "other"]).is_err());
        assert!(args(&["--trace", "x.csv", "--seed", "3"]).is_err());
        // A generated trace has the preset's caps: --cap would be ignored, so it is refused.
        assert!(args(&["--generate", "paper", "--cap", "2"]).is_err());
        let a = args(&["--trace", "x.csv", "--cap", "2"]).unwrap();
        assert_eq!(a.config().unwrap().planner.default_sigma, 2.0);
        let a = args(&[
            "--trace",
            "x.csv",
            "--consolidation-minutes",
            "30",
            "--sizing",
            "measured",
            "--no-drain",
            "--cold-start",
            "--threshold",
            "0.8",
            "--score-from-minute",
            "60",
        ])
        .unwrap();
        let c = a.config().unwrap();
        assert_eq!(c.consolidation_minutes(), 30);
        assert_eq!(c.sizing, Sizing::Measured);
        assert!(!c.drain && !c.warm_start);
        assert_eq!(c.score_from_minute, 60);
        let a = args(&["--trace", "x.csv", "--sizing", "adaptive"]).unwrap();
        assert_eq!(a.config().unwrap().sizing, Sizing::Adaptive);
        assert_eq!(c.planner.hotspot_threshold, 0.8);
        let bad = args(&["--trace", "x", "--threshold", "1.5"]).unwrap();
        assert!(bad.config().unwrap_err().contains("hotspot_threshold"));
        let bad = args(&["--trace", "x", "--consolidation-minutes", "0"]).unwrap();
        assert!(bad.config().is_err());
        let bad = args(&["--trace", "x", "--tau-minutes", "0"]).unwrap();
        assert!(bad.config().unwrap_err().contains("tau"));
    }

    #[test]
    fn every_family_can_be_generated() {
        for (family, tunnels, arrivals) in [
            ("paper", 170, 0),
            ("bursty", 170, 17),
            ("together", 170, 17),
            ("heldout", 240, 24),
        ] {
            let a = args(&["--generate", family, "--seed", "4", "--minutes", "30"]).unwrap();
            let (source, trace) = a.trace().unwrap();
            assert_eq!(
                source,
                format!("generated: {family} family, seed 4, 30 minutes")
            );
            assert_eq!(
                (trace.tunnels(), trace.minutes()),
                (tunnels, 30),
                "{family}"
            );
            let late = (0..tunnels).filter(|&i| trace.arrival(i) > 0).count();
            assert_eq!(late, arrivals, "{family}");
        }
        // The paper family is the paper preset, one day by default.
        let a = args(&["--generate", "paper", "--seed", "2"]).unwrap();
        let paper = generate(&TraceParams::paper(), 2).unwrap();
        assert_eq!(a.trace().unwrap().1, paper);
        let a = args(&["--generate", "bursty", "--minutes", "0"]).unwrap();
        assert!(a.trace().unwrap_err().contains("minutes"));
        assert!(args(&["--trace", "x.csv", "--minutes", "60"]).is_err());
        assert!(args(&["--generate", "Bursty"]).is_err());
    }

    #[test]
    fn interval_lists() {
        assert_eq!(parse_intervals("3, 5,10,5"), Ok(vec![3, 5, 10]));
        assert!(parse_intervals("3,0").unwrap_err().contains("`0`"));
        assert!(parse_intervals("3,,5").is_err());
    }

    #[test]
    fn a_missing_or_bad_trace_file_is_reported_with_its_path() {
        let dir = std::env::temp_dir().join(format!("protego-sim-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.csv");
        std::fs::write(&bad, "minute,tunnel,gbps\n0,1,0.5\n0,1,x\n").unwrap();
        let a = args(&["--trace", bad.to_str().unwrap()]).unwrap();
        let err = a.trace().unwrap_err();
        assert!(err.contains("bad.csv: trace CSV line 3: gbps `x`"), "{err}");
        let missing = dir.join("missing.csv");
        let a = args(&["--trace", missing.to_str().unwrap()]).unwrap();
        assert!(a.trace().unwrap_err().contains("cannot read the trace"));
        let good = dir.join("good.csv");
        let out = dir.join("written.csv");
        let a = args(&[
            "--generate",
            "paper",
            "--seed",
            "2",
            "--write-trace",
            out.to_str().unwrap(),
        ])
        .unwrap();
        let (_, generated) = a.trace().unwrap();
        std::fs::copy(&out, &good).unwrap();
        let a = args(&["--trace", good.to_str().unwrap()]).unwrap();
        assert_eq!(a.trace().unwrap().1, generated);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn json_has_the_figures_and_every_baseline() {
        let o = small_outcome(&[3, 10]);
        let doc = to_json(&o);
        for key in [
            "saving_pct",
            "guarantee_pct",
            "active_capacity_gbps",
            "violation_minutes",
        ] {
            assert!(doc[key].is_number(), "{key}");
            for baseline in ["dedicated", "static_peak", "paper", "lower_bound"] {
                assert!(
                    doc["baselines"][baseline][key].is_number(),
                    "{baseline} {key}"
                );
            }
        }
        assert_eq!(doc["consolidation_minutes"], 10);
        assert_eq!(doc["baselines"]["dedicated"]["saving_pct"], 0.0);
        assert_eq!(doc["baselines"]["dedicated"]["active_capacity_gbps"], 90.0);
        assert_eq!(doc["intervals"].as_array().unwrap().len(), 2);
        assert_eq!(doc["intervals"][1]["consolidation_minutes"], 10);
        // The 10-minute row reuses the main runs.
        assert_eq!(
            doc["intervals"][1]["protego"]["saving_pct"],
            doc["saving_pct"]
        );
        assert_eq!(doc["model"]["sizing"], "adaptive");
        assert_eq!(doc["trace"]["tunnels"], 30);
    }

    #[test]
    fn text_has_the_policies_the_hours_and_table_2() {
        let o = small_outcome(&[3, 10]);
        let text = render_text(&o);
        for needle in [
            "protego 10m",
            "paper 10m",
            "dedicated",
            "static_peak",
            "lower_bound",
            "Table 2 (same trace):",
            "   3 min   10 min",
            "paper, as published",
            "   90.21    96.84",
        ] {
            assert!(text.contains(needle), "missing {needle:?} in\n{text}");
        }
        // Three hours of trace: three hourly rows.
        let hourly = text
            .lines()
            .skip_while(|l| !l.starts_with("hour"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .count();
        assert_eq!(hourly, 3);
    }

    #[test]
    fn plots_are_written_as_svg_and_png() {
        let o = small_outcome(&[3, 10]);
        let dir = std::env::temp_dir().join(format!("protego-sim-plots-{}", std::process::id()));
        let written = write_plots(&dir, &o).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "figure11.svg",
                "figure11.png",
                "tradeoff.svg",
                "tradeoff.png"
            ]
        );
        let svg = std::fs::read_to_string(dir.join("figure11.svg")).unwrap();
        assert!(svg.contains("active, Protego 10 min"));
        assert!(
            svg.contains("active, paper&apos;s algorithm") || svg.contains("paper's algorithm")
        );
        let png = std::fs::read(dir.join("tradeoff.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
        std::fs::remove_dir_all(&dir).unwrap();
        let only = small_outcome(&[]);
        let dir2 = std::env::temp_dir().join(format!("protego-sim-plots2-{}", std::process::id()));
        assert_eq!(write_plots(&dir2, &only).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir2).unwrap();
    }
}
