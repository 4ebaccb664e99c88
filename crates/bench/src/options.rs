//! What to measure: ciphers (ESP transforms of RFC 4106, RFC 7634, RFC 3602 + RFC 4868),
//! packet sizes (fixed or simple IMIX), directions, tunnel and worker counts, and the case
//! matrix built from them, grouped by gateway configuration so that each gateway is started
//! once per group.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{BenchError, Result};
use crate::imix;

/// Smallest inner packet: IPv4 (20) + UDP (8) + the 12-byte payload carrying the run tag and
/// packet index.
pub const MIN_PACKET: u16 = 40;
/// Largest fixed inner packet (the bench links have an MTU of 9000, ESP and VXLAN add < 100).
pub const MAX_PACKET: u16 = 8800;
/// Largest inner packet strongSwan's kernel-libipsec reads from its TUN device (its MTU is
/// fixed at 1400 bytes), so the largest it can encrypt.
pub const STRONGSWAN_MAX_OUTBOUND: u16 = 1400;

/// An ESP transform of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cipher {
    /// AES-GCM with a 16-byte ICV and a 256-bit key (RFC 4106).
    Aes256Gcm,
    /// AES-GCM with a 16-byte ICV and a 128-bit key (RFC 4106).
    Aes128Gcm,
    /// ChaCha20-Poly1305 (RFC 7634).
    ChaCha20Poly1305,
    /// AES-CBC with a 256-bit key (RFC 3602) and HMAC-SHA2-256-128 (RFC 4868).
    Aes256CbcSha256,
}

impl Cipher {
    /// Every cipher, in the order of the full matrix.
    pub const ALL: [Cipher; 4] = [
        Cipher::Aes256Gcm,
        Cipher::Aes128Gcm,
        Cipher::ChaCha20Poly1305,
        Cipher::Aes256CbcSha256,
    ];

    /// The name used on the command line and in the JSON output.
    pub fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes256gcm",
            Cipher::Aes128Gcm => "aes128gcm",
            Cipher::ChaCha20Poly1305 => "chacha20poly1305",
            Cipher::Aes256CbcSha256 => "aes256cbc-sha256",
        }
    }

    /// The ESP proposal keyword (strongSwan and Protego syntax).
    pub fn esp_proposal(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes256gcm16",
            Cipher::Aes128Gcm => "aes128gcm16",
            Cipher::ChaCha20Poly1305 => "chacha20poly1305",
            Cipher::Aes256CbcSha256 => "aes256-sha256",
        }
    }

    /// The transforms of the `crypto` crate.
    pub fn transforms(self) -> (crypto::Encr, Option<crypto::Integ>) {
        match self {
            Cipher::Aes256Gcm => (crypto::Encr::AesGcm16_256, None),
            Cipher::Aes128Gcm => (crypto::Encr::AesGcm16_128, None),
            Cipher::ChaCha20Poly1305 => (crypto::Encr::ChaCha20Poly1305, None),
            Cipher::Aes256CbcSha256 => {
                (crypto::Encr::AesCbc256, Some(crypto::Integ::HmacSha256_128))
            }
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Cipher {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        let key = s.trim().to_ascii_lowercase().replace(['_', '+'], "-");
        Ok(match key.as_str() {
            "aes256gcm" | "aes256gcm16" | "aes-256-gcm" => Cipher::Aes256Gcm,
            "aes128gcm" | "aes128gcm16" | "aes-128-gcm" => Cipher::Aes128Gcm,
            "chacha20poly1305" | "chacha20-poly1305" | "chacha" => Cipher::ChaCha20Poly1305,
            "aes256cbc-sha256" | "aes256-sha256" | "aes-256-cbc-hmac-sha2-256" | "aes256cbc" => {
                Cipher::Aes256CbcSha256
            }
            _ => {
                return Err(BenchError::InvalidOption {
                    option: "--ciphers",
                    value: s.to_owned(),
                    reason: "expected aes256gcm, aes128gcm, chacha20poly1305 or aes256cbc-sha256"
                        .to_owned(),
                })
            }
        })
    }
}

/// Inner packet sizes of a case: the length of the inner IP packet (IPv4 header included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PacketSize {
    /// Every packet this long.
    Fixed(u16),
    /// Simple IMIX: 40, 576 and 1500-byte packets in the proportion 7:4:1 (mean 340.3 bytes).
    Imix,
}

