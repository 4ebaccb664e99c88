//! Node providers: how the autoscaler (`[cluster.autoscale] mode = "act"`) starts and stops
//! data nodes — the paper's shut-down → inactive transition (§5.2) and back.
//!
//! A provider manages a fixed set of data nodes, each known by its name (its certificate's
//! CN, the name it registers with). It only runs and stops them: whether a running node has
//! registered, and whether it is active or held in reserve, is the cluster's knowledge. The
//! autoscaler maps what the provider reports onto the model's node states:
//!
//! | provider says                         | node registered and alive | model state          |
//! |---------------------------------------|---------------------------|----------------------|
//! | [`ProvidedState::Running`]            | yes                       | active or inactive   |
//! | [`ProvidedState::Running`]            | no                        | starting             |
//! | [`ProvidedState::Stopping`]           | either                    | shut down            |
//! | [`ProvidedState::Stopped`], `Failed`  | no                        | shut down            |
//!
//! Inactive nodes are kept warm: their process runs, they are registered and hold every VNet
//! and steering table, and the cluster merely places no tunnel on them (it *parks* them), so
//! activation is instant.
//!
//! Data nodes must outlive the control node that started them (they carry the tenants'
//! traffic through a control takeover), so a provider never stops its nodes when the control
//! node exits, and a new active control node's provider adopts the nodes that run.
//!
//! Writing another provider (e.g. Kubernetes: a node is a pod of a StatefulSet, `start`
//! scales it up or creates the pod, `stop` deletes it) means implementing [`NodeProvider`]:
//!
//! - `nodes` is called every autoscaler step and must not block for long (seconds at most);
//!   it reports every node the provider manages, in a stable order.
//! - `start` and `stop` return once the request is made, not when the node is up or gone;
//!   the next `nodes` reports the progress. Both are idempotent: starting a running node or
//!   stopping a stopped one succeeds and changes nothing.
//! - Errors name the node and what failed; the autoscaler logs them and retries at its next
//!   step if the model still asks.

use std::time::Instant;

/// Where a provider's node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProvidedState {
    /// Not running.
    Stopped,
    /// Running (not necessarily registered yet).
    Running {
        /// When this provider started it, if it did (`None`: adopted, found running).
        started_at: Option<Instant>,
    },
    /// Asked to stop and not gone yet.
    Stopping,
    /// It exited on its own or could not be started; the provider says why. It is started
    /// again only when asked.
    Failed {
        /// What happened (e.g. "exited with status 1").
        reason: String,
    },
}

/// One node a provider manages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvidedNode {
    /// Its name (the name it registers with).
    pub name: String,
    /// Where it is.
    pub state: ProvidedState,
}

/// A failed provider request.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider does not manage a node of that name.
    #[error("the node provider does not manage a node named {0:?}")]
    UnknownNode(String),
    /// The provider's own configuration is wrong.
    #[error("node provider configuration: {0}")]
    Config(String),
    /// Starting or stopping a node failed.
    #[error("cannot {action} data node {node:?}: {reason}")]
    Failed {
        /// "start" or "stop".
        action: &'static str,
        /// The node.
        node: String,
        /// What failed.
        reason: String,
    },
}

/// Starts and stops data nodes for the autoscaler (see the module documentation).
pub trait NodeProvider: Send + Sync {
    /// The provider's kind, as configured (e.g. `"local"`).
    fn kind(&self) -> &'static str;

    /// Every node it manages, in a stable order, with its state now.
    fn nodes(&self) -> Vec<ProvidedNode>;

    /// Starts node `name` (returns once the start is under way).
    fn start(&self, name: &str) -> Result<(), ProviderError>;

    /// Stops node `name` (returns once the stop is under way).
    fn stop(&self, name: &str) -> Result<(), ProviderError>;
}

pub mod local;
pub use local::LocalProvider;
