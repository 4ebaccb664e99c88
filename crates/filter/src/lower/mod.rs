//! The lowering pass between the verifier and rbpf (issue 18 §1.4): it rewrites a verified
//! program into bytecode rbpf 0.4.1 runs, adding what rbpf lacks.
//!
//! - **Instruction meter.** At entry, `*(u32 *)(r10 - 512) = LIMIT`. Every loop head (the
//!   target of a backward jump) gets a block that subtracts the loop's span (the number of
//!   instructions from the head to its furthest back edge, an upper bound of one trip around
//!   it) and leaves the program when the counter drops below zero:
//!   ```text
//!   *(u64 *)(r10 - 504) = rT        ; spill a scratch register
//!   rT = *(u32 *)(r10 - 512)        ; zero-extended: 0 ..= i32::MAX
//!   rT -= SPAN                      ; 64-bit: negative once exhausted
//!   *(u32 *)(r10 - 512) = rT
//!   if rT s< 0 goto exhausted       ; exhausted: r0 = METER_EXHAUSTED; exit
//!   rT = *(u64 *)(r10 - 504)        ; restore
//!   ```
//!   Straight-line code between two loop heads is shorter than the program, so a run executes
//!   at most about LIMIT + (number of loop entries) × length instructions of the original
//!   program; clang's loops (contiguous, entered at their head) stay within LIMIT + length
//!   per entry into the outermost loop.
//! - **Atomic add.** `lock *(uN *)(rD + off) += rS` (BPF_ATOMIC ADD without fetch, which rbpf
//!   cannot run) becomes a spill, a load, an add, a store and a restore. **It is not atomic
//!   across threads**: two workers adding to the same hash or array value at once can lose an
//!   increment. Per-CPU arrays, XDP's idiom for counters, are exact. Other atomic operations
//!   are refused at load ([`crate::insn`]).
//! - **rbpf's JIT and the ISA.** Four instructions the JIT computes differently from RFC 9669
//!   (`w = w`, `le16`, `le32`, a 32-bit modulo by zero keep the destination's upper half) are
//!   rewritten, in the program rbpf runs, into forms it gets right (`isa_fix`). Each form
//!   computes the same value as the instruction it replaces under RFC 9669, which is what
//!   PREVAIL proves the program safe under; `run::conformance` checks that both engines compute
//!   RFC 9669's values for every ALU and byte-swap instruction. The second proof is of the
//!   program without these forms: PREVAIL loses the relations a `w &= -1` keeps (a packet
//!   length in a register no longer bounds an access), so it refuses programs it accepted.
//! - **Map references.** `lddw rX, H` with the map pseudo-source becomes a plain `lddw rX, H`:
//!   the helpers take the map's handle `H` and check it against the program's maps.
//! - **Stack pointer for the helpers.** The first instruction stores r10 into a hidden word
//!   of the context buffer (offset [`CTX_STACK_SLOT`], past the 24 bytes of `struct xdp_md`
//!   the verifier lets the program touch), so helpers can check that a pointer argument
//!   lies in the program's stack.
//!
//! - **What the meter charged.** In the program rbpf runs, the first instructions also keep
//!   the context's address in the stack word at `r10 - 508` (32 bits: frames live below
//!   4 GiB), and every `exit` becomes a jump to one tail (after the exhaustion block, which
//!   falls into it): load that address into r1, load the meter's counter into r2, store r2 at
//!   [`CTX_METER_SLOT`] of the context, `exit` (only r0 is live at an exit). The runtime reads
//!   it back to count the instructions the meter charged. (One tail, not a copy per exit:
//!   rbpf's JIT holds a program's code in one 4 KiB page.)
//!
//! The meter and the atomic lowering use the 16 stack bytes below `r10 - 496` that
//! [`crate::verify::STACK_SIZE`] keeps from the program. PREVAIL verifies the result again
//! (with the whole 512-byte stack and the termination check), so the rewrite cannot open a
//! hole. The counter is 32 bits wide for that proof's sake: with a 64-bit counter PREVAIL
//! 0.2.6 reaches no fixpoint, in minutes, on an 11-instruction packet walk (seen; 9 ms with
//! 32 bits). The last two rewrites change no control flow and touch only memory the runtime
//! owns, and are applied after the second proof (PREVAIL refuses plain numbers as map
//! arguments and stores to the context).

