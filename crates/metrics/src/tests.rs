use super::*;
use std::io::{Read, Write};

/// A source with one family of each kind, a label value that needs escaping, and an optional
/// failure after the first family.
struct Fake {
    fail: bool,
}

impl Source for Fake {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), Collect> {
        let hq: &Labels<'_> = &[("tenant", "acme"), ("tunnel", "hq")];
        let odd: &Labels<'_> = &[("tenant", "acme"), ("tunnel", "a\"b\\c\nd")];
        out.counter("protego_test_bytes", "Bytes.", [(hq, 12_u64), (odd, 3)])?;
        if self.fail {
            return Err(Collect::Unavailable("control loop did not answer".into()));
        }
        out.gauge("protego_test_state", "State.", [(hq, 2_i64)])?;
        out.info("protego_test", "Build.", [&[("version", "1.2.3")][..]])?;
        let h = Histogram {
            sum: 0.5,
            count: 3,
            buckets: vec![(0.001, 1), (0.01, 2), (f64::INFINITY, 0)],
        };
        out.histogram("protego_test_latency_seconds", "Latency.", [(&[][..], &h)])?;
        Ok(())
    }
}

fn rendered(fail: bool) -> (String, Option<String>) {
    let source: Arc<dyn Source> = Arc::new(Fake { fail });
    render(&source, "gw1")
}

#[test]
fn families_carry_the_node_label_and_the_format_suffixes() {
    let (text, missing) = rendered(false);
    assert_eq!(missing, None);
    for line in [
        "# TYPE protego_test_bytes counter",
        "protego_test_bytes_total{node=\"gw1\",tenant=\"acme\",tunnel=\"hq\"} 12",
        "protego_test_state{node=\"gw1\",tenant=\"acme\",tunnel=\"hq\"} 2",
        "protego_test_info{node=\"gw1\",version=\"1.2.3\"} 1",
        "protego_test_latency_seconds_count{node=\"gw1\"} 3",
        "protego_test_latency_seconds_bucket{le=\"0.01\",node=\"gw1\"} 3",
        "protego_test_latency_seconds_bucket{le=\"+Inf\",node=\"gw1\"} 3",
        "protego_up{node=\"gw1\"} 1",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn label_values_are_escaped() {
    let (text, _) = rendered(false);
    assert!(
        text.contains(r#"tunnel="a\"b\\c\nd""#),
        "quote, backslash and newline escaped:\n{text}"
    );
}

#[test]
fn a_source_that_cannot_read_its_figures_reports_up_0_and_keeps_what_it_wrote() {
    let (text, missing) = rendered(true);
    assert_eq!(missing.as_deref(), Some("control loop did not answer"));
    assert!(text.contains("protego_up{node=\"gw1\"} 0"), "{text}");
    assert!(text.contains("protego_test_bytes_total"), "{text}");
    assert!(!text.contains("protego_test_state"), "{text}");
    assert!(text.ends_with("# EOF\n"), "{text}");
}

/// A raw HTTP/1.1 GET (no client library in the dependencies).
fn get(addr: SocketAddr, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
}

use std::net::SocketAddr;

#[test]
fn the_listener_serves_metrics_and_stops_when_dropped() {
    let server = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "gw1",
        Arc::new(Fake { fail: false }),
    )
    .unwrap();
    let addr = server.local_addr();
    let answer = get(addr, "/metrics");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.contains("content-type: application/openmetrics-text"),
        "{answer}"
    );
    assert!(
        answer.contains("protego_test_bytes_total{node=\"gw1\""),
        "{answer}"
    );
    assert!(get(addr, "/").contains("GET /metrics"));
    assert!(get(addr, "/nothing").starts_with("HTTP/1.1 404"));
    drop(server);
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the port is closed once the server is dropped"
    );
}

#[test]
fn a_taken_address_is_a_clear_error() {
    let first = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "gw1",
        Arc::new(Fake { fail: false }),
    )
    .unwrap();
    let Err(e) = MetricsServer::start(first.local_addr(), "gw1", Arc::new(Fake { fail: false }))
    else {
        panic!("a second listener on the same port")
    };
    let text = e.to_string();
    assert!(
        text.starts_with(&format!(
            "[metrics] listen = \"{}\": cannot listen:",
            first.local_addr()
        )),
        "{text}"
    );
}

#[test]
fn a_tenants_rendering_keeps_only_the_series_labelled_with_it() {
    let source: Arc<dyn Source> = Arc::new(Fake { fail: false });
    let (mine, missing) = render_for_tenant(&source, "gw1", "acme");
    assert_eq!(missing, None);
    assert!(
        mine.contains("protego_test_bytes_total{node=\"gw1\",tenant=\"acme\",tunnel=\"hq\"} 12"),
        "{mine}"
    );
    assert!(mine.contains("protego_test_state{"), "{mine}");
    // Series without a tenant label are the node's, not the tenant's.
    assert!(!mine.contains("version=\"1.2.3\""), "{mine}");
    assert!(
        !mine.contains("protego_test_latency_seconds_bucket"),
        "{mine}"
    );
    assert!(mine.contains("protego_up{node=\"gw1\"} 1") && mine.ends_with("# EOF\n"));
    let (other, _) = render_for_tenant(&source, "gw1", "globex");
    assert!(!other.contains("acme"), "{other}");
}
