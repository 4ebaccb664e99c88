//! Prints summary statistics of every trace family (`provision::trace::TraceFamily`), one
//! trace each: no simulator runs, only what the traces themselves look like.
//!
//! ```text
//! cargo run -p protego-provision --example families -- [--role tune|report] [--k K] [--minutes N]
//! ```
//!
//! Each family but `heldout` uses its seed `K` (default 0) of `--role` (default `tune`); the
//! held-out family has seeds for its own role only, and uses its seed `K` of that role.
//! Columns: mean and peak aggregate (Gbit/s), the mean over the sum of the caps, the mean
//! `|d_i(t) − d_i(t − 1)| / σ_i`, the 99th percentile of the aggregate's 5-minute rise
//! `A(t + 5) − A(t)` (Gbit/s), and the tunnels that arrive during the trace.

use std::process::ExitCode;

use provision::trace::{generate, Role, TraceFamily, TraceParams, TraceStats};

struct Options {
    role: Role,
    k: u32,
    minutes: Option<usize>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        role: Role::Tune,
        k: 0,
        minutes: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next().ok_or_else(|| format!("{arg}: needs a value"))?;
        let number = || format!("{arg} `{value}`: not a whole number");
        match arg.as_str() {
            "--role" => o.role = value.parse().map_err(|e| format!("{e}"))?,
            "--k" => o.k = value.parse().map_err(|_| number())?,
            "--minutes" => o.minutes = Some(value.parse().map_err(|_| number())?),
            other => return Err(format!("unknown option {other}")),
        }
    }
    if o.role == Role::HeldOut {
        return Err(
            "--role heldout: the held-out family is always shown with its own seeds; \
                    choose tune or report for the others"
                .into(),
        );
    }
    Ok(o)
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    println!(
        "| family | role, k | seed | tunnels × minutes | Σ caps | mean agg. | mean / Σ caps \
         | peak agg. | mean \\|Δ\\| / cap | p99 5-min rise | arrivals |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for family in TraceFamily::ALL {
        let role = if family.has_role(o.role) {
            o.role
        } else {
            Role::HeldOut
        };
        let mut params = family.params();
        if let Some(minutes) = o.minutes {
            params = TraceParams { minutes, ..params };
        }
        let trace = match family
            .seed(role, o.k)
            .and_then(|seed| generate(&params, seed).map(|t| (seed, t)))
        {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {family}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let (seed, trace) = trace;
        let s = TraceStats::of(&trace);
        println!(
            "| {family} | {role}, {} | {seed} | {} × {} | {:.1} | {:.2} | {:.4} | {:.2} \
             | {:.4} | {:.2} | {} |",
            o.k,
            trace.tunnels(),
            trace.minutes(),
            s.cap_total_gbps,
            s.mean_total_gbps,
            s.mean_total_gbps / s.cap_total_gbps,
            s.peak_total_gbps,
            s.mean_step_of_cap,
            s.rise_p99_gbps,
            s.arrivals,
        );
    }
    ExitCode::SUCCESS
}
