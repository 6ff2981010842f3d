//! The `nodeipam` command line: subcommands and flags, each flag also settable by environment.
//! Names and value types follow kube-controller-manager and controller-runtime where they
//! overlap (`--leader-elect*`, `--kube-api-qps`, `--metrics-bind-address`, `-v`), so an
//! operator's habits and manifests carry over.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

use crate::duration;

/// The Lease the replicas elect with, in `--namespace`, unless `--lease-name` says otherwise.
pub const DEFAULT_LEASE_NAME: &str = "nodeipam-controller";
/// The ConfigMap (in `--namespace`) the pod network is published to by default.
pub const DEFAULT_POD_NETWORK_CONFIGMAP: &str = "nodeipam-pod-network";

#[derive(Debug, Parser)]
#[command(
    name = "nodeipam",
    version = crate::version::SHORT,
    about = "Hands out pod CIDRs to Nodes from many discontiguous ranges"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller (leader-elected) and the admission webhook (every replica).
    Run(Box<RunArgs>),
    /// Print the CRD YAML (NodeIPAMConfig and NodeIPAMPool).
    Crdgen,
    /// Print the pod network (every range not yet drained, and unmanaged podCIDRs).
    #[command(after_help = crate::ranges::EXIT_CODES_HELP)]
    Ranges(RangesArgs),
    /// Print the version, the git commit and the build date.
    Version,
    /// Print a shell completion script (e.g. `source <(nodeipam completion bash)`).
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum CertMode {
    /// Generate the CA and serving cert, keep them in a Secret, patch caBundle, rotate.
    Managed,
    /// Read tls.crt and tls.key from --cert-dir (e.g. mounted from cert-manager).
    Files,
}

#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Path to a kubeconfig. Without it: $KUBECONFIG (a colon-separated list, merged as kubectl
    /// does), then ~/.kube/config, then the in-cluster config.
    #[arg(long, env = "NODEIPAM_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, env = "NODEIPAM_CONTEXT")]
    pub context: Option<String>,
    /// Sustained requests per second to the API server, for every request this process makes
    /// (as kube-controller-manager's); 0 means unlimited.
    #[arg(long, env = "NODEIPAM_KUBE_API_QPS", default_value_t = 50.0)]
    pub kube_api_qps: f64,
    /// Requests allowed in a burst above --kube-api-qps.
    #[arg(long, env = "NODEIPAM_KUBE_API_BURST", default_value_t = 100)]
    pub kube_api_burst: u32,
}

#[derive(Debug, Clone, Args)]
pub struct RangesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Output format, as kubectl's -o: table, wide, json, yaml, name; or a consumer's format:
    /// ip-masq-agent, kube-proxy, no-masquerade-cidrs.
    #[arg(
        long = "output",
        short = 'o',
        visible_alias = "format",
        env = "NODEIPAM_OUTPUT",
        value_enum,
        default_value_t = crate::ranges::Format::Table
    )]
    pub format: crate::ranges::Format,
}

/// A listen address as controller-runtime takes it: `host:port`, `:port` (every interface),
/// or `0` to turn the server off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

impl std::str::FromStr for BindAddress {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s == "0" {
            return Ok(BindAddress(None));
        }
        if let Some(port) = s.strip_prefix(':') {
            let port: u16 = port
                .parse()
                .map_err(|_| format!("{s:?}: the port must be a number from 0 to 65535"))?;
            return Ok(BindAddress(Some(SocketAddr::from((
                Ipv4Addr::UNSPECIFIED,
                port,
            )))));
        }
        s.parse().map(|a| BindAddress(Some(a))).map_err(|_| {
            format!("{s:?} is not an address: use host:port, :port, [v6]:port, or 0 to turn it off")
        })
    }
}

impl std::fmt::Display for BindAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) => write!(f, "{a}"),
            None => f.write_str("0"),
        }
    }
}

/// A Go-style duration flag value (`15s`, `1m30s`, `500ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl std::str::FromStr for GoDuration {
    type Err = duration::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        duration::parse(s).map(GoDuration)
    }
}

impl std::fmt::Display for GoDuration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&duration::format(self.0))
    }
}

