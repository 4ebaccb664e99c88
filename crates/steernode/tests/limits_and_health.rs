//! Socket tests of per-tunnel rate limits and of data-node failure detection on loopback.
//!
//! Rate limits are checked against the token bucket's own bound (burst plus rate times the
//! time that passed), never against timing: whatever the machine's speed, a tunnel can never
//! have been admitted more than that, and an unlimited one loses nothing.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use protego_steernode::{DropReason, ForwardKind, SteerEvent};
use steer::{HealthConfig, NodeId, RateLimit, SpiEntry, TunnelId};
use wire::EspSpi;

#[test]
fn a_limited_tunnel_loses_its_excess_while_another_is_unaffected() {
    let steer = start(patient_health(), None);
    let local = steer.local_addrs().clone();
    let node = socket("127.0.1.1");
    let peer = socket("127.0.0.50");
    steer
        .set_data_nodes(vec![(NodeId(1), node.local_addr().unwrap())])
        .unwrap();
    let (limited, free) = (TunnelId(10), TunnelId(11));
    for (spi, tunnel) in [(0x2000, limited), (0x3000, free)] {
        steer
            .set_spi(
                EspSpi(spi),
                SpiEntry {
                    node: NodeId(1),
                    tunnel,
                },
            )
            .unwrap();
    }
    const RATE: u64 = 1_000_000; // bit/s
    const BURST: u64 = 4_000; // bytes
    const SIZE: usize = 1_000;
    const COUNT: u64 = 300;
    steer.set_rate_limit(limited, Some(RateLimit::new(RATE, BURST).into()));
    steer.set_rate_limit(free, Some(RateLimit::mbit(10_000, 1 << 20).into()));

    let start = Instant::now();
    for seq in 0..COUNT as u32 {
        peer.send_to(&esp(0x2000, seq, SIZE), local.natt[0])
            .unwrap();
        peer.send_to(&esp(0x3000, seq, SIZE), local.natt[0])
            .unwrap();
        if seq % 50 == 49 {
            // Let the steer node drain its socket.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let s = wait_stats(&steer, "every datagram counted", |s| {
        let seen = |t: TunnelId| {
            s.tunnels.get(&t).map_or(0, |c| {
                c.inbound.admitted_packets + c.inbound.dropped_packets
            })
        };
        seen(limited) == COUNT && seen(free) == COUNT
    });
    let elapsed = start.elapsed();
    let l = s.tunnels[&limited];
    let f = s.tunnels[&free];
    assert_eq!(l.limit, Some(RateLimit::new(RATE, BURST).into()));
    // The bucket starts full: the burst always passes.
    let burst_packets = BURST / SIZE as u64;
    assert!(l.inbound.admitted_packets >= burst_packets, "{l:?}");
    // It can never have admitted more than the burst plus what accrued meanwhile.
    let accrued = (RATE as f64 / 8.0 * elapsed.as_secs_f64()) as u64;
    let bound = (BURST + accrued) / SIZE as u64 + 1;
    assert!(
        l.inbound.admitted_packets <= bound,
        "{l:?} admitted, bound {bound} after {elapsed:?}"
    );
    assert_eq!(
        l.inbound.dropped_packets,
        COUNT - l.inbound.admitted_packets
    );
    assert_eq!(
        l.inbound.dropped_bytes,
        l.inbound.dropped_packets * SIZE as u64
    );
    assert_eq!(
        s.dropped.get(DropReason::RateLimited),
        l.inbound.dropped_packets
    );
    // The other tunnel lost nothing.
    assert_eq!(f.inbound.admitted_packets, COUNT, "{f:?}");
    assert_eq!(f.inbound.dropped_packets, 0);
    assert_eq!(
        s.forwarded.get(ForwardKind::EspToData),
        COUNT + l.inbound.admitted_packets
    );

    // Lifting the limit lets the tunnel through again.
    steer.set_rate_limit(limited, None);
    for seq in 0..20 {
        peer.send_to(&esp(0x2000, 1000 + seq, SIZE), local.natt[0])
            .unwrap();
    }
    let s = wait_stats(&steer, "unlimited again", |s| {
        s.tunnels[&limited].inbound.admitted_packets == l.inbound.admitted_packets + 20
    });
    assert_eq!(s.tunnels[&limited].limit, None);
    assert_eq!(
        s.tunnels[&limited].inbound.dropped_packets,
        l.inbound.dropped_packets
    );
}

/// Failure detection that notices a silent node within a fraction of a second (the timeout
/// is long enough that a briefly descheduled thread on a busy machine is not taken for dead).
fn quick_health() -> HealthConfig {
    HealthConfig {
        sample: 1,
        min_interval: Duration::from_millis(5),
        idle_interval: Duration::from_millis(10),
        timeout: Duration::from_millis(250),
        misses: 3,
        max_outstanding: 32,
    }
}

/// A fake data node that answers every probe while `answering` is set, until `stop`.
fn responder(
    sock: std::net::UdpSocket,
    answering: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut answered = 0;
        while !stop.load(Ordering::Relaxed) {
            let Some((bytes, from)) = recv(&sock, Duration::from_millis(20)) else {
                continue;
            };
            let Ok(frame) = wire::relay::parse_frame(&bytes) else {
                continue;
            };
            if let Some(p) = frame.probe {
                if answering.load(Ordering::Relaxed) {
                    reply_probe(&sock, from, p);
                    answered += 1;
                }
            }
        }
        answered
    })
}