impl PacketSize {
    /// The sizes of the full matrix.
    pub const ALL: [PacketSize; 4] = [
        PacketSize::Fixed(64),
        PacketSize::Fixed(512),
        PacketSize::Fixed(1400),
        PacketSize::Imix,
    ];

    /// The size of the packet with index `i` of a run.
    pub fn size_of(self, i: u64) -> u16 {
        match self {
            PacketSize::Fixed(n) => n,
            PacketSize::Imix => imix::size_of(i),
        }
    }

    /// The mean inner packet length.
    pub fn mean(self) -> f64 {
        match self {
            PacketSize::Fixed(n) => f64::from(n),
            PacketSize::Imix => imix::mean(),
        }
    }

    /// The largest inner packet.
    pub fn max(self) -> u16 {
        match self {
            PacketSize::Fixed(n) => n,
            PacketSize::Imix => imix::MAX,
        }
    }

    /// The distinct sizes it uses.
    pub fn sizes(self) -> Vec<u16> {
        match self {
            PacketSize::Fixed(n) => vec![n],
            PacketSize::Imix => imix::SIZES.to_vec(),
        }
    }

    /// `64`, `1400`, `imix`.
    pub fn label(self) -> String {
        match self {
            PacketSize::Fixed(n) => n.to_string(),
            PacketSize::Imix => "imix".to_owned(),
        }
    }
}

impl fmt::Display for PacketSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

impl FromStr for PacketSize {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("imix") {
            return Ok(PacketSize::Imix);
        }
        let bad = |reason: String| BenchError::InvalidOption {
            option: "--sizes",
            value: s.to_owned(),
            reason,
        };
        let n: u16 = t
            .parse()
            .map_err(|_| bad("expected a byte count or `imix`".to_owned()))?;
        if !(MIN_PACKET..=MAX_PACKET).contains(&n) {
            return Err(bad(format!(
                "the inner IP packet must be {MIN_PACKET}..={MAX_PACKET} bytes"
            )));
        }
        Ok(PacketSize::Fixed(n))
    }
}

/// Which way the traffic crosses the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// ESP from the peer; the gateway decrypts and sends VXLAN to the host.
    Inbound,
    /// VXLAN from the host; the gateway encrypts and sends ESP to the peer.
    Outbound,
}

impl Direction {
    /// Both directions.
    pub const ALL: [Direction; 2] = [Direction::Inbound, Direction::Outbound];

    /// `in` or `out`.
    pub fn short(self) -> &'static str {
        match self {
            Direction::Inbound => "in",
            Direction::Outbound => "out",
        }
    }

    /// `inbound` or `outbound`.
    pub fn name(self) -> &'static str {
        match self {
            Direction::Inbound => "inbound",
            Direction::Outbound => "outbound",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Direction {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "in" | "inbound" | "decrypt" => Ok(Direction::Inbound),
            "out" | "outbound" | "encrypt" => Ok(Direction::Outbound),
            _ => Err(BenchError::InvalidOption {
                option: "--dirs",
                value: s.to_owned(),
                reason: "expected `in` or `out`".to_owned(),
            }),
        }
    }
}

/// How the load generator sends, as a peer or host would.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerMode {
    /// Trains of up to 64 datagrams per UDP GSO send, up to 64 trains per `sendmmsg`: the
    /// most the gateway can be offered per kernel crossing (how the maximum rate is found).
    Batching,
    /// One datagram per system call, paced: what a peer's kernel ESP or a host's VXLAN device
    /// does (strongSwan, a Cisco or Palo Alto box, a hypervisor). Wake-ups and system calls
    /// per packet then dominate the gateway's cost.
    Single,
}

impl PeerMode {
    /// Both modes.
    pub const ALL: [PeerMode; 2] = [PeerMode::Batching, PeerMode::Single];

