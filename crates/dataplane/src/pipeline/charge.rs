//! The CPU charge (issue 18 §3; docs/architecture.md, "CPU charge"): every packet's CPU time
//! is charged to its tenant, measured with the cycle counter ([`crate::sys::tsc`]) but read
//! once per *tenant run*, not per packet: [`Charge::enter`] is called where a packet's tenant
//! becomes known (ESP open by SPI before decryption, VXLAN decap after the VNI → VNet lookup,
//! the attach stage after the tag → attachment lookup, the seal stage's choice for a TUN
//! packet) and reads the counter only when the tenant differs from the previous packet's. The
//! cycles from one reading to the next are the run's tenant's: its packets' classification,
//! decryption or decapsulation, delivery or sealing queue. Before the first tenant of a batch
//! is known, and for packets no tenant is known for, cycles are *unattributed* and reported
//! as such.
//!
//! A batch has phases: receive (one `recvmmsg`), the graph pass (with the feature chains, one
//! run per chain), encryption of the queued packets (runs of one CHILD_SA's tenant), and the
//! hand-over to the sender (`sendmmsg`, possibly other workers' batches too). The system calls'
//! cycles are split over the batch's packets by tenant counts: each packet pays an equal share
//! (the "per-packet share of the batch's system calls"). A phase that crosses more than
//! [`CAP_RUNS`] tenant runs (perfectly interleaved tenants) stops reading the counter: the
//! rest of the phase is one interval split by packet count, and the phase is counted as
//! capped, so a bench can tell how often the charge was approximate.
//!
//! Cost: one branch per packet while `cpu_fairness` is off (`Out::charge` is None); else a
//! comparison per packet, one counter read per run (14–20 ns on the development VM), and a few
//! atomic adds per tenant and batch when the batch's charges are folded into the shared
//! per-tenant counters ([`Charge::end`]).
//!
//! # Enforcement (`cpu_fairness = "enforce"`)
//! Each worker keeps one token bucket per tenant ([`fair::Buckets`], the offloading paper's
//! Algorithm 1, work-conserving, weighted by `cpu_weight`). Tokens are generated at a batch's
//! start for the intervals Δt elapsed on a *virtual* clock: the cycle counter minus the cycles
//! the worker spent inside batches on nothing a tenant is charged for. An idle worker's clock
//! runs with the wall clock (every bucket fills: nobody is refused); a saturated worker's runs
//! with the charged cycles, of which [`FairParams`] generates 31/32 (`fair::Params`' doc: as
//! many tokens as cycles would let a flood keep an unfair share), so the buckets drain and the
//! split converges to the weights. The gate is [`Charge::enter`] at the same marks: a tenant
//! whose bucket holds no token has the packet dropped there (`fair_share`), before decryption,
//! decapsulation or the attach stage; the packet is still counted and the cycles up to its
//! drop (its classification, its share of the system calls) still charged to its tenant: a
//! flood pays for itself, down to the floor −B. Every run's cycles are taken from the bucket as
//! soon as the run ends, so a tenant is refused within the batch that empties its bucket. The
//! gate also counts what the packets it already admitted in the batch will cost in their
//! tenant's feature chains (run at the end of the pass): each reserves the tenant's expected
//! chain cost per admitted packet, a moving average of its chains' measured cycles, so a
//! program at its instruction limit cannot have a whole batch admitted on a few tokens.
//!
//! The counter measures wall time. Once per millisecond the thread's CPU time is read too, and
//! the time the worker did not run in between (it was preempted) is taken back from the
//! tenants in proportion to their charges in that window ([`Charge::preemption`]).
//!
//! Nobody is refused while only one tenant was charged in the last interval: with no other
//! tenant to be fair to, a refusal would only idle the worker. (Measured with one flooded
//! tenant: since 31/32 of the charged cycles come back as tokens and a refused packet's own
//! cycles are charged too, a lone flood that keeps the worker busy even while being refused
//! never earns its bucket back, and most of it was refused.)
//!
//! Tenants are numbered with dense slots ([`TenantSlot`]) that the registry gives on first
//! sight and keeps for the process's life (a tenant removed and added again has its slot and
//! its counters back); the published [`TenantTable`] carries the slots' names, weights,
//! counters and each VNet's slot.

use crate::sys::tsc::Cycles;
use datapath::{CpuFairness, CpuFairnessConfig};
use fair::{Buckets, Occupant, Params, Weight};
use ids::TenantId;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// A tenant's dense number (see the module's doc).
pub(crate) type TenantSlot = u16;

/// No tenant (not known yet, or beyond the slots).
pub(crate) const NO_TENANT: TenantSlot = TenantSlot::MAX;

