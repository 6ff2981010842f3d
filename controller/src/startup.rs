//! Start-up checks of `nodeipam run`: the dangers the process can see before it allocates, and
//! that nothing else would tell an operator. No Service range known (a cluster without the
//! ServiceCIDR API and without `--service-cidr`: nothing keeps pod ranges off Service IPs);
//! ranges outside the consumers' pod network (`--pod-network-supernet`, and flannel's
//! `Network` read from its ConfigMap). The decisions are pure functions of the facts
//! ([`service_range_warning`], [`flannel_networks`], [`outside_pod_network`]); [`check`]
//! gathers the facts and reports each warning as a log line, an Event and a metric.

use ipnet::IpNet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource as _};
use nodeipam_crd::NodeIPAMConfig;
use tracing::{debug, info, warn};

use crate::metrics::Metrics;
use crate::reconcile::events::Events;

/// flannel's ConfigMap in kube-flannel.yml, and where it has lived: `kube-flannel` since
/// flannel 0.20, `kube-system` before.
pub const FLANNEL_CONFIGMAP: &str = "kube-flannel-cfg";
pub const FLANNEL_NAMESPACES: [&str; 2] = ["kube-flannel", "kube-system"];

/// The start-up checks' events: warnings, of the action Start.
const WARNING: EventType = EventType::Warning;
const START: &str = "Start";

const NET_CONF_KEY: &str = "net-conf.json";

/// What the API server said about ServiceCIDR objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceCidrApi {
    /// Served, with this many objects.
    Served(usize),
    /// Not served (Kubernetes before 1.33, or turned off with --runtime-config).
    NotServed,
    /// The list failed otherwise (API away, forbidden): the watch finds out later.
    Unknown(String),
}

/// The warning when no Service range is known, or None.
pub fn service_range_warning(flags: &[IpNet], api: &ServiceCidrApi) -> Option<String> {
    if !flags.is_empty() {
        return None;
    }
    let why = match api {
        ServiceCidrApi::Served(n) if *n > 0 => return None,
        // Not known yet: the ServiceCIDR watch keeps trying, and nothing is allocated before
        // it has listed; said all the same, since a lasting refusal (RBAC) leaves it unknown.
        ServiceCidrApi::Unknown(e) => &format!("listing ServiceCIDRs failed ({e})"),
        ServiceCidrApi::Served(_) => "the API server has no ServiceCIDR objects",
        ServiceCidrApi::NotServed => {
            "the API server does not serve ServiceCIDRs (networking.k8s.io/v1, Kubernetes 1.33+)"
        }
    };
    Some(format!(
        "no Service range is known: {why} and --service-cidr is not set, so nothing keeps pod \
         ranges off Service IPs; set --service-cidr to the API server's \
         --service-cluster-ip-range"
    ))
}

/// The pod networks of flannel's `net-conf.json`: `Network` (unless `EnableIPv4` is false)
/// and `IPv6Network` (when `EnableIPv6`). An error names the key and the reason.
pub fn flannel_networks(net_conf: &str) -> Result<Vec<IpNet>, String> {
    let conf: serde_json::Value =
        serde_json::from_str(net_conf).map_err(|e| format!("{NET_CONF_KEY}: {e}"))?;
    let flag =
        |key: &str, default: bool| conf.get(key).and_then(|v| v.as_bool()).unwrap_or(default);
    let mut out = Vec::new();
    for (key, enabled) in [
        ("Network", flag("EnableIPv4", true)),
        ("IPv6Network", flag("EnableIPv6", false)),
    ] {
        let Some(value) = conf.get(key).and_then(|v| v.as_str()).filter(|_| enabled) else {
            continue;
        };
        let net = nodeipam_crd::range::parse_cidr(value.trim())
            .map_err(|e| format!("{NET_CONF_KEY}: {key} {value:?}: {e}"))?;
        out.push(net.trunc());
    }
    Ok(out)
}