    /// `batching` or `single`.
    pub fn name(self) -> &'static str {
        match self {
            PeerMode::Batching => "batching",
            PeerMode::Single => "single",
        }
    }
}

impl fmt::Display for PeerMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for PeerMode {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "batching" | "batch" | "gso" => Ok(PeerMode::Batching),
            "single" | "non-batching" | "nonbatching" => Ok(PeerMode::Single),
            _ => Err(BenchError::InvalidOption {
                option: "--peers",
                value: s.to_owned(),
                reason: "expected `batching` or `single`".to_owned(),
            }),
        }
    }
}

/// Parses one offered load of `--loads`: a percentage of the maximum rate, 1 to 100.
pub fn parse_load(s: &str) -> Result<u32> {
    let t = s.trim().trim_end_matches('%');
    match t.parse::<u32>() {
        Ok(n) if (1..=100).contains(&n) => Ok(n),
        _ => Err(BenchError::InvalidOption {
            option: "--loads",
            value: s.to_owned(),
            reason: "a percentage of the maximum rate, 1 to 100".to_owned(),
        }),
    }
}

/// A worker count as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerCount {
    /// One worker per CPU the benchmark may use.
    All,
    /// Exactly this many.
    N(u32),
}

impl WorkerCount {
    /// The number of workers on a machine with `cpus` usable CPUs.
    pub fn resolve(self, cpus: u32) -> u32 {
        match self {
            WorkerCount::All => cpus.max(1),
            WorkerCount::N(n) => n,
        }
    }
}

impl FromStr for WorkerCount {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("all") {
            return Ok(WorkerCount::All);
        }
        match t.parse::<u32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(WorkerCount::N(n)),
            _ => Err(BenchError::InvalidOption {
                option: "--workers",
                value: s.to_owned(),
                reason: "expected 1..=1024 or `all`".to_owned(),
            }),
        }
    }
}

/// Parses a tunnel count (1..=10000).
pub fn parse_tunnels(s: &str) -> Result<u32> {
    match s.trim().parse::<u32>() {
        Ok(n) if (1..=10_000).contains(&n) => Ok(n),
        _ => Err(BenchError::InvalidOption {
            option: "--tunnels",
            value: s.to_owned(),
            reason: "expected 1..=10000".to_owned(),
        }),
    }
}

/// Parses a comma-separated list with `item`, dropping duplicates (first occurrence wins).
pub fn parse_list<T: PartialEq>(s: &str, item: impl Fn(&str) -> Result<T>) -> Result<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v = item(part)?;
        if !out.contains(&v) {
            out.push(v);
        }
    }
    Ok(out)
}

