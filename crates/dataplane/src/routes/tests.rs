use super::*;
use crate::vnet::Vnet;
use datapath::{Route, VmRoute, VnetConfig};
use overlay::Key;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn tenant(s: &str) -> TenantId {
    TenantId::new(s).expect("tenant")
}

/// VNet `name` of `tenant` with VNI `vni`: 10.0.0.0/24 behind 192.0.2.1.
fn cfg(tenant_name: &str, name: &str, vni: u32) -> VnetConfig {
    VnetConfig {
        tenant: tenant(tenant_name),
        name: name.into(),
        vni,
        gateway_ips: vec![ip("10.0.0.1")],
        vtep: ip("192.0.2.100"),
        routes: vec![Route {
            prefix: ip("10.0.0.0"),
            len: 24,
            host: ip("192.0.2.1"),
        }],
        router_mac: None,
    }
}

/// A writer with VNets `acme/prod` (VNI 100) and `globex/main` (VNI 200), and their runtime
/// VNets.
fn setup() -> (RouteWriter, RouteReaders, Vec<Vnet>) {
    let (mut w, readers) = RouteWriter::new();
    let mut vnets = Vec::new();
    let mut list = Vec::new();
    for (i, (t, n, vni)) in [("acme", "prod", 100), ("globex", "main", 200)]
        .into_iter()
        .enumerate()
    {
        let c = cfg(t, n, vni);
        let key = w.vnet_id(&c.tenant, &c.name);
        let v = Vnet::new(i, &c, 0, key).expect("valid");
        list.push(entry(&v));
        vnets.push(v);
    }
    w.set_vnets(list);
    (w, readers, vnets)
}

/// The writer's view of runtime VNet `v` (its VTEP is IPv4).
fn entry(v: &Vnet) -> RouteVnet {
    RouteVnet {
        tenant: v.tenant.clone(),
        name: v.name.clone(),
        id: v.key,
        vni: v.vni,
        vtep_v6: false,
    }
}

fn add(w: &mut RouteWriter, t: &str, v: &str, addr: &str, host: &str) -> RouteChangeReport {
    w.change(RouteChange::Add(VmRoute {
        tenant: tenant(t),
        vnet: v.into(),
        address: ip(addr),
        host: ip(host),
    }))
    .expect("added")
}

fn del(
    w: &mut RouteWriter,
    t: &str,
    v: &str,
    addr: &str,
) -> Result<RouteChangeReport, DataplaneError> {
    w.change(RouteChange::Del {
        tenant: tenant(t),
        vnet: v.into(),
        address: ip(addr),
    })
}

fn route(readers: &RouteReaders, vnet: &Vnet, dst: &str) -> Option<IpAddr> {
    let r = readers.reader();
    let g = r.enter().expect("writer alive");
    vnet.route(&g, ip(dst))
}

#[test]
fn an_exact_entry_beats_the_prefix_and_a_delete_falls_back() {
    let (mut w, readers, vnets) = setup();
    let prod = &vnets[0];
    assert_eq!(route(&readers, prod, "10.0.0.7"), Some(ip("192.0.2.1")));
    assert_eq!(
        add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50").added,
        1
    );
    assert_eq!(route(&readers, prod, "10.0.0.7"), Some(ip("192.0.2.50")));
    assert_eq!(
        route(&readers, prod, "10.0.0.8"),
        Some(ip("192.0.2.1")),
        "neighbour untouched"
    );
    // An entry outside every prefix is reached too.
    add(&mut w, "acme", "prod", "172.16.0.9", "192.0.2.51");
    assert_eq!(route(&readers, prod, "172.16.0.9"), Some(ip("192.0.2.51")));
    // Its host is an accepted VXLAN sender in this VNet (and only in it).
    let r = readers.reader();
    {
        let g = r.enter().expect("alive");
        assert!(prod.accepts_host(&g, ip("192.0.2.51")));
        assert!(!vnets[1].accepts_host(&g, ip("192.0.2.51")));
        assert!(prod.lives_behind(&g, ip("10.0.0.7"), ip("192.0.2.50")));
        assert!(!prod.lives_behind(&g, ip("10.0.0.7"), ip("192.0.2.1")));
    }
    assert_eq!(
        del(&mut w, "acme", "prod", "10.0.0.7")
            .expect("deleted")
            .removed,
        1
    );
    assert_eq!(
        route(&readers, prod, "10.0.0.7"),
        Some(ip("192.0.2.1")),
        "prefix again"
    );
    assert!(matches!(
        del(&mut w, "acme", "prod", "10.0.0.7"),
        Err(DataplaneError::Route {
            field: Some("address"),
            ..
        })
    ));
    // A host of the other address family than the VNet's VTEP: refused, naming the field.
    let e = w.change(RouteChange::Add(VmRoute {
        tenant: tenant("acme"),
        vnet: "prod".into(),
        address: ip("10.0.0.9"),
        host: ip("2001:db8::9"),
    }));
    assert!(
        matches!(
            e,
            Err(DataplaneError::Route {
                field: Some("host"),
                ..
            })
        ),
        "{e:?}"
    );
}

