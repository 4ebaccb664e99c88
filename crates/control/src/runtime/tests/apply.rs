//! Tests of `protego ctl apply` through the loop: tunnels added, updated, replaced, moved and
//! removed; a refused apply changes nothing; a restart runs what was applied.

use super::*;

/// The tenant and tunnel tables of one side, as `protego ctl apply` would get them: each
/// tunnel is (name, local_ts, remote_ts, start, extra lines). The tunnel of [`config`]'s
/// selectors (10.1.0.0/24 - 10.2.0.0/24) keeps its identities; the others get their own, so
/// that the peer can tell incoming IKE SAs apart.
fn inventory(side: char, tunnels: &[(&str, &str, &str, bool, &str)]) -> String {
    let peer = if side == 'a' {
        "192.0.2.2"
    } else {
        "192.0.2.1"
    };
    let other = if side == 'a' { 'b' } else { 'a' };
    let mut text = "[[tenant]]\nname = \"t\"\n".to_owned();
    for (name, local_ts, remote_ts, start, extra) in tunnels {
        let tag = if local_ts.ends_with(".0.0/24") {
            String::new()
        } else {
            format!(".{name}")
        };
        text.push_str(&format!(
            r#"
[[tunnel]]
name = "{name}"
tenant = "t"
inside = "tun"
remote_addrs = "{peer}"
local_id = "{side}{tag}.example"
remote_id = "{other}{tag}.example"
psk_file = "psk"
proposals = "aes256gcm16-prfsha256-x25519"
esp_proposals = "aes256gcm16"
local_ts = "{local_ts}"
remote_ts = "{remote_ts}"
start_action = "{start}"
{extra}
"#,
            start = if *start { "start" } else { "none" },
        ));
    }
    text
}

/// Applies `text` on `node` as `protego ctl apply -f DIR/apply-<side>.toml` would.
fn apply(node: &Node, side: char, text: &str, dry_run: bool) -> Result<ApplyOutcome, Error> {
    let path = node._dir.0.join(format!("apply-{side}.toml"));
    std::fs::write(&path, text).unwrap();
    node.control().handle().apply(ApplyRequest {
        text: text.to_owned(),
        source: path,
        dry_run,
    })
}

/// The IKE SAs of `node`'s tunnel `id`.
fn ike_spis_of(node: &Node, id: TunnelId) -> Vec<IkeSpis> {
    node.control()
        .handle()
        .ike_status()
        .unwrap()
        .iter()
        .filter(|s| s.tunnel == Some(id) && s.state == ike::IkeSaState::Established)
        .map(|s| s.ike)
        .collect()
}

