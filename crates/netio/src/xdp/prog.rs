//! The XDP program that steers our UDP ports into AF_XDP sockets, assembled at start for the
//! addresses and ports being served, and loaded with the `bpf(2)` system call.
//!
//! What it does, per frame (`struct xdp_md` context, see the kernel's
//! `Documentation/bpf/redirect.rst` and `Documentation/networking/af_xdp.rst`):
//! - Ethernet II with EtherType IPv4 or IPv6 (a VLAN-tagged frame is the kernel's);
//! - IPv4 without options and not a fragment (a fragment is reassembled by the kernel and
//!   reaches the socket), or IPv6 whose next header is UDP (no extension headers);
//! - no longer than the interface's MTU (a longer "frame" is a GSO or GRO train that the
//!   generic path shows whole; the kernel's socket receives it as such);
//! - UDP to one of the rules' (address, port): redirected to the XSKMAP entry
//!   `rx_queue_index × slots + slot` with `XDP_PASS` as the action when that entry is empty
//!   (`bpf_redirect_map`'s flags, Linux 5.3 and later), so a queue without a socket still
//!   reaches the kernel's socket;
//! - everything else: `XDP_PASS`, untouched.
//!
//! Why not a crate: `aya` loads programs from ELF objects (a compiler at build time); this one
//! depends on the addresses it serves and is about 50 instructions (a few more per address),
//! assembled here and loaded with three `bpf(2)` commands ([`crate::bpf`]: map create, program
//! load, link create). The link is tied to its descriptor: when the process ends, however it
//! ends, the kernel detaches the program.

use crate::bpf::{self, Insn, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{OwnedFd, RawFd};

/// How the program is attached to the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpAttach {
    /// In the driver (`XDP_FLAGS_DRV_MODE`): veth, and NICs whose driver supports XDP.
    Native,
    /// In the kernel's generic receive path (`XDP_FLAGS_SKB_MODE`): any interface, after the
    /// socket buffer is allocated.
    Generic,
}

impl XdpAttach {
    /// The `XDP_FLAGS_*` bit.
    fn flags(self) -> u32 {
        match self {
            Self::Native => 1 << 2,
            Self::Generic => 1 << 1,
        }
    }

    /// Its name in logs and status.
    pub fn name(self) -> &'static str {
        match self {
            Self::Native => "native",
            Self::Generic => "generic",
        }
    }
}

/// `BPF_FUNC_redirect_map`.
const HELPER_REDIRECT_MAP: i32 = 51;
/// `XDP_PASS`.
const XDP_PASS: i32 = 2;
/// `BPF_PSEUDO_MAP_FD`: the source register of a 64-bit load that names a map.
const PSEUDO_MAP_FD: u8 = 1;

/// An XSKMAP of `entries` entries.
pub(crate) fn xsk_map(entries: u32) -> io::Result<OwnedFd> {
    bpf::map_create(bpf::MAP_XSK, 4, 4, entries.max(1), 0, "protego_xsks")
}

/// Puts AF_XDP socket `sock` at `key` of XSKMAP `map`.
pub(crate) fn xsk_map_set(map: &OwnedFd, key: u32, sock: RawFd) -> io::Result<()> {
    bpf::map_update(map, &key.to_ne_bytes(), &sock.to_ne_bytes())
}

/// A loaded program attached to an interface; dropping it detaches the program.
#[derive(Debug)]
pub(crate) struct Attached {
    /// The link (closing it detaches).
    _link: OwnedFd,
    /// The program.
    _prog: OwnedFd,
}

/// Loads `insns` as an XDP program (the verifier's log in the error if it refuses) and
/// attaches it to `ifindex` in mode `how` through a BPF link. An interface that already has
/// an XDP program refuses (`EBUSY`): someone else's program is never replaced.
pub(crate) fn load_and_attach(
    insns: &[Insn],
    ifindex: u32,
    how: XdpAttach,
) -> io::Result<Attached> {
    let prog = bpf::prog_load_xdp(insns, "protego_steer")?;
    let link = bpf::link_create_xdp(&prog, ifindex, how.flags())?;
    Ok(Attached {
        _link: link,
        _prog: prog,
    })
}

/// Instruction classes, sizes, modes and operations (`include/uapi/linux/bpf.h`).
mod op {
    pub(super) const LDX_W: u8 = 0x61;
    pub(super) const LDX_H: u8 = 0x69;
    pub(super) const LDX_B: u8 = 0x71;
    pub(super) const LD_DW_IMM: u8 = 0x18;
    pub(super) const MOV64_X: u8 = 0xbf;
    pub(super) const MOV64_K: u8 = 0xb7;
    pub(super) const ADD64_X: u8 = 0x0f;
    pub(super) const ADD64_K: u8 = 0x07;
    pub(super) const MUL64_K: u8 = 0x27;
    pub(super) const AND64_K: u8 = 0x57;
    pub(super) const JA: u8 = 0x05;
    pub(super) const JEQ_K: u8 = 0x15;
    pub(super) const JNE_K: u8 = 0x55;
    pub(super) const JGT_X: u8 = 0x2d;
    pub(super) const JGT_K: u8 = 0x25;
    /// `BPF_ALU | BPF_END | BPF_TO_BE`: to network order (a swap on this little-endian host).
    pub(super) const TO_BE: u8 = 0xdc;
    /// 32-bit compare (`BPF_JMP32 | BPF_JNE | BPF_K`): an address word against an immediate
    /// without sign extension.
    pub(super) const JNE32_K: u8 = 0x56;
    pub(super) const CALL: u8 = 0x85;
    pub(super) const EXIT: u8 = 0x95;
}

