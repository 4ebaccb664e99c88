//! Running verified programs (issue 18 §1.4, §3): rbpf's x86-64 JIT behind the lowering pass,
//! with XDP frames, maps and helpers.
//!
//! [`Program::instantiate`] lowers the program ([`crate::lower`]: instruction meter, atomic
//! add, map handles), verifies the lowered program again with PREVAIL, allocates its maps
//! and compiles it once to refuse what rbpf's JIT cannot hold (its code buffer is one 4 KiB
//! page and it panics past it). [`Instance::runtime`] then makes one [`Runtime`] per worker:
//! its own JIT copy (rbpf's VM is not `Sync`), the worker's index (per-CPU maps,
//! `rx_queue_index`) and its ChaCha8 stream for `bpf_get_prandom_u32`. The maps are shared
//! by every runtime of an instance.
//!
//! rbpf's JIT maps its code page read-write-execute and never makes it read-only (a known
//! weakness of rbpf 0.4.1); code is generated only from verified, lowered bytecode.
//! [`Engine::Interpreter`] runs the same bytecode in rbpf's interpreter, which checks every
//! memory access against the context, the packet area, its stack and the map values: the
//! tests' oracle for the JIT.

mod frame;
mod helpers;
mod maps;

#[cfg(test)]
mod conformance;

pub use frame::{FrameBuf, FrameError, ETH_HLEN, HEADROOM, MAX_MTU, TAILROOM};
pub use maps::{Map, MapError, BPF_ANY, BPF_EXIST, BPF_NOEXIST, MAX_MAP_BYTES};

use crate::lower::{self, LowerError, Lowered, METER_EXHAUSTED};
use crate::{LoadError, Program};
use helpers::{RunState, Running};
use rand_core::SeedableRng;
use std::sync::Arc;

/// The eBPF stack's size in bytes (the program's 496 and the runtime's 16).
pub(crate) const STACK_BYTES: u64 = 512;

/// The default instruction limit per packet (the verifier's loop bound is 100 000 too).
pub const DEFAULT_INSN_LIMIT: u64 = 100_000;

/// The message of a program whose machine code does not fit rbpf's JIT.
pub const JIT_TOO_LARGE: &str =
    "needs more than 4096 bytes of machine code; split it or wait for the runtime upgrade";

/// How to instantiate a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunConfig {
    /// Original instructions a run may execute in loops before it is stopped (ABORTED).
    pub insn_limit: u64,
    /// Workers that will run the program (per-CPU maps keep one value per worker).
    pub workers: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            insn_limit: DEFAULT_INSN_LIMIT,
            workers: 1,
        }
    }
}

/// Which rbpf engine runs a [`Runtime`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// The x86-64 JIT: no memory checks at run time (the verifier's proof stands for them).
    Jit,
    /// The interpreter: every load and store checked; for tests and fuzzing.
    Interpreter,
}

/// Why a verified program cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The lowering pass failed.
    #[error("section `{section}`: {source}")]
    Lower {
        /// The program's section.
        section: String,
        /// Why.
        #[source]
        source: LowerError,
    },
    /// PREVAIL refused the lowered program (a bug of the lowering, never the tenant's).
    #[error("the lowered program failed verification (a runtime bug): {0}")]
    Reverify(#[source] Box<LoadError>),
    /// A map could not be allocated.
    #[error(transparent)]
    Map(#[from] MapError),
    /// rbpf refused the lowered bytecode.
    #[error("section `{section}`: rbpf refused the program: {reason}")]
    Rbpf {
        /// The program's section.
        section: String,
        /// rbpf's error.
        reason: String,
    },
    /// The machine code does not fit rbpf's 4 KiB JIT buffer.
    #[error("section `{section}`: {length} instructions after lowering {JIT_TOO_LARGE}")]
    TooLarge {
        /// The program's section.
        section: String,
        /// The lowered program's length in instructions.
        length: usize,
    },
    /// A worker index outside the instance's workers.
    #[error("worker {worker} of an instance for {workers} workers")]
    Worker {
        /// The worker asked for.
        worker: usize,
        /// The instance's workers.
        workers: usize,
    },
}

/// An XDP action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XdpAction {
    /// `XDP_ABORTED` (0), or anything the program did wrong: dropped and counted.
    Aborted,
    /// `XDP_DROP` (1).
    Drop,
    /// `XDP_PASS` (2).
    Pass,
    /// `XDP_TX` (3): send the (rewritten) frame back where it came from.
    Tx,
}