use crate::insn::{Insn, LDDW, PSEUDO_MAP_FD};

/// The value a lowered program returns when its instruction meter runs out (an invalid XDP
/// action, so it can never be mistaken for a verdict; the runtime counts it apart).
pub const METER_EXHAUSTED: i32 = -0x4d45;

/// Offset in the context buffer of the hidden word that receives r10 at entry.
pub const CTX_STACK_SLOT: i16 = 24;

/// Offset in the context buffer of the hidden 32-bit word that receives the meter's counter at
/// every exit (with a meter).
pub const CTX_METER_SLOT: i16 = 32;

/// Stack offset of the 32-bit word holding the context's address (with a meter).
const CTX_ADDR_SLOT: i16 = -508;

/// Stack offset of the meter's counter.
const METER_SLOT: i16 = -512;
/// Stack offset of the scratch register's spill.
const SPILL_SLOT: i16 = -504;

// Opcodes (RFC 9669).
const STW_IMM: u8 = 0x62;
const STXDW: u8 = 0x7b;
const STXW: u8 = 0x63;
const LDXDW: u8 = 0x79;
const LDXW: u8 = 0x61;
const ADD64_REG: u8 = 0x0f;
const ADD32_REG: u8 = 0x0c;
const SUB64_IMM: u8 = 0x17;
const MOV64_IMM: u8 = 0xb7;
const JSLT_IMM: u8 = 0xc5;
const JA: u8 = 0x05;
const CALL: u8 = 0x85;
const EXIT: u8 = 0x95;
const ATOMIC_DW: u8 = 0xdb;
const ATOMIC_W: u8 = 0xc3;
const MOV32_REG: u8 = 0xbc;
const MOD32_IMM: u8 = 0x94;
const MOD32_REG: u8 = 0x9c;
const AND32_IMM: u8 = 0x54;
/// `le16`/`le32`/`le64` (BPF_END, to little endian).
const LE: u8 = 0xd4;

/// Why a verified program could not be lowered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LowerError {
    /// A loop head or an atomic add where no register but the operands holds a value to
    /// spill (PREVAIL refuses storing an uninitialised register).
    #[error("instruction {index}: no initialised register is free for the runtime's {what}")]
    NoScratchRegister {
        /// The original instruction.
        index: usize,
        /// What needed it (`instruction meter`, `atomic add`).
        what: &'static str,
    },
    /// A jump whose offset no longer fits 16 bits once the program grew.
    #[error("instruction {index}: the jump is too long once the runtime's checks are inserted")]
    JumpTooLong {
        /// The original instruction.
        index: usize,
    },
    /// The instruction meter's limit does not fit an instruction's immediate.
    #[error("instruction limit {limit} is above {}", i32::MAX)]
    Limit {
        /// The limit asked for.
        limit: u64,
    },
}

/// A lowered program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lowered {
    /// The instructions after the meter and the atomic lowering (map references and context
    /// untouched): what PREVAIL verifies a second time.
    pub verified: Vec<Insn>,
    /// The instructions rbpf runs: `verified` with `isa_fix`'s forms, map references turned
    /// into handles, the stack pointer's and the context address's stores at entry and the
    /// meter's store before every exit.
    pub runnable: Vec<Insn>,
    /// For each instruction of `verified`, the original instruction it comes from (`None`
    /// for the meter's entry and exhaustion blocks).
    pub origin: Vec<Option<usize>>,
    /// The loop heads of the original program with the span the meter charges there.
    pub loop_heads: Vec<(usize, u32)>,
}

/// Lowers `insns` (a verified program) with an instruction meter of `limit` instructions, or
/// without a meter (`None`); with a meter, the runnable code stores what it charged in the
/// context at every exit.
pub fn lower(insns: &[Insn], limit: Option<u64>) -> Result<Lowered, LowerError> {
    lower_with(insns, limit, true)
}

