//! Certificate material for managed TLS: generating the CA and the serving certificate, reading
//! them back from a Secret's PEM, and deciding when to rotate. Pure: no I/O, the clock is an
//! argument.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SanType,
};
use time::OffsetDateTime;
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::pem::Pem;

use super::TlsError;

/// Secret key holding the CA bundle: the current CA first, then retired CAs not yet expired.
pub const CA_BUNDLE_KEY: &str = "ca.crt";
/// Secret key holding the current CA's private key.
pub const CA_KEY_KEY: &str = "ca.key";
/// Secret key holding the serving certificate.
pub const TLS_CRT_KEY: &str = "tls.crt";
/// Secret key holding the serving certificate's private key.
pub const TLS_KEY_KEY: &str = "tls.key";

/// Backdating, so a peer whose clock is a little behind still accepts a fresh certificate.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// Everything the managed Secret holds, as PEM text.
#[derive(Clone, PartialEq, Eq)]
pub struct Material {
    /// The current CA, then retired CAs still valid (what goes into `caBundle`).
    pub ca_bundle: String,
    /// The current CA's key.
    pub ca_key: String,
    /// The serving certificate.
    pub cert: String,
    /// The serving certificate's key.
    pub key: String,
}

impl fmt::Debug for Material {
    // Never print private keys.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("ca_bundle", &self.ca_bundle)
            .field("cert", &self.cert)
            .finish_non_exhaustive()
    }
}

impl Material {
    /// Reads the four keys of a Secret; `None` when one is missing or not UTF-8.
    pub fn from_secret_data(data: &BTreeMap<String, ByteString>) -> Option<Material> {
        let get = |k: &str| {
            data.get(k)
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
        };
        Some(Material {
            ca_bundle: get(CA_BUNDLE_KEY)?,
            ca_key: get(CA_KEY_KEY)?,
            cert: get(TLS_CRT_KEY)?,
            key: get(TLS_KEY_KEY)?,
        })
    }

    /// The Secret `data` for this material.
    pub fn to_secret_data(&self) -> BTreeMap<String, ByteString> {
        [
            (CA_BUNDLE_KEY, &self.ca_bundle),
            (CA_KEY_KEY, &self.ca_key),
            (TLS_CRT_KEY, &self.cert),
            (TLS_KEY_KEY, &self.key),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec())))
        .collect()
    }
}

/// What the serving certificate must cover and how long certificates live.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Subject alternative names: DNS names, or IP addresses written as such.
    pub names: Vec<String>,
    /// Lifetime of a serving certificate.
    pub validity: Duration,
    /// Lifetime of a CA.
    pub ca_validity: Duration,
    /// Reissue a certificate (or replace a CA) when less than this is left.
    pub rotate_before: Duration,
}

/// Why material has to change; the text goes to the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// The material is good: serve it.
    Keep,
    /// Issue a new serving certificate from the current CA.
    IssueCert(String),
    /// Make a new CA (keeping the old one in the bundle while it is valid) and a new certificate.
    NewCa(String),
}

/// Facts read from one certificate.
#[derive(Debug, Clone, Copy)]
struct CertInfo {
    not_after: i64,
}

/// One `CERTIFICATE` block of a PEM bundle: its text as found, and its decoded form.
struct Block {
    text: String,
    pem: Pem,
}

/// The `CERTIFICATE` blocks of `text`, in order, each kept verbatim so a bundle can be
/// rebuilt without re-encoding.
fn parse_pems(text: &str) -> Result<Vec<Block>, TlsError> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let after = &rest[start..];
        let Some(end) = after.find(END) else {
            return Err(TlsError::Parse("unterminated CERTIFICATE block".into()));
        };
        let block = format!("{}\n", &after[..end + END.len()]);
        let pem = Pem::iter_from_buffer(block.as_bytes())
            .next()
            .ok_or_else(|| TlsError::Parse("empty CERTIFICATE block".into()))?
            .map_err(|e| TlsError::Parse(format!("PEM: {e}")))?;
        out.push(Block { text: block, pem });
        rest = &after[end + END.len()..];
    }
    if out.is_empty() {
        return Err(TlsError::Parse("no CERTIFICATE in PEM".into()));
    }
    Ok(out)
}

