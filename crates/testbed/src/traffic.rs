//! Traffic helpers: ping (ICMP echo, RFC 792 / RFC 4443) with parsed loss
//! statistics, iperf3 server/client with parsed JSON results, and packet
//! captures (tcpdump to pcap, decoded independently with tshark).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::bed::Process;
use crate::cmd::{shorten, Cmd};
use crate::error::{Error, Result};
use crate::netns::Netns;
use crate::wait::{wait_for, Probe};

/// Default iperf3 port.
pub const IPERF3_PORT: u16 = 5201;

/// How to ping.
#[derive(Clone, Debug, PartialEq)]
pub struct PingOptions {
    /// Source address (`-I`), e.g. a LAN address inside a traffic selector.
    pub source: Option<IpAddr>,
    /// Number of echo requests (`-c`).
    pub count: u32,
    /// Interval between requests (`-i`; below 2 ms needs root, which the test bed has).
    pub interval: Duration,
    /// Payload size (`-s`).
    pub size: Option<u32>,
    /// How long to wait for the last reply (`-W`).
    pub reply_timeout: Duration,
}

impl PingOptions {
    /// `count` pings at `interval`, 1 s wait for the last reply.
    pub fn new(count: u32, interval: Duration) -> PingOptions {
        PingOptions {
            source: None,
            count,
            interval,
            size: None,
            reply_timeout: Duration::from_secs(1),
        }
    }

    /// Sets the source address.
    pub fn from(mut self, source: IpAddr) -> PingOptions {
        self.source = Some(source);
        self
    }
}

/// What a ping run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct PingStats {
    /// Requests sent.
    pub transmitted: u32,
    /// Replies received.
    pub received: u32,
    /// ICMP errors received instead of replies.
    pub errors: u32,
    /// Average round-trip time, if any reply came back.
    pub rtt_avg: Option<Duration>,
}

impl PingStats {
    /// Requests without a reply.
    pub fn lost(&self) -> u32 {
        self.transmitted.saturating_sub(self.received)
    }

    /// Whether every request got its reply.
    pub fn all_received(&self) -> bool {
        self.transmitted > 0 && self.received == self.transmitted
    }
}

/// Pings `dst` from inside `ns`. Partial loss is a result, not an error; an
/// error means ping could not run (e.g. no route).
pub fn ping(ns: &Netns, dst: IpAddr, opts: &PingOptions) -> Result<PingStats> {
    let mut cmd = Cmd::new("ping").args([
        "-n".to_owned(),
        "-q".to_owned(),
        "-c".to_owned(),
        opts.count.to_string(),
        "-i".to_owned(),
        format!("{:.6}", opts.interval.as_secs_f64()),
        "-W".to_owned(),
        format!("{:.3}", opts.reply_timeout.as_secs_f64().max(0.001)),
    ]);
    if let Some(src) = opts.source {
        cmd = cmd.args(["-I".to_owned(), src.to_string()]);
    }
    if let Some(size) = opts.size {
        cmd = cmd.args(["-s".to_owned(), size.to_string()]);
    }
    let budget = opts.interval * opts.count + opts.reply_timeout + Duration::from_secs(10);
    let cmd = cmd.arg(dst.to_string()).timeout(budget).in_netns(ns.name());
    let out = cmd.output()?;
    match parse_ping(&out.stdout) {
        Ok(stats) if out.code() == Some(0) || out.code() == Some(1) => Ok(stats),
        _ => Err(cmd.failure(&out)),
    }
}

