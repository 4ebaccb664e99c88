//! The data plane's writer and the control node's master (`routebook::RouteMaster`) agree:
//! the same random sequence of route changes gives the same answers (reports, or errors
//! naming the same line and field) and byte-identical snapshots after every step.

use super::*;
use datapath::VmRoute;
use overlay::Vni;
use proptest::prelude::*;
use routebook::RouteMaster;
use std::net::IpAddr;

/// (tenant, VNet, VTEP is IPv6) of the configured VNets; `acme/nope` is never configured.
const VNETS: [(&str, &str, bool); 3] = [
    ("acme", "prod", false),
    ("globex", "main", false),
    ("acme", "six", true),
];
const NAMES: [(&str, &str); 4] = [
    ("acme", "prod"),
    ("globex", "main"),
    ("acme", "six"),
    ("acme", "nope"),
];
const ADDRS: [&str; 8] = [
    "10.0.0.1",
    "10.0.0.2",
    "10.0.0.3",
    "10.0.0.4",
    "fd00::1",
    "fd00::2",
    "0.0.0.0",
    "224.0.0.1",
];
const HOSTS: [&str; 6] = [
    "192.0.2.1",
    "192.0.2.2",
    "192.0.2.3",
    "2001:db8::1",
    "2001:db8::2",
    "255.255.255.255",
];

fn ip(s: &str) -> IpAddr {
    s.parse().expect("literal")
}

/// A step of the sequence.
#[derive(Debug, Clone)]
enum Step {
    Add(usize, usize, usize),
    Del(usize, usize),
    /// A route file: lines (VNet, address, host, as JSON, damaged).
    Load(Vec<(usize, usize, usize, bool, bool)>),
    /// A snapshot of these entries (VNet index into `NAMES`, address, host).
    Restore(Vec<(usize, usize, usize)>),
    /// A snapshot of these entries replaces the table.
    Replace(Vec<(usize, usize, usize)>),
    /// Caps the entries of both tables.
    Limit(Option<usize>),
    /// Configures only the VNets whose bit is set.
    Vnets(u8),
}

fn step() -> impl Strategy<Value = Step> {
    let line = (
        0..4usize,
        0..8usize,
        0..6usize,
        any::<bool>(),
        prop::bool::weighted(0.1),
    );
    prop_oneof![
        6 => (0..4usize, 0..8usize, 0..6usize).prop_map(|(v, a, h)| Step::Add(v, a, h)),
        3 => (0..4usize, 0..8usize).prop_map(|(v, a)| Step::Del(v, a)),
        2 => prop::collection::vec(line, 0..8).prop_map(Step::Load),
        1 => prop::collection::vec((0..4usize, 0..6usize, 0..3usize), 0..8).prop_map(Step::Restore),
        1 => prop::collection::vec((0..4usize, 0..6usize, 0..3usize), 0..8).prop_map(Step::Replace),
        1 => prop::option::of(2..12usize).prop_map(Step::Limit),
        1 => (0..8u8).prop_map(Step::Vnets),
    ]
}

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).expect("tenant")
}

/// The configured VNets whose bit is set in `mask`, numbered by `id`.
fn configured(mask: u8, mut id: impl FnMut(&TenantId, &str) -> VnetId) -> Vec<RouteVnet> {
    VNETS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(i, (t, n, v6))| RouteVnet {
            tenant: tenant(t),
            name: (*n).into(),
            id: id(&tenant(t), n),
            vni: Vni::new(100 + i as u32).expect("vni"),
            vtep_v6: *v6,
        })
        .collect()
}

fn change(step: &Step) -> Option<RouteChange> {
    Some(match step {
        Step::Add(v, a, h) => RouteChange::Add(VmRoute {
            tenant: tenant(NAMES[*v].0),
            vnet: NAMES[*v].1.into(),
            address: ip(ADDRS[*a]),
            host: ip(HOSTS[*h]),
        }),
        Step::Del(v, a) => RouteChange::Del {
            tenant: tenant(NAMES[*v].0),
            vnet: NAMES[*v].1.into(),
            address: ip(ADDRS[*a]),
        },
        Step::Load(lines) => {
            let mut text = String::from("tenant,vnet,address,host\n");
            for (v, a, h, json, damaged) in lines {
                let (t, n) = NAMES[*v];
                let (a, h) = (ADDRS[*a], HOSTS[*h]);
                if *damaged {
                    text.push_str(&format!("{t},{n},{a}\n"));
                } else if *json {
                    text.push_str(&format!(
                        "{{\"tenant\":\"{t}\",\"vnet\":\"{n}\",\"address\":\"{a}\",\"host\":\"{h}\"}}\n"
                    ));
                } else {
                    text.push_str(&format!("{t},{n},{a},{h}\n"));
                }
            }
            RouteChange::Load(text.into())
        }
        Step::Restore(entries) | Step::Replace(entries) => {
            let entries: Vec<(u32, IpAddr, IpAddr)> = entries
                .iter()
                .map(|(v, a, h)| (*v as u32, ip(ADDRS[*a]), ip(HOSTS[*h])))
                .collect();
            let mut bytes = Vec::new();
            overlay::write_snapshot(&mut bytes, &NAMES, entries.len(), entries).expect("in memory");
            if matches!(step, Step::Replace(_)) {
                RouteChange::Replace(bytes.into())
            } else {
                RouteChange::Restore(bytes.into())
            }
        }
        Step::Limit(_) | Step::Vnets(_) => return None,
    })
}

/// An error's text and, for a route error, its line and field.
fn describe(e: &DataplaneError) -> (String, Option<usize>, Option<&'static str>) {
    match e {
        DataplaneError::Route { line, field, .. } => (e.to_string(), *line, *field),
        other => (other.to_string(), None, None),
    }
}

fn snapshots(w: &RouteWriter, m: &RouteMaster) -> (Vec<u8>, Vec<u8>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    w.write_snapshot(&mut a).expect("writer snapshot");
    m.peek_snapshot(&mut b).expect("master snapshot");
    (a, b)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn writer_and_master_agree(steps in prop::collection::vec(step(), 1..40)) {
        let (mut w, _readers) = RouteWriter::new();
        let mut m = RouteMaster::new(1);
        let v = configured(0b111, |t, n| w.vnet_id(t, n));
        w.set_vnets(v);
        let v = configured(0b111, |t, n| m.vnet_id(t, n));
        m.set_vnets(v);
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Limit(max) => {
                    w.limit(*max);
                    m.limit(*max);
                }
                Step::Vnets(mask) => {
                    let v = configured(*mask, |t, n| w.vnet_id(t, n));
                    w.set_vnets(v);
                    let v = configured(*mask, |t, n| m.vnet_id(t, n));
                    m.set_vnets(v);
                }
                _ => {
                    let c = change(s).expect("a change");
                    let a = w.change(c.clone());
                    let b = m.change(c).map(|(_, r)| r);
                    match (&a, &b) {
                        (Ok(a), Ok(b)) => prop_assert_eq!(a, b, "step {}: {:?}", i, s),
                        (Err(a), Err(b)) => prop_assert_eq!(describe(a), describe(b), "step {}: {:?}", i, s),
                        _ => prop_assert!(false, "step {}: {:?}: writer {:?}, master {:?}", i, s, a, b),
                    }
                }
            }
            let (a, b) = snapshots(&w, &m);
            prop_assert!(a == b, "step {}: {:?}: snapshots differ", i, s);
            prop_assert_eq!(w.stats().entries, m.stats().entries);
        }
    }
}
