//! `[metrics] listen` (issue 20 §1) with a real strongSwan 5.9 site and a real Prometheus
//! server, in network namespaces: two tenants' tunnels are configured and only one comes up;
//! Prometheus scrapes the gateway and sees both tunnels, the one that never connected with
//! state 0; the exposition itself carries the established tunnel's traffic as `_total`
//! counters, its IKE SA's establishment as a Unix timestamp, and `protego_up 1`. In the
//! distributed form each role serves its own families, and the control node its HTTP API
//! (issue 20 §2): the cluster's resources to an operator, `403` to a tenant, a tenant's own
//! tunnel and metrics to it and `404` for another tenant's.
//!
//! Needs root and the tools from `scripts/setup.sh` (strongSwan, Prometheus), and the
//! `protego` binary built in the same profile (`make test` does both).

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;

use protego_testbed::cluster::{ClusterSpec, ProtegoCluster};
use protego_testbed::protego::{GatewayTunnel, ProtegoGateway};
use protego_testbed::{Cmd, Netns, Testbed, Topology};

/// Test results: the test bed's errors, I/O, parsing and the test's own complaints.
type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// Where the gateway serves its metrics, inside its namespace.
const METRICS: &str = "127.0.0.1:19180";
/// Where the test's Prometheus answers queries, inside the same namespace.
const PROMETHEUS: &str = "127.0.0.1:19090";
/// Where the control node serves its HTTP API (plain HTTP: loopback of its namespace).
const API: &str = "127.0.0.1:19443";

/// A request to the API from inside `ns` with a bearer token: the status and the body.
fn api(ns: &Netns, method: &str, path: &str, token: &str) -> Result<(u16, String)> {
    let to: SocketAddr = API.parse()?;
    let mut s = ns.tcp_connect("0.0.0.0:0".parse()?, to, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {to}\r\nAuthorization: Bearer {token}\r\n\
         Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header in {answer:?}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// Runs `protego token add --file FILE ARGS...`: the token it prints.
fn token(file: &std::path::Path, args: &[&str]) -> Result<String> {
    let bin = protego_testbed::workspace_bin("protego")?;
    let file = file.display().to_string();
    Ok(Cmd::new(bin.display().to_string())
        .args(["token", "add", "--file", &file])
        .args(args.iter().copied())
        .run()?
        .trim()
        .to_owned())
}

/// A GET over HTTP/1.1 from inside `ns`: the body of a 200 answer.
fn http_get(ns: &Netns, to: &str, path: &str) -> Result<String> {
    let to: SocketAddr = to.parse()?;
    let mut s = ns.tcp_connect("0.0.0.0:0".parse()?, to, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {to}\r\nConnection: close\r\n\r\n"
    )?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no HTTP header in {answer:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {head}").into());
    }
    // Chunked bodies (Prometheus answers that way): join the chunks.
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16)?;
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            rest = &tail[n + 2..];
        }
        return Ok(out);
    }
    Ok(body.to_owned())
}

/// The value of the exposition's sample whose line starts with `family{` and contains every
/// label of `labels` (`name="value"`).
fn sample(text: &str, family: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Prometheus's answer to an instant query: each series' labels and value.
fn query(ns: &Netns, expr: &str) -> Result<Vec<(serde_json::Value, f64)>> {
    let body = http_get(ns, PROMETHEUS, &format!("/api/v1/query?query={expr}"))?;
    let v: serde_json::Value = serde_json::from_str(&body)?;
    Ok(v["data"]["result"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| {
                    let value = r["value"][1].as_str()?.parse().ok()?;
                    Some((r["metric"].clone(), value))
                })
                .collect()
        })
        .unwrap_or_default())
}

