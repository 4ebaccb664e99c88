//! Where a [`RouteStore`](super::RouteStore) keeps its snapshot and journal: the
//! [`RouteMedium`] trait, implemented by files ([`FileMedium`](super::FileMedium), `protego
//! up`) and by etcd ([`EtcdMedium`](crate::store::EtcdMedium), the cluster's control nodes).
//!
//! The store decides what is written when (restore, replay, compaction); a medium only keeps
//! it, with these guarantees:
//!
//! - a snapshot is replaced atomically: after a crash, [`RouteMedium::read_snapshot`] returns
//!   the old generation whole or the new one whole;
//! - an appended journal line is durable when [`RouteMedium::append`] returns;
//! - the journal names the generation it follows; lines appended after the snapshot of
//!   generation `g` belong to `g`.

use std::fmt;
use std::io::Write;

/// Why a medium failed: where (a file's path, an etcd key) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{at}: {reason}")]
pub struct MediumError {
    /// The file or key at fault.
    pub at: String,
    /// What failed.
    pub reason: String,
}

impl MediumError {
    /// An error at `at`.
    pub fn new(at: impl Into<String>, reason: impl fmt::Display) -> Self {
        Self {
            at: at.into(),
            reason: reason.to_string(),
        }
    }
}

/// A journal as read: the generation of the snapshot it follows, its complete change lines
/// with their numbers (1-based line of a file, or the sequence number of an etcd record), and
/// whether a last line a crash cut short (never answered) was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalRead {
    /// The generation it follows (0 for a file journal without a header).
    pub generation: u64,
    /// Its change lines, in order, each with its number.
    pub lines: Vec<(usize, String)>,
    /// A torn last line was left out.
    pub torn: bool,
}

/// What writes a snapshot's bytes (the data path's `write_routes`); returns the entries
/// written, or why it failed.
pub type WriteSnapshot<'a> = dyn FnMut(&mut dyn Write) -> Result<usize, String> + 'a;

/// Where a route store keeps its snapshot and journal (see the module docs).
pub trait RouteMedium: Send + fmt::Debug {
    /// The snapshot's place, for messages (a path, or an etcd key).
    fn snapshot_at(&self) -> String;
    /// The journal's place, for messages.
    fn journal_at(&self) -> String;
    /// The last snapshot written: its generation and the data path's snapshot bytes (see
    /// `overlay::snapshot`); None if none was ever written. A damaged one is an error naming
    /// what is damaged.
    fn read_snapshot(&mut self) -> Result<Option<(u64, Vec<u8>)>, MediumError>;
    /// The journal, None if there is none. A medium may keep journals of several generations
    /// (etcd until a compaction finishes): it returns the one of the snapshot's generation
    /// `snapshot` if there is one, else the latest.
    fn read_journal(&mut self, snapshot: u64) -> Result<Option<JournalRead>, MediumError>;
    /// Keeps what was found at start before the start's compaction replaces it, where the
    /// medium can (files: `.prev` copies). The default keeps nothing.
    fn keep_previous(&mut self) -> Result<(), MediumError> {
        Ok(())
    }
    /// Writes the snapshot of generation `generation` with `write`, replacing the last one
    /// atomically once it is whole and durable; returns the entries written. The journal of
    /// the generation before is stale afterwards (the snapshot holds its changes).
    fn write_snapshot(
        &mut self,
        generation: u64,
        write: &mut WriteSnapshot<'_>,
    ) -> Result<usize, MediumError>;
    /// Starts the (empty) journal of generation `generation`, durable when it returns.
    fn start_journal(&mut self, generation: u64) -> Result<(), MediumError>;
    /// Appends `line` (without its newline) to the journal of generation `generation`,
    /// durable when it returns. A failed append leaves no partial line that a later append
    /// would follow.
    fn append(&mut self, generation: u64, line: &str) -> Result<(), MediumError>;
}

impl<M: RouteMedium + ?Sized> RouteMedium for Box<M> {
    fn snapshot_at(&self) -> String {
        (**self).snapshot_at()
    }

    fn journal_at(&self) -> String {
        (**self).journal_at()
    }

    fn read_snapshot(&mut self) -> Result<Option<(u64, Vec<u8>)>, MediumError> {
        (**self).read_snapshot()
    }

    fn read_journal(&mut self, snapshot: u64) -> Result<Option<JournalRead>, MediumError> {
        (**self).read_journal(snapshot)
    }

    fn keep_previous(&mut self) -> Result<(), MediumError> {
        (**self).keep_previous()
    }

    fn write_snapshot(
        &mut self,
        generation: u64,
        write: &mut WriteSnapshot<'_>,
    ) -> Result<usize, MediumError> {
        (**self).write_snapshot(generation, write)
    }

    fn start_journal(&mut self, generation: u64) -> Result<(), MediumError> {
        (**self).start_journal(generation)
    }

    fn append(&mut self, generation: u64, line: &str) -> Result<(), MediumError> {
        (**self).append(generation, line)
    }
}