/// The default ports, shared with config/manager/manager.yaml (host networking: picked away
/// from kubelet 10250, kcm 10257, scheduler 10259, and 8080/8081/8443/9443 of other
/// controllers).
pub const METRICS_PORT: u16 = 8085;
pub const PROBE_PORT: u16 = 8086;

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Service CIDRs to keep out of pod ranges, for clusters without ServiceCIDR objects.
    #[arg(
        long = "service-cidr",
        visible_alias = "service-cluster-ip-range",
        env = "NODEIPAM_SERVICE_CIDRS",
        value_delimiter = ',',
        value_parser = cidr
    )]
    pub service_cidrs: Vec<IpNet>,

    /// The pod network the consumers are configured for, one CIDR per family or more (e.g.
    /// flannel's Network): the webhook admits a NodeIPAMConfig or NodeIPAMPool CIDR outside
    /// those of its family with a warning, so such a range cannot slip in unnoticed.
    #[arg(
        long = "pod-network-supernet",
        env = "NODEIPAM_POD_NETWORK_SUPERNETS",
        value_delimiter = ',',
        value_parser = cidr
    )]
    pub pod_network_supernets: Vec<IpNet>,

    /// Where /metrics is served: host:port, :port, or 0 for off. HTTPS with authentication
    /// and authorization unless --metrics-secure=false.
    #[arg(long, env = "NODEIPAM_METRICS_BIND_ADDRESS", default_value = ":8085")]
    pub metrics_bind_address: BindAddress,
    /// Serve /metrics over HTTPS, to callers the API server authenticates (TokenReview) and
    /// authorizes for `get` on the non-resource URL /metrics (SubjectAccessReview).
    #[arg(
        long,
        env = "NODEIPAM_METRICS_SECURE",
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true"
    )]
    pub metrics_secure: bool,
    /// Folder with tls.crt and tls.key for the metrics server (reloaded when they change);
    /// without it a self-signed certificate is generated at start.
    #[arg(long, env = "NODEIPAM_METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,
    /// Where /healthz and /readyz are served, plain HTTP (host:port, :port, or 0 for off).
    /// The manifest binds loopback: with host networking the kubelet probes 127.0.0.1.
    #[arg(
        long,
        env = "NODEIPAM_HEALTH_PROBE_BIND_ADDRESS",
        default_value = "127.0.0.1:8086"
    )]
    pub health_probe_bind_address: BindAddress,
    /// Deprecated: /metrics (plain HTTP), /healthz and /readyz on one address.
    #[arg(long, hide = true, env = "NODEIPAM_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,

    /// Turn the webhook off (e.g. a second controller deployment without it).
    #[arg(long, env = "NODEIPAM_DISABLE_WEBHOOK")]
    pub disable_webhook: bool,
    /// Address the webhook listens on.
    #[arg(long, env = "NODEIPAM_WEBHOOK_ADDR", default_value = "0.0.0.0:9445")]
    pub webhook_addr: SocketAddr,
    /// Where the webhook's serving certificate comes from.
    #[arg(long, env = "NODEIPAM_CERT_MODE", value_enum, default_value_t = CertMode::Managed)]
    pub cert_mode: CertMode,
    /// Folder with tls.crt and tls.key, for --cert-mode=files.
    #[arg(
        long,
        env = "NODEIPAM_CERT_DIR",
        default_value = "/tmp/k8s-webhook-server/serving-certs"
    )]
    pub cert_dir: PathBuf,
    /// The webhook's Service name (names the certificate).
    #[arg(long, env = "NODEIPAM_WEBHOOK_SERVICE", default_value = nodeipam_webhook::DEFAULT_SERVICE_NAME)]
    pub webhook_service: String,
    /// Extra names (DNS or IP) for the webhook certificate.
    #[arg(long, env = "NODEIPAM_WEBHOOK_DNS_NAMES", value_delimiter = ',')]
    pub webhook_dns_names: Vec<String>,
    /// Sustained requests per second the webhook's reviews may send to the API server, a
    /// budget apart from --kube-api-qps so that a flood of reviews never delays an
    /// allocation; 0 means unlimited.
    #[arg(long, env = "NODEIPAM_WEBHOOK_KUBE_API_QPS", default_value_t = 20.0)]
    pub webhook_kube_api_qps: f64,
    /// Requests the webhook may send in a burst above --webhook-kube-api-qps.
    #[arg(long, env = "NODEIPAM_WEBHOOK_KUBE_API_BURST", default_value_t = 40)]
    pub webhook_kube_api_burst: u32,
    /// Secret holding the managed webhook certificate.
    #[arg(long, env = "NODEIPAM_WEBHOOK_SECRET", default_value = nodeipam_webhook::DEFAULT_SECRET_NAME)]
    pub webhook_secret: String,
    /// ValidatingWebhookConfiguration whose caBundle is kept current.
    #[arg(long, env = "NODEIPAM_WEBHOOK_CONFIG", default_value = nodeipam_webhook::DEFAULT_WEBHOOK_CONFIG_NAME)]
    pub webhook_config: String,

    /// Namespace of the lease, the Secret and the published ConfigMaps (the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = nodeipam_webhook::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// This replica's identity in the lease (the pod name).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
    /// Elect a leader among the replicas; false only for a single replica.
    #[arg(
        long,
        env = "NODEIPAM_LEADER_ELECT",
        action = ArgAction::Set,
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true"
    )]
    pub leader_elect: bool,
    /// Deprecated: use --leader-elect=false.
    #[arg(long, hide = true, env = "NODEIPAM_DISABLE_LEADER_ELECTION")]
    pub disable_leader_election: bool,
    /// Name of the coordination.k8s.io Lease.
    #[arg(
        long,
        visible_alias = "leader-elect-resource-name",
        env = "NODEIPAM_LEASE_NAME",
        default_value = DEFAULT_LEASE_NAME
    )]
    pub lease_name: String,
    /// How long a lease is valid without renewal (whole seconds: the Lease stores seconds).
    #[arg(
        long,
        env = "NODEIPAM_LEADER_ELECT_LEASE_DURATION",
        default_value = "15s"
    )]
    pub leader_elect_lease_duration: GoDuration,
    /// How long after its last renewal the leader renews again; from then until the lease
    /// would expire it retries, and it stops allocating just before it does. Whole seconds,
    /// less than the lease duration.
    #[arg(
        long,
        env = "NODEIPAM_LEADER_ELECT_RENEW_DEADLINE",
        default_value = "10s"
    )]
    pub leader_elect_renew_deadline: GoDuration,
    /// How often a standby checks whether the lease is free, and a failed lease call is
    /// retried.
    #[arg(long, env = "NODEIPAM_LEADER_ELECT_RETRY_PERIOD", default_value = "1s")]
    pub leader_elect_retry_period: GoDuration,
    /// Deprecated: lease duration in seconds (use --leader-elect-lease-duration).
    #[arg(long, hide = true, env = "NODEIPAM_LEASE_DURATION")]
    pub lease_duration: Option<u64>,
    /// Deprecated: seconds before expiry the leader renews (use --leader-elect-renew-deadline).
    #[arg(long, hide = true, env = "NODEIPAM_LEASE_GRACE")]
    pub lease_grace: Option<u64>,

    /// The ConfigMap (in --namespace) that publishes the pod network for consumers. Allocation
    /// from a new range waits until it is written; empty turns publishing off.
    #[arg(
        long,
        env = "NODEIPAM_POD_NETWORK_CONFIGMAP",
        default_value = DEFAULT_POD_NETWORK_CONFIGMAP
    )]
    pub pod_network_configmap: String,
    /// ip-masq-agent's ConfigMap (namespace/name) whose `config` key is kept in sync.
    #[arg(long, env = "NODEIPAM_IP_MASQ_AGENT_CONFIGMAP")]
    pub ip_masq_agent_configmap: Option<crate::reconcile::publisher::ConfigMapRef>,
    /// More CIDRs for ip-masq-agent's nonMasqueradeCIDRs.
    #[arg(
        long = "extra-non-masquerade-cidr",
        env = "NODEIPAM_EXTRA_NON_MASQUERADE_CIDRS",
        value_delimiter = ',',
        value_parser = cidr
    )]
    pub extra_non_masquerade_cidrs: Vec<IpNet>,

    #[command(flatten)]
    pub typed: TypedOutputArgs,

    /// How many podCIDR writes run at once.
    #[arg(long, env = "NODEIPAM_WRITE_CONCURRENCY", default_value_t = 16)]
    pub write_concurrency: usize,

    #[command(flatten)]
    pub log: LogArgs,

    /// A fault for the end-to-end tests (`panic-on-node:NAME`, `stall-election`,
    /// `stall-webhook`); honoured by debug builds only.
    #[arg(long, hide = true, env = "NODEIPAM_INJECT_FAULT")]
    pub inject_fault: Option<crate::reconcile::Fault>,
}

