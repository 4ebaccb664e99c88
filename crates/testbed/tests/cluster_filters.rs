//! Tenant filters (issue 18 §1) in the distributed form, against real strongSwan: a filter
//! loaded on the control node (`protego ctl filter load`) drops exactly the packets it names
//! on the data node serving the tunnel, and keeps doing so after the tunnel migrates to the
//! other data node, after the serving node is killed and restarted (it gets the filters again
//! when it registers), and after the control node restarts (the set comes from its store); with
//! two control nodes on etcd, the standby that takes over runs the stored set and changes it.
//!
//! The data nodes run with `cpu_fairness = "account"`, shipped to them by the control node,
//! whose `status` sums the tenant's CPU over them.
//!
//! The filter, `tests/filters/drop_size.c`, drops ICMP echo requests of one IPv4 total length:
//! 1028 (`ping -s 1000`) until its map `size` says another. Map state is per data node: an
//! update reaches every live data node, and a node that restarts gets the tenant's map
//! settings (the updates the control node stored) written again after its filters, which the
//! test checks too.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

use protego_testbed::cluster::{ClusterSpec, ClusterStore, ProtegoCluster};
use protego_testbed::protego::GatewayTunnel;
use protego_testbed::traffic::{self, PingOptions};
use protego_testbed::wait::{wait_for, Probe};
use protego_testbed::{Result, Testbed, Topology};

/// `ping -s` of the packets the filter drops as it is loaded (IPv4 total length 1028).
const DEFAULT_SIZE: u32 = 1000;
/// `ping -s` of those it drops once its map says 1128.
const MAPPED_SIZE: u32 = 1100;
/// Echo requests per check.
const PINGS: u32 = 10;

/// Replies to [`PINGS`] pings of `size` bytes (None: ping's default) from the site to VM 0.
fn replies(topo: &Topology, size: Option<u32>) -> Result<u32> {
    let s = &topo.sites[0];
    let vm = &topo.tenants[0].vms[0];
    let mut opts = PingOptions::new(PINGS, Duration::from_millis(10)).from(s.lan_addr);
    opts.size = size;
    Ok(traffic::ping(&s.ns, vm.addr.addr, &opts)?.received)
}

/// Waits (at most 10 s) for a run of pings of `size` that all get their replies: a ping lost
/// while the cluster settles (a failover after missed probes on a busy machine) is not a
/// filter's doing, which drops every one.
fn all_replies(topo: &Topology, size: Option<u32>, what: &str) -> Result<()> {
    wait_for(what, Duration::from_secs(10), || {
        let got = replies(topo, size)?;
        Ok(if got == PINGS {
            Probe::Ready(())
        } else {
            Probe::NotYet(format!("{got} of {PINGS} replies"))
        })
    })
}

/// Pings of `dropped` bytes get no reply, the others all of theirs.
fn drops_exactly(topo: &Topology, dropped: u32, where_: &str) -> Result<()> {
    let other = if dropped == DEFAULT_SIZE {
        MAPPED_SIZE
    } else {
        DEFAULT_SIZE
    };
    assert_eq!(replies(topo, Some(dropped))?, 0, "{where_}: -s {dropped}");
    for size in [Some(other), None] {
        all_replies(topo, size, &format!("{where_}: -s {size:?}"))?;
    }
    Ok(())
}

/// Waits until `ctl filter show` counts at least `dropped` drops (summed over the data
/// nodes' reports, which come every second).
fn wait_counted(cluster: &ProtegoCluster, tenant: &str, dropped: u64) -> Result<()> {
    wait_for(
        "the dropped pings in filter show",
        Duration::from_secs(10),
        || {
            let show = cluster.control(&format!(
                r#"{{"command":"filter_show","tenant":"{tenant}"}}"#
            ))?;
            let seen = show["filters"][0]["dropped"].as_u64().unwrap_or(0);
            Ok(if seen >= dropped {
                Probe::Ready(())
            } else {
                Probe::NotYet(show.to_string())
            })
        },
    )
}

