//! kubernetes-sigs/node-ipam-controller's ClusterCIDRs as NodeIPAMConfigs, pure: the objects
//! as read (from the cluster or a file) and the cluster's own configs, pools and Service ranges
//! in; the configs to create, what the conversion changed on the way, and every ClusterCIDR
//! that cannot become a config (and why) out. `migrate` reads, prints and creates.
//!
//! The two APIs mean the same things: at most one CIDR per family, a core/v1 NodeSelector, and
//! the same order among several matching ranges (more matching requirements, fewer free blocks,
//! smaller blocks, selector, CIDR). They differ in three ways this module bridges or refuses:
//! one `perNodeHostBits` for both families becomes a mask per family; a ClusterCIDR being
//! deleted becomes a `Disabled` config (it drains); ClusterCIDRs may overlap each other,
//! NodeIPAMConfigs may not.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::NodeSelector;
use kube::api::ObjectMeta;
use nodeipam_crd::range::{Family, Ranges};
use nodeipam_crd::validation::find_overlaps;
use nodeipam_crd::{Allocation, FamilySpec, NodeIPAMConfig, NodeIPAMConfigSpec};
use nodeipam_webhook::review::{ClusterView, creation_problems};
use serde_json::Value;

/// The APIs ClusterCIDR was served by, newest first: node-ipam-controller's CRD (`v1`, and
/// `v1alpha1` before it) and kube-controller-manager's own, 1.25 to 1.28.
pub const APIS: [(&str, &str); 3] = [
    ("networking.x-k8s.io", "v1"),
    ("networking.x-k8s.io", "v1alpha1"),
    ("networking.k8s.io", "v1alpha1"),
];

/// The annotation naming the ClusterCIDR a config was made from (`<apiVersion> <name>`).
pub const MIGRATED_FROM: &str = "nodeipam.io/migrated-from";

/// node-ipam-controller's smallest `perNodeHostBits` (a block of 16 addresses).
const MIN_HOST_BITS: i64 = 4;

/// A ClusterCIDR as read, the fields a conversion needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterCidr {
    pub api_version: String,
    pub name: String,
    /// It has a `deletionTimestamp` (node-ipam-controller's finalizer holds it).
    pub deleting: bool,
    pub per_node_host_bits: i64,
    /// Empty when the family is not used, as the API has it.
    pub ipv4: String,
    pub ipv6: String,
    pub node_selector: Option<NodeSelector>,
}

impl ClusterCidr {
    /// Reads one object. The error names the field that is missing or has the wrong type.
    pub fn from_value(v: &Value) -> Result<Self, String> {
        let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind != "ClusterCIDR" {
            return Err(format!("kind {kind:?}: not a ClusterCIDR"));
        }
        let api_version = text(v, "apiVersion")?.ok_or("apiVersion: required")?;
        let group = api_version.split('/').next().unwrap_or_default();
        if !APIS.iter().any(|(g, _)| *g == group) {
            return Err(format!(
                "apiVersion {api_version:?}: not node-ipam-controller's ({})",
                api_list()
            ));
        }
        let meta = v.get("metadata").ok_or("metadata: required")?;
        let name = text(meta, "name")
            .map_err(|e| format!("metadata.{e}"))?
            .filter(|n| !n.is_empty())
            .ok_or("metadata.name: required")?;
        let spec = v.get("spec").ok_or("spec: required")?;
        let per_node_host_bits = spec
            .get("perNodeHostBits")
            .ok_or("spec.perNodeHostBits: required")?
            .as_i64()
            .ok_or("spec.perNodeHostBits: must be an integer")?;
        let field = |f: &str| text(spec, f).map_err(|e| format!("spec.{e}"));
        let node_selector = match spec.get("nodeSelector") {
            None | Some(Value::Null) => None,
            Some(s) => Some(
                serde_json::from_value(s.clone()).map_err(|e| format!("spec.nodeSelector: {e}"))?,
            ),
        };
        Ok(Self {
            deleting: meta.get("deletionTimestamp").is_some_and(|t| !t.is_null()),
            ipv4: field("ipv4")?.unwrap_or_default(),
            ipv6: field("ipv6")?.unwrap_or_default(),
            api_version,
            name,
            per_node_host_bits,
            node_selector,
        })
    }
}

/// The string field `key` of `v`: `None` when absent; an error naming it when not a string.
fn text(v: &Value, key: &str) -> Result<Option<String>, String> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key}: must be a string")),
    }
}

