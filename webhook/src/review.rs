//! The admission decision for a NodeIPAMConfig request, pure: a request and a snapshot of the
//! cluster in, an `AdmissionResponse` out. The HTTP layer only parses, reads the cluster and
//! serializes.

use std::sync::Arc;

use ipnet::IpNet;
use kube::ResourceExt;
use kube::core::Status;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, Operation};
use kube::core::response::{StatusCause, StatusDetails};
use nodeipam_crd::range::{Family, Ranges};
use nodeipam_crd::{
    FamilySpec, NodeIPAMConfig, NodeIPAMPool, PoolCidr, ServiceRangeRef, config_pool_conflicts,
    pool_conflicts, pool_label,
};

use crate::checks::{self, Problem, describe, overlap};

/// Observer label of an admitted request.
pub const ALLOWED: &str = "allowed";
/// Observer label of a request refused for what it asks.
pub const DENIED: &str = "denied";
/// Observer label of a request the webhook could not make sense of.
pub const INVALID: &str = "invalid";

/// The API group of NodeIPAMConfig.
pub const GROUP: &str = "nodeipam.io";
/// The only version this webhook decodes.
pub const VERSION: &str = "v1alpha1";
/// The kind.
pub const KIND: &str = "NodeIPAMConfig";
/// The plural resource name.
pub const RESOURCE: &str = "nodeipamconfigs";
/// The kind of a pool.
pub const POOL_KIND: &str = "NodeIPAMPool";
/// The plural resource name of pools.
pub const POOL_RESOURCE: &str = "nodeipampools";

/// A pod range with fewer blocks than this gets a warning.
pub const FEW_BLOCKS: u128 = 16;

/// What the decision needs to know about the cluster, listed for this review.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// Every NodeIPAMConfig (the one under review may be among them: it is skipped by name).
    pub configs: Vec<Arc<NodeIPAMConfig>>,
    /// Every NodeIPAMPool (the one under review may be among them: it is skipped by name).
    pub pools: Vec<Arc<NodeIPAMPool>>,
    /// The pools have not been listed yet (the CRD was not served when the webhook started):
    /// pool requests that read the view are refused until they are.
    pub pools_unlisted: bool,
    /// Service ranges pod ranges must not overlap.
    pub service_cidrs: Vec<ServiceRange>,
    /// The pod network the consumers are configured for (`--pod-network-supernet`): a range
    /// outside those of its family gets a warning. Empty: no such warning.
    pub pod_network_supernets: Vec<IpNet>,
    /// How many nodes the config under review can serve (those its nodeSelector matches, or
    /// every node), counted for this request up to [`nodes_worth_counting`]: exact below it, at
    /// least that many at or above it. `None` when it was not counted (the count failed or ran
    /// out of time): the warning that reads it is skipped.
    pub matching_nodes: Option<usize>,
}

impl ClusterView {
    /// The Service ranges as the shared checks take them.
    pub fn service_refs(&self) -> Vec<ServiceRangeRef<'_>> {
        self.service_cidrs
            .iter()
            .map(|s| ServiceRangeRef {
                cidr: s.cidr,
                source: &s.source,
            })
            .collect()
    }
}

/// A Service range and where it comes from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRange {
    pub cidr: IpNet,
    /// e.g. `ServiceCIDR "kubernetes"` or `--service-cidr`.
    pub source: String,
}

impl ServiceRange {
    /// A range given with `--service-cidr`.
    pub fn flag(cidr: IpNet) -> ServiceRange {
        ServiceRange {
            cidr,
            source: "--service-cidr".into(),
        }
    }

    /// A range of the ServiceCIDR object `name`.
    pub fn of_service_cidr(name: &str, cidr: IpNet) -> ServiceRange {
        ServiceRange {
            cidr,
            source: format!("ServiceCIDR \"{name}\""),
        }
    }
}

/// Which label the observer gets for `response`.
pub fn result_of(response: &AdmissionResponse) -> &'static str {
    if response.allowed {
        ALLOWED
    } else if response.result.reason == INVALID_REASON {
        INVALID
    } else {
        DENIED
    }
}

/// `AdmissionResponse::invalid` uses this reason.
const INVALID_REASON: &str = "InvalidRequest";

