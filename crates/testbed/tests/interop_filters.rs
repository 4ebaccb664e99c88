//! Tenant eBPF filters (issue 18 §5) against a real strongSwan site: `protego up` runs a
//! tenant's XDP programs (`[[filter]]`, compiled with clang-14 as a tenant would) on the traffic
//! between the site's tunnel and the tenant's VM behind a kernel VXLAN host.
//!
//! - A firewall (`examples/filters/udp_firewall.c`) drops exactly the UDP ports a tenant
//!   names in its map (`protego ctl filter map update`), in both directions, and `protego
//!   status` and `protego ctl filter show` count each dropped datagram.
//! - The SYN-cookie proxy (`examples/filters/syncookie.c`, its port set the same way) answers
//!   a real client's SYN itself: the VM's server sees its SYN only after the client
//!   acknowledged the cookie, the client's and the server's initial sequence numbers differ,
//!   and data flows both ways translated.
//! - A pass-everything program replaced several times (`protego ctl filter load`) under a
//!   1 kHz ping loses no ping; its map keeps its contents across the replacements.
//! - Programs that read out of bounds, loop without bound or call a helper the gateway lacks
//!   are refused by `protego check` and `protego up` (nothing runs) and by `protego ctl filter
//!   load` (nothing changes), naming the section, the instruction and the source line.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

use protego_testbed::inject::UdpByPort;
use protego_testbed::protego::{GatewayFilter, GatewayTunnel, ProtegoGateway};
use protego_testbed::topology::VmSpec;
use protego_testbed::traffic::{self, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Cmd, Error, Result, Testbed, Topology, TopologySpec};