/// Parses a duration: `2s`, `500ms`, `1.5s` or a bare number of seconds; 0.1 s to 600 s.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let t = s.trim();
    let bad = |reason: &str| BenchError::InvalidOption {
        option: "--duration",
        value: s.to_owned(),
        reason: reason.to_owned(),
    };
    let (num, scale) = if let Some(v) = t.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = t.strip_suffix('s') {
        (v, 1.0)
    } else {
        (t, 1.0)
    };
    let secs: f64 = num
        .trim()
        .parse()
        .map_err(|_| bad("expected e.g. `2s` or `500ms`"))?;
    let secs = secs * scale;
    if !(0.1..=600.0).contains(&secs) {
        return Err(bad("must be between 100ms and 600s"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Inner packet sizes.
    pub sizes: Vec<PacketSize>,
    /// ESP transforms.
    pub ciphers: Vec<Cipher>,
    /// Directions.
    pub directions: Vec<Direction>,
    /// Tunnel counts.
    pub tunnels: Vec<u32>,
    /// Worker counts of the Protego gateway.
    pub workers: Vec<WorkerCount>,
    /// Length of each measurement (the maximum-rate run and the latency run each take this
    /// long, unless the packet pool runs out first).
    pub duration: Duration,
    /// Also measure strongSwan (charon with kernel-libipsec) as the gateway under test.
    pub compare_strongswan: bool,
    /// Skip Protego (with `compare_strongswan`: measure strongSwan alone).
    pub skip_protego: bool,
    /// Bytes of pre-built packets the load generator may hold for one run.
    pub pool_bytes: usize,
    /// The `protego` binary to run as the gateway (default: found like the test bed does).
    pub gateway_bin: Option<PathBuf>,
    /// Keep the run directory (configurations, gateway logs) after the run.
    pub keep: bool,
    /// Extra `key = value` lines for the Protego gateway's `[gateway]` table (e.g.
    /// `busy_poll = "200us"`, `batch = 16`).
    pub gateway_options: Vec<String>,
    /// Offered loads of each case's load runs, percent of the case's measured maximum rate
    /// (each run takes `duration`). 100 with a batching peer is the maximum-rate run itself,
    /// 50 the latency run.
    pub loads: Vec<u32>,
    /// How the load generator sends in the load runs.
    pub peers: Vec<PeerMode>,
    /// Scrape the Protego gateway's `[metrics]` listener this often while the cases run
    /// (None: the gateway serves no metrics).
    pub scrape_every: Option<Duration>,
}

impl Options {
    /// The full matrix: every size, cipher and direction; 1 and 1000 tunnels; 1 worker and
    /// all workers; 1 s per measurement.
    pub fn full() -> Options {
        Options {
            sizes: PacketSize::ALL.to_vec(),
            ciphers: Cipher::ALL.to_vec(),
            directions: Direction::ALL.to_vec(),
            tunnels: vec![1, 1000],
            workers: vec![WorkerCount::N(1), WorkerCount::All],
            duration: Duration::from_secs(1),
            compare_strongswan: false,
            skip_protego: false,
            pool_bytes: 1 << 30,
            gateway_bin: None,
            keep: false,
            gateway_options: Vec::new(),
            loads: vec![100, 50, 10],
            peers: PeerMode::ALL.to_vec(),
            scrape_every: None,
        }
    }

    /// The `--quick` preset: AES-256-GCM, 1400 and 64 bytes, both directions, one tunnel, 1
    /// worker and all workers, 0.5 s per measurement.
    pub fn quick() -> Options {
        Options {
            sizes: vec![PacketSize::Fixed(1400), PacketSize::Fixed(64)],
            ciphers: vec![Cipher::Aes256Gcm],
            tunnels: vec![1],
            duration: Duration::from_millis(500),
            ..Options::full()
        }
    }

    /// Checks that every list is non-empty.
    pub fn validate(&self) -> Result<()> {
        let empty = |option: &'static str| BenchError::InvalidOption {
            option,
            value: String::new(),
            reason: "the list is empty".to_owned(),
        };
        if self.sizes.is_empty() {
            return Err(empty("--sizes"));
        }
        if self.ciphers.is_empty() {
            return Err(empty("--ciphers"));
        }
        if self.directions.is_empty() {
            return Err(empty("--dirs"));
        }
        if self.tunnels.is_empty() {
            return Err(empty("--tunnels"));
        }
        if self.workers.is_empty() {
            return Err(empty("--workers"));
        }
        if let Some(bad) = self.loads.iter().find(|l| !(1..=100).contains(*l)) {
            return Err(BenchError::InvalidOption {
                option: "--loads",
                value: bad.to_string(),
                reason: "a percentage of the maximum rate, 1 to 100".to_owned(),
            });
        }
        if self.skip_protego && !self.compare_strongswan {
            return Err(BenchError::InvalidOption {
                option: "--strongswan-only",
                value: String::new(),
                reason: "needs --compare-strongswan (nothing would be measured)".to_owned(),
            });
        }
        if self.pool_bytes < (16 << 20) {
            return Err(BenchError::InvalidOption {
                option: "--pool-mb",
                value: (self.pool_bytes >> 20).to_string(),
                reason: "at least 16 MiB".to_owned(),
            });
        }
        Ok(())
    }
}

/// The gateway under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GatewayKind {
    /// `protego up`.
    Protego,
    /// strongSwan 5.9 charon with kernel-libipsec.
    StrongSwan,
}

