//! The kernel helpers a tenant program may call (issue 18 §3), with the kernel's semantics
//! and argument checks.
//!
//! rbpf calls a helper as a plain `fn(u64, u64, u64, u64, u64) -> u64` without context, so
//! the run's state (maps, frame, worker, clock, RNG) is reached through a thread-local
//! pointer that [`Running`] sets for the length of one run. The verifier proved the
//! arguments' types; the helpers check them again, so that even a wrong proof or a bad
//! argument never lets a helper read or write outside the run's frame, maps and stack: a
//! pointer argument must lie in the packet (`[data, data_end)`), in the program's stack
//! (the 512 bytes below the r10 the lowered program stored in the context) or in one of
//! the program's map values; otherwise the helper returns `-EINVAL` (or NULL for a lookup).

use super::frame::ETH_HLEN;
use super::maps::Map;
use crate::lower::CTX_STACK_SLOT;
use rand_core::RngCore;
use std::cell::Cell;

const EINVAL: i64 = -22;
const EFAULT: i64 = -14;

/// The state of one run, reached by the helpers.
pub(crate) struct RunState<'a> {
    pub(crate) maps: &'a [std::sync::Arc<Map>],
    pub(crate) worker: usize,
    pub(crate) now_ns: u64,
    pub(crate) rng: &'a mut rand_chacha::ChaCha8Rng,
    /// The context buffer's address (r1 at entry).
    pub(crate) ctx: u64,
    /// The packet area: the headroom's start and the tailroom's end.
    pub(crate) area: (u64, u64),
    /// The packet, as the helpers move it.
    pub(crate) data: u64,
    pub(crate) data_end: u64,
}

/// Bytes copied out of the program's memory without allocating up to this length (keys and
/// most values; the helpers run once or more per packet).
const SMALL: usize = 64;

/// Bytes a helper copied out of the program's memory.
struct Copied {
    small: [u8; SMALL],
    big: Vec<u8>,
    len: usize,
}

impl std::ops::Deref for Copied {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        if self.len <= SMALL {
            &self.small[..self.len]
        } else {
            &self.big
        }
    }
}

thread_local! {
    static CURRENT: Cell<*mut RunState<'static>> = const { Cell::new(std::ptr::null_mut()) };
}

/// Makes `state` the helpers' state until dropped.
pub(crate) struct Running<'s, 'a> {
    _state: std::marker::PhantomData<&'s mut RunState<'a>>,
    previous: *mut RunState<'static>,
}

impl<'s, 'a> Running<'s, 'a> {
    pub(crate) fn new(state: &'s mut RunState<'a>) -> Self {
        let ptr = (state as *mut RunState<'a>).cast::<RunState<'static>>();
        let previous = CURRENT.with(|c| c.replace(ptr));
        Self {
            _state: std::marker::PhantomData,
            previous,
        }
    }
}

impl Drop for Running<'_, '_> {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.previous));
    }
}

/// Runs `f` on the current run's state; `None` outside a run.
fn with_state<R>(f: impl FnOnce(&mut RunState<'_>) -> R) -> Option<R> {
    let ptr = CURRENT.with(Cell::get);
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `Running` set the pointer from a `&mut RunState` that outlives it and clears
    // it on drop; the program runs on this thread only while `Running` lives, and the
    // helpers do not nest.
    Some(f(unsafe { &mut *ptr }))
}

fn ret(v: i64) -> u64 {
    v as u64
}

impl RunState<'_> {
    /// The program's stack, from the r10 the lowered program stored in the context.
    fn stack(&self) -> (u64, u64) {
        // SAFETY: the context buffer is 32 bytes at `ctx` (frame.rs); the word at 24 is
        // written by the lowered program's first instruction.
        let top = unsafe { ((self.ctx + CTX_STACK_SLOT as u64) as *const u64).read_unaligned() };
        (top.saturating_sub(crate::run::STACK_BYTES), top)
    }

    /// Whether the program may hand `[addr, addr + len)` to a helper for reading.
    fn readable(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        if len == 0 {
            return true;
        }
        let inside = |(lo, hi): (u64, u64)| lo <= addr && end <= hi;
        inside((self.data, self.data_end))
            || inside(self.stack())
            || self.maps.iter().any(|m| m.contains(self.worker, addr, len))
    }

    /// Copies `len` bytes the program handed over, after [`RunState::readable`].
    fn bytes(&self, addr: u64, len: usize) -> Option<Copied> {
        if !self.readable(addr, len as u64) {
            return None;
        }
        let mut c = Copied {
            small: [0; SMALL],
            big: Vec::new(),
            len,
        };
        let dst = if len <= SMALL {
            c.small.as_mut_ptr()
        } else {
            c.big = vec![0; len];
            c.big.as_mut_ptr()
        };
        // SAFETY: the range is inside the packet, the stack or a map value (checked above),
        // and `dst` has room for `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst, len) };
        Some(c)
    }

    fn map(&self, handle: u64) -> Option<&std::sync::Arc<Map>> {
        let i = usize::try_from(handle).ok()?.checked_sub(1)?;
        self.maps.get(i)
    }

    fn key(&self, map: &Map, addr: u64) -> Option<Copied> {
        self.bytes(addr, map.spec().key_size as usize)
    }

    /// Writes the packet bounds into the context (`data`, `data_end`, `data_meta`).
    fn publish_bounds(&self) {
        let words = [self.data as u32, self.data_end as u32, self.data as u32];
        for (i, w) in words.into_iter().enumerate() {
            // SAFETY: the first 12 bytes of the 32-byte context buffer.
            unsafe { ((self.ctx + 4 * i as u64) as *mut u32).write_unaligned(w) };
        }
    }
}

