//! The PREVAIL verifier as the gateway runs it: an XDP context, the offered helpers only, the
//! offered map types only, a termination check, and 496 of the 512 stack bytes.
//!
//! PREVAIL ("Simple and Precise Static Analysis of Untrusted Linux Kernel Extensions",
//! Gershuni et al., PLDI 2019) proves, by abstract interpretation over the control-flow graph,
//! that every memory access is inside the context, the stack, the packet or a map value, that
//! map values are checked against NULL, that packet pointers are not used after
//! `bpf_xdp_adjust_head/tail`, and (with the termination check) that every loop is bounded.

use prevail::crab::ebpf_domain::DomainContext;
use prevail::crab::var_registry::VariableRegistry;
use prevail::elf_loader::UnmarshalError;
use prevail::ir::syntax::Call;
use prevail::linux::linux_platform::LinuxPlatform;
use prevail::linux::spec_prototypes::HelperPrototype;
use prevail::platform::{EbpfPlatform, KsymBtfId};
use prevail::spec::config::EbpfVerifierOptions;
use prevail::spec::type_descriptors::{
    BtfLineInfo, EbpfMapDescriptor, EbpfMapType, EbpfProgramType, EbpfStructDescriptor, ProgramInfo,
};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use crate::{Insn, LoadError, MapKind, OFFERED_HELPERS};

/// Stack bytes a program may use. The last 16 of the kernel's 512 are kept for the runtime's
/// own bookkeeping (the instruction meter's counter and a spill slot, [`crate::lower`]), so
/// programs are verified against 496.
pub const STACK_SIZE: i32 = 496;

/// What PREVAIL found for an accepted program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// The largest number of iterations of any loop that PREVAIL proved (0 without loops).
    pub(crate) loop_bound: u32,
}

/// Linux's XDP platform narrowed to what the gateway offers: [`OFFERED_HELPERS`] and
/// [`MapKind`]. Everything else is Linux's (helper prototypes, the `xdp_md` layout).
struct GatewayPlatform {
    linux: LinuxPlatform,
}

impl EbpfPlatform for GatewayPlatform {
    fn get_program_type(&self, section: &str, path: &str) -> EbpfProgramType {
        self.linux.get_program_type(section, path)
    }
    fn get_helper_prototype(&self, n: i32) -> &HelperPrototype {
        self.linux.get_helper_prototype(n)
    }
    fn try_get_helper_prototype(&self, n: i32) -> Option<&HelperPrototype> {
        self.linux.try_get_helper_prototype(n)
    }
    fn is_helper_usable(&self, n: i32) -> bool {
        OFFERED_HELPERS.contains(&n) && self.linux.is_helper_usable(n)
    }
    fn resolve_builtin_call(&self, _name: &str) -> Option<i32> {
        None
    }
    fn resolve_ksym_btf_id(&self, _name: &str) -> Option<KsymBtfId> {
        None
    }
    fn get_builtin_call(&self, _id: i32) -> Option<Call> {
        None
    }
    fn map_record_size(&self) -> usize {
        self.linux.map_record_size()
    }
    fn parse_maps_section(
        &mut self,
        _descriptors: &mut Vec<EbpfMapDescriptor>,
        _data: &[u8],
        _record_size: usize,
        _count: usize,
        _options: &EbpfVerifierOptions,
    ) {
        // Maps come from aya-obj's BTF parsing (crate::maps), never from a legacy section.
    }
    fn resolve_inner_map_references(
        &self,
        _descriptors: &mut Vec<EbpfMapDescriptor>,
    ) -> Result<(), UnmarshalError> {
        Ok(())
    }
    fn get_map_descriptor(&self, map_fd: i32) -> Option<&EbpfMapDescriptor> {
        self.linux.get_map_descriptor(map_fd)
    }
    fn get_map_type(&self, platform_specific_type: u32) -> EbpfMapType {
        // An unoffered type becomes UNSPEC, which no helper accepts; the loader refuses such
        // maps by name before the verifier runs.
        let t = MapKind::from_type(platform_specific_type).map_or(0, MapKind::map_type);
        self.linux.get_map_type(t)
    }
    fn sock_common_layout(&self) -> Option<&'static EbpfStructDescriptor> {
        None
    }
    fn supported_conformance_groups(&self) -> u32 {
        self.linux.supported_conformance_groups()
    }
}