/// [`lower`], with the meter's store at the exits only if `readback` (it costs the JIT about
/// 40 bytes of machine code, which a program near rbpf's 4 KiB may not have).
pub fn lower_with(
    insns: &[Insn],
    limit: Option<u64>,
    readback: bool,
) -> Result<Lowered, LowerError> {
    let limit = limit
        .map(|limit| i32::try_from(limit).map_err(|_| LowerError::Limit { limit }))
        .transpose()?;
    let heads = if limit.is_some() {
        loop_heads(insns)
    } else {
        Vec::new()
    };
    let init = initialised(insns);
    let (verified, origin) = emit(insns, limit, &heads, &init, Fix::None)?;
    let fix = if readback {
        Fix::IsaAndReadback
    } else {
        Fix::Isa
    };
    let (mut runnable, _) = emit(insns, limit, &heads, &init, fix)?;
    for i in runnable
        .iter_mut()
        .filter(|i| i.is_lddw() && i.src == PSEUDO_MAP_FD)
    {
        i.src = 0;
    }
    // The stack pointer's store (and the context address's) are prepended: relative jumps
    // inside keep their meaning and nothing jumps to the first instruction.
    if limit.is_some() && readback {
        runnable.insert(0, ins(STXW, 10, 1, CTX_ADDR_SLOT, 0));
    }
    runnable.insert(0, ins(STXDW, 1, 10, CTX_STACK_SLOT, 0));
    Ok(Lowered {
        verified,
        runnable,
        origin,
        loop_heads: heads,
    })
}

/// What [`emit`] adds for rbpf beyond the verified program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    /// Nothing: the program PREVAIL verifies.
    None,
    /// [`isa_fix`]'s forms.
    Isa,
    /// [`isa_fix`]'s forms and, with a meter, the exits through the meter's tail.
    IsaAndReadback,
}

