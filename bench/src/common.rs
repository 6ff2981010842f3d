//! What the burst and start-up benchmarks share: their flags, a fresh control plane, the
//! NodeIPAMConfig nodeipam allocates from, and the CPU of the API server and etcd.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use kube::Api;
use kube::api::PostParams;
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_testenv::ControlPlane;
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::audit;
use crate::contender::{Kind, Settings};
use crate::procstat;

pub const CLUSTER_CIDR: &str = "10.0.0.0/8";
pub const MASK: u8 = 24;
/// The control plane's `--service-cluster-ip-range`, outside the cluster CIDR: nodeipam's
/// webhook refuses a pod range that overlaps a Service range, as it should. kcm and the floor
/// are told it all the same.
pub const SERVICE_RANGE: &str = "172.30.0.0/16";
pub const CONFIG_NAME: &str = "bench";

#[derive(Debug, Clone, clap::Args)]
pub struct CommonArgs {
    /// `--kube-api-qps` of every contender (nodeipam's write limit; kcm's client limit; the
    /// floor's patch limit).
    #[arg(long, default_value_t = 500.0)]
    pub qps: f64,
    /// `--kube-api-burst` of every contender.
    #[arg(long, default_value_t = 1000)]
    pub burst: u32,
    /// The per-node mask of every contender (kcm takes at most 16 bits more than the /8: 24).
    #[arg(long, default_value_t = MASK)]
    pub mask: u8,
    /// nodeipam's `--write-concurrency` and the floor's patches in flight (kcm has 30 workers).
    #[arg(long, default_value_t = 16)]
    pub write_concurrency: usize,
    /// The `nodeipam` binary (a release build).
    #[arg(long)]
    pub nodeipam: PathBuf,
    /// Folder of kube-apiserver, etcd and kube-controller-manager (default: the harness's).
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// Folder for the contenders' logs.
    #[arg(long)]
    pub work: PathBuf,
}

impl CommonArgs {
    pub fn settings(&self) -> Settings {
        let assets = self
            .assets
            .clone()
            .unwrap_or_else(nodeipam_testenv::default_assets_dir);
        Settings {
            qps: self.qps,
            burst: self.burst,
            write_concurrency: self.write_concurrency,
            cluster_cidr: CLUSTER_CIDR.into(),
            mask: self.mask,
            service_range: SERVICE_RANGE.into(),
            nodeipam_bin: self.nodeipam.clone(),
            kcm_bin: assets.join("kube-controller-manager"),
            webhook_port: 0,
            replica: None,
        }
    }

    /// A fresh control plane that audits the contender's requests, and the contender's
    /// kubeconfig (its own identity, a cluster admin).
    pub async fn control_plane(&self) -> anyhow::Result<(ControlPlane, Contender, f64)> {
        let began = Instant::now();
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos();
        let dir = self.work.join(format!("audit-{stamp}"));
        let audit = audit::files(&dir)?;
        let mut builder = ControlPlane::builder().service_cluster_ip_range(SERVICE_RANGE);
        for arg in &audit.args {
            builder = builder.apiserver_arg(arg);
        }
        if let Some(a) = &self.assets {
            builder = builder.assets_dir(a);
        }
        let cp = builder
            .start()
            .await
            .context("starting the control plane")?;
        let kubeconfig = dir.join("contender.kubeconfig");
        cp.write_kubeconfig_for(audit::CONTENDER_USER, &["system:masters"], &kubeconfig)
            .context("writing the contender's kubeconfig")?;
        let contender = Contender {
            kubeconfig,
            audit_log: audit.log,
        };
        Ok((cp, contender, began.elapsed().as_secs_f64()))
    }
}

/// How a contender reaches the control plane, and where its requests are counted.
pub struct Contender {
    pub kubeconfig: PathBuf,
    pub audit_log: PathBuf,
}

impl Contender {
    pub fn requests(&self) -> anyhow::Result<audit::Requests> {
        audit::count_file(&self.audit_log)
    }
}

/// What `kind` needs in the cluster before it starts: nodeipam's config (with our finalizer
/// as a restarted controller finds it when `finalizer`); for the default install also its
/// namespace and its webhook, registered by URL as `config/webhook` declares it.
pub async fn prepare(
    admin: &kube::Client,
    kind: Kind,
    settings: &mut Settings,
    finalizer: bool,
) -> anyhow::Result<()> {
    match kind {
        Kind::Nodeipam => create_config(admin, finalizer, settings.mask).await,
        // Its webhook refuses every config until it answers: the config comes after the
        // start (`create_config_once_admitted`), as a user's does.
        Kind::NodeipamDefault | Kind::NodeipamUpdated | Kind::NodeipamPool => {
            install_default(admin, settings).await
        }
        _ => Ok(()),
    }
}

