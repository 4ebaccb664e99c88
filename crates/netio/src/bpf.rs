//! The few `bpf(2)` commands Protego's own programs need: create a map, update and delete
//! an element, load a socket filter (the data plane's kernel gate of CPU fairness,
//! `dataplane/src/sys/gate.rs`) or an XDP program (the AF_XDP steering, [`crate::xdp`]),
//! attach an XDP program through a link, and map an array's values into memory. Written here
//! over `libc` rather than with `aya` (which the filter crate uses to *parse* tenants'
//! objects): aya loads programs only from ELF objects, which would put a BPF compiler into
//! the gateway's own build for programs of a few dozen instructions, assembled with [`Insn`].

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// `bpf_cmd` values.
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_PROG_LOAD: libc::c_long = 5;

/// `BPF_MAP_TYPE_HASH`.
pub const MAP_HASH: u32 = 1;
/// `BPF_MAP_TYPE_ARRAY`.
pub const MAP_ARRAY: u32 = 2;
/// Map flags: allocate hash elements on insert, not all at creation.
pub const F_NO_PREALLOC: u32 = 1;
/// Map flags: the array's values can be mapped into memory (`mmap`).
pub const F_MMAPABLE: u32 = 1 << 10;
/// `BPF_MAP_TYPE_XSKMAP`: AF_XDP sockets by index, for `bpf_redirect_map`.
pub const MAP_XSK: u32 = 17;
/// `BPF_PROG_TYPE_SOCKET_FILTER`.
const PROG_SOCKET_FILTER: u32 = 1;
/// `BPF_PROG_TYPE_XDP`.
const PROG_XDP: u32 = 6;
/// `BPF_XDP`, the attach type of an XDP program's link.
const ATTACH_XDP: u32 = 37;
/// `BPF_F_XDP_HAS_FRAGS`: the program takes frames of several buffers (jumbo frames).
const F_XDP_HAS_FRAGS: u32 = 1 << 5;
/// `BPF_LINK_CREATE`.
const BPF_LINK_CREATE: libc::c_long = 28;
/// `SO_ATTACH_BPF` (not in every libc).
const SO_ATTACH_BPF: libc::c_int = 50;

/// The attribute union is 128 bytes in every kernel this runs on; the kernel checks that
/// the bytes past what it knows are zero.
#[repr(C, align(8))]
struct Attr([u8; 128]);

impl Attr {
    fn new() -> Self {
        Self([0; 128])
    }

    fn u32(&mut self, at: usize, v: u32) -> &mut Self {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
        self
    }

    fn u64(&mut self, at: usize, v: u64) -> &mut Self {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
        self
    }

    fn name(&mut self, at: usize, name: &str) -> &mut Self {
        let n = name.len().min(15);
        self.0[at..at + n].copy_from_slice(&name.as_bytes()[..n]);
        self
    }

