//! What the machine is told and what it asks for: the options it starts with, the time, the
//! inputs (watch events, answers, ticks) and the effects (writes, jobs, publications, notes,
//! metrics).

use std::time::Duration;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube_core::DynamicObject;
use nodeipam_crd::{NodeIPAMConfig, NodeIPAMConfigStatus};

use crate::effects::{
    ChildConfig, ConfigJob, CreateOutcome, DeleteOutcome, EnableChild, EnableOutcome, Note,
    WriteJob, WriteResult,
};
use crate::node::IpamNode;
use crate::outcome::NodeNow;
use crate::podnetwork::{OutputRef, PodNetwork};
use crate::pool::{PoolInput, PoolStatus};

use super::revisions::{Revisions, WentBack};

/// What a machine is told once, when it starts.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Service CIDRs from the `--service-cidr` flag, for clusters without ServiceCIDR objects.
    pub service_cidrs: Vec<IpNet>,
    /// Whether the API serves ServiceCIDR objects: then their list is awaited before allocating.
    pub service_cidr_api: bool,
    /// Whether NodeIPAMPools are watched: then their list is awaited too.
    pub pools: bool,
    /// How many refused writes of the same blocks before we give up on them.
    pub write_attempts: u32,
    /// How long a node whose write we gave up on waits before it is tried again from scratch.
    pub retry_rejected_after: Duration,
    /// The consumer outputs of the pod network; a range is allocated from only once every one
    /// of them holds it.
    pub outputs: Vec<OutputRef>,
    /// Added to ip-masq-agent's `nonMasqueradeCIDRs`.
    pub extra_non_masquerade: Vec<IpNet>,
    /// A test fault: the machine panics when it sees a Node of this name.
    pub panic_on_node: Option<String>,
    /// The resourceVersions earlier terms of this process saw (`Machine::take_revisions`):
    /// a relist older than them stops allocation (storage went back in time).
    pub revisions: Revisions,
}

/// The time, as the driver's clocks tell it: monotonic since the machine started, and the wall
/// clock in whole seconds (what conditions carry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    pub mono: Duration,
    pub wall_seconds: i64,
}

/// One event of a watch: a (re)list is `ListStart`, one `Listed` per object, `ListDone`.
#[derive(Clone, Debug)]
pub enum Watch<T> {
    ListStart,
    Listed(T),
    ListDone,
    Applied(T),
    Deleted(T),
}

/// Every fact the world can tell the machine.
// Each input is moved once into `handle`; boxing would only add allocations.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum Input {
    Node(Watch<IpamNode>),
    Config(Watch<NodeIPAMConfig>),
    Service(Watch<ServiceCIDR>),
    /// NodeIPAMPools, as the driver maps them.
    Pool(Watch<PoolInput>),
    /// The answer to `Effect::CreateConfig`.
    ConfigCreated {
        config: ChildConfig,
        outcome: CreateOutcome,
    },
    /// The answer to `Effect::EnableConfig`.
    ConfigEnabled {
        child: EnableChild,
        outcome: EnableOutcome,
    },
    /// The answer to `Effect::DeleteConfig`.
    ConfigDeleted {
        name: String,
        uid: Option<String>,
        outcome: DeleteOutcome,
    },
    /// An output's objects (a ConfigMap, a typed object, or every IPPool of ours), by its
    /// index in `Options::outputs`.
    Output(usize, Watch<DynamicObject>),
    /// An output's watch cannot list (its CRD is not installed, RBAC forbids it): it holds
    /// nothing, and the ranges waiting for it say why.
    OutputFailed(usize, String),
    /// The answer to `Effect::Reread`.
    Reread {
        node: String,
        uid: Option<String>,
        now: NodeNow,
    },
    /// The outcome of an `Effect::Write`.
    Written(WriteResult),
    /// An `Effect::Config` job is done: written, or moot because its config is gone.
    ConfigWritten(ConfigJob),
    /// An `Effect::Publish` is written to every output. The publisher writes one network
    /// at a time and may skip one a newer network replaced.
    Published(PodNetwork),
    /// The publisher's attempt at the newest network failed (the output and the error); it
    /// retries by itself. The ranges waiting for an output say why until a network is written.
    PublishFailed(String),
    /// Periodic: coalesced status, publication, parked nodes whose time came.
    Tick,
    /// Rarely: every pending node is tried again.
    Resync,
}

/// Every action the machine asks for.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Write podCIDRs (with the Node's UID as a precondition) and answer with `Input::Written`.
    Write(WriteJob),
    Config(ConfigJob),
    /// Write the pod network to every output.
    Publish(PodNetwork),
    Note(Note),
    /// GET the node and answer with `Input::Reread`: it was missing from a relist.
    Reread {
        node: String,
        uid: Option<String>,
    },
    Metric(Metric),
    /// Create a pool's child config; answer with `Input::ConfigCreated`.
    CreateConfig(ChildConfig),
    /// Enable a pool's child created disabled (only the object `uid`, at the version the
    /// decision saw); answer with `Input::ConfigEnabled`.
    EnableConfig(EnableChild),
    /// Delete a pool's empty child config, only the object `uid`; answer with
    /// `Input::ConfigDeleted`.
    DeleteConfig {
        name: String,
        uid: Option<String>,
        /// Retired because its pool is over max: deleted only while it still awaits its
        /// enable as read just before (never a child enabled since, by us or by hand).
        only_awaiting: bool,
    },
    /// Write a pool's status, only to the object `uid`.
    PoolStatus {
        name: String,
        uid: Option<String>,
        status: PoolStatus,
    },
}

/// A metric change; ranges are the config ranges the blocks came from.
#[derive(Clone, Debug, PartialEq)]
pub enum Metric {
    Allocated(IpNet),
    Released(IpNet),
    /// Blocks leaked now (kept occupied after an ambiguous write): up when a write is given
    /// up, down when a leak ends.
    Leaked(u64),
    AssignmentFailure,
    Error(&'static str),
    Usage {
        range: IpNet,
        ratio: f64,
    },
    Blocks {
        config: String,
        family: &'static str,
        allocated: u64,
        capacity: u64,
    },
    Pending(usize),
    Unmanaged(usize),
    /// kcm's max gauge: the blocks in a range.
    Capacity {
        range: IpNet,
        blocks: u64,
    },
    /// The status the machine computed for a config (its condition and draining gauges).
    Status {
        config: String,
        status: NodeIPAMConfigStatus,
    },
    /// A config is gone: drop its series.
    ConfigGone(String),
    /// The ranges a pool has (its active children).
    PoolRanges {
        pool: String,
        ranges: u64,
    },
    RangeCarved {
        pool: String,
    },
    RangeRetired {
        pool: String,
    },
    /// From a pool's decision to carve (its headroom breached) to the new range accepting
    /// allocations (its gates open: finalizer on, published).
    ScaleUpSeconds {
        pool: String,
        seconds: f64,
    },
    /// A pool is gone: drop its series.
    PoolGone(String),
    /// A relist showed an object older than it was seen: storage went back in time, and
    /// nothing is allocated any more.
    StorageWentBack(WentBack),
}
