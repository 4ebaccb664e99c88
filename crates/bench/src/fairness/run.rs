//! One `protego bench fairness` session: the bench network and load generator of
//! `protego bench` ([`crate::net`], [`crate::load`]), the tenants' programs compiled, then for
//! each round every case in each of its modes (their order turned by one each round): a fresh
//! gateway with the case's configuration, its tunnels negotiated over IKEv2, a warm-up, one
//! measured run of the tenants' interleaved traffic with the gateway's status read just
//! before and after it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use testbed::{CleanupHandle, Testbed};

use super::config::{self, GatewayFiles, Objects, DNS_BURST, DNS_RATE};
use super::summary::{summarize, targets};
use super::traffic::{PlanTenant, TenantPlan};
use super::{
    CaseSpec, FairOptions, FairReport, FairSettings, Mode, Program, RunFigures, TenantRun,
    FAIR_REPORT_VERSION,
};
use crate::error::{BenchError, Result};
use crate::gateway::{self, ProtegoUnderTest};
use crate::ike_client::{IkeClient, TunnelSa};
use crate::load::{Flow, HostSide, Loadgen, RunResult, RunSpec, UnderTest, TRAINS_PER_CALL};
use crate::net::{self, BenchNet};
use crate::options::PacketSize;

/// Packets per GSO train at most.
const TRAIN: usize = 64;

/// The GSO train of a plan in blocks of `block`: one block each, so a train is one tenant's
/// packets, as trains from separate peers are (trains of several tenants' blocks, of one
/// length, would arrive at the gateway as one GRO buffer of one 5-tuple, which the kernel
/// gate lets pass whole). Cases interleaved packet by packet (`block` 1: the charge's worst
/// case, one run per packet) keep trains of [`TRAIN`]: one peer whose tunnels belong to
/// several tenants.
fn train_of(block: u32) -> usize {
    match block {
        1 => TRAIN,
        b => (b as usize).min(TRAIN),
    }
}

/// Where a run's gateway finds its files.
struct Ctx<'a> {
    opts: &'a FairOptions,
    bin: &'a Path,
    dir: &'a Path,
    psk: &'a Path,
    objects: &'a Objects,
}

/// Runs the benchmark: `progress` hears what happens, `on_start` gets the test bed's cleanup
/// handle once it exists (for a Ctrl-C handler).
pub fn run(
    opts: &FairOptions,
    progress: &mut dyn FnMut(&str),
    on_start: &mut dyn FnMut(CleanupHandle),
) -> Result<FairReport> {
    opts.validate()?;
    let bed = Testbed::new()?;
    if opts.keep {
        bed.keep_files(true);
    }
    on_start(bed.cleanup_handle());
    let bench = BenchNet::build(&bed)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    let mut load = Loadgen::new(&bench, opts.pool_bytes, interrupted)?;
    if let Some(n) = opts.nice {
        // Threads inherit their creator's nice value: the IKE threads started later too.
        renice(std::process::id(), n)?;
    }
    let dir = bed.dir().join("fair");
    std::fs::create_dir_all(&dir)
        .map_err(|e| BenchError::io(format!("create {}", dir.display()), e))?;
    let psk = gateway::write_psk(&dir)?;
    let objects = config::compile_programs(&dir)?;
    let bin = crate::gateway::protego_binary(opts.protego_bin.as_deref())?;
    progress(&format!(
        "programs compiled; run directory {}; {} case(s), {} round(s)",
        dir.display(),
        opts.cases.len(),
        opts.rounds
    ));
    let ctx = Ctx {
        opts,
        bin: &bin,
        dir: &dir,
        psk: &psk,
        objects: &objects,
    };
    let mut runs = Vec::new();
    let mut errors = Vec::new();
    let mut index = 0u32;
    for round in 1..=opts.rounds {
        for case in &opts.cases {
            let mut modes = opts.modes_of(case);
            if !modes.is_empty() {
                let turn = (round as usize - 1) % modes.len();
                modes.rotate_left(turn);
            }
            for mode in modes {
                index += 1;
                let label = format!("f{index}");
                match run_one(&ctx, &bench, &mut load, case, mode, round, &label) {
                    Ok(fig) => {
                        progress(&line(case, &fig));
                        runs.push(fig);
                    }
                    Err(BenchError::Interrupted) => return Err(BenchError::Interrupted),
                    Err(e) => {
                        let msg = format!("{} / {} round {round}: {e}", case.name, mode.name());
                        progress(&format!("error: {msg}"));
                        errors.push(msg);
                    }
                }
            }
        }
    }
    let summaries = summarize(&opts.cases, &runs);
    let targets = targets(&summaries);
    drop(load);
    drop(bench);
    drop(bed);
    Ok(FairReport {
        version: FAIR_REPORT_VERSION,
        machine: crate::session::machine(
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1),
        ),
        settings: FairSettings {
            rounds: opts.rounds,
            duration_s: opts.duration.as_secs_f64(),
            rate_pps: opts.rate_pps,
            workers: opts.workers,
            cipher: opts.cipher.name().to_owned(),
            gateway_options: opts.gateway_options.clone(),
            nice: opts.nice,
            block: opts.block,
            dns_rate: (DNS_RATE, DNS_BURST),
            notes: notes(),
        },
        cases: opts.cases.clone(),
        summaries,
        targets,
        runs,
        errors,
    })
}

