//! The nodeipam controller: pure allocation and selection, and the reconcile loops that apply them.

pub mod cidrset;
pub mod ipam;
pub mod metrics;
pub mod outcome;
pub mod reconcile;
pub mod selection;
pub mod status;
