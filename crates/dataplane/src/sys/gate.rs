//! The kernel gate of CPU fairness (`cpu_fairness = "enforce"`; docs/architecture.md, "CPU
//! charge"): a socket filter on the NAT-T sockets (by ESP SPI) and the VTEP sockets (by VNI)
//! that drops a tenant's datagrams in the kernel, before they are queued to the socket,
//! while *every* worker refuses that tenant (its token bucket empty).
//!
//! Without it a refused packet still costs the worker its receive and classification (about
//! 260 ns on the development VM) and a place in the socket's queue, where the kernel drops
//! under overload thin every tenant alike: a tenant whose program is dear (or a flood) took
//! the others' throughput down by 18 % although it was refused (`protego bench fairness`,
//! case `spin`, run 5 in docs/performance.md).
//!
//! The state is in three maps shared with the program:
//! - `keys`: hash of the packet's key (SPI or VNI, as a number) → tenant slot, kept equal to
//!   the published tables ([`Gate::sync`]);
//! - `refused`: per slot, one bit per worker that refuses the tenant now. The workers set and
//!   clear their bits in the memory-mapped array, without a system call ([`Gate::refuse`]);
//!   the program drops only when all bits are set, since the workers share the sockets and a
//!   datagram may be any worker's;
//! - `budget`: per slot, datagrams the program still lets through while the tenant is refused
//!   (a count the workers set from the tenant's new tokens, [`Gate::grant`], and the program
//!   takes from, a train all its datagrams or none): the kernel admits what the tokens pay
//!   for and drops the rest, instead of a worker receiving the whole flood to refuse most of
//!   it;
//! - `drops`: per slot, datagrams dropped by the program (a GRO train counts its segments),
//!   added to the tenant's `fair_drops` by status.

use crate::pipeline::charge::{KernelRefusal, TenantSlot};
use netio::bpf::{self, Insn, MappedArray, R0, R1, R10, R2, R6};
use std::collections::HashMap;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// Tenant slots the gate covers (every slot: they are 16-bit).
const SLOTS: usize = 1 << 16;
/// Keys (SPIs and VNIs) the gate can hold; beyond, a key's packets are refused in the worker
/// only.
const MAX_KEYS: u32 = 1 << 20;
/// Workers the bit masks hold.
pub(crate) const MAX_WORKERS: usize = 64;
/// Offsets of `gso_segs` and `gso_size` in `struct __sk_buff`.
const SKB_GSO_SEGS: i16 = 164;
const SKB_GSO_SIZE: i16 = 176;

/// What a socket carries: where its datagrams' key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Keyed {
    /// ESP in UDP (NAT-T): the SPI, the first word of the payload (0 is the non-ESP marker
    /// of IKE, which always passes).
    Spi,
    /// VXLAN: the VNI, the upper 24 bits of the payload's second word.
    Vni,
}

/// One kind of socket's program and keys.
struct Program {
    prog: OwnedFd,
    keys: OwnedFd,
    /// What `keys` holds now (key → slot).
    synced: Mutex<HashMap<u32, u32>>,
}

/// The gate (see the module's doc).
pub(crate) struct Gate {
    spi: Program,
    vni: Program,
    refused: MappedArray,
    budget: MappedArray,
    drops: MappedArray,
    _refused_map: OwnedFd,
    _budget_map: OwnedFd,
    _drops_map: OwnedFd,
}

