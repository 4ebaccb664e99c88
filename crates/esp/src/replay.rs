//! The anti-replay window (RFC 4303 §3.4.3) and the inference of the high-order 32 bits of
//! extended sequence numbers (RFC 4303 Appendix A2.2), shared by all threads that open
//! packets of one inbound SA.
//!
//! # Use
//! [`ReplayWindow::check`] runs *before* decryption: it is read-only and cheap, and rejects
//! sequence numbers that are too old or already seen (RFC 4303 §3.4.3, "duplicates are
//! rejected ... before ICV verification"). [`ReplayWindow::update`] runs only *after* the ICV
//! verified ("the receive window is updated only if the integrity verification succeeds") and
//! is the only step that accepts a number: it decides atomically, so a sequence number is
//! accepted at most once even when several threads open copies of the same packet at once.
//!
//! # Structure
//! The window covers the `W` numbers `top - W + 1 ..= top`, where `top` is the highest number
//! accepted (or being accepted). Seen numbers are bits in a ring of `L` 64-bit words (`L` a
//! power of two, `L >= ceil(W / 64) + 1`, as the spare word of RFC 6479): number `s` is bit
//! `s % 64` of word `(s / 64) % L`, in *block* `s / 64`. `ready` is the highest block whose
//! word has been cleared for it; words for the blocks `ready - L + 1 ..= ready` are valid.
//!
//! - In-window update (`s / 64 <= ready`), lock-free: reject if `s <= top - W`; `fetch_or`
//!   the bit, reject if it was set; re-read `top` and reject if `s` has meanwhile become too
//!   old (see below); raise `top` with `fetch_max`; accept.
//! - Advancing update (`s / 64 > ready`): under a mutex, raise `top` to `s` *first*, then
//!   clear the words of blocks `ready + 1 ..= s / 64`, then publish `ready` (release), then
//!   continue as an in-window update. In-order traffic takes this path once per 64 packets.
//!
//! # Why a number is never accepted twice
//! Acceptance needs the thread's own `fetch_or` to flip the bit from 0 to 1. If two threads
//! X then Y both flipped the bit of `s`, a clear of that word came between them in the word's
//! modification order (bits are only ever cleared by advancing, never by the in-window path).
//! That clear recycled the word for a block `b >= s / 64 + L`, because the advancer read a
//! `ready >= s / 64` (X saw `s / 64 <= ready` before its flip, and `ready` only moves under
//! the mutex), so it raised `top` to at least `64 * b >= s + 64 * L - 63 > s + W - 1` before
//! clearing: `s` is too old for that `top`. Y's `fetch_or` (acquire) read the clear (release)
//! or a later read-modify-write of its release sequence, so Y's re-read of `top` sees the
//! raised value and Y rejects `s`. The same argument makes the bits of words of blocks at or
//! below `ready - L` irrelevant: such numbers are always too old for the `top` read after
//! `ready`.
//!
//! Only the advancer's raise of `top` takes part in this argument; the in-window path's
//! `fetch_max` merely keeps `top` at least every accepted number. Since every write to `top`
//! is a `fetch_max`, `top` never decreases, and the in-window `fetch_max` could be skipped
//! whenever the re-read already showed `top >= s` without touching the proof. We measured
//! that and kept the unconditional `fetch_max`: with two threads accepting interleaved
//! numbers of one SA, the skip made each update about 15-20 ns *slower* (AMD EPYC, KVM;
//! `examples/contention.rs` and a variant of it). The thread that is behind then never owns
//! the line of `top`, so each of its loads (in `check` and in `update`) misses behind the
//! other thread's writes, where its own `fetch_max` would have kept the line until the
//! other thread's next write.
//!
//! The mutex only serialises advances among themselves (two concurrent advances must not
//! clear words the other has already prepared). A thread that sets a bit in a word that is
//! being recycled (its number just became too old) can leave a stale bit in the new block:
//! that can only make one later number of the new block look like a duplicate (a drop, never
//! a double acceptance), and needs a packet about `W` behind to race an advance. So the exact
//! contract under concurrency is: no number is accepted twice; a number refused as
//! [`ReplayError::Replayed`] was accepted before, or was too old by the time of its refusal,
//! or shares its bit with an older number (`s - k * 64 * L`) that a racing update refused as
//! [`ReplayError::TooOld`]; numbers that all lie within `W` of each other are each accepted
//! exactly once (`replay/tests.rs` checks these on random interleavings).
//!
//! # Layout
//! `top`, `ready` and the advance mutex share cache lines of their own, written per packet
//! (`top`) or per 64 packets; the size, mask and ring pointer that every packet reads are
//! elsewhere, so writers do not invalidate them.

