//! The cost of one metrics scrape's formatting with many tunnels, without a gateway: a status
//! report of N established tunnels (one IKE SA and one CHILD_SA each, as `protego status`
//! builds it) written as Prometheus families, timed over several rounds.
//!
//! `cargo run -p protego-control --release --example metrics_cost -- [TUNNELS] [ROUNDS]`
//! (defaults 10000 and 20). Prints the median and the slowest round, the text's size and its
//! series. The end-to-end cost of a scrape (the control loop's IKE report and the data
//! plane's counters included) is measured by `protego bench --scrape-every`.

use protego_control::status::{
    ChildSaReport, IkeSaReport, StatusReport, TunnelEvents, TunnelState, TunnelStatus,
};
use std::sync::Arc;
use std::time::Instant;

struct Report(StatusReport);

impl metrics::Source for Report {
    fn collect(&self, out: &mut metrics::Families<'_, '_>) -> Result<(), metrics::Collect> {
        protego_control::status::metrics::write_report(out, &self.0, 1.8e9)?;
        Ok(())
    }
}

fn report(tunnels: usize) -> StatusReport {
    let tunnel = |i: usize| TunnelStatus {
        name: format!("tunnel-{i:05}"),
        tenant: ids::TenantId::new(&format!("tenant-{:03}", i % 100)).expect("a valid name"),
        inside: "vnet:prod".to_owned(),
        state: TunnelState::Established,
        remote_addrs: vec![format!("192.0.{}.{}", i / 250 % 250, i % 250 + 1)
            .parse()
            .expect("an address")],
        local_id: "gw.example.net".to_owned(),
        remote_id: format!("site-{i}.example.net"),
        ike_sas: vec![IkeSaReport {
            spi_i: format!("{:016x}", i as u64 * 7919),
            spi_r: format!("{:016x}", i as u64 * 104_729),
            initiator: false,
            state: "established".to_owned(),
            local: "198.51.100.1:4500".parse().expect("an address"),
            remote: "192.0.2.2:4500".parse().expect("an address"),
            proposal: "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519".to_owned(),
            established_secs: 3_600,
            rekey_in_secs: Some(10_000),
            children: vec![ChildSaReport {
                spi_in: format!("{:08x}", 0xc000_0000_u32 + i as u32),
                spi_out: format!("{:08x}", 0xd000_0000_u32 + i as u32),
                proposal: "AES_GCM_16_256/NO_EXT_SEQ".to_owned(),
                local_ts: vec!["10.2.0.0/16".to_owned()],
                remote_ts: vec![format!("10.{}.{}.0/24", 100 + i / 250 % 100, i % 250)],
                installed_secs: 600,
                rekey_in_secs: Some(2_000),
                expire_in_secs: Some(3_000),
                bytes_in: 123_456_789,
                packets_in: 98_765,
                bytes_out: 987_654_321,
                packets_out: 123_456,
                drops_in: 0,
                reordered_in: 0,
                max_reorder_in: 0,
                replay_window: 1024,
                per_resource: false,
            }],
        }],
        events: TunnelEvents {
            ike_established: 1,
            ike_rekeys: 3,
            child_installed: 1,
            child_rekeys: 12,
            dpd_answered: 40,
            ike_deleted: Default::default(),
        },
        traffic: datapath::TunnelTraffic {
            bytes_in: 1_234_567_890,
            packets_in: 987_654,
            bytes_out: 9_876_543_210,
            packets_out: 1_234_567,
            drops_in: 2,
        },
    };
    let mut r: StatusReport = serde_json::from_str(
        r#"{"version":1,"uptime_secs":86400,"tunnels":[],"unmatched_ike_sas":0,"drops":{}}"#,
    )
    .expect("a minimal report");
    r.tunnels = (0..tunnels).map(tunnel).collect();
    r
}

fn main() {
    let mut args = std::env::args().skip(1);
    let tunnels: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(20);
    let source: Arc<dyn metrics::Source> = Arc::new(Report(report(tunnels)));
    let mut times = Vec::with_capacity(rounds);
    let mut size = (0, 0);
    let mut text = String::new();
    for _ in 0..rounds {
        let started = Instant::now();
        // As the listener does: into the last scrape's buffer.
        metrics::render_into(&source, "gw1", None, &mut text);
        times.push(started.elapsed());
        size = (
            text.len(),
            text.lines().filter(|l| !l.starts_with('#')).count(),
        );
    }
    times.sort();
    println!(
        "{tunnels} tunnels: formatting median {:.1} ms, slowest {:.1} ms ({rounds} rounds); {:.1} MB, {} series",
        times[rounds / 2].as_secs_f64() * 1e3,
        times[rounds - 1].as_secs_f64() * 1e3,
        size.0 as f64 / 1e6,
        size.1
    );
}