    /// Runs command `cmd` with these attributes.
    fn call(&mut self, cmd: libc::c_long) -> io::Result<libc::c_long> {
        // SAFETY: the attributes are a valid, zero-padded `union bpf_attr` of the size
        // passed; every pointer in them points to memory alive for the call.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                cmd,
                self.0.as_mut_ptr(),
                std::mem::size_of::<Attr>() as libc::c_uint,
            )
        };
        if ret < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(ret)
        }
    }

    /// Runs a command that returns a new descriptor.
    fn call_fd(&mut self, cmd: libc::c_long) -> io::Result<OwnedFd> {
        let fd = self.call(cmd)?;
        let fd = RawFd::try_from(fd).map_err(|_| io::Error::other("descriptor out of range"))?;
        // SAFETY: the kernel returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// A map: `(type, key size, value size, max entries, flags)`, named `name` (15 bytes shown).
pub fn map_create(
    kind: u32,
    key: u32,
    value: u32,
    max_entries: u32,
    flags: u32,
    name: &str,
) -> io::Result<OwnedFd> {
    Attr::new()
        .u32(0, kind)
        .u32(4, key)
        .u32(8, value)
        .u32(12, max_entries)
        .u32(16, flags)
        .name(28, name)
        .call_fd(BPF_MAP_CREATE)
}

fn elem(map: &OwnedFd, key: &[u8], value: u64, flags: u64, cmd: libc::c_long) -> io::Result<()> {
    Attr::new()
        .u32(0, map.as_raw_fd() as u32)
        .u64(8, key.as_ptr() as u64)
        .u64(16, value)
        .u64(24, flags)
        .call(cmd)
        .map(drop)
}

/// Sets `key`'s value (created or replaced).
pub fn map_update(map: &OwnedFd, key: &[u8], value: &[u8]) -> io::Result<()> {
    elem(map, key, value.as_ptr() as u64, 0, BPF_MAP_UPDATE_ELEM)
}

/// Deletes `key` (an error `ENOENT` if it is not there).
pub fn map_delete(map: &OwnedFd, key: &[u8]) -> io::Result<()> {
    elem(map, key, 0, 0, BPF_MAP_DELETE_ELEM)
}

/// Loads `insns` as a socket filter; a refusal carries the end of the verifier's log.
pub fn prog_load_socket_filter(insns: &[Insn], name: &str) -> io::Result<OwnedFd> {
    prog_load(PROG_SOCKET_FILTER, 0, 0, insns, name)
}

/// Loads `insns` as an XDP program that takes multi-buffer frames (`BPF_F_XDP_HAS_FRAGS`), to
/// be attached with [`link_create_xdp`]; a refusal carries the end of the verifier's log.
pub fn prog_load_xdp(insns: &[Insn], name: &str) -> io::Result<OwnedFd> {
    prog_load(PROG_XDP, F_XDP_HAS_FRAGS, ATTACH_XDP, insns, name)
}

/// Attaches XDP program `prog` to interface `ifindex` with `XDP_FLAGS_*` `flags` through a
/// BPF link: the program stays attached while the returned descriptor is open, so it goes
/// when the process ends however it ends. An interface with an XDP program already refuses
/// (`EBUSY`).
pub fn link_create_xdp(prog: &OwnedFd, ifindex: u32, flags: u32) -> io::Result<OwnedFd> {
    Attr::new()
        .u32(0, prog.as_raw_fd() as u32)
        .u32(4, ifindex)
        .u32(8, ATTACH_XDP)
        .u32(12, flags)
        .call_fd(BPF_LINK_CREATE)
}

fn prog_load(
    kind: u32,
    flags: u32,
    expected_attach: u32,
    insns: &[Insn],
    name: &str,
) -> io::Result<OwnedFd> {
    let insn_cnt = u32::try_from(insns.len()).map_err(|_| io::Error::other("program too long"))?;
    let load = |log: &mut [u8]| {
        let license = c"GPL";
        let mut a = Attr::new();
        a.u32(0, kind)
            .u32(4, insn_cnt)
            .u64(8, insns.as_ptr() as u64)
            .u64(16, license.as_ptr() as u64)
            .u32(44, flags)
            .name(48, name)
            .u32(68, expected_attach);
        if !log.is_empty() {
            // Level 1: the instructions the verifier walked, ending with why it refused.
            // A buffer too small for the whole walk fails the load (ENOSPC) even when the
            // program is fine, hence the first load without it.
            a.u32(24, 1)
                .u32(28, log.len() as u32)
                .u64(32, log.as_mut_ptr() as u64);
        }
        a.call_fd(BPF_PROG_LOAD)
    };
    // Without a log first; the log is asked for only to say why it was refused.
    load(&mut []).or_else(|e| {
        let mut log = vec![0u8; 1 << 20];
        match load(&mut log) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let text = String::from_utf8_lossy(&log[..end]);
                let tail: Vec<&str> = text.lines().rev().take(6).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                Err(io::Error::new(
                    e.kind(),
                    format!("{e}; verifier: {}", tail.join(" | ")),
                ))
            }
        }
    })
}