/// Tenant runs a phase measures one by one before the rest of it is split by packet count.
pub(crate) const CAP_RUNS: u32 = 8;

/// One tenant's shared counters (cycles, packets), cumulative.
#[derive(Debug, Default)]
pub(crate) struct TenantCounters {
    /// Cycles charged.
    pub(crate) cycles: AtomicU64,
    /// Packets counted.
    pub(crate) packets: AtomicU64,
    /// Packets dropped for its fair share.
    pub(crate) fair_drops: AtomicU64,
}

/// The tenants as the packet path sees them, published with the SA tables.
#[derive(Debug, Default)]
pub(crate) struct TenantTable {
    /// The mode.
    pub(crate) mode: CpuFairness,
    /// Each slot's tenant.
    pub(crate) names: Vec<TenantId>,
    /// Each slot's weight (1 unless configured).
    pub(crate) weights: Vec<u16>,
    /// Each slot's counters.
    pub(crate) counters: Vec<Arc<TenantCounters>>,
    /// Each VNet's tenant, by VNet index.
    pub(crate) vnets: Vec<TenantSlot>,
    /// The token buckets' parameters (enforcing only).
    pub(crate) params: Option<Params>,
    /// The slot of each tenant.
    by_name: HashMap<TenantId, TenantSlot>,
    /// A number no other table of this process has (a worker's buckets follow a table by
    /// it: an address could be reused by a later table).
    pub(crate) generation: u64,
}

/// A table generation no earlier table had.
fn next_generation() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// The token buckets' parameters, in cycles of the cycle counter at `cycles_per_ns`: Δt = 1 ms,
/// B = 4 ms (the design's proposal: a tenant idle for a while may burst 4 ms), tokens 31/32 of
/// Δt per interval.
pub(crate) fn fair_params(cycles_per_ns: f64) -> Result<Params, fair::FairError> {
    let ms = ((cycles_per_ns * 1e6) as u64).max(32);
    Params::new(ms, 4 * ms)?.with_tokens(ms / 32 * 31)
}

impl TenantTable {
    /// The slot of `tenant` (NO_TENANT if it has none).
    pub(crate) fn slot(&self, tenant: &TenantId) -> TenantSlot {
        self.by_name.get(tenant).copied().unwrap_or(NO_TENANT)
    }

    /// VNet `index`'s tenant's slot.
    #[inline]
    pub(crate) fn vnet(&self, index: usize) -> TenantSlot {
        self.vnets.get(index).copied().unwrap_or(NO_TENANT)
    }
}

/// The registry's tenant slots and weights (edited under the registry's lock).
#[derive(Debug, Default)]
pub(crate) struct TenantBook {
    mode: CpuFairness,
    params: Option<Params>,
    names: Vec<TenantId>,
    counters: Vec<Arc<TenantCounters>>,
    by_name: HashMap<TenantId, TenantSlot>,
    weights: HashMap<TenantId, u16>,
}

impl TenantBook {
    /// `tenant`'s slot, given now if it has none (NO_TENANT once every slot is given).
    pub(crate) fn slot(&mut self, tenant: &TenantId) -> TenantSlot {
        if let Some(&s) = self.by_name.get(tenant) {
            return s;
        }
        let Ok(s) = TenantSlot::try_from(self.names.len()) else {
            return NO_TENANT;
        };
        if s == NO_TENANT {
            return NO_TENANT;
        }
        self.names.push(tenant.clone());
        self.counters.push(Arc::default());
        self.by_name.insert(tenant.clone(), s);
        s
    }

    /// Sets the mode, the weights and (enforcing) the buckets' parameters.
    pub(crate) fn configure(&mut self, cfg: &CpuFairnessConfig, params: Option<Params>) {
        self.mode = cfg.mode;
        self.params = params;
        self.weights = cfg.weights.iter().cloned().collect();
    }

    /// The published table, with the slots of the VNets' tenants `vnets` (by VNet index; a
    /// tenant without a slot yet gets none: give slots with [`slot`](Self::slot) first).
    pub(crate) fn table<'a>(&self, vnets: impl Iterator<Item = &'a TenantId>) -> TenantTable {
        let vnets = vnets
            .map(|t| self.by_name.get(t).copied().unwrap_or(NO_TENANT))
            .collect();
        TenantTable {
            mode: self.mode,
            names: self.names.clone(),
            weights: self
                .names
                .iter()
                .map(|n| self.weights.get(n).copied().unwrap_or(1).max(1))
                .collect(),
            counters: self.counters.clone(),
            vnets,
            params: self.params.filter(|_| self.mode == CpuFairness::Enforce),
            by_name: self.by_name.clone(),
            generation: next_generation(),
        }
    }
}

