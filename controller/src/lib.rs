//! The nodeipam controller: pure allocation and selection, and the reconcile loops that apply them.

pub mod cidrset;
