//! What the run tests share: the C programs of `tests/filters/` and `examples/filters/`,
//! compiled at test time with the command the documentation gives tenants.

use std::path::PathBuf;

/// Compiles `tests/filters/NAME.c` with `-g` (see `testreq::bpf::compile`); `None`: the
/// test returns.
pub(crate) fn compile(name: &str, debug_info: bool) -> Option<Vec<u8>> {
    let source = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/filters/{name}.c"));
    // One output per test and variant: tests run in parallel.
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "filter-run-{name}-{}-{}.o",
        if debug_info { "g" } else { "nog" },
        testreq::this_test().replace("::", "-")
    ));
    testreq::bpf::compile(&source, &out, debug_info)
}

/// Compiles the repository's example program `examples/filters/NAME.c`.
pub(crate) fn compile_example(name: &str) -> Option<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    testreq::bpf::example(name, &dir).map(|(_, bytes)| bytes)
}