/// `void *bpf_map_lookup_elem(map, key)` (1).
extern "C" fn map_lookup_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| {
        let Some(m) = s.map(map) else { return 0 };
        let Some(k) = s.key(m, key) else { return 0 };
        m.lookup_for(s.worker, &k).map_or(0, |p| p as u64)
    })
    .unwrap_or(0)
}

/// `long bpf_map_update_elem(map, key, value, flags)` (2).
extern "C" fn map_update_elem(map: u64, key: u64, value: u64, flags: u64, _: u64) -> u64 {
    with_state(|s| {
        let Some(m) = s.map(map) else {
            return ret(EINVAL);
        };
        let Some(k) = s.key(m, key) else {
            return ret(EFAULT);
        };
        let Some(v) = s.bytes(value, m.spec().value_size as usize) else {
            return ret(EFAULT);
        };
        match m.update_for(s.worker, &k, &v, flags) {
            Ok(()) => 0,
            Err(e) => ret(e.errno()),
        }
    })
    .unwrap_or(ret(EINVAL))
}

/// `long bpf_map_delete_elem(map, key)` (3).
extern "C" fn map_delete_elem(map: u64, key: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| {
        let Some(m) = s.map(map) else {
            return ret(EINVAL);
        };
        let Some(k) = s.key(m, key) else {
            return ret(EFAULT);
        };
        match m.delete(&k) {
            Ok(()) => 0,
            Err(e) => ret(e.errno()),
        }
    })
    .unwrap_or(ret(EINVAL))
}

/// `u64 bpf_ktime_get_ns(void)` (5): the time the runtime was given for the batch.
extern "C" fn ktime_get_ns(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| s.now_ns).unwrap_or(0)
}

/// `u32 bpf_get_prandom_u32(void)` (7): the worker's ChaCha8 stream.
extern "C" fn get_prandom_u32(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| u64::from(s.rng.next_u32())).unwrap_or(0)
}

/// `s64 bpf_csum_diff(from, from_size, to, to_size, seed)` (28): the one's-complement sum of
/// the complement of `from`'s 32-bit words, `to`'s words and `seed`, as a 32-bit partial
/// checksum (the kernel's `csum_partial`, equal to it once folded to 16 bits). Sizes must be
/// multiples of 4 and together at most 512 bytes.
extern "C" fn csum_diff(from: u64, from_size: u64, to: u64, to_size: u64, seed: u64) -> u64 {
    with_state(|s| {
        let (fs, ts) = (from_size as u32, to_size as u32);
        if (fs | ts) % 4 != 0 || u64::from(fs) + u64::from(ts) > 512 {
            return ret(EINVAL);
        }
        let (Some(f), Some(t)) = (s.bytes(from, fs as usize), s.bytes(to, ts as usize)) else {
            return ret(EFAULT);
        };
        let word = |c: &[u8]| u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]]));
        let mut sum = u64::from(seed as u32);
        sum += f
            .chunks_exact(4)
            .map(|c| word(c) ^ 0xffff_ffff)
            .sum::<u64>();
        sum += t.chunks_exact(4).map(word).sum::<u64>();
        while sum >> 32 != 0 {
            sum = (sum & 0xffff_ffff) + (sum >> 32);
        }
        sum
    })
    .unwrap_or(ret(EINVAL))
}

