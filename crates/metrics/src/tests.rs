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

/// A value of the differential test's families.
#[derive(Clone, Copy)]
enum V {
    U(u64),
    I(i64),
    F(f64),
}

/// Families with escapes, Unicode, integers and floats of every size, empty label sets, an
/// info and a histogram: written by this crate and by `prometheus-client`, compared.
/// A family of the differential test: name, help, kind, samples.
type RefFamily = (
    &'static str,
    &'static str,
    &'static str,
    Vec<(Vec<(&'static str, &'static str)>, V)>,
);

fn reference_families() -> Vec<RefFamily> {
    let labels = |t: &'static str| vec![("tenant", "acme"), ("tunnel", t)];
    vec![
        (
            "protego_a_bytes",
            "Bytes, with \"quotes\" and a backslash \\ in the help.",
            "counter",
            vec![
                (labels("hq"), V::U(0)),
                (labels("a\"b\\c\nd"), V::U(u64::MAX)),
                (labels("zürich-ü"), V::F(0.1)),
                (vec![], V::U(7)),
            ],
        ),
        (
            "protego_b",
            "Gauges.",
            "gauge",
            vec![
                (labels("hq"), V::F(1.8e9)),
                (labels("x"), V::F(1e300)),
                (labels("y"), V::F(-0.5)),
                (labels("z"), V::I(-42)),
                (labels("w"), V::F(f64::INFINITY)),
                (vec![], V::F(0.0)),
            ],
        ),
        (
            "protego_c",
            "Info.",
            "info",
            vec![
                (labels("hq"), V::U(1)),
                (vec![("version", "1.2.3")], V::U(1)),
            ],
        ),
        (
            "protego_d_seconds",
            "Histogram.",
            "histogram",
            vec![(labels("hq"), V::U(0)), (vec![], V::U(0))],
        ),
    ]
}

fn reference_histogram() -> Histogram {
    Histogram {
        sum: 12.25,
        count: 6,
        buckets: vec![(0.0001, 1), (0.25, 2), (10.0, 3), (f64::INFINITY, 0)],
    }
}

/// The differential test's families through this crate: labels as pairs, or (`sets`) escaped
/// once into label sets of the first label, the others written after the set.
struct Ours {
    sets: bool,
}

impl Source for Ours {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), Collect> {
        let h = reference_histogram();
        let boxed = |v: V| -> Box<dyn Value> {
            match v {
                V::F(f) => Box::new(f),
                V::U(u) => Box::new(u),
                V::I(i) => Box::new(i),
            }
        };
        for (name, help, kind, samples) in reference_families() {
            let labels: Vec<(Vec<(&str, &str)>, V)> = samples;
            if self.sets && kind != "histogram" {
                let sets: Vec<(LabelSet, &Labels<'_>, V)> = (labels.iter())
                    .map(|(l, v)| {
                        let split = l.len().min(1);
                        (out.label_set(&l[..split]), &l[split..], *v)
                    })
                    .collect();
                let series = || sets.iter().map(|(l, more, v)| ((l, *more), *v));
                match kind {
                    "counter" => out.counter(name, help, series().map(|(l, v)| (l, boxed(v))))?,
                    "gauge" => out.gauge(name, help, series().map(|(l, v)| (l, boxed(v))))?,
                    _ => out.info(name, help, series().map(|(l, _)| l))?,
                }
                continue;
            }
            match kind {
                "counter" => {
                    out.counter(name, help, labels.iter().map(|(l, v)| (&l[..], boxed(*v))))?
                }
                "gauge" => {
                    out.gauge(name, help, labels.iter().map(|(l, v)| (&l[..], boxed(*v))))?
                }
                "info" => out.info(name, help, labels.iter().map(|(l, _)| &l[..]))?,
                _ => out.histogram(name, help, labels.iter().map(|(l, _)| (&l[..], &h)))?,
            }
        }
        Ok(())
    }
}

impl Value for Box<dyn Value> {
    fn write(&self, out: &mut String) {
        (**self).write(out);
    }
}

/// The same families through `prometheus-client`'s own encoder.
#[derive(Debug)]
struct Theirs;