/// The APIs, for messages: `networking.x-k8s.io/v1, ...`.
pub fn api_list() -> String {
    APIS.iter()
        .map(|(g, v)| format!("{g}/{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A ClusterCIDR that cannot become a NodeIPAMConfig, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub name: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterCIDR {:?}: {}", self.name, self.reason)
    }
}

/// What becomes of one converted config, given the cluster's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No NodeIPAMConfig of that name: create it.
    Create,
    /// A NodeIPAMConfig of that name has the same ranges and selector (migrated before): left
    /// alone, its `allocation` too.
    Unchanged,
}

/// The configs a migration makes, in name order, and what it changed on the way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub configs: Vec<(NodeIPAMConfig, Step)>,
    /// One line per change a user should know of, e.g. a CIDR made canonical.
    pub notes: Vec<String>,
}

/// Converts every ClusterCIDR, or refuses them all with every reason: a migration that leaves
/// one range behind would hand its space to nobody while its nodes keep their blocks.
/// `view` holds the cluster's NodeIPAMConfigs, pools and Service ranges (only the Service
/// ranges given on the command line when a file is converted without a cluster).
pub fn plan(items: &[ClusterCidr], view: &ClusterView) -> Result<Plan, Vec<Refusal>> {
    let mut refusals = duplicates(items);
    let mut sorted: Vec<&ClusterCidr> = items.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted.dedup_by(|a, b| a.name == b.name);
    let mut plan = Plan::default();
    let mut made: Vec<(String, Ranges)> = Vec::new();
    for item in sorted {
        let refuse = |reason: String| Refusal {
            name: item.name.clone(),
            reason,
        };
        let (config, notes) = match convert(item) {
            Ok(c) => c,
            Err(reasons) => {
                refusals.extend(reasons.into_iter().map(refuse));
                continue;
            }
        };
        let ranges = Ranges::claimed(&config.spec);
        for overlap in find_overlaps(&ranges, made.iter().map(|(n, r)| (n.as_str(), r))) {
            refusals.push(refuse(format!(
                "{} range {} overlaps {} of ClusterCIDR {:?}: node-ipam-controller lets \
                 ClusterCIDRs overlap, NodeIPAMConfigs may not; give them one range (or convert \
                 one only, with -f)",
                overlap.family, overlap.ours, overlap.theirs, overlap.other
            )));
        }
        made.push((item.name.clone(), ranges));
        match step(&config, view, item.per_node_host_bits) {
            Ok(step) => {
                let name = &item.name;
                plan.notes
                    .extend(notes.iter().map(|n| format!("ClusterCIDR {name:?}: {n}")));
                plan.configs.push((config, step));
            }
            Err(reasons) => refusals.extend(reasons.into_iter().map(refuse)),
        }
    }
    if refusals.is_empty() {
        Ok(plan)
    } else {
        Err(refusals)
    }
}

/// Names read twice (e.g. from both API groups): which one is meant cannot be guessed.
fn duplicates(items: &[ClusterCidr]) -> Vec<Refusal> {
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for item in items {
        if let Some(first) = seen.insert(&item.name, &item.api_version) {
            out.push(Refusal {
                name: item.name.clone(),
                reason: format!(
                    "read twice, as {first} and as {}: a NodeIPAMConfig takes one name",
                    item.api_version
                ),
            });
        }
    }
    out
}

/// Whether the cluster already has `config` (same ranges and selector), or takes it new.
fn step(config: &NodeIPAMConfig, view: &ClusterView, host_bits: i64) -> Result<Step, Vec<String>> {
    let name = config.metadata.name.as_deref();
    if let Some(existing) = view
        .configs
        .iter()
        .find(|c| c.metadata.name.as_deref() == name)
    {
        let (a, b) = (&existing.spec, &config.spec);
        return if (&a.ipv4, &a.ipv6, &a.node_selector) == (&b.ipv4, &b.ipv6, &b.node_selector) {
            Ok(Step::Unchanged)
        } else {
            Err(vec![
                "a NodeIPAMConfig of that name exists with other ranges or another \
                 nodeSelector: delete or rename it first"
                    .into(),
            ])
        };
    }
    let problems = creation_problems(config, view);
    if problems.is_empty() {
        return Ok(Step::Create);
    }
    Err(problems
        .iter()
        .map(|p| {
            let mut line = p.message();
            if p.path.ends_with("perNodeMaskSize") {
                line.push_str(&format!(" (from perNodeHostBits {host_bits})"));
            }
            line
        })
        .collect())
}

