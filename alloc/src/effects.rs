//! What the allocation core asks the world to do, and the answers it gets back: podCIDR writes
//! and their results, config writes, events. Plain data: the API side carries them out.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use nodeipam_crd::{
    Allocation, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec, NodeIPAMConfigStatus,
};

use crate::pool::{AWAITING_ENABLE, POOL_LABEL};

use super::outcome::WriteOutcome;
use crate::seal::Fence;

/// One podCIDR write, as the allocation loop asks for it.
#[derive(Clone, Debug)]
pub struct WriteJob {
    pub node: String,
    pub uid: Option<String>,
    /// The Node's seal as last read: the write lands only while it stands (see
    /// docs/single-writer.md, step 2a).
    pub fence: Fence,
    /// The node's labels when its blocks were chosen, to choose again if this write is given up.
    pub labels: BTreeMap<String, String>,
    pub config: String,
    pub cidrs: Vec<IpNet>,
    pub ticket: u64,
    pub attempt: u32,
    /// How many attempts for these blocks the API server refused outright.
    pub rejections: u32,
    /// An earlier attempt for these blocks had an ambiguous outcome.
    pub was_ambiguous: bool,
}

impl WriteJob {
    /// The write as a JSON patch: the UID and the fence tested first, so that it lands only on
    /// the object it was chosen for and only while no seal has moved since it was read
    /// (docs/single-writer.md, step 2a); then our annotation naming the config, and the
    /// podCIDRs. Nothing else is tested: a kubelet's status update or another controller's
    /// label never fails it.
    pub fn patch(&self, config_annotation: &str) -> serde_json::Value {
        use serde_json::json;
        let mut ops = Vec::new();
        if let Some(uid) = &self.uid {
            ops.push(json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
        }
        ops.extend(
            self.fence
                .test_then_annotate(config_annotation, &self.config),
        );
        let cidrs: Vec<String> = self.cidrs.iter().map(ToString::to_string).collect();
        ops.push(json!({ "op": "add", "path": "/spec/podCIDR", "value": cidrs.first() }));
        ops.push(json!({ "op": "add", "path": "/spec/podCIDRs", "value": cidrs }));
        serde_json::Value::Array(ops)
    }
}

#[derive(Clone, Debug)]
pub struct WriteResult {
    pub job: WriteJob,
    pub outcome: WriteOutcome,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ConfigJob {
    /// Only to the object `uid`, the one it was computed for.
    Status {
        name: String,
        uid: Option<String>,
        status: NodeIPAMConfigStatus,
    },
    AddFinalizer {
        name: String,
    },
    /// Only from the object `uid`, the one found drained: never from a config re-created
    /// under the same name meanwhile.
    RemoveFinalizer {
        name: String,
        uid: Option<String>,
    },
}

impl ConfigJob {
    /// One pending job per config and kind: a newer status replaces an older one.
    pub fn key(&self) -> (String, u8) {
        match self {
            ConfigJob::Status { name, .. } => (name.clone(), 0),
            ConfigJob::AddFinalizer { name } | ConfigJob::RemoveFinalizer { name, .. } => {
                (name.clone(), 1)
            }
        }
    }
}

/// A child config a pool asks for: the driver creates a NodeIPAMConfig of this name with the
/// pool label and a controller ownerReference to the pool `pool_uid`, and answers with
/// `Input::ConfigCreated`. The name is deterministic, so a retry or a new leader gets
/// AlreadyExists instead of making a second child for one range.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildConfig {
    pub pool: String,
    pub pool_uid: Option<String>,
    pub name: String,
    /// `(range, per-node mask)` per family.
    pub ipv4: Option<(IpNet, u8)>,
    pub ipv6: Option<(IpNet, u8)>,
    pub selector: Option<NodeSelector>,
}

impl ChildConfig {
    /// The NodeIPAMConfig to create: the pool's label, and the pool as its controller owner
    /// (so deleting the pool deletes its children, which then drain behind our finalizer).
    /// Created `Disabled` and marked [`AWAITING_ENABLE`]: a create cannot carry a
    /// precondition, so one that lands late (after the pool carved elsewhere, or after a
    /// successor carved up to max) must serve nothing until a leader that counts it enables
    /// it ([`EnableChild`]; docs/single-writer.md, "Every write").
    pub fn object(&self) -> NodeIPAMConfig {
        let family = |f: Option<(IpNet, u8)>| {
            f.map(|(cidr, mask)| FamilySpec {
                cidr: cidr.to_string(),
                per_node_mask_size: mask,
            })
        };
        let spec = NodeIPAMConfigSpec {
            ipv4: family(self.ipv4),
            ipv6: family(self.ipv6),
            node_selector: self.selector.clone(),
            allocation: Allocation::Disabled,
        };
        let mut obj = NodeIPAMConfig::new(&self.name, spec);
        obj.metadata = ObjectMeta {
            name: Some(self.name.clone()),
            labels: Some(BTreeMap::from([(
                POOL_LABEL.to_string(),
                self.pool.clone(),
            )])),
            annotations: Some(BTreeMap::from([(
                AWAITING_ENABLE.to_string(),
                "true".to_string(),
            )])),
            owner_references: self.pool_uid.as_ref().map(|uid| {
                vec![OwnerReference {
                    api_version: "nodeipam.io/v1alpha1".into(),
                    kind: "NodeIPAMPool".into(),
                    name: self.pool.clone(),
                    uid: uid.clone(),
                    controller: Some(true),
                    // Foreground deletion needs no wait on children: they drain on their own.
                    block_owner_deletion: None,
                }]
            }),
            // Created held: the range is ours to drain from its first moment, and no
            // finalizer write has to come before its first block.
            finalizers: Some(vec![nodeipam_crd::FINALIZER.to_string()]),
            ..ObjectMeta::default()
        };
        obj
    }
}

/// A pool's child created disabled and awaiting its enabling ([`AWAITING_ENABLE`]), to be
/// enabled: only the object `uid`, and only at `resource_version`, the version the decision
/// saw it at (`fence::enable_patch`). Answered with `Input::ConfigEnabled`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EnableChild {
    pub pool: String,
    pub name: String,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

/// How an enable of a child config went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EnableOutcome {
    Enabled,
    /// Refused by its precondition (409/422) or gone (404): someone moved it since it was
    /// read; the pool decides again from the watch.
    Moved(String),
    /// Refused otherwise, or unanswered (it may still land: the child counts toward the
    /// pool's max while it awaits, so that changes nothing); decided again.
    Failed(String),
}

