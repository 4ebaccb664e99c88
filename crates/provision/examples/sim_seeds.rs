//! Runs the provisioning simulator on the paper-statistics trace preset for several seeds and
//! prints, per consolidation interval, Protego's and the paper's algorithm's active capacity,
//! guarantee, saving and migrations (each seed, then the mean over the seeds with the lowest
//! and highest), beside the paper's published Table 2.
//!
//! ```text
//! cargo run -p protego-provision --example sim_seeds -- \
//!     [--seeds 1,2,3,4,5] [--intervals 3,5,10,30,60] [--sizing envelope:2] [--drain on]
//! ```
//!
//! `--sizing` and `--drain` set how Protego runs (see `provision::sim::Sizing` and
//! `SimConfig::drain`); by default it runs as the planner alone (`measured`, `off`). The
//! paper's algorithm always runs as published.

use std::process::ExitCode;
use std::time::Instant;

use provision::{generate, sim::Sizing, sweep, SimConfig, Summary, TraceParams};

/// The paper's Table 2 (interval, active capacity, guarantee, saving).
const PUBLISHED: [(u64, f64, f64, f64); 5] = provision::sim::PAPER_TABLE2;

fn parse_list(text: &str) -> Result<Vec<u64>, String> {
    text.split(',')
        .map(|s| {
            s.trim()
                .parse::<u64>()
                .map_err(|_| format!("`{s}`: not a whole number"))
        })
        .collect()
}

struct Options {
    seeds: Vec<u64>,
    intervals: Vec<u64>,
    sizing: Sizing,
    drain: bool,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        seeds: vec![1, 2, 3, 4, 5],
        intervals: vec![3, 5, 10, 30, 60],
        sizing: Sizing::Measured,
        drain: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg}: needs a value"))?;
        match arg.as_str() {
            "--seeds" => o.seeds = parse_list(&value)?,
            "--intervals" => o.intervals = parse_list(&value)?,
            "--sizing" => o.sizing = value.parse()?,
            "--drain" => {
                o.drain = match value.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("--drain `{value}`: expected on or off")),
                }
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(o)
}

/// Mean, lowest and highest of one figure over the seeds.
fn stats(v: &[Summary], f: fn(&Summary) -> f64) -> (f64, f64, f64) {
    let values: Vec<f64> = v.iter().map(f).collect();
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let lo = values.iter().copied().fold(f64::MAX, f64::min);
    let hi = values.iter().copied().fold(f64::MIN, f64::max);
    (mean, lo, hi)
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let params = TraceParams::paper();
    let mut config = SimConfig::paper(params.cap_gbps);
    config.sizing = o.sizing;
    config.drain = o.drain;
    println!(
        "Protego: sizing {}, drain {}",
        o.sizing,
        if o.drain { "on" } else { "off" }
    );
    // results[interval] = (Protego, paper's algorithm) summaries over the seeds.
    let mut results: Vec<(Vec<Summary>, Vec<Summary>)> =
        vec![(Vec::new(), Vec::new()); o.intervals.len()];
    for &seed in &o.seeds {
        let trace = match generate(&params, seed) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        eprintln!("seed {seed}: {trace}");
        let started = Instant::now();
        let rows = match sweep(&trace, &config, &o.intervals, Instant::now(), &mut |_| {}) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        for (k, row) in rows.iter().enumerate() {
            let (p, q) = (&row.protego.summary, &row.paper.summary);
            println!(
                "seed {seed:>3} {:>3} min | protego {:6.2} Gbit/s {:6.2} % {:6.2} % ({:3} viol, \
                 {:5} mig) | paper {:6.2} Gbit/s {:6.2} % {:6.2} % ({:3} viol, {:5} mig)",
                row.consolidation_minutes,
                p.active_capacity_gbps,
                p.guarantee_pct,
                p.saving_pct,
                p.violation_minutes,
                p.migrations,
                q.active_capacity_gbps,
                q.guarantee_pct,
                q.saving_pct,
                q.violation_minutes,
                q.migrations,
            );
            results[k].0.push(*p);
            results[k].1.push(*q);
        }
        eprintln!("seed {seed}: {:.1} s", started.elapsed().as_secs_f64());
    }
    println!();
    println!(
        "mean over {} seeds [lowest, highest]: capacity Gbit/s, guarantee %, saving %, migrations",
        o.seeds.len()
    );
    for (k, &minutes) in o.intervals.iter().enumerate() {
        let (p, q) = &results[k];
        for (name, v) in [("protego", p), ("paper  ", q)] {
            let (c, _, _) = stats(v, |s| s.active_capacity_gbps);
            let (g, glo, ghi) = stats(v, |s| s.guarantee_pct);
            let (s, slo, shi) = stats(v, |s| s.saving_pct);
            let (m, _, _) = stats(v, |s| s.migrations as f64);
            println!(
                "{minutes:>3} min {name} {c:6.2}  {g:6.2} [{glo:6.2}, {ghi:6.2}]  \
                 {s:6.2} [{slo:6.2}, {shi:6.2}]  {m:7.0}"
            );
        }
        if let Some(r) = PUBLISHED.iter().find(|r| r.0 == minutes) {
            println!(
                "{minutes:>3} min published {:6.2}  {:6.2}                    {:6.2}",
                r.1, r.2, r.3
            );
        }
    }
    ExitCode::SUCCESS
}
