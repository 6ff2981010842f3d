//! The pod network as consumers (kube-proxy, ip-masq-agent, CNIs) must see it, and its renderings.
//! Pure: no client.
//!
//! The rule: the pod network is the union of the CIDRs of every NodeIPAMConfig whose `Drained`
//! condition is not True, and the unmanaged podCIDRs that nodes already hold. A new range joins
//! before its first block is handed out; a removed range leaves only once it is drained.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use indexmap::IndexMap;
use ipnet::IpNet;
/// Whether the union of some CIDRs covers a range: shared with the webhook through
/// `nodeipam_crd::range`, re-exported under the name the machine and the simulator use.
pub use nodeipam_crd::range::covered;
use serde::Serialize;

/// The outputs' vocabulary, under the names the machine, the publisher and the CLI use.
pub use crate::outputs::{OutputContent, OutputKind, OutputRef};

/// Where a range stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum RangeState {
    /// Handing out blocks (or would, but for capacity, an overlap or a pending gate).
    Active,
    /// `allocation: Disabled`, nodes still hold blocks.
    Disabled,
    /// Being deleted, nodes still hold blocks.
    Draining,
    /// Held by a node but in no config.
    Unmanaged,
}

impl RangeState {
    pub fn as_str(self) -> &'static str {
        match self {
            RangeState::Active => "Active",
            RangeState::Disabled => "Disabled",
            RangeState::Draining => "Draining",
            RangeState::Unmanaged => "Unmanaged",
        }
    }
}

/// One config as the pod network needs it.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfigRanges {
    pub name: String,
    /// (range, allocated blocks, capacity in blocks), IPv4 first.
    pub families: Vec<(IpNet, u64, u64)>,
    pub nodes: u64,
    pub deleting: bool,
    pub enabled: bool,
    pub drained: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Entry {
    pub cidr: IpNet,
    pub family: &'static str,
    pub config: Option<String>,
    pub state: RangeState,
    pub nodes: u64,
    pub allocated: Option<u64>,
    pub capacity: Option<u64>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PodNetwork {
    pub entries: Vec<Entry>,
    /// Which publication this is, numbered by the allocation loop in the order it sends them,
    /// so that the answer for one also accounts for every earlier one the publisher skipped:
    /// two publications can have the same content.
    #[serde(skip)]
    pub seq: u64,
}

fn family(c: &IpNet) -> &'static str {
    match c {
        IpNet::V4(_) => "IPv4",
        IpNet::V6(_) => "IPv6",
    }
}

/// The most a ConfigMap's data may hold: the API server refuses a larger one.
pub const CONFIGMAP_LIMIT: usize = 1024 * 1024;

