use super::*;

fn kubeconfig(current: &str, server: &str, user: &str) -> Kubeconfig {
    Kubeconfig::from_yaml(&format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: {current}\n\
         contexts:\n- name: {current}\n  context: {{cluster: {current}, user: {user}, namespace: ns1}}\n\
         clusters:\n- name: {current}\n  cluster: {{server: '{server}', certificate-authority-data: Zm9v}}\n\
         users:\n- name: {user}\n  user: {{token: secret-{user}}}\n"
    ))
    .expect("kubeconfig")
}

/// A folder of its own under the system's temporary folder, removed on drop.
struct Dir(PathBuf);
impl Dir {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("nodeipam-kc-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        Dir(dir)
    }
}
impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cluster_of(kc: &Kubeconfig) -> Cluster {
    kc.clusters[0].cluster.clone().expect("cluster")
}

fn user_of(kc: &Kubeconfig) -> AuthInfo {
    kc.auth_infos[0].auth_info.clone().expect("user")
}

#[test]
fn the_flag_wins_then_the_list_then_home() {
    let home = Path::new("/home/u");
    assert_eq!(
        files(Some(Path::new("/a")), Some(OsStr::new("/b")), Some(home)),
        Files::Flag("/a".into())
    );
    assert_eq!(
        files(None, Some(OsStr::new("/b::/c")), Some(home)),
        Files::Env(vec!["/b".into(), "/c".into()])
    );
    assert_eq!(
        files(None, Some(OsStr::new("")), Some(home)),
        Files::Home(Some("/home/u/.kube/config".into()))
    );
    assert_eq!(files(None, None, None), Files::Home(None));
}

#[test]
fn a_missing_file_of_the_list_is_skipped_and_the_first_to_set_a_key_wins() {
    let dir = Dir::new("merge");
    let first = dir.0.join("first");
    let second = dir.0.join("second");
    let yaml = |kc: &Kubeconfig| serde_json::to_string(kc).expect("json");
    std::fs::write(&first, yaml(&kubeconfig("one", "https://one:443", "u1"))).expect("write");
    std::fs::write(&second, yaml(&kubeconfig("two", "https://two:443", "u1"))).expect("write");
    let missing = dir.0.join("missing");
    let merged = load(&Files::Env(vec![missing.clone(), first, second]))
        .expect("loads")
        .expect("some file");
    assert_eq!(merged.current_context.as_deref(), Some("one"));
    assert_eq!(merged.contexts.len(), 2);
    assert!(
        load(&Files::Env(vec![missing.clone()]))
            .expect("loads")
            .is_none()
    );
    // The flag's file must be there; the message is one line naming it.
    let e = load(&Files::Flag(missing.clone()))
        .expect_err("missing")
        .to_string();
    assert_eq!(e.matches(&missing.display().to_string()).count(), 1, "{e}");
    assert!(e.starts_with("--kubeconfig=") && !e.contains('\n'), "{e}");
    let bad = dir.0.join("bad");
    std::fs::write(&bad, "clusters: 7\n").expect("write");
    let e = load(&Files::Env(vec![bad.clone()]))
        .expect_err("bad")
        .to_string();
    assert!(e.contains(&bad.display().to_string()), "{e}");
}

#[test]
fn the_flags_lay_over_the_selected_context() {
    let kc = kubeconfig("one", "https://one:443", "u1");
    let plain = select(Some(kc.clone()), &Overrides::default()).expect("selects");
    assert_eq!(
        cluster_of(&plain).server.as_deref(),
        Some("https://one:443")
    );
    assert_eq!(
        plain.contexts[0]
            .context
            .as_ref()
            .and_then(|c| c.namespace.as_deref()),
        Some("ns1")
    );
    let o = Overrides {
        server: Some("https://two:6443".into()),
        token: Some("t".into()),
        insecure_skip_tls_verify: true,
        impersonate: Some("alice".into()),
        impersonate_groups: vec!["g1".into(), "g2".into()],
        ..Overrides::default()
    };
    let over = select(Some(kc), &o).expect("selects");
    let cluster = cluster_of(&over);
    assert_eq!(cluster.server.as_deref(), Some("https://two:6443"));
    assert_eq!(cluster.insecure_skip_tls_verify, Some(true));
    assert_eq!(cluster.certificate_authority_data, None);
    let user = user_of(&over);
    assert_eq!(user.impersonate.as_deref(), Some("alice"));
    assert_eq!(
        user.impersonate_groups,
        Some(vec!["g1".to_string(), "g2".to_string()])
    );
    assert!(user.token.is_some());
}

#[test]
fn flags_alone_name_a_server() {
    let o = Overrides {
        server: Some("https://127.0.0.1:6443".into()),
        certificate_authority: Some("/ca.pem".into()),
        client_certificate: Some("/c.pem".into()),
        client_key: Some("/k.pem".into()),
        ..Overrides::default()
    };
    let kc = select(None, &o).expect("selects");
    let cluster = cluster_of(&kc);
    assert_eq!(cluster.certificate_authority.as_deref(), Some("/ca.pem"));
    let user = user_of(&kc);
    assert_eq!(user.client_certificate.as_deref(), Some("/c.pem"));
    assert_eq!(user.client_key.as_deref(), Some("/k.pem"));
    let e = select(None, &Overrides::default()).expect_err("no server");
    assert!(e.to_string().contains("--server"), "{e}");
}

#[test]
fn a_name_not_in_the_kubeconfig_is_named_with_its_flag() {
    let kc = kubeconfig("one", "https://one:443", "u1");
    for (o, flag) in [
        (
            Overrides {
                context: Some("nope".into()),
                ..Overrides::default()
            },
            "--context=nope",
        ),
        (
            Overrides {
                cluster: Some("nope".into()),
                ..Overrides::default()
            },
            "--cluster=nope",
        ),
        (
            Overrides {
                user: Some("nope".into()),
                ..Overrides::default()
            },
            "--user=nope",
        ),
    ] {
        let e = select(Some(kc.clone()), &o).expect_err(flag).to_string();
        assert!(e.starts_with(flag), "{e}");
    }
}

#[test]
fn request_timeouts_read_as_kubectl_reads_them() {
    assert_eq!(parse_request_timeout("5"), Ok(Duration::from_secs(5)));
    assert_eq!(parse_request_timeout("1m30s"), Ok(Duration::from_secs(90)));
    assert_eq!(parse_request_timeout("0"), Ok(Duration::ZERO));
    assert!(parse_request_timeout("soon").is_err());
}
