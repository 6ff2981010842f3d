//! The control-plane harness: starts etcd and kube-apiserver on loopback for tests, and a
//! fault-injecting proxy to put in front of the API server ([`fault_proxy`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), nodeipam_testenv::HarnessError> {
//! let cp = nodeipam_testenv::ControlPlane::start().await?;
//! let client = cp.client(); // admin (system:masters)
//! let alice = cp.client_for("alice", &["team-a"]).await?; // RBAC applies
//! # let _ = (client, alice);
//! cp.stop().await;
//! # Ok(()) }
//! ```

mod assets;
mod certs;
mod control_plane;
mod crds;
mod der;
mod error;
pub mod fault_proxy;
mod kubeconfig;
pub mod kubelet;
mod ports;
mod process;
mod webhook;
pub mod yaml;

pub use assets::{
    ETCD_VERSION, K8S_VERSION, default_assets_dir, default_etcdutl_path, default_helm_path,
};
pub use control_plane::{
    ControlPlane, ControlPlaneBuilder, StartupTimings, crd_dir, workspace_root,
};
pub use error::{HarnessError, Step};
pub use fault_proxy::FaultProxy;
