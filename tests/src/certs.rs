//! The control plane's PKI, generated fresh for every start: a serving CA and the
//! kube-apiserver serving certificate (127.0.0.1, localhost), a client CA and client
//! certificates (CN = user, one O per group), and the service-account signing key pair.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PublicKeyData, SigningKey,
};

use crate::der;
use crate::error::{HarnessError, Step};

/// A PEM certificate and its PEM (PKCS#8) private key.
#[derive(Clone)]
pub(crate) struct CertAndKey {
    pub cert_pem: String,
    pub key_pem: String,
}

/// Files of the PKI as written for kube-apiserver.
#[derive(Debug, Clone)]
pub(crate) struct PkiFiles {
    pub serving_ca: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub client_ca: PathBuf,
    pub sa_public: PathBuf,
    pub sa_private: PathBuf,
}

pub(crate) struct Pki {
    pub serving_ca_pem: String,
    serving: CertAndKey,
    client_ca_pem: String,
    client_ca_subject: Vec<u8>,
    client_ca_key: KeyPair,
    sa_key: KeyPair,
}

fn cert_err(context: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |source| HarnessError::Cert {
        step: Step::GenerateCerts,
        context: context.to_string(),
        source,
    }
}

fn ca_params(common_name: &str) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

impl Pki {
    pub fn generate() -> Result<Pki, HarnessError> {
        let serving_ca_key = KeyPair::generate().map_err(cert_err("serving CA key"))?;
        let serving_ca_params = ca_params("nodeipam-testenv-serving-ca");
        let serving_ca = serving_ca_params
            .self_signed(&serving_ca_key)
            .map_err(cert_err("serving CA"))?;
        let serving_issuer = Issuer::new(serving_ca_params, serving_ca_key);

        let serving_key = KeyPair::generate().map_err(cert_err("serving key"))?;
        let mut serving_params =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .map_err(cert_err("serving cert names"))?;
        serving_params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        serving_params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        serving_params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        serving_params.use_authority_key_identifier_extension = true;
        let serving_cert = serving_params
            .signed_by(&serving_key, &serving_issuer)
            .map_err(cert_err("serving cert"))?;

        let client_ca_key = KeyPair::generate().map_err(cert_err("client CA key"))?;
        let client_ca = ca_params("nodeipam-testenv-client-ca")
            .self_signed(&client_ca_key)
            .map_err(cert_err("client CA"))?;
        let client_ca_subject = der::certificate_subject(client_ca.der()).ok_or_else(|| {
            HarnessError::other(Step::GenerateCerts, "cannot read the client CA subject")
        })?;

        let sa_key = KeyPair::generate().map_err(cert_err("service-account key"))?;

        Ok(Pki {
            serving_ca_pem: serving_ca.pem(),
            serving: CertAndKey {
                cert_pem: serving_cert.pem(),
                key_pem: serving_key.serialize_pem(),
            },
            client_ca_pem: client_ca.pem(),
            client_ca_subject,
            client_ca_key,
            sa_key,
        })
    }