#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(long, env = "NODEIPAM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `nodeipam_controller=debug,info` (RUST_LOG syntax); it wins
    /// over -v when both are given (e.g. one from the environment, one from the arguments).
    /// Without either, RUST_LOG is honoured, else `info`.
    #[arg(long, env = "NODEIPAM_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// klog-style verbosity: 0-2 info, 3-4 debug, 5 and more trace.
    #[arg(short = 'v', long = "v", env = "NODEIPAM_V", value_name = "N")]
    pub verbosity: Option<u8>,
}

/// The leader election's timing in the units the lease manager takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTiming {
    /// Seconds a lease is valid without renewal.
    pub duration: u64,
    /// Seconds before expiry at which the holder renews.
    pub grace: u64,
    pub retry: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    #[error("--{flag}={value}: {reason}")]
    Invalid {
        flag: &'static str,
        value: String,
        reason: String,
    },
}

/// A CIDR flag value, read by the one parser the webhook and the CRD rules use, so the same
/// input gets the same reason everywhere (clap names the flag and the value).
fn cidr(s: &str) -> Result<IpNet, nodeipam_crd::range::CidrError> {
    nodeipam_crd::range::parse_cidr(s.trim())
}

fn whole_seconds(flag: &'static str, d: Duration) -> Result<u64, FlagError> {
    if d.subsec_nanos() != 0 || d.is_zero() {
        return Err(FlagError::Invalid {
            flag,
            value: duration::format(d),
            reason: "must be a whole number of seconds, at least 1s (the Lease stores seconds)"
                .into(),
        });
    }
    Ok(d.as_secs())
}

