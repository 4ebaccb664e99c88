//! The JIT (and the interpreter) against a reference of RFC 9669's arithmetic: every ALU,
//! ALU32 and byte-swap instruction, in its immediate and register forms, on operands whose
//! upper halves are set, as lowered programs run them. A mismatch means a verified program
//! may compute addresses other than the ones proved (review: rbpf 0.4.1's `w = w`, `le16`,
//! `le32` and 32-bit modulo by zero kept the upper half before `lower::isa_fix`).

use super::{Abort, Engine, FrameBuf, RunConfig, XdpAction};
use crate::lower::{ins, METER_EXHAUSTED};
use crate::{Insn, Program};

const ALU64: u8 = 0x07;
const ALU32: u8 = 0x04;
const K: u8 = 0x00;
const X: u8 = 0x08;

/// The operations with their RFC 9669 codes.
const OPS: [(u8, &str); 13] = [
    (0x00, "add"),
    (0x10, "sub"),
    (0x20, "mul"),
    (0x30, "div"),
    (0x40, "or"),
    (0x50, "and"),
    (0x60, "lsh"),
    (0x70, "rsh"),
    (0x80, "neg"),
    (0x90, "mod"),
    (0xa0, "xor"),
    (0xb0, "mov"),
    (0xc0, "arsh"),
];

/// RFC 9669 §4.1: `op` on `dst` and `src` (already the immediate, sign-extended, for `K`).
fn reference(op: u8, wide: bool, dst: u64, src: u64) -> u64 {
    if wide {
        match op {
            0x00 => dst.wrapping_add(src),
            0x10 => dst.wrapping_sub(src),
            0x20 => dst.wrapping_mul(src),
            0x30 => dst.checked_div(src).unwrap_or(0),
            0x40 => dst | src,
            0x50 => dst & src,
            0x60 => dst << (src & 63),
            0x70 => dst >> (src & 63),
            0x80 => dst.wrapping_neg(),
            0x90 => dst.checked_rem(src).unwrap_or(dst),
            0xa0 => dst ^ src,
            0xb0 => src,
            0xc0 => ((dst as i64) >> (src & 63)) as u64,
            _ => unreachable!("not an ALU operation"),
        }
    } else {
        let (d, s) = (dst as u32, src as u32);
        u64::from(match op {
            0x00 => d.wrapping_add(s),
            0x10 => d.wrapping_sub(s),
            0x20 => d.wrapping_mul(s),
            0x30 => d.checked_div(s).unwrap_or(0),
            0x40 => d | s,
            0x50 => d & s,
            0x60 => d << (s & 31),
            0x70 => d >> (s & 31),
            0x80 => d.wrapping_neg(),
            0x90 => d.checked_rem(s).unwrap_or(d),
            0xa0 => d ^ s,
            0xb0 => s,
            0xc0 => ((d as i32) >> (s & 31)) as u32,
            _ => unreachable!("not an ALU operation"),
        })
    }
}

/// `lddw reg, value`.
fn lddw(reg: u8, value: u64) -> [Insn; 2] {
    [
        ins(0x18, reg, 0, 0, value as u32 as i32),
        ins(0, 0, 0, 0, (value >> 32) as u32 as i32),
    ]
}

/// Runs `body` (which leaves its result in r1, with r2 and r3 loaded with `a` and `b`) on
/// both engines, through the lowering and both proofs; returns each engine's result. A run
/// returns 32 bits (the kernel's XDP verdict is the low half of r0), so each half of the
/// result is a run of its own.
fn run(body: &[Insn], a: u64, b: u64) -> [u64; 2] {
    let [low, high] = [false, true].map(|high| {
        let mut insns: Vec<Insn> = Vec::new();
        insns.extend(lddw(2, a));
        insns.extend(lddw(3, b));
        insns.push(ins(0xbf, 1, 2, 0, 0)); // r1 = r2
        insns.extend_from_slice(body);
        insns.push(ins(0xbf, 0, 1, 0, 0)); // r0 = r1
        if high {
            insns.push(ins(0x77, 0, 0, 0, 32)); // r0 >>= 32
        }
        insns.push(ins(0x95, 0, 0, 0, 0));
        let program = Program {
            section: "xdp".into(),
            function: "conformance".into(),
            insns,
            maps: Vec::new(),
            loop_bound: 0,
        };
        let instance = program
            .instantiate(RunConfig::default())
            .unwrap_or_else(|e| panic!("{body:?} on {a:#x}, {b:#x}: {e}"));
        [Engine::Jit, Engine::Interpreter].map(|engine| {
            let mut rt = instance.runtime(0, engine, 0).expect("runtime");
            let mut frame = FrameBuf::new(64).expect("frame");
            frame.load_ip(&[0x45; 20]).expect("packet");
            let v = rt.run(&mut frame);
            // Every 32-bit value comes back as some verdict.
            u64::from(match (v.action, v.abort) {
                (XdpAction::Aborted, Some(Abort::Returned)) => 0,
                (XdpAction::Drop, None) => 1,
                (XdpAction::Pass, None) => 2,
                (XdpAction::Tx, None) => 3,
                (XdpAction::Aborted, Some(Abort::InsnLimit)) => METER_EXHAUSTED as u32,
                (XdpAction::Aborted, Some(Abort::InvalidAction(r))) => r as u32,
                other => panic!("{body:?} on {a:#x}, {b:#x} ({engine:?}): {other:?}"),
            })
        })
    });
    [low[0] | high[0] << 32, low[1] | high[1] << 32]
}

