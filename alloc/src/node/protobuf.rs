//! Node lists in the API server's protobuf encoding, read slim: the same fields as the JSON
//! reader of [`IpamNode`], decoded by `prost` into message structs that name only those fields,
//! so prost skips every other field by its length without looking at it. The API server
//! encodes protobuf at a fraction of JSON's cost, so a start-up list of tens of thousands of
//! Nodes is cheaper at both ends.
//!
//! prost replaced a hand-written reader: on a real API server's 65,000-Node list (33 pages of
//! 2,000) the two cost the same CPU (prost 0.97-1.04x the hand-written one by the medians of
//! three interleaved runs of `hack/bench/nodelist.sh`), so the less code won (BENCHMARKS.md).
//!
//! The wire format (k8s.io/apimachinery `runtime.Unknown` behind the `k8s\0` prefix; field
//! numbers from `k8s.io/api/core/v1/generated.proto`, proto2): numbers that never change, since
//! protobuf compatibility rests on them. Input is untrusted: garbage is an error naming where
//! it was found (prost's message and field path), never a panic.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use prost::Message;

use super::IpamNode;

/// What every protobuf body of the API server starts with.
const MAGIC: &[u8] = b"k8s\0";

/// One page of a Node list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeListPage {
    /// `metadata.resourceVersion`: where a watch resumes after the last page.
    pub resource_version: Option<String>,
    /// `metadata.continue`: the token for the next page; none on the last.
    pub continue_token: Option<String>,
    /// `metadata.remainingItemCount`, when the server says.
    pub remaining_item_count: Option<i64>,
    pub items: Vec<IpamNode>,
}

/// The parts of a `meta/v1` Status an error report needs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusFacts {
    pub status: Option<String>,
    pub message: Option<String>,
    pub reason: Option<String>,
    pub code: Option<i32>,
}

/// Why a body could not be read, and where in it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("protobuf {at}: {reason}")]
pub struct DecodeError {
    /// `envelope` (the wrapper around the object) or the object's kind; prost's reason names
    /// the message and field within it, e.g. `ObjectMeta.name`.
    pub at: &'static str,
    pub reason: String,
}

fn err(at: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError {
        at,
        reason: reason.into(),
    }
}

/// The slim messages: only the fields nodeipam reads, by their numbers on the wire.
mod wire_types {
    use std::collections::BTreeMap;

