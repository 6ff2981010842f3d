//! The hand-written protobuf Node-list reader nodeipam had before prost (alloc/src/node/protobuf.rs
//! until 2026-12-04), kept here as the contender the benchmark compares prost with: a field
//! iterator over the wire bytes, every field it does not read skipped by its length.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodeipam_alloc::node::IpamNode;
use nodeipam_alloc::node::protobuf::{DecodeError, NodeListPage};

const MAGIC: &[u8] = b"k8s\0";

fn err(at: &'static str, reason: impl Into<String>) -> DecodeError {
    DecodeError {
        at,
        reason: reason.into(),
    }
}

/// A Node list page from a protobuf body.
pub fn node_list(body: &[u8]) -> Result<NodeListPage, DecodeError> {
    let raw = envelope(body, "NodeList")?;
    // Items counted first (each skipped by its length): the list is allocated once, not grown
    // by doubling, which copied every Node about once more (7% more bytes allocated).
    let items = Fields::new(raw, "NodeList")
        .filter(|f| matches!(f, Ok((2, _))))
        .count();
    let mut page = NodeListPage {
        items: Vec::with_capacity(items),
        ..NodeListPage::default()
    };
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