/// The program with the meter at `heads` and the atomic lowering, and what `fix` adds; with
/// each emitted instruction's original.
fn emit(
    insns: &[Insn],
    limit: Option<i32>,
    heads: &[(usize, u32)],
    init: &[u16],
    fix: Fix,
) -> Result<(Vec<Insn>, Vec<Option<usize>>), LowerError> {
    let readback = fix == Fix::IsaAndReadback && limit.is_some();
    let fix = fix != Fix::None;
    let n = insns.len();
    let scratch = |index: usize, taken: &[u8], what| {
        (0..10u8)
            .rev()
            .find(|r| init[index] & (1 << r) != 0 && !taken.contains(r))
            .ok_or(LowerError::NoScratchRegister { index, what })
    };

    // Emit, remembering where each original instruction's expansion starts (jump targets)
    // and where the instruction itself lands (jump sources).
    let mut out: Vec<Insn> = Vec::with_capacity(n + 8 * heads.len() + 4);
    let mut origin = Vec::with_capacity(out.capacity());
    let mut start = vec![0usize; n + 1];
    let mut at = vec![0usize; n];
    let mut to_exhausted = Vec::new();
    let mut to_tail = Vec::new();
    let emit = |out: &mut Vec<Insn>, origin: &mut Vec<Option<usize>>, i: Insn, o| {
        out.push(i);
        origin.push(o);
    };
    if let Some(limit) = limit {
        emit(
            &mut out,
            &mut origin,
            ins(STW_IMM, 10, 0, METER_SLOT, limit),
            None,
        );
    }
    let mut index = 0;
    while index < n {
        let i = insns[index];
        start[index] = out.len();
        if let Some(&(_, span)) = heads.iter().find(|(h, _)| *h == index) {
            let t = scratch(index, &[], "instruction meter")?;
            let o = Some(index);
            let span = i32::try_from(span).unwrap_or(i32::MAX);
            emit(&mut out, &mut origin, ins(STXDW, 10, t, SPILL_SLOT, 0), o);
            emit(&mut out, &mut origin, ins(LDXW, t, 10, METER_SLOT, 0), o);
            emit(&mut out, &mut origin, ins(SUB64_IMM, t, 0, 0, span), o);
            emit(&mut out, &mut origin, ins(STXW, 10, t, METER_SLOT, 0), o);
            to_exhausted.push(out.len());
            emit(&mut out, &mut origin, ins(JSLT_IMM, t, 0, 0, 0), o);
            emit(&mut out, &mut origin, ins(LDXDW, t, 10, SPILL_SLOT, 0), o);
        }
        at[index] = out.len();
        let o = Some(index);
        if matches!(i.code, ATOMIC_DW | ATOMIC_W) {
            // The loader refused every other atomic operation; this is a plain add.
            let t = scratch(index, &[i.dst, i.src], "atomic add")?;
            let (load, add, store) = if i.code == ATOMIC_DW {
                (LDXDW, ADD64_REG, STXDW)
            } else {
                (LDXW, ADD32_REG, STXW)
            };
            emit(&mut out, &mut origin, ins(STXDW, 10, t, SPILL_SLOT, 0), o);
            emit(&mut out, &mut origin, ins(load, t, i.dst, i.off, 0), o);
            emit(&mut out, &mut origin, ins(add, t, i.src, 0, 0), o);
            emit(&mut out, &mut origin, ins(store, i.dst, t, i.off, 0), o);
            emit(&mut out, &mut origin, ins(LDXDW, t, 10, SPILL_SLOT, 0), o);
        } else if i.code == EXIT && readback {
            to_tail.push(out.len());
            emit(&mut out, &mut origin, ins(JA, 0, 0, 0, 0), o);
        } else {
            let forms = if fix { isa_fix(i) } else { [Some(i), None] };
            for form in forms.into_iter().flatten() {
                emit(&mut out, &mut origin, form, o);
            }
        }
        if i.is_lddw() && index + 1 < n {
            start[index + 1] = out.len();
            at[index + 1] = out.len();
            emit(&mut out, &mut origin, insns[index + 1], o);
            index += 2;
        } else {
            index += 1;
        }
    }
    start[n] = out.len();
    let exhausted = out.len();
    if limit.is_some() {
        emit(
            &mut out,
            &mut origin,
            ins(MOV64_IMM, 0, 0, 0, METER_EXHAUSTED),
            None,
        );
        if !readback {
            emit(&mut out, &mut origin, ins(EXIT, 0, 0, 0, 0), None);
        }
    }
    let tail = out.len();
    if readback {
        for form in meter_exit() {
            emit(&mut out, &mut origin, form, None);
        }
    }

    // Jump offsets, relative to the next instruction.
    let offset = |from: usize, to: usize, index| {
        i16::try_from(to as i64 - from as i64 - 1).map_err(|_| LowerError::JumpTooLong { index })
    };
    for index in 0..n {
        let i = insns[index];
        if is_jump(i) && (index == 0 || !insns[index - 1].is_lddw()) {
            let target = jump_target(index, i).min(n);
            out[at[index]].off = offset(at[index], start[target], index)?;
        }
    }
    for &j in &to_exhausted {
        out[j].off = offset(j, exhausted, origin[j].unwrap_or(0))?;
    }
    for &j in &to_tail {
        out[j].off = offset(j, tail, origin[j].unwrap_or(0))?;
    }

    Ok((out, origin))
}

/// `i` as rbpf 0.4.1's JIT must see it to compute what RFC 9669 (and PREVAIL's proof) says:
/// its x86-64 JIT keeps the upper half of the destination in `w = w` (a 64-bit `mov`), `le16`
/// and `le32` (no code at all) and a 32-bit modulo by zero (the destination left as it was),
/// where eBPF zero-extends. A program proved safe would then compute other addresses than
/// the ones proved (seen in review: a read past the stack). The fix: a 32-bit `and` with all
/// ones (`w &= -1`, which x86 zero-extends) after `w = w` and the 32-bit modulo, in place of
/// `w = w` on one register and of `le32`, and `w &= 0xffff` in place of `le16`; `le64`
/// (no-op on this little-endian machine) stays as it is. Each fixed form computes the same
/// value on the ISA (see the module's documentation for why that carries the proof over).
fn isa_fix(i: Insn) -> [Option<Insn>; 2] {
    let zext = |dst| ins(AND32_IMM, dst, 0, 0, -1);
    match i.code {
        MOV32_REG if i.dst == i.src => [Some(zext(i.dst)), None],
        MOV32_REG | MOD32_IMM | MOD32_REG => [Some(i), Some(zext(i.dst))],
        LE if i.imm == 16 => [Some(ins(AND32_IMM, i.dst, 0, 0, 0xffff)), None],
        LE if i.imm == 32 => [Some(zext(i.dst)), None],
        _ => [Some(i), None],
    }
}