fn info(pem: &Pem) -> Result<(CertInfo, X509Certificate<'_>), TlsError> {
    let x509 = pem
        .parse_x509()
        .map_err(|e| TlsError::Parse(format!("X.509: {e}")))?;
    let info = CertInfo {
        not_after: x509.validity().not_after.timestamp(),
    };
    Ok((info, x509))
}

/// Subject alternative names of a certificate, as strings (`DNS` names and IP addresses).
fn sans(cert: &X509Certificate<'_>) -> Vec<String> {
    let Ok(Some(ext)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    ext.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some(d.to_string()),
            GeneralName::IPAddress(b) => match b.len() {
                4 => <[u8; 4]>::try_from(*b)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                16 => <[u8; 16]>::try_from(*b)
                    .ok()
                    .map(|a| IpAddr::from(a).to_string()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Canonical form of a wanted name, so `::1` and `0:0::1` compare equal.
fn canonical_name(name: &str) -> String {
    match name.parse::<IpAddr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => name.to_ascii_lowercase(),
    }
}

fn remaining(not_after: i64, now: OffsetDateTime) -> i64 {
    not_after - now.unix_timestamp()
}

fn secs(d: Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Decides what to do with the material found in the Secret (`None`: no Secret).
/// `force` asks for a new serving certificate even when the current one is good.
pub fn plan(found: Option<&Material>, policy: &Policy, now: OffsetDateTime, force: bool) -> Plan {
    let Some(m) = found else {
        return Plan::NewCa("no certificate yet".into());
    };
    let rotate_before = secs(policy.rotate_before);

    // The CA: the first certificate of the bundle, with its key.
    let ca_pems = match parse_pems(&m.ca_bundle) {
        Ok(p) => p,
        Err(e) => return Plan::NewCa(format!("CA bundle unreadable: {e}")),
    };
    let (ca, ca_x509) = match info(&ca_pems[0].pem) {
        Ok(v) => v,
        Err(e) => return Plan::NewCa(format!("CA unreadable: {e}")),
    };
    match KeyPair::from_pem(&m.ca_key) {
        Ok(k) if k.der_bytes() == ca_x509.public_key().subject_public_key.data.as_ref() => {}
        Ok(_) => return Plan::NewCa("CA key does not match the CA certificate".into()),
        Err(e) => return Plan::NewCa(format!("CA key unreadable: {e}")),
    }
    if remaining(ca.not_after, now) < rotate_before {
        return Plan::NewCa("CA expires soon".into());
    }

    // The serving certificate: readable, signed by the current CA, its key, names and time.
    let leaf_pems = match parse_pems(&m.cert) {
        Ok(p) => p,
        Err(e) => return Plan::IssueCert(format!("certificate unreadable: {e}")),
    };
    let (leaf, leaf_x509) = match info(&leaf_pems[0].pem) {
        Ok(v) => v,
        Err(e) => return Plan::IssueCert(format!("certificate unreadable: {e}")),
    };
    if leaf_x509
        .verify_signature(Some(ca_x509.public_key()))
        .is_err()
    {
        return Plan::IssueCert("certificate not signed by the current CA".into());
    }
    match KeyPair::from_pem(&m.key) {
        Ok(k) if k.der_bytes() == leaf_x509.public_key().subject_public_key.data.as_ref() => {}
        Ok(_) => return Plan::IssueCert("key does not match the certificate".into()),
        Err(e) => return Plan::IssueCert(format!("key unreadable: {e}")),
    }
    let have: Vec<String> = sans(&leaf_x509).iter().map(|s| canonical_name(s)).collect();
    if let Some(missing) = policy
        .names
        .iter()
        .map(|n| canonical_name(n))
        .find(|n| !have.contains(n))
    {
        return Plan::IssueCert(format!("certificate does not cover {missing}"));
    }
    if remaining(leaf.not_after, now) < rotate_before {
        return Plan::IssueCert("certificate expires soon".into());
    }
    if force {
        return Plan::IssueCert("rotation requested".into());
    }
    Plan::Keep
}

/// Carries out `plan` (anything but `Keep`) on top of the material found.
pub fn execute(
    plan: &Plan,
    found: Option<&Material>,
    policy: &Policy,
    now: OffsetDateTime,
) -> Result<Material, TlsError> {
    match plan {
        Plan::Keep => found
            .cloned()
            .ok_or_else(|| TlsError::Generate("nothing to keep".into())),
        Plan::IssueCert(_) => {
            let m = found.ok_or_else(|| TlsError::Generate("no CA to issue from".into()))?;
            let ca_pem = parse_pems(&m.ca_bundle)?
                .into_iter()
                .next()
                .map(|b| b.text)
                .ok_or_else(|| TlsError::Parse("empty CA bundle".into()))?;
            let (cert, key) = issue_cert(&ca_pem, &m.ca_key, policy, now)?;
            Ok(Material {
                ca_bundle: m.ca_bundle.clone(),
                ca_key: m.ca_key.clone(),
                cert,
                key,
            })
        }
        Plan::NewCa(_) => {
            let (ca_pem, ca_key) = generate_ca(policy, now)?;
            // Keep the old CAs that are still valid: other replicas may serve certificates
            // they signed until they read the new Secret.
            let mut bundle = ca_pem.clone();
            if let Some(old) = found
                && let Ok(pems) = parse_pems(&old.ca_bundle)
            {
                for b in pems {
                    if let Ok((i, _)) = info(&b.pem)
                        && remaining(i.not_after, now) > 0
                    {
                        bundle.push_str(&b.text);
                    }
                }
            }
            let (cert, key) = issue_cert(&ca_pem, &ca_key, policy, now)?;
            Ok(Material {
                ca_bundle: bundle,
                ca_key,
                cert,
                key,
            })
        }
    }
}

fn validity_window(
    params: &mut CertificateParams,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<(), TlsError> {
    let validity = time::Duration::try_from(validity)
        .map_err(|_| TlsError::Generate("validity too long".into()))?;
    params.not_before = now - BACKDATE;
    params.not_after = now
        .checked_add(validity)
        .ok_or_else(|| TlsError::Generate("validity too long".into()))?;
    Ok(())
}

/// A fresh self-signed CA: (certificate PEM, key PEM).
fn generate_ca(policy: &Policy, now: OffsetDateTime) -> Result<(String, String), TlsError> {
    let key = KeyPair::generate().map_err(gen_err)?;
    let mut params = CertificateParams::default();
    // A distinct name per CA, so a certificate names the CA that signed it.
    params.distinguished_name.push(
        DnType::CommonName,
        format!("nodeipam-webhook-ca-{}", now.unix_timestamp_nanos()),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    validity_window(&mut params, now, policy.ca_validity)?;
    let cert = params.self_signed(&key).map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// A serving certificate for `policy.names`, signed by the CA: (certificate PEM, key PEM).
fn issue_cert(
    ca_pem: &str,
    ca_key_pem: &str,
    policy: &Policy,
    now: OffsetDateTime,
) -> Result<(String, String), TlsError> {
    let ca_key = KeyPair::from_pem(ca_key_pem).map_err(gen_err)?;
    let issuer = Issuer::from_ca_cert_pem(ca_pem, ca_key).map_err(gen_err)?;
    let key = KeyPair::generate().map_err(gen_err)?;
    let mut params = CertificateParams::default();
    params.subject_alt_names = policy
        .names
        .iter()
        .map(|n| match n.parse::<IpAddr>() {
            Ok(ip) => Ok(SanType::IpAddress(ip)),
            Err(_) => n.clone().try_into().map(SanType::DnsName).map_err(gen_err),
        })
        .collect::<Result<_, _>>()?;
    let cn = policy
        .names
        .first()
        .cloned()
        .unwrap_or_else(|| "nodeipam-webhook".into());
    params.distinguished_name.push(DnType::CommonName, cn);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    validity_window(&mut params, now, policy.validity)?;
    let cert = params.signed_by(&key, &issuer).map_err(gen_err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

fn gen_err(e: impl fmt::Display) -> TlsError {
    TlsError::Generate(e.to_string())
}

/// The expiry (Unix seconds) of the first certificate in `cert_pem`, for logs and tests.
pub fn cert_not_after(cert_pem: &str) -> Result<i64, TlsError> {
    let pems = parse_pems(cert_pem)?;
    Ok(info(&pems[0].pem)?.0.not_after)
}

#[cfg(test)]
mod tests;