fn notes() -> Vec<String> {
    vec![
        "cpu% = the tenant's part of the CPU the gateway charged to tenants over the run (protego status `tenants` cpu_ns); absent with cpu_fairness = off, so `account` (charged, nothing refused) stands for \"without fairness\"".to_owned(),
        "fair% = weighted max-min fair share: weight over the weights of the tenants that send, a tenant wanting less keeping only what it wants (its demand: its packets that reached the gateway, refused ones included, times its cost per packet in the account runs, over the CPU charged; median over the charged runs)".to_owned(),
        "dev = cpu% / fair% - 1; Jain = Jain's index of cpu%/fair% over the tenants that send".to_owned(),
        "dec.Mpps = packets the gateway decrypted for the tenant (its CHILD_SAs' packets_in), i.e. admitted past the fairness gate; the tenant's program may then drop them (DNS limiter) or answer them (SYN cookie, XDP_TX)".to_owned(),
        "gateway ns/packet = the gateway process's CPU time (schedstat of all its threads) over the run per decrypted packet".to_owned(),
        "each run: a fresh gateway, tunnels negotiated, warm-up, then the tenants' packets interleaved in blocks and sent at the offered rate; medians over the rounds".to_owned(),
    ]
}

fn line(case: &CaseSpec, f: &RunFigures) -> String {
    let charged: Option<u64> = f.tenants.iter().map(|t| t.cpu_ns).sum();
    let shares = f
        .tenants
        .iter()
        .map(|t| {
            let share = match (t.cpu_ns, charged) {
                (Some(c), Some(all)) if all > 0 => format!("{:.1}%", c as f64 * 100.0 / all as f64),
                _ => "-".to_owned(),
            };
            format!(
                "{} {:.3} Mpps cpu {share}",
                t.tenant,
                t.decrypted as f64 / f.span_s.max(1e-9) / 1e6
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "{} / {} round {}: offered {:.3} Mpps, gateway {:.2} cores, load average {}; {shares}",
        case.name,
        f.mode,
        f.round,
        f.offered_pps / 1e6,
        f.gateway_cpu_ns as f64 / 1e9 / f.span_s.max(1e-9),
        f.loadavg
            .map_or_else(|| "-".to_owned(), |l| format!("{l:.1}"))
    )
}

/// The tunnels of `case` in configuration order, as `(tenant index, tunnel index)`.
fn tunnel_owners(case: &CaseSpec) -> Vec<usize> {
    case.tenants
        .iter()
        .enumerate()
        .flat_map(|(k, t)| std::iter::repeat_n(k, t.tunnels as usize))
        .collect()
}

/// The plan of `case`'s traffic over its tunnels.
pub(crate) fn plan_of(case: &CaseSpec) -> Result<TenantPlan> {
    let owners = tunnel_owners(case);
    let tenants = case
        .tenants
        .iter()
        .enumerate()
        .map(|(k, t)| PlanTenant {
            traffic: t.traffic,
            share: t.share,
            tunnels: owners
                .iter()
                .enumerate()
                .filter(|(_, &o)| o == k)
                .map(|(i, _)| (i, net::tunnel_addr(i as u32)))
                .collect(),
        })
        .collect();
    TenantPlan::new(tenants, case.block).ok_or_else(|| BenchError::InvalidOption {
        option: "--cases",
        value: case.name.to_owned(),
        reason: "no tenant sends, or one that sends has no tunnel".to_owned(),
    })
}

fn run_one(
    ctx: &Ctx<'_>,
    bench: &BenchNet,
    load: &mut Loadgen,
    case: &CaseSpec,
    mode: Mode,
    round: u32,
    label: &str,
) -> Result<RunFigures> {
    let socket = ctx.dir.join(format!("{label}.sock"));
    let files = GatewayFiles {
        socket: &socket,
        psk_file: ctx.psk,
        objects: ctx.objects,
        workers: ctx.opts.workers,
        cipher: ctx.opts.cipher,
        extra: &ctx.opts.gateway_options,
    };
    let text = config::render(case, mode, &files);
    let gw = ProtegoUnderTest::start_with_config(
        &bench.gw,
        ctx.bin,
        ctx.dir,
        label,
        &text,
        &socket,
        ctx.opts.keep,
    )?;
    let result = match ctx.opts.nice {
        Some(n) => renice(gw.pid(), n).and_then(|()| measure(ctx, load, case, mode, round, &gw)),
        None => measure(ctx, load, case, mode, round, &gw),
    };
    let _ = load.set_ike_inbox(None);
    gw.stop();
    result
}

fn measure(
    ctx: &Ctx<'_>,
    load: &mut Loadgen,
    case: &CaseSpec,
    mode: Mode,
    round: u32,
    gw: &ProtegoUnderTest,
) -> Result<RunFigures> {
    let tunnels = case.tunnels();
    let client = IkeClient::start(
        gw.name(),
        Arc::clone(&load.ike),
        Arc::clone(&load.natt),
        tunnels,
        ctx.opts.cipher,
    )?;
    load.set_ike_inbox(Some(client.inbox()))?;
    let sas = client.establish(tunnels)?;
    // Warm up through every tunnel whose program lets UDP to the VM by (the spinning one
    // aborts everything): the gateway learns the VM's MAC in each VNet.
    let owners = tunnel_owners(case);
    let passing = owners
        .iter()
        .take_while(|&&k| case.tenants[k].program != Program::Spin)
        .count();
    warm_up(load, &sas[..passing], gw)?;
    let block = ctx.opts.block.unwrap_or(case.block);
    let plan = plan_of(&CaseSpec {
        block,
        ..case.clone()
    })?;
    let spec = RunSpec {
        size: PacketSize::Fixed(64),
        packets: (ctx.opts.rate_pps * ctx.opts.duration.as_secs_f64()).clamp(1000.0, 4e9) as u32,
        rate_pps: ctx.opts.rate_pps,
        train: train_of(block),
        per_call: TRAINS_PER_CALL,
        record: false,
    };
    let r = load.run(
        &Flow::Planned {
            sas: &sas,
            plan: &plan,
        },
        &spec,
        Some(gw),
    )?;
    drop(client);
    figures(case, mode, round, &plan, &r).ok_or_else(|| BenchError::Status {
        path: gw.socket().to_owned(),
        reason: "no status document around the run".to_owned(),
    })
}

/// Sets the nice value of every thread of process `pid` (Linux keeps one per thread).
fn renice(pid: u32, nice: i32) -> Result<()> {
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).map_err(|e| BenchError::io(format!("list {dir}"), e))?;
    for task in tasks.flatten() {
        let Some(tid) = task
            .file_name()
            .to_str()
            .and_then(|t| t.parse::<libc::id_t>().ok())
        else {
            continue;
        };
        // SAFETY: setpriority takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            // A thread that ended between the listing and now (the gateway's short-lived
            // helpers) has no nice value to set; three runs of one reported run were lost so.
            if e.raw_os_error() == Some(libc::ESRCH) {
                continue;
            }
            return Err(BenchError::io(
                format!("set the nice value of thread {tid} of {pid} to {nice}"),
                e,
            ));
        }
    }
    Ok(())
}

