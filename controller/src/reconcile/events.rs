//! Publishes Kubernetes Events on Nodes and NodeIPAMConfigs off the allocation loop, so a slow
//! events API never delays an allocation. Events are best effort: a failure is logged.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::mpsc;
use tracing::debug;

use super::MANAGER;

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

pub async fn run(
    client: Client,
    instance: Option<String>,
    mut notes: mpsc::UnboundedReceiver<Note>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: MANAGER.into(),
            instance,
        },
    );
    while let Some(note) = notes.recv().await {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.into(),
            // The events API caps the note at 1 kB.
            note: Some(truncate(&note.message, 1000)),
            action: note.action.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &note.regarding).await {
            debug!(error = %e, reason = note.reason, "publishing an event failed");
        }
    }
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
