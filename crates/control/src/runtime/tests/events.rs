//! Tests of how the loop answers a failing store, the data plane's requests, commands, the key
//! log, DPD, NAT rebinding, and a data plane or store that goes away.

use super::*;

#[test]
fn responses_wait_for_a_failing_store_and_leave_once_it_works() {
    let (a, b) = pair("store-down-test", "", "", "");
    wait_up(&a, &b);
    let installs = a.path.installs().len();
    b.store.fail_commits(true);
    let (a_in, _) = a.path.live()[0];
    let spi = a_in;
    a.control().handle().rekey_child(TunnelId(1)).unwrap();
    // B takes the request, but its answer cannot leave before its new state is stored.
    wait_until(5, "the responder holds its answer", || {
        b.control()
            .handle()
            .store_stats()
            .is_ok_and(|s| s.held > 0 && s.failures > 0 && s.error.is_some())
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(a.path.installs().len(), installs, "no answer reached A");
    b.store.fail_commits(false);
    wait_until(5, "the rekey completes once the store works", || {
        a.path.installs().len() == installs + 1
    });
    wait_until(5, "the old CHILD_SA is gone", || {
        a.path.live().len() == 1 && a.path.live()[0].0 != spi
    });
    let stats = b.control().handle().store_stats().unwrap();
    assert_eq!((stats.held, stats.error.as_deref()), (0, None));
    assert!(stats.commits > 0 && stats.backend == "memory", "{stats:?}");
}

#[test]
fn data_plane_rekey_request_rekeys_the_child() {
    let (a, b) = pair("rekey-test", "", "", "");
    wait_up(&a, &b);
    let (old_in, _) = a.path.live()[0];
    a.to_control.send(ToControl::RekeyNeeded(old_in)).unwrap();
    wait_until(
        10,
        "the rekeyed CHILD_SA replaced the old one on both sides",
        || {
            let a_live = a.path.live();
            let b_live = b.path.live();
            a_live.len() == 1
                && b_live.len() == 1
                && a_live[0].0 != old_in
                && a_live[0].0 == b_live[0].1
        },
    );
    assert!(
        a.path
            .installs()
            .iter()
            .any(|c| matches!(c, Call::Install { replaces: Some(r), .. } if *r == old_in)),
        "{:?}",
        a.path.calls()
    );
    let rekeyed = log_lines_with("CHILD_SA rekeyed");
    assert!(
        rekeyed.iter().any(|l| l.contains("tunnel=rekey-test")),
        "{rekeyed:?}"
    );
}

#[test]
fn terminate_and_initiate_commands() {
    let (a, b) = pair("command-test", "", "", "");
    wait_up(&a, &b);
    let handle = a.control().handle();
    handle.terminate(TunnelId(1)).unwrap();
    wait_until(5, "both sides removed the CHILD_SA", || {
        a.path.live().is_empty() && b.path.live().is_empty()
    });
    wait_until(5, "no IKE SA left", || {
        handle.ike_status().is_ok_and(|s| s.is_empty())
    });
    handle.initiate(TunnelId(1)).unwrap();
    wait_up(&a, &b);
    assert!(matches!(
        handle.initiate(TunnelId(9)),
        Err(Error::Command {
            command: "initiate",
            ..
        })
    ));
}

#[test]
fn rekey_commands_rekey_the_child_and_the_ike_sa() {
    let (a, b) = pair("rekey-command-test", "", "", "");
    wait_up(&a, &b);
    let handle = a.control().handle();
    let ike_before = handle.ike_status().unwrap()[0].ike;
    let (old_in, _) = a.path.live()[0];
    handle.rekey_child(TunnelId(1)).unwrap();
    wait_until(10, "the CHILD_SA was replaced on both sides", || {
        let (a_live, b_live) = (a.path.live(), b.path.live());
        a_live.len() == 1
            && b_live.len() == 1
            && a_live[0].0 != old_in
            && a_live[0].0 == b_live[0].1
    });
    handle.rekey_ike(TunnelId(1)).unwrap();
    wait_until(10, "one IKE SA with new SPIs", || {
        handle
            .ike_status()
            .is_ok_and(|s| s.len() == 1 && s[0].ike != ike_before)
    });
    // Both sides counted one establishment, one CHILD_SA and both rekeys.
    for side in [&a, &b] {
        let events = side.control().handle().ike_report().unwrap().events;
        let e = &events[&TunnelId(1)];
        assert_eq!(
            (
                e.ike_established,
                e.child_installed,
                e.child_rekeys,
                e.ike_rekeys
            ),
            (1, 1, 1, 1),
            "{e:?}"
        );
    }
    assert!(matches!(
        handle.rekey_child(TunnelId(9)),
        Err(Error::Command {
            command: "rekey",
            ..
        })
    ));
}

#[test]
fn key_log_is_written_when_enabled() {
    let scratch = scratch_dir();
    let dir = &scratch.0;
    let gateway = format!("key_log = \"{}\"", dir.join("keys").display());
    let (a, b) = pair("keylog-test", &gateway, "", "");
    assert!(a.config.endpoint.key_log);
    wait_up(&a, &b);
    let (a_in, a_out) = a.path.live()[0];
    let esp = std::fs::read_to_string(dir.join("keys").join(crate::ESP_TABLE)).unwrap();
    assert!(
        esp.contains(&format!("\"0x{a_in}\"")) && esp.contains(&format!("\"0x{a_out}\"")),
        "{esp}"
    );
    assert!(esp.contains("AES-GCM with 16 octet ICV [RFC4106]"), "{esp}");
    wait_until(5, "the IKE key log line", || {
        std::fs::read_to_string(dir.join("keys").join(crate::IKE_TABLE))
            .is_ok_and(|s| s.lines().count() >= 1)
    });
}

#[test]
fn dpd_timeout_restarts_the_tunnel() {
    let (a, b) = pair(
        "dpd-test",
        "",
        "dpd_delay = \"1s\"\ndpd_action = \"restart\"",
        "",
    );
    wait_up(&a, &b);
    let (first_in, _) = a.path.live()[0];
    // The peer goes silent: its answers are lost.
    b.path.blackhole.store(true, Ordering::SeqCst);
    wait_until(20, "DPD declared the peer dead", || {
        a.path.live().is_empty()
    });
    let events = a.control().handle().ike_report().unwrap().events;
    assert_eq!(
        events[&TunnelId(1)].ike_deleted.get("dpd_timeout"),
        Some(&1),
        "{events:?}"
    );
    let dead = log_lines_with("DPD timeout");
    assert!(
        dead.iter()
            .any(|l| l.contains("tunnel=dpd-test") && l.contains("reason=dpd_timeout")),
        "{dead:?}"
    );
    // The peer comes back; the restarted initiation (or one of its retransmits) gets through.
    b.path.blackhole.store(false, Ordering::SeqCst);
    wait_until(20, "the tunnel was re-established", || {
        a.path.live().iter().any(|(i, _)| *i != first_in)
    });
}

#[test]
fn loop_stops_when_the_data_plane_goes_away() {
    let _ = logs();
    let dir = scratch_dir();
    let cfg = config(&dir.0, 'b', "orphan-test", false, "", "");
    let path: Arc<dyn DataPath> = Arc::new(FakePath::default());
    let (tx, rx) = crossbeam_channel::unbounded::<ToControl>();
    let control = ControlPlane::start(&cfg, path, rx, Box::new(MemoryStore::default())).unwrap();
    assert!(control.is_running());
    drop(tx);
    wait_until(5, "the loop noticed the closed channel", || {
        !control.is_running()
    });
    assert!(matches!(
        control.handle().ike_status(),
        Err(Error::ControlStopped)
    ));
}

#[test]
fn lone_responder_waits_quietly() {
    let dir = scratch_dir();
    let n = node(
        config(&dir.0, 'b', "lone-test", false, "", ""),
        Arc::clone(&dir),
    );
    std::thread::sleep(Duration::from_millis(100));
    assert!(n.control().is_running());
    assert_eq!(
        n.path.sent.load(Ordering::SeqCst),
        0,
        "a responder sends nothing on its own"
    );
    assert!(n.control().handle().ike_status().unwrap().is_empty());
}

#[test]
fn nat_rebinding_updates_the_data_path() {
    let (a, b) = pair("nat-test", "", "", "dpd_delay = \"1s\"");
    wait_up(&a, &b);
    // From now on b's NAT maps its port 4500 to 4501; a's answers to 4501 come back to 4500.
    b.path.snat.store(4501, Ordering::SeqCst);
    a.path.dnat.store(4501, Ordering::SeqCst);
    wait_until(10, "a learned b's new port", || {
        a.path.calls().iter().any(|c| matches!(c, Call::UpdatePeer { tunnel: TunnelId(1), remote, .. } if remote.port() == 4501))
    });
    let lines = log_lines_with("peer address changed");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("tunnel=nat-test") && l.contains(":4501")),
        "{lines:?}"
    );
}

#[test]
fn an_unreadable_store_fails_the_start() {
    let dir = scratch_dir();
    let cfg = config(&dir.0, 'b', "unreadable-test", false, "", "");
    let store = MemoryStore::default();
    store.fail_reads(true);
    let path: Arc<dyn DataPath> = Arc::new(FakePath::default());
    let (_tx, rx) = crossbeam_channel::unbounded::<ToControl>();
    match ControlPlane::start(&cfg, path, rx, Box::new(store)) {
        Err(Error::Store(e)) => assert!(e.to_string().contains("memory"), "{e}"),
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("started without its store"),
    }
}