impl GatewayKind {
    /// `protego` or `strongswan`.
    pub fn name(self) -> &'static str {
        match self {
            GatewayKind::Protego => "protego",
            GatewayKind::StrongSwan => "strongswan",
        }
    }
}

/// One measured combination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Case {
    /// The gateway under test.
    pub gateway: GatewayKind,
    /// Protego's worker count (None for strongSwan, whose threads are not configured).
    pub workers: Option<u32>,
    /// Number of tunnels (IKE SAs with one CHILD_SA each); packets cycle over them.
    pub tunnels: u32,
    /// ESP transform.
    pub cipher: Cipher,
    /// Inner packet sizes.
    pub size: PacketSize,
    /// Direction.
    pub direction: Direction,
}

impl Case {
    /// A short label for tables and messages.
    pub fn label(&self) -> String {
        let workers = self
            .workers
            .map_or_else(|| "-".to_owned(), |w| format!("{w}w"));
        format!(
            "{} {} {} {} {}t {}",
            self.gateway.name(),
            self.direction.short(),
            self.cipher,
            self.size,
            self.tunnels,
            workers
        )
    }
}

/// The cases that share one gateway configuration (one gateway start, one IKE setup).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// The gateway under test.
    pub gateway: GatewayKind,
    /// Protego's worker count.
    pub workers: Option<u32>,
    /// Tunnel count.
    pub tunnels: u32,
    /// ESP transform.
    pub cipher: Cipher,
    /// The cases, in run order.
    pub cases: Vec<Case>,
}

/// Whether strongSwan can run `size` in `direction`: its TUN device reads at most 1400-byte
/// packets, so outbound packets above that are not encrypted whole.
pub fn strongswan_supports(size: PacketSize, direction: Direction) -> bool {
    direction == Direction::Inbound || size.max() <= STRONGSWAN_MAX_OUTBOUND
}

