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

use crate::contender::Settings;
use crate::procstat;

pub const CLUSTER_CIDR: &str = "10.0.0.0/8";
pub const MASK: u8 = 24;
/// The harness's `--service-cluster-ip-range`; kcm and the floor keep it out, nodeipam reads it
/// from the `kubernetes` ServiceCIDR object.
pub const SERVICE_RANGE: &str = "10.96.0.0/16";
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
            mask: MASK,
            service_range: SERVICE_RANGE.into(),
            nodeipam_bin: self.nodeipam.clone(),
            kcm_bin: assets.join("kube-controller-manager"),
        }
    }

    pub async fn control_plane(&self) -> anyhow::Result<(ControlPlane, f64)> {
        let began = Instant::now();
        let mut builder = ControlPlane::builder().service_cluster_ip_range(SERVICE_RANGE);
        if let Some(a) = &self.assets {
            builder = builder.assets_dir(a);
        }
        let cp = builder
            .start()
            .await
            .context("starting the control plane")?;
        Ok((cp, began.elapsed().as_secs_f64()))
    }
}

/// The one NodeIPAMConfig nodeipam allocates from: 10.0.0.0/8, a /24 per node. With
/// `finalizer`, it carries nodeipam's finalizer already, as a restarted controller finds it.
pub async fn create_config(client: &kube::Client, finalizer: bool) -> anyhow::Result<()> {
    let mut meta = json!({ "name": CONFIG_NAME });
    if finalizer {
        meta["finalizers"] = json!([nodeipam_crd::FINALIZER]);
    }
    let config: NodeIPAMConfig = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "NodeIPAMConfig",
        "metadata": meta,
        "spec": { "ipv4": { "cidr": CLUSTER_CIDR, "perNodeMaskSize": MASK } },
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