/// Runs PREVAIL on `insns` (map references relocated to the handles of `maps`). `lines` maps
/// instruction indices to their C source, for the error.
pub(crate) fn verify(
    section: &str,
    insns: &[Insn],
    maps: &[EbpfMapDescriptor],
    lines: &BTreeMap<usize, String>,
) -> Result<Verdict, LoadError> {
    verify_with_stack(section, insns, maps, lines, STACK_SIZE, true)
}

/// How long one verification may take. PREVAIL's analysis terminates (it widens loops), but
/// its time grows with the program's size and branching; a program that takes longer is
/// refused, so that no tenant's program holds the thread that loads it (a control socket's
/// or `ctl apply`'s) for long. The gateway's own programs take well under a second.
pub const VERIFY_BUDGET: Duration = Duration::from_secs(10);

/// Verifications that ran past their budget and were left to finish on their own thread;
/// while [`MAX_ABANDONED`] are still running, new ones are refused at once, so that programs
/// sent again and again cannot pile up threads that burn the gateway's CPU.
static ABANDONED: AtomicUsize = AtomicUsize::new(0);

/// The most verifications left running past their budget.
const MAX_ABANDONED: usize = 2;

/// [`verify`] with `stack` bytes of stack and the termination check on or off: the runtime
/// verifies its lowered programs, which use the 16 bytes kept from the tenant's program, with
/// the whole 512. Within [`VERIFY_BUDGET`].
pub(crate) fn verify_with_stack(
    section: &str,
    insns: &[Insn],
    maps: &[EbpfMapDescriptor],
    lines: &BTreeMap<usize, String>,
    stack: i32,
    termination: bool,
) -> Result<Verdict, LoadError> {
    let work = Analysis {
        section: section.to_owned(),
        insns: insns.to_vec(),
        maps: maps.to_vec(),
        lines: lines.clone(),
        stack,
        termination,
        #[cfg(test)]
        pause: Duration::ZERO,
    };
    within(VERIFY_BUDGET, &ABANDONED, work)
}

/// One verification's inputs, owned so that it can run on a thread of its own.
struct Analysis {
    section: String,
    insns: Vec<Insn>,
    maps: Vec<EbpfMapDescriptor>,
    lines: BTreeMap<usize, String>,
    stack: i32,
    termination: bool,
    /// Tests: how long the analysis waits before it starts.
    #[cfg(test)]
    pause: Duration,
}

