//! A paced UDP probe stream that times the path between two namespaces to the microsecond
//! (`protego-probe`): the sender writes a sequence number and its send time into each
//! datagram at a fixed rate, the receiver records the kernel's arrival time of each
//! (`SO_TIMESTAMPNS`, so a receiver that is scheduled late does not move it). From the
//! samples a test reads how long the path stopped forwarding while something happened (a
//! table load, a migration): the longest time between arrivals, whether the sender itself
//! paused then, the largest one-way delay, and what was lost or reordered.
//!
//! `ping -i 0.01` cannot say this: on a loaded machine its own timer fires every 16–20 ms,
//! and a reply's arrival time is when ping read it.
//!
//! Both ends run in namespaces of one machine, so `CLOCK_REALTIME` is one clock for both.

use crate::error::{Error, Result};
use std::io::{BufRead, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Bytes of a probe datagram: magic, sequence number, send time (ns since the epoch).
pub const PROBE_LEN: usize = 24;
const MAGIC: &[u8; 8] = b"PGPROBE1";

/// One datagram as the receiver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// Its sequence number (from 0).
    pub seq: u64,
    /// When it was sent (ns since the epoch, the sender's clock).
    pub sent_ns: u64,
    /// When it arrived (ns since the epoch, the kernel's timestamp).
    pub arrived_ns: u64,
}

/// What a run of samples says about the path, over a window of send times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeStats {
    /// Datagrams sent in the window (by sequence number, from the first to the last seen).
    pub sent: u64,
    /// Of those, received.
    pub received: u64,
    /// Received after a higher sequence number.
    pub reordered: u64,
    /// The longest time between two consecutive arrivals (µs).
    pub longest_gap_us: u64,
    /// The time the sender took to send those two (µs): when it is close to the gap, the
    /// sender paused, not the path.
    pub sender_gap_us: u64,
    /// The largest one-way delay (µs): a path that stopped for `d` delays what waited by up
    /// to `d`.
    pub max_delay_us: u64,
    /// The median one-way delay (µs).
    pub median_delay_us: u64,
}

impl ProbeStats {
    /// The path's own longest stall (µs): the longest time nothing arrived, less the time the
    /// sender itself took between those two datagrams (what it did not send could not
    /// arrive). Delay is reported apart: under a TCP stream queues grow and shrink by
    /// milliseconds while the path forwards all along, which is not a stall.
    pub fn stall_us(&self) -> u64 {
        self.longest_gap_us.saturating_sub(self.sender_gap_us)
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// Sends `rate` datagrams a second from `bind` to `to` for `duration`, paced on an absolute
/// schedule (a late send does not shift the ones after it). Returns how many were sent.
pub fn send(bind: SocketAddr, to: SocketAddr, rate: u32, duration: Duration) -> Result<u64> {
    let sock = UdpSocket::bind(bind)
        .map_err(|e| Error::io("bind the probe sender", bind.to_string(), e))?;
    sock.connect(to)
        .map_err(|e| Error::io("connect the probe sender", to.to_string(), e))?;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    let start = Instant::now();
    let mut seq = 0u64;
    let mut buf = [0u8; PROBE_LEN];
    buf[..8].copy_from_slice(MAGIC);
    while start.elapsed() < duration {
        let due = start + interval * (seq as u32);
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        buf[8..16].copy_from_slice(&seq.to_be_bytes());
        buf[16..24].copy_from_slice(&now_ns().to_be_bytes());
        // A full socket buffer or an unreachable path loses this one; the receiver counts it.
        let _ = sock.send(&buf);
        seq += 1;
    }
    Ok(seq)
}

/// Receives probe datagrams on `bind` and appends one line per datagram to `out`
/// (`seq,sent_ns,arrived_ns`), until `idle` passes with none after the first (or `limit`
/// passes in all). `ready` is called once the socket is bound. Returns the number received.
pub fn receive(
    bind: SocketAddr,
    out: &mut dyn Write,
    idle: Duration,
    limit: Duration,
    ready: impl FnOnce(),
) -> Result<u64> {
    use std::os::fd::AsRawFd;
    let sock = UdpSocket::bind(bind)
        .map_err(|e| Error::io("bind the probe receiver", bind.to_string(), e))?;
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and an int option of the size given.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(Error::io(
            "ask for arrival timestamps",
            bind.to_string(),
            std::io::Error::last_os_error(),
        ));
    }
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(|e| Error::io("set the probe receiver's timeout", bind.to_string(), e))?;
    ready();
    let started = Instant::now();
    let mut last = None::<Instant>;
    let mut count = 0u64;
    let mut data = [0u8; 64];
    let mut control = [0u64; 16];
    loop {
        if started.elapsed() >= limit || last.is_some_and(|l| l.elapsed() >= idle) {
            break;
        }
        let mut iov = libc::iovec {
            iov_base: data.as_mut_ptr().cast(),
            iov_len: data.len(),
        };
        // SAFETY: msghdr is plain data; every pointer set below outlives the call.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        // SAFETY: the buffers described by msg are valid for writes of their lengths.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::WouldBlock
                | std::io::ErrorKind::TimedOut
                | std::io::ErrorKind::Interrupted => continue,
                _ => return Err(Error::io("receive a probe", bind.to_string(), e)),
            }
        }
        let n = n as usize;
        if n != PROBE_LEN || &data[..8] != MAGIC {
            continue;
        }
        let arrived = arrival_ns(&msg).unwrap_or_else(now_ns);
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[at..at + 8]);
            u64::from_be_bytes(b)
        };
        writeln!(out, "{},{},{}", word(8), word(16), arrived)
            .map_err(|e| Error::io("write a probe sample", bind.to_string(), e))?;
        count += 1;
        last = Some(Instant::now());
    }
    out.flush()
        .map_err(|e| Error::io("write the probe samples", bind.to_string(), e))?;
    Ok(count)
}

