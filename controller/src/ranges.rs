//! `nodeipam ranges`: reads the configs and nodes of a cluster and prints the pod network in a
//! format a person or a consumer (ip-masq-agent, kube-proxy) can use.

use clap::ValueEnum;
use ipnet::IpNet;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use nodeipam_crd::range::overlaps;
use nodeipam_crd::{Allocation, CONDITION_DRAINED, FamilySpec, NodeIPAMConfig};

use crate::alloc::podnetwork::{ConfigRanges, PodNetwork, ip_masq_agent_config};
use crate::node::IpamNode;

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// CIDR, family, config, state, nodes, allocated/capacity.
    Table,
    /// The table with free blocks and usage.
    Wide,
    Json,
    Yaml,
    /// The CIDRs, one a line.
    Name,
    /// The `config` key of ip-masq-agent's ConfigMap.
    IpMasqAgent,
    /// A kube-proxy `--cluster-cidr` value, when one range per family covers it.
    KubeProxy,
    /// A KubeProxyConfiguration snippet with `noMasqueradeCIDRs`: a field only proposed
    /// (KEP-6246) that no released kube-proxy reads.
    NoMasqueradeCidrs,
}

#[derive(Debug, thiserror::Error)]
pub enum RangesError {
    #[error(
        "the NodeIPAMConfig CRD (nodeipamconfigs.nodeipam.io) is not installed in this cluster: \
         apply config/crd first (kubectl apply -k config/crd)"
    )]
    CrdMissing,
    // The cause is its source, said once by whoever prints the chain.
    #[error("listing {what}")]
    List {
        what: &'static str,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Render(String),
}

/// Exit status of a command that did what was asked.
pub const EXIT_OK: u8 = 0;
/// Exit status of a command that ran and found something wrong (`check`'s inconsistencies, a
/// `migrate` that cannot convert).
pub const EXIT_FOUND: u8 = 1;
/// Exit status of a command that could not run: a bad flag or kubeconfig, an API server it
/// cannot reach or that refuses it, a CRD not installed. clap's usage errors exit 2 too.
pub const EXIT_FAILED: u8 = 2;

/// The exit statuses, for a command's `--help`.
pub const EXIT_CODES_HELP: &str = "Exit status: 0 done (or nothing found), 1 something found \
(check's inconsistencies, a migrate that cannot convert), 2 could not run (bad flag or \
kubeconfig, API server unreachable or refusing, CRD missing).";

/// `nodeipam ranges`: connect, read, print; the error as one line naming the server and the
/// reason, exit [`EXIT_FAILED`].
pub async fn run(args: &crate::cli::RangesArgs) -> std::process::ExitCode {
    let mut server = None;
    let out = async {
        let config = crate::client::config(&args.client).await?;
        server = Some(config.cluster_url.clone());
        let client = crate::client::build(config, &args.client)?;
        let network = read(&client).await?;
        Ok::<_, anyhow::Error>(render(&network, args.format)?)
    }
    .await;
    match out {
        Ok(text) => {
            print!("{text}");
            std::process::ExitCode::from(EXIT_OK)
        }
        Err(e) => {
            eprintln!(
                "nodeipam ranges: {}",
                crate::client::one_line(&e, server.as_ref())
            );
            std::process::ExitCode::from(EXIT_FAILED)
        }
    }
}

/// Reads the cluster into the pod network, as the controller publishes it.
pub async fn read(client: &Client) -> Result<PodNetwork, RangesError> {
    let configs = match Api::<NodeIPAMConfig>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(kube::Error::Api(s)) if s.code == 404 => return Err(RangesError::CrdMissing),
        Err(source) => {
            return Err(RangesError::List {
                what: "NodeIPAMConfigs",
                source,
            });
        }
    };
    // One list, read as protobuf: `ranges` may run against a cluster of many thousand Nodes.
    let nodes = Api::<IpamNode>::all(crate::node_lists::client(client.clone()))
        .list(&ListParams::default())
        .await
        .map_err(|source| RangesError::List {
            what: "Nodes",
            source,
        })?
        .items;
    let ranges: Vec<ConfigRanges> = configs.iter().map(config_ranges).collect();
    let all: Vec<IpNet> = ranges
        .iter()
        .flat_map(|r| r.families.iter().map(|f| f.0))
        .collect();
    let mut unmanaged = Vec::new();
    for n in &nodes {
        // A node with unparsable podCIDRs has nothing to contribute.
        for c in n.cidrs().unwrap_or_default() {
            if !all.iter().any(|r| overlaps(r, &c)) {
                unmanaged.push((c, n.name_any()));
            }
        }
    }
    Ok(PodNetwork::new(&ranges, &unmanaged))
}