/// The typed consumer outputs (Calico's IPPools and GlobalNetworkSet, Cilium's CIDR group): the
/// controller keeps them, and `kubectl nodeipam` checks them, from the same flags.
#[derive(clap::Args, Clone, Debug)]
pub struct TypedOutputArgs {
    /// Keep one Calico IPPool per range of the pod network (labelled
    /// app.kubernetes.io/managed-by=nodeipam; pools without the label are never touched), for
    /// Calico with host-local IPAM (`usePodCidr`).
    #[arg(long, global = true, env = "NODEIPAM_CALICO_IP_POOLS")]
    pub calico_ip_pools: bool,
    /// `natOutgoing` of the IPPools we keep.
    #[arg(
        long,
        global = true,
        env = "NODEIPAM_CALICO_IP_POOL_NAT_OUTGOING",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub calico_ip_pool_nat_outgoing: bool,
    /// Encapsulation of the IPPools we keep: None, IPIP, IPIPCrossSubnet (IPv4 pools only),
    /// VXLAN or VXLANCrossSubnet.
    #[arg(
        long,
        global = true,
        env = "NODEIPAM_CALICO_IP_POOL_ENCAPSULATION",
        default_value = "None"
    )]
    pub calico_ip_pool_encapsulation: crate::alloc::outputs::Encapsulation,
    /// `disabled` of the IPPools we keep (Calico IPAM assigns nothing from a disabled pool).
    #[arg(
        long,
        global = true,
        env = "NODEIPAM_CALICO_IP_POOL_DISABLED",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub calico_ip_pool_disabled: bool,
    /// A Calico GlobalNetworkSet, by name, whose `nets` are kept equal to the pod network.
    #[arg(long, global = true, env = "NODEIPAM_CALICO_NETWORK_SET")]
    pub calico_network_set: Option<String>,
    /// The apiVersion of Calico's resources: projectcalico.org/v3, or crd.projectcalico.org/v1
    /// for a cluster with only Calico's own CRDs.
    #[arg(
        long,
        global = true,
        env = "NODEIPAM_CALICO_API_VERSION",
        default_value = "projectcalico.org/v3"
    )]
    pub calico_api_version: String,
    /// A CiliumCIDRGroup, by name, whose `externalCIDRs` are kept equal to the pod network.
    #[arg(long, global = true, env = "NODEIPAM_CILIUM_CIDR_GROUP")]
    pub cilium_cidr_group: Option<String>,
    /// The apiVersion of CiliumCIDRGroup: cilium.io/v2, or cilium.io/v2alpha1 before Cilium 1.18.
    #[arg(
        long,
        global = true,
        env = "NODEIPAM_CILIUM_API_VERSION",
        default_value = "cilium.io/v2"
    )]
    pub cilium_api_version: String,
}

