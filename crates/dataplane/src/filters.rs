//! Tenant filters in the data path (issue 18): the eBPF programs of `[[filter]]` tables, run
//! by `filter`'s runtime as one stage of their tenant's feature chain per direction.
//!
//! [`Filters::build`] loads and verifies every program again (the data path trusts no caller),
//! instantiates it for every worker (its JIT code compiled once per worker, a frame per
//! worker) and makes one [`BpfStage`] per (tenant, direction) that has filters, which
//! `Shared::set_filters` publishes as that tenant's feature chain: the tenant's programs of
//! that direction in increasing weight. Each program sees the packets
//! the earlier ones let through (`XDP_PASS`), as their last stage left them; `XDP_DROP` and
//! `XDP_ABORTED` drop the packet (counted as `<tenant>/filter_drop` and
//! `<tenant>/filter_aborted`), `XDP_TX` sends it back the way it came
//! ([`FeatureBatch::reflect`]).
//!
//! A program the current set already runs in the same place (tenant, direction, object file
//! name, section), from the same object and at the same weight, is kept as it is (not verified
//! or compiled again; its maps and counters go on), so a change of one tenant's filters costs
//! the others nothing.
//!
//! Programs of one tenant loaded from the same object (the same bytes) share the object's
//! maps, as under libbpf, and a replacement keeps a map whose declaration did not change,
//! with its contents: the maps of every filter set are kept by (tenant, object) and handed to
//! the next set's instances of the same object, or of the object that replaces it in the same
//! place (tenant, direction, object file name, section). A batch in flight finishes with the
//! stage it read from the published tables; the next batch runs the new one.

use crate::feature::{Feature, FeatureBatch, FeatureChain};
use crate::sys::tsc::{Cycles, Tsc};
use datapath::{
    DataplaneError, FilterConfig, FilterCounters, FilterDirection, FilterMapAnswer, FilterMapOp,
    FilterMapReport, FilterProgramReport, FilterReport,
};
use filter::run::{Engine, FrameBuf, Map, RunConfig, Runtime, XdpAction};
use ids::TenantId;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The drop reasons of a filter stage, in [`Feature::drop_reasons`] order.
const REASONS: [&str; 3] = ["filter_drop", "filter_aborted", "filter_too_long"];
const DROP: usize = 0;
const ABORTED: usize = 1;
const TOO_LONG: usize = 2;

/// The largest packet a filter's frame holds (the gateway's packets fit a 64 KiB datagram).
const FRAME_MTU: usize = 65_000;

/// One worker's copy of a program: its runtime, its frame and the cycles spent in it.
struct Slot {
    rt: Runtime,
    frame: FrameBuf,
    cycles: u64,
}

/// One program of a stage: where it runs, and a [`Slot`] per worker.
struct Program {
    tenant: TenantId,
    direction: FilterDirection,
    section: String,
    object_name: String,
    /// The object's bytes (whose maps it shares).
    object: Arc<[u8]>,
    weight: u32,
    instructions: usize,
    workers: Vec<Mutex<Slot>>,
}

impl Program {
    /// What it did, summed over the workers.
    fn report(&self) -> FilterProgramReport {
        let mut c = FilterCounters::default();
        for slot in &self.workers {
            let slot = slot.lock().unwrap_or_else(|p| p.into_inner());
            let r = slot.rt.counters();
            c.passed += r.passed;
            c.dropped += r.dropped;
            c.tx += r.tx;
            c.aborted += r.aborted;
            c.insn_limit += r.insn_limit;
            c.metered_insns += r.metered_insns;
            c.cpu_ns += crate::sys::tsc::to_ns(slot.cycles);
        }
        FilterProgramReport {
            tenant: self.tenant.clone(),
            direction: self.direction,
            section: self.section.clone(),
            object_name: self.object_name.clone(),
            weight: self.weight,
            instructions: self.instructions,
            counters: c,
        }
    }
}

/// A tenant's filters of one direction: one stage of its feature chain.
pub(crate) struct BpfStage {
    programs: Vec<Arc<Program>>,
    /// `bpf_ktime_get_ns` is CLOCK_MONOTONIC: its value at `base`.
    base: Instant,
    base_ns: u64,
}