impl Gate {
    /// A gate for `workers` workers (1..=64): the maps made and both programs loaded (not
    /// attached yet).
    pub(crate) fn new(workers: usize) -> io::Result<Self> {
        if workers == 0 || workers > MAX_WORKERS {
            return Err(io::Error::other(format!(
                "{workers} workers: the kernel gate holds 1 to {MAX_WORKERS}"
            )));
        }
        let full = if workers == MAX_WORKERS {
            u64::MAX
        } else {
            (1u64 << workers) - 1
        };
        let array = |name| {
            bpf::map_create(bpf::MAP_ARRAY, 4, 8, SLOTS as u32, bpf::F_MMAPABLE, name)
                .map_err(|e| io::Error::new(e.kind(), format!("array map {name}: {e}")))
        };
        let refused_map = array("protego_refused")?;
        let budget_map = array("protego_budget")?;
        let drops_map = array("protego_drops")?;
        let refused = MappedArray::new(&refused_map, SLOTS)?;
        let budget = MappedArray::new(&budget_map, SLOTS)?;
        let drops = MappedArray::new(&drops_map, SLOTS)?;
        let maps = Maps {
            refused: &refused_map,
            budget: &budget_map,
            drops: &drops_map,
        };
        let program = |keyed| -> io::Result<Program> {
            let name = match keyed {
                Keyed::Spi => "protego_spis",
                Keyed::Vni => "protego_vnis",
            };
            let keys = bpf::map_create(bpf::MAP_HASH, 4, 4, MAX_KEYS, bpf::F_NO_PREALLOC, name)
                .map_err(|e| io::Error::new(e.kind(), format!("hash map {name}: {e}")))?;
            let insns = program(keyed, &keys, &maps, full);
            let prog = bpf::prog_load_socket_filter(&insns, name)
                .map_err(|e| io::Error::new(e.kind(), format!("socket filter {name}: {e}")))?;
            Ok(Program {
                prog,
                keys,
                synced: Mutex::default(),
            })
        };
        Ok(Self {
            spi: program(Keyed::Spi)?,
            vni: program(Keyed::Vni)?,
            refused,
            budget,
            drops,
            _refused_map: refused_map,
            _budget_map: budget_map,
            _drops_map: drops_map,
        })
    }

    fn program(&self, keyed: Keyed) -> &Program {
        match keyed {
            Keyed::Spi => &self.spi,
            Keyed::Vni => &self.vni,
        }
    }

    /// Attaches the program for `keyed` datagrams to socket `sock`.
    pub(crate) fn attach(&self, sock: RawFd, keyed: Keyed) -> io::Result<()> {
        bpf::attach_socket(sock, &self.program(keyed).prog)
    }

    /// Makes the `keyed` keys those of `entries` (key → tenant slot): adds, changes and
    /// removes only the difference with what the map holds. A key the map has no room for is
    /// left out (its packets are refused in the workers only); the count of such is returned.
    pub(crate) fn sync(
        &self,
        keyed: Keyed,
        entries: impl Iterator<Item = (u32, TenantSlot)>,
    ) -> usize {
        let p = self.program(keyed);
        let mut synced = p.synced.lock().unwrap_or_else(|e| e.into_inner());
        let want: HashMap<u32, u32> = entries
            .filter(|&(k, _)| keyed == Keyed::Vni || k != 0)
            .map(|(k, s)| (k, u32::from(s)))
            .collect();
        let gone: Vec<u32> = synced
            .keys()
            .filter(|k| !want.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            // Already gone (ENOENT) is what was wanted.
            let _ = bpf::map_delete(&p.keys, &k.to_ne_bytes());
            synced.remove(&k);
        }
        let mut failed = 0;
        for (&k, &slot) in &want {
            if synced.get(&k) == Some(&slot) {
                continue;
            }
            match bpf::map_update(&p.keys, &k.to_ne_bytes(), &slot.to_ne_bytes()) {
                Ok(()) => {
                    synced.insert(k, slot);
                }
                Err(_) => failed += 1,
            }
        }
        failed
    }

    /// Worker `worker` refuses (`on`) or admits again `slot`'s tenant.
    pub(crate) fn refuse(&self, slot: TenantSlot, worker: usize, on: bool) {
        let Some(w) = self.refused.get(usize::from(slot)) else {
            return;
        };
        let bit = 1u64 << (worker % MAX_WORKERS);
        if on {
            w.fetch_or(bit, Ordering::Relaxed);
        } else {
            w.fetch_and(!bit, Ordering::Relaxed);
        }
    }

    /// While `slot`'s tenant is refused, the next `datagrams` of it pass (replacing what was
    /// left of an earlier grant).
    pub(crate) fn grant(&self, slot: TenantSlot, datagrams: u64) {
        if let Some(b) = self.budget.get(usize::from(slot)) {
            b.store(datagrams.min(i64::MAX as u64), Ordering::Relaxed);
        }
    }

