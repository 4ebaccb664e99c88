//! Loads the C programs of `tests/filters/` as clang compiles them (at test time, with the
//! command the documentation gives tenants) and checks what is accepted and what is refused,
//! and why.

use filter::{LoadError, MapKind, MapSpec, Object};
use std::path::PathBuf;

/// Compiles `tests/filters/NAME.c` (see [`testreq::bpf::compile`]); `None`: the test returns.
fn compile(name: &str, debug_info: bool) -> Option<Vec<u8>> {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/filters/{name}.c"));
    // One output per test and variant: tests run in parallel.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "filter-{name}-{}-{}.o",
        if debug_info { "g" } else { "nog" },
        testreq::this_test().replace("::", "-")
    ));
    testreq::bpf::compile(&source, &out, debug_info)
}

/// Compiles the repository's example program `examples/filters/NAME.c`.
fn compile_example(name: &str) -> Option<Vec<u8>> {
    testreq::bpf::example(name, std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))).map(|(_, b)| b)
}

fn refusal(name: &str, section: &str) -> Option<String> {
    let bytes = compile(name, true)?;
    match Object::load(&bytes, section) {
        Ok(p) => panic!("{section} of {name}.c was accepted: {p:?}"),
        Err(e) => Some(e.to_string()),
    }
}

#[test]
fn the_drop_filter_is_accepted_with_its_maps() {
    let Some(bytes) = compile("drop", true) else {
        return;
    };
    let p = Object::load(&bytes, "xdp").expect("drop.c verifies");
    assert_eq!(p.function(), "drop_blocked");
    assert_eq!(
        p.maps(),
        [
            MapSpec {
                name: "blocked".into(),
                kind: MapKind::Array,
                key_size: 4,
                value_size: 4,
                max_entries: 16,
                flags: 0,
            },
            MapSpec {
                name: "dropped".into(),
                kind: MapKind::PerCpuArray,
                key_size: 4,
                value_size: 8,
                max_entries: 1,
                flags: 0,
            },
        ]
    );
    // The loop over the 16 slots is unrolled (see drop.c).
    assert_eq!(p.loop_bound(), 0);
    // Map references point at the program's maps: handle = index + 1.
    let mut handles: Vec<i32> = p
        .instructions()
        .iter()
        .filter(|i| i.is_lddw() && i.src == 1)
        .map(|i| i.imm)
        .collect();
    handles.sort_unstable();
    handles.dedup();
    assert_eq!(handles, [1, 2]);
    assert_eq!(p.bytecode().len(), 8 * p.instructions().len());
    // The same program by name.
    let by_name = Object::load(&bytes, "xdp:drop_blocked").expect("by name");
    assert_eq!(by_name.instructions(), p.instructions());
}

#[test]
fn the_dns_limiter_is_accepted_with_every_offered_helper() {
    let Some(bytes) = compile("dns_limit", true) else {
        return;
    };
    let p = Object::load(&bytes, "xdp").expect("dns_limit.c verifies");
    let kinds: Vec<(&str, MapKind, u32)> = p
        .maps()
        .iter()
        .map(|m| (m.name.as_str(), m.kind, m.max_entries))
        .collect();
    assert_eq!(
        kinds,
        [
            ("config", MapKind::Array, 1),
            ("exempt", MapKind::Hash, 64),
            ("last_pass", MapKind::LruHash, 4096),
            ("verdicts", MapKind::PerCpuArray, 2),
        ]
    );
    let mut helpers: Vec<i32> = p
        .instructions()
        .iter()
        .filter(|i| i.code == 0x85)
        .map(|i| i.imm)
        .collect();
    helpers.sort_unstable();
    helpers.dedup();
    assert_eq!(helpers, filter::OFFERED_HELPERS);
    assert_eq!(p.loop_bound(), 0);
}

#[test]
fn an_out_of_bounds_packet_read_is_refused_where_it_happens() {
    let Some(e) = refusal("refused", "xdp:out_of_bounds") else {
        return;
    };
    assert!(
        e.starts_with("section `xdp:out_of_bounds`, instruction ")
            && e.contains("Upper bound must be at most packet_size")
            && e.contains("check `pointer + length <= data_end`")
            && e.contains("refused.c:")
            && e.contains("p[20]"),
        "{e}"
    );
}

#[test]
fn a_map_value_used_without_a_null_check_is_refused() {
    let Some(e) = refusal("refused", "xdp:no_null_check") else {
        return;
    };
    assert!(
        e.contains("Possible null access")
            && e.contains("used without checking it")
            && e.contains("return *v & 3;"),
        "{e}"
    );
}

#[test]
fn an_unbounded_loop_is_refused() {
    let Some(e) = refusal("refused", "xdp:unbounded_loop") else {
        return;
    };
    assert!(
        e.contains("Loop counter is too large") && e.contains("the loop may not terminate"),
        "{e}"
    );
}

#[test]
fn a_loop_bounded_by_the_packet_is_accepted() {
    let Some(bytes) = compile("refused", true) else {
        return;
    };
    let p = Object::load(&bytes, "xdp:packet_walk").expect("packet_walk verifies");
    assert!(
        (64..=100_000).contains(&p.loop_bound()),
        "{}",
        p.loop_bound()
    );
}

#[test]
fn a_packet_pointer_used_after_adjust_tail_is_refused_and_a_reloaded_one_is_not() {
    let Some(e) = refusal("refused", "xdp:stale_pointer") else {
        return;
    };
    assert!(
        e.contains("Invalid type") && e.contains("p[30] = 1;"),
        "{e}"
    );
    let Some(bytes) = compile("refused", true) else {
        return;
    };
    Object::load(&bytes, "xdp:fresh_pointer").expect("reloaded pointers verify");
}

