//! Declares the `loom` cfg used by the model-checked concurrency tests of the replay window
//! (`RUSTFLAGS="--cfg loom" cargo test -p protego-esp --release loom`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
