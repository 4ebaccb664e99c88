//! The provider edge's overlay table (issue 16, §2): exact-match entries
//! (tenant's VNet, VM address) -> (host VTEP, VNI) for up to 16 M VMs and more, looked up in
//! batches with software prefetching; and the parser of the route files that fill it.
//!
//! Pure: no I/O, no clock, no threads, no randomness (the hash seed is an argument).
//!
//! DOCS-TODO

mod cuckoo;
mod hosts;
mod key;
mod prefetch;
pub mod routes;
mod table;

#[cfg(test)]
mod tests;

pub use key::{Key, Value, VnetId};
pub use routes::{parse_routes, resolve_routes, Field, Problem, RouteFileError, RouteLine};
pub use table::{Family, Memory, OverlayError, OverlayTable, BATCH, MAX_VNETS};
pub use wire::vxlan::Vni;