/// Waits for the next event, panicking at the deadline.
fn next_event(events: &crossbeam_channel::Receiver<SteerEvent>) -> SteerEvent {
    events
        .recv_timeout(DEADLINE)
        .expect("an event before the deadline")
}

#[test]
fn a_silent_node_is_declared_dead_an_answering_one_is_not_and_a_revived_one_is_reported() {
    let steer = start(quick_health(), Some(Duration::from_millis(20)));
    let local = steer.local_addrs().clone();
    let events = steer.events();
    let (s1, s2) = (socket("127.0.1.1"), socket("127.0.1.2"));
    let (a1, a2) = (s1.local_addr().unwrap(), s2.local_addr().unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let answering1 = Arc::new(AtomicBool::new(true));
    let answering2 = Arc::new(AtomicBool::new(false));
    let r1 = responder(s1, Arc::clone(&answering1), Arc::clone(&stop));
    let r2 = responder(s2, Arc::clone(&answering2), Arc::clone(&stop));
    steer
        .set_data_nodes(vec![(NodeId(1), a1), (NodeId(2), a2)])
        .unwrap();
    steer
        .set_spi(
            EspSpi(0x5000),
            SpiEntry {
                node: NodeId(2),
                tunnel: TunnelId(1),
            },
        )
        .unwrap();
    // Traffic to node 1 too, so its probes ride on packets as well as in idle frames.
    steer
        .set_spi(
            EspSpi(0x6000),
            SpiEntry {
                node: NodeId(1),
                tunnel: TunnelId(2),
            },
        )
        .unwrap();
    let peer = socket("127.0.0.50");
    let traffic_stop = Arc::new(AtomicBool::new(false));
    let traffic = {
        let stop = Arc::clone(&traffic_stop);
        let natt = local.natt[0];
        std::thread::spawn(move || {
            let mut seq = 0;
            while !stop.load(Ordering::Relaxed) {
                seq += 1;
                let _ = peer.send_to(&esp(0x6000, seq, 100), natt);
                std::thread::sleep(Duration::from_millis(2));
            }
            peer
        })
    };

    // Node 2 never answers: it is declared dead, once; node 1 is not.
    assert_eq!(next_event(&events), SteerEvent::NodeDead(NodeId(2)));
    // Give node 1 several probe timeouts more.
    std::thread::sleep(Duration::from_secs(1));
    assert!(events.try_recv().is_err(), "no other event");
    let s = steer.stats();
    assert!(
        s.nodes[&NodeId(1)].alive && !s.nodes[&NodeId(2)].alive,
        "{s:#?}"
    );
    assert!(s.nodes[&NodeId(1)].replies > 0);
    assert!(
        s.health.deaths == 1 && s.health.accepted_replies > 0,
        "{s:#?}"
    );
    assert!(s.forwarded.get(ForwardKind::ProbesOnPackets) > 0);

    // ESP for the dead node is dropped and counted.
    let peer = {
        traffic_stop.store(true, Ordering::Relaxed);
        traffic.join().unwrap()
    };
    peer.send_to(&esp(0x5000, 1, 100), local.natt[0]).unwrap();
    wait_stats(&steer, "dropped for the dead node", |s| {
        s.dropped.get(DropReason::NodeDead) >= 1
    });

    // Node 2 answers again: it is reported alive and forwarded to.
    answering2.store(true, Ordering::Relaxed);
    assert_eq!(next_event(&events), SteerEvent::NodeAlive(NodeId(2)));
    let forwarded = steer.stats().forwarded.get(ForwardKind::EspToData);
    peer.send_to(&esp(0x5000, 2, 100), local.natt[0]).unwrap();
    wait_stats(&steer, "forwarded to the revived node", |s| {
        s.forwarded.get(ForwardKind::EspToData) == forwarded + 1
    });

    stop.store(true, Ordering::Relaxed);
    assert!(r1.join().unwrap() > 0);
    assert!(r2.join().unwrap() > 0);
    steer.shutdown();
}

#[test]
fn without_revival_a_dead_node_stays_dead_until_given_again_with_a_new_address() {
    let steer = start(quick_health(), None);
    let events = steer.events();
    let s1 = socket("127.0.1.1");
    steer
        .set_data_nodes(vec![(NodeId(1), s1.local_addr().unwrap())])
        .unwrap();
    assert_eq!(next_event(&events), SteerEvent::NodeDead(NodeId(1)));
    // The node answers now (after dropping the probes it missed), but nobody probes it.
    while recv(&s1, Duration::from_millis(50)).is_some() {}
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = socket("127.0.1.2");
    let a2 = s2.local_addr().unwrap();
    let r1 = responder(s1, Arc::new(AtomicBool::new(true)), Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(200));
    assert!(events.try_recv().is_err());
    assert!(!steer.stats().nodes[&NodeId(1)].alive);
    // Given again at another address, it starts over alive and answers there.
    let r2 = responder(s2, Arc::new(AtomicBool::new(true)), Arc::clone(&stop));
    steer.set_data_nodes(vec![(NodeId(1), a2)]).unwrap();
    assert!(steer.stats().nodes[&NodeId(1)].alive);
    wait_stats(&steer, "replies from the new address", |s| {
        s.nodes[&NodeId(1)].replies >= 5
    });
    stop.store(true, Ordering::Relaxed);
    assert_eq!(r1.join().unwrap(), 0, "the dead node was not probed");
    assert!(r2.join().unwrap() >= 5);
    assert!(events.try_recv().is_err(), "no other event");
}
