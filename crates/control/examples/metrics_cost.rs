//! The cost of one metrics scrape's formatting with many tunnels, without a gateway: the
//! engine's view of N established tunnels (one IKE SA and one CHILD_SA each, as the control
//! loop and the data path hand them over) written as Prometheus families, as a scrape does
//! (the join of the view included); and, beside it, what assembling and dropping the status
//! report of the same view costs (what `protego status` pays; scrapes did before they were
//! written from the view). Each step is timed over several rounds.
//!
//! `cargo run -p protego-control --release --example metrics_cost -- [TUNNELS] [ROUNDS]`
//! (defaults 10000 and 20). Prints the median and the slowest round of each step, the text's
//! size and its series. The end-to-end cost of a scrape (the control loop's copy of its SAs,
//! the data plane's counters and the transfer included) is measured by
//! `protego bench --scrape-every`.

use datapath::{ChildStats, DataplaneStats, TunnelTraffic};
use ike::{ChildSaStatus, IkeSaState, IkeSaStatus, IkeSpis, IkeStats, TunnelId};
use protego_control::status::metrics::{write_gateway, GatewayView};
use protego_control::status::{StatusReport, TunnelDirectory, TunnelEntry, TunnelEvents};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::ike::TrafficSelector;
use wire::{EspSpi, IkeSpi};

impl metrics::Source for EngineView {
    fn collect(&self, out: &mut metrics::Families<'_, '_>) -> Result<(), metrics::Collect> {
        let view = GatewayView {
            directory: &self.directory,
            sas: &self.sas,
            events: &self.events,
            stats: &self.stats,
        };
        let node = StatusReport::node(&IkeStats::default(), &self.stats, 86_400);
        write_gateway(out, &view, &node, 1.8e9)?;
        Ok(())
    }
}

/// What the control loop and the data path hand over for `tunnels` established tunnels.
struct EngineView {
    directory: TunnelDirectory,
    sas: Vec<IkeSaStatus>,
    events: HashMap<TunnelId, TunnelEvents>,
    stats: DataplaneStats,
}

fn engine_view(tunnels: usize) -> EngineView {
    let prefix = |a: [u8; 4], len: u8| {
        let start = std::net::Ipv4Addr::from(a);
        let end = std::net::Ipv4Addr::from(u32::from(start) | (u32::MAX >> len));
        TrafficSelector {
            ip_proto: 0,
            start_port: 0,
            end_port: u16::MAX,
            start: start.into(),
            end: end.into(),
        }
    };
    let mut view = EngineView {
        directory: TunnelDirectory::default(),
        sas: Vec::new(),
        events: HashMap::new(),
        stats: DataplaneStats::default(),
    };
    for i in 0..tunnels {
        let id = TunnelId(i as u32 + 1);
        let remote: std::net::IpAddr = format!("192.0.{}.{}", i / 250 % 250, i % 250 + 1)
            .parse()
            .expect("an address");
        view.directory.0.push(TunnelEntry {
            id,
            name: format!("tunnel-{i:05}"),
            tenant: ids::TenantId::new(&format!("tenant-{:03}", i % 100)).expect("a valid name"),
            inside: "vnet:prod".to_owned(),
            remote_addrs: vec![remote],
            local_id: "gw.example.net".to_owned(),
            remote_id: format!("site-{i}.example.net"),
        });
        let (spi_in, spi_out) = (
            EspSpi(0xc000_0000 + i as u32),
            EspSpi(0xd000_0000 + i as u32),
        );
        view.sas.push(IkeSaStatus {
            tunnel: Some(id),
            ike: IkeSpis {
                initiator: IkeSpi(i as u64 * 7919 + 1),
                responder: IkeSpi(i as u64 * 104_729 + 1),
            },
            initiator: false,
            state: IkeSaState::Established,
            proposal: "AES_GCM_16_256/PRF_HMAC_SHA2_256/CURVE_25519".to_owned(),
            local: "198.51.100.1:4500".parse().expect("an address"),
            remote: std::net::SocketAddr::new(remote, 4500),
            age_secs: 3_600,
            rekey_in_secs: Some(10_000),
            children: vec![ChildSaStatus {
                inbound_spi: spi_in,
                outbound_spi: spi_out,
                proposal: "AES_GCM_16_256/NO_EXT_SEQ".to_owned(),
                local_ts: vec![prefix([10, 2, 0, 0], 16)],
                remote_ts: vec![prefix(
                    [10, (100 + i / 250 % 100) as u8, (i % 250) as u8, 0],
                    24,
                )],
                age_secs: 600,
                per_resource: false,
                rekey_in_secs: Some(2_000),
                expire_in_secs: Some(3_000),
            }],
        });
        view.events.insert(
            id,
            TunnelEvents {
                ike_established: 1,
                ike_rekeys: 3,
                child_installed: 1,
                child_rekeys: 12,
                dpd_answered: 40,
                ike_deleted: Default::default(),
            },
        );
        view.stats.children.push(ChildStats {
            tunnel: Some(id),
            inbound_spi: spi_in,
            outbound_spi: spi_out,
            bytes_in: 123_456_789,
            packets_in: 98_765,
            bytes_out: 987_654_321,
            packets_out: 123_456,
            drops_in: 0,
            reordered_in: 0,
            max_reorder_in: 0,
            replay_window: 1024,
        });
        view.stats.tunnels.push((
            id,
            TunnelTraffic {
                bytes_in: 1_234_567_890,
                packets_in: 987_654,
                bytes_out: 9_876_543_210,
                packets_out: 1_234_567,
                drops_in: 2,
            },
        ));
    }
    view
}

fn main() {
    let mut args = std::env::args().skip(1);
    let tunnels: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or(20)
        .max(1);
    let view: Arc<dyn metrics::Source> = Arc::new(engine_view(tunnels));
    let (mut formatting, mut assembly, mut dropping) = (Vec::new(), Vec::new(), Vec::new());
    let mut size = (0, 0);
    let mut text = String::new();
    for _ in 0..rounds {
        let started = Instant::now();
        // As the listener does: into the last scrape's buffer.
        metrics::render_into(&view, "gw1", None, &mut text);
        formatting.push(started.elapsed());
        size = (
            text.len(),
            text.lines().filter(|l| !l.starts_with('#')).count(),
        );
    }
    let engine = engine_view(tunnels);
    for _ in 0..rounds {
        let started = Instant::now();
        let mut report = StatusReport::build(
            &engine.directory,
            &engine.sas,
            &IkeStats::default(),
            &engine.stats,
            86_400,
        );
        report.set_events(&engine.directory, engine.events.clone());
        assembly.push(started.elapsed());
        let started = Instant::now();
        drop(std::hint::black_box(report));
        dropping.push(started.elapsed());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let summary = |what: &str, mut times: Vec<Duration>| {
        times.sort();
        format!(
            "{what} median {:.1} ms, slowest {:.1} ms",
            ms(times[rounds / 2]),
            ms(times[rounds - 1])
        )
    };
    println!(
        "{tunnels} tunnels ({rounds} rounds): {}, {:.1} MB, {} series; status report (not \
         part of a scrape): {}; {}",
        summary("scrape formatting from the engine view", formatting),
        size.0 as f64 / 1e6,
        size.1,
        summary("assembling", assembly),
        summary("dropping", dropping),
    );
}