/// The groups to run for `options` on a machine with `cpus` usable CPUs: Protego groups
/// (tunnels, cipher, workers) first, then strongSwan's (tunnels, cipher) if asked for. Worker
/// counts resolving to the same number are measured once.
pub fn matrix(options: &Options, cpus: u32) -> Vec<Group> {
    let mut workers: Vec<u32> = Vec::new();
    for w in &options.workers {
        let n = w.resolve(cpus);
        if !workers.contains(&n) {
            workers.push(n);
        }
    }
    let cases_for = |gateway: GatewayKind, w: Option<u32>, tunnels: u32, cipher: Cipher| {
        let mut cases = Vec::new();
        for &size in &options.sizes {
            for &direction in &options.directions {
                if gateway == GatewayKind::StrongSwan && !strongswan_supports(size, direction) {
                    continue;
                }
                cases.push(Case {
                    gateway,
                    workers: w,
                    tunnels,
                    cipher,
                    size,
                    direction,
                });
            }
        }
        cases
    };
    let mut groups = Vec::new();
    if !options.skip_protego {
        for &tunnels in &options.tunnels {
            for &cipher in &options.ciphers {
                for &w in &workers {
                    let cases = cases_for(GatewayKind::Protego, Some(w), tunnels, cipher);
                    groups.push(Group {
                        gateway: GatewayKind::Protego,
                        workers: Some(w),
                        tunnels,
                        cipher,
                        cases,
                    });
                }
            }
        }
    }
    if options.compare_strongswan {
        for &tunnels in &options.tunnels {
            for &cipher in &options.ciphers {
                let cases = cases_for(GatewayKind::StrongSwan, None, tunnels, cipher);
                if !cases.is_empty() {
                    groups.push(Group {
                        gateway: GatewayKind::StrongSwan,
                        workers: None,
                        tunnels,
                        cipher,
                        cases,
                    });
                }
            }
        }
    }
    groups.retain(|g| !g.cases.is_empty());
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_values() {
        let sizes = parse_list("64, 1400,imix,64", str::parse::<PacketSize>).unwrap();
        assert_eq!(
            sizes,
            vec![
                PacketSize::Fixed(64),
                PacketSize::Fixed(1400),
                PacketSize::Imix
            ]
        );
        assert!("39".parse::<PacketSize>().is_err());
        assert!("abc".parse::<PacketSize>().is_err());
        let ciphers = parse_list(
            "aes256gcm,AES128GCM16,chacha20poly1305,aes256-sha256",
            |s| s.parse::<Cipher>(),
        )
        .unwrap();
        assert_eq!(ciphers, Cipher::ALL.to_vec());
        assert!("des".parse::<Cipher>().is_err());
        assert_eq!("in".parse::<Direction>().unwrap(), Direction::Inbound);
        assert_eq!(
            "outbound".parse::<Direction>().unwrap(),
            Direction::Outbound
        );
        assert!("sideways".parse::<Direction>().is_err());
        assert_eq!("all".parse::<WorkerCount>().unwrap(), WorkerCount::All);
        assert_eq!("2".parse::<WorkerCount>().unwrap(), WorkerCount::N(2));
        assert!("0".parse::<WorkerCount>().is_err());
        assert_eq!(parse_tunnels("1000").unwrap(), 1000);
        assert!(parse_tunnels("0").is_err());
    }

    #[test]
    fn parses_loads_and_peer_modes() {
        assert_eq!(
            parse_list("100, 50%,10,50", parse_load).unwrap(),
            vec![100, 50, 10]
        );
        for bad in ["0", "101", "-5", "half", ""] {
            assert!(parse_load(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_list("single,batching", str::parse::<PeerMode>).unwrap(),
            vec![PeerMode::Single, PeerMode::Batching]
        );
        assert!("bursty".parse::<PeerMode>().is_err());
        let mut o = Options::quick();
        assert!(o.validate().is_ok());
        o.loads = vec![50, 0];
        assert!(o.validate().is_err(), "a load of 0 % is refused");
        o.loads = Vec::new();
        assert!(o.validate().is_ok(), "no load runs at all is allowed");
    }

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("50ms").is_err());
        assert!(parse_duration("1h").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn full_matrix_shape() {
        let mut o = Options::full();
        o.compare_strongswan = true;
        let groups = matrix(&o, 2);
        // Protego: 2 tunnel counts x 4 ciphers x 2 worker counts, 8 cases each.
        let protego: Vec<_> = groups
            .iter()
            .filter(|g| g.gateway == GatewayKind::Protego)
            .collect();
        assert_eq!(protego.len(), 16);
        assert!(protego.iter().all(|g| g.cases.len() == 8));
        // strongSwan: no worker dimension, and no outbound IMIX (1500-byte packets).
        let swan: Vec<_> = groups
            .iter()
            .filter(|g| g.gateway == GatewayKind::StrongSwan)
            .collect();
        assert_eq!(swan.len(), 8);
        assert!(swan
            .iter()
            .all(|g| g.cases.len() == 7 && g.workers.is_none()));
        assert!(!swan
            .iter()
            .flat_map(|g| &g.cases)
            .any(|c| c.size == PacketSize::Imix && c.direction == Direction::Outbound));
        let total: usize = groups.iter().map(|g| g.cases.len()).sum();
        assert_eq!(total, 16 * 8 + 8 * 7);
    }

    #[test]
    fn worker_counts_are_deduplicated() {
        let mut o = Options::quick();
        o.workers = vec![WorkerCount::N(1), WorkerCount::All];
        // On a one-CPU machine "all" is 1: measured once.
        assert_eq!(matrix(&o, 1).len(), 1);
        assert_eq!(matrix(&o, 2).len(), 2);
        let g = &matrix(&o, 2)[1];
        assert_eq!(g.workers, Some(2));
        assert_eq!(g.cases.len(), 4);
        assert!(o.validate().is_ok());
        o.sizes.clear();
        assert!(o.validate().is_err());
    }

    #[test]
    fn case_labels() {
        let c = Case {
            gateway: GatewayKind::Protego,
            workers: Some(2),
            tunnels: 1000,
            cipher: Cipher::Aes256Gcm,
            size: PacketSize::Imix,
            direction: Direction::Outbound,
        };
        assert_eq!(c.label(), "protego out aes256gcm imix 1000t 2w");
    }
}