#[test]
fn a_moved_vm_is_found_at_its_new_host() {
    let (mut w, readers, vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    let r = add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.60");
    assert_eq!((r.added, r.replaced), (0, 1));
    assert_eq!(
        route(&readers, &vnets[0], "10.0.0.7"),
        Some(ip("192.0.2.60"))
    );
    let g = readers.reader();
    let g = g.enter().expect("alive");
    assert!(
        !vnets[0].accepts_host(&g, ip("192.0.2.50")),
        "old host no longer referenced"
    );
    assert!(vnets[0].accepts_host(&g, ip("192.0.2.60")));
}

#[test]
fn identical_addresses_in_two_vnets_are_kept_apart() {
    let (mut w, readers, vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    add(&mut w, "globex", "main", "10.0.0.7", "192.0.2.70");
    assert_eq!(
        route(&readers, &vnets[0], "10.0.0.7"),
        Some(ip("192.0.2.50"))
    );
    assert_eq!(
        route(&readers, &vnets[1], "10.0.0.7"),
        Some(ip("192.0.2.70"))
    );
    del(&mut w, "globex", "main", "10.0.0.7").expect("deleted");
    assert_eq!(
        route(&readers, &vnets[0], "10.0.0.7"),
        Some(ip("192.0.2.50"))
    );
    assert_eq!(
        route(&readers, &vnets[1], "10.0.0.7"),
        Some(ip("192.0.2.1"))
    );
    let st = w.stats();
    assert_eq!((st.entries, st.vnets[0].v4, st.vnets[1].v4), (1, 1, 0));
}

#[test]
fn a_bad_file_changes_nothing_and_names_its_line() {
    let (mut w, readers, vnets) = setup();
    let text =
        "tenant,vnet,address,host\nacme,prod,10.0.0.7,192.0.2.50\nacme,prod,10.0.0.8,not-an-ip\n";
    match w.change(RouteChange::Load(text.into())) {
        Err(DataplaneError::Route {
            line: Some(3),
            field: Some("host"),
            ..
        }) => {}
        other => panic!("unexpected {other:?}"),
    }
    let family = "acme,prod,10.0.0.7,192.0.2.50\nacme,prod,10.0.0.8,2001:db8::50\n";
    let e = w
        .change(RouteChange::Load(family.into()))
        .expect_err("IPv6 host, IPv4 VTEP");
    assert!(
        e.to_string()
            .starts_with("line 2, field host: host 2001:db8::50 is not of the address family"),
        "{e}"
    );
    let unknown = "acme,prod,10.0.0.7,192.0.2.50\nacme,staging,10.0.0.8,192.0.2.50\n";
    let e = w
        .change(RouteChange::Load(unknown.into()))
        .expect_err("unknown VNet");
    assert!(e.to_string().starts_with("line 2, field vnet:"), "{e}");
    assert_eq!(w.stats().entries, 0);
    assert_eq!(
        route(&readers, &vnets[0], "10.0.0.7"),
        Some(ip("192.0.2.1"))
    );
    let good = "acme,prod,10.0.0.7,192.0.2.50\n{\"tenant\":\"globex\",\"vnet\":\"main\",\"address\":\"fd00::7\",\"host\":\"192.0.2.70\"}\n";
    let r = w.change(RouteChange::Load(good.into())).expect("loaded");
    assert_eq!(r.added, 2);
    assert_eq!(w.len_of(Family::V4) + w.len_of(Family::V6), 2);
    assert_eq!(
        route(&readers, &vnets[1], "fd00::7"),
        Some(ip("192.0.2.70"))
    );
}

#[test]
fn snapshot_restores_and_skips_vnets_gone() {
    let (mut w, _readers, _vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    add(&mut w, "globex", "main", "10.0.0.7", "192.0.2.70");
    let mut snap = Vec::new();
    assert_eq!(w.write_snapshot(&mut snap).expect("written"), 2);
    // A new node where only acme/prod is configured.
    let (mut w2, readers2) = RouteWriter::new();
    let c = cfg("acme", "prod", 100);
    let key = w2.vnet_id(&c.tenant, &c.name);
    let v = Vnet::new(0, &c, 0, key).expect("valid");
    w2.set_vnets(vec![entry(&v)]);
    let r = w2
        .change(RouteChange::Restore(snap.into()))
        .expect("restored");
    assert_eq!((r.added, r.skipped), (1, 1));
    assert_eq!(route(&readers2, &v, "10.0.0.7"), Some(ip("192.0.2.50")));
    assert!(w2
        .change(RouteChange::Restore(vec![1, 2, 3].into()))
        .is_err());
}

#[test]
fn removing_a_vnet_removes_its_entries() {
    let (mut w, _readers, vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    add(&mut w, "globex", "main", "10.0.0.7", "192.0.2.70");
    let keep = &vnets[1];
    w.set_vnets(vec![entry(keep)]);
    assert_eq!(w.stats().entries, 1);
    // The same names get the same number again.
    assert_eq!(w.vnet_id(&tenant("acme"), "prod"), vnets[0].key);
}

/// Readers on other threads look up all the time while the writer moves VMs between two
/// hosts: every lookup finds one of the two hosts (never none, never another), and a lookup
/// that starts after a change returned sees it.
#[test]
fn changes_while_readers_look_up_lose_and_misdeliver_nothing() {
    let (mut w, readers, vnets) = setup();
    let vnets = Arc::new(vnets);
    let (a, b) = (ip("192.0.2.50"), ip("192.0.2.60"));
    let vms: Vec<IpAddr> = (2..66).map(|i| IpAddr::from([10, 1, 0, i])).collect();
    for vm in &vms {
        add(&mut w, "acme", "prod", &vm.to_string(), "192.0.2.50");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let generation = Arc::new(AtomicU64::new(0));
    // Readers that finished a batch: the writer starts once both have (on a loaded machine
    // a reader may otherwise not run before the writer is done).
    let running = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (stop, generation, vnets, vms, running) = (
                Arc::clone(&stop),
                Arc::clone(&generation),
                Arc::clone(&vnets),
                vms.clone(),
                Arc::clone(&running),
            );
            let reader = readers.reader();
            std::thread::spawn(move || {
                let mut batches = 0u64;
                let mut keys = vec![Key::new(VnetId(0), IpAddr::from([0, 0, 0, 0])); vms.len()];
                let mut found = vec![None; vms.len()];
                while !stop.load(Ordering::Relaxed) {
                    // The writer's round when this batch began.
                    let seen = generation.load(Ordering::Acquire);
                    let g = reader.enter().expect("alive");
                    for (k, vm) in keys.iter_mut().zip(&vms) {
                        *k = Key::new(vnets[0].key, *vm);
                    }
                    g.exact_batch(&keys, &mut found);
                    // Even: round seen / 2 is done and the next has not begun.
                    let want = if (seen / 2) % 2 == 0 { a } else { b };
                    let hosts: Vec<_> = found.iter().map(|v| v.map(|v| v.host)).collect();
                    for h in &hosts {
                        assert!(*h == Some(a) || *h == Some(b), "lookup found {h:?}");
                    }
                    // One batch sees one copy: all VMs at the same host.
                    assert!(
                        hosts.iter().all(|h| *h == hosts[0]),
                        "a batch saw a half-done change"
                    );
                    let now = generation.load(Ordering::Acquire);
                    if now == seen && seen % 2 == 0 {
                        assert_eq!(
                            hosts[0],
                            Some(want),
                            "a change the writer finished is not seen"
                        );
                    }
                    drop(g);
                    batches += 1;
                    if batches == 1 {
                        running.fetch_add(1, Ordering::Release);
                    }
                }
                batches
            })
        })
        .collect();
    let text_a: String = vms
        .iter()
        .map(|vm| format!("acme,prod,{vm},192.0.2.50\n"))
        .collect();
    let text_b: String = vms
        .iter()
        .map(|vm| format!("acme,prod,{vm},192.0.2.60\n"))
        .collect();
    while running.load(Ordering::Acquire) < 2 {
        std::thread::yield_now();
    }
    for round in 1..=200u64 {
        let text = if round % 2 == 1 { &text_b } else { &text_a };
        generation.store(2 * round - 1, Ordering::Release);
        w.change(RouteChange::Load(text.as_str().into()))
            .expect("loaded");
        generation.store(2 * round, Ordering::Release);
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let batches = t.join().expect("reader ok");
        assert!(batches > 0);
    }
}

/// An entry the table has no room for is reported as an error (so the route store does not
/// journal it), and both copies are left as they were; a load past the room says how many
/// of its entries are missing.
#[test]
fn an_insert_that_fails_is_an_error_and_changes_nothing() {
    let (mut w, readers, vnets) = setup();
    let prod = &vnets[0];
    w.limit(Some(1));
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    let e = w
        .change(RouteChange::Add(VmRoute {
            tenant: tenant("acme"),
            vnet: "prod".into(),
            address: ip("10.0.0.8"),
            host: ip("192.0.2.51"),
        }))
        .expect_err("no room");
    assert!(e.to_string().contains("table full"), "{e}");
    // Both copies: the one readers see now, and the other after one more publication.
    for _ in 0..2 {
        assert_eq!(route(&readers, prod, "10.0.0.8"), Some(ip("192.0.2.1")));
        assert_eq!(w.len_of(Family::V4), 1);
        w.publish();
    }
    // Replacing an entry needs no room.
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.52");
    assert_eq!(route(&readers, prod, "10.0.0.7"), Some(ip("192.0.2.52")));
    let e = w
        .change(RouteChange::Load(Arc::from(
            "acme,prod,10.0.0.9,192.0.2.53\nacme,prod,10.0.0.10,192.0.2.53\n",
        )))
        .expect_err("no room");
    assert!(
        e.to_string().contains("2 entries of the file not added"),
        "{e}"
    );
}

/// The statistics `protego status` shows come from the last publication, not from the
/// writer, whose lock a bulk load holds for seconds.
#[test]
fn statistics_do_not_wait_for_the_writer() {
    let (mut w, readers, _vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    let w = std::sync::Arc::new(std::sync::Mutex::new(w));
    let (held, hold) = std::sync::mpsc::channel();
    let busy = {
        let w = std::sync::Arc::clone(&w);
        std::thread::spawn(move || {
            let _load = w.lock().expect("writer");
            held.send(()).expect("main waits");
            std::thread::sleep(std::time::Duration::from_millis(500));
        })
    };
    hold.recv().expect("writer held");
    let started = std::time::Instant::now();
    let st = readers.stats();
    assert!(started.elapsed() < std::time::Duration::from_millis(250));
    assert_eq!((st.entries, st.vnets[0].v4, st.vnets.len()), (1, 1, 2));
    busy.join().expect("busy writer");
}

/// A VNet whose VTEP changes address family loses its entries: their hosts are of the old
/// family, which the VTEP's socket can no longer send to. The VNet keeps its VNI, and takes
/// entries of the new family.
#[test]
fn a_vtep_of_another_family_drops_the_vnets_entries() {
    let (mut w, readers, vnets) = setup();
    add(&mut w, "acme", "prod", "10.0.0.7", "192.0.2.50");
    add(&mut w, "globex", "main", "10.0.0.7", "192.0.2.70");
    let mut prod = entry(&vnets[0]);
    prod.vtep_v6 = true;
    w.set_vnets(vec![prod, entry(&vnets[1])]);
    let st = w.stats();
    assert_eq!((st.entries, st.vnets[0].v4, st.vnets[1].v4), (1, 0, 1));
    assert_eq!(
        route(&readers, &vnets[0], "10.0.0.7"),
        Some(ip("192.0.2.1"))
    );
    add(&mut w, "acme", "prod", "10.0.0.7", "2001:db8::50");
    assert_eq!(w.stats().vnets[0].v4, 1);
}