/// A worker's CPU charge of the current batch (see the module's doc).
pub(crate) struct Charge {
    clock: Box<dyn Cycles>,
    /// The tenant of the current run.
    current: TenantSlot,
    /// The reading at which the current run (or the capped tail) began.
    since: u64,
    /// Runs begun in this phase.
    runs: u32,
    /// After [`CAP_RUNS`] runs: the phase's packets since the last reading, by tenant.
    tail: Option<Vec<(TenantSlot, u32)>>,
    /// Cycles of the batch's system calls, split at the end.
    syscalls: u64,
    /// Per slot: cycles and packets of this batch.
    cycles: Vec<u64>,
    packets: Vec<u32>,
    /// Slots charged or counted in this batch, once each.
    touched: Vec<TenantSlot>,
    /// Cycles no tenant is known for, in this batch.
    unattributed: u64,
    /// Phases capped in this batch.
    capped: u64,
    /// Packets dropped for their fair share in this batch, per slot.
    refused: Vec<u32>,
    /// Cycles spent on nothing charged to a tenant, since the start: inside batches (no
    /// tenant known) and between them (housekeeping, polls that found work, the lanes' locks),
    /// all but the worker's idle waits. The virtual clock of the buckets runs that much behind
    /// the counter, so tokens are generated for charged and idle cycles only: a saturated
    /// worker generates 31/32 of what it charges, whatever its overhead.
    uncharged: u64,
    /// Where the time between batches was last accounted up to (a batch's start or end).
    mark: Option<u64>,
    /// Cycles of idle waits ([`idle`](Self::idle)) since `mark`.
    idle: u64,
    /// A batch is under way (between [`start`](Self::start) and [`end`](Self::end)).
    in_batch: bool,
    /// Enforcing: the token buckets.
    enforce: Option<Enforce>,
    /// Counter cycles between two readings of the thread's CPU time (1 ms).
    cpu_every: u64,
    /// The counter and the thread's CPU time at the last reading of the latter.
    cpu_mark: Option<(u64, u64)>,
    /// Idle cycles since `cpu_mark`.
    window_idle: u64,
    /// Per slot: cycles charged since `cpu_mark`.
    window: Vec<u64>,
    /// Per slot: cycles taken back from its charge (preemption) not folded yet.
    refunded: Vec<u64>,
    /// Cycles taken back from the tenants' charges (preemption) since the last fold.
    preempted: u64,
    /// The current run is a feature chain's (its cycles are its tenant's chain cost).
    chain: bool,
    /// Per slot: cycles of its feature chains in this batch.
    chain_cycles: Vec<u64>,
    /// Per slot: the expected cost of its chains per packet it has admitted (a moving
    /// average over batches), in cycles.
    chain_cost: Vec<u64>,
    /// Per slot (enforcing): the expected cost of its packets admitted in this batch that
    /// has not been charged yet.
    reserved: Vec<u64>,
    /// Where this worker's refusals also reach the kernel (the gate of `sys::gate`), and the
    /// worker's number there.
    kernel: Option<(Arc<dyn KernelRefusal>, usize)>,
    /// Slots this worker has the kernel refuse now.
    in_kernel: Vec<TenantSlot>,
    /// Per slot: the cycles charged to it per packet it had admitted (a moving average over
    /// batches; its refusals included, since its tokens pay for them too): what a datagram
    /// the kernel lets through will cost its bucket.
    admitted_cost: Vec<u64>,
}

/// Where a worker's refusals reach the kernel, which drops a tenant's datagrams before they
/// are queued to the sockets while every worker refuses it (`sys::gate::Gate`; the tests
/// record them instead).
pub(crate) trait KernelRefusal: Send + Sync {
    /// Worker `worker` refuses (`on`) or admits again `slot`'s tenant.
    fn refuse(&self, slot: TenantSlot, worker: usize, on: bool);

    /// While it is refused, the kernel lets the next `datagrams` of `slot`'s tenant through
    /// (what its tokens can pay for), replacing what was left of an earlier grant.
    fn grant(&self, slot: TenantSlot, datagrams: u64);
}

/// A worker's token buckets and the tenant table they were sized for.
struct Enforce {
    buckets: Buckets,
    /// The generation of the table the buckets follow.
    table: u64,
    /// Tokens were generated since [`Charge::tokens`] last looked.
    generated: bool,
    /// Per slot: the interval (number) in which it was last charged.
    stamp: Vec<u64>,
    /// The current interval's number (since the buckets were made).
    interval: u64,
    /// Tenants charged in the current interval.
    active: u32,
    /// Two tenants or more were charged in the last interval: refusals are on.
    competing: bool,
}

