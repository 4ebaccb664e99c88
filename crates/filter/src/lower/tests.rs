//! The lowering's shape: jump offsets, loop heads, scratch registers.

use super::*;

const EXIT_I: Insn = Insn {
    code: EXIT,
    dst: 0,
    src: 0,
    off: 0,
    imm: 0,
};

fn mov(dst: u8, imm: i32) -> Insn {
    ins(MOV64_IMM, dst, 0, 0, imm)
}

/// The original instruction a lowered jump lands on (skipping the meter's block).
fn landing(l: &Lowered, at: usize) -> Option<usize> {
    let target = (at as i64 + 1 + i64::from(l.verified[at].off)) as usize;
    l.origin[target]
}

#[test]
fn a_program_without_loops_or_atomics_only_gains_the_meter_entry() {
    let p = [mov(0, 2), EXIT_I];
    let l = lower(&p, Some(1000)).expect("lowers");
    assert_eq!(l.verified[0], ins(STW_IMM, 10, 0, METER_SLOT, 1000));
    assert_eq!(&l.verified[1..3], &p);
    assert!(l.loop_heads.is_empty());
    // The exhaustion block; for rbpf the stack pointer's and the context address's stores
    // prepended, and the exits jumping to one tail that stores the meter's counter in the
    // context first (the exhaustion block falls into it).
    assert_eq!(l.verified.len(), 5);
    assert_eq!(l.runnable.len(), 5 + 2 + 3);
    assert_eq!(l.runnable[0], ins(STXDW, 1, 10, CTX_STACK_SLOT, 0));
    assert_eq!(l.runnable[1], ins(STXW, 10, 1, CTX_ADDR_SLOT, 0));
    assert_eq!(l.runnable[4], ins(JA, 0, 0, 1, 0));
    assert_eq!(l.runnable[5], ins(MOV64_IMM, 0, 0, 0, METER_EXHAUSTED));
    assert_eq!(&l.runnable[6..], &meter_exit());
}

#[test]
fn a_loop_head_gets_the_meter_and_jumps_are_retargeted() {
    // 0: r2 = 10
    // 1: r2 -= 1        <- head
    // 2: if r2 != 0 goto 1
    // 3: if r2 == 5 goto 5  (forward over the exit)
    // 4: exit
    // 5: r0 = 2
    // 6: exit
    let p = [
        mov(2, 10),
        ins(SUB64_IMM, 2, 0, 0, 1),
        ins(0x55, 2, 0, -2, 0),
        ins(0x15, 2, 0, 1, 5),
        EXIT_I,
        mov(0, 2),
        EXIT_I,
    ];
    let l = lower(&p, Some(50)).expect("lowers");
    assert_eq!(l.loop_heads, [(1, 2)]);
    let back = l
        .origin
        .iter()
        .position(|&o| o == Some(2))
        .expect("jump kept");
    // The back edge lands on the head's meter block, which belongs to instruction 1.
    let target = (back as i64 + 1 + i64::from(l.verified[back].off)) as usize;
    assert_eq!(l.origin[target], Some(1));
    assert_eq!(l.verified[target].code, STXDW, "the meter's spill");
    // The meter's scratch register is one initialised on every path: r2 (or r1).
    assert!(matches!(l.verified[target].src, 1 | 2));
    let fwd = l
        .origin
        .iter()
        .position(|&o| o == Some(3))
        .expect("jump kept");
    assert_eq!(landing(&l, fwd), Some(5));
    // The meter's exit lands on the exhaustion block.
    let exit = l
        .verified
        .iter()
        .position(|i| i.code == JSLT_IMM)
        .expect("meter test");
    let t = (exit as i64 + 1 + i64::from(l.verified[exit].off)) as usize;
    assert_eq!(l.verified[t], ins(MOV64_IMM, 0, 0, 0, METER_EXHAUSTED));
}

#[test]
fn an_atomic_add_becomes_load_add_store_with_a_spilled_scratch() {
    // r2 = 1; lock *(u64 *)(r10 - 8) += r2; r0 = 2; exit
    let p = [mov(2, 1), ins(ATOMIC_DW, 10, 2, -8, 0), mov(0, 2), EXIT_I];
    let l = lower(&p, Some(10)).expect("lowers");
    let body: Vec<Insn> = l
        .verified
        .iter()
        .zip(&l.origin)
        .filter(|(_, o)| **o == Some(1))
        .map(|(i, _)| *i)
        .collect();
    // r1 is the only other register initialised there.
    assert_eq!(
        body,
        [
            ins(STXDW, 10, 1, SPILL_SLOT, 0),
            ins(LDXDW, 1, 10, -8, 0),
            ins(ADD64_REG, 1, 2, 0, 0),
            ins(STXDW, 10, 1, -8, 0),
            ins(LDXDW, 1, 10, SPILL_SLOT, 0),
        ]
    );
}

#[test]
fn no_initialised_scratch_register_is_an_error_not_a_guess() {
    // After a call only r0 (and r6–r9 if written) are initialised; here the atomic's
    // operands are r0 and r10: nothing else to spill.
    let p = [
        ins(CALL, 0, 0, 0, 5),
        ins(ATOMIC_DW, 10, 0, -8, 0),
        mov(0, 2),
        EXIT_I,
    ];
    assert_eq!(
        lower(&p, Some(10)),
        Err(LowerError::NoScratchRegister {
            index: 1,
            what: "atomic add"
        })
    );
}

#[test]
fn map_references_become_plain_handles_only_in_the_runnable_code() {
    let p = [
        ins(LDDW, 1, PSEUDO_MAP_FD, 0, 2),
        ins(0, 0, 0, 0, 0),
        mov(0, 2),
        EXIT_I,
    ];
    let l = lower(&p, Some(10)).expect("lowers");
    assert_eq!(l.verified[1].src, PSEUDO_MAP_FD);
    assert_eq!(l.runnable[3].src, 0);
    assert_eq!(l.runnable[3].imm, 2);
    assert!(lower(&p, Some(u64::MAX)).is_err());
}

#[test]
fn without_a_meter_only_the_atomics_change() {
    let p = [
        mov(2, 1),
        ins(ATOMIC_W, 10, 2, -8, 0),
        ins(0x55, 2, 0, -3, 0),
        mov(0, 2),
        EXIT_I,
    ];
    let l = lower(&p, None).expect("lowers");
    assert!(l.loop_heads.is_empty());
    assert_eq!(l.verified.len(), p.len() + 4);
    assert_eq!(l.verified[1], ins(STXDW, 10, 1, SPILL_SLOT, 0));
    assert_eq!(l.verified[2], ins(LDXW, 1, 10, -8, 0));
    assert_eq!(l.verified[3], ins(ADD32_REG, 1, 2, 0, 0));
    // The back edge still lands on instruction 0.
    assert_eq!(landing(&l, 6), Some(0));
}