/// Why a run ended ABORTED.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Abort {
    /// The program returned `XDP_ABORTED`.
    Returned,
    /// The program returned a value that is no action (4 `XDP_REDIRECT` included).
    InvalidAction(u64),
    /// The instruction meter ran out.
    InsnLimit,
    /// The interpreter caught a memory access outside the allowed memory (never with a
    /// sound verifier; the JIT does not check).
    Fault(String),
}

/// The outcome of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What to do with the frame.
    pub action: XdpAction,
    /// Why it is ABORTED, when it is.
    pub abort: Option<Abort>,
    /// The packet's bounds after the run ([`FrameBuf::bounds`]).
    pub bounds: std::ops::Range<usize>,
}

/// Per-runtime counters (worker-local; the caller folds them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Runs that ended ABORTED, for any reason.
    pub aborted: u64,
    /// Runs that returned `XDP_DROP`.
    pub dropped: u64,
    /// Runs that returned `XDP_PASS`.
    pub passed: u64,
    /// Runs that returned `XDP_TX`.
    pub tx: u64,
    /// Of the aborted runs, those stopped by the instruction meter.
    pub insn_limit: u64,
    /// Of the aborted runs, those that returned no valid action.
    pub invalid_action: u64,
    /// Of the aborted runs, memory faults the interpreter caught.
    pub faults: u64,
    /// Instructions the meter charged (every trip around a loop charges the loop's span;
    /// code outside loops is not charged).
    pub metered_insns: u64,
}

impl Program {
    /// Lowers, re-verifies and compiles the program, and allocates its maps.
    pub fn instantiate(&self, config: RunConfig) -> Result<Instance, RunError> {
        self.instantiate_sharing(config, &[])
    }

