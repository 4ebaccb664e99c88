//! The benchmark's error type: one enum, every variant naming what failed and where.

use std::path::PathBuf;

/// Result of the benchmark's fallible operations.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Everything that can stop a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A command-line value could not be understood.
    #[error("invalid {option} `{value}`: {reason}")]
    InvalidOption {
        /// The option (`--sizes`, `--duration`, ...).
        option: &'static str,
        /// The offending value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Building or tearing down the network namespaces, or starting a process, failed.
    #[error("test bed: {0}")]
    Testbed(#[from] testbed::Error),
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The gateway under test failed to start, exited, or misbehaved.
    #[error("gateway under test ({gateway}): {reason}{}", log_suffix(.log_tail))]
    Gateway {
        /// `protego` or `strongswan`.
        gateway: &'static str,
        /// What went wrong.
        reason: String,
        /// The last lines of its log, if any.
        log_tail: String,
    },
    /// The IKE negotiation of the load generator's tunnels with the gateway failed.
    #[error("IKE with the gateway under test ({gateway}): {reason}")]
    Ike {
        /// `protego` or `strongswan`.
        gateway: &'static str,
        /// What went wrong.
        reason: String,
    },
    /// An ESP SA could not be keyed or a packet could not be sealed.
    #[error("ESP SA {spi:08x}: {source}")]
    Esp {
        /// The SPI of the SA.
        spi: u32,
        /// The `esp` crate's error.
        source: esp::EspError,
    },
    /// The CHILD_SA keys could not be turned into a cipher.
    #[error("CHILD_SA {spi:08x} keys: {source}")]
    Crypto {
        /// The SPI of the SA.
        spi: u32,
        /// The `crypto` crate's error.
        source: crypto::Error,
    },
    /// The gateway's control socket did not answer as expected.
    #[error("status socket {}: {reason}", .path.display())]
    Status {
        /// The socket path.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A case delivered nothing at all, so no figure can be computed.
    #[error("case {case}: {detail}")]
    NoTraffic {
        /// The case, as printed in the table.
        case: String,
        /// What was observed.
        detail: String,
    },
    /// A worker thread of the load generator panicked or vanished.
    #[error("load generator thread `{thread}` failed: {reason}")]
    Thread {
        /// The thread's name.
        thread: &'static str,
        /// What happened.
        reason: String,
    },
    /// The run was interrupted (Ctrl-C).
    #[error("interrupted")]
    Interrupted,
}

fn log_suffix(tail: &str) -> String {
    if tail.trim().is_empty() {
        String::new()
    } else {
        format!("\n--- last lines of its log ---\n{tail}")
    }
}

impl BenchError {
    /// An [`BenchError::Io`] for `what`.
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        BenchError::Io {
            what: what.into(),
            source,
        }
    }
}
