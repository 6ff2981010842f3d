//! The nodeipam controller: pure allocation and selection, and the reconcile loops that apply them.

pub mod app;
pub mod cidrset;
pub mod cli;
pub mod ipam;
pub mod metrics;
pub mod node;
pub mod outcome;
pub mod podnetwork;
pub mod ranges;
pub mod ratelimit;
pub mod reconcile;
pub mod selection;
pub mod status;