    /// [`Program::instantiate`], taking each map from `maps` when one there has the same
    /// declaration (name, kind, sizes, entries, flags) and is kept for as many workers: the
    /// programs of one object share its maps, as under libbpf, and a program replaced by one
    /// with the same maps keeps their contents.
    pub fn instantiate_sharing(
        &self,
        config: RunConfig,
        maps: &[Arc<Map>],
    ) -> Result<Instance, RunError> {
        // With the meter's count read back at the exits if the JIT still holds the program
        // then, else without (the program runs; its metered instructions are not counted).
        let lower = |readback| {
            lower::lower_with(self.instructions(), Some(config.insn_limit), readback).map_err(
                |source| RunError::Lower {
                    section: self.section().to_owned(),
                    source,
                },
            )
        };
        let lowered = lower(true)?;
        let descriptors: Vec<_> = self
            .maps()
            .iter()
            .enumerate()
            .map(|(i, m)| m.descriptor(crate::handle(i)))
            .collect();
        crate::verify::verify_with_stack(
            self.section(),
            &lowered.verified,
            &descriptors,
            &Default::default(),
            STACK_BYTES as i32,
            true,
        )
        .map_err(|e| RunError::Reverify(Box::new(e)))?;
        let maps = self
            .maps()
            .iter()
            .map(|spec| {
                let copies = if spec.kind == crate::MapKind::PerCpuArray {
                    config.workers.max(1)
                } else {
                    1
                };
                match maps
                    .iter()
                    .find(|m| m.spec() == spec && m.copies() == copies)
                {
                    Some(m) => Ok(Arc::clone(m)),
                    None => Map::new(spec, config.workers).map(Arc::new),
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let code =
            |l: &Lowered| -> Arc<[u8]> { l.runnable.iter().flat_map(|i| i.to_bytes()).collect() };
        let mut instance = Instance {
            section: self.section().to_owned(),
            code: code(&lowered),
            lowered: Arc::new(lowered),
            maps: Arc::new(maps),
            workers: config.workers.max(1),
            // `lower` refused a limit above i32::MAX.
            insn_limit: u32::try_from(config.insn_limit).unwrap_or(u32::MAX),
            counts_insns: true,
        };
        // Compile once here, so that a program the JIT cannot hold is refused at load.
        if let Err(RunError::TooLarge { .. }) = instance.runtime(0, Engine::Jit, 0) {
            let plain = lower(false)?;
            instance.code = code(&plain);
            instance.lowered = Arc::new(plain);
            instance.counts_insns = false;
        }
        instance.runtime(0, Engine::Jit, 0)?;
        Ok(instance)
    }
}

/// A program ready to run: lowered, verified twice, with its maps.
#[derive(Debug, Clone)]
pub struct Instance {
    section: String,
    lowered: Arc<Lowered>,
    code: Arc<[u8]>,
    maps: Arc<Vec<Arc<Map>>>,
    workers: usize,
    insn_limit: u32,
    /// Whether the runnable code stores the meter's count at its exits.
    counts_insns: bool,
}

impl Instance {
    /// Whether runs count the instructions the meter charged (`Counters::metered_insns`):
    /// not when the code that stores the count would not fit the JIT's 4 KiB.
    pub fn counts_insns(&self) -> bool {
        self.counts_insns
    }

    /// The lowered program.
    pub fn lowered(&self) -> &Lowered {
        &self.lowered
    }

    /// The program's maps, in the order of [`Program::maps`].
    pub fn maps(&self) -> &[Arc<Map>] {
        &self.maps
    }

    /// The map called `name`.
    pub fn map(&self, name: &str) -> Option<&Arc<Map>> {
        self.maps.iter().find(|m| m.spec().name == name)
    }

    /// A runtime for `worker` (0-based, below the instance's workers) on `engine`, its
    /// `bpf_get_prandom_u32` stream seeded with `seed`.
    pub fn runtime(&self, worker: usize, engine: Engine, seed: u64) -> Result<Runtime, RunError> {
        if worker >= self.workers {
            return Err(RunError::Worker {
                worker,
                workers: self.workers,
            });
        }
        let rbpf_error = |e: std::io::Error| RunError::Rbpf {
            section: self.section.clone(),
            reason: e.to_string(),
        };
        // SAFETY: the slice borrows `self.code`'s allocation, which the runtime keeps alive
        // in its `code` field and drops after `vm` (field order); an `Arc<[u8]>` never moves
        // its contents.
        let bytes: &'static [u8] = unsafe { std::mem::transmute::<&[u8], &[u8]>(&self.code) };
        let mut vm = rbpf::EbpfVmMbuff::new(Some(bytes)).map_err(rbpf_error)?;
        let table = match engine {
            Engine::Jit => helpers::for_jit(),
            Engine::Interpreter => helpers::for_interpreter(),
        };
        for (id, f) in table {
            vm.register_helper(id, f).map_err(rbpf_error)?;
        }
        match engine {
            Engine::Jit => {
                // rbpf's JIT writes into a single 4 KiB page and asserts (panics) past it.
                let compiled =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| vm.jit_compile()));
                match compiled {
                    Ok(r) => r.map_err(rbpf_error)?,
                    Err(_) => {
                        return Err(RunError::TooLarge {
                            section: self.section.clone(),
                            length: self.lowered.runnable.len(),
                        })
                    }
                }
            }
            Engine::Interpreter => {
                for m in self.maps.iter() {
                    for r in m.ranges() {
                        vm.register_allowed_memory(r);
                    }
                }
            }
        }
        Ok(Runtime {
            vm,
            engine,
            maps: self.maps.clone(),
            worker,
            rng: rand_chacha::ChaCha8Rng::seed_from_u64(seed),
            now_ns: 0,
            ingress_ifindex: 0,
            counters: Counters::default(),
            insn_limit: self.insn_limit,
            counts_insns: self.counts_insns,
            _code: self.code.clone(),
        })
    }
}

/// One worker's compiled copy of a program.
pub struct Runtime {
    // Drops before `_code`, which it borrows.
    vm: rbpf::EbpfVmMbuff<'static>,
    engine: Engine,
    maps: Arc<Vec<Arc<Map>>>,
    worker: usize,
    rng: rand_chacha::ChaCha8Rng,
    now_ns: u64,
    ingress_ifindex: u32,
    counters: Counters,
    /// The meter's limit (what the context's meter word starts at).
    insn_limit: u32,
    /// Whether the code stores the meter's count at its exits.
    counts_insns: bool,
    _code: Arc<[u8]>,
}

// SAFETY: rbpf's VM is not `Send` only because its stack-usage verifier may hold a
// `Box<dyn Any>` of a custom calculator's data; the runtime never sets one (it is `None`).
// The rest is owned: the JIT page, the helper table (plain `fn`s), the allowed ranges.
unsafe impl Send for Runtime {}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("engine", &self.engine)
            .field("worker", &self.worker)
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// Sets what `bpf_ktime_get_ns` returns (the gateway sets the batch's start).
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// Sets `xdp_md.ingress_ifindex` for the next runs (where the packets come from).
    pub fn set_ingress(&mut self, ifindex: u32) {
        self.ingress_ifindex = ifindex;
    }