    /// Writes the files kube-apiserver reads into `dir`.
    pub fn write(&self, dir: &Path) -> Result<PkiFiles, HarnessError> {
        let files = PkiFiles {
            serving_ca: dir.join("serving-ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            client_ca: dir.join("client-ca.crt"),
            sa_public: dir.join("sa.pub"),
            sa_private: dir.join("sa.key"),
        };
        let write = |path: &Path, data: &str| {
            std::fs::write(path, data).map_err(|e| {
                HarnessError::io(Step::GenerateCerts, format!("write {}", path.display()), e)
            })
        };
        write(&files.serving_ca, &self.serving_ca_pem)?;
        write(&files.serving_cert, &self.serving.cert_pem)?;
        write(&files.serving_key, &self.serving.key_pem)?;
        write(&files.client_ca, &self.client_ca_pem)?;
        write(&files.sa_public, &self.sa_key.public_key_pem())?;
        write(&files.sa_private, &self.sa_key.serialize_pem())?;
        Ok(files)
    }

    /// A client certificate for `user` in `groups`, signed by the client CA.
    pub fn client_cert(&self, user: &str, groups: &[&str]) -> Result<CertAndKey, HarnessError> {
        if user.is_empty() {
            return Err(HarnessError::other(
                Step::GenerateCerts,
                "a client certificate needs a non-empty user name",
            ));
        }
        let key = KeyPair::generate().map_err(cert_err("client key"))?;
        let der = client_cert_der(
            &self.client_ca_subject,
            &self.client_ca_key,
            &key.subject_public_key_info(),
            user,
            groups,
        )
        .map_err(cert_err("sign client cert"))?;
        Ok(CertAndKey {
            cert_pem: pem("CERTIFICATE", &der),
            key_pem: key.serialize_pem(),
        })
    }
}

/// X.509 v3 client certificate: subject `O=<group>...,CN=<user>`, clientAuth only.
fn client_cert_der(
    issuer_subject: &[u8],
    issuer_key: &KeyPair,
    subject_spki: &[u8],
    user: &str,
    groups: &[&str],
) -> Result<Vec<u8>, rcgen::Error> {
    const ECDSA_WITH_SHA256: &[u64] = &[1, 2, 840, 10045, 4, 3, 2];
    const ORGANIZATION: &[u64] = &[2, 5, 4, 10];
    const COMMON_NAME: &[u64] = &[2, 5, 4, 3];
    const KEY_USAGE: &[u64] = &[2, 5, 29, 15];
    const EXT_KEY_USAGE: &[u64] = &[2, 5, 29, 37];
    const BASIC_CONSTRAINTS: &[u64] = &[2, 5, 29, 19];
    const CLIENT_AUTH: &[u64] = &[1, 3, 6, 1, 5, 5, 7, 3, 2];

    let attribute = |oid: &[u64], value: &str| {
        der::set(&[&der::sequence(&[&der::oid(oid), &der::utf8_string(value)])])
    };
    let mut rdns: Vec<Vec<u8>> = groups.iter().map(|g| attribute(ORGANIZATION, g)).collect();
    rdns.push(attribute(COMMON_NAME, user));
    let rdn_refs: Vec<&[u8]> = rdns.iter().map(Vec::as_slice).collect();
    let subject = der::sequence(&rdn_refs);

    let signature_alg = der::sequence(&[&der::oid(ECDSA_WITH_SHA256)]);
    let extension = |oid: &[u64], critical: bool, value: &[u8]| {
        if critical {
            der::sequence(&[
                &der::oid(oid),
                &der::boolean_true(),
                &der::octet_string(value),
            ])
        } else {
            der::sequence(&[&der::oid(oid), &der::octet_string(value)])
        }
    };
    // digitalSignature is bit 0: one byte 0x80 with 7 unused bits.
    let key_usage = extension(KEY_USAGE, true, &der::bit_string(7, &[0x80]));
    let ext_key_usage = extension(
        EXT_KEY_USAGE,
        false,
        &der::sequence(&[&der::oid(CLIENT_AUTH)]),
    );
    let basic_constraints = extension(BASIC_CONSTRAINTS, true, &der::sequence(&[]));
    let extensions = der::explicit(
        3,
        &der::sequence(&[&key_usage, &ext_key_usage, &basic_constraints]),
    );

    // Validity is wide on purpose: the PKI lives as long as one test run.
    let validity = der::sequence(&[
        &der::utc_time("000101000000Z"),
        &der::generalized_time("99991231235959Z"),
    ]);

    let tbs = der::sequence(&[
        &der::explicit(0, &der::unsigned_integer(&[2])),
        &der::unsigned_integer(&random_serial()),
        &signature_alg,
        issuer_subject,
        &validity,
        &subject,
        subject_spki,
        &extensions,
    ]);
    let signature = issuer_key.sign(&tbs)?;
    Ok(der::sequence(&[
        &tbs,
        &signature_alg,
        &der::bit_string(0, &signature),
    ]))
}

/// 16 random bytes, positive, with a non-zero first byte so the DER INTEGER is 16 bytes.
fn random_serial() -> [u8; 16] {
    let mut out = [0u8; 16];
    for chunk in out.chunks_mut(8) {
        // RandomState is seeded from the OS; each instance differs.
        let mut hasher = RandomState::new().build_hasher();
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        chunk.copy_from_slice(&hasher.finish().to_be_bytes());
    }
    out[0] = (out[0] & 0x7F) | 0x40;
    out
}

fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pem_der(pem: &str) -> Vec<u8> {
        use base64::Engine as _;
        let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD
            .decode(body)
            .unwrap()
    }

    #[test]
    fn client_cert_names_issuer_and_every_group() {
        let pki = Pki::generate().unwrap();
        let cert = pki
            .client_cert("alice", &["team-a", "system:masters"])
            .unwrap();
        assert!(cert.cert_pem.starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert!(cert.key_pem.contains("PRIVATE KEY"));
        let der = pem_der(&cert.cert_pem);
        // The whole certificate parses as one DER element with nothing trailing.
        assert_eq!(der::read(&der).unwrap().whole.len(), der.len());
        let subject = der::certificate_subject(&der).unwrap();
        let has = |needle: &[u8]| subject.windows(needle.len()).any(|w| w == needle);
        assert!(has(&der::utf8_string("team-a")));
        assert!(has(&der::utf8_string("system:masters")));
        assert!(has(&der::utf8_string("alice")));
        // The issuer is the CA subject byte for byte.
        let issuer_pos = der
            .windows(pki.client_ca_subject.len())
            .position(|w| w == pki.client_ca_subject.as_slice());
        assert!(issuer_pos.is_some());
    }

    #[test]
    fn empty_user_is_an_error() {
        let pki = Pki::generate().unwrap();
        let err = pki.client_cert("", &[]).err().unwrap();
        assert_eq!(err.step(), Step::GenerateCerts);
    }

    #[test]
    fn serials_differ() {
        assert_ne!(random_serial(), random_serial());
    }
}
