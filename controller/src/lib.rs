//! The nodeipam controller: the pure allocation core (`alloc`), and the API side that feeds it
//! facts and carries out its effects (`reconcile`).

pub mod alloc;
pub mod app;
pub mod cli;
pub mod client;
pub mod duration;
pub mod health;
pub mod logging;
pub mod metrics;
pub mod metrics_server;
pub mod node;
pub mod ranges;
pub mod ratelimit;
pub mod reconcile;
pub mod version;
