//! The per-VM overlay routes (issue 16 §2) without a data plane: what a data node and the
//! control node must do alike, so that a change the control node accepts is one every data
//! node accepts, and both hold the same table.
//!
//! - [`RouteBook`]: the configured VNets, numbered by (tenant, name) on first sight; checks a
//!   `datapath::RouteChange` whole against them (VNet configured, unicast addresses, host of
//!   its VTEP's address family; a route file's every line, errors naming line and field) and
//!   applies it as [`Op`]s through an [`Apply`]; writes the compact snapshot
//!   (`overlay::snapshot`) of a table.
//! - [`Routes`]: one copy of the table (the `overlay` cuckoo table, hosts per VNet, counts).
//! - [`RouteMaster`]: the control node's single copy, versioned ([`RouteVersion`]), with the
//!   single changes since the last snapshot kept for replay ([`Replay`]).
//!
//! The data plane (`dataplane::routes::RouteWriter`) publishes two copies of [`Routes`] to its
//! workers with `left-right`; this crate knows nothing of that: no threads, no sockets, no
//! clock. Why a crate of its own: `overlay` is the table and its file formats and knows no
//! `datapath::RouteChange` nor `DataplaneError`; `dataplane` has sockets and threads the
//! control node must not pull in; and the cluster crate, which holds the master, should not
//! reach into the data plane's internals.

mod book;
mod master;

pub use book::{Apply, Op, RouteBook, RouteVnet, Routes, Source};
pub use master::{Replay, RouteMaster, RouteVersion, KEEP_CHANGES};
