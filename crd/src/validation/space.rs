//! Who may hold which addresses, across objects: a `NodeIPAMPool`'s CIDRs against other pools,
//! Service ranges and the NodeIPAMConfigs that are not its children; a `NodeIPAMConfig`'s
//! ranges against the pools (inside a pool's space only as a child of that pool, and a child
//! only inside its pool). Pure; the webhook calls it with what it listed for the review, and what overlaps is
//! decided by [`crate::range`], as everywhere else.

use ipnet::IpNet;
use kube_core::ResourceExt;

use super::FieldError;
use crate::pool::{NodeIPAMPool, NodeIPAMPoolSpec, POOL_LABEL, PoolFamilySpec, is_child_of};
use crate::range::{Family, Ranges, claimed_cidr, describe, nesting};
use crate::types::NodeIPAMConfig;

/// A Service range pod ranges must stay out of, and where it comes from (e.g.
/// `ServiceCIDR "kubernetes"` or `--service-cidr`), for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceRangeRef<'a> {
    pub cidr: IpNet,
    pub source: &'a str,
}

/// One CIDR a pool names, even if invalid (see [`claimed_cidr`]), with where it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolCidr {
    pub family: Family,
    /// Index in `spec.<family>.cidrs`.
    pub index: usize,
    pub cidr: IpNet,
}

impl PoolCidr {
    /// `spec.ipv4.cidrs[2]`.
    pub fn path(&self) -> String {
        format!("spec.{}.cidrs[{}]", self.family.field(), self.index)
    }
}

impl PoolFamilySpec {
    /// The CIDRs this family names that parse at all, as written, with their index.
    pub fn claimed(&self) -> impl Iterator<Item = (usize, IpNet)> + '_ {
        self.cidrs
            .iter()
            .enumerate()
            .filter_map(|(i, c)| claimed_cidr(c).map(|net| (i, net)))
    }
}

impl NodeIPAMPoolSpec {
    /// Every CIDR the pool names, as written, IPv4 first. A CIDR of the other family in a
    /// family's list keeps its own family (it is refused by validation, but it names those
    /// addresses).
    pub fn claimed_cidrs(&self) -> Vec<PoolCidr> {
        let mut out = Vec::new();
        for family in Family::ALL {
            let spec = match family {
                Family::V4 => &self.ipv4,
                Family::V6 => &self.ipv6,
            };
            for (index, cidr) in spec.iter().flat_map(PoolFamilySpec::claimed) {
                out.push(PoolCidr {
                    family,
                    index,
                    cidr,
                });
            }
        }
        out
    }
}

/// Why a pool's space is only the controller's: what a refused config is told to do.
const POOL_SPACE_HINT: &str = "the controller carves the space of a pool into its own NodeIPAMConfigs; choose a range outside every NodeIPAMPool, or let the pool serve these nodes";

