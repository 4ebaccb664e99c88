//! The `protego` command.
fn main() {}