pub(crate) fn join(cidrs: impl IntoIterator<Item = IpNet>) -> String {
    cidrs
        .into_iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The unmanaged podCIDRs merged into the fewest ranges that hold exactly their addresses,
/// each with the nodes holding blocks in it. One by one they can pass the API server's 1 MiB
/// limit on the ConfigMap: a cluster from kcm has a block per node, and kcm hands them out
/// side by side, so they merge into a few ranges.
fn unmanaged_ranges(unmanaged: &[(IpNet, String)]) -> BTreeMap<IpNet, BTreeSet<&str>> {
    let blocks: Vec<IpNet> = unmanaged.iter().map(|(c, _)| *c).collect();
    let mut ranges: BTreeMap<IpNet, BTreeSet<&str>> = IpNet::aggregate(&blocks)
        .into_iter()
        .map(|r| (r, BTreeSet::new()))
        .collect();
    for (cidr, node) in unmanaged {
        // The merged ranges do not overlap: the one holding this block starts at or before it.
        let holder = ranges
            .range_mut(..=*cidr)
            .next_back()
            .filter(|(r, _)| r.contains(cidr));
        if let Some((_, nodes)) = holder {
            nodes.insert(node);
        }
    }
    ranges
}

impl PodNetwork {
    /// Builds the network from the configs (drained ones leave it) and the unmanaged podCIDRs
    /// with the nodes holding them.
    pub fn new(configs: &[ConfigRanges], unmanaged: &[(IpNet, String)]) -> Self {
        let mut entries = Vec::new();
        for c in configs.iter().filter(|c| !c.drained) {
            let state = if c.deleting {
                RangeState::Draining
            } else if !c.enabled {
                RangeState::Disabled
            } else {
                RangeState::Active
            };
            for (cidr, allocated, capacity) in &c.families {
                entries.push(Entry {
                    cidr: *cidr,
                    family: family(cidr),
                    config: Some(c.name.clone()),
                    state,
                    nodes: c.nodes,
                    allocated: Some(*allocated),
                    capacity: Some(*capacity),
                });
            }
        }
        for (cidr, nodes) in unmanaged_ranges(unmanaged) {
            entries.push(Entry {
                cidr,
                family: family(&cidr),
                config: None,
                state: RangeState::Unmanaged,
                nodes: nodes.len() as u64,
                allocated: None,
                capacity: None,
            });
        }
        entries.sort_by(|a, b| (a.family, a.cidr, &a.config).cmp(&(b.family, b.cidr, &b.config)));
        PodNetwork { entries, seq: 0 }
    }

    /// Every CIDR of the network, sorted.
    pub fn cidrs(&self) -> BTreeSet<IpNet> {
        self.entries.iter().map(|e| e.cidr).collect()
    }

    /// Adjacent and nested CIDRs merged, for consumers with a limit (ip-masq-agent: 64).
    pub fn aggregated(&self) -> Vec<IpNet> {
        IpNet::aggregate(&self.cidrs().into_iter().collect())
    }

    fn in_states(&self, states: &[RangeState]) -> BTreeSet<IpNet> {
        self.entries
            .iter()
            .filter(|e| states.contains(&e.state))
            .map(|e| e.cidr)
            .collect()
    }

    /// The keys of the published ConfigMap. `observed_at` is RFC 3339.
    pub fn configmap_data(&self, observed_at: &str) -> BTreeMap<String, String> {
        let all = self.cidrs();
        let mut data = BTreeMap::new();
        data.insert(
            "ipv4".into(),
            join(all.iter().copied().filter(|c| matches!(c, IpNet::V4(_)))),
        );
        data.insert(
            "ipv6".into(),
            join(all.iter().copied().filter(|c| matches!(c, IpNet::V6(_)))),
        );
        data.insert("active".into(), join(self.in_states(&[RangeState::Active])));
        data.insert(
            "draining".into(),
            join(self.in_states(&[RangeState::Draining, RangeState::Disabled])),
        );
        data.insert(
            "unmanaged".into(),
            join(self.in_states(&[RangeState::Unmanaged])),
        );
        data.insert("aggregated".into(), join(self.aggregated()));
        data.insert("observedAt".into(), observed_at.into());
        data
    }

    /// What the API server counts of a ConfigMap holding `data` against its 1 MiB limit
    /// ([`CONFIGMAP_LIMIT`]): every key and value.
    pub fn configmap_bytes(data: &BTreeMap<String, String>) -> usize {
        data.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// A `--cluster-cidr` value for kube-proxy: one range per family at most. Otherwise an
    /// explanation of why it cannot be expressed and what to use instead.
    pub fn kube_proxy_cluster_cidr(&self) -> Result<String, String> {
        let agg = self.aggregated();
        let v4: Vec<&IpNet> = agg.iter().filter(|c| matches!(c, IpNet::V4(_))).collect();
        let v6: Vec<&IpNet> = agg.iter().filter(|c| matches!(c, IpNet::V6(_))).collect();
        if agg.is_empty() {
            return Err("the pod network is empty: no NodeIPAMConfig holds a range yet".into());
        }
        if v4.len() > 1 || v6.len() > 1 {
            return Err(format!(
                "kube-proxy's --cluster-cidr takes at most one CIDR per family, but the pod network has {} IPv4 and {} IPv6 ranges that do not merge ({}).\n\
                 Run kube-proxy with --detect-local-mode=NodeCIDR (it then uses each node's own podCIDRs), \
                 and use `nodeipam ranges --format no-masquerade-cidrs` where KubeProxyConfiguration.noMasqueradeCIDRs is available (only proposed so far, KEP-6246).",
                v4.len(),
                v6.len(),
                join(agg.iter().copied())
            ));
        }
        Ok(format!(
            "--cluster-cidr={}",
            join(v4.into_iter().chain(v6).copied())
        ))
    }

    /// A KubeProxyConfiguration snippet with `noMasqueradeCIDRs`. The field is only proposed
    /// (KEP-6246): the snippet says so in a comment, since no released kube-proxy reads it.
    pub fn no_masquerade_snippet(&self) -> String {
        let mut out = String::from(
            "# noMasqueradeCIDRs is only proposed (KEP-6246): no released kube-proxy reads it.\n\
             apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nnoMasqueradeCIDRs:\n",
        );
        for c in self.aggregated() {
            let _ = writeln!(out, "- {c}");
        }
        if self.entries.is_empty() {
            out = out.replace("noMasqueradeCIDRs:\n", "noMasqueradeCIDRs: []\n");
        }
        out
    }

    /// The human table of `nodeipam ranges`.
    pub fn table(&self) -> String {
        let rows: Vec<[String; 6]> = self
            .entries
            .iter()
            .map(|e| {
                [
                    e.cidr.to_string(),
                    e.family.to_string(),
                    e.config.clone().unwrap_or_else(|| "-".into()),
                    e.state.as_str().to_string(),
                    e.nodes.to_string(),
                    match (e.allocated, e.capacity) {
                        (Some(a), Some(c)) => format!("{a}/{c}"),
                        _ => "-".into(),
                    },
                ]
            })
            .collect();
        let header = ["CIDR", "FAMILY", "CONFIG", "STATE", "NODES", "ALLOCATED"].map(String::from);
        columns(&header, &rows)
    }
}

/// Rows under a header, each column as wide as its widest cell, as kubectl prints tables.
pub fn columns<const N: usize>(header: &[String; N], rows: &[[String; N]]) -> String {
    let rows: Vec<&[String]> = rows.iter().map(|r| r.as_slice()).collect();
    table(header, &rows)
}

/// [`columns`] for tables whose width is known at run time only; a short row is padded.
pub fn table(header: &[String], rows: &[&[String]]) -> String {
    let mut widths: Vec<usize> = header.iter().map(String::len).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for r in std::iter::once(header).chain(rows.iter().copied()) {
        let line: Vec<String> = widths
            .iter()
            .enumerate()
            .map(|(i, w)| format!("{:<w$}", r.get(i).map_or("", String::as_str)))
            .collect();
        let _ = writeln!(out, "{}", line.join("   ").trim_end());
    }
    out
}

/// The `nonMasqueradeCIDRs` we write: the aggregated pod network, then `extra`.
pub fn ip_masq_agent_cidrs(network: &PodNetwork, extra: &[IpNet]) -> Vec<IpNet> {
    let mut cidrs: Vec<IpNet> = network.aggregated();
    for e in extra {
        if !cidrs.contains(e) {
            cidrs.push(*e);
        }
    }
    cidrs
}

/// ip-masq-agent's `config` key with `nonMasqueradeCIDRs` set to the pod network plus
/// `extra`, keeping every other setting of `existing` (`masqLinkLocal`, `masqLinkLocalIPv6`,
/// `resyncInterval`, and any key this version does not know).
pub fn ip_masq_agent_config(
    existing: Option<&str>,
    network: &PodNetwork,
    extra: &[IpNet],
) -> Result<String, String> {
    // The user's other settings keep their order: the config is rewritten, not reformatted.
    let mut doc: IndexMap<String, serde_json::Value> =
        match existing.map(str::trim).filter(|s| !s.is_empty()) {
            // ip-masq-agent reads YAML or JSON; YAML parses both.
            Some(text) => match serde_saphyr::from_str::<serde_json::Value>(text) {
                Ok(serde_json::Value::Object(_)) => serde_saphyr::from_str(text)
                    .map_err(|e| format!("ip-masq-agent config is not valid YAML: {e}"))?,
                Ok(other) => {
                    return Err(format!(
                        "ip-masq-agent config: expected a mapping, found {other}"
                    ));
                }
                Err(e) => return Err(format!("ip-masq-agent config is not valid YAML: {e}")),
            },
            None => IndexMap::new(),
        };
    let list = ip_masq_agent_cidrs(network, extra)
        .into_iter()
        .map(|c| serde_json::Value::String(c.to_string()))
        .collect();
    doc.insert("nonMasqueradeCIDRs".into(), serde_json::Value::Array(list));
    serde_saphyr::to_string(&doc).map_err(|e| format!("rendering ip-masq-agent config: {e}"))
}

/// A ConfigMap by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigMapRef {
    pub namespace: String,
    pub name: String,
}

impl std::str::FromStr for ConfigMapRef {
    type Err = String;
    /// `namespace/name`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ConfigMapRef {
                    namespace: ns.into(),
                    name: name.into(),
                })
            }
            _ => Err(format!("{s:?} is not namespace/name")),
        }
    }
}