    /// `runtime.Unknown` without its `raw` bytes (field 2, skipped): the kind and encoding are
    /// checked before the object is decoded.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Envelope {
        #[prost(message, optional, tag = "1")]
        pub type_meta: Option<TypeMeta>,
        #[prost(string, optional, tag = "3")]
        pub content_encoding: Option<String>,
    }

    /// `runtime.Unknown` with `raw` read as the message it holds: bytes and an embedded
    /// message are the same on the wire, so the object is decoded in place, not copied out.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Wrapped<T: prost::Message + Default + std::fmt::Debug> {
        #[prost(message, optional, tag = "2")]
        pub raw: Option<T>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct TypeMeta {
        #[prost(string, optional, tag = "2")]
        pub kind: Option<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeList {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ListMeta>,
        #[prost(message, repeated, tag = "2")]
        pub items: Vec<Node>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ListMeta {
        #[prost(string, optional, tag = "2")]
        pub resource_version: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub continue_token: Option<String>,
        #[prost(int64, optional, tag = "4")]
        pub remaining_item_count: Option<i64>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Node {
        #[prost(message, optional, tag = "1")]
        pub metadata: Option<ObjectMeta>,
        #[prost(message, optional, tag = "2")]
        pub spec: Option<NodeSpec>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ObjectMeta {
        #[prost(string, optional, tag = "1")]
        pub name: Option<String>,
        #[prost(string, optional, tag = "5")]
        pub uid: Option<String>,
        #[prost(string, optional, tag = "6")]
        pub resource_version: Option<String>,
        #[prost(btree_map = "string, string", tag = "11")]
        pub labels: BTreeMap<String, String>,
        #[prost(btree_map = "string, string", tag = "12")]
        pub annotations: BTreeMap<String, String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NodeSpec {
        #[prost(string, optional, tag = "1")]
        pub pod_cidr: Option<String>,
        #[prost(string, repeated, tag = "7")]
        pub pod_cidrs: Vec<String>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Status {
        #[prost(string, optional, tag = "2")]
        pub status: Option<String>,
        #[prost(string, optional, tag = "3")]
        pub message: Option<String>,
        #[prost(string, optional, tag = "4")]
        pub reason: Option<String>,
        #[prost(int32, optional, tag = "6")]
        pub code: Option<i32>,
    }
}

/// A Node list page from a protobuf body.
pub fn node_list(body: &[u8]) -> Result<NodeListPage, DecodeError> {
    let list: wire_types::NodeList = object(body, "NodeList")?;
    let meta = list.metadata.unwrap_or_default();
    Ok(NodeListPage {
        resource_version: nonempty(meta.resource_version),
        continue_token: nonempty(meta.continue_token),
        remaining_item_count: meta.remaining_item_count,
        items: list.items.into_iter().map(node).collect(),
    })
}

/// A Status (what the API server answers a failed request with) from a protobuf body.
pub fn status(body: &[u8]) -> Result<StatusFacts, DecodeError> {
    let s: wire_types::Status = object(body, "Status")?;
    Ok(StatusFacts {
        status: s.status,
        message: s.message,
        reason: s.reason,
        code: s.code,
    })
}

/// The object behind the prefix, once the envelope says its kind is `kind` and nothing says
/// it is further encoded.
fn object<T: Message + Default + std::fmt::Debug>(
    body: &[u8],
    kind: &'static str,
) -> Result<T, DecodeError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        err(
            "envelope",
            "no k8s\\0 prefix: not a Kubernetes protobuf body",
        )
    })?;
    let envelope =
        wire_types::Envelope::decode(rest).map_err(|e| err("envelope", e.to_string()))?;
    let found = envelope.type_meta.and_then(|t| t.kind).unwrap_or_default();
    if found != kind {
        return Err(err(
            "envelope.typeMeta.kind",
            format!("{found:?}, expected {kind}"),
        ));
    }
    if let Some(encoding) = nonempty(envelope.content_encoding) {
        return Err(err(
            "envelope.contentEncoding",
            format!("{encoding:?} is not supported"),
        ));
    }
    let wrapped = wire_types::Wrapped::<T>::decode(rest).map_err(|e| err(kind, e.to_string()))?;
    Ok(wrapped.raw.unwrap_or_default())
}

/// A Node as the JSON reader gives it: an empty string, map or list is absent.
fn node(n: wire_types::Node) -> IpamNode {
    let meta = n.metadata.unwrap_or_default();
    let spec = n.spec.unwrap_or_default();
    IpamNode {
        metadata: ObjectMeta {
            name: nonempty(meta.name),
            uid: nonempty(meta.uid),
            resource_version: nonempty(meta.resource_version),
            labels: (!meta.labels.is_empty()).then_some(meta.labels),
            annotations: super::keep_seal(
                (!meta.annotations.is_empty()).then_some(meta.annotations),
            ),
            ..ObjectMeta::default()
        },
        pod_cidr: nonempty(spec.pod_cidr),
        pod_cidrs: (!spec.pod_cidrs.is_empty()).then_some(spec.pod_cidrs),
    }
}

/// A string field the JSON encoding omits when empty: Go writes every string to protobuf,
/// empty or not, and the two readers must agree.
fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

#[cfg(test)]
pub(crate) mod wire {
    //! A protobuf writer for the tests: just enough to build the bodies the API server sends.

    pub fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }

    pub fn bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
        varint(out, u64::from(number) << 3 | 2);
        varint(out, b.len() as u64);
        out.extend_from_slice(b);
    }

    pub fn uint(out: &mut Vec<u8>, number: u32, v: u64) {
        varint(out, u64::from(number) << 3);
        varint(out, v);
    }

    /// Writes one or more fields.
    pub type Field<'a> = &'a dyn Fn(&mut Vec<u8>);

    pub fn message(fields: &[Field]) -> Vec<u8> {
        let mut out = Vec::new();
        for f in fields {
            f(&mut out);
        }
        out
    }

    /// `k8s\0` + `runtime.Unknown{typeMeta{apiVersion: v1, kind}, raw}`.
    pub fn wrapped(kind: &str, raw: &[u8]) -> Vec<u8> {
        let type_meta = message(&[&|o| bytes(o, 1, b"v1"), &|o| bytes(o, 2, kind.as_bytes())]);
        let mut out = b"k8s\0".to_vec();
        bytes(&mut out, 1, &type_meta);
        bytes(&mut out, 2, raw);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::wire::*;
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn label(key: &str, value: &str) -> Vec<u8> {
        message(&[&|o| bytes(o, 1, key.as_bytes()), &|o| {
            bytes(o, 2, value.as_bytes())
        }])
    }

    /// A Node as the API server writes it, with fields IPAM skips around the ones it reads.
    fn full_node(name: &str, cidrs: &[&str]) -> Vec<u8> {
        let managed = message(&[&|o| bytes(o, 1, b"kubelet"), &|o| bytes(o, 2, b"Update")]);
        let meta = message(&[
            &|o| bytes(o, 1, name.as_bytes()),
            &|o| bytes(o, 5, format!("uid-{name}").as_bytes()),
            &|o| bytes(o, 6, b"77"),
            &|o| uint(o, 7, 3),
            &|o| bytes(o, 11, &label("zone", "a")),
            &|o| bytes(o, 12, &label("note", "skipped")),
            &|o| bytes(o, 12, &label(crate::seal::ANNOTATION, "r/1")),
            &|o| bytes(o, 11, &label("rack", "r1")),
            &|o| bytes(o, 17, &managed),
        ]);
        let spec = message(&[
            &|o| bytes(o, 1, cidrs.first().unwrap_or(&"").as_bytes()),
            &|o| bytes(o, 3, b"provider://x"),
            &|o| uint(o, 4, 1),
            &|o| {
                for c in cidrs {
                    bytes(o, 7, c.as_bytes());
                }
            },
        ]);
        let status = message(&[&|o| bytes(o, 1, b"capacity"), &|o| {
            o.extend_from_slice(&[0x0d, 1, 2, 3, 4]); // field 1, fixed32
            o.extend_from_slice(&[0x11, 1, 2, 3, 4, 5, 6, 7, 8]); // field 2, fixed64
        }]);
        message(&[&|o| bytes(o, 1, &meta), &|o| bytes(o, 2, &spec), &|o| {
            bytes(o, 3, &status)
        }])
    }

    fn list(items: &[Vec<u8>], rv: &str, cont: &str) -> Vec<u8> {
        let meta = message(&[
            &|o| bytes(o, 2, rv.as_bytes()),
            &|o| bytes(o, 3, cont.as_bytes()),
            &|o| uint(o, 4, 9),
        ]);
        let raw = message(&[&|o| bytes(o, 1, &meta), &|o| {
            for i in items {
                bytes(o, 2, i);
            }
        }]);
        wrapped("NodeList", &raw)
    }

    #[test]
    fn reads_what_the_json_reader_reads_and_skips_the_rest() {
        let body = list(
            &[
                full_node("a", &["10.0.0.0/24", "fd00::/64"]),
                full_node("b", &[]),
            ],
            "1234",
            "tok",
        );
        let page = node_list(&body).expect("decodes");
        assert_eq!(page.resource_version.as_deref(), Some("1234"));
        assert_eq!(page.continue_token.as_deref(), Some("tok"));
        assert_eq!(page.remaining_item_count, Some(9));
        assert_eq!(page.items.len(), 2);
        let a = &page.items[0];
        assert_eq!(a.metadata.name.as_deref(), Some("a"));
        assert_eq!(a.metadata.uid.as_deref(), Some("uid-a"));
        assert_eq!(a.metadata.resource_version.as_deref(), Some("77"));
        assert_eq!(
            a.metadata.labels,
            Some(BTreeMap::from([
                ("rack".to_string(), "r1".to_string()),
                ("zone".to_string(), "a".to_string())
            ]))
        );
        // Of the annotations, only the seal's is kept.
        assert_eq!(
            a.metadata.annotations,
            Some(BTreeMap::from([(
                crate::seal::ANNOTATION.to_string(),
                "r/1".to_string()
            )]))
        );
        assert_eq!(a.pod_cidr.as_deref(), Some("10.0.0.0/24"));
        assert_eq!(
            a.pod_cidrs,
            Some(vec!["10.0.0.0/24".to_string(), "fd00::/64".to_string()])
        );
        assert_eq!(page.items[1].pod_cidrs, None);
        assert_eq!(page.items[1].cidrs(), Ok(vec![]));
    }

    #[test]
    fn empty_strings_read_as_absent_as_json_omits_them() {
        // Go writes `podCIDR: ""` and an empty continue token; JSON leaves both out.
        let spec = message(&[&|o| bytes(o, 1, b"")]);
        let meta = message(&[&|o| bytes(o, 1, b"n"), &|o| bytes(o, 5, b"")]);
        let node = message(&[&|o| bytes(o, 1, &meta), &|o| bytes(o, 2, &spec)]);
        let page = node_list(&list(&[node], "3", "")).expect("decodes");
        assert_eq!(page.continue_token, None);
        assert_eq!(page.items[0].pod_cidr, None);
        assert_eq!(page.items[0].metadata.uid, None);
        assert_eq!(page.items[0].metadata.name.as_deref(), Some("n"));
    }

    #[test]
    fn an_empty_last_page_has_no_token_and_no_items() {
        let page = node_list(&wrapped("NodeList", &[])).expect("decodes");
        assert_eq!(page, NodeListPage::default());
    }

    #[test]
    fn reads_a_status() {
        let raw = message(&[
            &|o| bytes(o, 2, b"Failure"),
            &|o| bytes(o, 3, b"continue expired"),
            &|o| bytes(o, 4, b"Expired"),
            &|o| uint(o, 6, 410),
        ]);
        let facts = status(&wrapped("Status", &raw)).expect("decodes");
        assert_eq!(facts.code, Some(410));
        assert_eq!(facts.reason.as_deref(), Some("Expired"));
        assert_eq!(facts.message.as_deref(), Some("continue expired"));
        assert_eq!(facts.status.as_deref(), Some("Failure"));
    }

    #[test]
    fn garbage_is_an_error_naming_where() {
        let no_magic = node_list(b"{\"kind\":\"NodeList\"}").expect_err("json");
        assert_eq!(no_magic.at, "envelope");
        let wrong_kind = node_list(&wrapped("PodList", &[])).expect_err("kind");
        assert!(wrong_kind.to_string().contains("PodList"), "{wrong_kind}");
        let mut truncated = list(&[full_node("a", &["10.0.0.0/24"])], "1", "");
        truncated.truncate(truncated.len() - 5);
        assert!(node_list(&truncated).is_err());
        let bad_utf8 = list(
            &[message(&[&|o| {
                bytes(o, 1, &message(&[&|o| bytes(o, 1, &[0xff, 0xfe])]))
            }])],
            "1",
            "",
        );
        let e = node_list(&bad_utf8).expect_err("utf8");
        assert_eq!(e.at, "NodeList");
        assert!(e.reason.contains("ObjectMeta.name"), "{e}");
        assert!(e.reason.contains("UTF-8"), "{e}");
        let group = wrapped("NodeList", &[0x0b]); // field 1, wire type 3 (a group)
        let e = node_list(&group).expect_err("group");
        assert!(e.reason.contains("wire type"), "{e}");
        let mut gzipped = b"k8s\0".to_vec();
        bytes(&mut gzipped, 1, &message(&[&|o| bytes(o, 2, b"NodeList")]));
        bytes(&mut gzipped, 3, b"gzip");
        assert_eq!(
            node_list(&gzipped).expect_err("encoding").at,
            "envelope.contentEncoding"
        );
    }

    proptest! {
        /// Whatever the bytes, decoding returns; it never panics or loops.
        #[test]
        fn any_bytes_decode_or_fail_cleanly(tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let mut body = b"k8s\0".to_vec();
            body.extend_from_slice(&tail);
            let _ = node_list(&body);
            let _ = status(&body);
        }

        /// A well-formed page cut anywhere is an error or holds the whole nodes it had before
        /// the cut, never a half-read one.
        #[test]
        fn a_cut_page_is_an_error_or_a_prefix(cut in 0usize..400) {
            let body = list(&[full_node("a", &["10.0.0.0/24"]), full_node("b", &["10.0.1.0/24"])], "5", "t");
            let whole = node_list(&body).expect("whole page");
            let cut = cut.min(body.len());
            if let Ok(page) = node_list(&body[..cut]) {
                prop_assert!(whole.items.starts_with(&page.items), "{page:?}");
            }
        }
    }
}