#[test]
fn apply_adds_updates_replaces_and_removes_tunnels() {
    let (a, b) = pair("apply-one", "", "", "");
    wait_up(&a, &b);
    let one = ike_spis_of(&a, TunnelId(1));
    let second = ("apply-two", "10.1.1.0/24", "10.2.1.0/24");

    // A dry run says what would change and changes nothing.
    let a_two = inventory(
        'a',
        &[
            ("apply-one", "10.1.0.0/24", "10.2.0.0/24", true, ""),
            (second.0, second.1, second.2, true, ""),
        ],
    );
    let dry = apply(&a, 'a', &a_two, true).unwrap();
    assert_eq!(dry.plan.tunnels_added, vec!["apply-two".to_owned()]);
    assert_eq!(dry.plan.tunnels_unchanged, 1);
    assert_eq!(dry.generation, 0);
    assert!(a.store.applied_config().unwrap().is_none());
    assert!(!a
        .path
        .calls()
        .iter()
        .any(|c| matches!(c, Call::SetInside(_))));

    // A new tunnel on both sides: the responder first, then the initiator starts it.
    let b_two = inventory(
        'b',
        &[
            ("apply-one", "10.2.0.0/24", "10.1.0.0/24", false, ""),
            (second.0, second.2, second.1, false, ""),
        ],
    );
    let out = apply(&b, 'b', &b_two, false).unwrap();
    assert_eq!(out.generation, 1);
    assert_eq!(
        out.config.tunnel_named("apply-two").unwrap().peer.id,
        TunnelId(2)
    );
    let out = apply(&a, 'a', &a_two, false).unwrap();
    assert_eq!(out.plan.tunnels_added, vec!["apply-two".to_owned()]);
    assert!(a
        .path
        .calls()
        .contains(&Call::SetInside(vec![TunnelId(1), TunnelId(2)])));
    wait_until(10, "the new tunnel is up on both sides", || {
        ike_spis_of(&a, TunnelId(2)).len() == 1 && ike_spis_of(&b, TunnelId(2)).len() == 1
    });
    assert_eq!(
        ike_spis_of(&a, TunnelId(1)),
        one,
        "the first tunnel was left alone"
    );
    let stored =
        crate::applied::AppliedConfig::decode(&a.store.applied_config().unwrap().unwrap()).unwrap();
    assert_eq!((stored.generation, stored.next_id), (1, 3));
    assert_eq!(stored.ids["apply-two"], TunnelId(2));
    assert_eq!(
        stored.psks.get("apply-two").unwrap().as_slice(),
        b"runtime test secret"
    );

    // Settings that apply in place: the SAs stay.
    let a_dpd = inventory(
        'a',
        &[
            (
                "apply-one",
                "10.1.0.0/24",
                "10.2.0.0/24",
                true,
                "dpd_delay = \"7s\"",
            ),
            (second.0, second.1, second.2, true, ""),
        ],
    );
    let out = apply(&a, 'a', &a_dpd, false).unwrap();
    assert_eq!(out.plan.tunnels_updated, vec!["apply-one".to_owned()]);
    assert!(out.plan.tunnels_replaced.is_empty());
    assert_eq!(ike_spis_of(&a, TunnelId(1)), one);

    // A negotiated setting: the SAs are deleted and negotiated again, under the same id.
    let a_esp = a_dpd.replacen(
        "esp_proposals = \"aes256gcm16\"",
        "esp_proposals = \"aes128gcm16,aes256gcm16\"",
        1,
    );
    let out = apply(&a, 'a', &a_esp, false).unwrap();
    assert_eq!(out.plan.tunnels_replaced, vec!["apply-one".to_owned()]);
    wait_until(
        10,
        "the changed tunnel is up again with a new IKE SA",
        || {
            let now = ike_spis_of(&a, TunnelId(1));
            now.len() == 1 && now != one && ike_spis_of(&b, TunnelId(1)) == now
        },
    );

    // Removed: DELETE to the peer, the SAs leave both data paths, the name is unknown.
    let a_one = a_esp[..a_esp.rfind("\n[[tunnel]]").unwrap()].to_owned();
    let out = apply(&a, 'a', &a_one, false).unwrap();
    assert_eq!(out.plan.tunnels_removed, vec!["apply-two".to_owned()]);
    assert_eq!(out.generation, 4);
    wait_until(
        10,
        "the removed tunnel's SAs are gone on both sides",
        || ike_spis_of(&a, TunnelId(2)).is_empty() && ike_spis_of(&b, TunnelId(2)).is_empty(),
    );
    assert_eq!(
        a.control()
            .handle()
            .initiate(TunnelId(2))
            .unwrap_err()
            .to_string(),
        Error::Command {
            command: "initiate",
            tunnel: TunnelId(2),
            source: ike::Error::UnknownTunnel(TunnelId(2)),
        }
        .to_string()
    );
    // Added again later: a fresh id, never the removed one's.
    let out = apply(&a, 'a', &a_two, true).unwrap();
    assert_eq!(
        out.config.tunnel_named("apply-two").unwrap().peer.id,
        TunnelId(3)
    );
}

#[test]
fn a_refused_apply_changes_nothing() {
    let (a, b) = pair("apply-refused", "", "", "");
    wait_up(&a, &b);
    let one = ike_spis_of(&a, TunnelId(1));
    let good = inventory(
        'a',
        &[
            ("apply-refused", "10.1.0.0/24", "10.2.0.0/24", true, ""),
            ("apply-new", "10.1.1.0/24", "10.2.1.0/24", false, ""),
        ],
    );

    // Invalid: the error points into the applied file.
    let bad = good.replace(
        "esp_proposals = \"aes256gcm16\"\nlocal_ts = \"10.1.1.0/24\"",
        "esp_proposals = \"nonsense\"\nlocal_ts = \"10.1.1.0/24\"",
    );
    assert_ne!(bad, good);
    let e = apply(&a, 'a', &bad, false).unwrap_err().to_string();
    assert!(
        e.contains("apply-a.toml") && e.contains("esp_proposals"),
        "{e}"
    );

    // Node-wide tables in the applied file are ignored, and a tunnel must still fit this
    // node's [gateway].
    let foreign = format!(
        "[gateway]\nlisten = [\"203.0.113.9\"]\n\n{}",
        good.replace(
            "local_id = \"a.apply-new.example\"",
            "local_addrs = \"203.0.113.9\"\nlocal_id = \"a.apply-new.example\"",
        )
    );
    assert!(foreign.contains("local_addrs = \"203.0.113.9\""));
    let e = apply(&a, 'a', &foreign, false).unwrap_err().to_string();
    assert!(
        e.contains("not one of the [gateway] listen addresses"),
        "{e}"
    );

    // A first TUN-less node cannot grow a TUN device, but this one has one: fine. The data
    // path refusing the VNets stops the apply before the store or the engine.
    a.path.refuse_inside.store(true, Ordering::SeqCst);
    let e = apply(&a, 'a', &good, false).unwrap_err().to_string();
    assert!(e.contains("refused by the test"), "{e}");
    a.path.refuse_inside.store(false, Ordering::SeqCst);

    // The store failing stops it too.
    a.store.fail_commits(true);
    let e = apply(&a, 'a', &good, false).unwrap_err().to_string();
    assert!(e.contains("cannot write it to the store"), "{e}");
    a.store.fail_commits(false);

    assert!(a.store.applied_config().unwrap().is_none());
    assert!(!a
        .path
        .calls()
        .iter()
        .any(|c| matches!(c, Call::SetInside(_))));
    assert_eq!(ike_spis_of(&a, TunnelId(1)), one);
    assert!(
        a.control().handle().initiate(TunnelId(2)).is_err(),
        "no tunnel 2"
    );
    // And then it applies.
    assert_eq!(apply(&a, 'a', &good, false).unwrap().generation, 1);
}

