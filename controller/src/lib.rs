//! The nodeipam controller: pure allocation and selection, and the reconcile loops that apply them.

pub mod app;
pub mod cidrset;
pub mod cli;
pub mod client;
pub mod duration;
pub mod health;
pub mod ipam;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod node;
pub mod outcome;
pub mod podnetwork;
pub mod ranges;
pub mod ratelimit;
pub mod reconcile;
pub mod selection;
pub mod status;
pub mod version;
