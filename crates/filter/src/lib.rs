//! Tenant packet filters as eBPF programs (issue 18 §1–§2): loading and verification.
//!
//! A tenant ships an ordinary eBPF object, as `clang -O2 -g -target bpf -mcpu=v3 -c filter.c`
//! emits it, with XDP's contract: a `struct xdp_md` context over the tenant's packet and the
//! return codes `XDP_ABORTED`, `XDP_DROP`, `XDP_PASS`, `XDP_TX`. [`Object::load`] turns such an
//! object into a [`Program`], or refuses it with a [`LoadError`] that names the reason:
//!
//! 1. the ELF object is parsed by `aya-obj`; its maps must be BTF-defined (`SEC(".maps")`
//!    with `__uint`/`__type`), so an object without BTF is refused ("compile with -g");
//! 2. the program is chosen by section: `xdp`, or `xdp:FUNCTION` when the section holds
//!    several programs;
//! 3. map references (`lddw` with a relocation against the map's symbol) are rewritten to the
//!    handles of [`Program::maps`]; a map type outside [`MapKind`] is refused by name
//!    ("map `events`: type ringbuf (27) is not offered");
//! 4. every instruction is checked ([`insn`]): a helper outside [`OFFERED_HELPERS`] is refused
//!    by name ("helper bpf_get_smp_processor_id (8) is not offered"), and so are bpf-to-bpf
//!    calls, eBPF v4 opcodes and the other instructions the runtime cannot run yet;
//! 5. the PREVAIL verifier ([`verify`]) proves that the program terminates and that every
//!    memory access is inside the context, the stack, the packet or a map value; a failed
//!    proof names the instruction, PREVAIL's reason and the C source line.
//!
//! [`Program::instantiate`] ([`run`]) then runs a verified program: a lowering pass
//! ([`lower`]: per-packet instruction meter, atomic add, map handles), rbpf's x86-64 JIT per
//! worker, XDP frames below 4 GiB, the maps and the helpers. Loading does no I/O and reads
//! no clock; running takes the time and the RNG seed from the caller.

// Loading and compiling refuse what aya-obj, PREVAIL and rbpf's JIT panic on by catching the
// panic; with `panic = "abort"` a tenant's object would take the gateway down instead.
#[cfg(not(panic = "unwind"))]
compile_error!("protego-filter needs panic = \"unwind\": it refuses objects its parsers panic on");

mod error;
pub mod insn;
pub mod lower;
mod maps;
// The runtime is x86-64 Linux only: rbpf's JIT emits x86-64, frames need MAP_32BIT.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub mod run;
pub mod verify;

pub use error::{helper_name, map_type_name, LoadError, Unsupported};
pub use insn::{Insn, OFFERED_HELPERS};
pub use maps::{MapKind, MapSpec, MAX_KEY_OR_VALUE};
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
pub use run::{
    Abort, Counters, Engine, FrameBuf, Instance, Map, MapError, RunConfig, RunError, Runtime,
    Verdict, XdpAction,
};

use std::collections::{BTreeMap, BTreeSet, HashSet};

/// The longest program accepted, in instructions: the kernel's limit for unprivileged
/// programs. It bounds the verifier's work and the runtime's code size; the runtime may refuse
/// shorter programs whose machine code does not fit its JIT.
pub const MAX_INSTRUCTIONS: usize = 4096;

/// A parsed eBPF object, from which XDP programs are loaded.
pub struct Object {
    obj: aya_obj::Object,
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("programs", &self.programs())
            .finish_non_exhaustive()
    }
}

impl Object {
    /// Parses `bytes` and loads the program of `section` (`xdp` or `xdp:FUNCTION`):
    /// [`Object::parse`] then [`Object::program`].
    pub fn load(bytes: &[u8], section: &str) -> Result<Program, LoadError> {
        Self::parse(bytes)?.program(section)
    }

    /// Parses an eBPF ELF object. It must carry BTF (`clang -g`).
    pub fn parse(bytes: &[u8]) -> Result<Self, LoadError> {
        // aya-obj indexes into the ELF and BTF data it reads and panics on some damaged
        // objects (seen in tests/malformed.rs): a panic refuses the object.
        let parsed =
            std::panic::catch_unwind(|| aya_obj::Object::parse(bytes)).map_err(|panic| {
                LoadError::ParserFailed {
                    reason: error::panic_message(panic.as_ref()),
                }
            })?;
        let obj = parsed.map_err(|e| match e {
            aya_obj::ParseError::NoBTF => LoadError::NoBtf,
            aya_obj::ParseError::InvalidProgramSection { section } => {
                LoadError::UnknownSection { section }
            }
            source => LoadError::Malformed {
                reason: chain(&source),
                source,
            },
        })?;
        if obj.btf.is_none() {
            return Err(LoadError::NoBtf);
        }
        Ok(Self { obj })
    }

