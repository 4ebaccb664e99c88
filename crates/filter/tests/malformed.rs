//! Objects damaged byte by byte and cut short are refused with an error, never a panic: the
//! object is the tenant's input.

use filter::Object;

fn compile_drop() -> Option<Vec<u8>> {
    let test = testreq::this_test();
    if !testreq::program(&test, "clang-14")
        || !testreq::program(&test, "/usr/include/bpf/bpf_helpers.h")
    {
        return None;
    }
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("filter-malformed-drop.o");
    let status = std::process::Command::new("clang-14")
        .args([
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-mcpu=v3",
            "-I/usr/include/x86_64-linux-gnu",
            "-c",
        ])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/filters/drop.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("clang-14 runs");
    assert!(status.success());
    Some(std::fs::read(&out).expect("object"))
}

#[test]
fn damaged_objects_are_refused_without_panicking() {
    // 3 000 rounds found 32 panics in aya-obj before they were caught; 300 keep the test short.
    const ROUNDS: usize = 300;
    let Some(good) = compile_drop() else { return };
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut outcomes = [0usize; 3];
    for round in 0..ROUNDS {
        let mut bytes = good.clone();
        if round % 4 == 0 {
            bytes.truncate((next() % good.len() as u64) as usize);
        } else {
            for _ in 0..1 + round % 8 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
        }
        let r = std::panic::catch_unwind(|| Object::load(&bytes, "xdp"));
        match r {
            Ok(Ok(_)) => outcomes[0] += 1,
            Ok(Err(_)) => outcomes[1] += 1,
            Err(_) => outcomes[2] += 1,
        }
    }
    eprintln!("accepted, refused, panicked = {outcomes:?}");
    assert_eq!(
        outcomes[2], 0,
        "panics: accepted, refused, panicked = {outcomes:?}"
    );
}