/// An `invalid` response that still answers `request` (same uid), so the API server accepts
/// it as the answer and refuses the operation with `message`.
pub fn invalid_for<T: kube::Resource>(
    request: &AdmissionRequest<T>,
    message: impl ToString,
) -> AdmissionResponse {
    let mut response = AdmissionResponse::invalid(message);
    response.uid = request.uid.clone();
    response.result.code = 400;
    if !request.types.api_version.is_empty() {
        response.types = request.types.clone();
    }
    response
}

/// Decides a request for a NodeIPAMConfig against `view`.
///
/// Denies: anything the shared validation rejects, a change to an immutable field, a range
/// overlapping a range of another NodeIPAMConfig or a Service range. Warns (and admits): fewer
/// than [`FEW_BLOCKS`] blocks in a family, or fewer blocks than there are nodes it can serve
/// (those its nodeSelector matches, or every node). Allows DELETE and CONNECT, status writes,
/// and updates that leave the spec alone (finalizers, labels), so a config admitted earlier can
/// always be drained and deleted.
pub fn review(request: &AdmissionRequest<NodeIPAMConfig>, view: &ClusterView) -> AdmissionResponse {
    if let Err(message) = check_target(request, KIND, RESOURCE) {
        return invalid_for(request, message);
    }
    if matches!(request.operation, Operation::Delete | Operation::Connect)
        || request.sub_resource.is_some()
    {
        return AdmissionResponse::from(request);
    }
    let Some(object) = request.object.as_ref() else {
        return invalid_for(request, "the request has no object");
    };
    let name = object
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| request.name.clone());

    let mut problems = Vec::new();
    // Which families get the overlap checks: on UPDATE only ranges that changed, so a
    // pre-existing overlap (admitted while the webhook was down) never blocks metadata writes.
    let mut check = [true, true];
    if request.operation == Operation::Update {
        let Some(old) = request.old_object.as_ref() else {
            return invalid_for(request, "an UPDATE request has no oldObject");
        };
        if old.spec == object.spec {
            return AdmissionResponse::from(request);
        }
        problems.extend(
            checks::update_problems(&old.spec, &object.spec)
                .into_iter()
                .map(|mut p| {
                    if !p.body.contains("create a new") {
                        p.body.push_str(IMMUTABLE_HINT);
                    }
                    p
                }),
        );
        check = [
            cidr(&old.spec.ipv4) != cidr(&object.spec.ipv4),
            cidr(&old.spec.ipv6) != cidr(&object.spec.ipv6),
        ];
    }
    let spec_problems = checks::spec_problems(&object.spec);
    let spec_valid = spec_problems.is_empty();
    // Ratcheting, like the API server: on UPDATE, what was already wrong with the old spec
    // (e.g. rules tightened since) does not block the change; only new problems do.
    let old_problems = match (&request.operation, request.old_object.as_ref()) {
        (Operation::Update, Some(old)) => checks::spec_problems(&old.spec),
        _ => Vec::new(),
    };
    for p in spec_problems {
        if !problems.contains(&p) && !old_problems.contains(&p) {
            problems.push(p);
        }
    }
    problems.extend(conflicts(&name, object, check, view));

    if !problems.is_empty() {
        return deny(request, KIND, &name, problems);
    }
    let mut response = AdmissionResponse::from(request);
    if spec_valid {
        let mut warnings = warnings(object, view.matching_nodes);
        warnings.extend(
            Ranges::claimed(&object.spec)
                .iter()
                .filter_map(|(family, r)| {
                    let path = format!("spec.{}.cidr", family.field());
                    checks::outside_supernets(&path, &r.cidr, &view.pod_network_supernets)
                }),
        );
        if !warnings.is_empty() {
            response.warnings = Some(warnings);
        }
    }
    response
}

/// Everything that refuses a new NodeIPAMConfig `object` in `view`: the shared validation, an
/// overlap with another config's or a Service range, a pool's space. What [`review`] denies a
/// CREATE for, and what `kubectl nodeipam migrate` checks before it creates anything (the
/// webhook may not run yet during a migration).
pub fn creation_problems(object: &NodeIPAMConfig, view: &ClusterView) -> Vec<Problem> {
    let mut problems = checks::spec_problems(&object.spec);
    let name = object.metadata.name.as_deref().unwrap_or_default();
    problems.extend(conflicts(name, object, [true, true], view));
    problems
}