/// `long bpf_xdp_adjust_head(ctx, delta)` (44): moves `data` by `delta` within the headroom's
/// start and 14 bytes (an Ethernet header) before `data_end`; bytes the headroom gives up are
/// zeroed (unlike the kernel, which leaves what the page held).
extern "C" fn xdp_adjust_head(ctx: u64, delta: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| {
        let delta = i64::from(delta as i32);
        let new = s.data as i64 + delta;
        if ctx != s.ctx || new < s.area.0 as i64 || new > s.data_end as i64 - ETH_HLEN as i64 {
            return ret(EINVAL);
        }
        if new < s.data as i64 {
            // Bytes the headroom gives up are zeroed: they may hold an earlier packet's.
            // SAFETY: [new, data) lies inside the packet area (checked above).
            unsafe { std::ptr::write_bytes(new as *mut u8, 0, (s.data - new as u64) as usize) };
        }
        s.data = new as u64;
        s.publish_bounds();
        0
    })
    .unwrap_or(ret(EINVAL))
}

/// `long bpf_xdp_adjust_tail(ctx, delta)` (65): moves `data_end` by `delta` within 14 bytes
/// after `data` and the tailroom's end; grown bytes are zeroed, as the kernel does.
extern "C" fn xdp_adjust_tail(ctx: u64, delta: u64, _: u64, _: u64, _: u64) -> u64 {
    with_state(|s| {
        let delta = i64::from(delta as i32);
        let new = s.data_end as i64 + delta;
        if ctx != s.ctx || new > s.area.1 as i64 || new < s.data as i64 + ETH_HLEN as i64 {
            return ret(EINVAL);
        }
        if new > s.data_end as i64 {
            // SAFETY: [data_end, new) lies inside the packet area (checked above).
            unsafe {
                std::ptr::write_bytes(s.data_end as *mut u8, 0, (new as u64 - s.data_end) as usize)
            };
        }
        s.data_end = new as u64;
        s.publish_bounds();
        0
    })
    .unwrap_or(ret(EINVAL))
}

/// A helper as rbpf's JIT calls it: a trampoline that aligns the stack to 16 bytes first.
///
/// rbpf 0.4.1's JIT calls helpers with the stack 8 bytes off the System V alignment (five
/// pushes, the 512-byte frame and its own return address: seen as a crash in `malloc`'s
/// aligned SSE stores); the trampoline keeps the argument registers, realigns, calls the
/// helper and restores the stack pointer.
macro_rules! aligned {
    ($name:ident => $target:path) => {
        #[unsafe(naked)]
        extern "C" fn $name(_: u64, _: u64, _: u64, _: u64, _: u64) -> u64 {
            core::arch::naked_asm!(
                "push rbp",
                "mov rbp, rsp",
                "and rsp, -16",
                "call {f}",
                "mov rsp, rbp",
                "pop rbp",
                "ret",
                f = sym $target,
            )
        }
    };
}

/// A helper as rbpf's interpreter calls it (Rust to Rust, aligned).
macro_rules! direct {
    ($name:ident => $target:path) => {
        fn $name(a: u64, b: u64, c: u64, d: u64, e: u64) -> u64 {
            $target(a, b, c, d, e)
        }
    };
}

macro_rules! helpers {
    ($(($id:literal, $f:ident, $jit:ident, $interp:ident)),* $(,)?) => {
        $( aligned!($jit => $f); direct!($interp => $f); )*

        /// The helpers by kernel number, as rbpf's JIT calls them (System V calls through
        /// stack-aligning trampolines).
        pub(crate) fn for_jit() -> [(u32, rbpf::Helper); 8] {
            // SAFETY: rbpf's JIT calls a helper's address with the System V convention
            // (arguments in rdi, rsi, rdx, rcx, r8; result in rax), which is the trampolines'
            // `extern "C"`; the `fn` type is only how rbpf stores the address.
            [$(($id, unsafe {
                std::mem::transmute::<extern "C" fn(u64, u64, u64, u64, u64) -> u64, rbpf::Helper>($jit)
            })),*]
        }

        /// The helpers by kernel number, as rbpf's interpreter calls them.
        pub(crate) fn for_interpreter() -> [(u32, rbpf::Helper); 8] {
            [$(($id, $interp as rbpf::Helper)),*]
        }
    };
}

