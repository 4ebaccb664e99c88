//! The edge bench's address plan and its per-VM route file (the CSV form of
//! `protego ctl route load FILE`, `tenant,vnet,address,host`), and the uniform draw of
//! destinations over the loaded entries.
//!
//! ```text
//!  VM i (0-based): 64.0.0.0 + i + 1, on the host VTEP 10.255.0.2 (every entry)
//!  CE: 10.99.0.2 behind the attachment (routes 10.99.0.0/24), gateway_ip 10.99.0.1
//! ```

use std::io::{self, Write};
use std::net::Ipv4Addr;

/// The bench tenant's name.
pub(crate) const TENANT: &str = "bench";
/// The bench VNet's name.
pub(crate) const VNET: &str = "vnet";
/// The first VM address's predecessor: VM `i` is this plus `i + 1`.
const VM_BASE: u32 = 0x4000_0000; // 64.0.0.0
/// Most entries the plan holds: the VM addresses stay inside 64.0.0.0/6.
pub(crate) const MAX_ENTRIES: u32 = (1 << 26) - 2;
/// The CE's address on the attachment's segment.
pub(crate) const CE_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
/// The gateway's address on the segment.
pub(crate) const SEGMENT_GW: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 1);
/// The prefixes behind the CE.
pub(crate) const CE_ROUTES: &str = "10.99.0.0/24";

/// The address of VM `i` (0-based; `i` < [`MAX_ENTRIES`]).
pub(crate) fn vm_addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(VM_BASE + 1 + i)
}

/// Writes the route file of `entries` VMs, all on `host`: one CSV line per VM, in address
/// order.
pub(crate) fn write_route_file(
    out: &mut impl Write,
    entries: u32,
    host: Ipv4Addr,
) -> io::Result<()> {
    let host = host.to_string();
    for i in 0..entries {
        writeln!(out, "{TENANT},{VNET},{},{host}", vm_addr(i))?;
    }
    Ok(())
}

/// The fixed-seed draw of destinations, the table benchmark's (`overlay::workload`).
pub(crate) use overlay::workload::Draw;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_addresses_and_route_file() {
        assert_eq!(vm_addr(0), Ipv4Addr::new(64, 0, 0, 1));
        assert_eq!(vm_addr(255), Ipv4Addr::new(64, 0, 1, 0));
        assert_eq!(vm_addr(16 << 20), Ipv4Addr::new(65, 0, 0, 1));
        assert_eq!(vm_addr(MAX_ENTRIES - 1), Ipv4Addr::new(67, 255, 255, 254));
        let mut out = Vec::new();
        write_route_file(&mut out, 3, Ipv4Addr::new(10, 255, 0, 2)).expect("in memory");
        let text = String::from_utf8(out).expect("utf-8");
        assert_eq!(
            text,
            "bench,vnet,64.0.0.1,10.255.0.2\nbench,vnet,64.0.0.2,10.255.0.2\n\
             bench,vnet,64.0.0.3,10.255.0.2\n"
        );
        // The data plane's own parser takes every line.
        let parsed: Vec<_> = overlay::parse_routes(&text)
            .collect::<Result<_, _>>()
            .expect("valid route file");
        assert_eq!(parsed.len(), 3);
        assert_eq!(parsed[2].address.to_string(), "64.0.0.3");
    }

    #[test]
    fn draws_cover_the_range_uniformly() {
        let mut d = Draw::new(7);
        let n = 16u32;
        let mut seen = [0u32; 16];
        for _ in 0..160_000 {
            let i = d.below(n);
            assert!(i < n);
            seen[i as usize] += 1;
        }
        // Each bucket within 5 % of its expected 10 000.
        assert!(
            seen.iter().all(|&c| (9_500..=10_500).contains(&c)),
            "{seen:?}"
        );
        assert_eq!(Draw::new(0).below(0), 0);
        assert_eq!(Draw::new(1).below(1), 0);
    }
}