/// The ranges of `object` (the families `check` names) against the rest of the cluster: other
/// configs, Service ranges, pools.
fn conflicts(
    name: &str,
    object: &NodeIPAMConfig,
    check: [bool; 2],
    view: &ClusterView,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    // Even an invalid spec's ranges are checked, as written: the controller treats what they
    // claim as taken too (see `FamilyRange::claimed`).
    let claimed = Ranges::claimed(&object.spec);
    for (family, check) in Family::ALL.into_iter().zip(check) {
        let Some(range) = claimed.get(family).filter(|_| check) else {
            continue;
        };
        problems.extend(overlap_problems(name, family, &range.cidr, view));
    }
    // A pool's space is its children's alone, and a child stays inside its pool.
    problems.extend(
        config_pool_conflicts(object, check, view.pools.iter().map(AsRef::as_ref))
            .into_iter()
            .map(checks::from_field_error),
    );
    problems
}

/// Whether deciding `request` reads the cluster view: a CREATE, or an UPDATE of the spec.
pub fn needs_view(request: &AdmissionRequest<NodeIPAMConfig>) -> bool {
    if request.sub_resource.is_some() {
        return false;
    }
    match request.operation {
        Operation::Create => true,
        Operation::Update => match (&request.object, &request.old_object) {
            (Some(new), Some(old)) => new.spec != old.spec,
            _ => true,
        },
        Operation::Delete | Operation::Connect => false,
    }
}

/// Appended to an immutability error that does not already say what to do instead.
const IMMUTABLE_HINT: &str = "; ranges and the node selector are immutable: create a new \
     NodeIPAMConfig with the new values, then set spec.allocation: Disabled on this one (or \
     delete it) so it drains";

fn cidr(f: &Option<FamilySpec>) -> Option<&str> {
    f.as_ref().map(|f| f.cidr.as_str())
}

fn check_target<K: kube::Resource>(
    request: &AdmissionRequest<K>,
    kind: &str,
    resource: &str,
) -> Result<(), String> {
    let k = &request.kind;
    if (k.group.as_str(), k.version.as_str(), k.kind.as_str()) != (GROUP, VERSION, kind) {
        return Err(format!(
            "this webhook only reviews {GROUP}/{VERSION} {KIND} and {POOL_KIND}, not {}/{} {}",
            k.group, k.version, k.kind
        ));
    }
    let r = &request.resource;
    if (r.group.as_str(), r.version.as_str(), r.resource.as_str()) != (GROUP, VERSION, resource) {
        return Err(format!(
            "this webhook only reviews {GROUP}/{VERSION} {resource}, not {}/{} {}",
            r.group, r.version, r.resource
        ));
    }
    match request.sub_resource.as_deref() {
        None | Some("status") => Ok(()),
        Some(other) => Err(format!("unexpected subresource {other:?}")),
    }
}

/// The cause type of an overlap: the value is invalid.
const OVERLAP_REASON: &str = "FieldValueInvalid";

/// Overlaps of `range` (of `family`) with other configs' ranges of the same family and with
/// Service ranges.
fn overlap_problems(name: &str, family: Family, range: &IpNet, view: &ClusterView) -> Vec<Problem> {
    let field = format!("spec.{}.cidr", family.field());
    let mut out = Vec::new();
    let mut others: Vec<&NodeIPAMConfig> = view
        .configs
        .iter()
        .map(|c| c.as_ref())
        .filter(|c| c.metadata.name.as_deref() != Some(name))
        .collect();
    others.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for other in others {
        let Some(theirs) = Ranges::claimed(&other.spec).get(family).map(|r| r.cidr) else {
            continue;
        };
        if let Some(how) = overlap(range, &theirs) {
            let other_name = other.metadata.name.as_deref().unwrap_or("");
            out.push(Problem {
                path: field.clone(),
                reason: OVERLAP_REASON,
                body: format!(
                    "Invalid value: \"{range}\": overlaps {theirs} of NodeIPAMConfig \
                     \"{other_name}\" ({}); ranges of NodeIPAMConfigs must not overlap",
                    describe(range, &theirs, how)
                ),
            });
        }
    }
    for service in &view.service_cidrs {
        if let Some(how) = overlap(range, &service.cidr) {
            out.push(Problem {
                path: field.clone(),
                reason: OVERLAP_REASON,
                body: format!(
                    "Invalid value: \"{range}\": overlaps the Service range {} of {} \
                     ({}); pod and Service ranges must not overlap",
                    service.cidr,
                    service.source,
                    describe(range, &service.cidr, how)
                ),
            });
        }
    }
    out
}