/// The Lease of the default install (namespace and name as `nodeipam run` defaults them).
pub const LEASE: &str = "nodeipam-controller";

/// Deletes the default install's Lease and waits until it is gone: the next replica starts as
/// on a first install. (A leader killed with writes in flight leaves its finalizer on the
/// Lease; then it never goes, and the run stops saying so.)
pub async fn delete_lease(admin: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    let api: Api<Lease> = Api::namespaced(admin.clone(), nodeipam_webhook::DEFAULT_NAMESPACE);
    match api.delete(LEASE, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e).context("deleting the lease"),
    }
    for _ in 0..100 {
        match api.get_opt(LEASE).await.context("reading the lease")? {
            None => return Ok(()),
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    anyhow::bail!(
        "the lease {LEASE} was deleted but is still there after 10 s (a finalizer: {:?})",
        api.get_opt(LEASE)
            .await
            .ok()
            .flatten()
            .map(|l| l.metadata.finalizers)
    )
}

/// Takes our finalizer off the bench config, as on a first install over nodes that already
/// hold podCIDRs (moving off kcm): nothing says nodeipam ever allocated from it, so a first
/// leader on a missing Lease has no predecessor's writes to wait for. With the finalizer (a
/// previous round's), a missing Lease means one deleted under a live leader, and the leader
/// rightly waits a whole term and its longest write first (`nodeipam_alloc::lease::wait`).
pub async fn unfinalize_config(admin: &kube::Client) -> anyhow::Result<()> {
    let api = Api::<NodeIPAMConfig>::all(admin.clone());
    let patch = json!({ "metadata": { "finalizers": null } });
    api.patch(
        CONFIG_NAME,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .context("taking the finalizer off the bench config")?;
    Ok(())
}

/// For `nodeipam-updated`: the replica a rolling update replaces. It starts as installed
/// (with the admin's identity, so that its requests are not the timed contender's), leads,
/// gets the config ready when `config` (created as a user does, after the start), and stops
/// on SIGTERM as a Deployment's old pod does. It must hand over settled, or the run would not
/// measure what it says.
pub async fn predecessor(
    cp: &ControlPlane,
    settings: &Settings,
    work: &std::path::Path,
    log_name: &str,
    config: bool,
) -> anyhow::Result<()> {
    let (admin, admin_kubeconfig) = (&cp.client(), cp.kubeconfig_path());
    let mut s = settings.clone();
    s.replica = Some("bench-previous".into());
    let log = format!("previous-{log_name}");
    let mut proc =
        crate::contender::spawn(Kind::NodeipamDefault, &s, admin_kubeconfig, work, &log)?;
    proc.wait_synced(std::time::Duration::from_secs(300))
        .await?;
    if config {
        create_config_once_admitted(admin, s.mask).await?;
        wait_config_ready(admin).await?;
    }
    let log = proc.log.clone();
    proc.stop().await?;
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if !text.contains("every write answered") {
        anyhow::bail!(
            "the replica replaced in a rolling update did not hand over settled; see {}",
            log.display()
        );
    }
    Ok(())
}

/// Until the config carries our finalizer: the leader has taken it on.
async fn wait_config_ready(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<NodeIPAMConfig> = Api::all(client.clone());
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    while Instant::now() < deadline {
        let config = api.get_opt(CONFIG_NAME).await?;
        let finalizers = config
            .and_then(|c| c.metadata.finalizers)
            .unwrap_or_default();
        if finalizers.iter().any(|f| f == nodeipam_crd::FINALIZER) {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    anyhow::bail!("the config never got the controller's finalizer")
}

/// What a user creates right after installing: the config, or for `nodeipam-pool` the pool.
pub async fn create_allocation_source(
    client: &kube::Client,
    kind: Kind,
    mask: u8,
) -> anyhow::Result<()> {
    match kind {
        Kind::NodeipamPool => retry_while_webhook_starts(|| create_pool(client, mask)).await,
        _ => create_config_once_admitted(client, mask).await,
    }
}

/// Retries `create` while the (fail-closed) webhook is not answering yet.
async fn retry_while_webhook_starts<F, Fut>(mut create: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match create().await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline && format!("{e:#}").contains("webhook") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The pool of `nodeipam-pool`: all of the cluster CIDR as its budget, ranges of 256 blocks.
pub async fn create_pool(client: &kube::Client, mask: u8) -> anyhow::Result<()> {
    use nodeipam_crd::NodeIPAMPool;
    let pool: NodeIPAMPool = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMPool",
        "metadata": { "name": CONFIG_NAME },
        "spec": {
            "ipv4": { "cidrs": [CLUSTER_CIDR], "rangeMaskSize": mask - 8, "perNodeMaskSize": mask },
            "ranges": { "min": 1, "max": 256 },
            "headroom": { "blocks": 16 },
        },
    }))
    .context("the NodeIPAMPool literal")?;
    Api::<NodeIPAMPool>::all(client.clone())
        .create(&PostParams::default(), &pool)
        .await
        .context("creating the NodeIPAMPool")?;
    Ok(())
}

/// Creates the config as a user does right after installing: without our finalizer, retried
/// until the webhook (fail-closed) admits it.
pub async fn create_config_once_admitted(client: &kube::Client, mask: u8) -> anyhow::Result<()> {
    let deadline = Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match create_config(client, false, mask).await {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() < deadline && format!("{e:#}").contains("webhook") => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The namespace and the webhook registration of the default install.
pub async fn install_default(admin: &kube::Client, settings: &mut Settings) -> anyhow::Result<()> {
    namespace(admin, nodeipam_webhook::DEFAULT_NAMESPACE).await?;
    settings.webhook_port = free_port()?;
    register_webhook(admin, settings.webhook_port).await
}

pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

pub async fn namespace(admin: &kube::Client, name: &str) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Namespace;
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating namespace {name}")),
    }
}

/// The ValidatingWebhookConfiguration of `config/webhook`, reaching the webhook by URL.
async fn register_webhook(admin: &kube::Client, port: u16) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let path = nodeipam_testenv::workspace_root().join("config/webhook/manifests.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut vwc: ValidatingWebhookConfiguration =
        serde_saphyr::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    for hook in vwc.webhooks.iter_mut().flatten() {
        let service_path = hook
            .client_config
            .service
            .take()
            .and_then(|s| s.path)
            .context("the webhook manifest names no path")?;
        hook.client_config.url = Some(format!("https://127.0.0.1:{port}{service_path}"));
    }
    Api::<ValidatingWebhookConfiguration>::all(admin.clone())
        .create(&PostParams::default(), &vwc)
        .await
        .context("registering the webhook")?;
    Ok(())
}

/// The one NodeIPAMConfig nodeipam allocates from: 10.0.0.0/8, a /24 per node. With
/// `finalizer`, it carries nodeipam's finalizer already, as a restarted controller finds it.
pub async fn create_config(client: &kube::Client, finalizer: bool, mask: u8) -> anyhow::Result<()> {
    let mut meta = json!({ "name": CONFIG_NAME });
    if finalizer {
        meta["finalizers"] = json!([nodeipam_crd::FINALIZER]);
    }
    let config: NodeIPAMConfig = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": meta,
        "spec": { "ipv4": { "cidr": CLUSTER_CIDR, "perNodeMaskSize": mask } },
    }))
    .context("the NodeIPAMConfig literal")?;
    Api::<NodeIPAMConfig>::all(client.clone())
        .create(&PostParams::default(), &config)
        .await
        .context("creating the NodeIPAMConfig")?;
    Ok(())
}

/// CPU seconds of the harness's kube-apiserver and etcd, for the load a contender puts on them.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct ServerCpu {
    pub apiserver_s: f64,
    pub etcd_s: f64,
}

pub fn server_cpu() -> anyhow::Result<ServerCpu> {
    let cpu = |comm: &str| -> anyhow::Result<f64> {
        let pid = procstat::child_named(comm).with_context(|| format!("no {comm} child"))?;
        Ok(procstat::sample(pid)?.cpu_s)
    };
    Ok(ServerCpu {
        apiserver_s: cpu("kube-apiserver")?,
        etcd_s: cpu("etcd")?,
    })
}

impl std::ops::Sub for ServerCpu {
    type Output = ServerCpu;
    fn sub(self, rhs: ServerCpu) -> ServerCpu {
        ServerCpu {
            apiserver_s: self.apiserver_s - rhs.apiserver_s,
            etcd_s: self.etcd_s - rhs.etcd_s,
        }
    }
}

/// Rounds to `digits` decimals, for readable JSON.
pub fn dec(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