/// The conflicts of `pool`'s CIDRs (those `fresh` selects: on an update only the appended
/// ones, so a conflict admitted earlier never blocks other changes) with the CIDRs of other
/// `pools` (skipped by name), with Service ranges, and with every NodeIPAMConfig that is not
/// a child of `pool`. Each error is on the pool's `spec.<family>.cidrs[i]` and names the
/// other object.
pub fn pool_conflicts<'a>(
    pool: &NodeIPAMPool,
    fresh: impl Fn(&PoolCidr) -> bool,
    pools: impl IntoIterator<Item = &'a NodeIPAMPool>,
    configs: impl IntoIterator<Item = &'a NodeIPAMConfig>,
    services: &[ServiceRangeRef<'_>],
) -> Vec<FieldError> {
    let name = pool.name_any();
    let ours: Vec<PoolCidr> = pool
        .spec
        .claimed_cidrs()
        .into_iter()
        .filter(|c| fresh(c))
        .collect();
    let mut errors = Vec::new();
    if ours.is_empty() {
        return errors;
    }
    let mut pools: Vec<&NodeIPAMPool> =
        pools.into_iter().filter(|p| p.name_any() != name).collect();
    pools.sort_by_key(|p| p.name_any());
    let mut configs: Vec<&NodeIPAMConfig> = configs
        .into_iter()
        .filter(|c| !is_child_of(c, pool))
        .collect();
    configs.sort_by_key(|c| c.name_any());
    for mine in &ours {
        let at = mine.cidr;
        for other in &pools {
            for theirs in other.spec.claimed_cidrs() {
                if theirs.family != mine.family {
                    continue;
                }
                if let Some(how) = nesting(&at, &theirs.cidr) {
                    errors.push(FieldError::invalid(
                        mine.path(),
                        at,
                        format!(
                            "overlaps {} ({}) of NodeIPAMPool {:?} ({}); the CIDRs of NodeIPAMPools must not overlap",
                            theirs.cidr,
                            theirs.path(),
                            other.name_any(),
                            describe(&at, &theirs.cidr, how)
                        ),
                    ));
                }
            }
        }
        for config in &configs {
            let Some(theirs) = Ranges::claimed(&config.spec)
                .get(mine.family)
                .map(|r| r.cidr)
            else {
                continue;
            };
            if let Some(how) = nesting(&at, &theirs) {
                errors.push(FieldError::invalid(
                    mine.path(),
                    at,
                    format!(
                        "overlaps {theirs} (spec.{}.cidr) of NodeIPAMConfig {:?} ({}), which is not a child of this pool; a pool's CIDRs must be free of NodeIPAMConfigs it did not carve",
                        mine.family.field(),
                        config.name_any(),
                        describe(&at, &theirs, how)
                    ),
                ));
            }
        }
        for service in services {
            if let Some(how) = nesting(&at, &service.cidr) {
                errors.push(FieldError::invalid(
                    mine.path(),
                    at,
                    format!(
                        "overlaps the Service range {} of {} ({}); pod and Service ranges must not overlap",
                        service.cidr,
                        service.source,
                        describe(&at, &service.cidr, how)
                    ),
                ));
            }
        }
    }
    errors
}

/// The conflicts of `config`'s ranges (the families `check` selects, IPv4 first: on an update
/// only the changed ones) with the space of `pools`: a range that shares addresses with a
/// pool's CIDRs is refused unless the config is a child of that pool ([`is_child_of`]) and
/// the range lies inside one of that pool's CIDRs; and a child of a pool is refused when a
/// range lies outside the pool's CIDRs. Each error is on the config's `spec.<family>.cidr` and
/// names the pool.
pub fn config_pool_conflicts<'a>(
    config: &NodeIPAMConfig,
    check: [bool; 2],
    pools: impl IntoIterator<Item = &'a NodeIPAMPool>,
) -> Vec<FieldError> {
    let mut pools: Vec<&NodeIPAMPool> = pools.into_iter().collect();
    pools.sort_by_key(|p| p.name_any());
    let ranges = Ranges::claimed(&config.spec);
    let mut errors = Vec::new();
    for (family, check) in Family::ALL.into_iter().zip(check) {
        let Some(range) = ranges.get(family).filter(|_| check).map(|r| r.cidr) else {
            continue;
        };
        let path = format!("spec.{}.cidr", family.field());
        for pool in &pools {
            let child = is_child_of(config, pool);
            let cidrs: Vec<PoolCidr> = pool
                .spec
                .claimed_cidrs()
                .into_iter()
                .filter(|c| c.family == family)
                .collect();
            let inside = cidrs.iter().any(|c| c.cidr.contains(&range));
            if child {
                if !inside {
                    let list = cidrs
                        .iter()
                        .map(|c| c.cidr.to_string())
                        .collect::<Vec<_>>()
                        .join(", ");
                    errors.push(FieldError::invalid(
                        &path,
                        range,
                        format!(
                            "lies outside NodeIPAMPool {:?} (its {family} CIDRs: [{list}]), whose child this config is (owner reference and label {POOL_LABEL}); a child must be carved from its pool's CIDRs",
                            pool.name_any()
                        ),
                    ));
                }
                continue;
            }
            for theirs in &cidrs {
                if let Some(how) = nesting(&range, &theirs.cidr) {
                    errors.push(FieldError::invalid(
                        &path,
                        range,
                        format!(
                            "overlaps {} ({}) of NodeIPAMPool {:?} ({}), and this config is not a child of that pool; {POOL_SPACE_HINT}",
                            theirs.cidr,
                            theirs.path(),
                            pool.name_any(),
                            describe(&range, &theirs.cidr, how)
                        ),
                    ));
                }
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests;