fn deny<K: kube::Resource>(
    request: &AdmissionRequest<K>,
    kind: &str,
    name: &str,
    problems: Vec<Problem>,
) -> AdmissionResponse {
    let message = problems
        .iter()
        .map(Problem::message)
        .collect::<Vec<_>>()
        .join("; ");
    let causes = problems
        .into_iter()
        .map(|p| StatusCause {
            reason: p.reason.into(),
            message: p.body,
            field: p.path,
        })
        .collect();
    let mut response = AdmissionResponse::from(request).deny(&message);
    response.result = Status::failure(&message, "Invalid")
        .with_code(422)
        .with_details(StatusDetails {
            name: name.to_string(),
            group: GROUP.into(),
            kind: kind.into(),
            uid: String::new(),
            causes,
            retry_after_seconds: 0,
        });
    response
}

/// How many matching nodes the exhaustion warning of `config` needs to see to decide: the block
/// count of its largest family. `None` when it gets no such warning: a spec without valid
/// ranges, or a range a pool carved (its pool carves another before this one runs out, so
/// "this range alone would run out" is true of every child and means nothing; counting would
/// cost a paged list of the nodes per carve).
pub fn nodes_worth_counting(config: &NodeIPAMConfig) -> Option<usize> {
    if pool_label(config.labels()).is_some() {
        return None;
    }
    let ranges = config.spec.ranges().ok()?;
    ranges
        .iter()
        .map(|(_, r)| usize::try_from(r.block_count()).unwrap_or(usize::MAX))
        .max()
}

/// Admission warnings for a valid spec; `node_count` is how many nodes it can serve (see
/// [`ClusterView::matching_nodes`]; `None`: no exhaustion warning).
fn warnings(config: &NodeIPAMConfig, node_count: Option<usize>) -> Vec<String> {
    let spec = &config.spec;
    let mut out = Vec::new();
    // Only called for a valid spec; an invalid one has no block count to warn about.
    let Ok(ranges) = spec.ranges() else {
        return out;
    };
    // A count that reached what the warning needs may have stopped there.
    let enough = nodes_worth_counting(config);
    let at_least = match (node_count, enough) {
        (Some(n), Some(enough)) if n >= enough => "at least ",
        _ => "",
    };
    for (family, r) in ranges.iter() {
        let path = format!("spec.{}", family.field());
        let (range, mask) = (r.cidr, r.per_node_mask_size);
        let n = u128::from(r.block_count());
        if n < FEW_BLOCKS {
            out.push(format!(
                "{path}: perNodeMaskSize {mask} leaves only {n} blocks in {range}: at most {n} \
                 nodes can get a range from it"
            ));
        }
        let Some(nodes) = node_count.filter(|_| enough.is_some()).map(|c| c as u128) else {
            continue;
        };
        if nodes > 0 && nodes >= n {
            // Only the nodes the selector matches take blocks from it; say which count this is.
            let who = if spec.node_selector.is_some() {
                format!("{at_least}{nodes} nodes match its nodeSelector")
            } else {
                format!("the cluster already has {at_least}{nodes} nodes")
            };
            out.push(format!(
                "{path}: {range} has {n} blocks of /{mask} but {who}: this range alone would \
                 run out"
            ));
        }
    }
    out
}