/// One tenant's charge in a batch (handed to the fold of [`Charge::end`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Charged {
    /// Its slot.
    pub(crate) slot: TenantSlot,
    /// Cycles charged.
    pub(crate) cycles: u64,
    /// Packets counted.
    pub(crate) packets: u64,
    /// Packets dropped for the fair share.
    pub(crate) refused: u64,
    /// Cycles taken back from earlier charges (folded before this batch's): the worker was
    /// preempted while it charged them.
    pub(crate) refunded: u64,
}

/// What one batch's charge amounted to (folded into the shared counters by the worker).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Folded {
    /// Cycles no tenant is known for.
    pub(crate) unattributed: u64,
    /// Capped phases.
    pub(crate) capped: u64,
    /// Cycles taken back from the tenants' charges (the worker was preempted).
    pub(crate) preempted: u64,
}

impl Charge {
    /// A charge reading `clock`.
    pub(crate) fn new(clock: Box<dyn Cycles>) -> Self {
        Self {
            clock,
            current: NO_TENANT,
            since: 0,
            runs: 0,
            tail: None,
            syscalls: 0,
            cycles: Vec::new(),
            packets: Vec::new(),
            touched: Vec::new(),
            unattributed: 0,
            capped: 0,
            refused: Vec::new(),
            uncharged: 0,
            mark: None,
            idle: 0,
            in_batch: false,
            enforce: None,
            cpu_every: crate::sys::tsc::from_ns(1_000_000),
            cpu_mark: None,
            window_idle: 0,
            window: Vec::new(),
            refunded: Vec::new(),
            preempted: 0,
            chain: false,
            chain_cycles: Vec::new(),
            chain_cost: Vec::new(),
            reserved: Vec::new(),
            kernel: None,
            in_kernel: Vec::new(),
            admitted_cost: Vec::new(),
        }
    }

    /// Has `kernel` refuse (as worker `worker`) the floods this worker refuses, while
    /// enforcing: a tenant of which a batch refused more than half the packets, its bucket
    /// still empty at the batch's end, is refused there, with a budget of the datagrams its
    /// tokens pay for set at every generation, until nobody competes, the worker sleeps (an
    /// idle worker refuses nobody) or the charge ends.
    pub(crate) fn set_kernel(&mut self, kernel: Arc<dyn KernelRefusal>, worker: usize) {
        self.release_kernel();
        self.kernel = Some((kernel, worker));
    }

    /// A kernel is set ([`set_kernel`](Self::set_kernel)).
    pub(crate) fn has_kernel(&self) -> bool {
        self.kernel.is_some()
    }

    /// The kernel refuses some of this worker's tenants now.
    pub(crate) fn kernel_refuses(&self) -> bool {
        !self.in_kernel.is_empty()
    }

    /// The kernel refuses none of this worker's tenants any more (the worker is about to
    /// sleep, stops enforcing or ends).
    pub(crate) fn release_kernel(&mut self) {
        if let Some((k, worker)) = &self.kernel {
            for s in self.in_kernel.drain(..) {
                k.refuse(s, *worker, false);
            }
        }
    }

    /// Reads the thread's CPU time every `cycles` of the counter instead of every millisecond
    /// (tests of simulated clocks).
    #[cfg(test)]
    pub(crate) fn with_cpu_every(mut self, cycles: u64) -> Self {
        self.cpu_every = cycles;
        self
    }

    /// Follows `table`: enforcing with its parameters and weights (buckets kept for the slots
    /// whose tenant stays, full for new ones), or not enforcing when it has none. Call once
    /// per batch, after [`start`](Self::start), with the batch's tables.
    pub(crate) fn follow(&mut self, table: &TenantTable) {
        let Some(params) = table.params else {
            self.enforce = None;
            self.release_kernel();
            return;
        };
        let id = table.generation;
        if let Some(e) = self.enforce.as_mut() {
            if e.table == id {
                return;
            }
            if e.buckets.params() != params {
                e.buckets.set_params(params);
            }
        }
        let occupants: Vec<Option<Occupant>> = table
            .weights
            .iter()
            .enumerate()
            .map(|(slot, &w)| {
                Some(Occupant {
                    key: slot as u64,
                    weight: Weight::new(u64::from(w)).unwrap_or(Weight::ONE),
                })
            })
            .collect();
        let set = match self.enforce.as_mut() {
            Some(e) => e.buckets.set_tenants(&occupants),
            None => Buckets::new(params, &occupants).map(|mut buckets| {
                // The origin of the virtual clock: the batch's start.
                buckets.tick(self.since.saturating_sub(self.uncharged));
                self.enforce = Some(Enforce {
                    buckets,
                    table: id,
                    generated: true,
                    stamp: Vec::new(),
                    interval: 1,
                    active: 0,
                    competing: false,
                });
            }),
        };
        match set {
            Ok(()) => {
                if let Some(e) = self.enforce.as_mut() {
                    e.table = id;
                }
            }
            Err(e) => {
                // More than 65 536 slots: cannot happen (slots are u16).
                tracing::error!(error = %e, "cannot size the token buckets; not enforcing");
                self.enforce = None;
            }
        }
    }