/// Parses the summary of `ping -q` (iputils).
pub fn parse_ping(text: &str) -> Result<PingStats> {
    let err = |detail: &str| Error::Parse {
        what: "ping statistics",
        detail: detail.to_owned(),
        input: shorten(text, 400),
    };
    let line = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .ok_or_else(|| err("no 'packets transmitted' line"))?;
    let mut transmitted = None;
    let mut received = None;
    let mut errors = 0;
    for part in line.split(',') {
        let part = part.trim();
        let mut words = part.split_whitespace();
        let (Some(n), Some(what)) = (words.next(), words.next()) else {
            continue;
        };
        let n = n.trim_start_matches('+');
        match what {
            "packets" => transmitted = n.parse().ok(),
            "received" => received = n.parse().ok(),
            "errors" => errors = n.parse().unwrap_or(0),
            _ => {}
        }
    }
    let rtt_avg = text
        .lines()
        .find(|l| l.starts_with("rtt") || l.starts_with("round-trip"))
        .and_then(|l| l.split('=').nth(1))
        .and_then(|v| v.trim().split('/').nth(1))
        .and_then(|avg| avg.parse::<f64>().ok())
        .map(|ms| Duration::from_secs_f64(ms / 1000.0));
    Ok(PingStats {
        transmitted: transmitted.ok_or_else(|| err("no transmitted count"))?,
        received: received.ok_or_else(|| err("no received count"))?,
        errors,
        rtt_avg,
    })
}

/// A running `iperf3 -s`.
#[derive(Clone, Debug)]
pub struct Iperf3Server {
    /// The server process.
    pub process: Process,
    /// The address it is bound to.
    pub addr: IpAddr,
    /// Its port.
    pub port: u16,
}

/// Starts `iperf3 -s -B bind -p port` in `ns` and waits until it listens.
pub fn iperf3_server(ns: &Netns, bind: IpAddr, port: u16) -> Result<Iperf3Server> {
    let process = ns.spawn(
        &format!("iperf3-server-{port}"),
        Cmd::new("iperf3").args([
            "-s".to_owned(),
            "-B".to_owned(),
            bind.to_string(),
            "-p".to_owned(),
            port.to_string(),
        ]),
    )?;
    wait_for(
        &format!("iperf3 server on {bind} port {port}"),
        Duration::from_secs(10),
        || {
            process.check_running()?;
            let out = ns.exec(Cmd::new("ss").args(["-Hltn", "sport", "=", &format!(":{port}")]))?;
            Ok(if out.trim().is_empty() {
                Probe::NotYet("not listening".to_owned())
            } else {
                Probe::Ready(())
            })
        },
    )?;
    Ok(Iperf3Server {
        process,
        addr: bind,
        port,
    })
}

/// How to run an iperf3 client.
#[derive(Clone, Debug, PartialEq)]
pub struct IperfOptions {
    /// Test duration (`-t`, whole seconds, at least 1).
    pub duration: Duration,
    /// Local address to bind (`-B`).
    pub bind: Option<IpAddr>,
    /// Server port (`-p`).
    pub port: u16,
    /// UDP at this many bits/s (`-u -b`); TCP when `None`.
    pub udp_bitrate: Option<u64>,
    /// Cap a TCP stream at this many bits/s (`-b`; ignored for UDP). Keeps a test that must
    /// lose nothing below what the slowest hop can carry (strongSwan's userspace ESP drops at
    /// its TUN queue when it is overrun).
    pub tcp_bitrate: Option<u64>,
    /// Server sends, client receives (`-R`).
    pub reverse: bool,
    /// Parallel streams (`-P`).
    pub parallel: u32,
    /// Buffer / datagram length (`-l`).
    pub length: Option<u32>,
}

impl IperfOptions {
    /// TCP for `duration` on the default port.
    pub fn tcp(duration: Duration) -> IperfOptions {
        IperfOptions {
            duration,
            bind: None,
            port: IPERF3_PORT,
            udp_bitrate: None,
            tcp_bitrate: None,
            reverse: false,
            parallel: 1,
            length: None,
        }
    }
}

