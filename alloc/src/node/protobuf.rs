//! Node lists in the API server's protobuf encoding, read slim: the same fields as the JSON
//! reader of [`IpamNode`], every other field skipped by its length without being looked at.
//! The API server encodes protobuf at a fraction of JSON's cost and a skipped field costs one
//! bounds check, so a start-up list of tens of thousands of Nodes is cheaper at both ends.
//!
//! The wire format (k8s.io/apimachinery `runtime.Unknown` behind the `k8s\0` prefix; field
//! numbers from `k8s.io/api/core/v1/generated.proto`): numbers that never change, since
//! protobuf compatibility rests on them. Input is untrusted: every length is checked, and
//! garbage is an error naming where it was found, never a panic.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
    /// The field path, e.g. `items.metadata.labels`.
    pub at: &'static str,
    pub reason: String,
}

fn err(at: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError {
        at,
        reason: reason.into(),
    }
}

/// A Node list page from a protobuf body.
pub fn node_list(body: &[u8]) -> Result<NodeListPage, DecodeError> {
    let raw = envelope(body, "NodeList")?;
    let mut page = NodeListPage::default();
    for field in Fields::new(raw, "NodeList") {
        match field? {
            (1, Value::Bytes(b)) => list_meta(b, &mut page)?,
            (2, Value::Bytes(b)) => page.items.push(node(b)?),
            (1 | 2, _) => return Err(err("NodeList", "metadata and items must be messages")),
            _ => {}
        }
    }
    Ok(page)
}

/// A Status (what the API server answers a failed request with) from a protobuf body.
pub fn status(body: &[u8]) -> Result<StatusFacts, DecodeError> {
    let raw = envelope(body, "Status")?;
    let mut facts = StatusFacts::default();
    for field in Fields::new(raw, "Status") {
        match field? {
            (2, Value::Bytes(b)) => facts.status = Some(text(b, "Status.status")?),
            (3, Value::Bytes(b)) => facts.message = Some(text(b, "Status.message")?),
            (4, Value::Bytes(b)) => facts.reason = Some(text(b, "Status.reason")?),
            // int32 on the wire as a varint; a negative one is sign-extended to 64 bits.
            (6, Value::Varint(v)) => facts.code = Some(v as i64 as i32),
            _ => {}
        }
    }
    Ok(facts)
}

/// The `raw` bytes of the `runtime.Unknown` behind the prefix, once its kind is `want` and
/// nothing says they are further encoded.
fn envelope<'a>(body: &'a [u8], want: &str) -> Result<&'a [u8], DecodeError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        err(
            "envelope",
            "no k8s\\0 prefix: not a Kubernetes protobuf body",
        )
    })?;
    let (mut kind, mut raw, mut encoding) = (String::new(), None, String::new());
    for field in Fields::new(rest, "envelope") {
        match field? {
            (1, Value::Bytes(b)) => kind = type_meta_kind(b)?,
            (2, Value::Bytes(b)) => raw = Some(b),
            (3, Value::Bytes(b)) => encoding = text(b, "envelope.contentEncoding")?,
            _ => {}
        }
    }
    if kind != want {
        return Err(err(
            "envelope.typeMeta.kind",
            format!("{kind:?}, expected {want}"),
        ));
    }
    if !encoding.is_empty() {
        return Err(err(
            "envelope.contentEncoding",
            format!("{encoding:?} is not supported"),
        ));
    }
    Ok(raw.unwrap_or_default())
}

fn type_meta_kind(b: &[u8]) -> Result<String, DecodeError> {
    let mut kind = String::new();
    for field in Fields::new(b, "envelope.typeMeta") {
        if let (2, Value::Bytes(k)) = field? {
            kind = text(k, "envelope.typeMeta.kind")?;
        }
    }
    Ok(kind)
}

fn list_meta(b: &[u8], page: &mut NodeListPage) -> Result<(), DecodeError> {
    for field in Fields::new(b, "NodeList.metadata") {
        match field? {
            (2, Value::Bytes(v)) => {
                page.resource_version = nonempty(v, "NodeList.metadata.resourceVersion")?
            }
            (3, Value::Bytes(v)) => {
                page.continue_token = nonempty(v, "NodeList.metadata.continue")?
            }
            (4, Value::Varint(v)) => page.remaining_item_count = Some(v as i64),
            _ => {}
        }
    }
    Ok(())
}

fn node(b: &[u8]) -> Result<IpamNode, DecodeError> {
    let mut node = IpamNode::default();
    for field in Fields::new(b, "items") {
        match field? {
            (1, Value::Bytes(m)) => object_meta(m, &mut node.metadata)?,
            (2, Value::Bytes(s)) => node_spec(s, &mut node)?,
            _ => {}
        }
    }
    Ok(node)
}