    /// Datagrams of `slot`'s tenant the kernel dropped since the start.
    pub(crate) fn drops(&self, slot: TenantSlot) -> u64 {
        self.drops
            .get(usize::from(slot))
            .map_or(0, |d| d.load(Ordering::Relaxed))
    }
}

impl KernelRefusal for Gate {
    fn refuse(&self, slot: TenantSlot, worker: usize, on: bool) {
        Gate::refuse(self, slot, worker, on);
    }

    fn grant(&self, slot: TenantSlot, datagrams: u64) {
        Gate::grant(self, slot, datagrams);
    }
}

/// The arrays the programs share.
struct Maps<'a> {
    refused: &'a OwnedFd,
    budget: &'a OwnedFd,
    drops: &'a OwnedFd,
}

/// A program with labels: jumps to them are fixed up at the end.
struct Asm {
    insns: Vec<Insn>,
    fixups: Vec<(usize, Label)>,
    labels: [Option<usize>; 4],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Label {
    /// Keep the datagram.
    Pass = 0,
    /// Refused: count its datagrams, let it through on the budget or drop it.
    Count = 1,
    /// Count it as dropped, then drop it.
    Dropped = 2,
    /// Drop it.
    Drop = 3,
}

impl Asm {
    fn new() -> Self {
        Self {
            insns: Vec::new(),
            fixups: Vec::new(),
            labels: [None; 4],
        }
    }

    fn op(&mut self, i: Insn) -> &mut Self {
        self.insns.push(i);
        self
    }

    fn ops(&mut self, i: [Insn; 2]) -> &mut Self {
        self.insns.extend(i);
        self
    }

    /// A conditional or unconditional jump (made with offset 0) to `to`.
    fn jump(&mut self, i: Insn, to: Label) -> &mut Self {
        self.fixups.push((self.insns.len(), to));
        self.insns.push(i);
        self
    }

    /// `to` is the next instruction.
    fn label(&mut self, to: Label) -> &mut Self {
        self.labels[to as usize] = Some(self.insns.len());
        self
    }

