use super::*;
use crate::status::tests::{sample, Sample};
use crate::status::TunnelEvents;
use std::sync::Arc;

/// The sample engine view with the control loop's `events` and the node's `store`, as a scrape
/// would write them.
struct Fixed {
    sample: Sample,
    events: HashMap<TunnelId, TunnelEvents>,
    store: Option<crate::runtime::StoreStats>,
}

impl metrics::Source for Fixed {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), metrics::Collect> {
        let s = &self.sample;
        let mut node = s.node();
        node.store.clone_from(&self.store);
        let view = GatewayView {
            directory: &s.directory,
            sas: &s.sas,
            events: &self.events,
            stats: &s.stats,
        };
        write_gateway(out, &view, &node, 1_000_000.0)?;
        Ok(())
    }
}

fn scrape_with(
    events: HashMap<TunnelId, TunnelEvents>,
    store: Option<crate::runtime::StoreStats>,
) -> String {
    let source: Arc<dyn metrics::Source> = Arc::new(Fixed {
        sample: sample(),
        events,
        store,
    });
    let (text, missing) = metrics::render(&source, "gw1");
    assert_eq!(missing, None);
    text
}

fn scrape() -> String {
    scrape_with(HashMap::new(), None)
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing {line:?} in\n{text}"
    );
}

#[test]
fn every_configured_tunnel_has_a_state_even_when_down() {
    let text = scrape();
    has(
        &text,
        r#"protego_tunnel_state{node="gw1",tenant="acme",tunnel="hq"} 2"#,
    );
    has(
        &text,
        r#"protego_tunnel_state{node="gw1",tenant="acme",tunnel="branch"} 1"#,
    );
    has(
        &text,
        r#"protego_tunnel_state{node="gw1",tenant="globex",tunnel="dc"} 0"#,
    );
    has(
        &text,
        r#"protego_tunnel_up{node="gw1",tenant="globex",tunnel="dc"} 0"#,
    );
    has(
        &text,
        r#"protego_tunnel_up{node="gw1",tenant="acme",tunnel="hq"} 1"#,
    );
    // A down tunnel's counters exist too, at zero.
    has(
        &text,
        r#"protego_ike_sas_established_total{node="gw1",tenant="globex",tunnel="dc"} 0"#,
    );
}

