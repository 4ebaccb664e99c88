//! Contention microbenchmark of one ESP SA shared by several threads (RFC 4303 §3.3.3
//! sequence allocation, §3.4.3 anti-replay window): nanoseconds per `open`, per `seal` and per
//! bare window update on one thread, and per thread when two or more threads work on the same
//! SA at once (packets dealt round-robin, the worst case for shared cache lines), beside the
//! same work on one SA per thread (nothing shared: the reference).
//!
//! A program that prints figures, never a test:
//! `cargo run -p protego-esp --release --example contention [packets] [max_threads]`.
//! Times are per operation of the slowest thread, CPU and wall; the median of five runs in
//! which no thread was descheduled for long (see `measure`); run it on an otherwise idle
//! machine.

use std::net::Ipv4Addr;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crypto::{Encr, SaCipher};
use protego_esp::{InboundSa, OutboundSa, ReplayWindow, SaConfig, MAX_OVERHEAD, MAX_REPLAY_WINDOW};
use wire::ip::{IpProtocol, Ipv4Repr};
use wire::EspSpi;

const SPI: EspSpi = EspSpi(0x1000);
const INNER_LEN: usize = 64;
const RUNS: usize = 5;

fn cipher() -> SaCipher {
    let key: Vec<u8> = (0..Encr::AesGcm16_128.keymat_len() as u8).collect();
    SaCipher::new(Encr::AesGcm16_128, &key, None).expect("AES-GCM-128 takes 20 bytes")
}

fn config() -> SaConfig {
    SaConfig {
        // The widest window, so that a thread the scheduler delays does not turn the run
        // into a test of "too old" drops.
        replay_window: MAX_REPLAY_WINDOW,
        ..SaConfig::default()
    }
}

fn inner() -> Vec<u8> {
    let mut p = vec![0u8; INNER_LEN];
    Ipv4Repr {
        src_addr: Ipv4Addr::new(10, 0, 0, 1),
        dst_addr: Ipv4Addr::new(10, 0, 0, 2),
        protocol: IpProtocol::UDP,
        payload_len: INNER_LEN - 20,
        ttl: 64,
        dscp: 0,
        ecn: 0,
        ident: 1,
        dont_frag: true,
    }
    .emit(&mut p)
    .expect("64 bytes hold an IPv4 header");
    p
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "CLOCK_THREAD_CPUTIME_ID");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// What one configuration cost: the largest CPU time and the largest wall time of a thread,
/// and how many operations succeeded in all.
#[derive(Debug, Clone, Copy, Default)]
struct Run {
    cpu: Duration,
    wall: Duration,
    ok: usize,
}

