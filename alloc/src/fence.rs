//! The precondition each of our writes to an object other than a Node carries, decided from
//! what was read just before it: what makes a deposed leader's late write fail however late it
//! arrives (docs/single-writer.md, "Every write, and what fences it"). The publisher, the config
//! writer and the simulator all ask here, so a fence dropped here is dropped everywhere.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodeipam_crd::NodeIPAMConfigStatus;
use serde_json::{Value, json};

/// The annotation every published object carries: the process and session that wrote it last.
/// A successor's first publish writes each object once even when it agrees with its content,
/// so that the new signature moves the version a predecessor's late write was sent on.
pub const PUBLISHED_BY: &str = "nodeipam.io/published-by";

/// How one object of a publication is written, given it as read just before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Send {
    /// Nothing to write: it holds what we want and this session signed it already.
    Skip,
    /// Absent when read: a create, so one made since is refused (409), not written over.
    Create,
    /// Applied at the version read: refused (409) once anything wrote it since.
    At { resource_version: Option<String> },
}

/// What a publish of one object sends. `holds`: the object already has what we would write;
/// `by`: this session's signature.
pub fn send(read: Option<&ObjectMeta>, holds: bool, by: &str) -> Send {
    match read {
        None => Send::Create,
        Some(meta) if holds && signed_by(meta) == Some(by) => Send::Skip,
        Some(meta) => Send::At {
            resource_version: meta.resource_version.clone(),
        },
    }
}

/// Who last published an object, by its [`PUBLISHED_BY`] annotation.
pub fn signed_by(meta: &ObjectMeta) -> Option<&str> {
    meta.annotations
        .as_ref()?
        .get(PUBLISHED_BY)
        .map(String::as_str)
}

/// The preconditions of a delete of an object as listed, `(uid, resourceVersion)`: only that
/// object (not one created again under its name), and only while nothing wrote it since (a
/// successor that published it moved its version).
pub fn delete_at(listed: &ObjectMeta) -> (Option<String>, Option<String>) {
    (listed.uid.clone(), listed.resource_version.clone())
}

/// A config's status write as a JSON patch: a test of the UID (the object it was computed for)
/// and of `metadata.generation` against the status's `observedGeneration` (the spec it was
/// computed for), then the status. A Drained=True computed for a disabled config is refused
/// once the config was enabled again, however late it arrives.
pub fn status_patch(uid: Option<&str>, status: &NodeIPAMConfigStatus) -> Value {
    let mut ops = Vec::new();
    if let Some(uid) = uid {
        ops.push(json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
    }
    if let Some(generation) = status.observed_generation {
        ops.push(json!({ "op": "test", "path": "/metadata/generation", "value": generation }));
    }
    ops.push(json!({ "op": "add", "path": "/status", "value": status }));
    Value::Array(ops)
}

/// The tests that keep a JSON patch on the object as it was read: its resourceVersion (any
/// write since, by anyone, fails it: 422) and, when given, its UID (not an object created
/// again under the name). The config writer's finalizer edits and a pool child's enable carry
/// them.
pub fn at_version(uid: Option<&str>, resource_version: &str) -> Vec<Value> {
    let mut ops = vec![
        json!({ "op": "test", "path": "/metadata/resourceVersion", "value": resource_version }),
    ];
    if let Some(uid) = uid {
        ops.push(json!({ "op": "test", "path": "/metadata/uid", "value": uid }));
    }
    ops
}

/// A pool child's enable as a JSON patch: at the version read ([`at_version`]), the marker
/// [`nodeipam_crd::AWAITING_ENABLE`] tested and removed, and `spec.allocation` set `Enabled`.
/// A deposed leader's enable can therefore only land on the child exactly as it read it,
/// awaiting: a successor that read the same version counted it toward the pool's max, and
/// any write since (its retire, a successor's enable) refuses it.
pub fn enable_patch(uid: Option<&str>, resource_version: &str) -> Value {
    let marker = format!(
        "/metadata/annotations/{}",
        nodeipam_crd::AWAITING_ENABLE
            .replace('~', "~0")
            .replace('/', "~1")
    );
    let mut ops = at_version(uid, resource_version);
    ops.push(json!({ "op": "remove", "path": marker }));
    ops.push(json!({ "op": "replace", "path": "/spec/allocation", "value": "Enabled" }));
    Value::Array(ops)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(version: &str, by: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            resource_version: Some(version.into()),
            uid: Some("u1".into()),
            annotations: by.map(|b| [(PUBLISHED_BY.to_string(), b.to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn an_object_is_written_at_the_version_read_until_this_session_signed_it() {
        let at = |v: &str| Send::At {
            resource_version: Some(v.into()),
        };
        assert_eq!(send(None, false, "s2"), Send::Create);
        // A predecessor's object that agrees with us is still written once: that moves its
        // version past any late write the predecessor sent on it.
        assert_eq!(send(Some(&meta("7", Some("s1"))), true, "s2"), at("7"));
        assert_eq!(send(Some(&meta("7", None)), true, "s2"), at("7"));
        assert_eq!(send(Some(&meta("8", Some("s2"))), false, "s2"), at("8"));
        assert_eq!(send(Some(&meta("8", Some("s2"))), true, "s2"), Send::Skip);
    }

    #[test]
    fn an_enable_tests_the_version_read_and_takes_the_marker_off() {
        let ops = enable_patch(Some("u1"), "7");
        assert_eq!(
            ops[0],
            json!({ "op": "test", "path": "/metadata/resourceVersion", "value": "7" })
        );
        assert_eq!(ops[1]["path"], "/metadata/uid");
        assert_eq!(ops[2]["op"], "remove");
        assert_eq!(
            ops[2]["path"],
            "/metadata/annotations/nodeipam.io~1awaiting-enable"
        );
        assert_eq!(ops[3]["value"], "Enabled");
    }

    #[test]
    fn a_delete_carries_the_uid_and_version_listed() {
        assert_eq!(
            delete_at(&meta("9", None)),
            (Some("u1".into()), Some("9".into()))
        );
    }

    #[test]
    fn a_status_tests_the_uid_and_the_generation_it_was_computed_for() {
        let status = NodeIPAMConfigStatus {
            observed_generation: Some(3),
            ..NodeIPAMConfigStatus::default()
        };
        let ops = status_patch(Some("u1"), &status);
        assert_eq!(ops[0]["path"], "/metadata/uid");
        assert_eq!(
            ops[1],
            json!({ "op": "test", "path": "/metadata/generation", "value": 3 })
        );
        assert_eq!(ops[2]["path"], "/status");
    }
}
