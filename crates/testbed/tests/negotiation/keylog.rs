//! The key log (`[gateway] key_log = "DIR"`) as the suite checks it: file names, modes and
//! lines of Wireshark's IKEv2 decryption table and ESP SA table, and the selectors of the
//! standard connection as tshark prints them from decrypted IKE messages (RFC 7296 §3.13).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use protego_testbed::strongswan::ChildSa;

use super::IkeMsg;

/// Wireshark's user-table file names (what `key_log` writes).
pub const IKE_TABLE: &str = "ikev2_decryption_table";
/// Wireshark's ESP SA table.
pub const ESP_TABLE: &str = "esp_sa";

/// The `[gateway]` line that turns the key log on, writing into `dir`.
pub fn key_log_line(dir: &Path) -> String {
    format!("key_log = {:?}", dir.display().to_string())
}

/// The permission bits of `path`.
pub fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// The lines of the text file at `path`.
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Every file under `dir` named `name`.
pub fn find_named(dir: &Path, name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            } else if e.file_name() == name {
                found.push(p);
            }
        }
    }
    found
}

/// A CHILD_SA's SPIs as the site (strongSwan) sees them.
pub struct Generation {
    /// The site's inbound SPI: Protego sends with it.
    pub site_in: String,
    /// The site's outbound SPI: the site sends with it, Protego's inbound SPI.
    pub site_out: String,
}

impl From<&ChildSa> for Generation {
    fn from(c: &ChildSa) -> Self {
        Generation {
            site_in: c.spi_in.clone(),
            site_out: c.spi_out.clone(),
        }
    }
}

/// The standard connection's traffic selectors as tshark prints them (TSi = site, TSr = VNet):
/// start addresses.
pub const TS_START: [&str; 2] = ["10.1.0.0", "10.2.0.0"];

/// Their end addresses.
pub const TS_END: [&str; 2] = ["10.1.0.255", "10.2.0.255"];

/// Asserts that `m` carries exactly the standard selectors.
pub fn assert_ts(m: &IkeMsg) {
    assert_eq!(
        (&m.ts_start, &m.ts_end),
        (
            &TS_START.map(str::to_owned).to_vec(),
            &TS_END.map(str::to_owned).to_vec()
        ),
        "frame {}",
        m.frame
    );
}