/// Sends a few packets through `sas` until they arrive.
fn warm_up(load: &mut Loadgen, sas: &[TunnelSa], gw: &dyn UnderTest) -> Result<()> {
    if sas.is_empty() {
        return Ok(());
    }
    let spec = RunSpec {
        size: PacketSize::Fixed(128),
        packets: (sas.len() as u32 * 4).clamp(200, 4000),
        rate_pps: 20_000.0,
        train: 1,
        per_call: TRAINS_PER_CALL,
        record: false,
    };
    let mut last = RunResult::default();
    for _ in 0..5 {
        last = load.run(
            &Flow::Inbound {
                sas,
                host: HostSide::Vxlan,
            },
            &spec,
            Some(gw),
        )?;
        if last.delivered > 0 && last.delivered >= last.sent.saturating_sub(last.sent / 100) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    Err(BenchError::NoTraffic {
        case: "fairness warm-up".to_owned(),
        detail: format!(
            "only {} of {} inbound packets arrived (gateway drop counters {:?})",
            last.delivered, last.sent, last.gateway_drops
        ),
    })
}

/// Per-tenant counters of a status document.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct TenantCounters {
    pub(crate) decrypted: u64,
    pub(crate) cpu_ns: Option<u64>,
    pub(crate) counted: Option<u64>,
    pub(crate) fair_drops: Option<u64>,
    pub(crate) tokens_ns: Option<i64>,
    pub(crate) filter_drops: u64,
    pub(crate) filter_aborted: u64,
}

