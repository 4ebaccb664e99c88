//! Why an eBPF object was refused: one error type for the whole crate, each variant naming
//! the section, the instruction, the map or the helper it is about.

/// Why [`crate::Object::load`] refused an object. A refused object changes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not an eBPF ELF object `aya-obj` can read.
    #[error("not a readable eBPF object: {reason}")]
    Malformed {
        /// The parser's error, with its causes.
        reason: String,
        /// The parser's error itself.
        #[source]
        source: aya_obj::ParseError,
    },
    /// The ELF parser or the relocation failed on the object (a panic in `aya-obj`, caught).
    #[error("not a readable eBPF object: the parser failed on it ({reason})")]
    ParserFailed {
        /// The parser's panic message.
        reason: String,
    },
    /// The object carries no BTF, so its maps cannot be described.
    #[error("the object has no BTF, which describes its maps: compile with -g (clang -O2 -g -target bpf -c ...)")]
    NoBtf,
    /// A program section whose name `aya-obj` does not know (e.g. `xdp/foo`).
    #[error(
        "section `{section}` is not a program section we know: put the filter in SEC(\"xdp\")"
    )]
    UnknownSection {
        /// The ELF section's name.
        section: String,
    },
    /// The requested section is neither `xdp` nor `xdp:FUNCTION`.
    #[error("section `{requested}`: expected `xdp`, or `xdp:FUNCTION` when the section holds several programs")]
    BadSectionName {
        /// What was asked for.
        requested: String,
    },
    /// No XDP program matches the requested section.
    #[error(
        "section `{requested}`: no such XDP program; the object has {}",
        list(available)
    )]
    NoProgram {
        /// What was asked for.
        requested: String,
        /// The XDP programs of the object, as `xdp:FUNCTION`.
        available: Vec<String>,
    },
    /// `xdp` was asked for and the section holds several programs.
    #[error("section `xdp` holds several programs ({}): choose one with `xdp:FUNCTION`", available.join(", "))]
    Ambiguous {
        /// The XDP programs of the object, as `xdp:FUNCTION`.
        available: Vec<String>,
    },
    /// The named function is a program of another kind than plain XDP.
    #[error("section `{requested}`: `{function}` is a {kind} program; only XDP programs in SEC(\"xdp\") are offered")]
    NotXdp {
        /// What was asked for.
        requested: String,
        /// The function.
        function: String,
        /// Its program kind, as `aya-obj` names it.
        kind: String,
    },
    /// The program is longer than [`crate::MAX_INSTRUCTIONS`].
    #[error(
        "section `{section}`: {length} instructions, more than the {} offered",
        crate::MAX_INSTRUCTIONS
    )]
    TooLong {
        /// The requested section.
        section: String,
        /// The program's length in instructions.
        length: usize,
    },
    /// Map references or calls could not be relocated.
    #[error("section `{section}`: relocation failed: {reason}")]
    Relocation {
        /// The requested section.
        section: String,
        /// The relocation error, with its causes.
        reason: String,
    },
    /// The program calls a helper outside [`crate::OFFERED_HELPERS`].
    #[error("section `{section}`, instruction {index}: helper {} ({id}) is not offered", helper_name(*id))]
    Helper {
        /// The requested section.
        section: String,
        /// The call's instruction index in the program (see [`crate::Insn`]).
        index: usize,
        /// The helper's number in the kernel's `enum bpf_func_id`.
        id: i32,
    },
    /// The program uses a map whose type is outside [`crate::MapKind`].
    #[error("map `{map}`: type {} ({map_type}) is not offered", map_type_name(*map_type))]
    MapType {
        /// The map's name in the object.
        map: String,
        /// The map's type number in the kernel's `enum bpf_map_type`.
        map_type: u32,
    },
    /// The program uses a map declared in the legacy `maps` section (no BTF).
    #[error("map `{map}` is declared in the legacy `maps` section: declare it in SEC(\".maps\") with __uint/__type (BTF)")]
    LegacyMap {
        /// The map's name in the object.
        map: String,
    },
    /// A map's key or value size is out of range.
    #[error("map `{map}`: {what}")]
    MapShape {
        /// The map's name in the object.
        map: String,
        /// What is wrong with it.
        what: &'static str,
    },
    /// An instruction the gateway does not run yet.
    #[error("section `{section}`, instruction {index}: {what}")]
    Unsupported {
        /// The requested section.
        section: String,
        /// The instruction index in the program (see [`crate::Insn`]).
        index: usize,
        /// What it is.
        what: Unsupported,
    },
    /// The PREVAIL verifier could not prove the program safe.
    #[error("section `{section}`, instruction {}: {reason}{}", index.map_or_else(|| "?".to_owned(), |i| i.to_string()), source_line.as_ref().map_or_else(String::new, |l| format!(" (at {l})")))]
    Verifier {
        /// The requested section.
        section: String,
        /// The instruction where the proof failed, when PREVAIL names one (an index in the
        /// program, see [`crate::Insn`]).
        index: Option<usize>,
        /// PREVAIL's reason, e.g. `Upper bound must be at most packet_size (valid_access(r1.offset+20, width=1) for read)`.
        reason: String,
        /// The C source line of that instruction, from the object's BTF line information.
        source_line: Option<String>,
    },
    /// The verification took longer than its budget (`verify::VERIFY_BUDGET`).
    #[error("section `{section}`: the verifier gave up after {seconds} s (the program is too complex to prove in time: simplify its loops and branches, or split it)")]
    VerifierBudget {
        /// The requested section.
        section: String,
        /// The budget, in seconds.
        seconds: f64,
    },
    /// Earlier verifications that ran past their budget are still running: refused without
    /// starting, until they end.
    #[error("section `{section}`: the verifier is still busy with programs that ran past their time budget; try again later")]
    VerifierBusy {
        /// The requested section.
        section: String,
    },
    /// PREVAIL could not read the program, or failed internally.
    #[error("section `{section}`: the verifier could not analyse the program: {reason}")]
    VerifierInternal {
        /// The requested section.
        section: String,
        /// What went wrong.
        reason: String,
    },
}

