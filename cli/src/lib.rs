//! `kubectl nodeipam`: a kubectl plugin that reads the cluster with the user's kubeconfig and
//! prints the pod network (`ranges`), the controller's state (`status`) and every
//! inconsistency between nodes, configs, Service ranges and published outputs (`check`), and
//! converts node-ipam-controller's ClusterCIDRs into NodeIPAMConfigs (`migrate clustercidr`),
//! which it creates with `--apply`: the one command that writes.
//! A shell around pure decisions: `nodeipam_alloc::check`, `nodeipam_controller::ranges` (the
//! rules the controller itself keeps) and this crate's `clustercidr`.

pub mod args;
pub mod clustercidr;
pub mod complete;
pub mod migrate;
pub mod read;
pub mod report;
pub mod status;