#[test]
fn times_are_unix_timestamps_and_counters_totals() {
    let text = scrape();
    // Established 125 s before the scrape's 1 000 000; rekey due in 3 000 s.
    has(
        &text,
        r#"protego_ike_sa_established_timestamp_seconds{node="gw1",tenant="acme",tunnel="hq"} 999875.0"#,
    );
    has(
        &text,
        r#"protego_ike_sa_rekey_timestamp_seconds{node="gw1",tenant="acme",tunnel="hq"} 1003000.0"#,
    );
    has(
        &text,
        r#"protego_child_sa_established_timestamp_seconds{node="gw1",tenant="acme",tunnel="hq",spi_in="c0000001"} 999940.0"#,
    );
    has(
        &text,
        r#"protego_child_sa_expire_timestamp_seconds{node="gw1",tenant="acme",tunnel="hq",spi_in="c0000001"} 1003500.0"#,
    );
    // The tunnel's totals (retired CHILD_SAs included) and the live CHILD_SA's own.
    has(
        &text,
        r#"protego_tunnel_bytes_total{node="gw1",tenant="acme",tunnel="hq",direction="in"} 223456"#,
    );
    has(
        &text,
        r#"protego_tunnel_packets_total{node="gw1",tenant="acme",tunnel="hq",direction="out"} 290"#,
    );
    has(
        &text,
        r#"protego_tunnel_esp_drops_total{node="gw1",tenant="acme",tunnel="hq"} 4"#,
    );
    has(
        &text,
        r#"protego_child_sa_bytes_total{node="gw1",tenant="acme",tunnel="hq",spi_in="c0000001",direction="out"} 654321"#,
    );
    // Data-path drops summed by reason, IKE drops, workers.
    has(
        &text,
        r#"protego_drops_total{node="gw1",reason="esp_replay"} 4"#,
    );
    has(
        &text,
        r#"protego_worker_packets_total{node="gw1",worker="0"} 700"#,
    );
    has(
        &text,
        r#"protego_worker_spin_seconds_total{node="gw1",worker="0"} 0.0015"#,
    );
    has(
        &text,
        r#"protego_tenant_fair_drops_total{node="gw1",tenant="globex"} 7"#,
    );
    // Half-open: the connecting tunnel's SA and the one matched to no tunnel.
    has(&text, r#"protego_half_open_ike_sas{node="gw1"} 2"#);
    has(&text, r#"protego_ike_sas{node="gw1"} 3"#);
    let version = format!(
        r#"protego_build_info{{node="gw1",version="{}"}} 1"#,
        env!("CARGO_PKG_VERSION")
    );
    has(&text, &version);
}

#[test]
fn tunnel_events_become_counters_by_result_and_reason() {
    let events = TunnelEvents {
        ike_established: 2,
        ike_rekeys: 5,
        child_installed: 2,
        child_rekeys: 9,
        dpd_answered: 40,
        ike_deleted: [
            ("dpd_timeout".to_owned(), 1),
            ("peer_request".to_owned(), 3),
        ]
        .into_iter()
        .collect(),
    };
    // Tunnel 1 is `hq`.
    let text = scrape_with([(TunnelId(1), events)].into_iter().collect(), None);
    has(
        &text,
        r#"protego_ike_sa_rekeys_total{node="gw1",tenant="acme",tunnel="hq"} 5"#,
    );
    has(
        &text,
        r#"protego_child_sa_rekeys_total{node="gw1",tenant="acme",tunnel="hq"} 9"#,
    );
    has(
        &text,
        r#"protego_dpd_total{node="gw1",tenant="acme",tunnel="hq",result="answered"} 40"#,
    );
    has(
        &text,
        r#"protego_dpd_total{node="gw1",tenant="acme",tunnel="hq",result="timeout"} 1"#,
    );
    has(
        &text,
        r#"protego_dpd_total{node="gw1",tenant="globex",tunnel="dc",result="timeout"} 0"#,
    );
    has(
        &text,
        r#"protego_ike_sa_deleted_total{node="gw1",tenant="acme",tunnel="hq",reason="peer_request"} 3"#,
    );
}

#[test]
fn store_commits_are_a_histogram() {
    let mut latency = crate::runtime::CommitLatency::default();
    for us in [80, 90, 700, 30_000] {
        latency.observe(std::time::Duration::from_micros(us));
    }
    let store = Some(crate::runtime::StoreStats {
        backend: "file x".into(),
        commits: 4,
        failures: 1,
        records_written: 4,
        commit_us_p50: 0,
        commit_us_p99: 0,
        commit_latency: latency,
        held: 0,
        error: None,
        encryption: None,
    });
    let text = scrape_with(HashMap::new(), store);
    has(
        &text,
        r#"protego_store_commit_duration_seconds_count{node="gw1"} 4"#,
    );
    has(
        &text,
        r#"protego_store_commit_duration_seconds_bucket{le="0.0001",node="gw1"} 2"#,
    );
    has(
        &text,
        r#"protego_store_commit_duration_seconds_bucket{le="0.001",node="gw1"} 3"#,
    );
    has(
        &text,
        r#"protego_store_commit_duration_seconds_bucket{le="+Inf",node="gw1"} 4"#,
    );
    has(
        &text,
        r#"protego_store_commit_failures_total{node="gw1"} 1"#,
    );
}

/// The metrics are written from the engine's view, the status report is assembled from the
/// same view: every tunnel's state, every IKE SA's and CHILD_SA's labels (SPIs, addresses,
/// selectors) and counters agree with what `protego status` shows.
#[test]
fn metrics_agree_with_the_status_report() {
    let text = scrape();
    let report = crate::status::tests::sample_report();
    assert!(!report.tunnels.is_empty());
    for t in &report.tunnels {
        let id = format!(r#"node="gw1",tenant="{}",tunnel="{}""#, t.tenant, t.name);
        has(
            &text,
            &format!("protego_tunnel_state{{{id}}} {}", state_value(t.state)),
        );
        has(
            &text,
            &format!("protego_tunnel_ike_sas{{{id}}} {}", t.ike_sas.len()),
        );
        for s in &t.ike_sas {
            has(
                &text,
                &format!(
                    r#"protego_ike_sa_info{{{id},spi_i="{}",spi_r="{}",state="{}",initiator="{}",local="{}",remote="{}",proposal="{}"}} 1"#,
                    s.spi_i, s.spi_r, s.state, s.initiator, s.local, s.remote, s.proposal
                ),
            );
            for c in &s.children {
                has(
                    &text,
                    &format!(
                        r#"protego_child_sa_info{{{id},spi_in="{}",spi_out="{}",proposal="{}",local_ts="{}",remote_ts="{}"}} 1"#,
                        c.spi_in,
                        c.spi_out,
                        c.proposal,
                        c.local_ts.join(","),
                        c.remote_ts.join(",")
                    ),
                );
                has(
                    &text,
                    &format!(
                        r#"protego_child_sa_packets_total{{{id},spi_in="{}",direction="in"}} {}"#,
                        c.spi_in, c.packets_in
                    ),
                );
            }
        }
    }
    // The sample's selectors include a port range's suffix, which the report writes too.
    assert!(
        text.contains(r#"remote_ts="10.1.0.0/24,10.1.1.5/32[tcp/443]""#),
        "{text}"
    );
}

#[test]
fn hex_is_what_the_spis_display_writes() {
    for n in [0, 1, 0xabc, 0x0123_4567_89ab_cdef, u64::MAX, 0xffff_ffff] {
        let mut text = String::new();
        crate::status::push_hex(&mut text, n, 16);
        assert_eq!(text, wire::IkeSpi(n).to_string());
        text.clear();
        crate::status::push_hex(&mut text, n & 0xffff_ffff, 8);
        assert_eq!(text, wire::EspSpi(n as u32).to_string());
    }
}
