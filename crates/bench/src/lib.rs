//! `protego bench`: the data plane benchmark of issue 3.
//!
//! It drives a gateway under test — the real `protego up` process, or strongSwan 5.9 with
//! kernel-libipsec for comparison — with real ESP traffic (RFC 4303 in UDP, RFC 3948) in
//! network namespaces, and reports for each case the maximum delivered rate, the gateway's
//! own CPU time per packet and per byte, losses, the latency it adds at half the maximum
//! rate, and the share of the crypto-only limit of the machine it reaches.
//!
//! ```text
//!  load generator (this process)                gateway under test          load generator
//!  peer ns: IKEv2 (ike::Endpoint) + ESP  <──WAN──>  gw ns: protego up  <──underlay──> host ns:
//!  pre-sealed pools, sendmmsg + UDP GSO             (or charon)                 VXLAN VTEP,
//!  recvmmsg + UDP GRO, opens a sample                                           recvmmsg + GRO
//! ```
//!
//! - [`Options`] and [`matrix`] say what to measure; [`Session`] builds the test bed, runs
//!   it and returns a [`Report`] (the `--json` document), which [`render_text`] prints.
//! - The load generator negotiates every tunnel with the gateway through IKEv2 (Protego's own
//!   engine, PSK, forced UDP encapsulation) and seals its traffic with the negotiated keys.
//! - Benchmarks are programs: nothing here asserts a timing; the unit tests cover the pure
//!   parts (IMIX, percentiles, the case matrix, the JSON shape, CPU accounting, targets).

mod cpu;
mod crypto_only;
pub mod edge;
mod error;
pub mod failover;
pub mod fairness;
mod gateway;
mod ike_client;
mod imix;
mod load;
mod net;
mod options;
mod packet;
mod pool;
mod report;
mod rx;
mod scrape;
mod session;
pub mod site;
mod sock;
mod stats;
mod swan;
mod targets;

pub use crypto_only::CryptoFigure;
pub use error::{BenchError, Result};
pub use options::{
    matrix, parse_duration, parse_list, parse_load, parse_tunnels, strongswan_supports, Case,
    Cipher, Direction, GatewayKind, Group, Options, PacketSize, PeerMode, WorkerCount, MAX_PACKET,
    MIN_PACKET, STRONGSWAN_MAX_OUTBOUND,
};
pub use report::{
    load_header, load_row, render_text, table_header, table_row, CaseReport, Drops, LoadFigures,
    Machine, Report, RunSummary, Settings, Target, REPORT_VERSION,
};
pub use session::Session;
pub use stats::Percentiles;