fn config_ranges(c: &NodeIPAMConfig) -> ConfigRanges {
    let status = c.status.clone().unwrap_or_default();
    let drained = status
        .conditions
        .iter()
        .any(|x| x.type_ == CONDITION_DRAINED && x.status == "True");
    // The range a spec claims, valid or not, as the controller publishes it.
    let fam = |spec: &Option<FamilySpec>, st: Option<nodeipam_crd::FamilyStatus>| {
        let cidr = spec.as_ref()?.claimed()?.cidr;
        Some((
            cidr,
            st.map_or(0, |s| s.allocated),
            st.map_or(0, |s| s.capacity),
        ))
    };
    ConfigRanges {
        name: c.name_any(),
        families: [
            fam(&c.spec.ipv4, status.ipv4),
            fam(&c.spec.ipv6, status.ipv6),
        ]
        .into_iter()
        .flatten()
        .collect(),
        nodes: status.nodes.unwrap_or(0),
        deleting: c.metadata.deletion_timestamp.is_some(),
        enabled: c.spec.allocation == Allocation::Enabled,
        drained,
    }
}

/// Renders `network` in `format`.
pub fn render(network: &PodNetwork, format: Format) -> Result<String, RangesError> {
    match format {
        Format::Table => Ok(network.table()),
        Format::Wide => Ok(wide(network)),
        Format::Json => serde_json::to_string_pretty(network)
            .map(|s| s + "\n")
            .map_err(|e| RangesError::Render(e.to_string())),
        Format::Yaml => {
            serde_saphyr::to_string(network).map_err(|e| RangesError::Render(e.to_string()))
        }
        Format::Name => Ok(network.cidrs().iter().map(|c| format!("{c}\n")).collect()),
        Format::IpMasqAgent => {
            ip_masq_agent_config(None, network, &[]).map_err(RangesError::Render)
        }
        Format::KubeProxy => network
            .kube_proxy_cluster_cidr()
            .map(|s| s + "\n")
            .map_err(RangesError::Render),
        Format::NoMasqueradeCidrs => Ok(network.no_masquerade_snippet()),
    }
}

/// The table with FREE (blocks left) and USAGE (allocated of capacity, in percent).
fn wide(network: &PodNetwork) -> String {
    let header = [
        "CIDR",
        "FAMILY",
        "CONFIG",
        "STATE",
        "NODES",
        "ALLOCATED",
        "FREE",
        "USAGE",
    ]
    .map(String::from);
    let rows: Vec<[String; 8]> = network
        .entries
        .iter()
        .map(|e| {
            let (allocated, free, usage) = match (e.allocated, e.capacity) {
                (Some(a), Some(c)) => (
                    format!("{a}/{c}"),
                    c.saturating_sub(a).to_string(),
                    if c == 0 {
                        "-".into()
                    } else {
                        format!("{:.1}%", a as f64 * 100.0 / c as f64)
                    },
                ),
                _ => ("-".into(), "-".into(), "-".into()),
            };
            [
                e.cidr.to_string(),
                e.family.to_string(),
                e.config.clone().unwrap_or_else(|| "-".into()),
                e.state.as_str().to_string(),
                e.nodes.to_string(),
                allocated,
                free,
                usage,
            ]
        })
        .collect();
    crate::alloc::podnetwork::columns(&header, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::podnetwork::ConfigRanges;

    fn network() -> PodNetwork {
        PodNetwork::new(
            &[ConfigRanges {
                name: "default".into(),
                families: vec![("10.100.0.0/16".parse().expect("cidr"), 3, 256)],
                nodes: 3,
                deleting: false,
                enabled: true,
                drained: false,
            }],
            &[("192.168.7.0/24".parse().expect("cidr"), "old-node".into())],
        )
    }

    #[test]
    fn kubectl_like_outputs() {
        let n = network();
        let wide = render(&n, Format::Wide).expect("wide");
        assert!(
            wide.lines()
                .next()
                .is_some_and(|h| h.contains("FREE") && h.contains("USAGE")),
            "{wide}"
        );
        assert!(wide.contains("253") && wide.contains("1.2%"), "{wide}");
        let yaml: serde_json::Value =
            serde_saphyr::from_str(&render(&n, Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml["entries"][0]["cidr"], "10.100.0.0/16");
        let json: serde_json::Value =
            serde_json::from_str(&render(&n, Format::Json).expect("json")).expect("parses");
        assert_eq!(json["entries"][1]["state"], "Unmanaged");
        assert_eq!(
            render(&n, Format::Name).expect("name"),
            "10.100.0.0/16\n192.168.7.0/24\n"
        );
    }
}