/// What an iperf3 run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct IperfResult {
    /// Sender-side rate in bits/s.
    pub sent_bps: f64,
    /// Receiver-side rate in bits/s (what arrived).
    pub received_bps: f64,
    /// Bytes sent.
    pub bytes_sent: u64,
    /// Bytes received.
    pub bytes_received: u64,
    /// TCP retransmissions (TCP only).
    pub retransmits: Option<u64>,
    /// UDP datagrams lost, percent (UDP only).
    pub lost_percent: Option<f64>,
    /// UDP jitter in milliseconds (UDP only).
    pub jitter_ms: Option<f64>,
    /// The client's per-interval reports (`-J` `intervals`, one per second by default), in
    /// order: a stall shows as an interval with zero bytes.
    pub intervals: Vec<IperfInterval>,
}

/// One interval of an iperf3 run, as the client reported it (sender side for TCP and UDP
/// sends, receiver side with `-R`).
#[derive(Clone, Debug, PartialEq)]
pub struct IperfInterval {
    /// Start, seconds since the test began.
    pub start: f64,
    /// End, seconds since the test began.
    pub end: f64,
    /// Bytes moved in the interval (all streams).
    pub bytes: u64,
}

impl IperfResult {
    /// The intervals that moved no data.
    pub fn stalled_intervals(&self) -> Vec<&IperfInterval> {
        self.intervals.iter().filter(|i| i.bytes == 0).collect()
    }
}