/// Runs `f(state, thread)` on `threads` threads at once, released together; `f` returns the
/// operations that succeeded. A run counts only if no thread waited for a CPU for more than
/// 5 % of its time (wall time within 5 % of CPU time), so that contention is measured and not
/// the scheduler; the median of the first [`RUNS`] such runs out of at most `10 * RUNS`, each
/// with a fresh `setup()`. The flag is false if fewer than [`RUNS`] runs counted.
fn measure<S: Sync>(
    threads: usize,
    setup: impl Fn() -> S,
    f: impl Fn(&S, usize) -> usize + Sync,
) -> (Run, bool) {
    let mut counted = Vec::new();
    let mut all = Vec::new();
    for _ in 0..10 * RUNS {
        let s = setup();
        let go = Barrier::new(threads);
        let results: Vec<(Duration, Duration, usize)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let (s, f, go) = (&s, &f, &go);
                    scope.spawn(move || {
                        go.wait();
                        let (cpu, wall) = (thread_cpu(), Instant::now());
                        let ok = f(s, t);
                        (thread_cpu() - cpu, wall.elapsed(), ok)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("benchmark thread"))
                .collect()
        });
        let run = Run {
            cpu: results.iter().map(|r| r.0).max().unwrap_or_default(),
            wall: results.iter().map(|r| r.1).max().unwrap_or_default(),
            ok: results.iter().map(|r| r.2).sum(),
        };
        all.push(run);
        if results
            .iter()
            .all(|r| r.1.as_nanos() * 100 <= r.0.as_nanos() * 105)
        {
            counted.push(run);
            if counted.len() == RUNS {
                break;
            }
        }
    }
    let full = counted.len() == RUNS;
    let mut pick = if counted.is_empty() { all } else { counted };
    pick.sort_by_key(|r| r.cpu);
    (pick[pick.len() / 2], full)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let packets: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(400_000);
    let max_threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2);

    let out = OutboundSa::new(SPI, cipher(), &config()).expect("valid SA");
    let inner = inner();
    let stride = out.sealed_len(INNER_LEN);
    let mut sealed = vec![0u8; stride * packets];
    for pkt in sealed.chunks_exact_mut(stride) {
        let hl = out.header_len();
        pkt[hl..hl + INNER_LEN].copy_from_slice(&inner);
        out.seal(pkt, INNER_LEN).expect("seal");
    }

    println!(
        "AES-GCM-128, {INNER_LEN}-byte inner packets, {packets} packets, median of {RUNS} runs"
    );
    println!(
        "{:<28} {:>7} {:>10} {:>10} {:>10}",
        "operation", "threads", "cpu ns/op", "wall ns/op", "succeeded"
    );
    for threads in 1..=max_threads {
        let per_thread = packets / threads;
        let report = |name: &str, (r, full): (Run, bool)| {
            let ns = |d: Duration| d.as_nanos() as f64 / per_thread as f64;
            println!(
                "{name:<28} {threads:>7} {:>10.1} {:>10.1} {:>10}{}",
                ns(r.cpu),
                ns(r.wall),
                r.ok,
                if full {
                    ""
                } else {
                    "  (threads were descheduled)"
                }
            );
        };
        // Thread `t` opens the packets of every `threads`-th run of `run` packets.
        let open_runs = |inb: &InboundSa, t: usize, run: usize| {
            let mut buf = [0u8; INNER_LEN + MAX_OVERHEAD];
            let mut ok = 0;
            for (i, pkt) in sealed.chunks_exact(stride).enumerate() {
                if i / run % threads != t {
                    continue;
                }
                let b = &mut buf[..stride];
                b.copy_from_slice(pkt);
                ok += usize::from(inb.open(b).is_ok());
            }
            ok
        };
        let open = |inb: &InboundSa, t: usize| open_runs(inb, t, 1);
        let new_inbound = || InboundSa::new(SPI, cipher(), &config()).expect("valid SA");
        report("open, same SA", measure(threads, new_inbound, open));
        report(
            "open, same SA, runs of 32",
            measure(threads, new_inbound, |inb, t| open_runs(inb, t, 32)),
        );
        report(
            "open, one SA per thread",
            measure(
                threads,
                || (0..threads).map(|_| new_inbound()).collect::<Vec<_>>(),
                |sas, t| open(&sas[t], t),
            ),
        );

        let seal = |out: &OutboundSa| {
            let mut buf = [0u8; INNER_LEN + MAX_OVERHEAD];
            let hl = out.header_len();
            let mut ok = 0;
            for _ in 0..per_thread {
                buf[hl..hl + INNER_LEN].copy_from_slice(&inner);
                ok += usize::from(out.seal(&mut buf, INNER_LEN).is_ok());
            }
            ok
        };
        let new_outbound = || OutboundSa::new(SPI, cipher(), &config()).expect("valid SA");
        report(
            "seal, same SA",
            measure(threads, new_outbound, |o, _| seal(o)),
        );
        // Numbers allocated up front (a serial stage's job), sealed in parallel: the per-packet
        // work shares nothing but the counters.
        report(
            "seal_with_seq, same SA",
            measure(
                threads,
                || {
                    let out = new_outbound();
                    let seqs: Vec<u64> = (0..per_thread * threads)
                        .map(|_| out.allocate().expect("fresh SA"))
                        .collect();
                    (out, seqs)
                },
                |(out, seqs), t| {
                    let mut buf = [0u8; INNER_LEN + MAX_OVERHEAD];
                    let hl = out.header_len();
                    let mut ok = 0;
                    for &seq in seqs.iter().skip(t).step_by(threads) {
                        buf[hl..hl + INNER_LEN].copy_from_slice(&inner);
                        ok += usize::from(out.seal_with_seq(&mut buf, INNER_LEN, seq).is_ok());
                    }
                    ok
                },
            ),
        );
        report(
            "seal, one SA per thread",
            measure(
                threads,
                || (0..threads).map(|_| new_outbound()).collect::<Vec<_>>(),
                |sas, t| seal(&sas[t]),
            ),
        );

        report(
            "window update only, same",
            measure(
                threads,
                || ReplayWindow::new(MAX_REPLAY_WINDOW),
                |w, t| {
                    (1 + t as u64..=packets as u64)
                        .step_by(threads)
                        .filter(|&seq| w.update(seq).is_ok())
                        .count()
                },
            ),
        );
    }
}