/// The exit tail: stores the meter's counter in the context, then exits (see the module's
/// documentation); r1 and r2 are dead at an exit.
fn meter_exit() -> [Insn; 4] {
    [
        ins(LDXW, 1, 10, CTX_ADDR_SLOT, 0),
        ins(LDXW, 2, 10, METER_SLOT, 0),
        ins(STXW, 1, 2, CTX_METER_SLOT, 0),
        ins(EXIT, 0, 0, 0, 0),
    ]
}

/// An instruction from its fields.
pub(crate) fn ins(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        dst,
        src,
        off,
        imm,
    }
}

/// Whether `i` is a jump with an offset (classes JMP and JMP32, not call or exit).
fn is_jump(i: Insn) -> bool {
    matches!(i.code & 0x07, 0x05 | 0x06) && !matches!(i.code & 0xf0, 0x80 | 0x90)
}

/// The index a jump at `index` lands on (clamped at 0; the verifier proved it inside).
fn jump_target(index: usize, i: Insn) -> usize {
    usize::try_from(index as i64 + 1 + i64::from(i.off)).unwrap_or(0)
}

/// The targets of backward jumps with the span of their longest back edge, sorted.
fn loop_heads(insns: &[Insn]) -> Vec<(usize, u32)> {
    let mut heads: std::collections::BTreeMap<usize, u32> = Default::default();
    for (index, &i) in insns.iter().enumerate() {
        if index > 0 && insns[index - 1].is_lddw() {
            continue;
        }
        if is_jump(i) {
            let target = jump_target(index, i);
            if target <= index {
                let span = u32::try_from(index - target + 1).unwrap_or(u32::MAX);
                let e = heads.entry(target).or_insert(0);
                *e = (*e).max(span);
            }
        }
    }
    heads.into_iter().collect()
}

/// For each instruction, the registers (bit r) initialised on every path that reaches it:
/// r1 and r10 at entry, a register once written; a call defines r0 and leaves r1–r5
/// uninitialised, as the verifiers model it.
fn initialised(insns: &[Insn]) -> Vec<u16> {
    let n = insns.len();
    let mut state = vec![u16::MAX; n];
    let mut reached = vec![false; n];
    let mut work = vec![0usize];
    if n > 0 {
        state[0] = (1 << 1) | (1 << 10);
        reached[0] = true;
    }
    while let Some(index) = work.pop() {
        let i = insns[index];
        let mut s = state[index];
        let class = i.code & 0x07;
        let mut succ: [Option<usize>; 2] = [Some(index + 1), None];
        match class {
            0x00 if i.code == LDDW => {
                s |= 1 << i.dst;
                succ[0] = Some(index + 2);
            }
            0x01 | 0x04 | 0x07 => s |= 1 << i.dst,
            0x05 | 0x06 if i.code == CALL => s = (s & !0b11_1110) | 1,
            0x05 | 0x06 if i.code == EXIT => succ[0] = None,
            0x05 | 0x06 => {
                let target = jump_target(index, i);
                if i.code == JA {
                    succ[0] = Some(target);
                } else {
                    succ[1] = Some(target);
                }
            }
            _ => {}
        }
        for next in succ.into_iter().flatten().filter(|&j| j < n) {
            let merged = if reached[next] { state[next] & s } else { s };
            if !reached[next] || merged != state[next] {
                reached[next] = true;
                state[next] = merged;
                work.push(next);
            }
        }
    }
    state
}

#[cfg(test)]
mod tests;