/// The counters of every tenant in a status document, by tenant name.
pub(crate) fn tenant_counters(status: &Value) -> HashMap<String, TenantCounters> {
    let mut out: HashMap<String, TenantCounters> = HashMap::new();
    for t in status
        .get("tunnels")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(tenant) = t.get("tenant").and_then(Value::as_str) else {
            continue;
        };
        let packets: u64 = t
            .get("ike_sas")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|s| s.get("children").and_then(Value::as_array))
            .flatten()
            .filter_map(|c| c.get("packets_in").and_then(Value::as_u64))
            .sum();
        out.entry(tenant.to_owned()).or_default().decrypted += packets;
    }
    for t in status
        .get("tenants")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(tenant) = t.get("tenant").and_then(Value::as_str) else {
            continue;
        };
        let e = out.entry(tenant.to_owned()).or_default();
        e.cpu_ns = t.get("cpu_ns").and_then(Value::as_u64);
        e.counted = t.get("packets").and_then(Value::as_u64);
        e.fair_drops = t.get("fair_drops").and_then(Value::as_u64);
        e.tokens_ns = t.get("tokens_ns").and_then(Value::as_i64);
    }
    if let Some(drops) = status.get("drops").and_then(Value::as_object) {
        for (key, v) in drops {
            let Some((tenant, reason)) = key.split_once('/') else {
                continue;
            };
            let n = v.as_u64().unwrap_or(0);
            let e = out.entry(tenant.to_owned()).or_default();
            match reason {
                "filter_drop" => e.filter_drops += n,
                "filter_aborted" => e.filter_aborted += n,
                _ => {}
            }
        }
    }
    out
}

fn since(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    Some(a?.saturating_sub(b.unwrap_or(0)))
}

/// The figures of one run from its result and the status documents around it.
pub(crate) fn figures(
    case: &CaseSpec,
    mode: Mode,
    round: u32,
    plan: &TenantPlan,
    r: &RunResult,
) -> Option<RunFigures> {
    let (s0, s1) = r.status.as_ref()?;
    let (c0, c1) = (tenant_counters(s0), tenant_counters(s1));
    let offered = plan.counts(r.sent);
    let unattributed = |s: &Value| s.get("cpu_unattributed_ns").and_then(Value::as_u64);
    // Absent while zero.
    let capped = |s: &Value| {
        s.get("cpu_capped_phases")
            .and_then(Value::as_u64)
            .or(Some(0))
    };
    let charged = mode != Mode::Off;
    let tenants = case
        .tenants
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let before = c0.get(&t.name).cloned().unwrap_or_default();
            let after = c1.get(&t.name).cloned().unwrap_or_default();
            // A tenant the charge never saw is absent from `tenants`: zero, not unknown.
            let charged_or = |a: Option<u64>, b: Option<u64>| {
                if charged {
                    Some(since(a, b).unwrap_or(0))
                } else {
                    since(a, b)
                }
            };
            TenantRun {
                tenant: t.name.clone(),
                offered: offered.get(k).copied().unwrap_or(0),
                decrypted: after.decrypted.saturating_sub(before.decrypted),
                counted: charged_or(after.counted, before.counted),
                cpu_ns: charged_or(after.cpu_ns, before.cpu_ns),
                fair_drops: charged_or(after.fair_drops, before.fair_drops),
                filter_drops: after.filter_drops.saturating_sub(before.filter_drops),
                filter_aborted: after.filter_aborted.saturating_sub(before.filter_aborted),
                tokens_ns: after.tokens_ns,
            }
        })
        .collect();
    Some(RunFigures {
        case: case.name.to_owned(),
        mode: mode.name().to_owned(),
        round,
        sent: r.sent,
        span_s: r.send_span_s,
        offered_pps: if r.send_span_s > 0.0 {
            r.sent as f64 / r.send_span_s
        } else {
            0.0
        },
        gateway_cpu_ns: r.cpu_ns,
        host_delivered: r.delivered,
        socket_drops: r.gateway_socket_drops,
        unattributed_ns: since(unattributed(s1), unattributed(s0)).filter(|_| charged),
        capped_phases: charged.then(|| since(capped(s1), capped(s0)).unwrap_or(0)),
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok()),
        tenants,
    })
}
