//! The webhook's view of the shared validation rules (`nodeipam_crd::validation`), for configs
//! and pools, reduced to what a denial needs: a field path and a Kubernetes-style message.
//! Also the overlap wording; what overlaps is decided by `nodeipam_crd::range`, shared with
//! the controller.

use ipnet::IpNet;
use nodeipam_crd::{NodeIPAMConfigSpec, NodeIPAMPoolSpec};

/// One rejected field, in the two parts a Kubernetes `StatusCause` has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// e.g. `spec.ipv4.cidr`.
    pub path: String,
    /// The cause type, e.g. `FieldValueInvalid`.
    pub reason: &'static str,
    /// The message without the path, e.g. `Invalid value: "x": ...`: the API server and
    /// kubectl print a cause as `<field>: <message>`, so the path must not be in it too.
    pub body: String,
}

impl Problem {
    /// The whole line, path first, e.g. `spec.ipv4.cidr: Invalid value: "x": ...`.
    pub fn message(&self) -> String {
        format!("{}: {}", self.path, self.body)
    }
}

/// A shared-validation error as a denial cause.
pub fn from_field_error(e: nodeipam_crd::validation::FieldError) -> Problem {
    Problem {
        reason: e.kind.cause_type(),
        body: e.body(),
        path: e.path,
    }
}

/// Everything the shared rules reject in a spec.
pub fn spec_problems(spec: &NodeIPAMConfigSpec) -> Vec<Problem> {
    nodeipam_crd::validation::validate_spec(spec)
        .into_iter()
        .map(from_field_error)
        .collect()
}

/// Everything the shared rules reject in a pool's spec.
pub fn pool_spec_problems(spec: &NodeIPAMPoolSpec) -> Vec<Problem> {
    spec.parse()
        .err()
        .unwrap_or_default()
        .into_iter()
        .map(from_field_error)
        .collect()
}

/// Everything the shared rules reject in a change of a pool's spec from `old` to `new`.
pub fn pool_update_problems(old: &NodeIPAMPoolSpec, new: &NodeIPAMPoolSpec) -> Vec<Problem> {
    nodeipam_crd::validation::validate_pool_update(old, new)
        .into_iter()
        .map(from_field_error)
        .collect()
}

/// Everything the shared rules reject in a change from `old` to `new` (immutable fields).
pub fn update_problems(old: &NodeIPAMConfigSpec, new: &NodeIPAMConfigSpec) -> Vec<Problem> {
    nodeipam_crd::validation::validate_update(old, new)
        .into_iter()
        .map(from_field_error)
        .collect()
}

/// How two ranges of one family relate, when they share addresses, and how to find out: the
/// controller's allocator decides overlap with the same `nodeipam_crd::range`, so a range this
/// webhook admits is one the allocator sees as disjoint too. Re-exported under the names the
/// messages and tests use.
pub use nodeipam_crd::range::nesting as overlap;

/// `10.0.0.0/8 contains 10.64.0.0/14`, for messages: the crd's wording, shared with the
/// pool checks.
pub use nodeipam_crd::range::describe;

/// The warning for `cidr` (at `path`) when pod-network supernets of its family are declared
/// (`--pod-network-supernet`) and none holds it: a consumer configured with them, such as
/// flannel's `Network` (whose flanneld exits on a podCIDR outside it) or a masquerade rule,
/// would not carry this range's pods. Without a supernet of the family there is nothing to
/// check against.
pub fn outside_supernets(path: &str, cidr: &IpNet, supernets: &[IpNet]) -> Option<String> {
    let same_family: Vec<&IpNet> = supernets
        .iter()
        .filter(|s| s.addr().is_ipv4() == cidr.addr().is_ipv4())
        .collect();
    if same_family.is_empty() || same_family.iter().any(|s| s.contains(cidr)) {
        return None;
    }
    let declared: Vec<String> = same_family.iter().map(ToString::to_string).collect();
    Some(format!(
        "{path}: {cidr} is outside the declared pod network ({}, --pod-network-supernet): \
         consumers configured with it (flannel's Network, masquerade rules) will not carry this \
         range's pods; create it inside, or widen the consumers first",
        declared.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use ipnet::IpNet;
    use nodeipam_crd::range::Nesting as Overlap;

    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn overlap_kinds() {
        assert_eq!(
            overlap(&net("10.0.0.0/8"), &net("10.64.0.0/14")),
            Some(Overlap::Contains)
        );
        assert_eq!(
            overlap(&net("10.64.0.0/14"), &net("10.0.0.0/8")),
            Some(Overlap::Inside)
        );
        assert_eq!(
            overlap(&net("10.0.0.0/8"), &net("10.0.0.0/8")),
            Some(Overlap::Same)
        );
        assert_eq!(overlap(&net("10.0.0.0/16"), &net("10.1.0.0/16")), None);
        assert_eq!(overlap(&net("10.0.0.0/8"), &net("fd00::/8")), None);
    }

    /// Compiles only if both arguments are the same item: every function has its own type.
    fn same_item<T>(_: T, _: T) {}

    #[test]
    fn overlap_is_the_shared_range_vocabulary() {
        // A local copy here, however alike, would be another function and fail to compile.
        same_item(overlap, nodeipam_crd::range::nesting);
        let _: nodeipam_crd::range::Nesting = Overlap::Same;
    }

    #[test]
    fn describe_reads_naturally() {
        let (a, b) = (net("10.0.0.0/8"), net("10.64.0.0/14"));
        assert_eq!(
            describe(&a, &b, Overlap::Contains),
            "10.0.0.0/8 contains 10.64.0.0/14"
        );
        assert_eq!(
            describe(&b, &a, Overlap::Inside),
            "10.64.0.0/14 is inside 10.0.0.0/8"
        );
    }

    #[test]
    fn outside_supernets_warns_per_family() {
        let supernets = [net("10.240.0.0/12")];
        assert_eq!(
            outside_supernets("p", &net("10.241.0.0/16"), &supernets),
            None
        );
        assert_eq!(
            outside_supernets("p", &net("10.240.0.0/12"), &supernets),
            None
        );
        let w = outside_supernets("spec.ipv4.cidr", &net("10.64.0.0/16"), &supernets)
            .expect("a range outside warns");
        assert!(
            w.starts_with("spec.ipv4.cidr: 10.64.0.0/16 is outside"),
            "{w}"
        );
        assert!(w.contains("10.240.0.0/12"), "{w}");
        // A wider range than the supernet is outside it too.
        assert!(outside_supernets("p", &net("10.0.0.0/8"), &supernets).is_some());
        // No IPv6 supernet declared: nothing to check an IPv6 range against.
        assert_eq!(outside_supernets("p", &net("fd00::/48"), &supernets), None);
        assert_eq!(outside_supernets("p", &net("10.64.0.0/16"), &[]), None);
    }
}