/// Attaches program `prog` to socket `sock` as its filter (replacing any other).
pub fn attach_socket(sock: RawFd, prog: &OwnedFd) -> io::Result<()> {
    let fd: libc::c_int = prog.as_raw_fd();
    // SAFETY: `fd` is a valid c_int for the option's length.
    crate::cvt(unsafe {
        libc::setsockopt(
            sock,
            libc::SOL_SOCKET,
            SO_ATTACH_BPF,
            std::ptr::from_ref(&fd).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// An array map's values mapped into memory (the map created with [`F_MMAPABLE`]), as
/// 64-bit words shared with the kernel's programs.
pub struct MappedArray {
    ptr: std::ptr::NonNull<std::sync::atomic::AtomicU64>,
    words: usize,
    len: usize,
}

// SAFETY: the mapping is shared memory of atomics, valid until drop.
unsafe impl Send for MappedArray {}
// SAFETY: as above; every access is atomic.
unsafe impl Sync for MappedArray {}

impl MappedArray {
    /// Maps the `words` 8-byte values of array `map`.
    pub fn new(map: &OwnedFd, words: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
        let len = (words * 8).div_ceil(page) * page;
        // SAFETY: a shared mapping of the map's descriptor, of a length the map covers.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap"))?;
        Ok(Self { ptr, words, len })
    }

    /// Value `i` (None beyond the array).
    pub fn get(&self, i: usize) -> Option<&std::sync::atomic::AtomicU64> {
        // SAFETY: `i` is inside the mapping, which is 8-byte aligned (page aligned) and lives
        // as long as `self`.
        (i < self.words).then(|| unsafe { &*self.ptr.as_ptr().add(i) })
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// One eBPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

/// Register 0: return value.
pub const R0: u8 = 0;
/// Register 1: first argument (the context at entry).
pub const R1: u8 = 1;
/// Register 2: second argument.
pub const R2: u8 = 2;
/// Register 3: third argument.
pub const R3: u8 = 3;
/// Register 4: fourth argument.
pub const R4: u8 = 4;
/// Register 5: fifth argument.
pub const R5: u8 = 5;
/// Register 6: kept across calls.
pub const R6: u8 = 6;
/// Register 7: kept across calls.
pub const R7: u8 = 7;
/// Register 8: kept across calls.
pub const R8: u8 = 8;
/// Register 9: kept across calls.
pub const R9: u8 = 9;
/// Register 10: the frame pointer (read-only).
pub const R10: u8 = 10;

impl Insn {
    /// Any instruction: opcode `code`, registers `dst` and `src`, offset and immediate.
    pub const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Self {
        Self {
            code,
            regs: (src << 4) | (dst & 0xf),
            off,
            imm,
        }
    }

    /// Its opcode.
    pub fn code(&self) -> u8 {
        self.code
    }

    /// Its source register.
    pub fn src(&self) -> u8 {
        self.regs >> 4
    }

    /// Its offset.
    pub fn off(&self) -> i16 {
        self.off
    }

    /// Its immediate.
    pub fn imm(&self) -> i32 {
        self.imm
    }

    /// The same instruction with offset `off` (a jump's target, fixed up after assembly).
    pub const fn with_off(self, off: i16) -> Self {
        Self { off, ..self }
    }

    /// `dst = src` (64 bits).
    pub const fn mov(dst: u8, src: u8) -> Self {
        Self::new(0xbf, dst, src, 0, 0)
    }

    /// `dst = imm` (64 bits, sign-extended).
    pub const fn mov_imm(dst: u8, imm: i32) -> Self {
        Self::new(0xb7, dst, 0, 0, imm)
    }

    /// `dst += imm` (64 bits).
    pub const fn add_imm(dst: u8, imm: i32) -> Self {
        Self::new(0x07, dst, 0, 0, imm)
    }

    /// `dst >>= imm` (32 bits; the upper half cleared).
    pub const fn rsh32_imm(dst: u8, imm: i32) -> Self {
        Self::new(0x74, dst, 0, 0, imm)
    }

    /// `dst = *(u32 *)(src + off)`.
    pub const fn load32(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0x61, dst, src, off, 0)
    }

    /// `dst = *(u64 *)(src + off)`.
    pub const fn load64(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0x79, dst, src, off, 0)
    }

    /// `*(u32 *)(dst + off) = src`.
    pub const fn store32(dst: u8, off: i16, src: u8) -> Self {
        Self::new(0x63, dst, src, off, 0)
    }

    /// `lock *(u64 *)(dst + off) += src`.
    pub const fn atomic_add64(dst: u8, off: i16, src: u8) -> Self {
        Self::new(0xdb, dst, src, off, 0)
    }

    /// `src = atomic_fetch_add((u64 *)(dst + off), src)`: the old value into `src`.
    pub const fn atomic_fetch_add64(dst: u8, off: i16, src: u8) -> Self {
        // BPF_ADD | BPF_FETCH.
        Self::new(0xdb, dst, src, off, 0x01)
    }

    /// `dst -= src` (64 bits).
    pub const fn sub(dst: u8, src: u8) -> Self {
        Self::new(0x1f, dst, src, 0, 0)
    }

    /// `if (s64)dst >= (s64)src goto +off`.
    pub const fn jsge(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0x7d, dst, src, off, 0)
    }

    /// `r0 = ntohl(*(u32 *)(skb->data + imm))`, the packet's bytes from the start of what the
    /// socket filter sees (`r6` holds the context); a read past the end ends the program
    /// with 0.
    pub const fn load_abs32(imm: i32) -> Self {
        Self::new(0x20, 0, 0, 0, imm)
    }

    /// `r0 = ntohl(*(u32 *)(skb->data + src + imm))`, as [`load_abs32`](Self::load_abs32)
    /// at an offset in register `src`.
    pub const fn load_ind32(src: u8, imm: i32) -> Self {
        Self::new(0x40, 0, src, 0, imm)
    }

    /// `dst += src` (64 bits).
    pub const fn add(dst: u8, src: u8) -> Self {
        Self::new(0x0f, dst, src, 0, 0)
    }

    /// `if dst > src goto +off` (unsigned).
    pub const fn jgt(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0x2d, dst, src, off, 0)
    }

    /// `goto +off`.
    pub const fn ja(off: i16) -> Self {
        Self::new(0x05, 0, 0, off, 0)
    }

    /// `if dst == imm goto +off`.
    pub const fn jeq_imm(dst: u8, imm: i32, off: i16) -> Self {
        Self::new(0x15, dst, 0, off, imm)
    }

    /// `if dst != src goto +off`.
    pub const fn jne(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0x5d, dst, src, off, 0)
    }

    /// `if dst < imm goto +off` (unsigned).
    pub const fn jlt_imm(dst: u8, imm: i32, off: i16) -> Self {
        Self::new(0xa5, dst, 0, off, imm)
    }

    /// `if dst <= src goto +off` (unsigned).
    pub const fn jle(dst: u8, src: u8, off: i16) -> Self {
        Self::new(0xbd, dst, src, off, 0)
    }

    /// `if dst > imm goto +off` (unsigned).
    pub const fn jgt_imm(dst: u8, imm: i32, off: i16) -> Self {
        Self::new(0x25, dst, 0, off, imm)
    }

    /// Helper call `id`.
    pub const fn call(id: i32) -> Self {
        Self::new(0x85, 0, 0, 0, id)
    }

    /// `exit`.
    pub const fn exit() -> Self {
        Self::new(0x95, 0, 0, 0, 0)
    }

    /// `dst = imm64` (two instructions).
    pub const fn load_imm64(dst: u8, imm: u64) -> [Self; 2] {
        [
            Self::new(0x18, dst, 0, 0, imm as u32 as i32),
            Self::new(0, 0, 0, 0, (imm >> 32) as u32 as i32),
        ]
    }

    /// `dst = map` (the map's descriptor, which the loader turns into its address).
    pub fn load_map(dst: u8, map: &OwnedFd) -> [Self; 2] {
        [
            Self::new(0x18, dst, 1, 0, map.as_raw_fd()),
            Self::new(0, 0, 0, 0, 0),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        // `r1 = *(u32 *)(r6 + 0)`: opcode 0x61, dst 1 in the low nibble, src 6 in the high.
        let i = Insn::load32(R1, R6, 0);
        // SAFETY: Insn is 8 bytes of plain data.
        let bytes: [u8; 8] = unsafe { std::mem::transmute(i) };
        assert_eq!(bytes, [0x61, 0x61, 0, 0, 0, 0, 0, 0]);
        let i = Insn::jeq_imm(R0, 0, -2);
        // SAFETY: as above.
        let bytes: [u8; 8] = unsafe { std::mem::transmute(i) };
        assert_eq!(bytes, [0x15, 0x00, 0xfe, 0xff, 0, 0, 0, 0]);
        let [lo, hi] = Insn::load_imm64(R2, 0x1122_3344_5566_7788);
        assert_eq!((lo.imm as u32, hi.imm as u32), (0x5566_7788, 0x1122_3344));
    }
}
