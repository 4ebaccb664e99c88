//! Tests of [`crate::election`] against a real etcd, with the harness of the store's etcd tests
//! (`control::testing`): one etcd per test, on loopback ports of its own, killed and removed
//! whatever the outcome; and against an etcd secured as docs/operations.md says.

use crate::election::{Election, ElectionError, ElectionOptions, Role, RoleChange, Term};
use control::store::{EtcdOptions, EtcdStore, Store};
use control::testing::{free_port, put, Etcd, Raw, Secured, PASSWORD, PREFIX};
use etcd_client::{Client, ConnectOptions, TlsOptions};
use std::time::{Duration, Instant};

/// etcd grants 1 s leases only with an election timeout of at most 700 ms (see the election's
/// docs); with its defaults it would grant 2 s.
const ETCD_FLAGS: &[&str] = &["--heartbeat-interval", "100", "--election-timeout", "500"];
const TTL: Duration = Duration::from_secs(1);
/// How long a leader counts on its lease after sending a keep-alive (TTL minus the margin).
const VALIDITY: Duration = Duration::from_millis(800);
/// The longest takeover after a crash: the TTL, plus etcd's 500 ms sweep of expired leases,
/// plus slack for the watch, the campaign and a busy machine.
const TAKEOVER_BOUND: Duration = Duration::from_millis(1650);

fn start_etcd() -> Option<Etcd> {
    Etcd::start_with(ETCD_FLAGS)
}

fn options(etcd: &Etcd, prefix: &str, name: &str) -> ElectionOptions {
    ElectionOptions::new(vec![etcd.url()], prefix, name)
}

fn start(etcd: &Etcd, prefix: &str, name: &str) -> Election {
    Election::start(&options(etcd, prefix, name)).unwrap()
}

/// Polls until `done`, at most `limit`; returns how long it took.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(2));
    }
    t.elapsed()
}

fn term(election: &Election) -> Term {
    match election.role() {
        Role::Leader { term, .. } => term,
        other => panic!("{} is not leader: {other:?}", election.name()),
    }
}

fn standby_of(leader: &Election) -> Role {
    Role::Standby {
        leader: Some(leader.name().to_owned()),
    }
}

fn drain(election: &Election) {
    while election.changes().try_recv().is_ok() {}
}

/// Waits on the change channel until `election` reports being leader; the time since `since`.
fn await_leader(election: &Election, since: Instant, limit: Duration) -> Duration {
    let deadline = since + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match election.changes().recv_timeout(left) {
            Ok(RoleChange {
                role: Role::Leader { .. },
                ..
            }) => return since.elapsed(),
            Ok(_) => {}
            Err(e) => panic!(
                "{} did not become leader within {limit:?} ({e}); its role: {:?}",
                election.name(),
                election.role()
            ),
        }
    }
}