/// How a create of a child config went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CreateOutcome {
    Created,
    /// An object of that name exists: a retry of our own, or another leader's.
    AlreadyExists,
    /// Refused or unanswered: the next decision carves again (under the same name).
    Failed(String),
}

/// How a delete of a child config (with the UID precondition) went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    Deleted,
    /// Not there, or another object under the name (the precondition failed).
    Gone,
    Failed(String),
}

/// Reasons on Nodes, named like kube-controller-manager's where the meaning is the same.
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
pub const UNMANAGED_POD_CIDR: &str = "UnmanagedPodCIDR";
pub const OVERLAPPING_POD_CIDR: &str = "OverlappingPodCIDR";
pub const INVALID_POD_CIDR: &str = "InvalidPodCIDR";
/// Reasons on NodeIPAMConfigs.
pub const DRAINED: &str = "Drained";
pub const EXHAUSTED: &str = "Exhausted";
/// Reasons on NodeIPAMPools.
pub const RANGE_CARVED: &str = "RangeCarved";
pub const RANGE_RETIRED: &str = "RangeRetired";
pub const POOL_EXHAUSTED: &str = "PoolExhausted";
pub const RANGE_CARVE_FAILED: &str = "RangeCarveFailed";

#[derive(Clone, Debug)]
pub struct Note {
    pub regarding: ObjectReference,
    pub warning: bool,
    pub reason: &'static str,
    pub action: &'static str,
    pub message: String,
}

impl Note {
    pub fn node(
        name: &str,
        uid: Option<&str>,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> Self {
        Self::about(
            ("v1", "Node", "AllocatePodCIDR"),
            name,
            uid,
            warning,
            reason,
            message,
        )
    }

    pub fn config(
        name: &str,
        uid: Option<&str>,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> Self {
        Self::about(
            ("nodeipam.io/v1alpha1", "NodeIPAMConfig", "Reconcile"),
            name,
            uid,
            warning,
            reason,
            message,
        )
    }

    pub fn pool(
        name: &str,
        uid: Option<&str>,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> Self {
        Self::about(
            ("nodeipam.io/v1alpha1", "NodeIPAMPool", "Scale"),
            name,
            uid,
            warning,
            reason,
            message,
        )
    }

    /// `(apiVersion, kind, action)` name the object and what the controller was doing.
    fn about(
        (api_version, kind, action): (&str, &str, &'static str),
        name: &str,
        uid: Option<&str>,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> Self {
        Note {
            regarding: ObjectReference {
                api_version: Some(api_version.into()),
                kind: Some(kind.into()),
                name: Some(name.into()),
                uid: uid.map(str::to_string),
                ..ObjectReference::default()
            },
            warning,
            reason,
            action,
            message,
        }
    }
}