impl Feature for BpfStage {
    fn name(&self) -> &'static str {
        "filter"
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &REASONS
    }

    fn process(&self, batch: &mut FeatureBatch<'_>) {
        let now_ns = self.base_ns
            + u64::try_from(batch.now().saturating_duration_since(self.base).as_nanos())
                .unwrap_or(u64::MAX);
        for program in &self.programs {
            let Some(slot) = program.workers.get(batch.worker()) else {
                continue;
            };
            let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
            let started = Tsc.now();
            let Slot { rt, frame, cycles } = &mut *guard;
            rt.set_now(now_ns);
            for i in 0..batch.len() {
                if batch.is_dropped(i) || batch.is_reflected(i) {
                    continue;
                }
                if frame.load_ip(batch.packet(i)).is_err() {
                    batch.drop_packet(i, TOO_LONG);
                    continue;
                }
                let verdict = rt.run(frame);
                match verdict.action {
                    XdpAction::Drop => batch.drop_packet(i, DROP),
                    XdpAction::Aborted => batch.drop_packet(i, ABORTED),
                    XdpAction::Pass | XdpAction::Tx => {
                        // The program may have rewritten the packet or moved its bounds.
                        let Some(ip) = frame.ip_packet() else {
                            batch.drop_packet(i, ABORTED);
                            continue;
                        };
                        if !batch.replace(i, ip) {
                            batch.drop_packet(i, TOO_LONG);
                        } else if verdict.action == XdpAction::Tx {
                            batch.reflect(i);
                        }
                    }
                }
            }
            *cycles += Tsc.now().wrapping_sub(started);
        }
    }
}

/// A tenant's object (its bytes) and the maps its programs share.
type ObjectMaps = (TenantId, Arc<[u8]>, Vec<Arc<Map>>);

/// The filters a data path runs, and the maps kept across replacements. Cloning it is cheap
/// (shared programs and maps): a new set is built from a clone, outside the data path's lock.
#[derive(Default, Clone)]
pub(crate) struct Filters {
    /// The maps of the current set, by (tenant, object bytes).
    maps: Vec<ObjectMaps>,
    /// The tenants and directions that have a stage now.
    chains: Vec<(TenantId, FilterDirection)>,
    /// Each current filter's place and object: a filter replaced by another object in the
    /// same place (tenant, direction, object file name, section) takes over its maps.
    placed: Vec<Placed>,
    /// The programs running now, in stage order.
    programs: Vec<Arc<Program>>,
}

/// Where a filter runs (tenant, direction, section, object file name: see
/// [`FilterConfig::same_place`]) and its object's bytes.
type Placed = (TenantId, FilterDirection, String, String, Arc<[u8]>);

/// The stages a filter set makes, by (tenant, direction), and what [`Filters`] keeps of it.
pub(crate) struct Built {
    pub(crate) stages: Vec<(TenantId, FilterDirection, FeatureChain)>,
    maps: Vec<ObjectMaps>,
    placed: Vec<Placed>,
    programs: Vec<Arc<Program>>,
}

