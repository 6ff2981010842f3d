//! The nodeipam controller: the pure allocation core (`alloc`), and the API side that feeds it
//! facts and carries out its effects (`reconcile`).

pub mod api_metrics;
pub mod app;
pub mod cli;
pub mod client;
/// Go durations, shared with the pool API's `scaleDown.emptyFor`.
pub use nodeipam_crd::duration;
pub mod health;
pub mod kubeconfig;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod node_lists;
pub mod process_metrics;
pub mod ranges;
pub mod ratelimit;
pub mod reconcile;
pub mod startup;
pub mod version;

/// The pure allocation core lives in its own crate, which can name neither tokio nor kube's
/// client; under these names for the code that uses it.
pub use nodeipam_alloc as alloc;
pub use nodeipam_alloc::node;