    /// The counters since the runtime was made.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Runs the program on `frame`; the frame's bounds follow `adjust_head`/`adjust_tail`.
    pub fn run(&mut self, frame: &mut FrameBuf) -> Verdict {
        frame.write_ctx(self.ingress_ifindex, self.worker as u32, self.insn_limit);
        let (data, data_end) = frame.data_addrs();
        let mut state = RunState {
            maps: &self.maps,
            worker: self.worker,
            now_ns: self.now_ns,
            rng: &mut self.rng,
            ctx: frame.ctx_addr(),
            area: (frame.area_start(), frame.area_end()),
            data,
            data_end,
        };
        let result = {
            let _running = Running::new(&mut state);
            // SAFETY: the context and the packet area are the frame's mapping, which lives
            // through the run; the program was verified (then lowered and verified again),
            // so the JIT's unchecked accesses stay in the context, the area, its stack and
            // the map values; helpers check their arguments.
            let ctx = unsafe { std::slice::from_raw_parts_mut(frame.ctx_ptr(), frame::CTX_LEN) };
            let (area, len) = frame.area_ptr();
            let area = unsafe { std::slice::from_raw_parts_mut(area, len) };
            match self.engine {
                Engine::Jit => unsafe { self.vm.execute_program_jit(&mut [], ctx) },
                Engine::Interpreter => self.vm.execute_program(area, ctx),
            }
        };
        frame.set_data_addrs(state.data, state.data_end);
        // What the meter charged: its limit less what the last exit left (negative once
        // exhausted; untouched, so nothing, if the run faulted before an exit).
        if self.counts_insns {
            let left = frame.meter_left().max(0) as u32;
            self.counters.metered_insns += u64::from(self.insn_limit.saturating_sub(left));
        }
        // The kernel takes an XDP program's verdict as the low 32 bits of r0.
        let (action, abort) = match result.map(|r| r as u32) {
            Ok(0) => (XdpAction::Aborted, Some(Abort::Returned)),
            Ok(1) => (XdpAction::Drop, None),
            Ok(2) => (XdpAction::Pass, None),
            Ok(3) => (XdpAction::Tx, None),
            Ok(r) if r == METER_EXHAUSTED as u32 => (XdpAction::Aborted, Some(Abort::InsnLimit)),
            Ok(r) => (XdpAction::Aborted, Some(Abort::InvalidAction(u64::from(r)))),
            Err(e) => (XdpAction::Aborted, Some(Abort::Fault(e.to_string()))),
        };
        let c = &mut self.counters;
        match (&action, &abort) {
            (XdpAction::Drop, _) => c.dropped += 1,
            (XdpAction::Pass, _) => c.passed += 1,
            (XdpAction::Tx, _) => c.tx += 1,
            (XdpAction::Aborted, a) => {
                c.aborted += 1;
                match a {
                    Some(Abort::InsnLimit) => c.insn_limit += 1,
                    Some(Abort::InvalidAction(_)) => c.invalid_action += 1,
                    Some(Abort::Fault(_)) => c.faults += 1,
                    _ => {}
                }
            }
        }
        Verdict {
            action,
            abort,
            bounds: frame.bounds(),
        }
    }
}