impl Filters {
    /// Loads, verifies and instantiates `filters` for `workers` workers, reusing the maps of
    /// the current set where a program's declaration matches; changes nothing (an error
    /// naming the filter) if any program is refused.
    pub(crate) fn build(
        &self,
        filters: &[FilterConfig],
        workers: usize,
    ) -> Result<Built, DataplaneError> {
        let mut sorted: Vec<(usize, &FilterConfig)> = filters.iter().enumerate().collect();
        sorted.sort_by_key(|(i, f)| (f.tenant.clone(), f.direction, f.weight, *i));
        let mut maps: Vec<ObjectMaps> = Vec::new();
        let mut stages: Vec<(TenantId, FilterDirection, Vec<Arc<Program>>)> = Vec::new();
        for (index, f) in sorted {
            // A program the current set runs in the same place, from the same object, at the
            // same weight: kept as it is (verified, compiled, its maps and counters), so that a
            // change of one tenant's filters costs the others nothing.
            if let Some(p) = self.programs.iter().find(|p| {
                p.tenant == f.tenant
                    && p.direction == f.direction
                    && p.section == f.section
                    && p.weight == f.weight
                    && p.object_name == f.object_name
                    && p.object == f.object
            }) {
                let kept = self
                    .maps
                    .iter()
                    .find(|(t, o, _)| *t == f.tenant && *o == f.object)
                    .map(|(_, _, m)| m.clone())
                    .unwrap_or_default();
                match maps
                    .iter_mut()
                    .find(|(t, o, _)| *t == f.tenant && **o == *f.object)
                {
                    Some((_, _, m)) => {
                        for map in kept {
                            if !m.iter().any(|k| Arc::ptr_eq(k, &map)) {
                                m.push(map);
                            }
                        }
                    }
                    None => maps.push((f.tenant.clone(), Arc::clone(&f.object), kept)),
                }
                let p = Arc::clone(p);
                match stages
                    .iter_mut()
                    .find(|(t, d, _)| *t == f.tenant && *d == f.direction)
                {
                    Some((_, _, programs)) => programs.push(p),
                    None => stages.push((f.tenant.clone(), f.direction, vec![p])),
                }
                continue;
            }
            let err = |reason: String| DataplaneError::Config {
                field: format!("filters[{index}]"),
                reason: format!(
                    "{} of {} (tenant {}, {}): {reason}",
                    f.section, f.object_name, f.tenant, f.direction
                ),
            };
            let program =
                filter::Object::load(&f.object, &f.section).map_err(|e| err(e.to_string()))?;
            // The maps this object already has in the new set, else in the current one, else
            // those of the object the current set runs in this place (a new version of the
            // program: its maps whose declaration did not change keep their contents).
            let replaced = self
                .placed
                .iter()
                .find(|(t, d, s, n, _)| {
                    *t == f.tenant && *d == f.direction && *s == f.section && n == f.file_name()
                })
                .map(|(_, _, _, _, o)| Arc::clone(o));
            let pool: Vec<Arc<Map>> = maps
                .iter()
                .chain(&self.maps)
                .find(|(t, o, _)| *t == f.tenant && **o == *f.object)
                .or_else(|| {
                    let old = replaced?;
                    self.maps
                        .iter()
                        .find(|(t, o, _)| *t == f.tenant && *o == old)
                })
                .map(|(_, _, m)| m.clone())
                .unwrap_or_default();
            let config = RunConfig {
                workers: workers.max(1),
                ..RunConfig::default()
            };
            let instance = program
                .instantiate_sharing(config, &pool)
                .map_err(|e| err(e.to_string()))?;
            match maps
                .iter_mut()
                .find(|(t, o, _)| *t == f.tenant && **o == *f.object)
            {
                Some((_, _, m)) => {
                    for map in instance.maps() {
                        if !m.iter().any(|k| Arc::ptr_eq(k, map)) {
                            m.push(Arc::clone(map));
                        }
                    }
                }
                None => maps.push((
                    f.tenant.clone(),
                    Arc::clone(&f.object),
                    instance.maps().to_vec(),
                )),
            }
            let runtimes = (0..workers.max(1))
                .map(|w| {
                    let rt = instance
                        .runtime(w, Engine::Jit, seed(w))
                        .map_err(|e| err(e.to_string()))?;
                    let frame = FrameBuf::new(FRAME_MTU).map_err(|e| err(e.to_string()))?;
                    Ok(Mutex::new(Slot {
                        rt,
                        frame,
                        cycles: 0,
                    }))
                })
                .collect::<Result<Vec<_>, DataplaneError>>()?;
            tracing::info!(
                tenant = %f.tenant,
                direction = %f.direction,
                program = %f.section,
                object = %f.object_name,
                weight = f.weight,
                instructions = program.instructions().len(),
                "tenant filter loaded"
            );
            let p = Arc::new(Program {
                tenant: f.tenant.clone(),
                direction: f.direction,
                section: f.section.clone(),
                object_name: f.object_name.clone(),
                object: Arc::clone(&f.object),
                weight: f.weight,
                instructions: program.instructions().len(),
                workers: runtimes,
            });
            match stages
                .iter_mut()
                .find(|(t, d, _)| *t == f.tenant && *d == f.direction)
            {
                Some((_, _, programs)) => programs.push(p),
                None => stages.push((f.tenant.clone(), f.direction, vec![p])),
            }
        }
        let base = Instant::now();
        let base_ns = monotonic_ns();
        let programs = stages
            .iter()
            .flat_map(|(_, _, p)| p.iter().cloned())
            .collect();
        let stages = stages
            .into_iter()
            .map(|(tenant, direction, programs)| {
                let stage = BpfStage {
                    programs,
                    base,
                    base_ns,
                };
                (tenant, direction, FeatureChain::new().with(Arc::new(stage)))
            })
            .collect();
        let placed = filters
            .iter()
            .map(|f| {
                (
                    f.tenant.clone(),
                    f.direction,
                    f.section.clone(),
                    f.file_name().to_owned(),
                    Arc::clone(&f.object),
                )
            })
            .collect();
        Ok(Built {
            stages,
            maps,
            placed,
            programs,
        })
    }