/// The `SCM_TIMESTAMPNS` arrival time in a received message, if any.
fn arrival_ns(msg: &libc::msghdr) -> Option<u64> {
    // SAFETY: the CMSG macros walk the control buffer recvmsg filled, within its length.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                return Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(msg, c);
        }
    }
    None
}

/// Reads the samples a receiver wrote (lines it could not parse are skipped: a line being
/// written when the file was read).
pub fn read_samples(path: &Path) -> Result<Vec<Sample>> {
    let f = std::fs::File::open(path).map_err(|e| Error::io("open the probe samples", path, e))?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(f).lines() {
        let line = line.map_err(|e| Error::io("read the probe samples", path, e))?;
        let mut it = line.split(',').map(|w| w.parse::<u64>());
        if let (Some(Ok(seq)), Some(Ok(sent_ns)), Some(Ok(arrived_ns)), None) =
            (it.next(), it.next(), it.next(), it.next())
        {
            out.push(Sample {
                seq,
                sent_ns,
                arrived_ns,
            });
        }
    }
    Ok(out)
}

/// The statistics of the samples sent within `[from_ns, to_ns]` (in arrival order, as the
/// receiver wrote them). None if fewer than two fall in it.
pub fn stats(samples: &[Sample], from_ns: u64, to_ns: u64) -> Option<ProbeStats> {
    let inside: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.sent_ns >= from_ns && s.sent_ns <= to_ns)
        .collect();
    if inside.len() < 2 {
        return None;
    }
    let first = inside.iter().map(|s| s.seq).min()?;
    let last = inside.iter().map(|s| s.seq).max()?;
    let mut highest = None::<u64>;
    let mut reordered = 0;
    let (mut gap, mut sender_gap) = (0u64, 0u64);
    for w in inside.windows(2) {
        let g = w[1].arrived_ns.saturating_sub(w[0].arrived_ns);
        if g > gap {
            gap = g;
            sender_gap = w[1].sent_ns.saturating_sub(w[0].sent_ns);
        }
    }
    for s in &inside {
        if highest.is_some_and(|h| s.seq < h) {
            reordered += 1;
        }
        highest = Some(highest.map_or(s.seq, |h| h.max(s.seq)));
    }
    let mut delays: Vec<u64> = inside
        .iter()
        .map(|s| s.arrived_ns.saturating_sub(s.sent_ns))
        .collect();
    delays.sort_unstable();
    let mut seqs: Vec<u64> = inside.iter().map(|s| s.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    Some(ProbeStats {
        sent: last - first + 1,
        received: seqs.len() as u64,
        reordered,
        longest_gap_us: gap / 1000,
        sender_gap_us: sender_gap / 1000,
        max_delay_us: delays.last().copied().unwrap_or(0) / 1000,
        median_delay_us: delays[delays.len() / 2] / 1000,
    })
}

/// A probe stream running between two namespaces (`protego-probe` processes): start it,
/// do what is to be timed, then [`ProbeStream::finish`] and read the samples.
pub struct ProbeStream {
    receiver: crate::Process,
    sender: crate::Process,
    samples: std::path::PathBuf,
}

