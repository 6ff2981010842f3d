//! `kubectl nodeipam`: a kubectl plugin that reads the cluster with the user's kubeconfig and
//! prints the pod network (`ranges`), the controller's state (`status`) and every
//! inconsistency between nodes, configs, Service ranges and published outputs (`check`).
//! A shell only: what it reports is decided by `nodeipam_alloc::check` and
//! `nodeipam_controller::ranges`, the rules the controller itself keeps.

pub mod args;
pub mod complete;
pub mod read;
pub mod report;
pub mod status;