    /// The maps of `tenant`'s filters (each once, whichever programs share it).
    pub(crate) fn tenant_maps(&self, tenant: &TenantId) -> Vec<Arc<Map>> {
        let mut out: Vec<Arc<Map>> = Vec::new();
        for (_, _, maps) in self.maps.iter().filter(|(t, _, _)| t == tenant) {
            for m in maps {
                if !out.iter().any(|o| Arc::ptr_eq(o, m)) {
                    out.push(Arc::clone(m));
                }
            }
        }
        out
    }

    /// Takes `built` as the current set; returns the (tenant, direction) pairs that had a
    /// stage before and have none now (their chains to clear).
    pub(crate) fn commit(&mut self, built: &mut Built) -> Vec<(TenantId, FilterDirection)> {
        let now: Vec<(TenantId, FilterDirection)> = built
            .stages
            .iter()
            .map(|(t, d, _)| (t.clone(), *d))
            .collect();
        let gone = self
            .chains
            .iter()
            .filter(|c| !now.contains(c))
            .cloned()
            .collect();
        self.chains = now;
        self.maps = std::mem::take(&mut built.maps);
        self.placed = std::mem::take(&mut built.placed);
        self.programs = std::mem::take(&mut built.programs);
        gone
    }

    /// The running programs of `tenant` (of all: `None`) with their counters, and their maps.
    pub(crate) fn report(&self, tenant: Option<&TenantId>) -> FilterReport {
        let of = |t: &TenantId| tenant.is_none_or(|x| x == t);
        FilterReport {
            programs: (self.programs.iter())
                .filter(|p| of(&p.tenant))
                .map(|p| p.report())
                .collect(),
            maps: self
                .named_maps()
                .into_iter()
                .filter(|(t, _, _)| of(t))
                .map(|(t, object, m)| map_report(t, object, m))
                .collect(),
        }
    }

    /// Every map once, with its tenant and the name of an object that declares it.
    fn named_maps(&self) -> Vec<(&TenantId, &str, &Arc<Map>)> {
        let mut out: Vec<(&TenantId, &str, &Arc<Map>)> = Vec::new();
        for (tenant, object, maps) in &self.maps {
            let name = self
                .programs
                .iter()
                .find(|p| p.tenant == *tenant && p.object == *object)
                .map_or("?", |p| p.object_name.as_str());
            for m in maps {
                if !out.iter().any(|(_, _, o)| Arc::ptr_eq(o, m)) {
                    out.push((tenant, name, m));
                }
            }
        }
        out
    }

    /// Carries out `op` on `tenant`'s map `name` (`OBJECT:MAP` when two objects declare maps
    /// of that name).
    pub(crate) fn map_op(
        &self,
        tenant: &TenantId,
        name: &str,
        op: FilterMapOp,
    ) -> Result<FilterMapAnswer, DataplaneError> {
        let err = |reason: String| DataplaneError::FilterMap {
            map: name.to_owned(),
            reason,
        };
        let all = self.named_maps();
        let mine: Vec<_> = all.iter().filter(|(t, _, _)| *t == tenant).collect();
        let (object, map_name) = match name.rsplit_once(':') {
            Some((o, m)) => (Some(o), m),
            None => (None, name),
        };
        let found: Vec<_> = mine
            .iter()
            .filter(|(_, o, m)| m.spec().name == map_name && object.is_none_or(|x| x == *o))
            .collect();
        let (t, o, map) = match found[..] {
            [one] => **one,
            [] => {
                let names: Vec<String> = mine
                    .iter()
                    .map(|(_, o, m)| format!("{o}:{}", m.spec().name))
                    .collect();
                return Err(err(if names.is_empty() {
                    format!("tenant {:?} runs no filter with maps", tenant.as_str())
                } else {
                    format!(
                        "tenant {:?} has no map of that name (its maps: {})",
                        tenant.as_str(),
                        names.join(", ")
                    )
                }));
            }
            _ => {
                let names: Vec<String> = found
                    .iter()
                    .map(|(_, o, _)| format!("{o}:{map_name}"))
                    .collect();
                return Err(err(format!(
                    "several of the tenant's objects declare a map of that name: name one of {}",
                    names.join(", ")
                )));
            }
        };
        let map_err = |e: filter::run::MapError| err(e.to_string());
        let entries = match op {
            FilterMapOp::Dump => map.dump(),
            FilterMapOp::Update { key, value, flags } => {
                map.update(&key, &value, flags).map_err(map_err)?;
                Vec::new()
            }
            FilterMapOp::Delete { key } => {
                map.delete(&key).map_err(map_err)?;
                Vec::new()
            }
        };
        Ok(FilterMapAnswer {
            map: map_report(t, o, map),
            entries,
            nodes: Vec::new(),
        })
    }
}