use crate::sync::{AtomicU64, CachePadded, Mutex, Ordering};

/// Why the window refused a sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplayError {
    /// Zero is never a valid sequence number (the first packet is 1, RFC 4303 §3.3.3), nor is
    /// an extended number whose high-order bits cannot be inferred (beyond 2^64 or below 0).
    Invalid,
    /// Below the window: at most `top - W`.
    TooOld {
        /// The highest sequence number accepted so far.
        top: u64,
    },
    /// Already accepted.
    Replayed,
}

/// An RFC 4303 §3.4.3 sliding window of `W` sequence numbers, safe to share between threads.
#[derive(Debug)]
pub struct ReplayWindow {
    size: u64,
    words: Box<[AtomicU64]>,
    mask: u64,
    hot: CachePadded<Hot>,
}

/// The window's position: written by the threads that accept numbers.
#[derive(Debug)]
struct Hot {
    /// The highest number accepted or being accepted.
    top: AtomicU64,
    /// The highest block whose ring word has been prepared.
    ready: AtomicU64,
    /// Serialises advances.
    advance: Mutex<()>,
}

const BITS: u64 = 64;

impl ReplayWindow {
    /// A window of `size` sequence numbers (callers validate the range; any size >= 1 is
    /// correct). Nothing has been received yet: `top` is 0.
    pub fn new(size: u32) -> Self {
        let size = u64::from(size.max(1));
        let words = (size.div_ceil(BITS) + 1).next_power_of_two();
        Self {
            size,
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            mask: words - 1,
            hot: CachePadded(Hot {
                top: AtomicU64::new(0),
                ready: AtomicU64::new(0),
                advance: Mutex::new(()),
            }),
        }
    }

    /// The window size `W`.
    pub fn size(&self) -> u32 {
        // Constructed from a u32.
        self.size as u32
    }

    /// The highest sequence number accepted (or being accepted) so far; 0 before the first.
    pub fn top(&self) -> u64 {
        self.hot.top.load(Ordering::Acquire)
    }

    /// Starts loading what [`update`](Self::update) of `seq` will read: the window's position
    /// and `seq`'s bitmap word (a CPU hint; see `wire::prefetch`).
    pub fn prefetch(&self, seq: u64) {
        wire::prefetch::prefetch(&*self.hot);
        wire::prefetch::line((self.word(seq) as *const AtomicU64).cast());
    }

    fn word(&self, seq: u64) -> &AtomicU64 {
        // `mask` is words.len() - 1, so the index is in range.
        &self.words[((seq / BITS) & self.mask) as usize]
    }

    fn too_old(&self, seq: u64, top: u64) -> bool {
        seq <= top.saturating_sub(self.size)
    }

    /// Pre-decryption check (RFC 4303 §3.4.3): `Ok` if `seq` may be new. Read-only; a later
    /// [`Self::update`] makes the final decision.
    pub fn check(&self, seq: u64) -> Result<(), ReplayError> {
        if seq == 0 {
            return Err(ReplayError::Invalid);
        }
        let top = self.hot.top.load(Ordering::Acquire);
        if seq > top {
            return Ok(());
        }
        if self.too_old(seq, top) {
            return Err(ReplayError::TooOld { top });
        }
        if seq / BITS > self.hot.ready.load(Ordering::Acquire) {
            // Its block is being prepared right now: nothing in it has been accepted.
            return Ok(());
        }
        if self.word(seq).load(Ordering::Acquire) & (1 << (seq % BITS)) != 0 {
            return Err(ReplayError::Replayed);
        }
        Ok(())
    }