/// Runs `work` on a thread of its own and waits for it at most `budget`: past it the program
/// is refused ([`LoadError::VerifierBudget`]) and the analysis finishes unobserved, counted in
/// `abandoned` until it ends; while [`MAX_ABANDONED`] are, new work is refused without
/// starting ([`LoadError::VerifierBusy`]).
fn within(
    budget: Duration,
    abandoned: &'static AtomicUsize,
    work: Analysis,
) -> Result<Verdict, LoadError> {
    let section = work.section.clone();
    if abandoned.load(Ordering::Acquire) >= MAX_ABANDONED {
        return Err(LoadError::VerifierBusy { section });
    }
    let (tx, rx) = mpsc::sync_channel(1);
    // Set when the caller gave up waiting: the thread then counts itself out of `abandoned`.
    let gave_up = Arc::new(Mutex::new(false));
    let flag = Arc::clone(&gave_up);
    let spawned = std::thread::Builder::new()
        .name("bpf-verify".into())
        .spawn(move || {
            let verdict = analyse(&work);
            let given_up = flag.lock().map(|g| *g).unwrap_or(true);
            if given_up {
                abandoned.fetch_sub(1, Ordering::AcqRel);
            } else {
                // The caller may give up between the check and the send: it then counts
                // this thread, which still ends here.
                let _ = tx.send(verdict);
            }
        });
    if let Err(e) = spawned {
        return Err(LoadError::VerifierInternal {
            section,
            reason: format!("cannot start the verifier's thread: {e}"),
        });
    }
    match rx.recv_timeout(budget) {
        Ok(verdict) => verdict,
        Err(mpsc::RecvTimeoutError::Timeout) => {
            let mut g = gave_up.lock().unwrap_or_else(|p| p.into_inner());
            // The verdict may have come meanwhile.
            if let Ok(verdict) = rx.try_recv() {
                return verdict;
            }
            *g = true;
            abandoned.fetch_add(1, Ordering::AcqRel);
            Err(LoadError::VerifierBudget {
                section,
                seconds: budget.as_secs_f64(),
            })
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(LoadError::VerifierInternal {
            section,
            reason: "the verifier's thread ended without a verdict".into(),
        }),
    }
}

/// The analysis itself.
fn analyse(work: &Analysis) -> Result<Verdict, LoadError> {
    #[cfg(test)]
    std::thread::sleep(work.pause);
    let Analysis {
        section,
        insns,
        maps,
        lines,
        stack,
        termination,
        ..
    } = work;
    let (section, stack, termination) = (section.as_str(), *stack, *termination);
    let internal = |reason: String| LoadError::VerifierInternal {
        section: section.to_owned(),
        reason,
    };
    let mut linux = LinuxPlatform::new();
    let program_type = linux.get_program_type("xdp", "");
    linux.set_program_type(&program_type);
    linux.map_descriptors = maps.to_vec();
    let platform = GatewayPlatform { linux };
    let mut info = ProgramInfo {
        map_descriptors: maps.to_vec(),
        program_type,
        line_info: lines
            .iter()
            .map(|(&i, l)| {
                let info = BtfLineInfo {
                    file_name: String::new(),
                    source_line: l.clone(),
                    line_number: 0,
                    column_number: 0,
                };
                (i, info)
            })
            .collect(),
        ..ProgramInfo::default()
    };
    info.supported_conformance_groups = platform.supported_conformance_groups();
    let mut options = EbpfVerifierOptions::default();
    options.runtime.check_for_termination = termination;
    options.runtime.subprogram_stack_size = stack;
    options.runtime.max_call_stack_frames = 1;
    options.mock_map_fds = true;

    let raw: Vec<_> = insns.iter().map(|i| i.to_prevail()).collect();
    // PREVAIL is young (a port of the C++ verifier); an internal panic refuses the program
    // instead of taking the caller down.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut notes = Vec::new();
        let seq = prevail::ir::unmarshal::unmarshal(&raw, &mut notes, &info, &platform, &options)
            .map_err(|e| internal(e.to_string()))?;
        let program =
            prevail::ir::program::Program::from_sequence(&seq, &mut info, &platform, &options)
                .map_err(|e| internal(e.to_string()))?;
        let ctx = DomainContext {
            program_info: &info,
            program: &program,
            runtime: &options.runtime,
            options: &options,
            platform: &platform,
        };
        let mut registry = VariableRegistry::new();
        let result = prevail::fwd_analyzer::analyze(&program, &ctx, &mut registry);
        if !result.failed {
            return Ok(Verdict {
                loop_bound: u32::try_from(result.max_loop_count).unwrap_or(0),
            });
        }
        let error = result.find_first_error();
        let index = error
            .as_ref()
            .and_then(|e| e.label.as_ref())
            .and_then(|l| usize::try_from(l.from).ok())
            .filter(|&i| i < insns.len());
        Err(LoadError::Verifier {
            section: section.to_owned(),
            index,
            reason: error.map_or_else(
                || "the program is not safe".to_owned(),
                |e| explained(e.message),
            ),
            source_line: index.and_then(|i| source_line(lines, i)),
        })
    }));
    run.unwrap_or_else(|panic| {
        let why = crate::error::panic_message(panic.as_ref());
        Err(internal(format!("verifier panicked: {why}")))
    })
}

