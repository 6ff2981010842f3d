//! The Service ranges, kept out of every config: the `--service-cidr` flag's and each
//! ServiceCIDR object's, one source each in the allocation state (which holds them: this part
//! keeps no state of its own), and what a change of them moves (statuses, pending nodes).

use std::collections::HashSet;

use ipnet::IpNet;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube_core::ResourceExt;

use super::nodes::{Around, Nodes};
use crate::ipam::Ipam;

/// The source name of the `--service-cidr` flag among the Service ranges.
pub const SERVICE_FLAG_SOURCE: &str = "--service-cidr";

/// The source of a ServiceCIDR object's ranges.
fn source(name: &str) -> String {
    format!("servicecidr/{name}")
}

/// The ranges of the `--service-cidr` flag, at the start.
pub(super) fn from_flag(ipam: &mut Ipam, cidrs: Vec<IpNet>) {
    ipam.set_service_cidrs(SERVICE_FLAG_SOURCE, cidrs);
}

/// A ServiceCIDR object as the watch shows it.
pub(super) fn applied(obj: &ServiceCIDR, nodes: &mut Nodes, cx: &mut Around<'_>) {
    let name = obj.name_any();
    let cidrs: Vec<IpNet> = obj
        .spec
        .as_ref()
        .and_then(|s| s.cidrs.clone())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| c.parse::<IpNet>().ok())
        .collect();
    cx.core
        .ipam_mut()
        .set_service_cidrs(&source(&name), cidrs.clone());
    cx.touch(&cidrs);
    // An update may also have freed blocks (a range removed from the object).
    cx.statuses.mark_all(cx.configs.names().cloned());
    if cx.core.synced() {
        nodes.retry_pending(cx);
    }
}

/// A ServiceCIDR object is gone: its ranges are free to allocate from.
pub(super) fn gone(name: &str, nodes: &mut Nodes, cx: &mut Around<'_>) {
    cx.core
        .ipam_mut()
        .set_service_cidrs(&source(name), Vec::new());
    cx.statuses.mark_all(cx.configs.names().cloned());
    if cx.core.synced() {
        nodes.retry_pending(cx);
    }
}

/// A ServiceCIDR (re)list is done: the objects it lacks are gone.
pub(super) fn relisted(seen: &HashSet<String>, nodes: &mut Nodes, cx: &mut Around<'_>) {
    let gone_ones: Vec<String> = cx
        .core
        .ipam()
        .service_sources()
        .filter_map(|s| s.strip_prefix("servicecidr/"))
        .filter(|n| !seen.contains(*n))
        .map(str::to_string)
        .collect();
    for name in gone_ones {
        gone(&name, nodes, cx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::service_cidr;
    use crate::machine::nodes::World;

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn a_service_cidr_keeps_its_ranges_out_until_it_is_gone_or_a_relist_lacks_it() {
        let mut world = World::synced();
        let mut nodes = Nodes::default();
        from_flag(world.core.ipam_mut(), vec![net("10.96.0.0/16")]);
        let obj = service_cidr("s", &["10.97.0.0/16"]);
        applied(&obj, &mut nodes, &mut world.around());
        let ranges = |w: &World| w.core.ipam().service_ranges().collect::<Vec<_>>();
        assert_eq!(ranges(&world).len(), 2);
        relisted(
            &HashSet::from(["s".to_string()]),
            &mut nodes,
            &mut world.around(),
        );
        assert_eq!(ranges(&world).len(), 2, "listed: still there");
        relisted(&HashSet::new(), &mut nodes, &mut world.around());
        assert_eq!(ranges(&world), vec![net("10.96.0.0/16")], "the flag's stay");
    }
}
