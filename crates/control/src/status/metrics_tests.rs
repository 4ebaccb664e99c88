use super::*;
use crate::status::{StatusReport, TunnelEvents};
use std::sync::Arc;

/// A report as a scrape would write it.
struct Fixed(StatusReport);

impl metrics::Source for Fixed {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), metrics::Collect> {
        write_report(out, &self.0, 1_000_000.0)?;
        Ok(())
    }
}

fn scrape(report: StatusReport) -> String {
    let source: Arc<dyn metrics::Source> = Arc::new(Fixed(report));
    let (text, missing) = metrics::render(&source, "gw1");
    assert_eq!(missing, None);
    text
}

fn has(text: &str, line: &str) {
    assert!(
        text.lines().any(|l| l == line),
        "missing {line:?} in\n{text}"
    );
}

#[test]
fn every_configured_tunnel_has_a_state_even_when_down() {
    let text = scrape(crate::status::tests::sample_report());
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
    let text = scrape(crate::status::tests::sample_report());
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
    let mut report = crate::status::tests::sample_report();
    report.tunnels[0].events = TunnelEvents {
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
    let text = scrape(report);
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
    let mut report = crate::status::tests::sample_report();
    let mut latency = crate::runtime::CommitLatency::default();
    for us in [80, 90, 700, 30_000] {
        latency.observe(std::time::Duration::from_micros(us));
    }
    report.store = Some(crate::runtime::StoreStats {
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
    let text = scrape(report);
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