/// The map `size` of each data node, by name, as `filter map dump` answers.
fn sizes(cluster: &ProtegoCluster, tenant: &str) -> Result<Vec<(String, String)>> {
    let dump = cluster.control(&format!(
        r#"{{"command":"filter_map","tenant":"{tenant}","map":"size","op":"dump"}}"#
    ))?;
    Ok(dump["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|n| {
            (
                n["node"].as_str().unwrap_or("?").to_owned(),
                n["entries"][0]["value"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect())
}

/// `tests/filters/drop_size.c` compiled for the running test; `None`: no clang-14 (not strict).
fn drop_size() -> Option<String> {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filters/drop_size.c");
    let object = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "drop_size-{}-{}.o",
        std::process::id(),
        testreq::this_test().replace("::", "-")
    ));
    testreq::bpf::compile(&source, &object, true)?;
    Some(object.display().to_string())
}

/// `protego ctl filter load TENANT --direction to_cloud --object OBJECT` on the active control
/// node.
fn load(cluster: &ProtegoCluster, tenant: &str, object: &str) -> Result<()> {
    let loaded = cluster.ctl(&[
        "filter",
        "load",
        tenant,
        "--direction",
        "to_cloud",
        "--object",
        object,
        "--json",
    ])?;
    assert!(loaded.contains("\"generation\""), "{loaded}");
    Ok(())
}

#[test]
fn a_filter_loaded_on_the_control_node_follows_the_tunnel_across_data_nodes() -> Result<()> {
    let Some(object) = drop_size() else {
        return Ok(());
    };
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    // The data nodes charge each packet's CPU to its tenant; `status` on the control node
    // sums the charge over them.
    let spec = ClusterSpec {
        extra_gateway: vec!["cpu_fairness = \"account\"".to_owned()],
        ..ClusterSpec::default()
    };
    let mut cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    let result = (|| -> Result<()> {
        let _site = site_up(&topo, &tun)?;
        warm_up(&topo, 0)?;
        let tenant = topo.tenants[0].name.clone();
        let data = cluster.data_node_names();
        assert_eq!(
            replies(&topo, Some(DEFAULT_SIZE))?,
            PINGS,
            "before the filter"
        );

        // Loaded on the control node: every data node verified it before the answer.
        load(&cluster, &tenant, &object)?;
        let holder = cluster
            .sa_holder()?
            .expect("one data node holds the tunnel");
        drops_exactly(&topo, DEFAULT_SIZE, &format!("on {holder}"))?;
        wait_counted(&cluster, &tenant, u64::from(PINGS))?;
        wait_for(
            "the tenant's CPU in status",
            Duration::from_secs(10),
            || {
                let status = cluster.control("status")?;
                let t = &status["tenants"][0];
                Ok(
                    if t["tenant"] == tenant.as_str() && t["packets"].as_u64() > Some(0) {
                        Probe::Ready(())
                    } else {
                        Probe::NotYet(status["tenants"].to_string())
                    },
                )
            },
        )?;

        // A map update reaches every data node; each answers its own copy.
        let updated = cluster.control(&format!(
            r#"{{"command":"filter_map","tenant":"{tenant}","map":"size","op":"update","key":"00000000","value":"{}"}}"#,
            hex_u32(MAPPED_SIZE + 28)
        ))?;
        assert_eq!(
            updated["nodes"].as_array().map(Vec::len),
            Some(data.len()),
            "{updated}"
        );
        let mapped = hex_u32(MAPPED_SIZE + 28);
        assert!(
            sizes(&cluster, &tenant)?.iter().all(|(_, v)| *v == mapped),
            "{:?}",
            sizes(&cluster, &tenant)?
        );
        drops_exactly(&topo, MAPPED_SIZE, &format!("on {holder} after the update"))?;

        // Migrated to the other data node: it runs the same program with the same map.
        let other = data
            .iter()
            .find(|n| **n != holder)
            .expect("two data nodes")
            .clone();
        let moved = cluster.control(&format!("migrate {} {other}", tun.name))?;
        assert_eq!(moved["ok"], true, "{moved}");
        warm_up_within(&topo, 0, Duration::from_secs(10))?;
        drops_exactly(
            &topo,
            MAPPED_SIZE,
            &format!("on {other} after the migration"),
        )?;

        // The serving node is killed: the tunnel fails over to the first one. Restarted, the
        // node gets the filters again when it registers, then the tenant's map setting; moved
        // back onto it, the tunnel's pings of the size the tenant set are dropped there.
        cluster.kill(&other)?;
        warm_up_within(&topo, 0, Duration::from_secs(10))?;
        drops_exactly(
            &topo,
            MAPPED_SIZE,
            &format!("on {holder} after the failover"),
        )?;
        cluster.restart(&other)?;
        cluster.wait_alive(&[other.as_str()], Duration::from_secs(10))?;
        let moved = cluster.control(&format!("migrate {} {other}", tun.name))?;
        assert_eq!(moved["ok"], true, "{moved}");
        warm_up_within(&topo, 0, Duration::from_secs(10))?;
        drops_exactly(&topo, MAPPED_SIZE, &format!("on restarted {other}"))?;
        let per_node = sizes(&cluster, &tenant)?;
        assert!(
            per_node.contains(&(other.clone(), mapped.clone()))
                && per_node.contains(&(holder.clone(), mapped.clone())),
            "the setting on both nodes: {per_node:?}"
        );

        // Back to the declared length (0), on both nodes; the setting stays stored, and the
        // control node's restart below writes it into the nodes as they register again.
        cluster.control(&format!(
            r#"{{"command":"filter_map","tenant":"{tenant}","map":"size","op":"update","key":"00000000","value":"00000000"}}"#
        ))?;

        // The control node restarts: the set comes from its store, the data nodes keep
        // running it, and `filter show` lists it again.
        cluster.kill("control1")?;
        cluster.restart("control1")?;
        warm_up_within(&topo, 0, Duration::from_secs(10))?;
        drops_exactly(&topo, DEFAULT_SIZE, "after the control node's restart")?;
        let show = cluster.control(&format!(
            r#"{{"command":"filter_show","tenant":"{tenant}"}}"#
        ))?;
        assert_eq!(show["filters"][0]["section"], "xdp", "{show}");
        for n in &data {
            let log = cluster.log(n)?;
            eprintln!(
                "{n}: tenant filters applied {} times",
                log.matches("tenant filters applied").count()
            );
        }
        Ok(())
    })();
    cluster.finish(result)
}

/// With two control nodes on etcd, the standby that takes over after a `kill -9` of the
/// active one runs the stored set (its `filter show` lists it, the data nodes keep dropping)
/// and changes it on every data node (an unload there lets the pings through again).
#[test]
fn a_standby_taking_over_runs_and_changes_the_stored_filters() -> Result<()> {
    if skip_without_etcd("a_standby_taking_over_runs_and_changes_the_stored_filters") {
        return Ok(());
    }
    let Some(object) = drop_size() else {
        return Ok(());
    };
    let bed = Testbed::new()?;
    let topo = Topology::build(&bed, one_tenant(false)?)?;
    let tun = GatewayTunnel::for_site(&topo, 0, PSK);
    let spec = ClusterSpec {
        controls: 2,
        store: ClusterStore::Etcd,
        ..ClusterSpec::default()
    };
    let cluster = ProtegoCluster::start(&bed, &topo, std::slice::from_ref(&tun), &spec)?;
    let result = (|| -> Result<()> {
        let _site = site_up(&topo, &tun)?;
        warm_up(&topo, 0)?;
        let tenant = topo.tenants[0].name.clone();
        load(&cluster, &tenant, &object)?;
        drops_exactly(
            &topo,
            DEFAULT_SIZE,
            "loaded on the first active control node",
        )?;

        let (active, standby) = cluster.active_and_standby()?;
        cluster.kill(&active)?;
        cluster.wait_alive(&["data1", "data2", "steer1"], Duration::from_secs(15))?;
        assert_eq!(cluster.active_control()?, standby);
        let show = cluster.control(&format!(
            r#"{{"command":"filter_show","tenant":"{tenant}"}}"#
        ))?;
        assert_eq!(show["filters"][0]["section"], "xdp", "{show}");
        drops_exactly(&topo, DEFAULT_SIZE, &format!("after {standby} took over"))?;
        eprintln!("{active} killed: {standby} took over and runs the stored filters");

        let unloaded = cluster.ctl(&["filter", "unload", &tenant, "--json"])?;
        assert!(unloaded.contains("\"removed\""), "{unloaded}");
        all_replies(&topo, Some(DEFAULT_SIZE), "-s 1000 after the unload")
    })();
    cluster.finish(result)
}

/// A 32-bit number's little-endian bytes in hex (as an array map stores it).
fn hex_u32(n: u32) -> String {
    n.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect()
}
