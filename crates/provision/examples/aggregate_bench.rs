//! Times the aggregate Y = U_1 * … * U_n for many tunnels (default 10 000 tunnels of 100
//! bins) and prints the figures: wall time, C for a few ε, the nodes to reserve, and how far
//! the tree aggregate is from the exact direct convolution on a small subset. Then times two
//! whole planner steps on the same tunnels: the first places every tunnel and consolidates,
//! the second (after the usage moved) relieves hotspots.
//!
//! ```text
//! cargo run -p protego-provision --release --example aggregate_bench [-- --tunnels N --bins B --samples S]
//! ```
//!
//! The tunnels are synthetic and seeded (the same every run): each has a base load drawn
//! from a heavy-tailed distribution, noise around it, and some idle and capped minutes; half
//! of them have a cap σ of 0.3 node, the other half 0.15 (so the lattice mapping of unequal
//! caps is part of the timing).

use std::process::ExitCode;
use std::time::Instant;

use provision::{
    aggregate, aggregate_exact, reserve_nodes, Cluster, NodeId, NodeState, Planner, PlannerConfig,
    ProvisionError, TunnelId, UsageHistogram,
};

/// xorshift64*: enough for synthetic loads, and no RNG crate needed.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Args {
    tunnels: usize,
    bins: usize,
    samples: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        tunnels: 10_000,
        bins: 100,
        samples: 240,
    };
    let mut iter = std::env::args().skip(1);
    while let Some(flag) = iter.next() {
        let value = iter
            .next()
            .ok_or_else(|| format!("{flag}: missing value"))?;
        let number: usize = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
        match flag.as_str() {
            "--tunnels" => args.tunnels = number,
            "--bins" => args.bins = number,
            "--samples" => args.samples = number.max(1),
            _ => {
                return Err(format!(
                    "unknown flag {flag} (use --tunnels, --bins, --samples)"
                ))
            }
        }
    }
    Ok(args)
}

/// The tunnels' histograms, and each tunnel's last sample.
fn histograms(args: &Args, rng: &mut Rng) -> Result<Vec<(UsageHistogram, f64)>, ProvisionError> {
    (0..args.tunnels)
        .map(|i| {
            let sigma = if i % 2 == 0 { 0.3 } else { 0.15 };
            let mut h = UsageHistogram::new(sigma, args.bins, args.samples)?;
            // Heavy-tailed base load: most tunnels small, a few near their cap.
            let base = sigma * rng.unit().powi(3);
            let mut last = 0.0;
            for _ in 0..args.samples {
                let roll = rng.unit();
                let alpha = if roll < 0.05 {
                    0.0
                } else if roll < 0.08 {
                    sigma
                } else {
                    (base * (0.5 + rng.unit())).min(sigma)
                };
                h.record(alpha)?;
                last = alpha;
            }
            Ok((h, last))
        })
        .collect()
}

/// Two planner steps over all tunnels, on a cluster of inactive nodes.
fn plan_steps(tunnels: &[(UsageHistogram, f64)], rng: &mut Rng) -> Result<(), ProvisionError> {
    let planner = Planner::new(PlannerConfig::default())?;
    let mut usage = provision::UsageBook::new(planner.config().usage_config())?;
    let mut cluster = Cluster::new();
    let total: f64 = tunnels.iter().map(|t| t.1).sum();
    for n in 0..(total * 1.5) as u32 + 10 {
        cluster.add_node(NodeId(n), NodeState::Inactive)?;
    }
    for (i, (histogram, alpha)) in tunnels.iter().enumerate() {
        let id = TunnelId(i as u32);
        cluster.add_tunnel(id, *alpha)?;
        usage.set_sigma(id, histogram.sigma())?;
        for bin in 0..histogram.bins() {
            // Rebuild the window from the histogram (bin values, by count).
            let count = (histogram.probability(bin) * histogram.samples() as f64).round();
            for _ in 0..count as usize {
                usage.record(id, histogram.value(bin))?;
            }
        }
    }
    let now = Instant::now();
    let started = Instant::now();
    let plan = planner.plan(&cluster, &usage, now, None)?;
    let first = started.elapsed();
    cluster.apply_plan(&plan)?;
    println!(
        "planner step 1 (place {} tunnels, consolidate): {:.3} s, {} decisions, {} active, {}",
        tunnels.len(),
        first.as_secs_f64(),
        plan.decisions.len(),
        plan.reservation.active,
        plan.reservation
    );
    for (i, (histogram, alpha)) in tunnels.iter().enumerate() {
        let moved = (alpha * (0.7 + 0.6 * rng.unit())).min(histogram.sigma());
        cluster.set_alpha(TunnelId(i as u32), moved)?;
    }
    let hot = cluster.hotspots(planner.config().limit()).len();
    let later = now + planner.config().tau;
    let started = Instant::now();
    let plan = planner.plan(&cluster, &usage, later, Some(now))?;
    let second = started.elapsed();
    println!(
        "planner step 2 ({hot} hotspots after ±30 % usage): {:.3} s, {} migrations, {} hotspots left",
        second.as_secs_f64(),
        plan.moves().count(),
        plan.hotspots.len()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("aggregate_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut rng = Rng(0x00c0_ffee_d00d_f00d);
    let with_last = match histograms(&args, &mut rng) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("aggregate_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let tunnels: Vec<UsageHistogram> = with_last.iter().map(|(h, _)| h.clone()).collect();
    println!(
        "{} tunnels x {} bins, {} samples each",
        args.tunnels, args.bins, args.samples
    );

    let started = Instant::now();
    let y = match aggregate(&tunnels) {
        Ok(y) => y,
        Err(e) => {
            eprintln!("aggregate_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let elapsed = started.elapsed();
    println!(
        "aggregate: {:.3} s ({} lattice points of {:.5} held, beyond = {:.2e}, top = {:.1})",
        elapsed.as_secs_f64(),
        y.masses().len(),
        y.step(),
        y.beyond(),
        y.top_value()
    );
    println!("E[Y] = {:.3} nodes", y.mean());
    for epsilon in [0.1, 0.05, 0.01, 0.001] {
        match y
            .capacity(epsilon)
            .and_then(|c| reserve_nodes(c, 0.9).map(|n| (c, n)))
        {
            Ok((c, nodes)) => {
                println!("ε = {epsilon:<6} C = {c:.3} nodes, reserve ⌈C / 0.9⌉ = {nodes}")
            }
            Err(e) => eprintln!("aggregate_bench: ε = {epsilon}: {e}"),
        }
    }

    // The exact fold on a subset, to show the agreement and the cost it avoids.
    let subset = &tunnels[..tunnels.len().min(200)];
    let started = Instant::now();
    let (fast, exact) = match (aggregate(subset), aggregate_exact(subset)) {
        (Ok(f), Ok(e)) => (f, e),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("aggregate_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    let exact_time = started.elapsed();
    let worst = (exact.offset()..exact.offset() + exact.masses().len())
        .map(|i| (fast.exceedance(exact.value(i)) - exact.exceedance(exact.value(i))).abs())
        .fold(0.0, f64::max);
    println!(
        "first {} tunnels: tree and exact fold together {:.3} s; largest |ΔPr(Y > x)| = {:.2e}",
        subset.len(),
        exact_time.as_secs_f64(),
        worst
    );

    if let Err(e) = plan_steps(&with_last, &mut rng) {
        eprintln!("aggregate_bench: planner: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