    /// Enforcing: writes every slot's tokens (cycles) into `out`, if tokens were generated
    /// since the last call (at most once per Δt); false otherwise.
    pub(crate) fn tokens(&mut self, out: &mut Vec<i64>) -> bool {
        let Some(e) = self.enforce.as_mut().filter(|e| e.generated) else {
            return false;
        };
        e.generated = false;
        out.clear();
        out.extend((0..e.buckets.slots()).map(|s| e.buckets.tokens(s).unwrap_or(0)));
        true
    }

    /// Starts a batch (and its first phase) now, before its input is received; enforcing,
    /// generates the tokens of the intervals elapsed on the virtual clock.
    pub(crate) fn start(&mut self) {
        self.since = self.clock.now();
        self.between(self.since);
        if self
            .cpu_mark
            .is_none_or(|(at, _)| self.since.saturating_sub(at) >= self.cpu_every)
        {
            self.preemption(self.since);
        }
        self.in_batch = true;
        if let Some(e) = self.enforce.as_mut() {
            let g = e.buckets.tick(self.since.saturating_sub(self.uncharged));
            if g.generated != 0 {
                e.generated = true;
                e.competing = e.active >= 2;
                e.interval += 1;
                e.active = 0;
                if let Some((k, worker)) = &self.kernel {
                    // While it competes, a tenant refused in the kernel has as many datagrams
                    // let through as its new tokens pay for; admitted again when nobody
                    // competes, or when what a datagram costs it is not known yet.
                    let competing = e.competing;
                    let buckets = &e.buckets;
                    let costs = &self.admitted_cost;
                    self.in_kernel.retain(|&s| {
                        let i = usize::from(s);
                        let tokens = buckets.tokens(i).unwrap_or(0);
                        let cost = costs.get(i).copied().unwrap_or(0);
                        let keep = competing && (tokens <= 0 || cost != 0);
                        if !keep {
                            k.refuse(s, *worker, false);
                        } else if tokens > 0 {
                            k.grant(s, tokens.unsigned_abs() / cost);
                        }
                        keep
                    });
                }
            }
        }
        self.current = NO_TENANT;
        self.runs = 0;
        self.tail = None;
    }