#[test]
fn more_stack_than_496_bytes_is_refused() {
    let Some(e) = refusal("refused", "xdp:big_stack") else {
        return;
    };
    assert!(
        e.contains("Lower bound must be at least r10.stack_offset - subprogram_stack_size")
            && e.contains("r10.offset-500"),
        "{e}"
    );
}

#[test]
fn a_helper_the_gateway_does_not_offer_is_refused_by_name() {
    let Some(e) = refusal("refused", "xdp:unknown_helper") else {
        return;
    };
    assert!(
        e.starts_with("section `xdp:unknown_helper`, instruction ")
            && e.ends_with("helper bpf_get_smp_processor_id (8) is not offered"),
        "{e}"
    );
}

#[test]
fn a_ring_buffer_map_is_refused_by_name() {
    let Some(e) = refusal("refused", "xdp:ring_buffer") else {
        return;
    };
    assert_eq!(e, "map `events`: type ringbuf (27) is not offered");
}

#[test]
fn a_bpf_to_bpf_call_is_refused_for_now() {
    let Some(e) = refusal("refused", "xdp:local_call") else {
        return;
    };
    assert!(e.contains("bpf-to-bpf call is not supported yet"), "{e}");
}

#[test]
fn an_object_without_btf_asks_for_dash_g() {
    let Some(bytes) = compile("drop", false) else {
        return;
    };
    let e = Object::load(&bytes, "xdp").expect_err("no BTF");
    assert!(matches!(e, LoadError::NoBtf), "{e:?}");
    assert!(e.to_string().contains("compile with -g"), "{e}");
}

#[test]
fn the_section_must_name_one_xdp_program() {
    let Some(bytes) = compile("refused", true) else {
        return;
    };
    let obj = Object::parse(&bytes).expect("parses");
    assert!(obj.programs().contains(&"xdp:fresh_pointer".to_owned()));
    let e = obj
        .program("xdp")
        .expect_err("several programs")
        .to_string();
    assert!(
        e.starts_with("section `xdp` holds several programs (xdp:big_stack, xdp:fresh_pointer, ")
            && e.ends_with("choose one with `xdp:FUNCTION`"),
        "{e}"
    );
    let e = obj
        .program("xdp:nope")
        .expect_err("no such function")
        .to_string();
    assert!(
        e.contains("no such XDP program") && e.contains("xdp:local_call"),
        "{e}"
    );
    // `classify` is a function of the object but not a program.
    assert!(obj.program("xdp:classify").is_err());
    let e = obj
        .program("xdp:multi_buffer")
        .expect_err("frags")
        .to_string();
    assert!(
        e.contains("is a multi-buffer XDP (xdp.frags) program"),
        "{e}"
    );
    let e = obj
        .program("xdp:traffic_control")
        .expect_err("tc")
        .to_string();
    assert!(
        e.contains("`traffic_control` is a SchedClassifier program"),
        "{e}"
    );
    for bad in ["tc", "xdp/foo", "xdp:", ""] {
        let e = obj.program(bad).expect_err(bad).to_string();
        assert!(e.contains("expected `xdp`, or `xdp:FUNCTION`"), "{e}");
    }
}

#[test]
fn a_section_name_libbpf_does_not_know_refuses_the_object() {
    let Some(bytes) = compile("bad_section", true) else {
        return;
    };
    let e = Object::parse(&bytes).expect_err("xdp/filter").to_string();
    assert_eq!(
        e,
        "section `xdp/filter` is not a program section we know: put the filter in SEC(\"xdp\")"
    );
}

#[test]
fn bytes_that_are_not_an_object_are_refused() {
    let e = Object::load(b"not an ELF file", "xdp").expect_err("garbage");
    assert!(
        e.to_string().starts_with("not a readable eBPF object"),
        "{e}"
    );
    let e = Object::load(&[], "xdp").expect_err("empty");
    assert!(matches!(e, LoadError::Malformed { .. }), "{e:?}");
}

/// The example programs of `examples/filters/` verify: the SYN-cookie proxy's two programs
/// (one object, the same maps), the DNS rate limiter and the UDP firewall.
#[test]
fn the_example_programs_are_accepted() {
    let Some(bytes) = compile_example("syncookie") else {
        return;
    };
    let names = |p: &filter::Program| p.maps().iter().map(|m| m.name.clone()).collect::<Vec<_>>();
    let inbound = Object::load(&bytes, "xdp:syncookie_in").expect("syncookie_in verifies");
    let outbound = Object::load(&bytes, "xdp:syncookie_out").expect("syncookie_out verifies");
    assert_eq!(
        names(&inbound),
        ["conns", "protected_ports", "secret", "verdicts"]
    );
    assert_eq!(names(&outbound), ["conns", "verdicts"]);
    let Some(bytes) = compile_example("dns_ratelimit") else {
        return;
    };
    let limiter = Object::load(&bytes, "xdp").expect("dns_ratelimit verifies");
    assert_eq!(limiter.function(), "dns_ratelimit");
    assert_eq!(names(&limiter), ["buckets", "config", "verdicts"]);
    let Some(bytes) = compile_example("udp_firewall") else {
        return;
    };
    let firewall = Object::load(&bytes, "xdp").expect("udp_firewall verifies");
    assert_eq!(firewall.function(), "udp_firewall");
    assert_eq!(names(&firewall), ["blocked_ports", "verdicts"]);
}