impl TypedOutputArgs {
    /// The typed consumer outputs the flags ask for (Calico's IPPools and GlobalNetworkSet,
    /// Cilium's CIDR group), checked.
    pub fn typed_outputs(&self) -> Result<Vec<crate::alloc::outputs::OutputRef>, FlagError> {
        use crate::alloc::outputs::{CalicoPools, OutputKind, OutputRef};
        let version = |flag: &'static str, value: &str| match value.split_once('/') {
            Some((group, v)) if !group.is_empty() && !v.is_empty() && !v.contains('/') => Ok(()),
            _ => Err(FlagError::Invalid {
                flag,
                value: value.into(),
                reason: "must be group/version".into(),
            }),
        };
        let mut out = Vec::new();
        let calico = &self.calico_api_version;
        if self.calico_ip_pools {
            version("calico-api-version", calico)?;
            let pools = CalicoPools {
                nat_outgoing: self.calico_ip_pool_nat_outgoing,
                encapsulation: self.calico_ip_pool_encapsulation,
                disabled: self.calico_ip_pool_disabled,
            };
            out.push(OutputRef::typed(
                OutputKind::CalicoIPPools(pools),
                calico,
                None,
            ));
        }
        let named = [
            (
                &self.calico_network_set,
                OutputKind::CalicoNetworkSet,
                calico,
                "calico-api-version",
                "calico-network-set",
            ),
            (
                &self.cilium_cidr_group,
                OutputKind::CiliumCIDRGroup,
                &self.cilium_api_version,
                "cilium-api-version",
                "cilium-cidr-group",
            ),
        ];
        for (name, kind, api_version, version_flag, flag) in named {
            let Some(name) = name else { continue };
            version(version_flag, api_version)?;
            let errors = nodeipam_crd::validation::dns_subdomain_errors(name);
            if !errors.is_empty() {
                return Err(FlagError::Invalid {
                    flag,
                    value: name.clone(),
                    reason: errors.join("; "),
                });
            }
            out.push(OutputRef::typed(kind, api_version, Some(name)));
        }
        Ok(out)
    }
}

impl RunArgs {
    pub fn typed_outputs(&self) -> Result<Vec<crate::alloc::outputs::OutputRef>, FlagError> {
        self.typed.typed_outputs()
    }

    /// Leader election with the deprecated aliases applied.
    pub fn leader_elect(&self) -> bool {
        self.leader_elect && !self.disable_leader_election
    }