/// What status and `ctl filter show` say of a map.
fn map_report(tenant: &TenantId, object_name: &str, m: &Map) -> FilterMapReport {
    let spec = m.spec();
    FilterMapReport {
        tenant: tenant.clone(),
        name: spec.name.clone(),
        object_name: object_name.to_owned(),
        kind: spec.kind.to_string(),
        key_size: spec.key_size,
        value_size: spec.value_size,
        max_entries: spec.max_entries,
        entries: m.len(),
        copies: m.copies(),
    }
}

/// A per-worker seed for `bpf_get_prandom_u32`, different in each process.
fn seed(worker: usize) -> u64 {
    let mut s = monotonic_ns() ^ (u64::from(std::process::id()) << 32);
    s ^= (worker as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    s
}

/// CLOCK_MONOTONIC in nanoseconds (what `bpf_ktime_get_ns` returns).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tests/filters/echo.c`, compiled, and a copy of it with other bytes (a trailing byte
    /// the ELF reader ignores): a new version of the same program.
    fn objects() -> Option<[Arc<[u8]>; 2]> {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filters/echo.c");
        let out = std::env::temp_dir().join(format!("protego-echo-{}.o", std::process::id()));
        let bytes = testreq::bpf::compile(&source, &out, true)?;
        let _ = std::fs::remove_file(&out);
        let mut other = bytes.clone();
        other.push(0);
        Some([bytes.into(), other.into()])
    }

    fn config(object: &Arc<[u8]>, direction: FilterDirection) -> FilterConfig {
        FilterConfig {
            tenant: TenantId::new("acme").expect("tenant"),
            direction,
            object_name: "echo.o".into(),
            object: Arc::clone(object),
            section: "xdp".into(),
            weight: 0,
        }
    }

    fn seen(built: &Built) -> Arc<Map> {
        Arc::clone(&built.maps[0].2[0])
    }

    #[test]
    fn a_new_version_of_a_program_in_the_same_place_keeps_its_maps() {
        let Some([v1, v2]) = objects() else {
            return;
        };
        let mut filters = Filters::default();
        let mut first = filters
            .build(&[config(&v1, FilterDirection::ToCloud)], 2)
            .expect("builds");
        let map = seen(&first);
        map.update(&0u32.to_le_bytes(), &[7; 16], 0)
            .expect("update");
        let first_program = Arc::clone(&first.programs[0]);
        filters.commit(&mut first);
        // The same object again (kept as it is: the same program, not compiled again), and a
        // new version in its place: the same map, its contents.
        let mut again = filters
            .build(&[config(&v1, FilterDirection::ToCloud)], 2)
            .expect("builds");
        assert!(Arc::ptr_eq(&map, &seen(&again)));
        assert!(Arc::ptr_eq(&first_program, &again.programs[0]));
        let again_program = Arc::clone(&again.programs[0]);
        filters.commit(&mut again);
        let mut newer = filters
            .build(&[config(&v2, FilterDirection::ToCloud)], 2)
            .expect("builds");
        assert!(Arc::ptr_eq(&map, &seen(&newer)));
        assert!(!Arc::ptr_eq(&again_program, &newer.programs[0]));
        assert_eq!(map.lookup(&0u32.to_le_bytes()), Ok(Some(vec![7; 16])));
        filters.commit(&mut newer);
        // Elsewhere (the other direction), the new version starts with maps of its own.
        let elsewhere = Filters::default()
            .build(&[config(&v2, FilterDirection::FromCloud)], 2)
            .expect("builds");
        assert!(!Arc::ptr_eq(&map, &seen(&elsewhere)));
    }
}