    /// The object's plain XDP programs, as the section names that select them
    /// (`xdp:FUNCTION`), sorted.
    pub fn programs(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .obj
            .programs
            .iter()
            .filter(|(_, p)| is_plain_xdp(&p.section))
            .map(|(name, _)| format!("xdp:{name}"))
            .collect();
        names.sort();
        names
    }

    /// Loads and verifies the program of `section`: `xdp` when the object's `xdp` section
    /// holds one program, `xdp:FUNCTION` to name one of several.
    pub fn program(&self, section: &str) -> Result<Program, LoadError> {
        // As in `parse`: aya-obj's relocation may panic on a damaged object.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.load_program(section)))
            .unwrap_or_else(|panic| {
                Err(LoadError::ParserFailed {
                    reason: error::panic_message(panic.as_ref()),
                })
            })
    }

    fn load_program(&self, section: &str) -> Result<Program, LoadError> {
        let function = self.choose(section)?;
        let mut obj = self.obj.clone();
        // Every function section takes part in call linking; map symbols live elsewhere.
        let text: HashSet<usize> = obj.functions.keys().map(|&(section, _)| section).collect();
        obj.relocate_calls(&text)
            .map_err(|e| relocation(section, &e))?;
        // Relocate every map of the object to a provisional handle (its rank by name, plus
        // one); the program's own maps are renumbered below.
        let mut all: Vec<(&String, &aya_obj::Map)> = self.obj.maps.iter().collect();
        all.sort_by(|a, b| a.0.cmp(b.0));
        let provisional = all
            .iter()
            .enumerate()
            .map(|(i, (name, map))| (name.as_str(), handle(i), *map));
        obj.relocate_maps(provisional, &text)
            .map_err(|e| relocation(section, &e))?;

        let code = obj
            .programs
            .get(&function)
            .and_then(|p| obj.functions.get(&p.function_key()))
            .ok_or_else(|| LoadError::Relocation {
                section: section.to_owned(),
                reason: format!("the code of `{function}` is missing"),
            })?;
        if code.instructions.len() > MAX_INSTRUCTIONS {
            return Err(LoadError::TooLong {
                section: section.to_owned(),
                length: code.instructions.len(),
            });
        }
        let mut insns: Vec<Insn> = code.instructions.iter().map(Insn::from_obj).collect();

        // The maps the program references, in order of name, with their final handles.
        // A crafted object may carry `lddw` with the map pseudo-source and any immediate.
        let mut used = BTreeSet::new();
        for i in insns
            .iter()
            .filter(|i| i.is_lddw() && i.src == insn::PSEUDO_MAP_FD)
        {
            let rank = usize::try_from(i.imm)
                .ok()
                .and_then(|h| h.checked_sub(1))
                .filter(|&r| r < all.len())
                .ok_or_else(|| LoadError::Relocation {
                    section: section.to_owned(),
                    reason: format!("a map reference to unknown handle {}", i.imm),
                })?;
            used.insert(rank);
        }
        let mut maps = Vec::with_capacity(used.len());
        let mut renumber = BTreeMap::new();
        for &rank in &used {
            let (name, map) = all[rank];
            renumber.insert(handle(rank), handle(maps.len()));
            maps.push(MapSpec::from_obj(name, map)?);
        }
        for i in insns
            .iter_mut()
            .filter(|i| i.is_lddw() && i.src == insn::PSEUDO_MAP_FD)
        {
            i.imm = *renumber
                .get(&i.imm)
                .expect("every map reference was ranked in the loop above");
        }
        insn::check(section, &insns)?;

        let lines = self.source_lines(code);
        let descriptors: Vec<_> = maps
            .iter()
            .enumerate()
            .map(|(i, m)| m.descriptor(handle(i)))
            .collect();
        let verdict = verify::verify(section, &insns, &descriptors, &lines)?;
        Ok(Program {
            section: section.to_owned(),
            function,
            insns,
            maps,
            loop_bound: verdict.loop_bound,
        })
    }

    /// The function `section` names, checked to be a plain XDP program.
    fn choose(&self, section: &str) -> Result<String, LoadError> {
        let function = match section.split_once(':') {
            None if section == "xdp" => None,
            Some(("xdp", f)) if !f.is_empty() => Some(f),
            _ => {
                return Err(LoadError::BadSectionName {
                    requested: section.to_owned(),
                })
            }
        };
        let available = self.programs();
        let Some(function) = function else {
            return match available.as_slice() {
                [one] => Ok(one["xdp:".len()..].to_owned()),
                [] => Err(LoadError::NoProgram {
                    requested: section.to_owned(),
                    available,
                }),
                _ => Err(LoadError::Ambiguous { available }),
            };
        };
        match self.obj.programs.get(function) {
            Some(p) if is_plain_xdp(&p.section) => Ok(function.to_owned()),
            Some(p) => Err(LoadError::NotXdp {
                requested: section.to_owned(),
                function: function.to_owned(),
                kind: program_kind(&p.section),
            }),
            None => Err(LoadError::NoProgram {
                requested: section.to_owned(),
                available,
            }),
        }
    }