#[test]
fn a_restarted_node_runs_the_applied_tunnels_and_restores_their_sas() {
    let (a, mut b) = pair("applied-restart", "", "", "");
    wait_up(&a, &b);
    let second = ("applied-second", "10.1.1.0/24", "10.2.1.0/24");
    let b_two = inventory(
        'b',
        &[
            // Listed first: ids follow names, not places in the file.
            (second.0, second.2, second.1, false, ""),
            ("applied-restart", "10.2.0.0/24", "10.1.0.0/24", false, ""),
        ],
    );
    apply(&b, 'b', &b_two, false).unwrap();
    let a_two = inventory(
        'a',
        &[
            ("applied-restart", "10.1.0.0/24", "10.2.0.0/24", true, ""),
            (second.0, second.1, second.2, true, ""),
        ],
    );
    apply(&a, 'a', &a_two, false).unwrap();
    wait_until(10, "the applied tunnel is up", || {
        ike_spis_of(&b, TunnelId(2)).len() == 1
    });
    let before = (ike_spis_of(&b, TunnelId(1)), ike_spis_of(&b, TunnelId(2)));

    // B crashes and starts again from its (unchanged) file: the store's configuration wins.
    let file = b.config.clone();
    let (effective, record) =
        crate::applied::effective(file.clone(), &mut b.store.clone(), false).unwrap();
    assert_eq!(record.unwrap().generation, 1);
    assert_eq!(
        effective.tunnel_named(second.0).unwrap().peer.id,
        TunnelId(2)
    );
    assert_eq!(
        effective.tunnel_named("applied-restart").unwrap().peer.id,
        TunnelId(1)
    );
    crash_and_restart(&a, &mut b, effective);
    assert_eq!(
        (ike_spis_of(&b, TunnelId(1)), ike_spis_of(&b, TunnelId(2))),
        before,
        "both IKE SAs restored, none negotiated again"
    );

    // --discard-applied: the file's tunnels, and the record is gone.
    let (plain, record) = crate::applied::effective(file, &mut b.store.clone(), true).unwrap();
    assert!(record.is_none() && b.store.applied_config().unwrap().is_none());
    assert!(plain.tunnel_named(second.0).is_none());
}

#[test]
fn a_tunnel_moved_to_another_tenant_starts_anew_under_a_fresh_id() {
    let (a, b) = pair("apply-move", "", "", "");
    wait_up(&a, &b);
    let old = ike_spis_of(&a, TunnelId(1));
    let own = a.control().handle().ike_status().unwrap()[0].local_spi().0;
    assert!(a.store.ike_sa(own).is_some());
    let moved = inventory(
        'a',
        &[("apply-move", "10.1.0.0/24", "10.2.0.0/24", true, "")],
    )
    .replacen("tenant = \"t\"\ninside", "tenant = \"u\"\ninside", 1)
        + "\n[[tenant]]\nname = \"u\"\n";
    let out = apply(&a, 'a', &moved, false).unwrap();
    assert_eq!(out.plan.tunnels_replaced, vec!["apply-move".to_owned()]);
    assert_eq!(out.plan.tenants_added, vec!["u".to_owned()]);
    let id = out.config.tunnel_named("apply-move").unwrap().peer.id;
    assert_eq!(
        id,
        TunnelId(2),
        "a fresh id: the old SAs never serve the new tenant"
    );
    // The old IKE SA left the store with the configuration, before its DELETE was answered.
    assert!(a.store.ike_sa(own).is_none());
    assert!(a.path.calls().contains(&Call::SetInside(vec![TunnelId(2)])));
    wait_until(10, "the moved tunnel is up under its new id", || {
        let now = ike_spis_of(&a, id);
        now.len() == 1 && now != old
    });
    wait_until(10, "the old IKE SA is gone", || {
        ike_spis_of(&a, TunnelId(1)).is_empty()
    });
    assert!(a.control().handle().initiate(TunnelId(1)).is_err());
}