impl std::fmt::Display for ConfigMapRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configmap_size_counts_every_key_and_value() {
        let data = BTreeMap::from([
            ("ipv4".to_string(), "10.0.0.0/8".to_string()),
            ("observedAt".to_string(), String::new()),
        ]);
        assert_eq!(PodNetwork::configmap_bytes(&data), 4 + 10 + 10);
        assert_eq!(PodNetwork::configmap_bytes(&BTreeMap::new()), 0);
    }

    fn n(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn sample() -> PodNetwork {
        let configs = vec![
            ConfigRanges {
                name: "a".into(),
                families: vec![(n("10.0.0.0/17"), 3, 128), (n("fd00::/48"), 3, 65536)],
                nodes: 3,
                deleting: false,
                enabled: true,
                drained: false,
            },
            ConfigRanges {
                name: "b".into(),
                families: vec![(n("10.0.128.0/17"), 1, 128)],
                nodes: 1,
                deleting: true,
                enabled: true,
                drained: false,
            },
            ConfigRanges {
                name: "gone".into(),
                families: vec![(n("10.9.0.0/16"), 0, 256)],
                nodes: 0,
                deleting: true,
                enabled: true,
                drained: true,
            },
            ConfigRanges {
                name: "off".into(),
                families: vec![(n("10.7.0.0/16"), 2, 256)],
                nodes: 2,
                deleting: false,
                enabled: false,
                drained: false,
            },
        ];
        PodNetwork::new(
            &configs,
            &[
                (n("192.168.1.0/24"), "old-1".into()),
                (n("192.168.1.0/24"), "old-2".into()),
            ],
        )
    }

    #[test]
    fn unmanaged_blocks_side_by_side_merge_and_count_their_nodes() {
        let unmanaged: Vec<(IpNet, String)> = (0..4096u32)
            .map(|i| {
                let net = std::net::Ipv4Addr::from(0x0a00_0000 + i * 256);
                (
                    IpNet::V4(ipnet::Ipv4Net::new(net, 24).expect("net")),
                    format!("n{i}"),
                )
            })
            .chain([
                (n("192.168.7.0/24"), "far".into()),
                (n("192.168.7.128/25"), "inside-far".into()),
            ])
            .collect();
        let net = PodNetwork::new(&[], &unmanaged);
        let got: Vec<(String, u64)> = net
            .entries
            .iter()
            .map(|e| (e.cidr.to_string(), e.nodes))
            .collect();
        assert_eq!(
            got,
            vec![("10.0.0.0/12".into(), 4096), ("192.168.7.0/24".into(), 2)]
        );
        let data = net.configmap_data("t");
        assert_eq!(data["unmanaged"], "10.0.0.0/12,192.168.7.0/24");
        assert_eq!(data["ipv4"], data["unmanaged"]);
    }

    proptest::proptest! {
        /// Merged, the unmanaged ranges hold exactly the addresses of the blocks, and each
        /// counts the nodes whose blocks it holds.
        #[test]
        fn merged_unmanaged_ranges_hold_exactly_the_blocks(
            blocks in proptest::collection::vec((0u32..64, 22u8..=26, 0u8..4), 0..40)
        ) {
            let unmanaged: Vec<(IpNet, String)> = blocks
                .iter()
                .map(|(at, len, node)| {
                    let addr = std::net::Ipv4Addr::from(0x0a00_0000 + at * 64);
                    let net = ipnet::Ipv4Net::new(addr, *len).expect("net").trunc();
                    (IpNet::V4(net), format!("n{node}"))
                })
                .collect();
            let cidrs: Vec<IpNet> = unmanaged.iter().map(|(c, _)| *c).collect();
            let net = PodNetwork::new(&[], &unmanaged);
            let ranges: Vec<IpNet> = net.entries.iter().map(|e| e.cidr).collect();
            for c in &cidrs {
                proptest::prop_assert!(covered(c, &ranges), "{c} lost");
            }
            for e in &net.entries {
                proptest::prop_assert!(covered(&e.cidr, &cidrs), "{} added", e.cidr);
                let nodes: BTreeSet<&String> = unmanaged
                    .iter()
                    .filter(|(c, _)| e.cidr.contains(c))
                    .map(|(_, n)| n)
                    .collect();
                proptest::prop_assert_eq!(e.nodes, nodes.len() as u64);
            }
        }
    }

    #[test]
    fn drained_ranges_leave_and_states_are_kept() {
        let net = sample();
        assert!(
            !net.cidrs().contains(&n("10.9.0.0/16")),
            "drained config must leave the network"
        );
        let data = net.configmap_data("2026-01-01T00:00:00Z");
        assert_eq!(
            data["ipv4"],
            "10.0.0.0/17,10.0.128.0/17,10.7.0.0/16,192.168.1.0/24"
        );
        assert_eq!(data["ipv6"], "fd00::/48");
        assert_eq!(data["active"], "10.0.0.0/17,fd00::/48");
        assert_eq!(data["draining"], "10.0.128.0/17,10.7.0.0/16");
        assert_eq!(data["unmanaged"], "192.168.1.0/24");
        assert_eq!(
            data["aggregated"],
            "10.0.0.0/16,10.7.0.0/16,192.168.1.0/24,fd00::/48"
        );
        assert_eq!(data["observedAt"], "2026-01-01T00:00:00Z");
        let unmanaged = net
            .entries
            .iter()
            .find(|e| e.state == RangeState::Unmanaged)
            .expect("unmanaged");
        assert_eq!(unmanaged.nodes, 2);
    }

    #[test]
    fn kube_proxy_needs_one_range_per_family() {
        let one = PodNetwork::new(
            &[ConfigRanges {
                name: "a".into(),
                families: vec![(n("10.0.0.0/17"), 0, 1), (n("fd00::/48"), 0, 1)],
                nodes: 0,
                deleting: false,
                enabled: true,
                drained: false,
            }],
            &[],
        );
        assert_eq!(
            one.kube_proxy_cluster_cidr(),
            Ok("--cluster-cidr=10.0.0.0/17,fd00::/48".into())
        );
        let err = sample()
            .kube_proxy_cluster_cidr()
            .expect_err("three IPv4 ranges");
        assert!(err.contains("--detect-local-mode=NodeCIDR"), "{err}");
        assert!(PodNetwork::default().kube_proxy_cluster_cidr().is_err());
    }

    #[test]
    fn ip_masq_agent_keeps_user_settings() {
        let existing = "nonMasqueradeCIDRs: [1.2.3.0/24]\nmasqLinkLocal: true\nresyncInterval: 60s\nfutureKey: {a: 1}\n";
        let out = ip_masq_agent_config(Some(existing), &sample(), &[n("169.254.0.0/16")])
            .expect("renders");
        let v: serde_json::Value = serde_saphyr::from_str(&out).expect("valid YAML");
        assert_eq!(v["masqLinkLocal"], serde_json::Value::Bool(true));
        assert_eq!(v["resyncInterval"], serde_json::Value::String("60s".into()));
        assert!(v["futureKey"].is_object());
        // Rewritten in the user's order, the list we own where it was.
        let keys: Vec<&str> = out.lines().filter(|l| !l.starts_with([' ', '-'])).collect();
        assert!(keys[0].starts_with("nonMasqueradeCIDRs:"), "{out}");
        assert!(keys[1].starts_with("masqLinkLocal:"), "{out}");
        assert!(keys[3].starts_with("futureKey:"), "{out}");
        let cidrs: Vec<String> = v["nonMasqueradeCIDRs"]
            .as_array()
            .expect("list")
            .iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect();
        assert_eq!(
            cidrs,
            vec![
                "10.0.0.0/16",
                "10.7.0.0/16",
                "192.168.1.0/24",
                "fd00::/48",
                "169.254.0.0/16"
            ]
        );
        // JSON input works too; garbage is an error, not a panic.
        assert!(
            ip_masq_agent_config(Some("{\"masqLinkLocalIPv6\": true}"), &sample(), &[])
                .expect("json")
                .contains("masqLinkLocalIPv6: true")
        );
        assert!(ip_masq_agent_config(Some("- a list"), &sample(), &[]).is_err());
        assert!(ip_masq_agent_config(Some("{unclosed"), &sample(), &[]).is_err());
    }

    #[test]
    fn table_and_snippet() {
        let t = sample().table();
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("CIDR"), "{t}");
        assert!(
            t.contains("Draining")
                && t.contains("Disabled")
                && t.contains("Unmanaged")
                && t.contains("3/128"),
            "{t}"
        );
        let s = sample().no_masquerade_snippet();
        assert!(
            s.contains("kind: KubeProxyConfiguration") && s.contains("- 10.0.0.0/16"),
            "{s}"
        );
        assert!(
            s.starts_with("# noMasqueradeCIDRs is only proposed (KEP-6246)"),
            "{s}"
        );
        assert!(
            PodNetwork::default()
                .no_masquerade_snippet()
                .contains("noMasqueradeCIDRs: []")
        );
    }

    #[test]
    fn covered_means_every_address_is_in_the_union() {
        let list = [n("10.0.0.0/17"), n("10.0.128.0/17"), n("fd00::/48")];
        assert!(
            covered(&n("10.0.0.0/16"), &list),
            "two halves cover the whole"
        );
        assert!(covered(&n("10.0.5.0/24"), &list));
        assert!(covered(&n("fd00::/64"), &list));
        assert!(!covered(&n("10.0.0.0/15"), &list));
        assert!(!covered(&n("10.1.0.0/24"), &list));
        assert!(!covered(&n("fd01::/64"), &list));
        assert!(!covered(&n("10.0.0.0/16"), &[n("10.0.0.0/17")]));
        assert!(!covered(&n("10.0.0.0/16"), &[]));
        assert!(covered(&n("::/0"), &[n("::/1"), n("8000::/1")]));
        assert!(covered(&n("0.0.0.0/0"), &[n("0.0.0.0/0")]));
        // No mixing of families: ::/96 is not 0.0.0.0/0.
        assert!(!covered(&n("0.0.0.0/0"), &[n("::/0")]));
    }

    #[test]
    fn outputs_read_what_consumers_read_and_compare_only_what_is_ours() {
        let network = sample();
        let data = network.configmap_data("2026-01-01T00:00:00Z");
        let written = OutputKind::PodNetwork.read(&data);
        let cm = ConfigMapRef {
            namespace: "ns".into(),
            name: "cm".into(),
        };
        let ours = OutputRef::configmap(&cm, OutputKind::PodNetwork);
        assert_eq!(written, ours.desired(&network, &[]));
        assert_eq!(written.cidrs.len(), network.cidrs().len());
        // Only observedAt moved: the same content.
        let later = network.configmap_data("2026-01-02T00:00:00Z");
        assert_eq!(OutputKind::PodNetwork.read(&later), written);
        let mut edited = data.clone();
        edited.insert("ipv4".into(), String::new());
        assert_ne!(OutputKind::PodNetwork.read(&edited), written);

        let extra = [n("169.254.0.0/16")];
        let config =
            ip_masq_agent_config(Some("masqLinkLocal: true\n"), &network, &extra).expect("renders");
        let masq = BTreeMap::from([("config".to_string(), config)]);
        let read = OutputKind::IpMasqAgent.read(&masq);
        let masq_ref = OutputRef::configmap(&cm, OutputKind::IpMasqAgent);
        assert_eq!(read, masq_ref.desired(&network, &extra));
        assert!(read.cidrs.contains(&n("169.254.0.0/16")));
        // Unreadable YAML holds nothing a consumer could use.
        let broken = BTreeMap::from([("config".to_string(), "nonMasqueradeCIDRs: [".to_string())]);
        assert_eq!(
            OutputKind::IpMasqAgent.read(&broken).cidrs,
            Vec::<IpNet>::new()
        );
    }
}