    /// `file:line: source` for the instructions that begin a C source line, from the object's
    /// BTF line information (`.BTF.ext`; instruction indices relative to the function).
    fn source_lines(&self, code: &aya_obj::Function) -> BTreeMap<usize, String> {
        let Some(btf) = self.obj.btf.as_ref().map(aya_obj::btf::Btf::to_bytes) else {
            return BTreeMap::new();
        };
        let strings = btf_strings(&btf);
        let string = |off: u32| -> Option<&str> {
            let s = strings.get(usize::try_from(off).ok()?..)?;
            let end = s.iter().position(|&b| b == 0)?;
            std::str::from_utf8(&s[..end]).ok()
        };
        code.line_info
            .line_info
            .iter()
            .filter_map(|l| {
                let file = string(l.file_name_off)?;
                let file = file.rsplit('/').next().unwrap_or(file);
                let text = string(l.line_off)?.trim();
                let line = l.line_col >> 10;
                Some((
                    usize::try_from(l.insn_off).ok()?,
                    format!("{file}:{line}: {text}"),
                ))
            })
            .collect()
    }
}

/// A verified XDP program, ready for the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    section: String,
    function: String,
    insns: Vec<Insn>,
    maps: Vec<MapSpec>,
    loop_bound: u32,
}

impl Program {
    /// The section it was loaded from, as asked (`xdp` or `xdp:FUNCTION`).
    pub fn section(&self) -> &str {
        &self.section
    }

    /// The program's C function.
    pub fn function(&self) -> &str {
        &self.function
    }

    /// The verified instructions. A map reference is `lddw rX, H` with source register
    /// `BPF_PSEUDO_MAP_FD` (1) and `H` the map's index in [`Program::maps`] plus one.
    pub fn instructions(&self) -> &[Insn] {
        &self.insns
    }

    /// The instructions in their 8-byte encoding, as eBPF runtimes take them.
    pub fn bytecode(&self) -> Vec<u8> {
        self.insns.iter().flat_map(|i| i.to_bytes()).collect()
    }

    /// The maps the program uses, sorted by name.
    pub fn maps(&self) -> &[MapSpec] {
        &self.maps
    }

    /// The largest number of iterations PREVAIL proved for any of the program's loops (0 for
    /// a program without loops).
    pub fn loop_bound(&self) -> u32 {
        self.loop_bound
    }
}

/// The handle of the map at `index`: PREVAIL, like the kernel, keeps 0 for no map.
fn handle(index: usize) -> i32 {
    i32::try_from(index + 1).unwrap_or(i32::MAX)
}

fn is_plain_xdp(section: &aya_obj::ProgramSection) -> bool {
    matches!(
        section,
        aya_obj::ProgramSection::Xdp {
            frags: false,
            attach_type: aya_obj::programs::XdpAttachType::Interface,
        }
    )
}

/// How an error names a program kind other than plain XDP.
fn program_kind(section: &aya_obj::ProgramSection) -> String {
    use aya_obj::programs::XdpAttachType;
    use aya_obj::ProgramSection::Xdp;
    match section {
        Xdp { frags: true, .. } => "multi-buffer XDP (xdp.frags)".to_owned(),
        Xdp {
            attach_type: XdpAttachType::CpuMap,
            ..
        } => "cpumap XDP (xdp/cpumap)".to_owned(),
        Xdp {
            attach_type: XdpAttachType::DevMap,
            ..
        } => "devmap XDP (xdp/devmap)".to_owned(),
        other => format!("{other:?}"),
    }
}

fn relocation(section: &str, e: &aya_obj::relocation::EbpfRelocationError) -> LoadError {
    LoadError::Relocation {
        section: section.to_owned(),
        reason: chain(e),
    }
}

/// An error and its causes, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

/// The string section of encoded BTF (`struct btf_header`: magic, version, flags, hdr_len,
/// type_off, type_len, str_off, str_len; offsets after the header).
fn btf_strings(btf: &[u8]) -> &[u8] {
    let word = |at: usize| {
        btf.get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(|b| u32::from_le_bytes(b) as usize)
    };
    let range = (|| {
        let (hdr_len, str_off, str_len) = (word(4)?, word(16)?, word(20)?);
        let start = hdr_len.checked_add(str_off)?;
        btf.get(start..start.checked_add(str_len)?)
    })();
    range.unwrap_or(&[])
}
