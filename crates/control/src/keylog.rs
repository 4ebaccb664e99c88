//! The key log (`[gateway] key_log = "DIR"`): DANGEROUS, for debugging decoders only. Writes the
//! keys of every IKE SA and CHILD_SA into `DIR/ikev2_decryption_table` and `DIR/esp_sa`, the
//! user-table files Wireshark and tshark read from their configuration directory, so that
//! `WIRESHARK_CONFIG_DIR=DIR tshark -o esp.enable_encryption_decode:TRUE -r capture.pcap`
//! decrypts IKE (RFC 7296 §3.14) and ESP (RFC 4303, RFC 4106, RFC 3602 + RFC 4868).
//!
//! The IKE lines come ready-made from the engine ([`ike::Event::KeyLog`]); the ESP lines are
//! formatted here from [`ike::ChildSaInfo`], one per direction.

use crate::error::Error;
use crypto::{Encr, Integ};
use ike::ChildSaInfo;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// File name of Wireshark's IKEv2 decryption table.
pub const IKE_TABLE: &str = "ikev2_decryption_table";
/// File name of Wireshark's ESP SA table.
pub const ESP_TABLE: &str = "esp_sa";

/// The open key log files.
pub(crate) struct KeyLog {
    dir: PathBuf,
    ike: File,
    esp: File,
}

impl KeyLog {
    /// Creates `dir` (mode 0700) and opens both tables for appending (mode 0600).
    pub(crate) fn open(dir: &Path) -> Result<Self, Error> {
        let err = |path: &Path, source| Error::KeyLog {
            path: path.to_owned(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| err(dir, e))?;
        let open = |name: &str| {
            let path = dir.join(name);
            OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| err(&path, e))
        };
        Ok(Self {
            dir: dir.to_owned(),
            ike: open(IKE_TABLE)?,
            esp: open(ESP_TABLE)?,
        })
    }

    /// Appends one engine-formatted IKE SA line.
    pub(crate) fn write_ike(&mut self, line: &str) {
        let path = self.dir.join(IKE_TABLE);
        write_line(&mut self.ike, &path, line.trim_end());
    }

    /// Appends the two ESP SA lines of a CHILD_SA pair.
    pub(crate) fn write_child(&mut self, child: &ChildSaInfo) {
        let path = self.dir.join(ESP_TABLE);
        for line in esp_sa_lines(child) {
            write_line(&mut self.esp, &path, &line);
        }
    }
}

fn write_line(file: &mut File, path: &Path, line: &str) {
    let result = file
        .write_all(line.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.flush());
    if let Err(e) = result {
        tracing::warn!(path = %path.display(), error = %e, "cannot write the key log");
    }
}

/// The `esp_sa` lines (inbound, then outbound) of a CHILD_SA pair. Transforms Wireshark cannot
/// decrypt (ChaCha20-Poly1305 in Wireshark 4.0) become `#` comment lines.
pub(crate) fn esp_sa_lines(child: &ChildSaInfo) -> Vec<String> {
    let (local, remote) = (child.local.ip(), child.remote.ip());
    let k = &child.keys;
    [
        (remote, local, child.inbound_spi, k.inbound_encr.as_slice(), k.inbound_integ.as_slice()),
        (local, remote, child.outbound_spi, k.outbound_encr.as_slice(), k.outbound_integ.as_slice()),
    ]
    .into_iter()
    .map(|(src, dst, spi, encr_key, integ_key)| {
        let Some(encr) = encr_name(child.encr) else {
            return format!("# SPI 0x{spi} {src} -> {dst}: {} cannot be decrypted by Wireshark", child.proposal);
        };
        let (integ, integ_key) = match child.integ {
            None => ("NULL", String::new()),
            Some(i) => (integ_name(i), format!("0x{}", hex::encode(integ_key))),
        };
        format!(
            "\"{}\",\"{src}\",\"{dst}\",\"0x{spi}\",\"{encr}\",\"0x{}\",\"{integ}\",\"{integ_key}\"",
            family(src),
            hex::encode(encr_key)
        )
    })
    .collect()
}

fn family(addr: IpAddr) -> &'static str {
    if addr.is_ipv4() {
        "IPv4"
    } else {
        "IPv6"
    }
}

/// Wireshark's name of the cipher; for AES-GCM its key is the key followed by the 4-byte salt,
/// exactly the keying material RFC 4106 §8.1 takes from KEYMAT.
fn encr_name(encr: Encr) -> Option<&'static str> {
    match encr {
        Encr::AesGcm16_128 | Encr::AesGcm16_256 => Some("AES-GCM with 16 octet ICV [RFC4106]"),
        Encr::AesCbc128 | Encr::AesCbc256 => Some("AES-CBC [RFC3602]"),
        Encr::ChaCha20Poly1305 => None,
    }
}