    /// Post-verification update: accepts `seq` exactly once. Call only after the packet's
    /// ICV verified. Returns how far `seq` lay below the highest number accepted when it was
    /// accepted: 0 if it is (or became) the highest, `top - seq` for a packet that arrived
    /// behind a later one (the reordering the window absorbed; always below `W`).
    pub fn update(&self, seq: u64) -> Result<u64, ReplayError> {
        if seq == 0 {
            return Err(ReplayError::Invalid);
        }
        let block = seq / BITS;
        loop {
            let ready = self.hot.ready.load(Ordering::Acquire);
            if block > ready {
                self.advance_to(seq);
                continue;
            }
            let top = self.hot.top.load(Ordering::Acquire);
            if self.too_old(seq, top) {
                return Err(ReplayError::TooOld { top });
            }
            let bit = 1 << (seq % BITS);
            if self.word(seq).fetch_or(bit, Ordering::AcqRel) & bit != 0 {
                return Err(ReplayError::Replayed);
            }
            // The word may have been recycled between our range check and our fetch_or; the
            // recycler raised `top` before clearing (module docs), so this re-read sees it.
            let top = self.hot.top.load(Ordering::Acquire);
            if self.too_old(seq, top) {
                return Err(ReplayError::TooOld { top });
            }
            self.hot.top.fetch_max(seq, Ordering::AcqRel);
            // Measured against the `top` that admitted `seq`, so it stays below `W` even if
            // an advance overtook this update since.
            return Ok(top.saturating_sub(seq));
        }
    }

    /// Slides the window so that `seq`'s block is prepared.
    fn advance_to(&self, seq: u64) {
        // The guarded data are the atomics; a panic while holding the lock leaves them
        // consistent (every step is a single atomic store), so poisoning is ignored.
        let _guard = self.hot.advance.lock().unwrap_or_else(|e| e.into_inner());
        let ready = self.hot.ready.load(Ordering::Acquire);
        let block = seq / BITS;
        if block <= ready {
            return;
        }
        // Announce the new top before recycling any word (see "Why a number is never
        // accepted twice").
        self.hot.top.fetch_max(seq, Ordering::AcqRel);
        let n = (block - ready).min(self.mask + 1);
        for b in block + 1 - n..=block {
            // An RMW rather than a plain store: every write to a word then extends the
            // release sequence the in-window path acquires, and the loom model checker
            // (whose plain stores can slip inside a concurrent RMW, tokio-rs/loom#254) sees
            // the same semantics as the hardware. Costs one locked op per 64 packets.
            self.words[(b & self.mask) as usize].fetch_and(0, Ordering::Release);
        }
        self.hot.ready.store(block, Ordering::Release);
    }

    /// Infers the full 64-bit sequence number of a packet that carries only its low-order
    /// 32 bits (RFC 4303 Appendix A2.2), relative to the current window. `None` if the
    /// result would lie below 1 or beyond 2^64 - 1.
    pub fn infer_esn(&self, seq_low: u32) -> Option<u64> {
        let top = self.hot.top.load(Ordering::Acquire);
        let (tl, th) = (top as u32, (top >> 32) as u32);
        // W <= 2^16 (validated by the SA), so it fits the 32-bit subspace arithmetic.
        let w = self.size as u32;
        let bottom = tl.wrapping_sub(w - 1);
        let high = if tl >= w - 1 {
            // Case A: the window lies within one 2^32 subspace.
            if seq_low >= bottom {
                th
            } else {
                th.checked_add(1)?
            }
        } else if seq_low >= bottom {
            // Case B: the window spans two subspaces and this number is in the lower one.
            th.checked_sub(1)?
        } else {
            th
        };
        let full = (u64::from(high) << 32) | u64::from(seq_low);
        (full != 0).then_some(full)
    }
}

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_tests;