impl prometheus_client::collector::Collector for Theirs {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::NoLabelSet;
        use prometheus_client::metrics::MetricType;
        let node = [("node", "gw \"1\"")];
        let h = reference_histogram();
        for (name, help, kind, samples) in reference_families() {
            let kind = match kind {
                "counter" => MetricType::Counter,
                "gauge" => MetricType::Gauge,
                "info" => MetricType::Info,
                _ => MetricType::Histogram,
            };
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for (labels, v) in &samples {
                let set = (&node[..], &labels[..]);
                match kind {
                    MetricType::Info => family.encode_info(&set)?,
                    MetricType::Histogram => family
                        .encode_family(&set)?
                        .encode_histogram::<NoLabelSet>(h.sum, h.count, &h.buckets, None)?,
                    MetricType::Counter => {
                        let mut m = family.encode_family(&set)?;
                        match *v {
                            V::U(u) => m.encode_counter::<NoLabelSet, _, u64>(&u, None)?,
                            V::F(f) => m.encode_counter::<NoLabelSet, _, u64>(&f, None)?,
                            V::I(_) => unreachable!("no negative counter"),
                        }
                    }
                    _ => {
                        let mut m = family.encode_family(&set)?;
                        match *v {
                            V::U(u) => m.encode_gauge(&u)?,
                            V::F(f) => m.encode_gauge(&f)?,
                            V::I(i) => m.encode_gauge(&i)?,
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[test]
fn the_exposition_is_byte_for_byte_prometheus_clients() {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Theirs));
    let mut theirs = String::new();
    prometheus_client::encoding::text::encode_registry(&mut theirs, &registry).unwrap();
    assert!(theirs.contains("tunnel=\"a\\\"b\\\\c\\nd\""), "{theirs}");
    for sets in [false, true] {
        let source: Arc<dyn Source> = Arc::new(Ours { sets });
        let (ours, missing) = render(&source, "gw \"1\"");
        assert_eq!(missing, None);
        // Ours goes on with the scrape-health families and `# EOF`.
        let (body, tail) = ours.split_at(theirs.len());
        assert_eq!(body, theirs, "label sets: {sets}");
        assert!(tail.starts_with("# HELP protego_up "), "{tail}");
        assert!(tail.ends_with("# EOF\n"), "{tail}");
    }
}

#[test]
fn a_character_to_escape_is_found_wherever_it_is() {
    for len in 0..40 {
        let plain = "x".repeat(len);
        assert!(!needs_escaping(plain.as_bytes()), "{len}");
        for at in 0..len {
            for special in [b'\\', b'"', b'\n'] {
                let mut bytes = plain.clone().into_bytes();
                bytes[at] = special;
                assert!(needs_escaping(&bytes), "{len} {at} {special}");
            }
        }
    }
    // Bytes next to the special ones in value (borrows across bytes), and UTF-8.
    for near in ["[]!#\x01\x7f", "ü€𝄞 naïve", "\x5b\x5d\x21\x23\x09\x0b"] {
        assert!(!needs_escaping(near.as_bytes()), "{near:?}");
    }
}

/// A tenant's view of series written through label sets keeps the same series as through
/// pairs.
struct TenantSets;

impl Source for TenantSets {
    fn collect(&self, out: &mut Families<'_, '_>) -> Result<(), Collect> {
        let acme = out.label_set(&[("tenant", "acme"), ("tunnel", "hq")]);
        let node = out.label_set(&[("worker", "0")]);
        let other = out.label_set(&[("tenant", "globex"), ("tunnel", "hq")]);
        out.gauge(
            "protego_test_state",
            "State.",
            [(&acme, 1), (&node, 2), (&other, 4)],
        )?;
        // A set without a tenant, followed by acme's tenant label, and by globex's.
        let (acme_after, globex_after) = ([("tenant", "acme")], [("tenant", "globex")]);
        out.gauge(
            "protego_test_state_after",
            "State.",
            [
                ((&node, &acme_after[..]), 3),
                ((&node, &globex_after[..]), 5),
            ],
        )?;
        Ok(())
    }
}

#[test]
fn label_sets_keep_a_tenants_view() {
    let source: Arc<dyn Source> = Arc::new(TenantSets);
    let (mine, _) = render_for_tenant(&source, "gw1", "acme");
    let samples: Vec<&str> = (mine.lines())
        .filter(|l| l.starts_with("protego_test_state"))
        .collect();
    assert_eq!(
        samples,
        [
            "protego_test_state{node=\"gw1\",tenant=\"acme\",tunnel=\"hq\"} 1",
            "protego_test_state_after{node=\"gw1\",worker=\"0\",tenant=\"acme\"} 3",
        ]
    );
    let (all, _) = render(&source, "gw1");
    assert_eq!(
        all.lines()
            .filter(|l| l.starts_with("protego_test_state"))
            .count(),
        5
    );
}

#[test]
fn whole_floats_are_written_as_dtoa_writes_them() {
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut values = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        1_799_996_400.0,
        9_007_199_254_740_991.0,
        9_007_199_254_740_992.0,
        -9_007_199_254_740_991.0,
        1e16,
        1e300,
        0.5,
        -2.25,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        f64::MIN_POSITIVE,
    ];
    for _ in 0..20_000 {
        let r = next();
        // Whole numbers of every magnitude below 2^53, and arbitrary bit patterns.
        values.push(((r >> 11) >> (r % 53)) as f64 * if r & 1 == 0 { 1.0 } else { -1.0 });
        values.push(f64::from_bits(r));
    }
    for v in values {
        let mut ours = String::new();
        v.write(&mut ours);
        assert_eq!(ours, dtoa::Buffer::new().format(v), "{v:?}");
    }
}