/// An instruction kind the gateway does not run (yet), named in [`LoadError::Unsupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unsupported {
    /// A call to another BPF function of the object (`call pc+N`).
    LocalCall,
    /// A call through a register (`callx`).
    IndirectCall,
    /// A call to a kernel function (kfunc).
    Kfunc,
    /// A function pointer (`ld_imm64` of a function, for callbacks).
    FunctionPointer,
    /// A reference to global data (`.data`, `.rodata`, `.bss`).
    GlobalData,
    /// A 64-bit load of an unknown pseudo-source.
    UnknownLoad(u8),
    /// `LD_ABS`/`LD_IND`, the socket filters' packet access.
    LegacyPacketAccess,
    /// An atomic operation other than a plain add (fetch, xchg, cmpxchg, or/and/xor).
    Atomic(i32),
    /// eBPF v4: signed division or modulo.
    SignedDivision,
    /// eBPF v4: sign-extending move.
    SignExtendingMove,
    /// eBPF v4: sign-extending load.
    SignExtendingLoad,
    /// eBPF v4: unconditional byte swap.
    ByteSwap,
    /// eBPF v4: jump with a 32-bit offset (`gotol`).
    LongJump,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let v4 = "(eBPF v4) is not supported yet: compile with -mcpu=v3";
        match self {
            Self::LocalCall => f.write_str(
                "bpf-to-bpf call is not supported yet: make the callee `static __always_inline`",
            ),
            Self::IndirectCall => f.write_str("indirect call (callx) is not supported"),
            Self::Kfunc => f.write_str("kernel function calls (kfuncs) are not offered"),
            Self::FunctionPointer => {
                f.write_str("function pointers (callbacks) are not supported")
            }
            Self::GlobalData => f.write_str(
                "global variables (.data, .rodata, .bss) are not supported yet: use an array map",
            ),
            Self::UnknownLoad(src) => write!(f, "64-bit load of pseudo-source {src} is not supported"),
            Self::LegacyPacketAccess => f.write_str(
                "LD_ABS/LD_IND packet access is not offered to XDP programs: read through ctx->data",
            ),
            Self::Atomic(op) => write!(
                f,
                "atomic operation {op:#x} is not supported yet (only __sync_fetch_and_add whose result is unused)"
            ),
            Self::SignedDivision => write!(f, "signed division or modulo {v4}"),
            Self::SignExtendingMove => write!(f, "sign-extending move {v4}"),
            Self::SignExtendingLoad => write!(f, "sign-extending load {v4}"),
            Self::ByteSwap => write!(f, "unconditional byte swap {v4}"),
            Self::LongJump => write!(f, "jump with a 32-bit offset (gotol) {v4}"),
        }
    }
}

/// `bpf_NAME` for a kernel helper number, from PREVAIL's table of Linux helper prototypes.
pub fn helper_name(id: i32) -> String {
    match prevail::linux::spec_prototypes::try_get_helper_prototype(id) {
        Some(p) if !p.name.is_empty() => format!("bpf_{}", p.name),
        _ => "(unknown)".to_owned(),
    }
}

/// The kernel's name for a map type number, in lower case (`ringbuf`, `lru_hash`).
pub fn map_type_name(map_type: u32) -> String {
    use prevail::platform::EbpfPlatform;
    let t = prevail::linux::linux_platform::LinuxPlatform::new().get_map_type(map_type);
    if t.platform_specific_type == map_type && map_type != 0 {
        t.name.to_ascii_lowercase()
    } else {
        "(unknown)".to_owned()
    }
}

/// The message of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn list(available: &[String]) -> String {
    if available.is_empty() {
        "no XDP program".to_owned()
    } else {
        available.join(", ")
    }
}
