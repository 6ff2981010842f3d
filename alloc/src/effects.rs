//! What the allocation core asks the world to do, and the answers it gets back: podCIDR writes
//! and their results, config writes, events. Plain data: the API side carries them out.

use std::collections::BTreeMap;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ObjectReference;
use nodeipam_crd::NodeIPAMConfigStatus;

use super::outcome::WriteOutcome;

/// One podCIDR write, as the allocation loop asks for it.
#[derive(Clone, Debug)]
pub struct WriteJob {
    pub node: String,
    pub uid: Option<String>,
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

/// Reasons on Nodes, named like kube-controller-manager's where the meaning is the same.
pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
pub const UNMANAGED_POD_CIDR: &str = "UnmanagedPodCIDR";
pub const OVERLAPPING_POD_CIDR: &str = "OverlappingPodCIDR";
pub const INVALID_POD_CIDR: &str = "InvalidPodCIDR";
/// Reasons on NodeIPAMConfigs.
pub const DRAINED: &str = "Drained";
pub const EXHAUSTED: &str = "Exhausted";

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