/// An I/O error of `action` on `path`, as the test bed reports its own.
fn io_err(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// The tenant of every test here.
const TENANT: &str = "t1";

/// One tenant with one site and one VM on one cloud host.
fn one_vm() -> Result<TopologySpec> {
    Ok(TopologySpec {
        tenants: vec![tenant(TENANT, 4242, false, vec![VmSpec { host: 0 }])?],
        hosts: 1,
        ..TopologySpec::default()
    })
}

/// Compiles `source` into the run directory as `NAME.o`; `None` when clang-14 is missing
/// outside `make test` (testreq printed SKIPPED; under `make test` the test failed).
fn compile(bed: &Testbed, source: &Path) -> Option<PathBuf> {
    let name = source.file_stem()?.to_string_lossy().into_owned();
    let out = bed.dir().join(format!("{name}.o"));
    testreq::bpf::compile(source, &out, true).map(|_| out)
}

/// `examples/filters/NAME.c`, compiled as [`compile`] does.
fn example(bed: &Testbed, name: &str) -> Option<PathBuf> {
    compile(bed, &testreq::bpf::examples_dir().join(format!("{name}.c")))
}

/// `protego ctl filter map update TENANT MAP --key KEY --value VALUE` (hex).
fn map_update(gw: &ProtegoGateway, map: &str, key: &str, value: &str) -> Result<()> {
    gw.ctl([
        "filter", "map", "update", TENANT, map, "--key", key, "--value", value,
    ])
    .map(drop)
}

/// The counters of the tenant's program `section` in `direction`, from `protego ctl filter
/// show --json`.
fn program_counters(
    gw: &ProtegoGateway,
    direction: &str,
    section: &str,
) -> Result<serde_json::Value> {
    let out = gw.ctl(["filter", "show", TENANT, "--json"])?;
    let show: serde_json::Value = serde_json::from_str(&out).map_err(|e| Error::Parse {
        what: "protego ctl filter show --json",
        detail: e.to_string(),
        input: out.chars().take(400).collect(),
    })?;
    show["filters"]
        .as_array()
        .and_then(|fs| {
            fs.iter()
                .find(|f| f["direction"] == direction && f["section"] == section)
                .cloned()
        })
        .ok_or_else(|| Error::Parse {
            what: "protego ctl filter show --json",
            detail: format!("no program {section} {direction}"),
            input: out.chars().take(400).collect(),
        })
}

/// A `[[filter]]` of [`TENANT`].
fn filter(direction: &'static str, object: &Path, section: &str, weight: u32) -> GatewayFilter {
    GatewayFilter {
        tenant: TENANT.to_owned(),
        direction,
        object: object.to_owned(),
        section: section.to_owned(),
        weight,
    }
}

/// The tenant's `filter_drop` counter in `protego status --json`.
fn filter_drops(gw: &ProtegoGateway) -> Result<u64> {
    Ok(gw.status_json()?["drops"][format!("{TENANT}/filter_drop")]
        .as_u64()
        .unwrap_or(0))
}

/// Waits (at most 5 s) until the tenant's `filter_drop` counter reads `n`; the data plane's
/// counters reach the status a moment after the packets.
fn wait_filter_drops(gw: &ProtegoGateway, n: u64) -> Result<()> {
    wait_for(
        &format!("{TENANT}/filter_drop = {n}"),
        Duration::from_secs(5),
        || {
            let seen = filter_drops(gw)?;
            Ok(if seen == n {
                Probe::Ready(())
            } else {
                Probe::NotYet(format!("{seen}"))
            })
        },
    )
}

/// Starts the gateway for `topo` with `filters`, brings the site's tunnel up and runs `body`
/// with the gateway; prints the gateway's log if it fails.
fn with_gateway(
    bed: &Testbed,
    topo: &Topology,
    filters: &[GatewayFilter],
    body: impl FnOnce(&mut ProtegoGateway) -> Result<()>,
) -> Result<()> {
    let tun = GatewayTunnel::for_site(topo, 0, PSK);
    let mut gw = ProtegoGateway::start_with_tables(
        bed,
        topo,
        std::slice::from_ref(&tun),
        &[],
        &GatewayFilter::tables(filters),
    )?;
    let result = site_up(topo, &tun).and_then(|_site| body(&mut gw));
    if result.is_err() {
        eprintln!("--- protego log ---\n{}", gw.log());
    }
    result
}

/// The ports the firewall test sends to, and those it blocks (`map update blocked_ports`).
const PORTS: [u16; 6] = [7000, 7001, 7002, 7003, 7004, 7005];
const BLOCKED: [u16; 2] = [7001, 7003];
/// Datagrams per port.
const COPIES: u32 = 5;

#[test]
fn a_tenant_firewall_drops_exactly_the_ports_it_names_both_ways() -> Result<()> {
    let bed = Testbed::new()?;
    let Some(object) = example(&bed, "udp_firewall") else {
        return Ok(());
    };
    let topo = Topology::build(&bed, one_vm()?)?;
    let filters = [
        filter("to_cloud", &object, "xdp", 0),
        // The same object: the same map, so the same ports, from the VM.
        filter("from_cloud", &object, "xdp", 0),
    ];
    with_gateway(&bed, &topo, &filters, |gw| {
        let site = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        assert_eq!(filter_drops(gw)?, 0, "the warm-up pings passed");
        // The tenant names its ports: `blocked_ports` is u16 (network order) -> u8.
        for port in BLOCKED {
            map_update(gw, "blocked_ports", &format!("{port:04x}"), "01")?;
        }
        let passing: Vec<u16> = PORTS
            .iter()
            .copied()
            .filter(|p| !BLOCKED.contains(p))
            .collect();
        let expected: BTreeMap<u16, u32> = PORTS
            .iter()
            .map(|&p| (p, if BLOCKED.contains(&p) { 0 } else { COPIES }))
            .collect();
        let dropped = u64::from(COPIES) * BLOCKED.len() as u64;

        // Site -> VM (to_cloud).
        let to_vm = UdpByPort {
            src: &site.ns,
            from: site.lan_addr,
            dst: &vm.ns,
            to: vm.addr.addr,
            ports: &PORTS,
            copies: COPIES,
        };
        let seen = to_vm.run(&passing, Duration::from_secs(5))?;
        // Each blocked datagram reached the gateway and was dropped by the program: none is
        // delivered late, and none was lost elsewhere.
        wait_filter_drops(gw, dropped)?;
        assert_eq!(seen, expected, "datagrams the VM received, by port");

        // VM -> site (from_cloud).
        let to_site = UdpByPort {
            src: &vm.ns,
            from: vm.addr.addr,
            dst: &site.ns,
            to: site.lan_addr,
            ports: &PORTS,
            copies: COPIES,
        };
        let seen = to_site.run(&passing, Duration::from_secs(5))?;
        wait_filter_drops(gw, 2 * dropped)?;
        assert_eq!(seen, expected, "datagrams the site received, by port");
        // The programs' own counters say which one dropped them.
        for direction in ["to_cloud", "from_cloud"] {
            let counters = program_counters(gw, direction, "xdp")?;
            assert_eq!(counters["dropped"], dropped, "{direction}: {counters}");
        }

        // ICMP is not the firewall's: the VM still answers.
        ping_all_vms(&topo, 0, 3)?;
        let text = gw.status_text()?;
        assert!(
            text.contains(&format!("{TENANT}/filter_drop")),
            "protego status shows the drops:\n{text}"
        );

        // Killed and restarted, the gateway runs the filters with the tenant's map settings
        // written again from its store: the same ports stay blocked.
        let killed = gw.process().stop_with(SIGKILL);
        assert!(killed.is_some(), "protego was running");
        gw.restart(&topo, "protego-restarted")?;
        warm_up_within(&topo, 0, Duration::from_secs(20))?;
        let dump = map_dump(gw, "blocked_ports")?;
        let mut keys: Vec<String> = dump["entries"]
            .as_array()
            .map(|e| {
                e.iter()
                    .filter_map(|e| e["key"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default();
        keys.sort();
        let want: Vec<String> = BLOCKED.iter().map(|p| format!("{p:04x}")).collect();
        assert_eq!(keys, want, "the settings after the restart: {dump}");
        let seen = to_vm.run(&passing, Duration::from_secs(5))?;
        wait_filter_drops(gw, dropped)?;
        assert_eq!(
            seen, expected,
            "datagrams the VM received after the restart, by port"
        );
        Ok(())
    })
}

/// The TCP port the SYN-cookie test's server listens on, protected by the proxy.
const SERVER_PORT: u16 = 8080;
/// Bytes the client sends, and the server sends back: many segments, each with its sequence
/// numbers translated by the proxy.
const TCP_BYTES: usize = 100_000;

/// The byte at offset `i` of the test's TCP stream.
fn stream_byte(i: usize) -> u8 {
    (i * 7 % 251) as u8
}

/// The VM's server: accepts one connection (within 20 s), reads [`TCP_BYTES`], sends them back
/// and returns them.
fn serve_once(listener: std::net::TcpListener) -> std::io::Result<Vec<u8>> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut conn = loop {
        match listener.accept() {
            Ok((conn, _)) => break conn,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    };
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut data = vec![0; TCP_BYTES];
    conn.read_exact(&mut data)?;
    conn.write_all(&data)?;
    Ok(data)
}

/// One row of a tshark field query, parsed: the packet's time and raw sequence number.
fn time_and_seq(row: &[String]) -> Option<(f64, u64)> {
    Some((row.first()?.parse().ok()?, row.get(1)?.parse().ok()?))
}

/// The first packet matching `display_filter` in `pcap`: its time and raw sequence number.
fn first_packet(pcap: &Path, display_filter: &str) -> Result<(f64, u64)> {
    let rows = traffic::tshark_fields(pcap, display_filter, &["frame.time_epoch", "tcp.seq_raw"])?;
    rows.iter()
        .filter_map(|r| time_and_seq(r))
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .ok_or_else(|| Error::Parse {
            what: "capture",
            detail: format!("no packet matches {display_filter:?}"),
            input: pcap.display().to_string(),
        })
}

#[test]
fn the_syn_cookie_program_answers_a_syn_through_the_tunnel() -> Result<()> {
    let bed = Testbed::new()?;
    let Some(object) = example(&bed, "syncookie") else {
        return Ok(());
    };
    let topo = Topology::build(&bed, one_vm()?)?;
    let filters = [
        filter("to_cloud", &object, "xdp:syncookie_in", 0),
        filter("from_cloud", &object, "xdp:syncookie_out", 0),
    ];
    with_gateway(&bed, &topo, &filters, |gw| {
        // `protected_ports` is u16 (network order) -> u8.
        map_update(gw, "protected_ports", &format!("{SERVER_PORT:04x}"), "01")?;
        let site = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        let tcp = format!("tcp port {SERVER_PORT}");
        let site_cap = traffic::capture(&site.ns, "any", &tcp, "syncookie-site")?;
        let vm_cap = traffic::capture(&vm.ns, &vm.ifname, &tcp, "syncookie-vm")?;
        let server = SocketAddr::new(vm.addr.addr, SERVER_PORT);
        let listener = vm.ns.tcp_listener(server)?;
        let serving = std::thread::spawn(move || serve_once(listener));

        let sent: Vec<u8> = (0..TCP_BYTES).map(stream_byte).collect();
        let io = |what: &'static str| io_err(what, "site -> vm:8080");
        let mut client = site.ns.tcp_connect(
            SocketAddr::new(site.lan_addr, 0),
            server,
            Duration::from_secs(10),
        )?;
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(io("set a read timeout"))?;
        client.write_all(&sent).map_err(io("send"))?;
        let mut back = vec![0; TCP_BYTES];
        client.read_exact(&mut back).map_err(io("receive"))?;
        drop(client);
        let received = serving
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
            .map_err(io_err("serve", "vm:8080"))?;
        assert!(received == sent, "the server received what the client sent");
        assert!(
            back == sent,
            "the client received what the server sent back"
        );

        // The captures: the handshake at both ends.
        let syn = "tcp.flags.syn == 1 && tcp.flags.ack == 0";
        let syn_ack = "tcp.flags.syn == 1 && tcp.flags.ack == 1";
        let limit = Duration::from_secs(5);
        site_cap.wait_for_packets(syn_ack, 1, limit);
        vm_cap.wait_for_packets(syn_ack, 1, limit);
        let (site_pcap, vm_pcap) = (site_cap.stop(), vm_cap.stop());
        let client_ack =
            format!("tcp.dstport == {SERVER_PORT} && tcp.flags.syn == 0 && tcp.flags.ack == 1");
        let (acked_at, _) = first_packet(&site_pcap, &client_ack)?;
        let (cookie_at, cookie) = first_packet(&site_pcap, syn_ack)?;
        let (_, client_isn) = first_packet(&site_pcap, syn)?;
        let (vm_syn_at, vm_syn_isn) = first_packet(&vm_pcap, syn)?;
        let (_, server_isn) = first_packet(&vm_pcap, syn_ack)?;
        eprintln!(
            "client saw SYN-ACK seq {cookie} at {cookie_at:.6}, acknowledged at {acked_at:.6}; \
             the VM saw its SYN at {vm_syn_at:.6} and answered with seq {server_isn}"
        );
        // Causality, not timing: without the proxy the client's ACK would follow the VM's SYN.
        assert!(
            vm_syn_at > acked_at,
            "the VM saw a SYN ({vm_syn_at:.6}) before the client acknowledged the cookie ({acked_at:.6})"
        );
        assert_ne!(
            cookie, server_isn,
            "the client's SYN-ACK came from the gateway, not the VM"
        );
        assert_eq!(
            vm_syn_isn, client_isn,
            "the VM's SYN carries the client's initial sequence number"
        );
        // The programs sent the SYN-ACK to the client and the ACK to the server (XDP_TX).
        for direction in ["to_cloud", "from_cloud"] {
            let section = if direction == "to_cloud" {
                "xdp:syncookie_in"
            } else {
                "xdp:syncookie_out"
            };
            let counters = program_counters(gw, direction, section)?;
            assert!(
                counters["tx"].as_u64().is_some_and(|n| n >= 1),
                "{direction}: {counters}"
            );
        }
        // Not asserted: `t1/filter_drop`. The proxy drops the client's segments that arrive
        // before the server answered (the client sends them again), which a loaded machine
        // makes happen.
        Ok(())
    })
}

/// Writes and compiles version `version` of a program that passes every packet (and counts
/// them in its map `seen`, which a replacement keeps), or drops every packet with `drop`.
fn pass_program(bed: &Testbed, version: u32, drop: bool) -> Option<PathBuf> {
    let verdict = if drop { "XDP_DROP" } else { "XDP_PASS" };
    // Every version is a `pass.o` (in a directory of its own): a new version of the same file,
    // which a load puts in the place of the one before.
    let dir = bed.dir().join(format!("pass_v{version}"));
    std::fs::create_dir_all(&dir).expect("a directory for the version");
    let source = dir.join("pass.c");
    let text = format!(
        "/* Version {version}: {verdict} for every packet. */\n\
         #include <linux/bpf.h>\n\
         #include <bpf/bpf_helpers.h>\n\
         struct {{\n\
             __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);\n\
             __uint(max_entries, 1);\n\
             __type(key, __u32);\n\
             __type(value, __u64);\n\
         }} seen SEC(\".maps\");\n\
         SEC(\"xdp\")\n\
         int pass(struct xdp_md *ctx)\n\
         {{\n\
             __u32 key = 0;\n\
             __u64 *n = bpf_map_lookup_elem(&seen, &key);\n\
             if (n)\n\
                 *n += {version} + 1;\n\
             return {verdict};\n\
         }}\n\
         char LICENSE[] SEC(\"license\") = \"GPL\";\n"
    );
    std::fs::write(&source, text).expect("write the program into the run directory");
    let out = dir.join("pass.o");
    testreq::bpf::compile(&source, &out, true).map(|_| out)
}

/// `protego ctl filter map dump TENANT MAP --json`.
fn map_dump(gw: &ProtegoGateway, map: &str) -> Result<serde_json::Value> {
    let out = gw.ctl(["filter", "map", "dump", TENANT, map, "--json"])?;
    serde_json::from_str(&out).map_err(|e| Error::Parse {
        what: "protego ctl filter map dump --json",
        detail: e.to_string(),
        input: out.chars().take(400).collect(),
    })
}

/// The sum of every worker's value of the pass programs' map `seen`
/// (`protego ctl filter map dump`).
fn seen_total(gw: &ProtegoGateway) -> Result<u64> {
    let dump = map_dump(gw, "seen")?;
    let values = dump["entries"][0]["values"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    values
        .iter()
        .map(|v| {
            let bytes = v.as_str().and_then(|h| hex::decode(h).ok());
            bytes
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| Error::Parse {
                    what: "protego ctl filter map dump --json",
                    detail: "a value of `seen` is not 8 bytes of hex".to_owned(),
                    input: dump.to_string().chars().take(400).collect(),
                })
        })
        .sum()
}

/// Pings at 1 kHz during the replacements.
const PINGS: u32 = 3000;
/// Replacements under the ping.
const REPLACEMENTS: u32 = 6;

#[test]
fn replacing_a_program_under_a_1_khz_ping_loses_no_ping() -> Result<()> {
    let bed = Testbed::new()?;
    let mut versions = Vec::new();
    for v in 0..=REPLACEMENTS {
        let Some(object) = pass_program(&bed, v, false) else {
            return Ok(());
        };
        versions.push(object);
    }
    let Some(dropping) = pass_program(&bed, REPLACEMENTS + 1, true) else {
        return Ok(());
    };
    let Some(refused) = compile(&bed, &refused_source()) else {
        return Ok(());
    };
    let topo = Topology::build(&bed, one_vm()?)?;
    let filters = [filter("to_cloud", &versions[0], "xdp", 0)];
    with_gateway(&bed, &topo, &filters, |gw| {
        let site = &topo.sites[0];
        let vm = &topo.tenants[0].vms[0];
        let load = |object: &Path| {
            gw.ctl([
                "filter",
                "load",
                TENANT,
                "--direction",
                "to_cloud",
                "--object",
                &object.display().to_string(),
                "--section",
                "xdp",
            ])
        };
        let (ns, from, to) = (site.ns.clone(), site.lan_addr, vm.addr.addr);
        let pinging = std::thread::spawn(move || {
            traffic::ping(
                &ns,
                to,
                &PingOptions::new(PINGS, Duration::from_millis(1)).from(from),
            )
        });
        // Replacements spread over the ping's middle (it runs for about 3 s).
        std::thread::sleep(Duration::from_millis(500));
        let loaded = versions[1..].iter().try_for_each(|object| {
            let out = load(object)?;
            eprintln!("filter load {}: {}", object.display(), out.trim());
            // A replacement in the same place, not a second program.
            assert!(out.contains("in place of"), "{out}");
            std::thread::sleep(Duration::from_millis(250));
            Ok(())
        });
        // The ping ends by itself; wait for it before reporting a failed load.
        let ping = pinging
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        loaded?;
        let ping = ping?;
        eprintln!("{ping:?}");
        assert_eq!(ping.transmitted, PINGS, "{ping:?}");
        assert_eq!(
            ping.lost(),
            0,
            "pings lost across the replacements: {ping:?}"
        );
        // The last version runs, and its map kept what the earlier ones counted: each
        // version adds its number plus one per packet, so the last alone cannot make the sum.
        let seen = seen_total(gw)?;
        let last = program_counters(gw, "to_cloud", "xdp")?;
        assert_eq!(last["object"], "pass.o", "{last}");
        let own = u64::from(REPLACEMENTS + 1) * last["passed"].as_u64().unwrap_or(u64::MAX);
        assert!(
            seen > own,
            "map `seen` holds {seen}, no more than the last version's {own}: {last}"
        );

        // The loads took effect: a version that drops everything stops the pings (each
        // request dropped and counted), and the passing one brings them back.
        load(&dropping)?;
        let lost = traffic::ping(
            &site.ns,
            vm.addr.addr,
            &PingOptions::new(5, Duration::from_millis(10)).from(site.lan_addr),
        )?;
        assert_eq!(lost.received, 0, "{lost:?}");
        wait_filter_drops(gw, 5)?;
        load(&versions[0])?;
        ping_all_vms(&topo, 0, 5)?;

        // A program the verifier refuses, loaded at run time, changes nothing and says why.
        for r in &REFUSED {
            let e = gw
                .ctl([
                    "filter",
                    "load",
                    TENANT,
                    "--direction",
                    "to_cloud",
                    "--object",
                    &refused.display().to_string(),
                    "--section",
                    r.section,
                ])
                .expect_err("a refused program is not loaded");
            eprintln!("ctl filter load {}: {e}", r.section);
            let e = e.to_string();
            r.assert_said(&format!("ctl filter load {}", r.section), &e);
            assert!(e.contains("no filter changed"), "{e}");
        }
        let running = program_counters(gw, "to_cloud", "xdp")?;
        assert_eq!(running["object"], "pass.o", "{running}");
        ping_all_vms(&topo, 0, 5)?;
        Ok(())
    })
}

/// `crates/filter/tests/filters/refused.c`: programs the loader must refuse.
fn refused_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../filter/tests/filters/refused.c")
}

/// A program of [`refused_source`] the gateway must refuse, and what the refusal must say
/// besides its section.
struct Refused {
    section: &'static str,
    /// Each must appear in the message.
    says: &'static [&'static str],
}

impl Refused {
    /// Asserts that `message`, what `what` printed, names the section and says the rest.
    fn assert_said(&self, what: &str, message: &str) {
        let section = format!("section `{}`", self.section);
        for needle in std::iter::once(section.as_str()).chain(self.says.iter().copied()) {
            assert!(
                message.contains(needle),
                "{what}: {needle:?} missing from\n{message}"
            );
        }
    }
}

const REFUSED: [Refused; 3] = [
    Refused {
        section: "xdp:out_of_bounds",
        // Reads byte 20 after checking 14.
        says: &["instruction ", "packet_size", "refused.c:", "p[20]"],
    },
    Refused {
        section: "xdp:unbounded_loop",
        says: &["instruction ", "Loop", "refused.c:", "spins++"],
    },
    Refused {
        section: "xdp:unknown_helper",
        says: &["instruction ", "bpf_get_smp_processor_id", "not offered"],
    },
];

/// A gateway configuration of one tenant and one filter, listening on loopback.
fn refusal_config(dir: &Path, object: &Path, section: &str) -> String {
    format!(
        "[gateway]\nlisten = [\"127.0.0.1\"]\ncontrol_socket = {:?}\n\n\
         [[tenant]]\nname = {TENANT:?}\n\n{}",
        dir.join("protego.sock").display().to_string(),
        filter("to_cloud", object, section, 0).to_toml()
    )
}

#[test]
fn programs_that_read_out_of_bounds_loop_or_call_unknown_helpers_are_refused() -> Result<()> {
    let bed = Testbed::new()?;
    let Some(object) = compile(&bed, &refused_source()) else {
        return Ok(());
    };
    let ns = bed.netns("refuse")?;
    let bin = protego_testbed::workspace_bin("protego")?;
    let bin = bin.display().to_string();
    for (i, r) in REFUSED.iter().enumerate() {
        let dir = bed.dir().join(format!("refused{i}"));
        std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
        let config = dir.join("protego.toml");
        std::fs::write(&config, refusal_config(&dir, &object, r.section))
            .map_err(io_err("write config", &config))?;
        let config = config.display().to_string();
        let check = Cmd::new(&bin)
            .args(["check", "--config", &config])
            .timeout(Duration::from_secs(20))
            .output()?;
        let up = Cmd::new(&bin)
            .args(["up", "--config", &config])
            .timeout(Duration::from_secs(20))
            .in_netns(ns.name())
            .output()?;
        for (what, out) in [("check", &check), ("up", &up)] {
            let message = format!("{}{}", out.stdout, out.stderr);
            eprintln!("protego {what} on {}:\n{message}", r.section);
            assert_eq!(out.code(), Some(1), "protego {what} refuses {}", r.section);
            r.assert_said(&format!("protego {what} on {}", r.section), &message);
            assert!(
                message.contains("key `object` in [[filter]]"),
                "the configuration's key named:\n{message}"
            );
        }
        // Nothing ran: no control socket was ever opened.
        assert!(!dir.join("protego.sock").exists());
    }
    // The accepted counterpart of the same object passes the same check.
    let dir = bed.dir().join("accepted");
    std::fs::create_dir_all(&dir).map_err(io_err("create directory", &dir))?;
    let config = dir.join("protego.toml");
    std::fs::write(&config, refusal_config(&dir, &object, "xdp:packet_walk"))
        .map_err(io_err("write config", &config))?;
    let ok = Cmd::new(&bin)
        .args(["check", "--config", &config.display().to_string()])
        .timeout(Duration::from_secs(20))
        .run()?;
    assert!(ok.contains("verified"), "{ok}");
    Ok(())
}
