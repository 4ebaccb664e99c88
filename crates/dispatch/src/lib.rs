//! Self-dispatch on the VNet side without a dispatcher (issue 19 §1 and §3; the clustering
//! paper, `../shared/papers/ipsec-vpn-clustering-redistribution.md`, Algorithms 1, 4 and 5),
//! as pure state with no I/O, so that a simulation can drive it with a virtual clock.
//!
//! - [`VmacSpace`]: a VNet's `K` virtual MACs (Algorithm 1, step 1) and the hash `h` from a
//!   VM's MAC to one of them (step 2). Every data node computes the same `h`, so the node that
//!   owns `h(m)` is the one that answers the ARP request of the VM whose MAC is `m`
//!   (Algorithm 4) and processes the frames it then sends to that virtual MAC (Algorithm 2).
//! - [`partition`]: the initial equal partition of the virtual MACs among the data nodes
//!   (Algorithm 1, step 3).
//! - [`Node`]: one data node's side of flow migration along the ring of data nodes
//!   (Algorithm 5): its load reported to its predecessor every `T_L`, and every `T_M`, when
//!   its load exceeds its successor's by more than `L_D`, a set `W` of its virtual MACs offered
//!   to the successor, which takes them and acknowledges (the first decision comes one `T_L`
//!   after the start, on the successor's first report: `T_M` is the time a move needs to
//!   show in the loads, and before the first one there is nothing to wait for; a decision
//!   always waits for a report newer than the last). The node that gave a virtual MAC
//!   away forwards the frames still arriving for it to the new owner until the hosts have
//!   learnt where it went (the paper relies on the switch alone and loses what arrives in
//!   between). What the node must do on the wire comes out as [`Action`]s; what it hears
//!   from the other nodes goes in as [`Msg`]s.
//!
//! - [`Agent`]: a [`Node`] fed with what a data path measures (its load, each virtual MAC's
//!   frame count) and turned into the owner of every virtual MAC as the node knows it, for
//!   the data path's table.
//!
//! How `W` is chosen: the paper picks it at random. A node that knows each of its virtual
//! MACs' load ([`Node::set_load`]) picks instead at most `|W|` whose loads add up as close to
//! half the difference as they can (moving that much leaves the two nodes level): with a few
//! heavy VMs, a random `W` of 4 out of 256 seldom holds one of them, and light ones move the
//! load a few tenths of a per cent per `T_M`.
//!
//! Where the ring settles: a node hands over only while it exceeds its successor by more than
//! `L_D`, so the ring may rest with each node up to `L_D` above the next: with `N` nodes the
//! highest load may stay about `L_D · (N − 1) / 2` above the mean (with the paper's 10 % and
//! three nodes at 60 % load, a max/mean of 1.17), plus the load of one virtual MAC (a heavy
//! VM's cannot be split). A tighter balance needs a smaller `L_D`.

mod agent;
mod ring;
mod vmac;

pub use agent::Agent;
pub use ring::{Action, Move, Msg, Node, NodeId, Params};
pub use vmac::{partition, VmacSpace, MAX_VMACS};

/// Errors of the dispatch state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// A VNI outside the 24 bits VXLAN gives it.
    #[error("VNI {vni} is not a 24-bit number")]
    Vni {
        /// The VNI.
        vni: u32,
    },
    /// A number of virtual MACs outside `1..=MAX_VMACS`.
    #[error("{k} virtual MACs: a VNet has between 1 and {MAX_VMACS}")]
    Count {
        /// The number asked for.
        k: u32,
    },
    /// Parameters that cannot run the ring.
    #[error("{what}")]
    Params {
        /// What is wrong.
        what: String,
    },
}

#[cfg(test)]
mod sim_tests;
