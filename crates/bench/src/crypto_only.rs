//! The crypto-only limit of this machine: a single-core loop sealing and opening ESP packets
//! (RFC 4303) with the `esp` crate's SAs over `crypto::SaCipher` (aws-lc-rs), the very code
//! the gateway runs, without any I/O. Sealing uses dummy packets (Next Header 59, §2.6), which
//! take the same cipher work as real ones without re-writing the plaintext; opening runs over
//! freshly sealed packets in sequence order, so the anti-replay check is included. Time is the
//! thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`), so that other processes sharing the
//! machine do not inflate the figure.

use std::time::Duration;

use crypto::SaCipher;
use esp::{InboundSa, OutboundSa, SaConfig};
use serde::Serialize;
use wire::EspSpi;

use crate::error::{BenchError, Result};
use crate::imix;
use crate::options::{Cipher, PacketSize};

/// Packets sealed per open round.
const ROUND: usize = 512;

/// The crypto-only cost of one cipher and size on one core.
#[derive(Debug, Clone, Serialize)]
pub struct CryptoFigure {
    /// The cipher.
    pub cipher: String,
    /// The size label (`1400`, `imix`).
    pub size: String,
    /// Mean inner packet length.
    pub mean_bytes: f64,
    /// Sealing (outbound): nanoseconds per packet.
    pub seal_ns_per_packet: f64,
    /// Sealing: nanoseconds per inner byte.
    pub seal_ns_per_byte: f64,
    /// Sealing: inner Gbit/s of one core.
    pub seal_gbps: f64,
    /// Opening (inbound): nanoseconds per packet.
    pub open_ns_per_packet: f64,
    /// Opening: nanoseconds per inner byte.
    pub open_ns_per_byte: f64,
    /// Opening: inner Gbit/s of one core.
    pub open_gbps: f64,
}

impl CryptoFigure {
    /// Nanoseconds per packet of the direction's operation: open for inbound, seal for outbound.
    pub fn ns_per_packet(&self, inbound: bool) -> f64 {
        if inbound {
            self.open_ns_per_packet
        } else {
            self.seal_ns_per_packet
        }
    }

    /// Nanoseconds per byte of the direction's operation.
    pub fn ns_per_byte(&self, inbound: bool) -> f64 {
        if inbound {
            self.open_ns_per_byte
        } else {
            self.seal_ns_per_byte
        }
    }
}

fn key_err(source: crypto::Error) -> BenchError {
    BenchError::Crypto { spi: 0x100, source }
}

fn esp_err(source: esp::EspError) -> BenchError {
    BenchError::Esp { spi: 0x100, source }
}

/// A matching outbound/inbound pair with fixed test keys.
fn pair(cipher: Cipher) -> Result<(OutboundSa, InboundSa)> {
    let (encr, integ) = cipher.transforms();
    let ekey: Vec<u8> = (0..encr.keymat_len()).map(|i| i as u8 ^ 0x5c).collect();
    let ikey: Vec<u8> = (0..integ.map_or(0, |i| i.key_len()))
        .map(|i| i as u8 ^ 0x36)
        .collect();
    let make = || SaCipher::new(encr, &ekey, integ.map(|i| (i, ikey.as_slice()))).map_err(key_err);
    let cfg = SaConfig {
        esn: false,
        replay_window: esp::MAX_REPLAY_WINDOW,
        rekey_after: None,
    };
    let spi = EspSpi(0x100);
    Ok((
        OutboundSa::new(spi, make()?, &cfg).map_err(esp_err)?,
        InboundSa::new(spi, make()?, &cfg).map_err(esp_err)?,
    ))
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    // SAFETY: all-zero is a valid timespec; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: ts is a live timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Nanoseconds per packet to seal and to open `size`-byte payloads, measured for about
/// `budget` each.
pub(crate) fn measure_size(cipher: Cipher, size: usize, budget: Duration) -> Result<(f64, f64)> {
    let (out, inb) = pair(cipher)?;
    let len = out.sealed_len(size);
    let hl = out.header_len();
    // Seal: the same buffer over and over.
    let mut buf = vec![0u8; len];
    for (i, b) in buf[hl..hl + size].iter_mut().enumerate() {
        *b = i as u8;
    }
    let start = thread_cpu();
    let mut n = 0u64;
    while thread_cpu() - start < budget {
        for _ in 0..256 {
            out.seal_dummy(&mut buf, size).map_err(esp_err)?;
        }
        n += 256;
    }
    let seal_ns = (thread_cpu() - start).as_nanos() as f64 / n as f64;
    // Open: rounds of freshly sealed packets, only the opening timed.
    let mut bufs = vec![vec![0u8; len]; ROUND];
    let mut lens = vec![0usize; ROUND];
    let mut open_time = Duration::ZERO;
    let mut opened = 0u64;
    while open_time < budget {
        for (b, l) in bufs.iter_mut().zip(lens.iter_mut()) {
            *l = out.seal_dummy(b, size).map_err(esp_err)?.len;
        }
        let t = thread_cpu();
        for (b, &l) in bufs.iter_mut().zip(lens.iter()) {
            inb.open(&mut b[..l]).map_err(esp_err)?;
        }
        open_time += thread_cpu() - t;
        opened += ROUND as u64;
    }
    let open_ns = open_time.as_nanos() as f64 / opened as f64;
    Ok((seal_ns, open_ns))
}

/// The crypto-only figure of `cipher` at `size` (IMIX: the weighted mean of its sizes).
pub(crate) fn measure(cipher: Cipher, size: PacketSize, budget: Duration) -> Result<CryptoFigure> {
    let (seal, open, mean) = match size {
        PacketSize::Fixed(n) => {
            let (s, o) = measure_size(cipher, usize::from(n), budget)?;
            (s, o, f64::from(n))
        }
        PacketSize::Imix => {
            let total: u64 = imix::WEIGHTS.iter().sum();
            let (mut s, mut o) = (0.0, 0.0);
            for (sz, w) in imix::SIZES.iter().zip(imix::WEIGHTS) {
                let (a, b) = measure_size(cipher, usize::from(*sz), budget / 3)?;
                s += a * w as f64 / total as f64;
                o += b * w as f64 / total as f64;
            }
            (s, o, imix::mean())
        }
    };
    Ok(CryptoFigure {
        cipher: cipher.name().to_owned(),
        size: size.label(),
        mean_bytes: mean,
        seal_ns_per_packet: seal,
        seal_ns_per_byte: seal / mean,
        seal_gbps: mean * 8.0 / seal,
        open_ns_per_packet: open,
        open_ns_per_byte: open / mean,
        open_gbps: mean * 8.0 / open,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cipher_seals_and_opens() {
        for cipher in Cipher::ALL {
            let (seal, open) =
                measure_size(cipher, 64, Duration::from_millis(2)).expect("crypto works");
            assert!(seal > 0.0 && open > 0.0, "{cipher}: {seal} {open}");
        }
        let f = measure(
            Cipher::Aes128Gcm,
            PacketSize::Imix,
            Duration::from_millis(3),
        )
        .expect("imix");
        assert_eq!(f.size, "imix");
        assert!((f.seal_ns_per_byte * f.mean_bytes - f.seal_ns_per_packet).abs() < 1e-6);
        assert!((f.open_gbps - f.mean_bytes * 8.0 / f.open_ns_per_packet).abs() < 1e-9);
    }
}