#[test]
fn election_single_node() {
    let Some(etcd) = start_etcd() else { return };
    let prefix = "/protego/election-one";
    let a = start(&etcd, prefix, "a");
    assert!(a.is_leader(), "{:?}", a.role());
    assert_eq!(a.granted_ttl(), Some(TTL));
    let change = a.changes().try_recv().unwrap();
    assert_eq!(change.previous, Role::Unknown);
    assert!(change.role.is_leader(), "{change:?}");
    let fence = a.fence().unwrap();
    assert_eq!(fence.key, "/protego/election-one/leader");
    assert_eq!(fence.name, "a");
    assert!(fence.term.revision() > 0);

    // In etcd: the schema key (written first, as the store would) and the leader key.
    let raw = Raw::new(&etcd);
    assert_eq!(
        raw.dump(prefix),
        [
            ("/protego/election-one/leader".into(), b"a".to_vec()),
            ("/protego/election-one/schema".into(), b"1".to_vec()),
        ]
    );
    // So a store opened after the election works on the same prefix.
    let mut store = EtcdStore::connect(&EtcdOptions {
        endpoints: vec![etcd.url()],
        prefix: prefix.into(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        access: Default::default(),
    })
    .unwrap();
    store.commit(&[put(1, b"one")]).unwrap();

    // Keep-alives keep it leader, in the same term, without a change.
    std::thread::sleep(3 * TTL);
    assert_eq!(term(&a), fence.term);
    assert!(a.changes().try_recv().is_err());

    // The key deleted by hand: the node sees it on its watch and wins a new term.
    raw.delete("/protego/election-one/leader");
    let took = wait_until(
        "a new term",
        TTL,
        || matches!(a.role(), Role::Leader { term, .. } if term > fence.term),
    );
    println!("leader key deleted by hand: leader again, in a new term, after {took:?}");

    // Resigning deletes the key (and leaves the store's keys alone).
    a.resign().unwrap();
    assert_eq!(
        raw.dump(prefix),
        [
            (
                "/protego/election-one/ike_sas/0000000000000001".into(),
                b"one".to_vec()
            ),
            ("/protego/election-one/schema".into(), b"1".to_vec()),
        ]
    );
}

#[test]
fn election_resign_and_crash_takeovers() {
    let Some(etcd) = start_etcd() else { return };
    let prefix = "/protego/election-two";
    let a = start(&etcd, prefix, "a");
    let b = start(&etcd, prefix, "b");
    // Exactly one leader, and the other names it.
    assert!(a.is_leader(), "{:?}", a.role());
    assert_eq!(b.role(), standby_of(&a));
    let mut terms = vec![term(&a)];

    // A graceful stop hands over at once.
    drain(&b);
    let t = Instant::now();
    a.resign().unwrap();
    let took = await_leader(&b, t, TTL);
    println!("resign: the standby took over after {took:?}");
    assert!(took < Duration::from_millis(250), "{took:?}");
    terms.push(term(&b));

    // A crash (kill -9): dropping an election stops its thread without revoking its lease,
    // so the standby waits for the lease to expire. At a few points of the keep-alive cycle.
    let mut leader = b;
    let mut takeovers = Vec::new();
    for (i, offset) in [0u64, 110, 220, 60].into_iter().enumerate() {
        let standby = start(&etcd, prefix, &format!("n{i}"));
        assert_eq!(standby.role(), standby_of(&leader));
        std::thread::sleep(Duration::from_millis(300 + offset));
        drain(&standby);
        let t = Instant::now();
        drop(leader);
        let took = await_leader(&standby, t, 3 * TTL);
        println!("kill -9 of the leader: the standby took over after {took:?}");
        takeovers.push(took);
        terms.push(term(&standby));
        leader = standby;
    }
    let mean = takeovers.iter().sum::<Duration>() / takeovers.len() as u32;
    println!(
        "takeover after a crash, TTL {TTL:?}: min {:?}, mean {mean:?}, max {:?}",
        takeovers.iter().min().unwrap(),
        takeovers.iter().max().unwrap()
    );
    // The lease expires up to a TTL after the crash, and etcd 3.4 sweeps expired leases every
    // 500 ms: 1.5 s at worst, plus the watch and the campaign.
    assert!(mean < Duration::from_millis(1500), "{takeovers:?}");
    for took in &takeovers {
        assert!(*took < TAKEOVER_BOUND, "{takeovers:?}");
    }
    // Every new leader has a higher term.
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

#[test]
fn election_frozen_leader_steps_down_first() {
    let Some(etcd) = start_etcd() else { return };
    let prefix = "/protego/election-frozen";
    let a = start(&etcd, prefix, "a");
    let b = start(&etcd, prefix, "b");
    assert!(a.is_leader(), "{:?}", a.role());
    assert_eq!(b.role(), standby_of(&a));

    // The leader's fence guards a write while its term lasts.
    let raw = Raw::new(&etcd);
    let fenced = |fence: &crate::election::Fence, value: &str| {
        let txn =
            etcd_client::Txn::new()
                .when(fence.compares())
                .and_then([etcd_client::TxnOp::put(
                    "/protego/election-frozen/fenced",
                    value,
                    None,
                )]);
        let mut client = raw.client.clone();
        raw.runtime.block_on(client.txn(txn)).unwrap().succeeded()
    };
    let fence_a = a.fence().unwrap();
    assert!(fenced(&fence_a, "a"));

    // The leader freezes (its keep-alives stop, as for a hung process or a partition), but
    // still answers: it must stop calling itself leader before the standby takes over.
    std::thread::sleep(Duration::from_millis(150));
    drain(&a);
    let t = Instant::now();
    a.freeze();
    let (mut a_down, mut b_up) = (None, None);
    while b_up.is_none() {
        let (role_a, role_b) = (a.role(), b.role());
        assert!(
            !(role_a.is_leader() && role_b.is_leader()),
            "two leaders: {role_a:?}, {role_b:?}"
        );
        if a_down.is_none() && !role_a.is_leader() {
            a_down = Some(t.elapsed());
        }
        if role_b.is_leader() {
            b_up = Some(t.elapsed());
        }
        assert!(t.elapsed() < 3 * TTL, "no takeover: {role_a:?}, {role_b:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
    let (a_down, b_up) = (a_down.unwrap(), b_up.unwrap());
    println!(
        "frozen leader: it stepped down after {a_down:?}, the standby took over after {b_up:?} \
         ({:?} later)",
        b_up - a_down
    );
    assert!(a_down < b_up);
    assert!(a_down <= VALIDITY + Duration::from_millis(50), "{a_down:?}");
    assert_eq!(a.role(), Role::Unknown);
    // The frozen node's thread reported it too.
    let change = a.changes().try_recv().unwrap();
    assert!(change.previous.is_leader() && change.role == Role::Unknown);
    assert!(b_up < TAKEOVER_BOUND, "{b_up:?}");

    // The deposed leader's fenced writes fail; the new leader's pass.
    let fence_b = b.fence().unwrap();
    assert!(fence_b.term > fence_a.term);
    assert!(!fenced(&fence_a, "a again"));
    assert!(fenced(&fence_b, "b"));
    assert_eq!(
        raw.dump("/protego/election-frozen/fenced"),
        [("/protego/election-frozen/fenced".into(), b"b".to_vec())]
    );
}

/// After `event` (etcd thawed or restarted): waits until one of `a` and `b` leads and the
/// other stands by for it, and prints how long it took and the term (`before`: the term then).
fn leader_again<'e>(
    a: &'e Election,
    b: &'e Election,
    event: &str,
    before: Term,
) -> (&'e Election, &'e Election) {
    let took = wait_until(&format!("a leader after {event}"), 5 * TTL, || {
        a.is_leader() || b.is_leader()
    });
    let (leader, standby) = if a.is_leader() { (a, b) } else { (b, a) };
    println!(
        "{event}: {} leads after {took:?}, term {} (was {before})",
        leader.name(),
        term(leader)
    );
    wait_until("the other standing by", TTL, || {
        standby.role() == standby_of(leader)
    });
    (leader, standby)
}

#[test]
fn election_etcd_outage() {
    let Some(mut etcd) = start_etcd() else { return };
    let prefix = "/protego/election-outage";
    let a = start(&etcd, prefix, "a");
    let b = start(&etcd, prefix, "b");
    assert!(a.is_leader(), "{:?}", a.role());
    let before = term(&a);

    // etcd freezes: both nodes turn unknown within the TTL, the leader first of all.
    etcd.signal(libc::SIGSTOP);
    let t = Instant::now();
    let took = wait_until("both unknown", TTL, || {
        a.role() == Role::Unknown && b.role() == Role::Unknown
    });
    println!("etcd frozen: both nodes unknown after {took:?}");
    assert!(took <= VALIDITY + Duration::from_millis(50), "{took:?}");
    // No node leads while etcd is frozen (longer than the TTL: the leases expire).
    while t.elapsed() < 2 * TTL {
        assert!(!a.is_leader() && !b.is_leader());
        std::thread::sleep(Duration::from_millis(10));
    }
    etcd.signal(libc::SIGCONT);
    let (leader, _) = leader_again(&a, &b, "etcd thawed", before);
    assert!(term(leader) > before);
    let before = term(leader);

    // etcd crashes: both unknown; it restarts with its data: a leader again. Its lease
    // outlived the restart (etcd extends leases when it starts), so it may resume its term.
    etcd.stop();
    wait_until("both unknown", TTL, || {
        a.role() == Role::Unknown && b.role() == Role::Unknown
    });
    assert!(!a.is_leader() && !b.is_leader());
    etcd.launch();
    let (leader, standby) = leader_again(&a, &b, "etcd restarted", before);
    assert!(term(leader) >= before);
    assert!(!standby.is_leader());
}

#[test]
fn election_bad_options() {
    let closed = format!(
        "http://127.0.0.1:{}",
        free_port().local_addr().unwrap().port()
    );
    // An unreachable etcd is tried again until the connect timeout: a short one here.
    let base = ElectionOptions {
        connect_timeout: Duration::from_millis(500),
        ..ElectionOptions::new(vec![closed.clone()], "/protego/bad", "a")
    };
    let refused = |options: ElectionOptions, want: &str| {
        let err = Election::start(&options).unwrap_err();
        assert!(matches!(err, ElectionError::Options { .. }), "{err:?}");
        assert!(err.to_string().contains(want), "{err}");
    };
    refused(
        ElectionOptions {
            name: String::new(),
            ..base.clone()
        },
        "node name",
    );
    refused(
        ElectionOptions {
            name: "a\nb".into(),
            ..base.clone()
        },
        "control characters",
    );
    refused(
        ElectionOptions {
            name: "x".repeat(300),
            ..base.clone()
        },
        "node name",
    );
    for ttl in [500, 1500, 7_200_000] {
        refused(
            ElectionOptions {
                ttl: Duration::from_millis(ttl),
                ..base.clone()
            },
            "whole seconds",
        );
    }
    refused(
        ElectionOptions {
            timeout: Duration::ZERO,
            ..base.clone()
        },
        "timeout",
    );
    refused(
        ElectionOptions {
            connect_timeout: Duration::ZERO,
            ..base.clone()
        },
        "the connect_timeout must not be zero",
    );

    // The endpoints and prefix are checked as the store checks them, and etcd must answer.
    let store_error = |options: ElectionOptions, want: &str| {
        let t = Instant::now();
        let err = Election::start(&options).unwrap_err();
        assert!(
            t.elapsed() < 2 * options.connect_timeout,
            "{:?}",
            t.elapsed()
        );
        assert!(matches!(err, ElectionError::Store { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains(want) && text.contains("node \"a\""), "{text}");
        text
    };
    store_error(
        ElectionOptions {
            endpoints: vec![],
            ..base.clone()
        },
        "no endpoints",
    );
    store_error(
        ElectionOptions {
            prefix: "/".into(),
            ..base.clone()
        },
        "prefix",
    );
    let text = store_error(base, &closed);
    println!("election with etcd unreachable: {text}");
}

/// A standby finds the leader's published address, and revoking the leader's lease
/// ([`crate::peers::Peers::revoke_leader`]) hands over at once instead of after the lease's
/// expiry; a revoke aimed at a node that is no longer the leader does nothing.
#[test]
fn election_revoked_leader_is_replaced_at_once() {
    let Some(etcd) = start_etcd() else { return };
    let prefix = "/protego/revoke";
    // The election first: it claims the prefix (schema key) that the addresses live under.
    let a = start(&etcd, prefix, "a");
    let peers = crate::peers::Peers::connect(&EtcdOptions {
        endpoints: vec![etcd.url()],
        prefix: prefix.into(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        access: Default::default(),
    })
    .unwrap();
    let addr: std::net::SocketAddr = "10.0.0.1:7300".parse().unwrap();
    peers.publish("a", addr).unwrap();
    assert_eq!(peers.address("a").unwrap(), Some(addr));
    assert_eq!(peers.address("nobody").unwrap(), None);
    wait_until("a leads", Duration::from_secs(5), || a.is_leader());
    let b = start(&etcd, prefix, "b");
    wait_until("b stands by", Duration::from_secs(5), || {
        b.role() == standby_of(&a)
    });
    assert!(!peers.revoke_leader("b").unwrap(), "b is not the leader");
    assert!(a.is_leader());
    let t = Instant::now();
    assert!(peers.revoke_leader("a").unwrap());
    let took = wait_until("b takes over", TTL, || b.is_leader());
    eprintln!("takeover after revoking the leader's lease: {took:?}");
    wait_until("a learns it was deposed", Duration::from_secs(2), || {
        !a.is_leader()
    });
    assert!(t.elapsed() < TAKEOVER_BOUND);
}

/// A store fenced by a leader's term writes while the node leads and refuses, writing
/// nothing, once another node took over.
#[test]
fn election_fenced_store_refuses_a_deposed_leader() {
    let Some(etcd) = start_etcd() else { return };
    let prefix = "/protego/fence";
    let a = start(&etcd, prefix, "a");
    wait_until("a leads", Duration::from_secs(5), || a.is_leader());
    let options = EtcdOptions {
        endpoints: vec![etcd.url()],
        prefix: prefix.into(),
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        access: Default::default(),
    };
    let mut fenced = EtcdStore::connect(&options)
        .unwrap()
        .fenced(a.fence().unwrap());
    fenced.commit(&[put(1, b"while leading")]).unwrap();
    let b = start(&etcd, prefix, "b");
    wait_until("b stands by", Duration::from_secs(5), || {
        b.role() == standby_of(&a)
    });
    a.resign().unwrap();
    wait_until("b takes over", Duration::from_secs(5), || b.is_leader());
    let err = fenced.commit(&[put(2, b"after")]).unwrap_err();
    assert!(err.to_string().contains("no longer the leader"), "{err}");
    let plain = EtcdStore::connect(&options).unwrap();
    let spis: Vec<u64> = plain
        .ike_sas()
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(spis, [1], "the deposed leader's commit wrote nothing");
}

/// How long the secured etcd's test waits for a role.
const SECURED_WAIT: Duration = Duration::from_secs(5);

/// etcd forgets an idle auth token after `--auth-token-ttl` (here 1 s): the store, the
/// election and its fencing carry on, authenticating again.
#[test]
fn secured_etcd_expired_tokens_are_renewed_for_store_and_election() {
    let flags = [
        "--auth-token-ttl",
        "1",
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "500",
    ];
    let Some(s) = Secured::start(&flags) else {
        return;
    };
    let right = s.access(Some("node"), Some(("protego", PASSWORD)));
    let start = |name: &str| {
        let mut options = ElectionOptions::new(vec![s.etcd.url()], PREFIX, name);
        options.access = right.clone();
        Election::start(&options).unwrap()
    };
    let a = start("a");
    wait_until("a leads", SECURED_WAIT, || a.is_leader());
    let b = start("b");
    wait_until("b stands by", SECURED_WAIT, || {
        b.role()
            == Role::Standby {
                leader: Some("a".into()),
            }
    });
    let mut fenced = EtcdStore::connect(&s.options(PREFIX, right.clone()))
        .unwrap()
        .fenced(a.fence().unwrap());
    fenced.commit(&[put(1, b"before")]).unwrap();
    // A client that does not authenticate again shows the tokens do expire.
    let tls = right.tls.as_ref().unwrap();
    let once = ConnectOptions::new()
        .with_user("protego", PASSWORD)
        .with_tls(
            TlsOptions::new()
                .ca_certificate(etcd_client::Certificate::from_pem(tls.ca_pem()))
                .identity(etcd_client::Identity::from_pem(
                    tls.cert_pem().unwrap(),
                    tls.key_pem().unwrap().as_bytes(),
                )),
        );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut stale = runtime
        .block_on(Client::connect([s.etcd.url()], Some(once)))
        .unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let e = runtime
        .block_on(stale.get(format!("{PREFIX}/schema"), None))
        .unwrap_err();
    assert!(e.to_string().contains("invalid auth token"), "{e}");

    // The store's and the standby's tokens are as old.
    fenced.commit(&[put(2, b"after expiry")]).unwrap();
    assert!(a.is_leader());
    a.resign().unwrap();
    wait_until("b takes over", SECURED_WAIT, || b.is_leader());
    let err = fenced.commit(&[put(3, b"deposed")]).unwrap_err();
    assert!(err.to_string().contains("no longer the leader"), "{err}");
    let spis: Vec<u64> = fenced
        .ike_sas()
        .unwrap()
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(spis, [1, 2]);
    drop(b);
}