/// Decides a request for a NodeIPAMPool against `view`.
///
/// Denies: anything the shared pool validation rejects (ratcheted on UPDATE, like configs), a
/// change to an immutable field, and a CIDR overlapping another pool's, a Service range or a
/// NodeIPAMConfig that is not a child of this pool. On UPDATE only appended CIDRs get the
/// overlap checks, so scaling settings can always change. Warns (and admits) when the CIDRs
/// hold fewer ranges than `ranges.min` or `ranges.max`. Allows DELETE and CONNECT, status
/// writes and updates that leave the spec alone.
pub fn review_pool(
    request: &AdmissionRequest<NodeIPAMPool>,
    view: &ClusterView,
) -> AdmissionResponse {
    if let Err(message) = check_target(request, POOL_KIND, POOL_RESOURCE) {
        return invalid_for(request, message);
    }
    if matches!(request.operation, Operation::Delete | Operation::Connect)
        || request.sub_resource.is_some()
    {
        return AdmissionResponse::from(request);
    }
    let Some(object) = request.object.as_ref() else {
        return invalid_for(request, "the request has no object");
    };
    let name = object
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| request.name.clone());

    let mut problems = Vec::new();
    let mut old_cidrs: Vec<PoolCidr> = Vec::new();
    let mut old_problems = Vec::new();
    if request.operation == Operation::Update {
        let Some(old) = request.old_object.as_ref() else {
            return invalid_for(request, "an UPDATE request has no oldObject");
        };
        if old.spec == object.spec {
            return AdmissionResponse::from(request);
        }
        problems.extend(checks::pool_update_problems(&old.spec, &object.spec));
        old_cidrs = old.spec.claimed_cidrs();
        old_problems = checks::pool_spec_problems(&old.spec);
    }
    // Only at CREATE: the name is immutable, so an UPDATE of a pool stored before this check
    // can change nothing about it (the controller reports that pool Invalid instead).
    if request.operation == Operation::Create
        && let Some(e) = nodeipam_crd::validate_pool_name(&name)
    {
        problems.push(checks::from_field_error(e));
    }
    let spec_problems = checks::pool_spec_problems(&object.spec);
    let spec_valid = spec_problems.is_empty();
    for p in spec_problems {
        if !problems.contains(&p) && !old_problems.contains(&p) {
            problems.push(p);
        }
    }
    let fresh = |c: &PoolCidr| {
        !old_cidrs
            .iter()
            .any(|o| o.family == c.family && o.cidr == c.cidr)
    };
    problems.extend(
        pool_conflicts(
            object,
            fresh,
            view.pools.iter().map(AsRef::as_ref),
            view.configs.iter().map(AsRef::as_ref),
            &view.service_refs(),
        )
        .into_iter()
        .map(checks::from_field_error),
    );
    if !problems.is_empty() {
        return deny(request, POOL_KIND, &name, problems);
    }
    let mut response = AdmissionResponse::from(request);
    if spec_valid && let Ok(parsed) = object.spec.parse() {
        let warnings = pool_warnings(&parsed, &view.pod_network_supernets);
        if !warnings.is_empty() {
            response.warnings = Some(warnings);
        }
    }
    response
}

/// Whether deciding a pool `request` reads the cluster view: a CREATE, or an UPDATE of the
/// spec.
pub fn pool_needs_view(request: &AdmissionRequest<NodeIPAMPool>) -> bool {
    if request.sub_resource.is_some() {
        return false;
    }
    match request.operation {
        Operation::Create => true,
        Operation::Update => match (&request.object, &request.old_object) {
            (Some(new), Some(old)) => new.spec != old.spec,
            _ => true,
        },
        Operation::Delete | Operation::Connect => false,
    }
}

/// Admission warnings for a valid pool: CIDRs too small for `ranges.min` (or else for
/// `ranges.max`), one per family; and each CIDR outside the declared pod-network supernets.
fn pool_warnings(pool: &nodeipam_crd::ParsedPool, supernets: &[IpNet]) -> Vec<String> {
    let mut out = Vec::new();
    for family in pool.iter() {
        for (i, cidr) in family.cidrs.iter().enumerate() {
            let path = format!("spec.{}.cidrs[{i}]", family.family.field());
            out.extend(checks::outside_supernets(&path, cidr, supernets));
        }
        let fits = family.budget_ranges();
        let path = format!("spec.{}", family.family.field());
        // The tighter bound first: too few ranges for `min` is worse than for `max`.
        for (bound, value) in [("min", pool.min_ranges), ("max", pool.max_ranges)] {
            if fits < u64::from(value) {
                out.push(format!(
                    "{path}: the CIDRs have room for {fits} /{} ranges, fewer than spec.ranges.{bound} ({value}): the pool stops at {fits}",
                    family.range_mask_size
                ));
                break;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
