//! A minimal DER writer and reader, just enough to build client certificates whose subject
//! carries several `O=` (group) attributes. rcgen keeps one value per attribute type, and the
//! API server reads every `O` of a client certificate as a group, so client certificates are
//! assembled here and signed with rcgen's key.

/// Encodes one tag-length-value.
pub(crate) fn tlv(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len() + 6);
    out.push(tag);
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        let significant = &bytes[skip..];
        out.push(0x80 | significant.len() as u8);
        out.extend_from_slice(significant);
    }
    out.extend_from_slice(content);
    out
}

pub(crate) fn sequence(parts: &[&[u8]]) -> Vec<u8> {
    tlv(0x30, &parts.concat())
}

pub(crate) fn set(parts: &[&[u8]]) -> Vec<u8> {
    tlv(0x31, &parts.concat())
}

/// `[n] EXPLICIT`, constructed context-specific tag.
pub(crate) fn explicit(n: u8, content: &[u8]) -> Vec<u8> {
    tlv(0xA0 | n, content)
}

pub(crate) fn boolean_true() -> Vec<u8> {
    tlv(0x01, &[0xFF])
}

/// A non-negative INTEGER from big-endian magnitude bytes, minimally encoded.
pub(crate) fn unsigned_integer(magnitude: &[u8]) -> Vec<u8> {
    let skip = magnitude
        .iter()
        .take_while(|b| **b == 0)
        .count()
        .min(magnitude.len().saturating_sub(1));
    let trimmed = &magnitude[skip..];
    let mut content = Vec::with_capacity(trimmed.len() + 1);
    if trimmed.is_empty() || trimmed[0] & 0x80 != 0 {
        content.push(0);
    }
    content.extend_from_slice(trimmed);
    tlv(0x02, &content)
}

pub(crate) fn oid(arcs: &[u64]) -> Vec<u8> {
    let mut content = Vec::new();
    if arcs.len() >= 2 {
        push_base128(&mut content, arcs[0] * 40 + arcs[1]);
        for arc in &arcs[2..] {
            push_base128(&mut content, *arc);
        }
    }
    tlv(0x06, &content)
}

fn push_base128(out: &mut Vec<u8>, mut value: u64) {
    let mut groups = vec![(value & 0x7F) as u8];
    value >>= 7;
    while value > 0 {
        groups.push(0x80 | (value & 0x7F) as u8);
        value >>= 7;
    }
    groups.reverse();
    out.extend_from_slice(&groups);
}

pub(crate) fn utf8_string(s: &str) -> Vec<u8> {
    tlv(0x0C, s.as_bytes())
}

pub(crate) fn utc_time(s: &str) -> Vec<u8> {
    tlv(0x17, s.as_bytes())
}

pub(crate) fn generalized_time(s: &str) -> Vec<u8> {
    tlv(0x18, s.as_bytes())
}

/// A BIT STRING with `unused` trailing bits in the last byte.
pub(crate) fn bit_string(unused: u8, bytes: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(bytes.len() + 1);
    content.push(unused);
    content.extend_from_slice(bytes);
    tlv(0x03, &content)
}

pub(crate) fn octet_string(bytes: &[u8]) -> Vec<u8> {
    tlv(0x04, bytes)
}

/// One element at the start of `input`: its tag, the whole element, and its content.
pub(crate) struct Element<'a> {
    pub tag: u8,
    pub whole: &'a [u8],
    pub content: &'a [u8],
}

/// Reads the element at the start of `input`; `None` on anything malformed or truncated.
pub(crate) fn read(input: &[u8]) -> Option<Element<'_>> {
    let tag = *input.first()?;
    let first = *input.get(1)? as usize;
    let (len, header) = if first < 0x80 {
        (first, 2)
    } else {
        let n = first & 0x7F;
        if n == 0 || n > std::mem::size_of::<usize>() {
            return None;
        }
        let bytes = input.get(2..2 + n)?;
        let len = bytes.iter().fold(0usize, |acc, b| (acc << 8) | *b as usize);
        (len, 2 + n)
    };
    let end = header.checked_add(len)?;
    Some(Element {
        tag,
        whole: input.get(..end)?,
        content: input.get(header..end)?,
    })
}

/// The DER of the subject Name of an X.509 certificate, to use verbatim as the issuer of the
/// certificates it signs (verifiers match issuer and subject byte for byte).
pub(crate) fn certificate_subject(cert_der: &[u8]) -> Option<Vec<u8>> {
    let cert = read(cert_der)?;
    let tbs = read(cert.content)?;
    let mut rest = tbs.content;
    let mut next = || -> Option<Element<'_>> {
        let el = read(rest)?;
        rest = &rest[el.whole.len()..];
        Some(el)
    };
    let mut el = next()?;
    if el.tag == 0xA0 {
        el = next()?; // explicit version; the serial follows
    }
    let _serial = el;
    let _signature_alg = next()?;
    let _issuer = next()?;
    let _validity = next()?;
    let subject = next()?;
    (subject.tag == 0x30).then(|| subject.whole.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_use_short_and_long_forms() {
        assert_eq!(tlv(0x04, &[1, 2]), vec![0x04, 2, 1, 2]);
        let long = tlv(0x04, &[0u8; 200]);
        assert_eq!(&long[..3], &[0x04, 0x81, 200]);
        let longer = tlv(0x04, &[0u8; 300]);
        assert_eq!(&longer[..4], &[0x04, 0x82, 0x01, 0x2C]);
        let el = read(&longer).unwrap();
        assert_eq!(el.content.len(), 300);
        assert_eq!(el.whole.len(), longer.len());
    }

    #[test]
    fn integers_are_minimal_and_positive() {
        assert_eq!(unsigned_integer(&[0, 0, 5]), vec![0x02, 1, 5]);
        assert_eq!(unsigned_integer(&[0x80]), vec![0x02, 2, 0, 0x80]);
        assert_eq!(unsigned_integer(&[0]), vec![0x02, 1, 0]);
    }

    #[test]
    fn oids_encode_like_the_standard_examples() {
        // organizationName 2.5.4.10 and ecdsa-with-SHA256 1.2.840.10045.4.3.2
        assert_eq!(oid(&[2, 5, 4, 10]), vec![0x06, 3, 0x55, 0x04, 0x0A]);
        assert_eq!(
            oid(&[1, 2, 840, 10045, 4, 3, 2]),
            vec![0x06, 8, 0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x04, 0x03, 0x02]
        );
    }

    #[test]
    fn truncated_input_is_rejected() {
        assert!(read(&[0x30]).is_none());
        assert!(read(&[0x30, 5, 1]).is_none());
        assert!(read(&[0x30, 0x84, 0xFF, 0xFF, 0xFF, 0xFF]).is_none());
        assert!(certificate_subject(&[0x30, 2, 0x30, 0]).is_none());
    }
}
