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
//! lookup grows little once the table leaves the CPU caches. The prefetch is
//! `_mm_prefetch` on x86-64 (one `unsafe` call, see `prefetch.rs`) and nothing elsewhere.
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
//! - Hosts: 4096 hosts cost about 200 KiB in all, 0.01 byte per entry at 16 M.
//!
//! Measured at 16 M entries pointing at 4096 hosts, all included: **15.1 bytes per IPv4
//! entry** (230 MiB) and **30.1 bytes per IPv6 entry** (459 MiB), load factor 0.85; std's
//! `HashMap<Key, Value>` 102.8 bytes (1568 MiB).
//!
//! # Measured
//!
//! `cargo run -p protego-overlay --release --example table_bench` on this project's machine
//! (2-core AMD EPYC, Zen 5 family, KVM, 32 MiB L3, 4 KiB pages, shared with other builds so
//! figures vary by a third between runs; the ranges below are of three runs, load average
//! 1.7 to 2.8). Lookups per second on one core, destinations uniformly random over all
//! entries, 64 VNets, 4096 hosts:
//!
//! | entries | family | single | batch 32 | batch 64 | HashMap+Fx | HashMap+Sip | load |
//! |---|---|---|---|---|---|---|---|
//! | 1 | IPv4 | 200–320 M | 118–150 M | 150–164 M | 290–430 M | 66–80 M | 0 |
//! | 1 M | IPv4 | 30–50 M | 64–69 M | 59–65 M | 27–34 M | 8.5–10.5 M | 0.1 s |
//! | 16 M | IPv4 | 11–15 M | 33–44 M | 38–54 M | 13.5–17 M | 3.9–5.7 M | 2.5–3.4 s |
//! | 1 | IPv6 | 156–170 M | 116–123 M | 115–125 M | 328–350 M | 70 M | 0 |
//! | 1 M | IPv6 | 11–13 M | 44 M | 45 M | 3.1–3.6 M | 5.4–6.6 M | 0.2–0.3 s |
//! | 16 M | IPv6 | 7.7–9 M | 26–33 M | 35–39 M | 8.7–11 M | 2.1–2.2 M | 3.9–5.7 s |
//!
//! At 16 M entries batches of 64 reach the issue's 30 M lookups/s per core in both families
//! and are 3 to 4 times as fast as single lookups and as hashbrown; hashbrown with FxHash
//! degrades badly on IPv6 keys whose high bits are all alike. The 1-entry table is faster
//! unbatched (the batch's bookkeeping costs about 3 ns a key when there is no miss to hide),
//! so the cost of size for a batched caller is about 6.5 ns per lookup at 1 entry against
//! 19–26 ns at 16 M. A bulk load of 16 M entries takes 2.5–5.7 s (budget: 30 s), and parsing a
//! CSV route file runs at about 11 M lines/s (1.5 s for 16 M lines). With transparent huge
//! pages for the table (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, as this machine's THP is
//! `madvise`), the 16 M IPv4 batched rate rose about 10 %.

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