helpers!(
    (1, map_lookup_elem, jit_map_lookup_elem, int_map_lookup_elem),
    (2, map_update_elem, jit_map_update_elem, int_map_update_elem),
    (3, map_delete_elem, jit_map_delete_elem, int_map_delete_elem),
    (5, ktime_get_ns, jit_ktime_get_ns, int_ktime_get_ns),
    (7, get_prandom_u32, jit_get_prandom_u32, int_get_prandom_u32),
    (28, csum_diff, jit_csum_diff, int_csum_diff),
    (
        44,
        xdp_adjust_head,
        jit_xdp_adjust_head,
        int_xdp_adjust_head
    ),
    (
        65,
        xdp_adjust_tail,
        jit_xdp_adjust_tail,
        int_xdp_adjust_tail
    ),
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::FrameBuf;
    use crate::{MapKind, MapSpec};
    use rand_core::SeedableRng;
    use std::sync::Arc;

    /// Runs `f` inside a run over a 40-byte packet, a 4-byte-key hash map and a fake stack.
    fn with_run(f: impl FnOnce(&mut FrameBuf, &[u8; 512])) {
        let spec = MapSpec {
            name: "h".into(),
            kind: MapKind::Hash,
            key_size: 4,
            value_size: 8,
            max_entries: 4,
            flags: 0,
        };
        let maps = vec![Arc::new(Map::new(&spec, 1).expect("map"))];
        let mut frame = FrameBuf::new(1500).expect("frame");
        frame.load_ip(&[0x45; 40]).expect("fits");
        frame.write_ctx(0, 0, 0);
        let stack = [7u8; 512];
        let top = stack.as_ptr() as u64 + 512;
        // SAFETY: the context's stack-pointer word, as the lowered program writes it.
        unsafe { ((frame.ctx_addr() + 24) as *mut u64).write_unaligned(top) };
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let (data, data_end) = frame.data_addrs();
        let mut state = RunState {
            maps: &maps,
            worker: 0,
            now_ns: 42,
            rng: &mut rng,
            ctx: frame.ctx_addr(),
            area: (frame.area_start(), frame.area_end()),
            data,
            data_end,
        };
        let _running = Running::new(&mut state);
        f(&mut frame, &stack);
    }

    #[test]
    fn helpers_refuse_pointers_outside_the_packet_stack_and_maps() {
        with_run(|frame, stack| {
            let key = stack.as_ptr() as u64 + 100;
            let value = stack.as_ptr() as u64 + 200;
            let (data, end) = frame.data_addrs();
            let outside = [0u8; 16];
            let outside = outside.as_ptr() as u64;
            assert_eq!(map_update_elem(1, key, value, 0, 0), 0);
            assert_ne!(map_lookup_elem(1, key, 0, 0, 0), 0);
            // Unknown handles, keys or values outside, a key straddling the packet's end.
            assert_eq!(map_lookup_elem(0, key, 0, 0, 0), 0);
            assert_eq!(map_lookup_elem(2, key, 0, 0, 0), 0);
            assert_eq!(map_lookup_elem(1, outside, 0, 0, 0), 0);
            assert_eq!(map_lookup_elem(1, end - 2, 0, 0, 0), 0);
            assert_eq!(map_update_elem(1, key, outside, 0, 0) as i64, EFAULT);
            assert_eq!(map_update_elem(1, key, value, 7, 0) as i64, EINVAL);
            assert_eq!(map_delete_elem(1, u64::MAX - 1, 0, 0, 0) as i64, EFAULT);
            // A map value is readable as a key (its first bytes are the key's: 7 7 7 7).
            let v = map_lookup_elem(1, key, 0, 0, 0);
            assert_eq!(map_lookup_elem(1, v, 0, 0, 0), v);
            // csum_diff: sizes multiples of 4, at most 512 together, ranges checked.
            assert_eq!(csum_diff(data, 3, data, 4, 0) as i64, EINVAL);
            assert_eq!(csum_diff(data, 260, data, 256, 0) as i64, EINVAL);
            assert_eq!(csum_diff(outside, 4, data, 4, 0) as i64, EFAULT);
            let ip = data + 14;
            assert_eq!(
                csum_diff(0, 0, ip, 4, 0),
                u64::from(u32::from_ne_bytes([0x45; 4]))
            );
            // Adjusting with another context.
            assert_eq!(
                xdp_adjust_head(frame.ctx_addr() + 8, 0, 0, 0, 0) as i64,
                EINVAL
            );
            assert_eq!(xdp_adjust_tail(0, 0, 0, 0, 0) as i64, EINVAL);
            assert_eq!(ktime_get_ns(0, 0, 0, 0, 0), 42);
        });
        // Outside a run every helper fails closed.
        assert_eq!(map_lookup_elem(1, 0, 0, 0, 0), 0);
        assert_eq!(ktime_get_ns(0, 0, 0, 0, 0), 0);
        assert_eq!(xdp_adjust_head(0, 0, 0, 0, 0) as i64, EINVAL);
    }

    #[test]
    fn csum_diff_is_a_ones_complement_sum_with_end_around_carry() {
        with_run(|frame, _| {
            // The IP packet's bytes, all 0x45, after the 14-byte Ethernet header.
            let data = frame.data_addrs().0 + 14;
            let x = u64::from(u32::from_ne_bytes([0x45; 4]));
            assert_eq!(csum_diff(0, 0, data, 8, 0), 2 * x);
            // Removing and adding the same word: all ones; one more wraps around to 1.
            assert_eq!(csum_diff(data, 4, data, 4, 0), 0xffff_ffff);
            assert_eq!(csum_diff(data, 4, data, 4, 1), 1);
        });
    }
}
