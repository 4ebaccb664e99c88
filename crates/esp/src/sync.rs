//! The synchronisation primitives of the replay window: std's, or loom's when built with
//! `--cfg loom` so the model checker can explore every interleaving.

#[cfg(loom)]
pub(crate) use loom::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};
#[cfg(not(loom))]
pub(crate) use std::sync::{
    atomic::{AtomicU64, Ordering},
    Mutex,
};