    /// The lease timing from the flags, checked (the lease manager panics on bad values).
    pub fn lease_timing(&self) -> Result<LeaseTiming, FlagError> {
        let duration = match self.lease_duration {
            Some(secs) => secs,
            None => whole_seconds(
                "leader-elect-lease-duration",
                self.leader_elect_lease_duration.0,
            )?,
        };
        let grace = match self.lease_grace {
            Some(secs) => secs,
            None => {
                let deadline = whole_seconds(
                    "leader-elect-renew-deadline",
                    self.leader_elect_renew_deadline.0,
                )?;
                if deadline >= duration {
                    return Err(FlagError::Invalid {
                        flag: "leader-elect-renew-deadline",
                        value: duration::format(self.leader_elect_renew_deadline.0),
                        reason: format!(
                            "must be less than --leader-elect-lease-duration ({duration}s)"
                        ),
                    });
                }
                duration - deadline
            }
        };
        if duration == 0 || grace == 0 || grace >= duration {
            return Err(FlagError::Invalid {
                flag: "lease-grace",
                value: grace.to_string(),
                reason: format!(
                    "must be greater than zero and less than the lease duration ({duration}s)"
                ),
            });
        }
        let retry = self.leader_elect_retry_period.0;
        if retry < Duration::from_millis(100) || retry.as_secs() >= duration {
            return Err(FlagError::Invalid {
                flag: "leader-elect-retry-period",
                value: duration::format(retry),
                reason: format!(
                    "must be at least 100ms and less than the lease duration ({duration}s)"
                ),
            });
        }
        Ok(LeaseTiming {
            duration,
            grace,
            retry,
        })
    }

    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_timing().map_or(15, |t| t.duration))
    }

    /// The deprecated flags given, with what replaces each.
    pub fn deprecated(&self) -> Vec<(&'static str, &'static str)> {
        [
            (
                self.metrics_addr.is_some(),
                "--metrics-addr",
                "--metrics-bind-address and --health-probe-bind-address",
            ),
            (
                self.disable_leader_election,
                "--disable-leader-election",
                "--leader-elect=false",
            ),
            (
                self.lease_duration.is_some(),
                "--lease-duration",
                "--leader-elect-lease-duration",
            ),
            (
                self.lease_grace.is_some(),
                "--lease-grace",
                "--leader-elect-renew-deadline",
            ),
        ]
        .into_iter()
        .filter_map(|(given, old, new)| given.then_some((old, new)))
        .collect()
    }

    /// The metrics and probe listeners: (metrics, probes, metrics served securely).
    pub fn listeners(&self) -> (Option<SocketAddr>, Option<SocketAddr>, bool) {
        match self.metrics_addr {
            Some(addr) => (Some(addr), Some(addr), false),
            None => (
                self.metrics_bind_address.0,
                self.health_probe_bind_address.0,
                self.metrics_secure,
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "nodeipam",
            "run",
            "--service-cidr=10.96.0.0/12,fd00:96::/108",
            "--kube-api-qps=20",
            "--log-format=json",
            "--disable-leader-election",
        ])
        .expect("parses");
        let Command::Run(args) = cli.command else {
            panic!("run expected")
        };
        assert_eq!(args.service_cidrs.len(), 2);
        assert_eq!(args.client.kube_api_qps, 20.0);
        assert_eq!(args.log.log_format, LogFormat::Json);
        assert!(args.disable_leader_election);
        let Command::Run(args) = Cli::try_parse_from([
            "nodeipam",
            "run",
            "--pod-network-supernet=10.240.0.0/12,fd00:240::/40",
        ])
        .expect("valid supernets")
        .command
        else {
            panic!("not run");
        };
        assert_eq!(args.pod_network_supernets.len(), 2);
        let err = Cli::try_parse_from(["nodeipam", "run", "--pod-network-supernet=10.0.0.0/40"])
            .expect_err("a bad supernet");
        assert!(err.to_string().contains("--pod-network-supernet"), "{err}");
        let err = Cli::try_parse_from(["nodeipam", "run", "--service-cidr=10.96.0.0/33"])
            .expect_err("bad CIDR");
        assert!(err.to_string().contains("--service-cidr"), "{err}");
    }

    fn run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let cli = Cli::try_parse_from(["nodeipam", "run"].iter().chain(args))?;
        match cli.command {
            Command::Run(args) => Ok(*args),
            other => panic!("run expected, got {other:?}"),
        }
    }

    #[test]
    fn kcm_flag_names_and_types() {
        let a = run(&[
            "--leader-elect=false",
            "--leader-elect-lease-duration=1m",
            "--leader-elect-renew-deadline=45s",
            "--leader-elect-retry-period=500ms",
            "--service-cluster-ip-range=10.96.0.0/12",
            "--context=admin@prod",
        ])
        .expect("parses");
        assert!(!a.leader_elect());
        assert_eq!(a.service_cidrs.len(), 1);
        assert_eq!(a.client.context.as_deref(), Some("admin@prod"));
        assert_eq!(
            a.lease_timing(),
            Ok(LeaseTiming {
                duration: 60,
                grace: 15,
                retry: Duration::from_millis(500)
            })
        );
        let d = run(&[]).expect("defaults");
        assert!(d.leader_elect(), "leader election is on by default");
        assert_eq!(
            d.lease_timing(),
            Ok(LeaseTiming {
                duration: 15,
                grace: 5,
                retry: Duration::from_secs(1)
            })
        );
        assert!(run(&["--leader-elect"]).expect("bare bool").leader_elect());
        assert!(
            !run(&["--disable-leader-election"])
                .expect("alias")
                .leader_elect()
        );
        let old = run(&["--lease-duration=4", "--lease-grace=2"]).expect("old flags");
        assert_eq!(
            old.lease_timing().map(|t| (t.duration, t.grace)),
            Ok((4, 2))
        );
    }

    #[test]
    fn bad_durations_name_the_flag_and_the_reason() {
        let e = run(&["--leader-elect-lease-duration=15"]).expect_err("no unit");
        assert!(
            e.to_string().contains("--leader-elect-lease-duration")
                && e.to_string().contains("unit"),
            "{e}"
        );
        let e = run(&["--leader-elect-lease-duration=1500ms"])
            .expect("parses")
            .lease_timing()
            .expect_err("not whole seconds")
            .to_string();
        assert!(
            e.contains("--leader-elect-lease-duration=1.5s") && e.contains("whole"),
            "{e}"
        );
        let e = run(&["--leader-elect-renew-deadline=15s"])
            .expect("parses")
            .lease_timing()
            .expect_err("deadline not below duration")
            .to_string();
        assert!(
            e.contains("--leader-elect-renew-deadline") && e.contains("less than"),
            "{e}"
        );
        let e = run(&["--leader-elect-retry-period=1m"])
            .expect("parses")
            .lease_timing()
            .expect_err("retry too long")
            .to_string();
        assert!(e.contains("--leader-elect-retry-period"), "{e}");
    }

    #[test]
    fn bind_addresses_as_controller_runtime_takes_them() {
        let d = run(&[]).expect("defaults");
        assert_eq!(
            d.listeners(),
            (
                Some(SocketAddr::from((Ipv4Addr::UNSPECIFIED, METRICS_PORT))),
                Some(SocketAddr::from((Ipv4Addr::LOCALHOST, PROBE_PORT))),
                true
            )
        );
        let a = run(&[
            "--metrics-bind-address=0",
            "--health-probe-bind-address=[::1]:9",
        ])
        .expect("parses");
        assert_eq!(a.listeners().0, None, "0 turns metrics off");
        assert_eq!(a.listeners().1, Some("[::1]:9".parse().expect("addr")));
        let old = run(&["--metrics-addr=127.0.0.1:7"]).expect("deprecated flag");
        let addr = Some("127.0.0.1:7".parse().expect("addr"));
        assert_eq!(old.listeners(), (addr, addr, false));
        let e = run(&["--metrics-bind-address=localhost"]).expect_err("no port");
        assert!(e.to_string().contains("--metrics-bind-address"), "{e}");
        assert!(
            !run(&["--metrics-secure=false"])
                .expect("bool")
                .listeners()
                .2
        );
    }

    #[test]
    fn verbosity_and_log_level_combine() {
        assert_eq!(run(&["-v", "4"]).expect("-v").log.verbosity, Some(4));
        assert_eq!(run(&["--v=2"]).expect("--v").log.verbosity, Some(2));
        let both = run(&["-v", "4", "--log-level=warn"]).expect("both");
        assert_eq!(
            crate::logging::choose(&both.log, None),
            crate::logging::Filter::Flag("warn".into()),
            "--log-level wins over -v"
        );
    }

    /// The environment variable a flag must have: NODEIPAM_<FLAG>, a list flag's in the
    /// plural; the two the Downward API fills keep the names manifests give them.
    fn expected_env(flag: &str, list: bool) -> Vec<String> {
        match flag {
            "namespace" => vec!["POD_NAMESPACE".into()],
            "identity" => vec!["POD_NAME".into()],
            _ => {
                let base = format!("NODEIPAM_{}", flag.replace('-', "_").to_uppercase());
                let plural = format!("{base}S");
                if list { vec![base, plural] } else { vec![base] }
            }
        }
    }

    #[test]
    fn every_flag_has_an_environment_variable() {
        let mut cmd = Cli::command();
        cmd.build();
        let mut missing = Vec::new();
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(flag) = arg.get_long() else {
                    continue; // positionals (completion's shell)
                };
                if ["help", "version"].contains(&flag) {
                    continue;
                }
                let list = arg.get_value_delimiter().is_some();
                let want = expected_env(flag, list);
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                if !env.as_ref().is_some_and(|e| want.contains(e)) {
                    missing.push(format!(
                        "{} --{flag}: {env:?}, want {want:?}",
                        sub.get_name()
                    ));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "flags without their variable:\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn a_bad_cidr_names_the_flag_the_value_and_the_reason() {
        for flag in [
            "--service-cidr",
            "--pod-network-supernet",
            "--extra-non-masquerade-cidr",
        ] {
            let e = run(&[&format!("{flag}=10.96.0.0/33")])
                .expect_err("/33")
                .to_string();
            let first = e.lines().next().unwrap_or_default();
            let reason = nodeipam_crd::range::parse_cidr("10.96.0.0/33")
                .expect_err("/33")
                .to_string();
            assert!(
                first.contains(flag) && first.contains("10.96.0.0/33") && first.contains(&reason),
                "{e}"
            );
            assert!(!e.contains("invalid IP address syntax"), "{e}");
        }
    }

    #[test]
    fn typed_output_flags_become_outputs_and_bad_values_name_the_flag() {
        use crate::alloc::outputs::{CalicoPools, Encapsulation, OutputKind};
        let run = |extra: &[&str]| {
            let argv = ["nodeipam", "run"].iter().chain(extra).copied();
            match Cli::try_parse_from(argv).expect("parses").command {
                Command::Run(args) => args,
                _ => unreachable!("a run command"),
            }
        };
        assert!(run(&[]).typed_outputs().expect("none").is_empty());
        let outputs = run(&[
            "--calico-ip-pools",
            "--calico-ip-pool-encapsulation=VXLAN",
            "--calico-ip-pool-nat-outgoing=false",
            "--calico-network-set=pods",
            "--cilium-cidr-group=pods",
            "--cilium-api-version=cilium.io/v2alpha1",
        ])
        .typed_outputs()
        .expect("valid");
        let pools = CalicoPools {
            nat_outgoing: false,
            encapsulation: Encapsulation::Vxlan,
            disabled: false,
        };
        let kinds: Vec<_> = outputs
            .iter()
            .map(|o| (o.kind, o.api_version.as_str()))
            .collect();
        assert_eq!(
            kinds,
            [
                (OutputKind::CalicoIPPools(pools), "projectcalico.org/v3"),
                (OutputKind::CalicoNetworkSet, "projectcalico.org/v3"),
                (OutputKind::CiliumCIDRGroup, "cilium.io/v2alpha1"),
            ]
        );
        let bad = run(&["--cilium-cidr-group=Pods"])
            .typed_outputs()
            .expect_err("not a name");
        assert!(bad.to_string().contains("cilium-cidr-group"), "{bad}");
        let bad = run(&["--calico-ip-pools", "--calico-api-version=v3"]).typed_outputs();
        assert!(
            bad.expect_err("no group")
                .to_string()
                .contains("calico-api-version")
        );
        assert!(
            Cli::try_parse_from(["nodeipam", "run", "--calico-ip-pool-encapsulation=gre"]).is_err()
        );
    }

    #[test]
    fn ranges_output_like_kubectl() {
        for (flag, want) in [
            ("-ojson", crate::ranges::Format::Json),
            ("--output=yaml", crate::ranges::Format::Yaml),
            ("--format=wide", crate::ranges::Format::Wide),
        ] {
            let cli = Cli::try_parse_from(["nodeipam", "ranges", flag]).expect(flag);
            let Command::Ranges(r) = cli.command else {
                panic!("ranges expected")
            };
            assert_eq!(r.format, want, "{flag}");
        }
    }
}
