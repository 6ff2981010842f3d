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
const SERVICE_FLAG_SOURCE: &str = "--service-cidr";

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
