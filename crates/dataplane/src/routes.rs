//! The per-VM overlay routes (issue 16 §2): the exact-match table (VNet, VM address) -> host
//! VTEP of the `overlay` crate, beside each VNet's prefix routes (an exact entry wins), and
//! its publication to the workers while they forward.
//!
//! Publication is left-right (the `left-right` crate): two copies of [`Routes`]. Workers read
//! one copy, entered once per batch ([`RouteReader::enter`]: an epoch counter of their own,
//! no lock, no shared cache line written). The writer ([`RouteWriter`], one, behind a mutex in
//! `Shared`) applies a change to the other copy, swaps the pointer readers load, waits until
//! every worker that was inside the old copy has finished its batch, then replays the change
//! on it. A batch therefore sees the table before a change or after it, never a part of it;
//! a change is visible to every batch that starts after the swap (so a moved VM's next packet
//! goes to its new host); and a packet is never looked up in a copy being changed. Memory is
//! twice the table (2 × 15 bytes per IPv4 entry at the table's reserved load factor).
//!
//! A bulk load is one operation over the route file's text: the writer parses and resolves
//! the whole file first (a bad line changes nothing), then the operation inserts the entries
//! into one copy and is published; the other copy, once readers left it, becomes a memory
//! copy of the new one (a second publish, right away, so that the next single change does
//! not wait for it). Single changes are replayed, as left-right does.

use std::ops::Deref;
use std::sync::{Arc, Mutex, PoisonError};

use datapath::{DataplaneError, RouteChange, RouteChangeReport, RouteStats};
use ids::TenantId;
use left_right::{Absorb, ReadGuard, ReadHandle, ReadHandleFactory, WriteHandle};
#[cfg(test)]
use overlay::Family;
use overlay::{OverlayError, VnetId};
pub(crate) use routebook::RouteVnet;
use routebook::{Apply, Op, RouteBook};

/// One copy of the per-VM routes (`routebook::Routes`: the table, the hosts of each VNet's
/// entries, its counts), as `left-right` publishes it.
#[derive(Clone, Default)]
pub(crate) struct Routes(routebook::Routes);

impl Deref for Routes {
    type Target = routebook::Routes;

    fn deref(&self) -> &routebook::Routes {
        &self.0
    }
}

impl Absorb<Op> for Routes {
    fn absorb_first(&mut self, op: &mut Op, _other: &Self) {
        self.0.apply(op);
    }

    /// A bulk change is not replayed but copied: `other` holds it and every change before it,
    /// and a copy of the table is a memory copy where a replay parses and inserts again. The
    /// writer publishes a bulk change alone (nothing appended with it, published at once:
    /// [`Publisher::apply`]), so `other` holds nothing after it either; were a change
    /// published with it, `other` would hold that one too and it would be replayed on top,
    /// which every other operation allows (each is idempotent).
    fn absorb_second(&mut self, op: Op, other: &Self) {
        if op.is_bulk() {
            // Free this copy first: three copies of a large table at once are not needed.
            *self = Routes::default();
            *self = other.clone();
        } else {
            self.0.apply(&op);
        }
    }

    fn sync_with(&mut self, first: &Self) {
        self.clone_from(first);
    }
}

/// A worker's handle on the published routes.
pub(crate) struct RouteReader(ReadHandle<Routes>);

/// The routes a batch reads: valid until dropped (drop it when the batch is done, or the
/// writer waits).
pub(crate) type RouteGuard<'a> = ReadGuard<'a, Routes>;

/// An empty table, for the (never expected) case that the writer is gone.
static EMPTY: std::sync::LazyLock<Routes> = std::sync::LazyLock::new(Routes::default);

impl RouteReader {
    /// Enters the current copy for one batch.
    pub(crate) fn enter(&self) -> Option<RouteGuard<'_>> {
        self.0.enter()
    }

    /// The empty table (a reader whose writer is gone reads this).
    pub(crate) fn empty() -> &'static Routes {
        &EMPTY
    }
}

/// Makes [`RouteReader`]s (shared by the threads), and holds the statistics of the last
/// publication.
pub(crate) struct RouteReaders {
    factory: ReadHandleFactory<Routes>,
    stats: Arc<Mutex<Arc<RouteStats>>>,
}

impl RouteReaders {
    /// A reader for one worker thread.
    pub(crate) fn reader(&self) -> RouteReader {
        RouteReader(self.factory.handle())
    }