    /// Runs `f`, an idle wait of the worker (its poll): those cycles advance the buckets'
    /// virtual clock; every other cycle between batches does not.
    pub(crate) fn idle<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let before = self.clock.now();
        let r = f();
        let waited = self.clock.now().saturating_sub(before);
        self.idle = self.idle.saturating_add(waited);
        self.window_idle = self.window_idle.saturating_add(waited);
        r
    }

    /// A batch begun with [`start`](Self::start) found nothing to receive: its time counts
    /// as an idle wait, and no batch is under way.
    pub(crate) fn empty(&mut self) {
        let now = self.clock.now();
        let waited = now.saturating_sub(self.since);
        self.idle = self.idle.saturating_add(waited);
        self.window_idle = self.window_idle.saturating_add(waited);
        self.in_batch = false;
    }

    /// Reads the thread's CPU time (at `now`, a batch's start) and takes back from the
    /// tenants' charges since the last reading the time the thread did not run: the counter
    /// measures wall time, so a worker preempted in the middle of a tenant's run would charge
    /// the whole preemption to that tenant (on a shared machine, milliseconds at a time: enough
    /// to empty a bucket). The busy time of the window (all but the idle waits) minus the CPU
    /// time the thread ran in it is the preemption; each tenant gets back its part of it in
    /// proportion to what it was charged in the window (where in the window the thread was
    /// preempted cannot be told from two readings), to its bucket at once and to its counters
    /// at the batch's fold, and the buckets' virtual clock does not advance over it.
    fn preemption(&mut self, now: u64) {
        let Some(cpu) = self.clock.cpu() else {
            return;
        };
        let idle = std::mem::take(&mut self.window_idle);
        let Some((at, ran_at)) = self.cpu_mark.replace((now, cpu)) else {
            self.window.iter_mut().for_each(|w| *w = 0);
            return;
        };
        let busy = now.saturating_sub(at).saturating_sub(idle);
        let ran = cpu.saturating_sub(ran_at);
        let lost = busy.saturating_sub(ran);
        for slot in 0..self.window.len() {
            let charged = std::mem::take(&mut self.window[slot]);
            if lost == 0 || charged == 0 {
                continue;
            }
            let back = split(charged, lost.min(busy), busy).min(charged);
            if back == 0 {
                continue;
            }
            let s = slot as TenantSlot;
            self.touch(s);
            self.refunded[slot] += back;
            self.preempted += back;
            self.uncharged = self.uncharged.saturating_add(back);
            if let Some(e) = self.enforce.as_mut() {
                e.buckets.refund(slot, back);
            }
        }
    }

    /// Accounts the time from `mark` to `now`, between batches: what was not an idle wait is
    /// uncharged.
    fn between(&mut self, now: u64) {
        if let Some(mark) = self.mark {
            let busy = now.saturating_sub(mark).saturating_sub(self.idle);
            self.uncharged = self.uncharged.saturating_add(busy);
        }
        self.idle = 0;
        self.mark = Some(now);
    }

    /// The batch's input has been received: the cycles since [`start`](Self::start) are a
    /// system call's, split over the batch's packets at the end; the graph pass begins.
    pub(crate) fn received(&mut self) {
        let now = self.clock.now();
        self.syscalls += now.saturating_sub(self.since);
        self.since = now;
    }

    /// A packet of `slot`'s tenant: counted, and a new run begins if the previous packet's
    /// tenant differs. False if the packet is to be dropped for its tenant's fair share
    /// (enforcing, its bucket empty; counted here).
    #[inline]
    pub(crate) fn enter(&mut self, slot: TenantSlot) -> bool {
        self.count(slot, 1);
        self.switch(slot, 1);
        let Some(e) = self.enforce.as_ref().filter(|e| e.competing) else {
            return true;
        };
        let i = usize::from(slot);
        let Some(tokens) = e.buckets.tokens(i) else {
            return true;
        };
        // Admitted against what the packets already admitted in this batch will cost it
        // (their feature chains run at the end of the pass, after the gate): one dear
        // program cannot have a whole batch admitted on the few tokens left.
        let reserved = &mut self.reserved[i];
        if tokens <= i64::try_from(*reserved).unwrap_or(i64::MAX) {
            self.refused[i] += 1;
            return false;
        }
        *reserved = reserved.saturating_add(self.chain_cost[i]);
        true
    }

    /// Work for `packets` packets of `slot`'s tenant follows (a feature chain, sealing): a
    /// new run begins if the current one is another tenant's. The packets are not counted
    /// again (only to split a capped phase).
    #[inline]
    pub(crate) fn switch(&mut self, slot: TenantSlot, packets: u32) {
        if let Some(tail) = self.tail.as_mut() {
            self.current = slot;
            match tail.last_mut() {
                Some((s, n)) if *s == slot => *n += packets,
                _ => tail.push((slot, packets)),
            }
            return;
        }
        if slot == self.current && !self.chain {
            return;
        }
        let now = self.clock.now();
        self.run_ends(now.saturating_sub(self.since));
        self.since = now;
        self.current = slot;
        self.runs += 1;
        if self.runs > CAP_RUNS {
            self.tail = Some(vec![(slot, packets)]);
        }
    }

    /// A run of `slot`'s tenant that is measured even in a capped phase:
    /// a feature chain, whose tenant's program may cost anything (one that runs to its
    /// instruction limit costs 30 µs a packet, against 1 µs for the rest of a packet's way).
    /// Split by packet count with the capped tail, such a chain's cost would be paid by every
    /// tenant of the batch (seen in `protego bench fairness`, case `spin`). One counter reading
    /// at its start (the tail so far is split then) and one at its end (the next
    /// [`switch`](Self::switch), which resumes the capped tail, or the phase's end): two reads
    /// per chain and batch at most.
    ///
    /// The chain's cycles are also its tenant's chain cost, of which the moving average per
    /// admitted packet is reserved at the gate ([`enter`](Self::enter)) while enforcing.
    pub(crate) fn exact(&mut self, slot: TenantSlot) {
        let now = self.clock.now();
        let capped = self.tail.is_some() || self.runs >= CAP_RUNS;
        self.close(now);
        self.current = slot;
        self.chain = true;
        // Past the cap: the next switch ends this run with a reading, then caps again.
        self.runs = if capped {
            self.runs.max(CAP_RUNS) + 1
        } else {
            self.runs + 1
        };
    }

    /// Ends the current phase (its last run, or its capped tail, is charged); the next one
    /// begins with no tenant known.
    pub(crate) fn phase(&mut self) {
        let now = self.clock.now();
        self.close(now);
        self.current = NO_TENANT;
        self.runs = 0;
    }

    /// Runs `f`, a system call for the batch (sending): its cycles are split over the batch's
    /// packets at the end; the current run goes on after it.
    pub(crate) fn syscall<T>(&mut self, f: impl FnOnce() -> T) -> T {
        if !self.in_batch {
            // Outside a batch (housekeeping): no tenant's, and not idle either.
            return f();
        }
        let before = self.clock.now();
        let capped = self.tail.is_some();
        self.close(before);
        let r = f();
        let after = self.clock.now();
        self.syscalls += after.saturating_sub(before);
        self.since = after;
        if capped {
            // The phase stays capped: what follows is split among the packets that follow.
            self.tail = Some(Vec::new());
        }
        r
    }

    /// Ends the batch: the current phase ends, the system calls' cycles are split over the
    /// batch's `packets` (those whose tenant was not known are unattributed), each touched
    /// slot's charge is handed to `fold`, and the batch's state is cleared.
    pub(crate) fn end(&mut self, packets: u64, mut fold: impl FnMut(Charged)) -> Folded {
        self.phase();
        self.in_batch = false;
        // From here to the next batch's start is accounted then.
        self.idle = 0;
        self.mark = Some(self.since);
        let known: u64 = self.packets.iter().map(|&n| u64::from(n)).sum();
        let total = packets.max(known).max(1);
        let syscalls = std::mem::take(&mut self.syscalls);
        let mut given = 0;
        for i in 0..self.touched.len() {
            let s = self.touched[i];
            let n = u64::from(self.packets[usize::from(s)]);
            let share = split(syscalls, n, total);
            given += share;
            self.add(s, share);
        }
        self.unattributed += syscalls - given;
        for t in 0..self.touched.len() {
            let s = self.touched[t];
            let i = usize::from(s);
            fold(Charged {
                slot: s,
                cycles: self.cycles[i],
                packets: u64::from(self.packets[i]),
                refused: u64::from(self.refused[i]),
                refunded: self.refunded[i],
            });
            // A flood (most of its packets refused), not a tenant whose bucket hovers about
            // zero: the kernel refuses by the millisecond, the workers by the packet.
            if self.refused[i] > self.packets[i] / 2 {
                self.refuse_in_kernel(s);
            }
            let admitted = u64::from(self.packets[i].saturating_sub(self.refused[i]));
            if let Some(sample) = self.cycles[i].checked_div(admitted) {
                let cost = &mut self.admitted_cost[i];
                *cost = if *cost == 0 {
                    sample
                } else {
                    (3 * *cost + sample) / 4
                };
            }
            let chain = std::mem::take(&mut self.chain_cycles[i]);
            if let Some(sample) = chain.checked_div(admitted) {
                // A moving average over batches (weight 1/4 to the newest): a tenant whose
                // program changes cost is followed within a few batches.
                let cost = &mut self.chain_cost[i];
                *cost = (3 * *cost + sample) / 4;
            }
            self.cycles[i] = 0;
            self.packets[i] = 0;
            self.refused[i] = 0;
            self.refunded[i] = 0;
            self.reserved[i] = 0;
        }
        self.touched.clear();
        let unattributed = std::mem::take(&mut self.unattributed);
        self.uncharged = self.uncharged.saturating_add(unattributed);
        Folded {
            unattributed,
            capped: std::mem::take(&mut self.capped),
            preempted: std::mem::take(&mut self.preempted),
        }
    }

    /// Most of `slot`'s packets were refused in the batch: if its bucket is still empty, the
    /// kernel refuses it too (as this worker, with no budget until the next generation),
    /// before its datagrams cost a receive.
    fn refuse_in_kernel(&mut self, slot: TenantSlot) {
        let (Some((k, worker)), Some(e)) = (&self.kernel, &self.enforce) else {
            return;
        };
        let empty = e.buckets.tokens(usize::from(slot)).is_some_and(|t| t <= 0);
        if e.competing && empty && !self.in_kernel.contains(&slot) {
            k.grant(slot, 0);
            k.refuse(slot, *worker, true);
            self.in_kernel.push(slot);
        }
    }

    /// Charges the current run (or splits the capped tail) up to `now`.
    fn close(&mut self, now: u64) {
        let spent = now.saturating_sub(self.since);
        self.since = now;
        match self.tail.take() {
            None => self.run_ends(spent),
            Some(tail) if tail.is_empty() => self.run_ends(spent),
            Some(tail) => {
                self.capped += 1;
                let total: u64 = tail.iter().map(|&(_, n)| u64::from(n)).sum();
                let mut given = 0;
                for (i, &(slot, n)) in tail.iter().enumerate() {
                    let share = if i + 1 == tail.len() {
                        spent - given
                    } else {
                        split(spent, u64::from(n), total)
                    };
                    given += share;
                    self.add(slot, share);
                }
            }
        }
    }

    /// The current run ends after `spent` cycles: charged to its tenant (and counted as its
    /// chain cost if it was a chain).
    fn run_ends(&mut self, spent: u64) {
        if std::mem::take(&mut self.chain) && self.current != NO_TENANT {
            self.touch(self.current);
            self.chain_cycles[usize::from(self.current)] += spent;
        }
        self.add(self.current, spent);
    }

    fn add(&mut self, slot: TenantSlot, cycles: u64) {
        if slot == NO_TENANT {
            self.unattributed += cycles;
            return;
        }
        self.touch(slot);
        let i = usize::from(slot);
        self.cycles[i] += cycles;
        self.window[i] = self.window[i].saturating_add(cycles);
        self.reserved[i] = self.reserved[i].saturating_sub(cycles);
        if let Some(e) = self.enforce.as_mut() {
            e.buckets.charge(usize::from(slot), cycles);
            let i = usize::from(slot);
            if i >= e.stamp.len() {
                e.stamp.resize(i + 1, 0);
            }
            if e.stamp[i] != e.interval {
                e.stamp[i] = e.interval;
                e.active += 1;
            }
        }
    }

    #[inline]
    fn count(&mut self, slot: TenantSlot, packets: u32) {
        if slot == NO_TENANT {
            return;
        }
        self.touch(slot);
        self.packets[usize::from(slot)] += packets;
    }

    #[inline]
    fn touch(&mut self, slot: TenantSlot) {
        let i = usize::from(slot);
        if i >= self.cycles.len() {
            self.cycles.resize(i + 1, 0);
            self.packets.resize(i + 1, 0);
            self.refused.resize(i + 1, 0);
            self.window.resize(i + 1, 0);
            self.refunded.resize(i + 1, 0);
            self.chain_cycles.resize(i + 1, 0);
            self.chain_cost.resize(i + 1, 0);
            self.reserved.resize(i + 1, 0);
            self.admitted_cost.resize(i + 1, 0);
        }
        if self.cycles[i] == 0 && self.packets[i] == 0 && !self.touched.contains(&slot) {
            self.touched.push(slot);
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.release_kernel();
    }
}