    fn finish(mut self) -> Vec<Insn> {
        for (at, to) in std::mem::take(&mut self.fixups) {
            let target = self.labels[to as usize].expect("every label used is placed");
            let off = i16::try_from(target as i64 - at as i64 - 1).expect("jumps are short");
            self.insns[at] = self.insns[at].with_off(off);
        }
        self.insns
    }
}

/// Segments of a GSO or GRO train the program checks (the kernel's `UDP_MAX_SEGMENTS`; UDP
/// GRO merges at most 64). A longer train passes.
const TRAIN_MAX: usize = 128;

/// The socket filter: look up the datagram's key; if its tenant is refused by every worker,
/// count and drop the datagram, else keep all of it. A train (one buffer of several datagrams
/// of one 5-tuple, which UDP GRO merged) is dropped only if every datagram in it has the same
/// key: one peer's tunnels may belong to several tenants, and one host's VNIs do.
fn program(keyed: Keyed, keys: &OwnedFd, maps: &Maps<'_>, full: u64) -> Vec<Insn> {
    // The filter sees the datagram from its UDP header: the payload is at 8.
    const R7: u8 = 7;
    const R8: u8 = 8;
    const R9: u8 = 9;
    let (min_len, word) = match keyed {
        Keyed::Spi => (12, 8),
        Keyed::Vni => (16, 12),
    };
    let mut a = Asm::new();
    a.op(Insn::mov(R6, R1))
        .op(Insn::load32(R0, R6, 0))
        .jump(Insn::jlt_imm(R0, min_len, 0), Label::Pass)
        .op(Insn::load_abs32(word));
    match keyed {
        // 0 is IKE's non-ESP marker.
        Keyed::Spi => a.jump(Insn::jeq_imm(R0, 0, 0), Label::Pass),
        Keyed::Vni => a.op(Insn::rsh32_imm(R0, 8)),
    };
    // r8: the key, kept across the helper calls (r6-r9 are preserved).
    a.op(Insn::mov(R8, R0))
        .op(Insn::store32(R10, -4, R0))
        .op(Insn::mov(R2, R10))
        .op(Insn::add_imm(R2, -4))
        .ops(Insn::load_map(R1, keys))
        .op(Insn::call(1))
        .jump(Insn::jeq_imm(R0, 0, 0), Label::Pass)
        // The tenant's slot, the key of both arrays.
        .op(Insn::load32(R1, R0, 0))
        .op(Insn::store32(R10, -8, R1))
        .op(Insn::mov(R2, R10))
        .op(Insn::add_imm(R2, -8))
        .ops(Insn::load_map(R1, maps.refused))
        .op(Insn::call(1))
        .jump(Insn::jeq_imm(R0, 0, 0), Label::Pass)
        .op(Insn::load64(R1, R0, 0))
        .ops(Insn::load_imm64(R2, full))
        .jump(Insn::jne(R1, R2, 0), Label::Pass);
    // Refused by every worker. A train: r7 = its segment size, r9 = where the next segment's
    // key is; each further segment's key must be the first's (unrolled: no loop for the
    // verifier to bound).
    a.op(Insn::load32(R7, R6, SKB_GSO_SIZE))
        .jump(Insn::jeq_imm(R7, 0, 0), Label::Count)
        .op(Insn::mov(R9, R7))
        .op(Insn::add_imm(R9, word));
    for _ in 1..TRAIN_MAX {
        a.op(Insn::mov(R1, R9))
            .op(Insn::add_imm(R1, 4))
            .op(Insn::load32(R2, R6, 0))
            .jump(Insn::jgt(R1, R2, 0), Label::Count)
            .op(Insn::load_ind32(R9, 0));
        if keyed == Keyed::Vni {
            a.op(Insn::rsh32_imm(R0, 8));
        }
        a.jump(Insn::jne(R0, R8, 0), Label::Pass)
            .op(Insn::add(R9, R7));
    }
    a.jump(Insn::ja(0), Label::Pass);
    // r7: the datagrams of the buffer (`gso_segs` if it is longer than one segment, since a
    // segment split from a train may keep the train's count; else one).
    a.label(Label::Count)
        .op(Insn::mov_imm(R7, 1))
        .op(Insn::load32(R1, R6, SKB_GSO_SIZE))
        .op(Insn::jeq_imm(R1, 0, 5))
        .op(Insn::load32(R2, R6, 0))
        .op(Insn::add_imm(R2, -8))
        .op(Insn::jle(R2, R1, 2))
        .op(Insn::load32(R1, R6, SKB_GSO_SEGS))
        .op(Insn::jgt_imm(R1, 0, 1))
        .op(Insn::mov(R1, R7))
        .op(Insn::mov(R7, R1))
        // Taken from the budget: through if it held them all, else given back.
        .op(Insn::mov(R2, R10))
        .op(Insn::add_imm(R2, -8))
        .ops(Insn::load_map(R1, maps.budget))
        .op(Insn::call(1))
        .jump(Insn::jeq_imm(R0, 0, 0), Label::Dropped)
        .op(Insn::mov_imm(R1, 0))
        .op(Insn::sub(R1, R7))
        .op(Insn::atomic_fetch_add64(R0, 0, R1))
        .jump(Insn::jsge(R1, R7, 0), Label::Pass)
        .op(Insn::atomic_add64(R0, 0, R7));
    // Counted and dropped.
    a.label(Label::Dropped)
        .op(Insn::mov(R2, R10))
        .op(Insn::add_imm(R2, -8))
        .ops(Insn::load_map(R1, maps.drops))
        .op(Insn::call(1))
        .jump(Insn::jeq_imm(R0, 0, 0), Label::Drop)
        .op(Insn::atomic_add64(R0, 0, R7));
    a.label(Label::Drop)
        .op(Insn::mov_imm(R0, 0))
        .op(Insn::exit());
    // Keep the whole datagram.
    a.label(Label::Pass)
        .op(Insn::load32(R0, R6, 0))
        .op(Insn::exit());
    a.finish()
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