    /// Entries per configured VNet, hosts and memory, as of the last change (never waits for
    /// one in progress, a bulk load included: the lock is held only to swap an `Arc`).
    pub(crate) fn stats(&self) -> Arc<RouteStats> {
        Arc::clone(&self.stats.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The one writer of the routes: the book of VNets (`routebook::RouteBook`: their numbers,
/// the validation of a change) and the publication of its operations.
pub(crate) struct RouteWriter {
    w: WriteHandle<Routes, Op>,
    book: RouteBook,
    /// Where the statistics are left after each publication, for [`RouteReaders::stats`].
    stats: Arc<Mutex<Arc<RouteStats>>>,
}

/// Applies the book's operations to both copies: each appended alone and published twice
/// (the first publication swaps in the copy that applied it, the second the copy that
/// replayed it, or copied it for a bulk change), so the next one finds both copies current.
struct Publisher<'a> {
    w: &'a mut WriteHandle<Routes, Op>,
}

impl Publisher<'_> {
    /// Reads the published copy (the writer's own read handle).
    fn read_copy<R>(w: &WriteHandle<Routes, Op>, f: impl FnOnce(&Routes) -> R) -> R {
        match w.enter() {
            Some(g) => f(&g),
            None => f(RouteReader::empty()),
        }
    }
}

impl Apply for Publisher<'_> {
    fn read<R>(&self, f: impl FnOnce(&routebook::Routes) -> R) -> R {
        Self::read_copy(self.w, |r| f(r))
    }

    fn apply(&mut self, op: Op) -> Option<(usize, OverlayError)> {
        debug_assert!(
            !(op.is_bulk() && self.w.has_pending_operations()),
            "a bulk change is published alone"
        );
        self.w.append(op);
        self.w.publish();
        let first = self.read(|t| t.failed().cloned());
        self.w.publish();
        let second = self.read(|t| t.failed().cloned());
        first.or(second)
    }
}

impl RouteWriter {
    /// An empty table, its writer and the factory of its readers.
    pub(crate) fn new() -> (Self, RouteReaders) {
        let (mut w, r) = left_right::new_from_empty::<Routes, Op>(Routes::default());
        // Out of `left-right`'s first mode, which applies an appended operation to the write
        // copy with `absorb_second` and would turn a bulk change into a copy of the empty
        // other one.
        w.publish();
        let stats = Arc::new(Mutex::new(Arc::new(RouteStats::default())));
        let readers = RouteReaders {
            factory: r.factory(),
            stats: Arc::clone(&stats),
        };
        (
            Self {
                w,
                book: RouteBook::new(),
                stats,
            },
            readers,
        )
    }

    /// The number of VNet (`tenant`, `name`), given on first sight.
    pub(crate) fn vnet_id(&mut self, tenant: &TenantId, name: &str) -> VnetId {
        self.book.vnet_id(tenant, name)
    }

    /// The number VNet (`tenant`, `name`) has or would get, without giving it one.
    pub(crate) fn peek_id(&self, tenant: &TenantId, name: &str) -> VnetId {
        self.book.peek_id(tenant, name)
    }

    /// The configured VNets changed (in configuration order, with their numbers and VNIs):
    /// VNets no longer configured lose their entries, as do those whose VTEP changed address
    /// family; the others get their VNIs.
    pub(crate) fn set_vnets(&mut self, vnets: Vec<RouteVnet>) {
        for op in self.book.set_vnets(vnets) {
            self.w.append(op);
        }
        self.publish();
    }

    /// Publishes what was appended, and replays it on the other copy at once so the next
    /// change finds both copies current.
    fn publish(&mut self) {
        self.w.publish();
        self.w.publish();
        self.leave_stats();
    }

    /// Leaves the statistics of the published copy for [`RouteReaders::stats`] (a scan of
    /// the configured VNets, the rest is counters).
    fn leave_stats(&self) {
        let stats = Arc::new(self.stats());
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner) = stats;
    }

    /// Entries limit of both copies (tests).
    #[cfg(test)]
    pub(crate) fn limit(&mut self, max: Option<usize>) {
        self.w.append(Op::Limit(max));
        self.publish();
    }

    /// Applies `change` (validated whole first, by the book: see `routebook::RouteBook::change`).
    pub(crate) fn change(
        &mut self,
        change: RouteChange,
    ) -> Result<RouteChangeReport, DataplaneError> {
        let result = self.book.change(change, &mut Publisher { w: &mut self.w });
        self.leave_stats();
        result
    }

    /// Reads the published copy (the writer's own read handle).
    fn read<R>(&self, f: impl FnOnce(&Routes) -> R) -> R {
        Publisher::read_copy(&self.w, f)
    }

    /// Writes the compact snapshot of every entry of a configured VNet (see
    /// `overlay::snapshot`); returns the entries written.
    pub(crate) fn write_snapshot(
        &self,
        out: &mut dyn std::io::Write,
    ) -> Result<usize, DataplaneError> {
        self.read(|t| self.book.write_snapshot(t, out))
    }

    /// Entries per configured VNet, hosts and memory (both copies).
    pub(crate) fn stats(&self) -> RouteStats {
        self.read(|t| self.book.stats(t, 2))
    }

    /// Entries of `family` (tests).
    #[cfg(test)]
    pub(crate) fn len_of(&self, family: Family) -> usize {
        self.read(|t| t.len_of(family))
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod agree;