fn object_meta(b: &[u8], meta: &mut ObjectMeta) -> Result<(), DecodeError> {
    for field in Fields::new(b, "items.metadata") {
        match field? {
            (1, Value::Bytes(v)) => meta.name = nonempty(v, "items.metadata.name")?,
            (5, Value::Bytes(v)) => meta.uid = nonempty(v, "items.metadata.uid")?,
            (6, Value::Bytes(v)) => {
                meta.resource_version = nonempty(v, "items.metadata.resourceVersion")?
            }
            (11, Value::Bytes(v)) => {
                let (key, value) = map_entry(v, "items.metadata.labels")?;
                meta.labels
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, value);
            }
            _ => {}
        }
    }
    Ok(())
}

fn node_spec(b: &[u8], node: &mut IpamNode) -> Result<(), DecodeError> {
    for field in Fields::new(b, "items.spec") {
        match field? {
            (1, Value::Bytes(v)) => node.pod_cidr = nonempty(v, "items.spec.podCIDR")?,
            (7, Value::Bytes(v)) => node
                .pod_cidrs
                .get_or_insert_with(Vec::new)
                .push(text(v, "items.spec.podCIDRs")?),
            _ => {}
        }
    }
    Ok(())
}

/// A `map<string, string>` entry: key 1, value 2, either may be absent (empty).
fn map_entry(b: &[u8], at: &'static str) -> Result<(String, String), DecodeError> {
    let (mut key, mut value) = (String::new(), String::new());
    for field in Fields::new(b, at) {
        match field? {
            (1, Value::Bytes(k)) => key = text(k, at)?,
            (2, Value::Bytes(v)) => value = text(v, at)?,
            _ => {}
        }
    }
    Ok((key, value))
}

/// A string field the JSON encoding omits when empty: Go writes every string to protobuf,
/// empty or not, and the two readers must agree.
fn nonempty(b: &[u8], at: &'static str) -> Result<Option<String>, DecodeError> {
    Ok(Some(text(b, at)?).filter(|s| !s.is_empty()))
}

fn text(b: &[u8], at: &'static str) -> Result<String, DecodeError> {
    String::from_utf8(b.to_vec()).map_err(|_| err(at, "not UTF-8"))
}

/// A field's value as the wire carries it; fixed-width values are skipped unread.
#[derive(Debug)]
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of one message, in wire order.
struct Fields<'a> {
    buf: &'a [u8],
    at: &'static str,
    failed: bool,
}

impl<'a> Fields<'a> {
    fn new(buf: &'a [u8], at: &'static str) -> Self {
        Fields {
            buf,
            at,
            failed: false,
        }
    }

    fn varint(&mut self) -> Result<u64, DecodeError> {
        let mut value = 0u64;
        for (i, byte) in self.buf.iter().take(10).enumerate() {
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                self.buf = &self.buf[i + 1..];
                return Ok(value);
            }
        }
        Err(err(
            self.at,
            "a varint runs past the end or beyond 10 bytes",
        ))
    }

    fn take(&mut self, len: u64) -> Result<&'a [u8], DecodeError> {
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        if len > self.buf.len() {
            return Err(err(self.at, "a field runs past the end of its message"));
        }
        let (head, tail) = self.buf.split_at(len);
        self.buf = tail;
        Ok(head)
    }

    fn field(&mut self) -> Result<(u32, Value<'a>), DecodeError> {
        let key = self.varint()?;
        let number = u32::try_from(key >> 3).map_err(|_| err(self.at, "field number too large"))?;
        let value = match key & 7 {
            0 => Value::Varint(self.varint()?),
            1 => self.take(8).map(|_| Value::Fixed)?,
            2 => {
                let len = self.varint()?;
                Value::Bytes(self.take(len)?)
            }
            5 => self.take(4).map(|_| Value::Fixed)?,
            wire => {
                return Err(err(
                    self.at,
                    format!("wire type {wire} is not used by Kubernetes"),
                ));
            }
        };
        Ok((number, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.buf.is_empty() {
            return None;
        }
        let field = self.field();
        self.failed = field.is_err();
        Some(field)
    }
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
        assert_eq!(a.metadata.annotations, None);
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
        assert_eq!(e.at, "items.metadata.name");
        let group = wrapped("NodeList", &[0x0b]); // field 1, wire type 3 (a group)
        assert!(
            node_list(&group)
                .expect_err("group")
                .reason
                .contains("wire type 3")
        );
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