/// The `intervals` array of `iperf3 -J` output (each interval's `sum`).
fn parse_intervals(v: &serde_json::Value) -> Vec<IperfInterval> {
    v.get("intervals")
        .and_then(|i| i.as_array())
        .map(|list| {
            list.iter()
                .filter_map(|i| {
                    let sum = i.get("sum")?;
                    Some(IperfInterval {
                        start: sum.get("start")?.as_f64()?,
                        end: sum.get("end")?.as_f64()?,
                        bytes: sum.get("bytes")?.as_u64()?,
                    })
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Runs an iperf3 client in `ns` against `server` and parses its JSON report.
pub fn iperf3_client(ns: &Netns, server: IpAddr, opts: &IperfOptions) -> Result<IperfResult> {
    let secs = opts.duration.as_secs().max(1);
    let mut cmd = Cmd::new("iperf3").args([
        "-c".to_owned(),
        server.to_string(),
        "-p".to_owned(),
        opts.port.to_string(),
        "-t".to_owned(),
        secs.to_string(),
        "-J".to_owned(),
        "--connect-timeout".to_owned(),
        "3000".to_owned(),
    ]);
    if let Some(bind) = opts.bind {
        cmd = cmd.args(["-B".to_owned(), bind.to_string()]);
    }
    if let Some(rate) = opts.udp_bitrate {
        cmd = cmd.args(["-u".to_owned(), "-b".to_owned(), rate.to_string()]);
    } else if let Some(rate) = opts.tcp_bitrate {
        cmd = cmd.args(["-b".to_owned(), rate.to_string()]);
    }
    if opts.reverse {
        cmd = cmd.arg("-R");
    }
    if opts.parallel > 1 {
        cmd = cmd.args(["-P".to_owned(), opts.parallel.to_string()]);
    }
    if let Some(len) = opts.length {
        cmd = cmd.args(["-l".to_owned(), len.to_string()]);
    }
    let cmd = cmd
        .timeout(Duration::from_secs(secs + 20))
        .in_netns(ns.name());
    let out = cmd.output()?;
    match parse_iperf3_json(&out.stdout) {
        Ok(r) if out.success() => Ok(r),
        Ok(_) => Err(cmd.failure(&out)),
        Err(e) => {
            if out.success() {
                Err(e)
            } else {
                Err(cmd.failure(&out))
            }
        }
    }
}

/// Parses `iperf3 -J` output (TCP or UDP). A JSON `error` field becomes an error.
pub fn parse_iperf3_json(text: &str) -> Result<IperfResult> {
    let err = |detail: String| Error::Parse {
        what: "iperf3 JSON",
        detail,
        input: shorten(text, 400),
    };
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| err(format!("invalid JSON: {e}")))?;
    if let Some(msg) = v.get("error").and_then(|e| e.as_str()) {
        return Err(err(format!("iperf3 reported: {msg}")));
    }
    let end = v
        .get("end")
        .ok_or_else(|| err("no `end` section".to_owned()))?;
    let f = |section: &serde_json::Value, key: &str| section.get(key).and_then(|x| x.as_f64());
    let u = |section: &serde_json::Value, key: &str| section.get(key).and_then(|x| x.as_u64());
    if let (Some(sent), Some(recv)) = (end.get("sum_sent"), end.get("sum_received")) {
        // TCP (and UDP on newer iperf3, which also has `sum`).
        let udp = end.get("sum").filter(|s| s.get("lost_percent").is_some());
        return Ok(IperfResult {
            sent_bps: f(sent, "bits_per_second")
                .ok_or_else(|| err("no sum_sent.bits_per_second".to_owned()))?,
            received_bps: f(recv, "bits_per_second")
                .ok_or_else(|| err("no sum_received.bits_per_second".to_owned()))?,
            bytes_sent: u(sent, "bytes").unwrap_or(0),
            bytes_received: u(recv, "bytes").unwrap_or(0),
            retransmits: u(sent, "retransmits"),
            lost_percent: udp.and_then(|s| f(s, "lost_percent")),
            jitter_ms: udp.and_then(|s| f(s, "jitter_ms")),
            intervals: parse_intervals(&v),
        });
    }
    // UDP on iperf3 3.12: one `sum` with the receiver's view of loss.
    let sum = end
        .get("sum")
        .ok_or_else(|| err("no sum/sum_sent section".to_owned()))?;
    let bps = f(sum, "bits_per_second").ok_or_else(|| err("no sum.bits_per_second".to_owned()))?;
    let lost = f(sum, "lost_percent").unwrap_or(0.0);
    let bytes = u(sum, "bytes").unwrap_or(0);
    Ok(IperfResult {
        sent_bps: bps,
        received_bps: bps * (1.0 - lost / 100.0),
        bytes_sent: bytes,
        bytes_received: (bytes as f64 * (1.0 - lost / 100.0)) as u64,
        retransmits: None,
        lost_percent: Some(lost),
        jitter_ms: f(sum, "jitter_ms"),
        intervals: parse_intervals(&v),
    })
}

/// A running packet capture writing a pcap file.
#[derive(Clone, Debug)]
pub struct Capture {
    process: Process,
    path: PathBuf,
}

/// Starts `tcpdump` on `iface` in `ns` (use `any` for all interfaces) with a
/// BPF `filter` (may be empty), writing `<run dir>/<name>.pcap`; waits until it
/// listens.
pub fn capture(ns: &Netns, iface: &str, filter: &str, name: &str) -> Result<Capture> {
    let path = ns.run_dir().join(format!("{name}.pcap"));
    let mut cmd = Cmd::new("tcpdump").args([
        "-i",
        iface,
        "-n",
        // Without immediate mode libpcap hands packets over in timed batches,
        // and packets still in the ring when SIGINT arrives are lost.
        "--immediate-mode",
        "-U",
        "-Z",
        "root",
        "-s",
        "0",
        "-w",
        &path.to_string_lossy(),
    ]);
    if !filter.trim().is_empty() {
        cmd = cmd.arg(filter);
    }
    let process = ns.spawn(&format!("tcpdump-{name}"), cmd)?;
    wait_for(
        &format!("tcpdump {name} to listen"),
        Duration::from_secs(10),
        || {
            process.check_running()?;
            Ok(if process.log().contains("listening on") {
                Probe::Ready(())
            } else {
                Probe::NotYet(process.log_tail(3))
            })
        },
    )?;
    Ok(Capture { process, path })
}

impl Capture {
    /// The pcap file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits until the capture holds `at_least` packets matching the tshark display filter, at
    /// most `limit`, and returns how many it holds (fewer if the time ran out). A packet a test
    /// has seen arrive may not be in the file yet: tcpdump reads it from the kernel's ring when
    /// it is next scheduled, which on a loaded machine can be after the test moved on, and
    /// stopping it then loses it (SIGINT ends its loop with packets still in the ring). Call it
    /// before [`Capture::stop`] when the traffic to count is known to have crossed.
    pub fn wait_for_packets(
        &self,
        display_filter: &str,
        at_least: usize,
        limit: Duration,
    ) -> usize {
        let deadline = std::time::Instant::now() + limit;
        loop {
            // A file read while tcpdump appends to it may end inside a packet: not yet.
            let seen = tshark_count(&self.path, display_filter).unwrap_or(0);
            if seen >= at_least || std::time::Instant::now() >= deadline {
                return seen;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the capture (SIGINT, so tcpdump flushes) and returns the pcap path.
    pub fn stop(&self) -> PathBuf {
        self.process.stop_with(libc::SIGINT);
        self.path.clone()
    }
}

/// Decodes `pcap` with tshark: one row per packet matching the display filter,
/// with the requested fields (e.g. `isakmp.exchtype`, `esp.spi`).
pub fn tshark_fields(
    pcap: &Path,
    display_filter: &str,
    fields: &[&str],
) -> Result<Vec<Vec<String>>> {
    Tshark::new().fields(pcap, display_filter, fields)
}

/// Counts the packets in `pcap` matching a tshark display filter.
pub fn tshark_count(pcap: &Path, display_filter: &str) -> Result<usize> {
    Tshark::new().count(pcap, display_filter)
}

/// A tshark decoder with options: a configuration directory (`WIRESHARK_CONFIG_DIR`, where
/// Wireshark reads its user tables such as `ikev2_decryption_table` and `esp_sa`), preferences
/// (`-o name:value`) and whether every occurrence of a field is printed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tshark {
    config_dir: Option<PathBuf>,
    prefs: Vec<(String, String)>,
    all_occurrences: bool,
}

impl Tshark {
    /// Plain tshark: default preferences, first occurrence of each field.
    pub fn new() -> Tshark {
        Tshark::default()
    }

    /// tshark that decrypts IKEv2 and ESP with the keys in `dir`, a directory holding
    /// Wireshark's `ikev2_decryption_table` and `esp_sa` (e.g. Protego's `key_log`):
    /// the configuration directory plus ESP decryption and ICV checking turned on.
    pub fn with_keys(dir: &Path) -> Tshark {
        Tshark::new()
            .config_dir(dir)
            .pref("esp.enable_encryption_decode", "TRUE")
            .pref("esp.enable_authentication_check", "TRUE")
    }

    /// Reads user tables and preferences from `dir` (`WIRESHARK_CONFIG_DIR`).
    pub fn config_dir(mut self, dir: &Path) -> Tshark {
        self.config_dir = Some(dir.to_owned());
        self
    }

    /// Sets a preference (`-o name:value`).
    pub fn pref(mut self, name: &str, value: &str) -> Tshark {
        self.prefs.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Prints every occurrence of a field in a packet, joined with `,` (`-E occurrence=a`),
    /// instead of the first.
    pub fn all_occurrences(mut self) -> Tshark {
        self.all_occurrences = true;
        self
    }

    /// Decodes `pcap`: one row per packet matching the display filter, with the requested
    /// fields (empty strings for absent ones).
    pub fn fields(
        &self,
        pcap: &Path,
        display_filter: &str,
        fields: &[&str],
    ) -> Result<Vec<Vec<String>>> {
        let occurrence = if self.all_occurrences { "a" } else { "f" };
        let mut cmd = Cmd::new("tshark").args([
            "-n".to_owned(),
            "-r".to_owned(),
            pcap.to_string_lossy().into_owned(),
            "-T".to_owned(),
            "fields".to_owned(),
            "-E".to_owned(),
            "separator=\t".to_owned(),
            "-E".to_owned(),
            "aggregator=,".to_owned(),
            "-E".to_owned(),
            format!("occurrence={occurrence}"),
        ]);
        if let Some(dir) = &self.config_dir {
            cmd = cmd.env("WIRESHARK_CONFIG_DIR", dir.to_string_lossy());
        }
        for (name, value) in &self.prefs {
            cmd = cmd.args(["-o".to_owned(), format!("{name}:{value}")]);
        }
        if !display_filter.is_empty() {
            cmd = cmd.args(["-Y", display_filter]);
        }
        for f in fields {
            cmd = cmd.args(["-e", f]);
        }
        let out = cmd.timeout(Duration::from_secs(60)).run()?;
        Ok(out
            .lines()
            .map(|l| l.split('\t').map(str::to_owned).collect())
            .collect())
    }

    /// Counts the packets in `pcap` matching a display filter.
    pub fn count(&self, pcap: &Path, display_filter: &str) -> Result<usize> {
        Ok(self.fields(pcap, display_filter, &["frame.number"])?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ping_summaries() {
        let ok = "PING 10.2.0.1 (10.2.0.1) from 10.1.0.1 : 56(84) bytes of data.\n\n--- 10.2.0.1 ping statistics ---\n5 packets transmitted, 5 received, 0% packet loss, time 66ms\nrtt min/avg/max/mdev = 0.480/0.640/1.088/0.225 ms\n";
        let s = parse_ping(ok).expect("valid");
        assert_eq!((s.transmitted, s.received, s.lost()), (5, 5, 0));
        assert!(s.all_received());
        assert_eq!(s.rtt_avg, Some(Duration::from_secs_f64(0.000640)));

        let lossy = "--- 10.9.0.1 ping statistics ---\n100 packets transmitted, 97 received, +2 errors, 3% packet loss, time 990ms\n";
        let s = parse_ping(lossy).expect("valid");
        assert_eq!(
            (s.transmitted, s.received, s.errors, s.lost()),
            (100, 97, 2, 3)
        );
        assert_eq!(s.rtt_avg, None);
        assert!(parse_ping("ping: connect: Network is unreachable").is_err());
    }

    #[test]
    fn parses_iperf3_tcp_and_udp() {
        let tcp = r#"{"start":{},"end":{"sum_sent":{"bytes":1000,"bits_per_second":4000.5,"retransmits":3},"sum_received":{"bytes":990,"bits_per_second":3960.0}}}"#;
        let r = parse_iperf3_json(tcp).expect("valid");
        assert_eq!(r.sent_bps, 4000.5);
        assert_eq!(r.received_bps, 3960.0);
        assert_eq!(r.retransmits, Some(3));
        assert_eq!(r.lost_percent, None);
        assert!(r.intervals.is_empty());

        let with_intervals = r#"{"intervals":[{"sum":{"start":0,"end":1.0,"bytes":500}},{"sum":{"start":1.0,"end":2.0,"bytes":0}}],"end":{"sum_sent":{"bytes":500,"bits_per_second":2000.0},"sum_received":{"bytes":500,"bits_per_second":2000.0}}}"#;
        let r = parse_iperf3_json(with_intervals).expect("valid");
        assert_eq!(r.intervals.len(), 2);
        assert_eq!(r.intervals[0].bytes, 500);
        assert_eq!(r.stalled_intervals(), vec![&r.intervals[1]]);

        let udp = r#"{"end":{"sum":{"bytes":1000,"bits_per_second":8000.0,"lost_percent":25.0,"jitter_ms":0.1}}}"#;
        let r = parse_iperf3_json(udp).expect("valid");
        assert_eq!(r.received_bps, 6000.0);
        assert_eq!(r.lost_percent, Some(25.0));

        let e = parse_iperf3_json(r#"{"start":{},"end":{},"error":"unable to connect to server"}"#);
        assert!(e.unwrap_err().to_string().contains("unable to connect"));
    }
}