/// A jump target, resolved when the program is finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

/// A tiny assembler: instructions, labels, and jumps to labels.
#[derive(Default)]
struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    fixups: Vec<(usize, Label)>,
}

impl Asm {
    fn raw(&mut self, code: u8, dst: u8, src: u8, off: i16, imm: i32) {
        self.insns.push(Insn::new(code, dst, src, off, imm));
    }
    fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }
    fn here(&mut self, l: Label) {
        self.labels[l.0] = Some(self.insns.len());
    }
    fn jump(&mut self, code: u8, dst: u8, src: u8, imm: i32, to: Label) {
        self.fixups.push((self.insns.len(), to));
        self.raw(code, dst, src, 0, imm);
    }
    fn ldx(&mut self, code: u8, dst: u8, base: u8, off: i16) {
        self.raw(code, dst, base, off, 0);
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, l) in std::mem::take(&mut self.fixups) {
            let target = self.labels[l.0].expect("every label is placed");
            let off = i64::try_from(target).expect("small") - i64::try_from(at).expect("small") - 1;
            self.insns[at] =
                self.insns[at].with_off(i16::try_from(off).expect("the program is small"));
        }
        self.insns
    }
}

/// Ethernet header length.
const ETH: i16 = 14;

/// Assembles the steering program for `rules` (rule `i` is XSKMAP slot `i` of each queue),
/// with `slots` entries per queue, the XSKMAP at descriptor `map`, and IP packets up to `mtu`
/// bytes.
pub(crate) fn steer_program(rules: &[SocketAddr], slots: u32, map: RawFd, mtu: u32) -> Vec<Insn> {
    use op::*;
    let mut a = Asm::default();
    let pass = a.label();
    let redirect = a.label();
    let v4 = a.label();
    let v6 = a.label();
    // r6 = ctx; r2 = data; r3 = data_end.
    a.raw(MOV64_X, R6, R1, 0, 0);
    a.ldx(LDX_W, R2, R6, 0);
    a.ldx(LDX_W, R3, R6, 4);
    // The shortest frame we steer: Ethernet, IPv4, UDP.
    a.raw(MOV64_X, R4, R2, 0, 0);
    a.raw(ADD64_K, R4, 0, 0, i32::from(ETH + 20 + 8));
    a.jump(JGT_X, R4, R3, 0, pass);
    // EtherType, read as a little-endian word: 0x0800 reads 0x0008, 0x86dd reads 0xdd86.
    a.ldx(LDX_H, R5, R2, 12);
    a.jump(JEQ_K, R5, R0, 0x0008, v4);
    a.jump(JEQ_K, R5, R0, 0xdd86, v6);
    a.jump(JA, R0, R0, 0, pass);

    // IPv4: version 4, header 20 bytes (options go to the kernel), not a fragment, UDP.
    a.here(v4);
    a.ldx(LDX_B, R5, R2, ETH);
    a.jump(JNE_K, R5, R0, 0x45, pass);
    a.ldx(LDX_H, R5, R2, ETH + 6);
    // More-fragments and the offset: 0x3fff in network order, read little-endian.
    a.raw(AND64_K, R5, 0, 0, 0xff3f);
    a.jump(JNE_K, R5, R0, 0, pass);
    a.ldx(LDX_B, R5, R2, ETH + 9);
    a.jump(JNE_K, R5, R0, 17, pass);
    a.ldx(LDX_H, R5, R2, ETH + 2);
    a.raw(TO_BE, R5, 0, 0, 16);
    a.jump(JGT_K, R5, R0, mtu_imm(mtu), pass);
    a.ldx(LDX_W, R7, R2, ETH + 16);
    a.ldx(LDX_H, R8, R2, ETH + 20 + 2);
    for (slot, rule) in rules.iter().enumerate() {
        let IpAddr::V4(ip) = rule.ip() else { continue };
        let next = a.label();
        a.jump(JNE32_K, R7, R0, i32::from_le_bytes(ip.octets()), next);
        a.jump(JNE_K, R8, R0, port_word(rule.port()), next);
        a.raw(MOV64_K, R2, 0, 0, slot_imm(slot));
        a.jump(JA, R0, R0, 0, redirect);
        a.here(next);
    }
    a.jump(JA, R0, R0, 0, pass);

    // IPv6: next header UDP (no extension headers).
    a.here(v6);
    a.raw(MOV64_X, R4, R2, 0, 0);
    a.raw(ADD64_K, R4, 0, 0, i32::from(ETH + 40 + 8));
    a.jump(JGT_X, R4, R3, 0, pass);
    a.ldx(LDX_B, R5, R2, ETH + 6);
    a.jump(JNE_K, R5, R0, 17, pass);
    a.ldx(LDX_H, R5, R2, ETH + 4);
    a.raw(TO_BE, R5, 0, 0, 16);
    a.jump(JGT_K, R5, R0, mtu_imm(mtu.saturating_sub(40)), pass);
    a.ldx(LDX_W, R7, R2, ETH + 24);
    a.ldx(LDX_W, R8, R2, ETH + 28);
    a.ldx(LDX_W, R9, R2, ETH + 32);
    a.ldx(LDX_W, R5, R2, ETH + 36);
    a.ldx(LDX_H, R4, R2, ETH + 40 + 2);
    for (slot, rule) in rules.iter().enumerate() {
        let IpAddr::V6(ip) = rule.ip() else { continue };
        let o = ip.octets();
        let word = |i: usize| i32::from_le_bytes(o[i * 4..i * 4 + 4].try_into().expect("4"));
        let next = a.label();
        for (reg, i) in [(R7, 0), (R8, 1), (R9, 2), (R5, 3)] {
            a.jump(JNE32_K, reg, R0, word(i), next);
        }
        a.jump(JNE_K, R4, R0, port_word(rule.port()), next);
        a.raw(MOV64_K, R2, 0, 0, slot_imm(slot));
        a.jump(JA, R0, R0, 0, redirect);
        a.here(next);
    }
    a.jump(JA, R0, R0, 0, pass);

    // r2 = slot: key = rx_queue_index × slots + slot; bpf_redirect_map(map, key, XDP_PASS).
    a.here(redirect);
    a.ldx(LDX_W, R4, R6, 16);
    a.raw(MUL64_K, R4, 0, 0, i32::try_from(slots).unwrap_or(i32::MAX));
    a.raw(ADD64_X, R2, R4, 0, 0);
    a.raw(LD_DW_IMM, R1, PSEUDO_MAP_FD, 0, map);
    a.raw(0, R0, 0, 0, 0);
    a.raw(MOV64_K, R3, 0, 0, XDP_PASS);
    a.raw(CALL, R0, 0, 0, HELPER_REDIRECT_MAP);
    a.raw(EXIT, R0, 0, 0, 0);

    a.here(pass);
    a.raw(MOV64_K, R0, 0, 0, XDP_PASS);
    a.raw(EXIT, R0, 0, 0, 0);
    a.finish()
}

