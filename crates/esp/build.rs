//! Declares the `loom` cfg used by the model-checked concurrency tests of the sequence counter
//! and the replay window
//! (`RUSTFLAGS="--cfg loom" cargo test -p protego-esp --release --lib loom`).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