/// One ClusterCIDR as a NodeIPAMConfig, with notes on what changed; or every reason it cannot
/// be one on its own (overlaps and the cluster are [`plan`]'s).
pub fn convert(c: &ClusterCidr) -> Result<(NodeIPAMConfig, Vec<String>), Vec<String>> {
    let mut notes = Vec::new();
    // The name becomes the NodeIPAMConfig's: the API server would refuse what it refuses.
    let mut reasons: Vec<String> = nodeipam_crd::validation::dns_subdomain_errors(&c.name)
        .into_iter()
        .map(|reason| format!("metadata.name: {reason}"))
        .collect();
    let mut families = [None, None];
    for (slot, (family, cidr)) in families
        .iter_mut()
        .zip([(Family::V4, &c.ipv4), (Family::V6, &c.ipv6)])
    {
        match family_spec(family, cidr, c.per_node_host_bits) {
            Ok(Some((spec, note))) => {
                *slot = Some(spec);
                notes.extend(note);
            }
            Ok(None) => {}
            Err(reason) => reasons.push(reason),
        }
    }
    if reasons.is_empty() && families.iter().all(Option::is_none) {
        reasons.push("spec: neither ipv4 nor ipv6 is set".into());
    }
    if !reasons.is_empty() {
        return Err(reasons);
    }
    let node_selector = match &c.node_selector {
        Some(s) if s.node_selector_terms.is_empty() => {
            notes.push(
                "its nodeSelector has no terms, which node-ipam-controller reads as every node: \
                 the NodeIPAMConfig has no nodeSelector"
                    .into(),
            );
            None
        }
        other => other.clone(),
    };
    let allocation = if c.deleting {
        notes.push(
            "it is being deleted: the NodeIPAMConfig is Disabled, so it drains as its nodes go"
                .into(),
        );
        Allocation::Disabled
    } else {
        Allocation::Enabled
    };
    let [ipv4, ipv6] = families;
    let mut config = NodeIPAMConfig::new(
        &c.name,
        NodeIPAMConfigSpec {
            ipv4,
            ipv6,
            node_selector,
            allocation,
        },
    );
    config.metadata = ObjectMeta {
        name: Some(c.name.clone()),
        annotations: Some(BTreeMap::from([(
            MIGRATED_FROM.to_owned(),
            format!("{} {}", c.api_version, c.name),
        )])),
        ..ObjectMeta::default()
    };
    Ok((config, notes))
}

/// One family: the CIDR as node-ipam-controller reads it (host bits cleared) and the mask its
/// host bits give; a note when the CIDR was not canonical.
fn family_spec(
    family: Family,
    cidr: &str,
    host_bits: i64,
) -> Result<Option<(FamilySpec, Option<String>)>, String> {
    if cidr.is_empty() {
        return Ok(None);
    }
    let field = family.field();
    let net: IpNet = cidr
        .parse()
        .map_err(|_| format!("spec.{field}: {cidr:?} is not a CIDR"))?;
    if Family::of_net(&net) != family {
        return Err(format!("spec.{field}: {cidr:?} is not an {family} CIDR"));
    }
    let bits = i64::from(family.bits());
    let most = bits - i64::from(net.prefix_len());
    if !(MIN_HOST_BITS..=most).contains(&host_bits) {
        return Err(format!(
            "spec.perNodeHostBits: {host_bits} is outside {MIN_HOST_BITS} to {most}, what \
             node-ipam-controller takes for {cidr}: it never handed out blocks from it"
        ));
    }
    let canonical = net.trunc();
    let note = (canonical != net).then(|| {
        format!(
            "spec.{field} {cidr} has host bits set: node-ipam-controller used {canonical}, and \
             so does the NodeIPAMConfig"
        )
    });
    let mask = u8::try_from(bits - host_bits).expect("a prefix length fits a u8");
    Ok(Some((
        FamilySpec {
            cidr: canonical.to_string(),
            per_node_mask_size: mask,
        },
        note,
    )))
}

/// The cluster's configs as the view [`plan`] checks against, beside its pools and Service
/// ranges.
pub fn view_of(
    configs: Vec<NodeIPAMConfig>,
    pools: Vec<nodeipam_crd::NodeIPAMPool>,
    service_cidrs: Vec<nodeipam_webhook::ServiceRange>,
) -> ClusterView {
    ClusterView {
        configs: configs.into_iter().map(Arc::new).collect(),
        pools: pools.into_iter().map(Arc::new).collect(),
        pools_unlisted: false,
        service_cidrs,
        // Migration checks what refuses a config; the supernet warning is the webhook's.
        pod_network_supernets: Vec::new(),
        matching_nodes: None,
    }
}

#[cfg(test)]
mod tests;
