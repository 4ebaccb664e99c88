//! The edge bench's traffic on the CE side: paced `sendmmsg` of pre-built tagged frames, and
//! a receiver thread per run that counts the run's packets in the frames the gateway sends to
//! the CE (with their kernel receive times for latency); and the wait for a run's stragglers.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::frames;
use super::packet_sock::{self, PacketSocket, RecvFrames};
use crate::error::{BenchError, Result};
use crate::load;
use crate::packet;
use crate::sock::realtime_ns;

/// How long the receiver may see nothing new before a run is over.
const QUIET: Duration = Duration::from_millis(150);
/// Longest wait for a run's stragglers.
const DRAIN_MAX: Duration = Duration::from_secs(10);
/// Polling interval of the CE receiver.
const POLL: Duration = Duration::from_micros(50);

/// The CE's receiver for one run: counts the run's packets in the tagged frames it reads.
pub(super) struct CeReceiver {
    stop: Arc<AtomicBool>,
    pub(super) progress: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<CeCount>,
}

#[derive(Default)]
pub(super) struct CeCount {
    pub(super) packets: u64,
    pub(super) first_ns: Option<u64>,
    pub(super) last_ns: Option<u64>,
    pub(super) samples: Vec<(u32, u64)>,
}

impl CeReceiver {
    pub(super) fn start(sock: Arc<PacketSocket>, tag: u32, record: bool) -> Result<CeReceiver> {
        let stop = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicU64::new(0));
        let (s, p) = (Arc::clone(&stop), Arc::clone(&progress));
        let thread = std::thread::Builder::new()
            .name("bench-rx-ce".into())
            .spawn(move || {
                load::set_timer_slack(1_000);
                let mut batch = RecvFrames::default();
                let mut c = CeCount::default();
                while !s.load(Ordering::Relaxed) {
                    if sock.recv(&mut batch) == 0 {
                        std::thread::sleep(POLL);
                        continue;
                    }
                    for (frame, stamp) in batch.iter() {
                        let Some(m) = frames::ip_payload(frame).and_then(packet::read_inner) else {
                            continue;
                        };
                        if m.tag != tag {
                            continue;
                        }
                        let stamp = stamp.unwrap_or_else(realtime_ns);
                        c.packets += 1;
                        c.first_ns = Some(c.first_ns.map_or(stamp, |f| f.min(stamp)));
                        c.last_ns = Some(c.last_ns.map_or(stamp, |l| l.max(stamp)));
                        if record {
                            c.samples.push((m.index, stamp));
                        }
                    }
                    p.store(c.packets, Ordering::Relaxed);
                }
                c
            })
            .map_err(|e| BenchError::io("spawn the CE receiver", e))?;
        Ok(CeReceiver {
            stop,
            progress,
            thread,
        })
    }

    pub(super) fn finish(self) -> Result<CeCount> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().map_err(|_| BenchError::Thread {
            thread: "rx-ce",
            reason: "panicked".into(),
        })
    }
}

/// Waits until `progress` reaches `target` or stops moving for [`QUIET`].
pub(super) fn drain(progress: impl Fn() -> u64, target: u64) {
    let start = Instant::now();
    let mut last = progress();
    let mut changed = Instant::now();
    loop {
        std::thread::sleep(Duration::from_millis(5));
        let p = progress();
        if p >= target || start.elapsed() > DRAIN_MAX {
            return;
        }
        if p != last {
            last = p;
            changed = Instant::now();
        } else if changed.elapsed() > QUIET {
            return;
        }
    }
}

/// Sends `count` frames of `len` bytes laid out every `stride` bytes in `frames` from `sock`
/// at `rate` packets per second (infinite: as fast as the socket takes them), stamping each
/// frame's send time in `send_ns`. Returns the frames the kernel took.
pub(super) fn send_frames_paced(
    sock: &PacketSocket,
    frames: &[u8],
    stride: usize,
    len: usize,
    count: usize,
    rate: f64,
    send_ns: &mut [u64],
) -> u64 {
    let t0 = Instant::now();
    let mut k = 0usize;
    let mut sent = 0u64;
    let mut batch: Vec<&[u8]> = Vec::with_capacity(packet_sock::BATCH);
    while k < count {
        let due = if rate.is_finite() && rate > 0.0 {
            ((t0.elapsed().as_secs_f64() * rate) as usize + 1).min(count)
        } else {
            count
        };
        if k >= due {
            let next = t0 + Duration::from_secs_f64(k as f64 / rate);
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
            continue;
        }
        let end = due.min(k + packet_sock::BATCH);
        batch.clear();
        batch.extend((k..end).map(|i| &frames[i * stride..i * stride + len]));
        let now = realtime_ns();
        for s in &mut send_ns[k..end] {
            *s = now;
        }
        sent += sock.send(&batch) as u64;
        k = end;
    }
    sent
}
