//! eBPF instructions (RFC 9669, "BPF Instruction Set Architecture") and the checks the loader
//! makes before the verifier runs: helpers outside the offered set, calls and opcodes the
//! runtime cannot run yet, each refused by name with its instruction index.

use crate::{LoadError, Unsupported};

/// One 8-byte eBPF instruction (RFC 9669 §3): the second slot of a 64-bit immediate load
/// (`lddw`) is an instruction of its own, so indices count as `llvm-objdump -d` does, from the
/// program's first instruction (`llvm-objdump` numbers from the start of the ELF section,
/// which differs when a section holds several programs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Insn {
    /// The opcode: class (low 3 bits), source flag and operation or size/mode.
    pub code: u8,
    /// Destination register (0..=10).
    pub dst: u8,
    /// Source register (0..=10), or a pseudo-source for `lddw` and `call`.
    pub src: u8,
    /// Signed offset.
    pub off: i16,
    /// Signed immediate.
    pub imm: i32,
}

impl Insn {
    /// The instruction in the encoding of RFC 9669 §3.1 (little-endian).
    pub fn to_bytes(self) -> [u8; 8] {
        let [o0, o1] = self.off.to_le_bytes();
        let [i0, i1, i2, i3] = self.imm.to_le_bytes();
        [
            self.code,
            (self.src << 4) | (self.dst & 0x0f),
            o0,
            o1,
            i0,
            i1,
            i2,
            i3,
        ]
    }

    pub(crate) fn from_obj(i: &aya_obj::generated::bpf_insn) -> Self {
        Self {
            code: i.code,
            dst: i.dst_reg(),
            src: i.src_reg(),
            off: i.off,
            imm: i.imm,
        }
    }

    pub(crate) fn to_prevail(self) -> prevail::spec::vm_isa::EbpfInst {
        prevail::spec::vm_isa::EbpfInst {
            opcode: self.code,
            dst_src: (self.src << 4) | (self.dst & 0x0f),
            offset: self.off,
            imm: self.imm,
        }
    }

    fn class(self) -> u8 {
        self.code & 0x07
    }

    /// Whether this is the first half of a 64-bit immediate load (`lddw`, opcode 0x18).
    pub fn is_lddw(self) -> bool {
        self.code == LDDW
    }
}

/// The kernel helpers a tenant program may call, by number (`enum bpf_func_id`).
pub const OFFERED_HELPERS: [i32; 8] = [
    1,  // bpf_map_lookup_elem
    2,  // bpf_map_update_elem
    3,  // bpf_map_delete_elem
    5,  // bpf_ktime_get_ns
    7,  // bpf_get_prandom_u32
    28, // bpf_csum_diff
    44, // bpf_xdp_adjust_head
    65, // bpf_xdp_adjust_tail
];

// Classes (RFC 9669 §3.2).
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const STX: u8 = 0x03;
const ALU: u8 = 0x04;
const JMP: u8 = 0x05;
const JMP32: u8 = 0x06;
const ALU64: u8 = 0x07;
// Modes of load and store classes (RFC 9669 §5).
const MODE_MASK: u8 = 0xe0;
const MODE_ABS: u8 = 0x20;
const MODE_IND: u8 = 0x40;
const MODE_MEMSX: u8 = 0x80;
const MODE_ATOMIC: u8 = 0xc0;
// Operations of the arithmetic and jump classes (RFC 9669 §4).
const OP_MASK: u8 = 0xf0;
const OP_DIV: u8 = 0x30;
const OP_MOD: u8 = 0x90;
const OP_MOV: u8 = 0xb0;
const OP_END: u8 = 0xd0;
const OP_JA: u8 = 0x00;
const OP_CALL: u8 = 0x80;
const SRC_X: u8 = 0x08;
/// `lddw`: class LD, mode IMM, size DW.
pub(crate) const LDDW: u8 = 0x18;
/// `lddw` pseudo-source: the immediate is a map (our handle, after relocation).
pub(crate) const PSEUDO_MAP_FD: u8 = 1;
const PSEUDO_MAP_VALUE: u8 = 2;
const PSEUDO_FUNC: u8 = 4;
/// `call` pseudo-sources.
const CALL_HELPER: u8 = 0;
const CALL_LOCAL: u8 = 1;
const CALL_KFUNC: u8 = 2;
/// Atomic operation in `imm`: a plain add without fetch (`lock *(uN *)(dst + off) += src`).
const ATOMIC_ADD: i32 = 0x00;