fn integ_name(integ: Integ) -> &'static str {
    match integ {
        Integ::HmacSha1_96 => "HMAC-SHA-1-96 [RFC2404]",
        Integ::HmacSha256_128 => "HMAC-SHA-256-128 [RFC4868]",
        Integ::HmacSha384_192 => "HMAC-SHA-384-192 [RFC4868]",
        Integ::HmacSha512_256 => "HMAC-SHA-512-256 [RFC4868]",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ike::{ChildKeys, IkeSpis, TunnelId};
    use wire::{EspSpi, IkeSpi};
    use zeroize::Zeroizing;

    fn child(encr: Encr, integ: Option<Integ>, local: &str, remote: &str) -> ChildSaInfo {
        let key = |b: u8, n: usize| Zeroizing::new(vec![b; n]);
        let (ek, ik) = match (encr, integ) {
            (_, Some(i)) => (16, i.key_len_for_tests()),
            _ => (20, 0),
        };
        ChildSaInfo {
            tunnel: TunnelId(1),
            ike: IkeSpis {
                initiator: IkeSpi(1),
                responder: IkeSpi(2),
            },
            inbound_spi: EspSpi(0xc1c2_c3c4),
            outbound_spi: EspSpi(0x0000_1234),
            encr,
            integ,
            esn: false,
            pfs: None,
            keys: ChildKeys {
                inbound_encr: key(0x11, ek),
                inbound_integ: key(0x22, ik),
                outbound_encr: key(0x33, ek),
                outbound_integ: key(0x44, ik),
            },
            local_ts: vec![],
            remote_ts: vec![],
            local: local.parse().unwrap(),
            remote: remote.parse().unwrap(),
            replay_window: 32,
            replaces: None,
            outbound_active: true,
            proposal: "TEST".into(),
        }
    }

    trait KeyLen {
        fn key_len_for_tests(self) -> usize;
    }

    impl KeyLen for Integ {
        fn key_len_for_tests(self) -> usize {
            match self {
                Integ::HmacSha1_96 => 20,
                Integ::HmacSha256_128 => 32,
                Integ::HmacSha384_192 => 48,
                Integ::HmacSha512_256 => 64,
            }
        }
    }

    #[test]
    fn gcm_lines_carry_key_and_salt() {
        let lines = esp_sa_lines(&child(
            Encr::AesGcm16_128,
            None,
            "198.51.100.1:4500",
            "192.0.2.2:4500",
        ));
        let hex_in = "11".repeat(20);
        let hex_out = "33".repeat(20);
        assert_eq!(
            lines,
            [
                format!("\"IPv4\",\"192.0.2.2\",\"198.51.100.1\",\"0xc1c2c3c4\",\"AES-GCM with 16 octet ICV [RFC4106]\",\"0x{hex_in}\",\"NULL\",\"\""),
                format!("\"IPv4\",\"198.51.100.1\",\"192.0.2.2\",\"0x00001234\",\"AES-GCM with 16 octet ICV [RFC4106]\",\"0x{hex_out}\",\"NULL\",\"\""),
            ]
        );
    }

    #[test]
    fn cbc_lines_carry_the_hmac_key() {
        let lines = esp_sa_lines(&child(
            Encr::AesCbc128,
            Some(Integ::HmacSha256_128),
            "[2001:db8::1]:4500",
            "[2001:db8::2]:4500",
        ));
        assert!(
            lines[0].starts_with(
                "\"IPv6\",\"2001:db8::2\",\"2001:db8::1\",\"0xc1c2c3c4\",\"AES-CBC [RFC3602]\""
            ),
            "{}",
            lines[0]
        );
        assert!(
            lines[0].ends_with(&format!(
                "\"HMAC-SHA-256-128 [RFC4868]\",\"0x{}\"",
                "22".repeat(32)
            )),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].ends_with(&format!("\"0x{}\"", "44".repeat(32))),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn chacha_becomes_a_comment() {
        let lines = esp_sa_lines(&child(
            Encr::ChaCha20Poly1305,
            None,
            "198.51.100.1:4500",
            "192.0.2.2:4500",
        ));
        assert!(
            lines
                .iter()
                .all(|l| l.starts_with('#') && !l.contains("1111")),
            "{lines:?}"
        );
    }

    #[test]
    fn files_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("protego-keylog-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut log = KeyLog::open(&dir.join("keys")).unwrap();
        log.write_ike(
            "0102,0304,aa,bb,\"AES-CBC-128 [RFC3602]\",cc,dd,\"HMAC_SHA2_256_128 [RFC4868]\"\n",
        );
        log.write_child(&child(
            Encr::AesGcm16_256,
            None,
            "198.51.100.1:4500",
            "192.0.2.2:4500",
        ));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("keys")), 0o700);
        assert_eq!(mode(&dir.join("keys").join(IKE_TABLE)), 0o600);
        assert_eq!(mode(&dir.join("keys").join(ESP_TABLE)), 0o600);
        let ike = std::fs::read_to_string(dir.join("keys").join(IKE_TABLE)).unwrap();
        assert_eq!(ike.lines().count(), 1);
        let esp = std::fs::read_to_string(dir.join("keys").join(ESP_TABLE)).unwrap();
        assert_eq!(esp.lines().count(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
