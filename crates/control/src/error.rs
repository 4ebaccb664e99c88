//! Errors of the control plane: configuration errors that point into the file, and run-time
//! failures of the control loop, the status socket and the key log.

use std::fmt;
use std::path::PathBuf;

/// An error of the control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration file is invalid; nothing was started.
    #[error("{0}")]
    Config(Box<ConfigError>),
    /// The IKE engine refused a validated tunnel configuration.
    #[error("IKE engine rejected tunnel {tunnel:?}: {source}")]
    Engine {
        /// The tunnel's name.
        tunnel: String,
        /// The engine's error.
        source: ike::Error,
    },
    /// The state store could not be read at start (nothing was started: restoring from it is
    /// what keeps the peers' IKE SAs).
    #[error("cannot read the IKE state store: {0}")]
    Store(#[from] crate::store::StoreError),
    /// A thread could not be started.
    #[error("cannot start thread {name}: {source}")]
    Spawn {
        /// The thread's name.
        name: &'static str,
        /// The OS error.
        source: std::io::Error,
    },
    /// The IKE engine refused an operator command.
    #[error("{command} of tunnel {tunnel:?} failed: {source}")]
    Command {
        /// The command (`initiate`, `terminate`, `rekey`, `rekey-ike`).
        command: &'static str,
        /// The tunnel it was for.
        tunnel: ike::TunnelId,
        /// The engine's error.
        source: ike::Error,
    },
    /// The control loop is shutting down and takes no new commands.
    #[error("the control loop is shutting down")]
    ShuttingDown,
    /// The control loop is not running (it stopped or panicked).
    #[error("the control loop is not running")]
    ControlStopped,
    /// The control socket could not be created, bound or used.
    #[error("control socket {path}: {source}")]
    Socket {
        /// The socket's path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The process at the other end of the control socket answered something unexpected.
    #[error("control socket {path}: {reason}")]
    Protocol {
        /// The socket's path.
        path: PathBuf,
        /// What was wrong with the answer.
        reason: String,
    },
    /// The configuration applied with `protego ctl apply`, kept in the store, cannot be used.
    #[error(
        "the configuration applied with `protego ctl apply` ({store}) cannot be used: {detail}"
    )]
    Applied {
        /// The store, as [`crate::store::Store::describe`] puts it.
        store: String,
        /// What is wrong.
        detail: String,
    },
    /// The filters loaded with `protego ctl filter` cannot be read or run.
    #[error("the filters loaded with `protego ctl filter` ({store}) cannot be used: {detail}")]
    Filters {
        /// The store, as [`crate::store::Store::describe`] puts it.
        store: String,
        /// What is wrong.
        detail: String,
    },
    /// `protego ctl filter` refused a change; nothing changed.
    #[error("no filter changed: {0}")]
    Filter(String),
    /// `protego ctl apply` refused a configuration; nothing changed.
    #[error("nothing applied: {0}")]
    Apply(String),
    /// A per-VM route change was refused by the data path (nothing changed).
    #[error("{0}")]
    Route(#[from] datapath::DataplaneError),
    /// The per-VM route file, snapshot or journal could not be read or written.
    #[error("route store {path}: {reason}")]
    RouteStore {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A per-VM route change reached the data path but could not be recorded in the route
    /// store: the data path forwards by it until the next restart, which loses it.
    #[error("applied to the data path but not persisted (lost at the next restart): route store {path}: {reason}")]
    NotPersisted {
        /// The file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The key log could not be opened or written.
    #[error("key log {path}: {source}")]
    KeyLog {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Self {
        Error::Config(Box::new(e))
    }
}

/// A configuration error, located in the file: the first line of its `Display` reads
/// `FILE:LINE:COLUMN: key `KEY` in SECTION: MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The configuration file.
    pub file: PathBuf,
    /// 1-based line of the offending value (0 if the error concerns the whole file).
    pub line: usize,
    /// 1-based column (in characters) of the offending value (0 if unknown).
    pub column: usize,
    /// The offending key (`psk_file`), when known.
    pub key: Option<String>,
    /// The table it is in (`[[tunnel]] "site-a"`, `[gateway]`), when known.
    pub section: Option<String>,
    /// What is wrong.
    pub message: String,
    /// The text of the offending line, for a caret display.
    pub source_line: Option<String>,
    /// Length in characters of the offending span on that line (at least 1).
    pub span_len: usize,
}

impl ConfigError {
    /// A `rustc`-style excerpt of the offending line with a caret under the value, if the error
    /// has a location.
    pub fn snippet(&self) -> Option<String> {
        let text = self.source_line.as_ref()?;
        let number = self.line.to_string();
        let pad = " ".repeat(number.len());
        let indent = " ".repeat(self.column.saturating_sub(1));
        let carets = "^".repeat(self.span_len.max(1));
        Some(format!(
            "{pad} |\n{number} | {text}\n{pad} | {indent}{carets}"
        ))
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        f.write_str(": ")?;
        match (&self.key, &self.section) {
            (Some(key), Some(section)) => write!(f, "key `{key}` in {section}: ")?,
            (Some(key), None) => write!(f, "key `{key}`: ")?,
            (None, Some(section)) => write!(f, "in {section}: ")?,
            (None, None) => {}
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}
