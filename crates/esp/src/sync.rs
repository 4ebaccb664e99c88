//! The synchronisation primitives of the sequence counter and the replay window: std's, or
//! loom's when built with `--cfg loom` so the model checker can explore every interleaving;
//! and [`CachePadded`], which keeps a value that one core writes per packet off the cache
//! lines other cores read.

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

/// A value on cache lines of its own: 128 bytes, because x86 prefetches 64-byte lines in
/// adjacent pairs and some ARM cores have 128-byte lines (the choice of crossbeam-utils).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}