/// A UDP port as the program reads it: a 16-bit word in network order, loaded little-endian.
fn port_word(port: u16) -> i32 {
    i32::from(u16::from_le_bytes(port.to_be_bytes()))
}

fn mtu_imm(mtu: u32) -> i32 {
    i32::try_from(mtu).unwrap_or(i32::MAX)
}

fn slot_imm(slot: usize) -> i32 {
    i32::try_from(slot).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jumps_land_on_their_labels() {
        let mut a = Asm::default();
        let end = a.label();
        a.jump(op::JA, R0, R0, 0, end);
        a.raw(op::MOV64_K, R0, 0, 0, 1);
        a.here(end);
        a.raw(op::EXIT, R0, 0, 0, 0);
        let p = a.finish();
        assert_eq!(p[0].off(), 1);
    }

    #[test]
    fn the_program_ends_in_exits_and_names_its_map_once() {
        let rules = [
            "192.0.2.1:4500".parse().expect("v4"),
            "[2001:db8::1]:4789".parse().expect("v6"),
        ];
        let p = steer_program(&rules, 2, 42, 1500);
        assert!((50..80).contains(&p.len()), "{} instructions", p.len());
        assert_eq!(p.last().map(Insn::code), Some(op::EXIT));
        let maps: Vec<_> = p
            .iter()
            .filter(|i| i.code() == op::LD_DW_IMM && i.src() == PSEUDO_MAP_FD)
            .collect();
        assert_eq!(maps.len(), 1);
        assert_eq!(maps[0].imm(), 42);
        // The IPv4 rule compares the address as the program loads it.
        let want = i32::from_le_bytes([192, 0, 2, 1]);
        assert!(p.iter().any(|i| i.code() == op::JNE32_K && i.imm() == want));
        assert!(p
            .iter()
            .any(|i| i.code() == op::JNE_K && i.imm() == port_word(4789)));
        // Longer than the MTU (a GSO or GRO train in the generic path): to the kernel.
        assert!(p.iter().any(|i| i.code() == op::JGT_K && i.imm() == 1500));
        assert!(p.iter().any(|i| i.code() == op::JGT_K && i.imm() == 1460));
        // Every jump stays inside the program.
        for (at, i) in p.iter().enumerate() {
            if matches!(
                i.code(),
                op::JA | op::JEQ_K | op::JNE_K | op::JGT_X | op::JGT_K | op::JNE32_K
            ) {
                let to = at as i64 + 1 + i64::from(i.off());
                assert!((0..p.len() as i64).contains(&to), "{at}: {i:?}");
            }
        }
    }

    #[test]
    fn ports_read_in_network_order() {
        assert_eq!(port_word(4500), 0x9411);
        assert_eq!(port_word(0x12b5), 0xb512);
    }
}
