//! The allocation core, pure: no kube client, no tokio, no clock (this crate depends on none
//! of them, so it cannot name them). The bitmaps (`cidrset`), the allocation state (`ipam`),
//! config selection, write outcomes, status, the pod network, the leadership rules
//! (`lease`), the seal of a take-over (`seal`) and the preconditions of our other writes (`fence`) are decided here, and `machine` puts them together behind one
//! `handle(input) -> effects`. `check` recounts a cluster read from the API by the same
//! rules, for the command line.

pub mod check;
pub mod cidrset;
pub mod effects;
pub mod fence;
pub mod fixtures;
pub mod ipam;
pub mod lease;
pub mod machine;
pub mod node;
pub mod outcome;
pub mod outputs;
pub mod podnetwork;
pub mod pool;
pub mod seal;
pub mod selection;
pub mod status;