impl ProbeStream {
    /// Starts a receiver on `to` in `to_ns` and a sender from `from` (port 0: any) in
    /// `from_ns`, `rate` datagrams a second for at most `limit`.
    pub fn start(
        from_ns: &crate::Netns,
        from: std::net::IpAddr,
        to_ns: &crate::Netns,
        to: SocketAddr,
        rate: u32,
        limit: Duration,
    ) -> Result<ProbeStream> {
        let bin = crate::workspace_bin("protego-probe")?;
        let bin = bin.to_string_lossy().into_owned();
        let samples = to_ns.run_dir().join(format!("probe-{}.csv", to.port()));
        let receiver = to_ns.spawn(
            "probe-recv",
            crate::Cmd::new(bin.clone()).args([
                "recv".to_owned(),
                to.to_string(),
                samples.to_string_lossy().into_owned(),
                // Idle: the receiver ends 1 s after the sender stopped.
                "1000".to_owned(),
                (limit.as_secs() + 5).to_string(),
            ]),
        )?;
        crate::wait::wait_for(
            "the probe receiver to listen",
            Duration::from_secs(10),
            || {
                receiver.check_running()?;
                Ok(if receiver.log().contains("listening") {
                    crate::wait::Probe::Ready(())
                } else {
                    crate::wait::Probe::NotYet(receiver.log_tail(3))
                })
            },
        )?;
        let sender = from_ns.spawn(
            "probe-send",
            crate::Cmd::new(bin).args([
                "send".to_owned(),
                SocketAddr::new(from, 0).to_string(),
                to.to_string(),
                rate.to_string(),
                limit.as_secs_f64().to_string(),
            ]),
        )?;
        Ok(ProbeStream {
            receiver,
            sender,
            samples,
        })
    }

    /// Stops the sender, lets the receiver take what is in flight and end, and returns the
    /// samples.
    pub fn finish(self) -> Result<Vec<Sample>> {
        self.sender.stop();
        // The receiver ends by itself once idle for 1 s.
        let _ = self.receiver.wait(Duration::from_secs(5));
        self.receiver.stop();
        read_samples(&self.samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(seq: u64, sent_us: u64, arrived_us: u64) -> Sample {
        Sample {
            seq,
            sent_ns: sent_us * 1000,
            arrived_ns: arrived_us * 1000,
        }
    }

    #[test]
    fn a_stall_of_the_path_shows_as_gap_and_delay() {
        // 1 ms apart, 100 µs delay; the path stops from 3.0 to 9.0 ms: 3..8 wait and
        // arrive together at 9 ms.
        let mut v: Vec<Sample> = (0..3).map(|i| s(i, i * 1000, i * 1000 + 100)).collect();
        v.extend((3..9).map(|i| s(i, i * 1000, 9000 + i)));
        v.extend((9..12).map(|i| s(i, i * 1000, i * 1000 + 100)));
        let st = stats(&v, 0, u64::MAX).expect("samples");
        assert_eq!(st.sent, 12);
        assert_eq!(st.received, 12);
        assert_eq!(st.reordered, 0);
        assert_eq!(st.longest_gap_us, 9003 - 2100);
        assert_eq!(st.sender_gap_us, 1000);
        assert_eq!(st.max_delay_us, 9003 - 3000);
        assert_eq!(st.stall_us(), 9003 - 2100 - 1000);
    }

    #[test]
    fn a_sender_pause_is_not_the_path_s() {
        // The sender pauses 20 ms between 4 and 5; every datagram takes 100 µs.
        let v: Vec<Sample> = (0..10)
            .map(|i| {
                let t = if i < 5 { i * 1000 } else { i * 1000 + 20_000 };
                s(i, t, t + 100)
            })
            .collect();
        let st = stats(&v, 0, u64::MAX).expect("samples");
        assert_eq!(st.longest_gap_us, 21_000);
        assert_eq!(st.sender_gap_us, 21_000);
        assert_eq!(st.stall_us(), 0);
    }

    #[test]
    fn losses_and_reordering_are_counted_in_the_window() {
        let v = vec![
            s(0, 0, 100),
            s(2, 2000, 2100),
            s(1, 1000, 2200),
            s(5, 5000, 5100),
        ];
        let st = stats(&v, 0, 10_000_000).expect("samples");
        assert_eq!(st.sent, 6);
        assert_eq!(st.received, 4);
        assert_eq!(st.reordered, 1);
        // Outside the window: only 2 and 1 remain (sent 1.0–2.0 ms).
        let st = stats(&v, 1_000_000, 2_000_000).expect("samples");
        assert_eq!((st.sent, st.received), (2, 2));
        assert!(stats(&v, 9_000_000, 9_500_000).is_none());
    }

    #[test]
    fn samples_round_trip_through_the_file() {
        let dir = std::env::temp_dir().join(format!("probe-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("samples.csv");
        std::fs::write(&path, "0,10,20\n1,30,40\ngarbage\n2,50").expect("write");
        let v = read_samples(&path).expect("read");
        let want = [
            Sample {
                seq: 0,
                sent_ns: 10,
                arrived_ns: 20,
            },
            Sample {
                seq: 1,
                sent_ns: 30,
                arrived_ns: 40,
            },
        ];
        assert_eq!(v, want);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
