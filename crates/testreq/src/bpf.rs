//! Tenant filters for tests: C programs compiled with clang as the documentation tells
//! tenants to (`examples/filters/README.md`), so every crate's tests load the objects a tenant
//! would ship.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The header the programs include from libbpf-dev (`scripts/requirements.tsv`).
pub const BPF_HELPERS_H: &str = "/usr/include/bpf/bpf_helpers.h";

/// The repository's example filters (`examples/filters/`).
pub fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/filters")
}

/// Compiles `source` with `clang-14 -O2 [-g] -target bpf -mcpu=v3` into `out` and returns the
/// object's bytes; `None` (the test returns) when clang-14 or libbpf-dev is missing and the
/// run is not strict (see [`crate::program`]): under `make test` a missing compiler fails the
/// test. `out` must differ between tests that run at once. Panics if clang refuses the file:
/// the programs are the project's own.
pub fn compile(source: &Path, out: &Path, debug_info: bool) -> Option<Vec<u8>> {
    let test = crate::this_test();
    if !crate::program(&test, "clang-14") || !crate::program(&test, BPF_HELPERS_H) {
        return None;
    }
    let mut clang = Command::new("clang-14");
    clang.args([
        "-O2",
        "-target",
        "bpf",
        "-mcpu=v3",
        "-I/usr/include/x86_64-linux-gnu",
    ]);
    if debug_info {
        clang.arg("-g");
    }
    let status = clang
        .arg("-c")
        .arg(source)
        .arg("-o")
        .arg(out)
        .status()
        .expect("clang-14 runs");
    assert!(status.success(), "clang-14 failed on {}", source.display());
    Some(std::fs::read(out).expect("clang-14 wrote the object"))
}

/// [`compile`]s `examples/filters/NAME.c` with debug info into `dir`, named after the running
/// test; returns the object's path and bytes.
pub fn example(name: &str, dir: &Path) -> Option<(PathBuf, Vec<u8>)> {
    let source = examples_dir().join(format!("{name}.c"));
    let out = dir.join(format!(
        "{name}-{}-{}.o",
        std::process::id(),
        crate::this_test().replace("::", "-")
    ));
    let bytes = compile(&source, &out, true)?;
    Some((out, bytes))
}
