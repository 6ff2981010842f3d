//! Unit tests of certificate generation, reading back and the rotation plan.

use std::time::Duration;

use x509_parser::prelude::FromDer;

use super::*;
use crate::tls::certified_key;

const MIN: Duration = Duration::from_secs(60);

fn policy() -> Policy {
    Policy {
        names: vec!["webhook.ns.svc".into(), "127.0.0.1".into()],
        validity: 60 * MIN,
        ca_validity: 600 * MIN,
        rotate_before: 10 * MIN,
    }
}

fn t0() -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap()
}

fn after(d: Duration) -> OffsetDateTime {
    t0() + time::Duration::try_from(d).unwrap()
}

fn fresh() -> Material {
    let p = policy();
    let plan = plan(None, &p, t0(), false);
    assert!(matches!(plan, Plan::NewCa(_)), "{plan:?}");
    execute(&plan, None, &p, t0()).expect("generate")
}

fn ca_count(m: &Material) -> usize {
    parse_pems(&m.ca_bundle).unwrap().len()
}

#[test]
fn fresh_material_is_kept_and_loads_into_rustls() {
    let m = fresh();
    assert_eq!(plan(Some(&m), &policy(), t0(), false), Plan::Keep);
    assert_eq!(ca_count(&m), 1);
    certified_key(m.cert.as_bytes(), m.key.as_bytes()).expect("rustls loads it");
    assert_eq!(
        cert_not_after(&m.cert).unwrap(),
        t0().unix_timestamp() + 3600
    );
}

#[test]
fn the_certificate_covers_dns_names_and_ip_addresses() {
    let m = fresh();
    let block = &parse_pems(&m.cert).unwrap()[0];
    let (_, x509) = X509Certificate::from_der(&block.pem.contents).unwrap();
    let mut names = sans(&x509);
    names.sort();
    assert_eq!(names, vec!["127.0.0.1", "webhook.ns.svc"]);
    assert!(!x509.is_ca());
}

#[test]
fn forcing_issues_a_new_certificate_from_the_same_ca() {
    let m = fresh();
    let p = plan(Some(&m), &policy(), t0(), true);
    assert_eq!(p, Plan::IssueCert("rotation requested".into()));
    let n = execute(&p, Some(&m), &policy(), t0()).unwrap();
    assert_ne!(n.cert, m.cert);
    assert_ne!(n.key, m.key);
    assert_eq!(n.ca_bundle, m.ca_bundle);
    assert_eq!(n.ca_key, m.ca_key);
    assert_eq!(plan(Some(&n), &policy(), t0(), false), Plan::Keep);
}

#[test]
fn a_certificate_close_to_expiry_is_reissued() {
    let m = fresh();
    assert_eq!(
        plan(Some(&m), &policy(), after(49 * MIN), false),
        Plan::Keep
    );
    let now = after(51 * MIN);
    let p = plan(Some(&m), &policy(), now, false);
    assert_eq!(p, Plan::IssueCert("certificate expires soon".into()));
    let n = execute(&p, Some(&m), &policy(), now).unwrap();
    assert_eq!(plan(Some(&n), &policy(), now, false), Plan::Keep);
}

#[test]
fn new_names_get_a_new_certificate() {
    let m = fresh();
    let mut p = policy();
    p.names.push("other.ns.svc".into());
    assert!(
        matches!(plan(Some(&m), &p, t0(), false), Plan::IssueCert(r) if r.contains("other.ns.svc"))
    );
    // DNS case does not matter, and fewer names than covered is fine.
    let mut p = policy();
    p.names = vec!["WEBHOOK.ns.svc".into()];
    assert_eq!(plan(Some(&m), &p, t0(), false), Plan::Keep);
}

#[test]
fn a_ca_close_to_expiry_is_replaced_and_the_old_one_stays_trusted() {
    let m = fresh();
    let now = after(591 * MIN);
    let p = plan(Some(&m), &policy(), now, false);
    assert_eq!(p, Plan::NewCa("CA expires soon".into()));
    let n = execute(&p, Some(&m), &policy(), now).unwrap();
    assert_ne!(n.ca_key, m.ca_key);
    assert_eq!(
        ca_count(&n),
        2,
        "old CA still valid, so still in the bundle"
    );
    assert!(n.ca_bundle.ends_with(&m.ca_bundle));
    assert_eq!(plan(Some(&n), &policy(), now, false), Plan::Keep);

    // Once the old CA has expired, a later CA change drops it.
    let later = after(1190 * MIN);
    let p = plan(Some(&n), &policy(), later, false);
    assert!(matches!(p, Plan::NewCa(_)), "{p:?}");
    let o = execute(&p, Some(&n), &policy(), later).unwrap();
    assert_eq!(ca_count(&o), 2, "only the previous CA is still valid");
    assert!(!o.ca_bundle.contains(m.ca_bundle.trim()));
}

#[test]
fn broken_material_is_regenerated() {
    let m = fresh();
    let other = execute(&Plan::NewCa("x".into()), None, &policy(), t0()).unwrap();

    let mut bad = m.clone();
    bad.ca_bundle = "garbage".into();
    assert!(matches!(
        plan(Some(&bad), &policy(), t0(), false),
        Plan::NewCa(_)
    ));

    let mut bad = m.clone();
    bad.ca_key = other.ca_key.clone();
    assert!(
        matches!(plan(Some(&bad), &policy(), t0(), false), Plan::NewCa(r) if r.contains("CA key"))
    );

    let mut bad = m.clone();
    bad.key = other.key.clone();
    assert!(
        matches!(plan(Some(&bad), &policy(), t0(), false), Plan::IssueCert(r) if r.contains("key does not match"))
    );

    let mut bad = m.clone();
    bad.cert = other.cert.clone();
    bad.key = other.key.clone();
    assert!(
        matches!(plan(Some(&bad), &policy(), t0(), false), Plan::IssueCert(r) if r.contains("not signed"))
    );

    let mut bad = m.clone();
    bad.cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n".into();
    let p = plan(Some(&bad), &policy(), t0(), false);
    assert!(
        matches!(&p, Plan::IssueCert(r) if r.contains("unreadable")),
        "{p:?}"
    );
    let fixed = execute(&p, Some(&bad), &policy(), t0()).unwrap();
    assert_eq!(plan(Some(&fixed), &policy(), t0(), false), Plan::Keep);
}

#[test]
fn secret_data_round_trips_and_incomplete_data_is_none() {
    let m = fresh();
    let data = m.to_secret_data();
    assert_eq!(
        data.keys().cloned().collect::<Vec<_>>(),
        vec!["ca.crt", "ca.key", "tls.crt", "tls.key"]
    );
    assert_eq!(Material::from_secret_data(&data), Some(m.clone()));
    let mut partial = data.clone();
    partial.remove(TLS_KEY_KEY);
    assert_eq!(Material::from_secret_data(&partial), None);
    let mut binary = data;
    binary.insert(TLS_CRT_KEY.into(), ByteString(vec![0xff, 0xfe]));
    assert_eq!(Material::from_secret_data(&binary), None);
}

#[test]
fn debug_never_prints_keys() {
    let m = fresh();
    let shown = format!("{m:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(shown.contains("CERTIFICATE"));
}

#[test]
fn parse_pems_rejects_empty_and_unterminated_input() {
    assert!(parse_pems("").is_err());
    assert!(parse_pems("-----BEGIN CERTIFICATE-----\nAAAA").is_err());
}
