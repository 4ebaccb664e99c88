//! The test bed's error type: every failure names the command or object involved
//! and carries what the failing tool printed.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// Result alias used throughout the test bed.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while building or driving a test bed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The test bed needs root (network namespaces, veth, TUN, nftables).
    #[error("the test bed must run as root (effective uid is {euid})")]
    NotRoot {
        /// The effective uid the process has.
        euid: u32,
    },

    /// A required program is not installed (run `scripts/setup.sh`).
    #[error(
        "required program `{program}` not found (scripts/setup.sh installs it: Debian package {})",
        testreq::package_of(program).unwrap_or("see scripts/requirements.tsv")
    )]
    MissingProgram {
        /// The program looked for.
        program: String,
    },

    /// A command could not be started at all.
    #[error("could not start `{command}`: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// The operating-system error.
        #[source]
        source: io::Error,
    },

    /// A command ran and exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// How it ended (exit code or signal).
        status: String,
        /// What it wrote to stderr (trimmed; stdout if stderr was empty).
        stderr: String,
    },

    /// A command did not finish in time and was killed.
    #[error("`{command}` did not finish within {timeout:?} and was killed")]
    CommandTimeout {
        /// The command line.
        command: String,
        /// The time limit that expired.
        timeout: Duration,
    },

    /// A condition polled by a wait helper did not become true in time.
    #[error("timed out after {timeout:?} waiting for {what}; last state: {last}")]
    WaitTimeout {
        /// What was waited for.
        what: String,
        /// The time limit that expired.
        timeout: Duration,
        /// The last observed state, to tell why.
        last: String,
    },

    /// A background process exited while it was expected to run.
    #[error("process `{label}` (pid {pid}) exited unexpectedly ({status}); log tail:\n{log_tail}")]
    ProcessExited {
        /// The label given when it was spawned.
        label: String,
        /// Its pid.
        pid: u32,
        /// How it ended.
        status: String,
        /// The last lines of its log.
        log_tail: String,
    },

    /// The browser answered a DevTools command with an error, a page script threw, or the
    /// browser went away ([`crate::browser`]).
    #[error("browser: {method}: {detail}")]
    Browser {
        /// The DevTools method (`Page.navigate`, `Runtime.evaluate`, ...).
        method: String,
        /// The browser's error message, the script's exception, or what was missing.
        detail: String,
    },

    /// A file-system operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("create directory", "write", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The operating-system error.
        #[source]
        source: io::Error,
    },

    /// A generated name does not fit the kernel's limits.
    #[error("name `{name}` is invalid: {reason}")]
    InvalidName {
        /// The offending name.
        name: String,
        /// Why it is invalid.
        reason: &'static str,
    },

    /// A tool's output could not be understood.
    #[error("cannot parse {what}: {detail} (input: {input})")]
    Parse {
        /// Which output was parsed (e.g. "ping statistics").
        what: &'static str,
        /// What was wrong with it.
        detail: String,
        /// The input, shortened.
        input: String,
    },

    /// A topology or configuration description is inconsistent.
    #[error("invalid test-bed specification: {field}: {reason}")]
    InvalidSpec {
        /// The field that is wrong (e.g. `tenants[1].vms[0].host`).
        field: String,
        /// Why.
        reason: String,
    },

    /// Teardown could not remove everything.
    #[error("teardown of test bed {run} left problems: {problems}")]
    Teardown {
        /// The run id.
        run: String,
        /// What could not be removed, and why.
        problems: String,
    },

    /// The test bed was already torn down (e.g. by Ctrl-C) when a resource was created.
    #[error("the test bed {run} is already torn down; `{what}` was removed again")]
    TornDown {
        /// The run id.
        run: String,
        /// The resource that arrived too late.
        what: String,
    },
}

impl Error {
    /// Builds an [`Error::Io`].
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