/// Operands with their upper halves set, and the small and zero divisors.
const A: [u64; 3] = [
    0xdead_beef_8765_4321,
    0xffff_ffff_0000_0007,
    0x0000_0001_ffff_fff0,
];
const B: [u64; 6] = [
    0x0000_0001_0000_0003,
    0,
    7,
    0xffff_ffff_ffff_fff0,
    0x8000_0000_0000_0021,
    0x0000_0000_8000_0000,
];

#[test]
fn alu_instructions_compute_what_rfc_9669_says_on_both_engines() {
    let mut checked = 0;
    for (op, name) in OPS {
        for (class, wide) in [(ALU64, true), (ALU32, false)] {
            for a in A {
                for b in B {
                    // Shifts by the register's value beyond the width are masked by the
                    // reference and by x86 alike; the verifier takes them.
                    // (`neg` has no register form.)
                    if op != 0x80 {
                        let reg = ins(class | X | op, 1, 3, 0, 0);
                        let want = reference(op, wide, a, b);
                        assert_eq!(
                            run(&[reg], a, b),
                            [want; 2],
                            "{name}{} r1 = {a:#x}, r3 = {b:#x}",
                            if wide { "64" } else { "32" },
                        );
                    }
                    // Immediates: sign-extended (64-bit) or taken as 32 bits; nothing PREVAIL
                    // refuses (a division by zero, a shift past the width, subtracting
                    // i32::MIN, which it cannot negate).
                    // (`neg` takes no operand: its immediate is 0.)
                    let imm = if op == 0x80 { 0 } else { b as u32 as i32 };
                    let width = if wide { 64 } else { 32 };
                    let refused = (matches!(op, 0x30 | 0x90) && imm == 0)
                        || (op == 0x10 && imm == i32::MIN)
                        || (matches!(op, 0x60 | 0x70 | 0xc0) && !(0..width).contains(&imm));
                    if !refused {
                        let k = ins(class | K | op, 1, 0, 0, imm);
                        let want = reference(op, wide, a, i64::from(imm) as u64);
                        assert_eq!(
                            run(&[k], a, b),
                            [want; 2],
                            "{name}{} r1 = {a:#x}, imm {imm:#x}",
                            if wide { "64" } else { "32" },
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    // `w1 = w1` and `w2 = w1`: the register on itself and onto another.
    for a in A {
        let same = ins(ALU32 | X | 0xb0, 1, 1, 0, 0);
        assert_eq!(
            run(&[same], a, 0),
            [a & 0xffff_ffff; 2],
            "w1 = w1 on {a:#x}"
        );
        let other = [ins(ALU32 | X | 0xb0, 4, 1, 0, 0), ins(0xbf, 1, 4, 0, 0)];
        assert_eq!(run(&other, a, 0), [a & 0xffff_ffff; 2], "w4 = w1 on {a:#x}");
    }
    assert!(checked > 400);
}

#[test]
fn byte_swaps_compute_what_rfc_9669_says_on_both_engines() {
    for a in A {
        for (code, width, want) in [
            (0xd4, 16, a & 0xffff),
            (0xd4, 32, a & 0xffff_ffff),
            (0xd4, 64, a),
            (0xdc, 16, u64::from((a as u16).swap_bytes())),
            (0xdc, 32, u64::from((a as u32).swap_bytes())),
            (0xdc, 64, a.swap_bytes()),
        ] {
            let swap = ins(code, 1, 0, 0, width);
            assert_eq!(
                run(&[swap], a, 0),
                [want; 2],
                "{} {width} on {a:#x}",
                if code == 0xd4 { "le" } else { "be" }
            );
        }
    }
}

#[test]
fn a_frame_larger_than_the_proof_assumes_is_refused() {
    assert!(matches!(
        FrameBuf::new(super::MAX_MTU + 1),
        Err(super::FrameError::Mtu(_))
    ));
    assert!(FrameBuf::new(super::MAX_MTU).is_ok());
}