/// The pod network the consumers are configured for: the flag's supernets and flannel's,
/// without repeats. A range inside any of its family's is inside.
pub fn supernets(flags: &[IpNet], flannel: &[IpNet]) -> Vec<IpNet> {
    let mut out = flags.to_vec();
    out.extend(flannel.iter().filter(|n| !flags.contains(n)));
    out
}

/// One warning per config range outside the pod network: (config, warning). The words are
/// the webhook's admission warning, so a range gets the same one at admission and at start.
pub fn outside_pod_network(
    configs: &[(String, Vec<(&'static str, IpNet)>)],
    supernets: &[IpNet],
) -> Vec<(String, String)> {
    configs
        .iter()
        .flat_map(|(name, ranges)| {
            ranges.iter().filter_map(move |(path, cidr)| {
                nodeipam_webhook::outside_supernets(path, cidr, supernets)
                    .map(|w| (name.clone(), format!("NodeIPAMConfig {name}: {w}")))
            })
        })
        .collect()
}

/// A config's ranges with their field paths; a CIDR that does not parse is the webhook's and
/// the status's business, not this check's.
fn config_ranges(config: &NodeIPAMConfig) -> Vec<(&'static str, IpNet)> {
    [
        ("spec.ipv4.cidr", &config.spec.ipv4),
        ("spec.ipv6.cidr", &config.spec.ipv6),
    ]
    .into_iter()
    .filter_map(|(path, family)| {
        let cidr = nodeipam_crd::range::parse_cidr(&family.as_ref()?.cidr).ok()?;
        Some((path, cidr))
    })
    .collect()
}

/// An error and its causes on one line, each cause said once: kube and hyper repeat the
/// message of the error they wrap ("ServiceError: client error (Connect)" above "client error
/// (Connect)"), which says nothing twice as loud.
pub fn cause_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut next = Some(e);
    while let Some(err) = next {
        let msg = err.to_string();
        if !parts.iter().any(|p| p.contains(&msg)) {
            parts.retain(|p| !msg.contains(p.as_str()));
            parts.push(msg);
        }
        next = err.source();
    }
    parts.join(": ")
}

/// Asks the API server for its version once; when it cannot be reached, says so on one line
/// naming its URL (the watches retry on their own, so start-up goes on).
pub async fn probe_api_server(client: &Client, url: &str) {
    match client.apiserver_version().await {
        Ok(v) => info!(server = url, version = %v.git_version, "API server reached"),
        Err(e) => warn!(
            "cannot reach the Kubernetes API server at {url}: {}; retrying",
            cause_chain(&e)
        ),
    }
}

/// Where start-up warnings not about one config are recorded: the controller's Lease, in its
/// namespace, so `kubectl get events -n <namespace>` shows them next to the election's.
pub struct Subject {
    pub namespace: String,
    pub lease: String,
    pub instance: Option<String>,
}

/// Reads flannel's pod network, if its ConfigMap is there and readable. Absent (404) in both
/// namespaces is no flannel, said at debug; a read that failed otherwise (403: RBAC without the
/// ClusterRole's rule) is one warning, since ranges outside flannel's Network then go unwarned.
pub async fn read_flannel(client: &Client) -> Vec<IpNet> {
    let mut failed = Vec::new();
    for ns in FLANNEL_NAMESPACES {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let cm = match api.get_opt(FLANNEL_CONFIGMAP).await {
            Ok(Some(cm)) => cm,
            Ok(None) => continue,
            // The API server's message names the namespace and, for a 403, the missing right.
            Err(kube::Error::Api(s)) => {
                failed.push(format!("{} ({})", s.message, s.code));
                continue;
            }
            Err(e) => {
                failed.push(format!("{ns}: {}", cause_chain(&e)));
                continue;
            }
        };
        let conf = cm.data.as_ref().and_then(|d| d.get(NET_CONF_KEY));
        match conf.map(|c| flannel_networks(c)) {
            Some(Ok(nets)) => {
                let shown: Vec<String> = nets.iter().map(ToString::to_string).collect();
                info!(configmap = %format!("{ns}/{FLANNEL_CONFIGMAP}"), network = %shown.join(","), "flannel's pod network read: ranges outside it get a warning");
                return nets;
            }
            Some(Err(e)) => {
                warn!(configmap = %format!("{ns}/{FLANNEL_CONFIGMAP}"), "flannel's {e}")
            }
            None => {
                warn!(configmap = %format!("{ns}/{FLANNEL_CONFIGMAP}"), "flannel's ConfigMap has no {NET_CONF_KEY}")
            }
        }
        return Vec::new();
    }
    if failed.is_empty() {
        debug!("no flannel ConfigMap {FLANNEL_CONFIGMAP} in {FLANNEL_NAMESPACES:?}");
    } else {
        warn!(
            "cannot learn flannel's pod network: reading ConfigMap {FLANNEL_CONFIGMAP} failed ({}); ranges outside it get no warning",
            failed.join("; ")
        );
    }
    Vec::new()
}

async fn service_cidr_api(client: &Client) -> ServiceCidrApi {
    let api: Api<ServiceCIDR> = Api::all(client.clone());
    match api.list_metadata(&ListParams::default().limit(1)).await {
        Ok(list) => ServiceCidrApi::Served(list.items.len()),
        Err(kube::Error::Api(s)) if s.code == 404 => ServiceCidrApi::NotServed,
        Err(e) => ServiceCidrApi::Unknown(e.to_string()),
    }
}

/// Runs the checks once and reports: a log line, an Event and a metric per warning.
pub async fn check(
    client: &Client,
    service_cidrs: &[IpNet],
    supernets: &[IpNet],
    subject: &Subject,
    metrics: &Metrics,
) {
    let events = Events::new(client.clone(), subject.instance.clone());
    let api = service_cidr_api(client).await;
    let unknown = service_range_warning(service_cidrs, &api);
    metrics
        .service_ranges_known
        .set(i64::from(unknown.is_none()));
    if let Some(w) = unknown {
        warn!("{w}");
        let lease = lease_ref(subject);
        events
            .publish(WARNING, "ServiceRangeUnknown", START, &w, &lease)
            .await;
    }
    let listed = Api::<NodeIPAMConfig>::all(client.clone())
        .list(&ListParams::default())
        .await;
    let configs: Vec<_> = match listed {
        Ok(list) => list.items,
        Err(e) => {
            debug!(error = %e, "cannot list NodeIPAMConfigs for the pod-network check");
            return;
        }
    };
    let ranges: Vec<_> = configs
        .iter()
        .map(|c| {
            (
                c.metadata.name.clone().unwrap_or_default(),
                config_ranges(c),
            )
        })
        .collect();
    let outside = outside_pod_network(&ranges, supernets);
    metrics
        .ranges_outside_pod_network
        .set(i64::try_from(outside.len()).unwrap_or(i64::MAX));
    for (name, w) in outside {
        warn!("{w}");
        if let Some(config) = configs
            .iter()
            .find(|c| c.metadata.name.as_ref() == Some(&name))
        {
            let config = config.object_ref(&());
            events
                .publish(WARNING, "OutsidePodNetwork", START, &w, &config)
                .await;
        }
    }
}

fn lease_ref(subject: &Subject) -> k8s_openapi::api::core::v1::ObjectReference {
    use k8s_openapi::api::coordination::v1::Lease;
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(<Lease as k8s_openapi::Resource>::API_VERSION.into()),
        kind: Some(<Lease as k8s_openapi::Resource>::KIND.into()),
        namespace: Some(subject.namespace.clone()),
        name: Some(subject.lease.clone()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().expect("cidr")
    }

    #[test]
    fn a_service_range_is_known_from_the_flag_or_the_api() {
        let flag = [net("10.96.0.0/12")];
        assert_eq!(
            service_range_warning(&flag, &ServiceCidrApi::NotServed),
            None
        );
        assert_eq!(service_range_warning(&[], &ServiceCidrApi::Served(1)), None);
        let w = service_range_warning(&[], &ServiceCidrApi::NotServed).expect("warned");
        assert!(
            w.contains("--service-cidr") && w.contains("does not serve"),
            "{w}"
        );
        let w = service_range_warning(&[], &ServiceCidrApi::Served(0)).expect("warned");
        assert!(w.contains("no ServiceCIDR objects"), "{w}");
        let w = service_range_warning(&[], &ServiceCidrApi::Unknown("forbidden".into()))
            .expect("a range not known is not known");
        assert!(w.contains("listing ServiceCIDRs failed (forbidden)"), "{w}");
        assert_eq!(
            service_range_warning(&flag, &ServiceCidrApi::Unknown("forbidden".into())),
            None
        );
    }

    #[derive(Debug)]
    struct Wrap(&'static str, Option<Box<Wrap>>);
    impl std::fmt::Display for Wrap {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Wrap {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|w| w as _)
        }
    }

    #[test]
    fn each_cause_is_said_once() {
        let e = Wrap(
            "ServiceError: client error (Connect)",
            Some(Box::new(Wrap(
                "client error (Connect)",
                Some(Box::new(Wrap(
                    "tcp connect error",
                    Some(Box::new(Wrap("Connection refused (os error 111)", None))),
                ))),
            ))),
        );
        assert_eq!(
            cause_chain(&e),
            "ServiceError: client error (Connect): tcp connect error: Connection refused (os error 111)"
        );
    }

    #[test]
    fn flannel_net_conf() {
        let v4 = r#"{"Network": "10.244.0.0/16", "Backend": {"Type": "vxlan"}}"#;
        assert_eq!(flannel_networks(v4), Ok(vec![net("10.244.0.0/16")]));
        let dual =
            r#"{"Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/56"}"#;
        assert_eq!(
            flannel_networks(dual),
            Ok(vec![net("10.244.0.0/16"), net("fd00:244::/56")])
        );
        let v6 = r#"{"EnableIPv4": false, "Network": "10.244.0.0/16", "EnableIPv6": true, "IPv6Network": "fd00:244::/56"}"#;
        assert_eq!(flannel_networks(v6), Ok(vec![net("fd00:244::/56")]));
        let e = flannel_networks(r#"{"Network": "10.244.0.0/33"}"#).expect_err("bad");
        assert!(e.contains("Network") && e.contains("10.244.0.0/33"), "{e}");
        assert!(flannel_networks("not json").is_err());
    }

    #[test]
    fn ranges_outside_the_pod_network_are_named() {
        let all = supernets(
            &[net("10.240.0.0/12")],
            &[net("10.244.0.0/16"), net("10.240.0.0/12")],
        );
        assert_eq!(all, [net("10.240.0.0/12"), net("10.244.0.0/16")]);
        let flannel = [net("10.244.0.0/16")];
        let configs = vec![
            (
                "inside".to_string(),
                vec![("spec.ipv4.cidr", net("10.244.8.0/21"))],
            ),
            (
                "outside".to_string(),
                vec![
                    ("spec.ipv4.cidr", net("10.64.0.0/16")),
                    ("spec.ipv6.cidr", net("fd00:64::/56")),
                ],
            ),
        ];
        let w = outside_pod_network(&configs, &flannel);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "outside");
        assert!(
            w[0].1.contains("spec.ipv4.cidr: 10.64.0.0/16") && w[0].1.contains("10.244.0.0/16"),
            "{w:?}"
        );
        assert!(
            outside_pod_network(&configs, &[]).is_empty(),
            "nothing declared, nothing to check"
        );
    }
}