/// The tenants' charged cycles as they were over the last [`datapath::RECENT_CPU_WINDOW`]: a
/// sample of every slot's counter at most once a second (taken by the housekeeping round),
/// so that status shows a tenant's share *now*, not since the start.
#[derive(Debug, Default)]
pub(crate) struct RecentCpu {
    /// (when, every slot's cycles then), oldest first, spanning the window and one more.
    samples: std::collections::VecDeque<(std::time::Instant, Vec<u64>)>,
}

/// How often [`RecentCpu`] samples the counters.
const RECENT_SAMPLE: std::time::Duration = std::time::Duration::from_secs(1);

impl RecentCpu {
    /// Samples `counters` at `now` if a second has passed since the last sample, and forgets
    /// the samples older than the window needs.
    pub(crate) fn sample(&mut self, now: std::time::Instant, counters: &[Arc<TenantCounters>]) {
        if self
            .samples
            .back()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) < RECENT_SAMPLE)
        {
            return;
        }
        let cycles = counters
            .iter()
            .map(|c| c.cycles.load(std::sync::atomic::Ordering::Relaxed))
            .collect();
        self.samples.push_back((now, cycles));
        // Keep the newest sample at least a window old (it is the base of `recent`).
        while self.samples.len() > 1
            && now.saturating_duration_since(self.samples[1].0) >= datapath::RECENT_CPU_WINDOW
        {
            self.samples.pop_front();
        }
    }

    /// Every slot's cycles charged since the oldest sample at most a window old (while the
    /// data plane is younger than the window, its first sample), from its counter now
    /// (`counters`); a slot the sample did not know yet counts from zero, and without any
    /// sample everything counts.
    pub(crate) fn recent(
        &self,
        now: std::time::Instant,
        counters: &[Arc<TenantCounters>],
    ) -> Vec<u64> {
        let base = self
            .samples
            .iter()
            .find(|(at, _)| now.saturating_duration_since(*at) <= datapath::RECENT_CPU_WINDOW)
            .map(|(_, c)| c.as_slice())
            .unwrap_or(&[]);
        counters
            .iter()
            .enumerate()
            .map(|(slot, c)| {
                let now = c.cycles.load(std::sync::atomic::Ordering::Relaxed);
                // A refund (preemption) may take a counter below a sample's value.
                now.saturating_sub(base.get(slot).copied().unwrap_or(0))
            })
            .collect()
    }
}

/// `n / total` of `cycles`, rounded down (`n ≤ total`, `total > 0`).
fn split(cycles: u64, n: u64, total: u64) -> u64 {
    (u128::from(cycles) * u128::from(n) / u128::from(total.max(1))) as u64
}

#[cfg(test)]
#[path = "charge_tests.rs"]
mod tests;