#[test]
fn prometheus_sees_every_tunnel_the_down_one_included() -> Result<()> {
    if !testreq::program("metrics", "prometheus") {
        return Ok(());
    }
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, numbered_tenants(&[("red", 4201), ("blue", 4202)])?)?;
    let red = GatewayTunnel::for_site(&topo, 0, PSK);
    let blue = GatewayTunnel::for_site(&topo, 1, PSK);
    let gw = ProtegoGateway::start_with_tables(
        &bed,
        &topo,
        &[red.clone(), blue.clone()],
        &[],
        &format!("[metrics]\nlisten = \"{METRICS}\"\n"),
    )?;
    let ns = &topo.gateway.ns;

    // Before any tunnel: both have a state, 0.
    let text = http_get(ns, METRICS, "/metrics")?;
    for name in [&red.name, &blue.name] {
        let tunnel = format!("tunnel=\"{name}\"");
        assert_eq!(
            sample(&text, "protego_tunnel_state", &[&tunnel]),
            Some(0.0),
            "{text}"
        );
    }
    assert_eq!(sample(&text, "protego_up", &[]), Some(1.0), "{text}");

    // A real Prometheus scrapes the gateway every second.
    let dir = ns.run_dir().join("prometheus");
    std::fs::create_dir_all(&dir)?;
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: protego\n    static_configs:\n      - targets: [\"{METRICS}\"]\n"
        ),
    )?;
    let _prometheus = ns.spawn(
        "prometheus",
        Cmd::new("prometheus").args([
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={PROMETHEUS}"),
        ]),
    )?;

    let _site = site_up(&topo, &red)?;
    ping_all_vms(&topo, 0, 20)?;

    // Prometheus sees both tunnels: red established (2), blue never connected (0).
    let deadline = Instant::now() + Duration::from_secs(30);
    let states = loop {
        let states = query(ns, "protego_tunnel_state").unwrap_or_default();
        let of = |name: &str| {
            states
                .iter()
                .find(|(m, _)| m["tunnel"] == name)
                .map(|(_, v)| *v)
        };
        if of(&red.name) == Some(2.0) && of(&blue.name) == Some(0.0) {
            break states;
        }
        if Instant::now() > deadline {
            return Err(format!("Prometheus never saw red up and blue down: {states:?}").into());
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    for (m, _) in &states {
        assert_eq!(m["job"], "protego", "{m}");
        assert!(m["node"].as_str().is_some_and(|n| !n.is_empty()), "{m}");
    }
    let blue_tenant = query(ns, "protego_tunnel_up{tenant=\"blue\"}")?;
    assert_eq!(blue_tenant.len(), 1, "{blue_tenant:?}");
    assert_eq!(blue_tenant[0].1, 0.0);

    // The exposition: red's traffic as totals, its IKE SA's establishment as a timestamp.
    let text = http_get(ns, METRICS, "/metrics")?;
    let red_t = format!("tunnel=\"{}\"", red.name);
    let packets_in = sample(
        &text,
        "protego_tunnel_packets_total",
        &[&red_t, "direction=\"in\""],
    );
    assert!(packets_in.is_some_and(|n| n >= 40.0), "{text}");
    let bytes_out = sample(
        &text,
        "protego_tunnel_bytes_total",
        &[&red_t, "direction=\"out\""],
    );
    assert!(bytes_out.is_some_and(|n| n > 0.0), "{text}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let established = sample(
        &text,
        "protego_ike_sa_established_timestamp_seconds",
        &[&red_t],
    )
    .ok_or("no IKE SA timestamp")?;
    assert!(
        established > now - 120.0 && established <= now + 1.0,
        "{established} vs {now}"
    );
    assert_eq!(
        sample(&text, "protego_ike_sas_established_total", &[&red_t]),
        Some(1.0),
        "{text}"
    );
    let blue_t = format!("tunnel=\"{}\"", blue.name);
    assert_eq!(
        sample(
            &text,
            "protego_tunnel_bytes_total",
            &[&blue_t, "direction=\"in\""]
        ),
        Some(0.0),
        "a down tunnel's counters are there, at zero"
    );
    assert_eq!(
        sample(
            &text,
            "protego_ike_sa_established_timestamp_seconds",
            &[&blue_t]
        ),
        None,
        "a tunnel that never connected has no establishment time"
    );
    // Prometheus's own view of the scrape: up, and our scrape-health metric.
    let up = query(ns, "up{job=\"protego\"}")?;
    assert_eq!(up.first().map(|u| u.1), Some(1.0), "{up:?}");
    let health = query(ns, "protego_up")?;
    assert_eq!(health.first().map(|u| u.1), Some(1.0), "{health:?}");
    eprintln!("the gateway's exposition:\n{text}");
    drop(gw);
    bed.teardown()?;
    Ok(())
}

/// Scrapes `ns`'s metrics until `ready` holds of the text (at most 15 s).
fn scrape_until(ns: &Netns, what: &str, ready: impl Fn(&str) -> bool) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = http_get(ns, METRICS, "/metrics")?;
        if ready(&text) {
            return Ok(text);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: never seen in\n{text}").into());
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Also the HTTP API of a control node (issue 20 §2): the cluster's resources for an operator,
/// 403 for a tenant, whose tunnels and metrics are its own.
#[test]
fn control_data_and_steer_nodes_serve_their_own_metrics() -> Result<()> {
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let table = vec!["[metrics]".to_owned(), format!("listen = \"{METRICS}\"")];
    let tokens_dir = tempfile::tempdir()?;
    let tokens = tokens_dir.path().join("api-tokens");
    let operator = token(&tokens, &["--operator", "ops"])?;
    let tenant = token(&tokens, &["--tenant", "t1", "t1-portal"])?;
    let other = token(&tokens, &["--tenant", "t2", "t2-portal"])?;
    let spec = ClusterSpec {
        // [data] and [steer] end their files: these lines open a table of their own.
        extra_data: table.clone(),
        extra_steer: table.clone(),
        extra_tables: format!(
            "{}\n[api]\nlisten = \"{API}\"\ntls = false\ntokens_file = \"{}\"\n",
            table.join("\n"),
            tokens.display()
        ),
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    let result = (|| -> Result<()> {
        let _site = site_up(&topo, &tun)?;
        ping_all_vms(&topo, 0, 20)?;
        let name = format!("tunnel=\"{}\"", tun.name);

        // The control node: the tunnel (its traffic summed from the data nodes' reports) and
        // every member of the cluster.
        let control = cluster.active_control()?.to_owned();
        let text = scrape_until(cluster.netns(&control)?, "control node traffic", |t| {
            sample(
                t,
                "protego_tunnel_packets_total",
                &[&name, "direction=\"in\""],
            )
            .is_some_and(|n| n >= 40.0)
        })?;
        assert_eq!(
            sample(&text, "protego_tunnel_state", &[&name]),
            Some(2.0),
            "{text}"
        );
        for member in cluster
            .data_node_names()
            .iter()
            .chain(&cluster.steer_node_names())
        {
            let m = format!("member=\"{member}\"");
            assert_eq!(
                sample(&text, "protego_cluster_node_alive", &[&m]),
                Some(1.0),
                "{member}: {text}"
            );
        }
        assert_eq!(sample(&text, "protego_up", &[]), Some(1.0), "{text}");
        let control_node = format!("node=\"{control}\"");
        assert!(
            sample(&text, "protego_up", &[&control_node]).is_some(),
            "{text}"
        );

        // The control node's API: the cluster for the operator, only its own for a tenant.
        let ns = cluster.netns(&control)?;
        let (status, body) = api(ns, "GET", "/api/v1/nodes", &operator)?;
        assert_eq!(status, 200, "{body}");
        for member in cluster.data_node_names() {
            assert!(body.contains(&format!("\"{member}\"")), "{member}: {body}");
        }
        let (status, body) = api(ns, "GET", "/api/v1/capacity", &operator)?;
        assert_eq!(status, 200, "{body}");
        for path in ["/api/v1/nodes", "/api/v1/capacity", "/api/v1/dispatch"] {
            let (status, body) = api(ns, "GET", path, &tenant)?;
            assert_eq!(status, 403, "{path}: {body}");
        }
        let (status, body) = api(
            ns,
            "POST",
            &format!("/api/v1/nodes/{}/drain", cluster.data_node_names()[0]),
            &tenant,
        )?;
        assert_eq!(status, 403, "{body}");
        let tunnel_path = format!("/api/v1/tunnels/{}", tun.name);
        let (status, body) = api(ns, "GET", &tunnel_path, &tenant)?;
        assert_eq!(status, 200, "{body}");
        let seen: serde_json::Value = serde_json::from_str(&body)?;
        assert_eq!(seen["state"], "established", "{body}");
        let (status, body) = api(ns, "GET", &tunnel_path, &other)?;
        assert_eq!(status, 404, "another tenant's tunnel: {body}");
        let (status, body) = api(ns, "GET", "/api/v1/metrics", &tenant)?;
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains(&name) && !body.contains("protego_cluster_node_alive{"),
            "{body}"
        );

        // The data node holding the CHILD_SA: its own part of the tunnel's traffic.
        let holder = cluster
            .sa_holder()?
            .ok_or("no data node holds the CHILD_SA")?;
        let text = http_get(cluster.netns(&holder)?, METRICS, "/metrics")?;
        let packets = sample(
            &text,
            "protego_node_tunnel_packets_total",
            &[&name, "direction=\"in\""],
        );
        assert!(packets.is_some_and(|n| n >= 40.0), "{text}");
        assert!(
            sample(&text, "protego_worker_packets_total", &[]).is_some_and(|n| n > 0.0),
            "{text}"
        );
        assert!(
            !text.contains("protego_tunnel_state"),
            "a data node has no IKE: {text}"
        );

        // The steer node: what it forwarded and its probes of each data node.
        let steer = cluster.steer_node_names()[0].clone();
        let text = http_get(cluster.netns(&steer)?, METRICS, "/metrics")?;
        let forwarded: f64 = text
            .lines()
            .filter(|l| l.starts_with("protego_steer_forwarded_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        assert!(forwarded >= 80.0, "{text}");
        let probed = text
            .lines()
            .filter(|l| l.starts_with("protego_steer_data_node_alive{") && l.ends_with(" 1"))
            .count();
        assert_eq!(probed, cluster.data_node_names().len(), "{text}");
        assert!(text.contains("protego_steer_probe_misses_total{"), "{text}");

        // The Grafana dashboard in the repository asks only for series the nodes export.
        let mut exported = std::collections::HashSet::new();
        for node in [control.as_str(), holder.as_str(), steer.as_str()] {
            exported.extend(sample_names(&http_get(
                cluster.netns(node)?,
                METRICS,
                "/metrics",
            )?));
        }
        let dashboard = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/grafana/protego.json");
        let dashboard: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&dashboard)?)?;
        let asked = dashboard_series(&dashboard);
        assert!(asked.len() >= 15, "{asked:?}");
        let unknown: Vec<&String> = asked.iter().filter(|n| !exported.contains(*n)).collect();
        assert!(
            unknown.is_empty(),
            "the dashboard asks for {unknown:?}, which no node exports"
        );
        Ok(())
    })();
    if result.is_err() {
        eprintln!("{}", cluster.log_tails(80));
    }
    cluster.stop_all();
    result?;
    bed.teardown()?;
    Ok(())
}

/// The sample names an exposition can have, from its `# TYPE` lines (a counter's with
/// `_total`, a histogram's `_bucket`, `_sum` and `_count`, an info's `_info`).
fn sample_names(text: &str) -> std::collections::HashSet<String> {
    let mut out = std::collections::HashSet::new();
    for line in text.lines() {
        let mut words = line.split(' ');
        let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        match kind {
            "counter" => {
                out.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["bucket", "sum", "count"] {
                    out.insert(format!("{name}_{suffix}"));
                }
            }
            "info" => {
                out.insert(format!("{name}_info"));
            }
            _ => {
                out.insert(name.to_owned());
            }
        }
    }
    out
}

/// Every `protego_*` series name in the dashboard's queries.
fn dashboard_series(dashboard: &serde_json::Value) -> std::collections::BTreeSet<String> {
    fn walk(v: &serde_json::Value, out: &mut std::collections::BTreeSet<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    if let (true, Some(expr)) = (k == "expr", v.as_str()) {
                        let mut rest = expr;
                        while let Some(at) = rest.find("protego_") {
                            let name: String = rest[at..]
                                .chars()
                                .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                                .collect();
                            rest = &rest[at + name.len()..];
                            out.insert(name);
                        }
                    }
                    walk(v, out);
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = std::collections::BTreeSet::new();
    walk(dashboard, &mut out);
    out
}