/// Checks every instruction for what the gateway does not offer or run, in program order, and
/// returns the first refusal. `section` names the program in the error.
pub(crate) fn check(section: &str, insns: &[Insn]) -> Result<(), LoadError> {
    let refuse = |index, what| LoadError::Unsupported {
        section: section.to_owned(),
        index,
        what,
    };
    let mut index = 0;
    while let Some(&i) = insns.get(index) {
        let (class, op) = (i.class(), i.code & OP_MASK);
        match class {
            LD if i.code == LDDW => match i.src {
                0 | PSEUDO_MAP_FD => {}
                PSEUDO_MAP_VALUE => return Err(refuse(index, Unsupported::GlobalData)),
                PSEUDO_FUNC => return Err(refuse(index, Unsupported::FunctionPointer)),
                other => return Err(refuse(index, Unsupported::UnknownLoad(other))),
            },
            LD if matches!(i.code & MODE_MASK, MODE_ABS | MODE_IND) => {
                return Err(refuse(index, Unsupported::LegacyPacketAccess));
            }
            LDX if i.code & MODE_MASK == MODE_MEMSX => {
                return Err(refuse(index, Unsupported::SignExtendingLoad));
            }
            STX if i.code & MODE_MASK == MODE_ATOMIC && i.imm != ATOMIC_ADD => {
                return Err(refuse(index, Unsupported::Atomic(i.imm)));
            }
            ALU | ALU64 if matches!(op, OP_DIV | OP_MOD) && i.off != 0 => {
                return Err(refuse(index, Unsupported::SignedDivision));
            }
            ALU | ALU64 if op == OP_MOV && i.off != 0 => {
                return Err(refuse(index, Unsupported::SignExtendingMove));
            }
            ALU64 if op == OP_END => return Err(refuse(index, Unsupported::ByteSwap)),
            JMP32 if op == OP_JA => return Err(refuse(index, Unsupported::LongJump)),
            JMP if op == OP_CALL && i.code & SRC_X != 0 => {
                return Err(refuse(index, Unsupported::IndirectCall));
            }
            JMP if op == OP_CALL => match i.src {
                CALL_HELPER if OFFERED_HELPERS.contains(&i.imm) => {}
                CALL_HELPER => {
                    return Err(LoadError::Helper {
                        section: section.to_owned(),
                        index,
                        id: i.imm,
                    });
                }
                CALL_LOCAL => return Err(refuse(index, Unsupported::LocalCall)),
                CALL_KFUNC => return Err(refuse(index, Unsupported::Kfunc)),
                // Unknown pseudo-sources are left to the verifier, which refuses them.
                _ => {}
            },
            _ => {}
        }
        index += if i.code == LDDW { 2 } else { 1 };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn {
            code,
            dst: 1,
            src,
            off,
            imm,
        }
    }
    const EXIT: Insn = Insn {
        code: 0x95,
        dst: 0,
        src: 0,
        off: 0,
        imm: 0,
    };

    fn refusal(insns: &[Insn]) -> String {
        match check("xdp", insns) {
            Ok(()) => "accepted".to_owned(),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn v4_opcodes_are_refused_by_name() {
        for (i, name) in [
            (insn(0x3f, 0, 1, 0), "signed division"), // sdiv64 r1, r0
            (insn(0x94, 0, 1, 3), "signed division"), // smod32 w1, 3
            (insn(0xbf, 2, 8, 0), "sign-extending move"), // movsx64 r1, (s8) r2
            (insn(0xbc, 2, 16, 0), "sign-extending move"), // movsx32 w1, (s16) w2
            (insn(0x91, 2, 0, 0), "sign-extending load"), // ldsxb
            (insn(0xd7, 0, 0, 16), "unconditional byte swap"),
            (insn(0x06, 0, 0, 1), "gotol"),
        ] {
            let e = refusal(&[i, EXIT]);
            assert!(
                e.contains(name) && e.contains("eBPF v4") && e.contains("instruction 0"),
                "{e}"
            );
        }
    }

    #[test]
    fn v3_opcodes_pass() {
        for i in [
            insn(0x3f, 0, 0, 0),  // div64 r1, r0
            insn(0x94, 0, 0, 3),  // mod32 w1, 3
            insn(0xbf, 2, 0, 0),  // mov64 r1, r2
            insn(0xdc, 0, 0, 16), // be16 (v1 byte swap)
            insn(0x16, 0, 5, 0),  // jeq32 w1, 0, +5
            insn(0xdb, 2, 0, 0),  // lock *(u64 *)(r1 + 0) += r2
        ] {
            assert_eq!(refusal(&[i, EXIT]), "accepted", "{i:?}");
        }
    }

    #[test]
    fn calls_are_refused_unless_offered_helpers() {
        let e = refusal(&[insn(0xb7, 0, 0, 0), insn(0x85, 0, 0, 8), EXIT]);
        assert_eq!(
            e,
            "section `xdp`, instruction 1: helper bpf_get_smp_processor_id (8) is not offered"
        );
        let e = refusal(&[insn(0x85, 0, 0, 6), EXIT]);
        assert!(e.contains("helper bpf_trace_printk (6)"), "{e}");
        let e = refusal(&[insn(0x85, 0, 0, 100_000), EXIT]);
        assert!(e.contains("helper (unknown) (100000)"), "{e}");
        assert!(refusal(&[insn(0x85, 1, 0, 3), EXIT]).contains("bpf-to-bpf call"));
        assert!(refusal(&[insn(0x85, 2, 0, 3), EXIT]).contains("kfuncs"));
        assert!(refusal(&[insn(0x8d, 0, 0, 0), EXIT]).contains("callx"));
        for id in OFFERED_HELPERS {
            assert_eq!(refusal(&[insn(0x85, 0, 0, id), EXIT]), "accepted", "{id}");
        }
    }

    #[test]
    fn the_second_half_of_lddw_counts_as_an_instruction() {
        // lddw r1, 0 (two slots) then a refused atomic at index 2.
        let e = refusal(&[
            insn(LDDW, 0, 0, 0),
            insn(0, 0, 0, 0),
            insn(0xdb, 2, 0, 0xe1),
            EXIT,
        ]);
        assert!(
            e.starts_with("section `xdp`, instruction 2: atomic operation 0xe1"),
            "{e}"
        );
        let e = refusal(&[insn(LDDW, PSEUDO_MAP_VALUE, 0, 0), insn(0, 0, 0, 0), EXIT]);
        assert!(e.contains("global variables"), "{e}");
        assert!(refusal(&[insn(0x30, 0, 0, 12), EXIT]).contains("LD_ABS"));
    }
}
