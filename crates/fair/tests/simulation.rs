//! One worker in virtual time: tenants' packets arrive in a receive queue (tail-dropped when a
//! tenant has [`QUEUE`] packets waiting, or when [`QUEUE`] packets of all tenants wait in the
//! shared-ring variant), the worker takes them in order, admits each by its tenant's bucket
//! (`Buckets::admit`), processes it at the tenant's fixed cost or drops it at a small fixed cost,
//! and charges the cycles either way (`Buckets::charge`); tokens are generated at each packet
//! start (`Buckets::tick`), 31/32 of the cycles per interval unless a test says otherwise (see
//! `Params` for why not all of them). The CPU cycles each tenant used are compared with its
//! weighted fair share (issue 18 §4's target: within ±5 %).

use std::collections::VecDeque;

use fair::{Buckets, Occupant, Params, Weight};

/// Δt and B in cycles (scaled down from the design's 1 ms and 4 ms so the runs stay short).
const INTERVAL: u64 = 100_000;
const BUCKET: u64 = 400_000;
/// Receive queue size, per tenant or shared.
const QUEUE: usize = 512;
/// The run, and the warm-up not measured at its start, in cycles.
const RUN: u64 = 200_000_000;
const WARMUP: u64 = 20_000_000;

/// A tenant's traffic: its weight, what one of its packets costs, and the CPU it offers in
/// cores (arrival rate × cost).
#[derive(Clone, Copy)]
struct Traffic {
    weight: u64,
    cost: u64,
    offered: f64,
    /// The cycle at which it starts sending.
    start: u64,
}

const fn traffic(weight: u64, cost: u64, offered: f64) -> Traffic {
    Traffic {
        weight,
        cost,
        offered,
        start: 0,
    }
}

/// What a run measured per tenant.
#[derive(Debug)]
struct Outcome {
    /// Cycles used (processing and fairness drops) after the warm-up.
    used: Vec<u64>,
    /// Packets dropped for fairness.
    fair_drops: Vec<u64>,
    /// Cycles of the measured window.
    window: u64,
}

impl Outcome {
    fn total(&self) -> u64 {
        self.used.iter().sum()
    }

    fn share(&self, tenant: usize) -> f64 {
        self.used[tenant] as f64 / self.total() as f64
    }
}

/// A small deterministic generator for arrival jitter.
struct XorShift(u64);

impl XorShift {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How the worker's receive queue drops when full.
#[derive(Clone, Copy, PartialEq)]
enum Queue {
    /// At most [`QUEUE`] packets per tenant wait: the worker sees every tenant's demand.
    PerTenant,
    /// At most [`QUEUE`] packets wait in all: a flood crowds the others out before the worker.
    Shared,
}

/// A run's setting.
#[derive(Clone, Copy)]
struct Setup {
    /// Whether packets are admitted by their tenant's bucket (else all are, and only charged).
    enforce: bool,
    queue: Queue,
    /// Tokens generated per interval, in 32nds of the interval.
    tokens_32nds: u64,
    /// The cycle at which the measured window starts.
    measure_from: u64,
    /// The cycles a packet dropped for fairness costs (classification, a share of the receive).
    drop_cost: u64,
}

/// Fairness on, queues per tenant, 31/32 of the cycles generated as tokens (see `Params`).
const ON: Setup = Setup {
    enforce: true,
    queue: Queue::PerTenant,
    tokens_32nds: 31,
    measure_from: WARMUP,
    drop_cost: 100,
};

fn run(traffic: &[Traffic], setup: Setup) -> Outcome {
    let Setup {
        enforce,
        queue,
        tokens_32nds,
        measure_from,
        drop_cost,
    } = setup;
    let params = Params::new(INTERVAL, BUCKET)
        .and_then(|p| p.with_tokens(INTERVAL * tokens_32nds / 32))
        .expect("constants in range");
    let table: Vec<Option<Occupant>> = traffic
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Some(Occupant {
                key: i as u64,
                weight: Weight::new(t.weight).expect("test weights in range"),
            })
        })
        .collect();
    let mut buckets = Buckets::new(params, &table).expect("a few slots");
    let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
    // Mean cycles between two packets of a tenant; arrivals are jittered uniformly around it.
    let period: Vec<f64> = traffic
        .iter()
        .map(|t| {
            if t.offered > 0.0 {
                t.cost as f64 / t.offered
            } else {
                f64::INFINITY
            }
        })
        .collect();
    let mut next: Vec<f64> = period
        .iter()
        .zip(traffic)
        .map(|(&p, t)| {
            if p.is_finite() {
                t.start as f64 + p * rng.unit()
            } else {
                p
            }
        })
        .collect();
    let mut ring: VecDeque<usize> = VecDeque::new();
    let mut waiting = vec![0usize; traffic.len()];
    let mut out = Outcome {
        used: vec![0; traffic.len()],
        fair_drops: vec![0; traffic.len()],
        window: RUN - measure_from,
    };
    let mut now = 0u64;
    while now < RUN {
        // Packets that arrived by now, in arrival order.
        loop {
            let (i, at) = next
                .iter()
                .enumerate()
                .min_by(|a, b| a.1.total_cmp(b.1))
                .map(|(i, &at)| (i, at))
                .expect("at least one tenant");
            if at > now as f64 {
                if ring.is_empty() {
                    // Idle until the next arrival.
                    if at >= RUN as f64 {
                        now = RUN;
                        break;
                    }
                    now = at.ceil() as u64;
                    continue;
                }
                break;
            }
            let room = match queue {
                Queue::PerTenant => waiting[i] < QUEUE,
                Queue::Shared => ring.len() < QUEUE,
            };
            if room {
                ring.push_back(i);
                waiting[i] += 1;
            }
            next[i] += period[i] * 2.0 * rng.unit();
        }
        let Some(i) = ring.pop_front() else { break };
        waiting[i] -= 1;
        buckets.tick(now);
        let cost = if !enforce || buckets.admit(i) {
            traffic[i].cost
        } else {
            if now >= measure_from {
                out.fair_drops[i] += 1;
            }
            drop_cost
        };
        buckets.charge(i, cost);
        if now >= measure_from {
            // The part of the packet inside the window (the last one may end after RUN).
            out.used[i] += cost.min(RUN - now);
        }
        now += cost;
    }
    out
}

