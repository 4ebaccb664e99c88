//! Runs the C programs of `tests/filters/` on synthetic packets: verdicts, map contents,
//! helpers, the instruction meter, the JIT's size limit, and the JIT against rbpf's
//! interpreter (which checks every memory access) on random packets.
#![cfg(all(target_arch = "x86_64", target_os = "linux"))]

use filter::run::{Abort, Engine, FrameBuf, Instance, RunConfig, RunError, XdpAction};
use filter::run::{BPF_ANY, HEADROOM, JIT_TOO_LARGE, TAILROOM};
use filter::Object;
use rand_core::{RngCore, SeedableRng};

mod common;
use common::{compile, compile_example};

const UDP: u8 = 17;
const TCP: u8 = 6;

/// Loads and instantiates `section` of `tests/filters/NAME.c`, or of
/// `examples/filters/NAME.c` when `name` starts with `examples/`.
fn instance(name: &str, section: &str, config: RunConfig) -> Option<Instance> {
    let bytes = match name.strip_prefix("examples/") {
        Some(example) => compile_example(example)?,
        None => compile(name, true)?,
    };
    let program = Object::load(&bytes, section).expect("verifies");
    Some(program.instantiate(config).expect("instantiates"))
}

/// An IPv4 packet (20-byte header, checksum filled in) carrying `payload`.
fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, payload: &[u8]) -> Vec<u8> {
    let len = 20 + payload.len();
    let mut p = vec![
        0x45,
        0,
        (len >> 8) as u8,
        len as u8,
        0,
        1,
        0x40,
        0,
        64,
        proto,
        0,
        0,
    ];
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    let sum: u32 = p
        .chunks(2)
        .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
        .sum();
    let sum = (sum & 0xffff) + (sum >> 16);
    let check = !((sum & 0xffff) + (sum >> 16)) as u16;
    p[10..12].copy_from_slice(&check.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

fn udp(sport: u16, dport: u16, data: &[u8]) -> Vec<u8> {
    let len = (8 + data.len()) as u16;
    let mut u = [
        sport.to_be_bytes(),
        dport.to_be_bytes(),
        len.to_be_bytes(),
        [0, 0],
    ]
    .concat();
    u.extend_from_slice(data);
    u
}

fn tcp(sport: u16, dport: u16) -> Vec<u8> {
    let mut t = [sport.to_be_bytes(), dport.to_be_bytes()].concat();
    t.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
    t
}

fn key(i: u32) -> [u8; 4] {
    i.to_le_bytes()
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

#[test]
fn the_drop_filter_drops_the_blocked_addresses_and_counts_per_worker() {
    let config = RunConfig {
        workers: 2,
        ..RunConfig::default()
    };
    let Some(inst) = instance("drop", "xdp", config) else {
        return;
    };
    let blocked = inst.map("blocked").expect("map");
    blocked
        .update(&key(0), &[10, 0, 0, 9], BPF_ANY)
        .expect("update");
    blocked
        .update(&key(1), &[10, 0, 0, 10], BPF_ANY)
        .expect("update");
    let mut w0 = inst.runtime(0, Engine::Jit, 1).expect("jit");
    let mut w1 = inst.runtime(1, Engine::Jit, 2).expect("jit");
    let mut frame = FrameBuf::new(1500).expect("frame");
    let run = |rt: &mut filter::Runtime, frame: &mut FrameBuf, packet: &[u8]| {
        frame.load_ip(packet).expect("fits");
        rt.run(frame).action
    };
    let to = |d: u8| ipv4([192, 0, 2, 1], [10, 0, 0, d], UDP, &udp(1, 2, b"x"));
    assert_eq!(run(&mut w0, &mut frame, &to(9)), XdpAction::Drop);
    assert_eq!(run(&mut w0, &mut frame, &to(10)), XdpAction::Drop);
    assert_eq!(run(&mut w1, &mut frame, &to(9)), XdpAction::Drop);
    assert_eq!(run(&mut w0, &mut frame, &to(11)), XdpAction::Pass);
    // Not IPv4: passed untouched.
    let mut v6 = vec![0x60; 40];
    v6[6] = UDP;
    assert_eq!(run(&mut w0, &mut frame, &v6), XdpAction::Pass);
    // An IPv4 header cut short: dropped by the program's bounds check.
    assert_eq!(run(&mut w1, &mut frame, &[0x45; 12]), XdpAction::Drop);
    // The per-CPU counter: two drops on worker 0, one on worker 1.
    let dropped = inst.map("dropped").expect("map");
    let value = dropped.lookup(&key(0)).expect("key").expect("array");
    assert_eq!(u64s(&value), [2, 1]);
    assert_eq!((w0.counters().dropped, w0.counters().passed), (2, 2));
    assert_eq!((w1.counters().dropped, w1.counters().passed), (2, 0));
    // The frame is intact after a pass.
    frame.load_ip(&to(11)).expect("fits");
    w0.run(&mut frame);
    assert_eq!(frame.ip_packet(), Some(&to(11)[..]));
}

#[test]
fn the_dns_limiter_passes_once_per_interval_and_keeps_its_maps() {
    let Some(inst) = instance("dns_limit", "xdp", RunConfig::default()) else {
        return;
    };
    let interval: u64 = 1_000_000;
    inst.map("config")
        .expect("map")
        .update(&key(0), &interval.to_le_bytes(), BPF_ANY)
        .expect("update");
    let mut rt = inst.runtime(0, Engine::Jit, 7).expect("jit");
    let mut frame = FrameBuf::new(1500).expect("frame");
    let (a, b) = ([198, 51, 100, 1], [198, 51, 100, 2]);
    let query = |src| ipv4(src, [10, 0, 0, 53], UDP, &udp(4000, 53, &[0; 12]));
    let mut run = |rt: &mut filter::Runtime, now: u64, packet: &[u8]| {
        rt.set_now(now);
        frame.load_ip(packet).expect("fits");
        let v = rt.run(&mut frame);
        (v.action, v.bounds, frame.ip_packet().map(<[u8]>::to_vec))
    };
    assert_eq!(run(&mut rt, 1000, &query(a)).0, XdpAction::Pass);
    let last = inst.map("last_pass").expect("map");
    assert_eq!(last.dump(), [(a.to_vec(), 1000u64.to_le_bytes().to_vec())]);
    // Not DNS: passed and not counted.
    let web = ipv4(a, [10, 0, 0, 53], UDP, &udp(4000, 80, b""));
    assert_eq!(run(&mut rt, 1001, &web).0, XdpAction::Pass);
    assert_eq!(
        run(&mut rt, 1002, &ipv4(a, b, TCP, &tcp(1, 53))).0,
        XdpAction::Pass
    );
    // Within the interval: dropped, one in 16 answered truncated (TX) by the worker's RNG.
    let (mut drops, mut tx) = (0, 0);
    for i in 0..64 {
        let (action, bounds, ip) = run(&mut rt, 2000 + i, &query(a));
        match action {
            XdpAction::Drop => drops += 1,
            XdpAction::Tx => {
                tx += 1;
                let ip = ip.expect("still IPv4");
                // 8 bytes shorter (the UDP header's worth), and the IP length says so.
                assert_eq!(bounds.len(), 14 + 20 + 8 + 12 - 8);
                assert_eq!(u16::from_be_bytes([ip[2], ip[3]]), 20 + 8 + 12 - 8);
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(tx > 0 && drops > tx, "{drops} drops, {tx} TX");
    // An exempt source passes at any rate and is counted as passed.
    inst.map("exempt")
        .expect("map")
        .update(&b, &[1], BPF_ANY)
        .expect("update");
    assert_eq!(run(&mut rt, 3000, &query(b)).0, XdpAction::Pass);
    assert_eq!(run(&mut rt, 3001, &query(b)).0, XdpAction::Pass);
    // After the interval, A passes again and its time is updated.
    assert_eq!(run(&mut rt, 1000 + interval, &query(a)).0, XdpAction::Pass);
    assert_eq!(
        last.lookup(&a).expect("key"),
        Some((1000 + interval).to_le_bytes().to_vec())
    );
    let verdicts = inst.map("verdicts").expect("map");
    let passed = u64s(&verdicts.lookup(&key(0)).expect("k").expect("v"));
    let dropped = u64s(&verdicts.lookup(&key(1)).expect("k").expect("v"));
    assert_eq!((passed[0], dropped[0]), (4, 64));
    let c = rt.counters();
    assert_eq!((c.passed, c.dropped, c.tx, c.aborted), (6, drops, tx, 0));
}

#[test]
fn the_meter_stops_a_long_loop_at_a_low_limit_and_counts_it() {
    let low = RunConfig {
        insn_limit: 1000,
        ..RunConfig::default()
    };
    let Some(inst) = instance("loops", "xdp:walk_all", low) else {
        return;
    };
    let full = instance("loops", "xdp:walk_all", RunConfig::default()).expect("compiled");
    let mut frame = FrameBuf::new(1500).expect("frame");
    let long = ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, &[1; 1400]);
    let short = ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, &[1; 20]);
    for engine in [Engine::Jit, Engine::Interpreter] {
        let mut rt = inst.runtime(0, engine, 0).expect("runtime");
        frame.load_ip(&long).expect("fits");
        let v = rt.run(&mut frame);
        assert_eq!(
            (v.action, v.abort),
            (XdpAction::Aborted, Some(Abort::InsnLimit)),
            "{engine:?}"
        );
        // Exhausted: the meter charged its whole limit.
        assert!(inst.counts_insns());
        assert_eq!(rt.counters().metered_insns, 1000, "{engine:?}");
        frame.load_ip(&short).expect("fits");
        assert_ne!(rt.run(&mut frame).action, XdpAction::Aborted, "{engine:?}");
        let c = rt.counters();
        assert_eq!((c.aborted, c.insn_limit), (1, 1), "{engine:?}");
        // The short packet: one loop span per byte of its frame (Ethernet, IP header, UDP
        // payload), give or take the loop's entry and exit.
        let span = u64::from(inst.lowered().loop_heads[0].1);
        let charged = c.metered_insns - 1000;
        let bytes = 14 + short.len() as u64;
        assert!(
            charged % span == 0 && (bytes - 1..=bytes + 1).contains(&(charged / span)),
            "{engine:?}: {charged} charged, span {span}, {bytes} bytes"
        );
        // The default limit lets the whole packet through the loop.
        let mut rt = full.runtime(0, engine, 0).expect("runtime");
        frame.load_ip(&long).expect("fits");
        assert_ne!(rt.run(&mut frame).action, XdpAction::Aborted, "{engine:?}");
    }
    assert!(!inst.lowered().loop_heads.is_empty());
}

#[test]
fn a_return_value_that_is_no_action_counts_as_aborted() {
    let Some(inst) = instance("loops", "xdp:redirect", RunConfig::default()) else {
        return;
    };
    let mut rt = inst.runtime(0, Engine::Jit, 0).expect("jit");
    let mut frame = FrameBuf::new(1500).expect("frame");
    frame
        .load_ip(&ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, b""))
        .expect("fits");
    let v = rt.run(&mut frame);
    assert_eq!(
        (v.action, v.abort),
        (XdpAction::Aborted, Some(Abort::InvalidAction(4)))
    );
    let c = rt.counters();
    assert_eq!((c.aborted, c.invalid_action, c.insn_limit), (1, 1, 0));
}

#[test]
fn adjust_head_moves_the_frame_start_and_refuses_bad_deltas() {
    let Some(inst) = instance("adjust", "xdp:head", RunConfig::default()) else {
        return;
    };
    let mut rt = inst.runtime(0, Engine::Jit, 0).expect("jit");
    let mut frame = FrameBuf::new(1500).expect("frame");
    let packet = ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, &udp(1, 2, &[7; 12])); // 40 bytes
    let end = HEADROOM + 14 + packet.len();
    let cases: [(i32, Option<usize>); 6] = [
        (-20, Some(HEADROOM - 20)),
        (0, Some(HEADROOM)),
        (-(HEADROOM as i32), Some(0)),
        (-(HEADROOM as i32) - 1, None),
        (packet.len() as i32, Some(end - 14)),
        (packet.len() as i32 + 1, None),
    ];
    for (delta, start) in cases {
        inst.map("delta")
            .expect("map")
            .update(&key(0), &delta.to_le_bytes(), BPF_ANY)
            .expect("u");
        frame.load_ip(&packet).expect("fits");
        let v = rt.run(&mut frame);
        let result = inst
            .map("result")
            .expect("map")
            .lookup(&key(0))
            .expect("k")
            .expect("v");
        let result = i64::from_le_bytes(result.try_into().expect("8 bytes"));
        match start {
            Some(s) => {
                assert_eq!((v.action, result), (XdpAction::Pass, 0), "{delta}");
                assert_eq!(v.bounds, s..end, "{delta}");
                assert_eq!(frame.frame()[0], 0xab, "{delta}");
                if s == 0 {
                    // The first case wrote 0xab 20 bytes into the headroom: given up again,
                    // the headroom shows zeros, not an earlier run's bytes.
                    assert_eq!(frame.frame()[HEADROOM - 20], 0, "stale headroom");
                }
            }
            None => {
                assert_eq!((v.action, result), (XdpAction::Drop, -22), "{delta}");
                assert_eq!(v.bounds, HEADROOM..end, "{delta}");
            }
        }
    }
}

#[test]
fn adjust_tail_moves_the_frame_end_zeroes_growth_and_refuses_bad_deltas() {
    let Some(inst) = instance("adjust", "xdp:tail", RunConfig::default()) else {
        return;
    };
    let mut rt = inst.runtime(0, Engine::Jit, 0).expect("jit");
    let mtu = 1500;
    let mut frame = FrameBuf::new(mtu).expect("frame");
    let big = ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, &[0xee; 200]);
    let packet = ipv4([1, 2, 3, 4], [5, 6, 7, 8], UDP, &[0xee; 20]); // 40 bytes
    let end = HEADROOM + 14 + packet.len();
    let room = (mtu - packet.len() + TAILROOM) as i32;
    for (delta, ok) in [
        (-8, true),
        (100, true),
        (room, true),
        (room + 1, false),
        (-(packet.len() as i32), true),
        (-(packet.len() as i32) - 1, false),
    ] {
        inst.map("delta")
            .expect("map")
            .update(&key(0), &delta.to_le_bytes(), BPF_ANY)
            .expect("u");
        // Leave stale bytes behind the packet first: growth must not reveal them.
        frame.load_ip(&big).expect("fits");
        frame.load_ip(&packet).expect("fits");
        let v = rt.run(&mut frame);
        if ok {
            let new_end = (end as i64 + i64::from(delta)) as usize;
            assert_eq!(
                (v.action, v.bounds.clone()),
                (XdpAction::Pass, HEADROOM..new_end),
                "{delta}"
            );
            if delta > 0 {
                assert!(
                    frame.frame()[14 + packet.len()..].iter().all(|&b| b == 0),
                    "{delta}"
                );
            }
        } else {
            assert_eq!(
                (v.action, v.bounds),
                (XdpAction::Drop, HEADROOM..end),
                "{delta}"
            );
        }
    }
}

#[test]
fn a_program_too_large_for_the_jit_is_refused_with_the_reason() {
    let Some(bytes) = compile("loops", true) else {
        return;
    };
    let program = Object::load(&bytes, "xdp:huge").expect("verifies");
    let e = program
        .instantiate(RunConfig::default())
        .expect_err("too large");
    assert!(matches!(e, RunError::TooLarge { .. }), "{e:?}");
    assert!(
        e.to_string().starts_with("section `xdp:huge`: ") && e.to_string().ends_with(JIT_TOO_LARGE),
        "{e}"
    );
}

/// A random packet: DNS queries from a few sources, other UDP and TCP, IPv4 cut short,
/// IPv6, random bytes behind a valid version nibble.
fn random_packet(rng: &mut rand_chacha::ChaCha8Rng) -> Vec<u8> {
    let src = [198, 51, 100, (rng.next_u32() % 4) as u8];
    let dst = [10, 0, 0, 8 + (rng.next_u32() % 4) as u8];
    let mut junk = vec![0; (rng.next_u32() % 1400) as usize];
    rng.fill_bytes(&mut junk);
    match rng.next_u32() % 6 {
        0 | 1 => ipv4(src, dst, UDP, &udp(4000, 53, &junk[..junk.len().min(64)])),
        2 => ipv4(src, dst, TCP, &tcp(4000, 53)),
        3 => ipv4(src, dst, UDP, &udp(4000, 80, &junk)),
        4 => {
            let mut p = ipv4(src, dst, UDP, &junk);
            p.truncate((rng.next_u32() % 28) as usize + 1);
            p[0] = 0x45;
            p
        }
        _ => {
            junk.insert(0, 0x60);
            junk
        }
    }
}

#[test]
fn the_jit_and_the_interpreter_agree_on_random_packets() {
    let programs = [
        ("drop", "xdp"),
        ("dns_limit", "xdp"),
        ("loops", "xdp:walk_all"),
        ("adjust", "xdp:head"),
        ("adjust", "xdp:tail"),
        ("refused", "xdp:packet_walk"),
        ("refused", "xdp:fresh_pointer"),
        ("examples/dns_ratelimit", "xdp"),
        ("examples/syncookie", "xdp:syncookie_in"),
        ("examples/syncookie", "xdp:syncookie_out"),
        ("examples/udp_firewall", "xdp"),
    ];
    for (name, section) in programs {
        let config = RunConfig {
            insn_limit: 5000,
            workers: 1,
        };
        let Some(jit) = instance(name, section, config) else {
            return;
        };
        let interp = instance(name, section, config).expect("compiled");
        let setup = |inst: &Instance| {
            let set = |map: &str, k: &[u8], v: &[u8]| {
                // Only where the map has these sizes (the examples' maps differ).
                let fits = |m: &&std::sync::Arc<filter::Map>| {
                    m.spec().key_size as usize == k.len() && m.spec().value_size as usize == v.len()
                };
                if let Some(m) = inst.map(map).filter(fits) {
                    m.update(k, v, BPF_ANY).expect("update");
                }
            };
            set("blocked", &key(0), &[10, 0, 0, 9]);
            set("config", &key(0), &500u64.to_le_bytes());
            set("exempt", &[198, 51, 100, 3], &[1]);
            set("blocked_ports", &53u16.to_be_bytes(), &[1]);
        };
        setup(&jit);
        setup(&interp);
        let mut a = jit.runtime(0, Engine::Jit, 99).expect("jit");
        let mut b = interp
            .runtime(0, Engine::Interpreter, 99)
            .expect("interpreter");
        let (mut fa, mut fb) = (
            FrameBuf::new(1500).expect("f"),
            FrameBuf::new(1500).expect("f"),
        );
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for i in 0..400u64 {
            let packet = random_packet(&mut rng);
            let delta = (rng.next_u32() % 700) as i32 - 350;
            for inst in [&jit, &interp] {
                if let Some(m) = inst.map("delta") {
                    m.update(&key(0), &delta.to_le_bytes(), BPF_ANY).expect("u");
                }
            }
            a.set_now(i * 100);
            b.set_now(i * 100);
            fa.load_ip(&packet).expect("fits");
            fb.load_ip(&packet).expect("fits");
            let (va, vb) = (a.run(&mut fa), b.run(&mut fb));
            assert!(
                !matches!(vb.abort, Some(Abort::Fault(_))),
                "{name} {section}: {vb:?}"
            );
            assert_eq!(va, vb, "{name} {section}, packet {i}");
            assert_eq!(fa.frame(), fb.frame(), "{name} {section}, packet {i}");
        }
        for (ma, mb) in jit.maps().iter().zip(interp.maps()) {
            assert_eq!(
                ma.dump(),
                mb.dump(),
                "{name} {section}: map {}",
                ma.spec().name
            );
        }
        assert_eq!(a.counters(), b.counters(), "{name} {section}");
    }
}

/// The SYN-cookie proxy's two programs, instantiated from one object, share its maps: a
/// connection the inbound program records is the outbound program's too.
#[test]
fn programs_of_one_object_share_its_maps() {
    let Some(bytes) = compile_example("syncookie") else {
        return;
    };
    let inbound = Object::load(&bytes, "xdp:syncookie_in")
        .expect("verifies")
        .instantiate(RunConfig::default())
        .expect("instantiates");
    let outbound = Object::load(&bytes, "xdp:syncookie_out")
        .expect("verifies")
        .instantiate_sharing(RunConfig::default(), inbound.maps())
        .expect("instantiates");
    let conns = inbound.map("conns").expect("conns");
    assert!(std::sync::Arc::ptr_eq(
        conns,
        outbound.map("conns").expect("conns")
    ));
    conns.update(&[1; 12], &[2; 16], BPF_ANY).expect("update");
    assert_eq!(
        outbound.map("conns").expect("conns").lookup(&[1; 12]),
        Ok(Some(vec![2; 16]))
    );
    // A map declared differently is not taken: a per-CPU map for another worker count.
    let four = Object::load(&bytes, "xdp:syncookie_out")
        .expect("verifies")
        .instantiate_sharing(
            RunConfig {
                workers: 4,
                ..RunConfig::default()
            },
            inbound.maps(),
        )
        .expect("instantiates");
    assert!(!std::sync::Arc::ptr_eq(
        inbound.map("verdicts").expect("verdicts"),
        four.map("verdicts").expect("verdicts")
    ));
    assert!(std::sync::Arc::ptr_eq(
        conns,
        four.map("conns").expect("conns")
    ));
}
