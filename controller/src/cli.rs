//! The `nodeipam` command line: subcommands and flags, each flag also settable by environment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;

#[derive(Debug, Parser)]
#[command(
    name = "nodeipam",
    version,
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
    /// Print the NodeIPAMConfig CRD YAML.
    Crdgen,
    /// Print the pod network (every range not yet drained, and unmanaged podCIDRs).
    Ranges(RangesArgs),
    /// Print the version.
    Version,
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
    /// Path to a kubeconfig; in-cluster config when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Sustained API requests per second for writes.
    #[arg(long, env = "NODEIPAM_KUBE_API_QPS", default_value_t = 50.0)]
    pub kube_api_qps: f64,
    /// Requests allowed in a burst above the QPS.
    #[arg(long, env = "NODEIPAM_KUBE_API_BURST", default_value_t = 100)]
    pub kube_api_burst: u32,
}

#[derive(Debug, Clone, Args)]
pub struct RangesArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = crate::ranges::Format::Table)]
    pub format: crate::ranges::Format,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub client: ClientArgs,

    /// Service CIDRs to keep out of pod ranges, for clusters without ServiceCIDR objects.
    #[arg(
        long = "service-cidr",
        env = "NODEIPAM_SERVICE_CIDRS",
        value_delimiter = ','
    )]
    pub service_cidrs: Vec<IpNet>,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "NODEIPAM_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    pub metrics_addr: SocketAddr,

    /// Turn the webhook off (e.g. a second controller deployment without it).
    #[arg(long, env = "NODEIPAM_DISABLE_WEBHOOK")]
    pub disable_webhook: bool,
    /// Address the webhook listens on.
    #[arg(long, env = "NODEIPAM_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
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
    /// Turn leader election off: only for a single replica.
    #[arg(long, env = "NODEIPAM_DISABLE_LEADER_ELECTION")]
    pub disable_leader_election: bool,
    /// Name of the coordination.k8s.io Lease.
    #[arg(
        long,
        env = "NODEIPAM_LEASE_NAME",
        default_value = "nodeipam-controller"
    )]
    pub lease_name: String,
    /// How long a lease is valid without renewal, in seconds.
    #[arg(long, env = "NODEIPAM_LEASE_DURATION", default_value_t = 15)]
    pub lease_duration: u64,
    /// How long before expiry the holder renews, in seconds.
    #[arg(long, env = "NODEIPAM_LEASE_GRACE", default_value_t = 5)]
    pub lease_grace: u64,

    /// The ConfigMap (in --namespace) that publishes the pod network for consumers. Allocation
    /// from a new range waits until it is written; empty turns publishing off.
    #[arg(
        long,
        env = "NODEIPAM_POD_NETWORK_CONFIGMAP",
        default_value = "nodeipam-pod-network"
    )]
    pub pod_network_configmap: String,
    /// ip-masq-agent's ConfigMap (namespace/name) whose `config` key is kept in sync.
    #[arg(long, env = "NODEIPAM_IP_MASQ_AGENT_CONFIGMAP")]
    pub ip_masq_agent_configmap: Option<crate::reconcile::publisher::ConfigMapRef>,
    /// More CIDRs for ip-masq-agent's nonMasqueradeCIDRs.
    #[arg(
        long = "extra-non-masquerade-cidr",
        env = "NODEIPAM_EXTRA_NON_MASQUERADE_CIDRS",
        value_delimiter = ','
    )]
    pub extra_non_masquerade_cidrs: Vec<IpNet>,

    /// How many podCIDR writes run at once.
    #[arg(long, env = "NODEIPAM_WRITE_CONCURRENCY", default_value_t = 16)]
    pub write_concurrency: usize,

    /// Log format.
    #[arg(long, env = "NODEIPAM_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, e.g. `info` or `nodeipam_controller=debug,info`.
    #[arg(long, env = "NODEIPAM_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// A fault for the end-to-end tests (`panic-on-node:NAME`); honoured by debug builds only.
    #[arg(long, hide = true)]
    pub inject_fault: Option<crate::reconcile::Fault>,
}

impl RunArgs {
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration)
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
        assert_eq!(args.log_format, LogFormat::Json);
        assert!(args.disable_leader_election);
        let err = Cli::try_parse_from(["nodeipam", "run", "--service-cidr=10.96.0.0/33"])
            .expect_err("bad CIDR");
        assert!(err.to_string().contains("--service-cidr"), "{err}");
    }
}