/// PREVAIL's `message`, followed for the refusals tenants meet most by what it means in C
/// terms (the verifier's own words name its abstract domain, not the program).
fn explained(message: String) -> String {
    let meaning = if message.contains("Loop counter is too large") {
        "the loop may not terminate: the verifier found no bound on its iterations (bound it \
         by a constant, or walk the packet with a pointer checked against data_end)"
    } else if message.contains("must be at most packet_size") {
        "a packet access that may pass data_end: check `pointer + length <= data_end` before \
         the access"
    } else if message.contains("Possible null access") {
        "a pointer that may be NULL (a map lookup's result) used without checking it"
    } else {
        return message;
    };
    format!("{message}: {meaning}")
}

/// The source line of instruction `index`: BTF line information names the first instruction
/// of each line, so the nearest entry at or before it.
fn source_line(lines: &BTreeMap<usize, String>, index: usize) -> Option<String> {
    lines.range(..=index).next_back().map(|(_, l)| l.clone())
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    /// `r0 = XDP_PASS; exit`, with a loop of `n` bounded trips before it when `n > 0` (more
    /// work for the verifier).
    fn work(n: i32) -> Analysis {
        let ins = |code: u8, dst: u8, src: u8, off: i16, imm: i32| Insn {
            code,
            dst,
            src,
            off,
            imm,
        };
        let mut insns = Vec::new();
        if n > 0 {
            // r1 = 0; loop: r1 += 1; if r1 < n goto loop
            insns.push(ins(0xb7, 1, 0, 0, 0));
            insns.push(ins(0x07, 1, 0, 0, 1));
            insns.push(ins(0xa5, 1, 0, -2, n));
        }
        insns.push(ins(0xb7, 0, 0, 0, 2));
        insns.push(ins(0x95, 0, 0, 0, 0));
        Analysis {
            section: "xdp".into(),
            insns,
            maps: Vec::new(),
            lines: BTreeMap::new(),
            stack: STACK_SIZE,
            termination: true,
            pause: Duration::ZERO,
        }
    }

    #[test]
    fn a_verification_within_its_budget_gives_its_verdict() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let v = within(Duration::from_secs(60), &COUNT, work(100)).expect("verified");
        assert!(v.loop_bound >= 100, "{v:?}");
        assert_eq!(COUNT.load(Ordering::Acquire), 0);
    }

    #[test]
    fn past_its_budget_a_program_is_refused_and_the_analysis_ends_on_its_own() {
        static COUNT: AtomicUsize = AtomicUsize::new(0);
        let slow = Analysis {
            pause: Duration::from_millis(300),
            ..work(1000)
        };
        let err = within(Duration::from_millis(50), &COUNT, slow).expect_err("over budget");
        assert!(
            matches!(&err, LoadError::VerifierBudget { section, .. } if section == "xdp"),
            "{err}"
        );
        assert!(err.to_string().contains("gave up after 0.05 s"), "{err}");
        assert_eq!(COUNT.load(Ordering::Acquire), 1, "still running, counted");
        // The abandoned analysis counts itself out when it ends.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while COUNT.load(Ordering::Acquire) > 0 {
            assert!(std::time::Instant::now() < deadline, "never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn while_too_many_run_past_their_budget_new_ones_are_refused_at_once() {
        static COUNT: AtomicUsize = AtomicUsize::new(MAX_ABANDONED);
        let err = within(Duration::from_secs(60), &COUNT, work(0)).expect_err("busy");
        assert!(matches!(err, LoadError::VerifierBusy { .. }), "{err}");
        COUNT.store(MAX_ABANDONED - 1, Ordering::Release);
        within(Duration::from_secs(60), &COUNT, work(0)).expect("one fewer: verified");
    }
}
