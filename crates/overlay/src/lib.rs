//! The provider edge's overlay table (issue 16, §2): exact-match entries
//! (tenant's VNet, VM address) -> (host VTEP, VNI) for up to 16 M VMs and more, looked up in
//! batches with software prefetching; and the parser of the route files that fill it
//! ([`routes`]).
//!
//! Pure: no I/O, no clock, no threads, no randomness (the hash seed is an argument). Changes
//! take `&mut self`; how the data path publishes a changed table to workers that forward
//! meanwhile is its business (see "Memory" for why two copies are affordable).
//!
//! # Using it
//!
//! ```
//! use std::net::{IpAddr, Ipv4Addr};
//! use overlay::{Key, OverlayTable, Vni, VnetId};
//!
//! let mut table = OverlayTable::new();
//! let (acme_prod, globex_main) = (VnetId(0), VnetId(1));
//! table.set_vnet(acme_prod, Vni::new(100).expect("24 bits"))?;
//! table.set_vnet(globex_main, Vni::new(200).expect("24 bits"))?;
//! let vm = Ipv4Addr::new(10, 2, 0, 7); // the same address in both tenants' plans
//! table.insert(Key::new(acme_prod, vm), IpAddr::from([192, 0, 2, 10]))?;
//! table.insert(Key::new(globex_main, vm), IpAddr::from([192, 0, 2, 20]))?;
//!
//! let keys = [Key::new(acme_prod, vm), Key::new(globex_main, vm)];
//! let mut out = [None; 2];
//! table.get_batch(&keys, &mut out)?;
//! assert_eq!(out[1].map(|v| (v.host, v.vni.get())), Some((IpAddr::from([192, 0, 2, 20]), 200)));
//! # Ok::<(), overlay::OverlayError>(())
//! ```
//!
//! # Keys and values
//!
//! A [`Key`] is a [`VnetId`] and a VM address, IPv4 or IPv6. The control plane numbers every
//! configured (tenant, VNet name) pair, as it numbers tunnels ([`ids::TunnelId`]); the number
//! stands for the tenant too, so two VNets with identical address plans, of one tenant or of
//! two, never share an entry. The route file names tenant and VNet; [`resolve_routes`] turns the
//! names into numbers through the caller's configuration.
//!
//! A lookup returns a [`Value`]: the host VTEP's address and the VNet's [`Vni`] (the type
//! `wire::vxlan::Vni` the VXLAN encoder takes), everything the data path needs to build the
//! outer headers. The entry itself stores neither: it stores a 4-byte index into a side table
//! of host addresses, interned with reference counts, and the VNI is read from a per-VNet
//! array ([`OverlayTable::set_vnet`]). The VNI belongs to the VNet's configuration (the route
//! file does not carry it): kept once per VNet it costs nothing per entry, a VNet's VNI changes
//! in one write, and the array (4 bytes per VNet) stays in the L1 cache.
//!
//! # Layout
//!
//! One bucketized cuckoo hash table per address family. Every key has two candidate buckets,
//! chosen by the two halves of a 64-bit hash (MurmurHash3's finalizer over the packed key,
//! with the VNet mixed in its own round for IPv6) mapped onto the bucket count by
//! multiply-shift, so any bucket count works and a reservation sizes the table exactly. A
//! bucket is one 64-byte cache line (IPv4) or two adjacent ones (IPv6), keys and values
//! inline:
//!
//! ```text
//! IPv4 bucket, 64 bytes              IPv6 bucket, 128 bytes
//! +---------------------------+      +--------------------------------+
//! | key 0: vnet u32 | addr u32|      | key 0: vnet u32 | addr 4 x u32 |  5 x 20 bytes
//! | ... 5 keys, 40 bytes      |      | ...                            |
//! | host index 0..4, 20 bytes |      | host index 0..4, 20 bytes      |
//! | overflow count u32        |      | overflow count u32 (+4 pad)    |
//! +---------------------------+      +--------------------------------+
//! ```
//!
//! A free slot has host index `u32::MAX`. The overflow count of a bucket counts the entries
//! whose first bucket it is but that live in their second (the Cuckoo++ idea, as a counter
//! rather than a Bloom filter because with five slots the count fits in the line's last
//! word): a lookup reads the first bucket and stops there when it holds the key or when the
//! count is zero, so most hits and most misses cost one memory access. An insert takes a free
//! slot of the first bucket, else of the second, else moves entries along the shortest path
//! of moves a breadth-first search finds (at most 256 buckets visited). When the load factor
//! would pass 0.95, or no path exists, the table is rebuilt with at least twice the buckets:
//! amortized constant time per insert, never quadratic. [`OverlayTable::reserve`] and
//! [`OverlayTable::load`] size for a load factor of 0.85, where 15 % of the entries live in
//! their second bucket.
//!
//! # Batched lookups
//!
//! [`OverlayTable::get_batch`] works on up to [`BATCH`] (64) keys at a time: it hashes all of
//! them and prefetches their first buckets, then reads those buckets in order (by then mostly
//! in the cache), prefetching the second bucket of the keys that need it, then reads those.
//! The memory accesses of a batch overlap instead of following one another, so the cost per
//! lookup grows little once the table leaves the CPU caches. Measured alternatives: groups of
//! 16 reached 33 M/s with 16 M IPv4 entries against 38–55 M/s for 64, and 128 no more than
//! 64; a rolling window (prefetching the key 24 places ahead, reading second buckets 12 keys
//! after their prefetch) was within the noise of groups of 64, so the simpler groups stay.
//! The prefetch is `_mm_prefetch` on x86-64 (one `unsafe` call, see `prefetch.rs`) and
//! nothing elsewhere. The bucket arrays are advised for transparent huge pages on Linux
//! (`madvise(MADV_HUGEPAGE)` before they are first written, `huge.rs`): at 16 M entries the
//! gateway's CPU per packet fell by about 50 ns (17 %) with them on the project's machine
//! (docs/performance.md, "At saturation").
//!
//! # Why not a crate
//!
//! std's `HashMap` (hashbrown) has no prefetch or batched lookup and no access to bucket
//! addresses, and stores whole keys and values (48 bytes for `(Key, Value)`, 103 bytes per
//! entry at 16 M with its power-of-two sizing and 7/8 load). The one crate found with a
//! prefetch hint (kevy-map, part of a single application) is a generic SwissTable with
//! variable probe lengths, not a layout that answers in one cache line with the compact
//! entries the memory budget needs. DPDK's rte_hash and Cuckoo++ are C. The table is about 900
//! lines, the layout is the point, and the tests check it against a `HashMap` model.
//!
//! # Memory
//!
//! [`OverlayTable::memory_bytes`] adds up capacities, not lengths: bucket arrays, host table
//! (addresses, counts, free list, and the index map as hashbrown sizes it) and VNI array.
//! Per entry, at load factor α:
//!
//! - IPv4: 64 bytes / 5 slots = 12.8 bytes per slot, so 12.8 / α bytes per entry: 15.1 at
//!   α = 0.85 (after a reserved load), 13.5 at 0.95 (just before growing), 26.9 just after a
//!   doubling (α = 0.475), the worst case. Within the budget of 48 at every load, and two
//!   copies of a reserved table (30 bytes per entry) are too.
//! - IPv6: 128 / 5 = 25.6 bytes per slot: 30.1 at α = 0.85, 27 at 0.95, 54 just after a
//!   doubling (a reservation avoids that).
//! - Hosts: 4096 hosts cost 284 KiB in all, 0.02 byte per entry at 16 M.
//!
//! Measured at 16 M entries pointing at 4096 hosts, all included: **15.1 bytes per IPv4
//! entry** (230 MiB) and **30.1 bytes per IPv6 entry** (459 MiB), load factor 0.85; std's
//! `HashMap<Key, Value>` 102.8 bytes (1568 MiB).
//!
//! # Measured
//!
//! `cargo run -p protego-overlay --release --example table_bench` on this project's machine
//! (2-core AMD EPYC, Zen 5 family, KVM, 32 MiB L3, 4 KiB pages), one run at load average 2.4
//! (the machine is shared with other builds; figures vary by up to a third between runs).
//! Millions of lookups per second on one core, destinations uniformly random over all
//! entries, 64 VNets, 4096 hosts; bytes per entry all included; load: bulk load reserved
//! from the size hint.
//!
//! | family | entries | single | batch 32 | batch 64 | HashMap+Fx | HashMap+Sip | B/entry (hashbrown) | load |
//! |---|---|---|---|---|---|---|---|---|
//! | IPv4 | 1 | 331 | 178 | 189 | 416 | 73 | - | 0 |
//! | IPv4 | 1 M | 44 | 58 | 61 | 34 | 10.2 | 15.4 (102.8) | 0.07 s |
//! | IPv4 | 16 M | 15.4 | 39.9 | 46.7 | 14.9 | 4.9 | 15.1 (102.8) | 2.8 s |
//! | IPv6 | 1 | 154 | 120 | 111 | 349 | 68 | - | 0 |
//! | IPv6 | 1 M | 11.5 | 38 | 40 | 3.0 | 6.2 | 30.4 (102.8) | 0.21 s |
//! | IPv6 | 16 M | 8.0 | 31.1 | 35.7 | 10.3 | 2.1 | 30.1 (102.8) | 4.8 s |
//!
//! Over six runs at 16 M entries, batches of 64 gave 38–55 M/s for IPv4 and 28–39 M/s for
//! IPv6 (single lookups 11–16 and 7–9, hashbrown with FxHash 13–18 and 9–12); with
//! transparent huge pages for the table (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, as this
//! machine's THP is `madvise`) 53 and 44 M/s. So the issue's 30 M lookups/s per core at 16 M
//! entries is met for IPv4 with room, and for IPv6 in most runs; batches are 3 to 4 times as
//! fast as single lookups and as hashbrown, which with FxHash also degrades badly on IPv6 keys
//! whose high bits are all alike. The 1-entry table is faster unbatched (the batch's
//! bookkeeping costs about 2–3 ns a key when there is no miss to hide); for a batched caller
//! the cost of size is about 5 ns per lookup at 1 entry against about 21 ns at 16 M. A bulk
//! load of 16 M entries takes 2.4–5.7 s (budget: 30 s; 4–8 s without a reservation, growing by
//! doubling), and parsing a CSV route file runs at about 11.6 M lines/s (1.4 s for 16 M
//! lines).

mod cuckoo;
mod hosts;
mod huge;
mod key;
pub mod routes;
pub mod snapshot;
mod table;
pub mod workload;

#[cfg(test)]
mod tests;

pub use key::{Key, Value, VnetId};
pub use routes::{parse_routes, resolve_routes, Field, Problem, RouteFileError, RouteLine};
pub use snapshot::{read_snapshot, write_snapshot, Snapshot, SnapshotEntry, SnapshotError};
pub use table::{Family, Memory, OverlayError, OverlayTable, BATCH, MAX_VNETS};
pub use wire::vxlan::Vni;