fn assert_share(out: &Outcome, tenant: usize, fair: f64) {
    let share = out.share(tenant);
    assert!(
        (share - fair).abs() <= 0.05 * fair,
        "tenant {tenant}: {:.2} % of the CPU, fair share {:.2} % ({out:?})",
        share * 100.0,
        fair * 100.0
    );
}

/// Weights 1:3, each tenant offering three times its share (0.75 and 2.25 cores), at different
/// costs per packet: 25 % and 75 % of the cycles.
#[test]
fn two_tenants_at_three_times_their_share() {
    let traffic = [traffic(1, 1_500, 0.75), traffic(3, 600, 2.25)];
    let out = run(&traffic, ON);
    assert_share(&out, 0, 0.25);
    assert_share(&out, 1, 0.75);
    assert!(out.total() as f64 >= 0.95 * out.window as f64, "{out:?}");
}

/// Weight 1 flooding (three whole cores of dear packets) against weight 3 at three times its
/// share.
const FLOOD: [Traffic; 2] = [traffic(1, 1_500, 3.0), traffic(3, 500, 2.25)];

/// Without fairness the flood takes most of the core; with it, 25 % and 75 %.
#[test]
fn flood_is_held_to_its_share() {
    let off = run(
        &FLOOD,
        Setup {
            enforce: false,
            ..ON
        },
    );
    assert!(
        off.share(0) > 0.5,
        "without fairness the flood wins: {off:?}"
    );
    let on = run(&FLOOD, ON);
    assert_share(&on, 0, 0.25);
    assert_share(&on, 1, 0.75);
    assert!(on.fair_drops[0] > 0, "{on:?}");
    assert!(on.total() as f64 >= 0.95 * on.window as f64, "{on:?}");
}

/// A tenant that was idle while another flooded gets its share back when it starts sending.
#[test]
fn returning_tenant_gets_its_share_back() {
    let mut traffic = FLOOD;
    traffic[1].start = RUN / 4;
    let out = run(
        &traffic,
        Setup {
            measure_from: RUN / 2,
            ..ON
        },
    );
    assert_share(&out, 0, 0.25);
    assert_share(&out, 1, 0.75);
}

/// Why the tokens are fewer than the cycles (see `Params`): generating as many tokens as a
/// saturated worker charges conserves the sum of the tokens, so the flood, admitted from full
/// buckets, is never refused while its queue position keeps the other tenant below its share.
#[test]
fn as_many_tokens_as_cycles_lets_the_flood_win() {
    let out = run(
        &FLOOD,
        Setup {
            tokens_32nds: 32,
            ..ON
        },
    );
    assert!(out.share(0) > 0.5, "{out:?}");
    assert_eq!(out.fair_drops[0], 0, "{out:?}");
}

/// One receive queue for all tenants, tail-dropped when full: fairness still holds, since the
/// worker drops the refused packets faster than they arrive (dropping every arrival would take
/// 0.65 of the core), the queue drains and the other tenant's packets get in. (With drops at
/// 250 cycles, 1.6 cores for all arrivals, the flood got 27 % here: the queue drops some of the
/// other tenant's packets before the worker sees them.)
#[test]
fn shared_queue_fair_while_drops_keep_up() {
    let out = run(
        &FLOOD,
        Setup {
            queue: Queue::Shared,
            ..ON
        },
    );
    assert_share(&out, 0, 0.25);
    assert_share(&out, 1, 0.75);
}

/// Three tenants 1:3:2, the third idle: the first two split the whole core 1:3 (25 % and 75 %
/// instead of 1/6 and 1/2), and the core stays busy (≥ 95 % of the cycles used).
#[test]
fn idle_tenant_share_goes_to_the_others() {
    let traffic = [
        traffic(1, 1_000, 0.5),
        traffic(3, 700, 1.5),
        traffic(2, 900, 0.0),
    ];
    let out = run(&traffic, ON);
    assert_eq!(out.used[2], 0);
    assert_share(&out, 0, 0.25);
    assert_share(&out, 1, 0.75);
    assert!(out.total() as f64 >= 0.95 * out.window as f64, "{out:?}");
}

/// A tenant above its share on a core that is not full loses nothing: the other tenant's
/// unused tokens are its.
#[test]
fn no_fairness_drops_below_capacity() {
    let traffic = [traffic(1, 1_000, 0.4), traffic(3, 700, 0.4)];
    let out = run(&traffic, ON);
    assert_eq!(out.fair_drops, [0, 0], "{out:?}");
    for (i, t) in traffic.iter().enumerate() {
        let used = out.used[i] as f64 / out.window as f64;
        assert!(
            (used - t.offered).abs() <= 0.05 * t.offered,
            "tenant {i}: {out:?}"
        );
    }
}
