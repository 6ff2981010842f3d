//! The `kubectl nodeipam` command line: subcommands and flags. The connection flags are
//! kubectl's generic ones (`--kubeconfig`, `--context`, `--server`, `--token`, `--as`, ...)
//! and may come before or after the subcommand, as a kubectl plugin receives them; they mean
//! what [`nodeipam_controller::kubeconfig`] makes of them. The controller's names have the
//! controller's defaults.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use ipnet::IpNet;
use nodeipam_alloc::podnetwork::ConfigMapRef;
use nodeipam_controller::cli::{
    ClientArgs, DEFAULT_LEASE_NAME, DEFAULT_POD_NETWORK_CONFIGMAP, GoDuration,
};
use nodeipam_controller::kubeconfig::Overrides;
use nodeipam_controller::ranges::Format;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl-nodeipam",
    bin_name = "kubectl nodeipam",
    version = nodeipam_controller::version::SHORT,
    about = "The pod network, the nodeipam controller's status and a consistency check, read \
             with your kubeconfig as kubectl reads it; `migrate --apply` also creates \
             NodeIPAMConfigs",
    after_help = nodeipam_controller::ranges::EXIT_CODES_HELP
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Path to the kubeconfig. Without it: $KUBECONFIG (a colon-separated list, merged as
    /// kubectl does: missing files skipped, the first to set a key wins), then
    /// ~/.kube/config, then the in-cluster config.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current-context).
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use (default: the context's).
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use (default: the context's).
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// The address and port of the API server.
    #[arg(short = 's', long, global = true)]
    pub server: Option<String>,
    /// Bearer token for authentication to the API server.
    #[arg(long, global = true)]
    pub token: Option<String>,
    /// Path to a cert file for the certificate authority.
    #[arg(long, global = true)]
    pub certificate_authority: Option<PathBuf>,
    /// Path to a client certificate file for TLS.
    #[arg(long, global = true)]
    pub client_certificate: Option<PathBuf>,
    /// Path to a client key file for TLS.
    #[arg(long, global = true)]
    pub client_key: Option<PathBuf>,
    /// Do not check the server's certificate: insecure.
    #[arg(
        long,
        global = true,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set
    )]
    pub insecure_skip_tls_verify: bool,
    /// Username to impersonate for the operation.
    #[arg(long = "as", global = true, value_name = "USER")]
    pub as_user: Option<String>,
    /// Group to impersonate for the operation; repeat it for several groups.
    #[arg(long = "as-group", global = true, value_name = "GROUP")]
    pub as_group: Vec<String>,
    /// How long to wait for one answer of the API server before giving up (1s, 2m, 3h; whole
    /// seconds without a unit); 0 waits as long as it takes.
    #[arg(
        long,
        global = true,
        value_parser = nodeipam_controller::kubeconfig::parse_request_timeout
    )]
    pub request_timeout: Option<std::time::Duration>,
    /// The controller's namespace: its Lease and its published ConfigMaps.
    #[arg(short = 'n', long, global = true, default_value = nodeipam_webhook::DEFAULT_NAMESPACE)]
    pub namespace: String,
    /// The controller's Lease (its --lease-name).
    #[arg(long, global = true, default_value = DEFAULT_LEASE_NAME)]
    pub lease_name: String,
    /// The ConfigMap the controller publishes the pod network to (its
    /// --pod-network-configmap); empty when it publishes none.
    #[arg(long, global = true, default_value = DEFAULT_POD_NETWORK_CONFIGMAP)]
    pub pod_network_configmap: String,
    /// ip-masq-agent's ConfigMap (namespace/name), when the controller keeps it (its
    /// --ip-masq-agent-configmap).
    #[arg(long, global = true)]
    pub ip_masq_agent_configmap: Option<ConfigMapRef>,
    /// The controller's --service-cidr, for a cluster whose API serves no ServiceCIDRs.
    #[arg(long = "service-cidr", global = true, value_delimiter = ',')]
    pub service_cidrs: Vec<IpNet>,
    /// The controller's --extra-non-masquerade-cidr, to compare ip-masq-agent's config with.
    #[arg(
        long = "extra-non-masquerade-cidr",
        global = true,
        value_delimiter = ','
    )]
    pub extra_non_masquerade_cidrs: Vec<IpNet>,
    /// The controller's typed outputs, by its own flags (--calico-ip-pools, ...).
    #[command(flatten)]
    pub typed: nodeipam_controller::cli::TypedOutputArgs,
}

impl Global {
    /// kubectl's flags, for [`nodeipam_controller::kubeconfig::config`].
    pub fn overrides(&self) -> Overrides {
        Overrides {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
            server: self.server.clone(),
            token: self.token.clone(),
            certificate_authority: self.certificate_authority.clone(),
            client_certificate: self.client_certificate.clone(),
            client_key: self.client_key.clone(),
            insecure_skip_tls_verify: self.insecure_skip_tls_verify,
            impersonate: self.as_user.clone(),
            impersonate_groups: self.as_group.clone(),
            request_timeout: self.request_timeout,
        }
    }

    /// The client flags the controller's own commands take. A report sends a handful of
    /// reads: the controller's default rate limit never holds it back.
    pub fn client(&self) -> ClientArgs {
        ClientArgs {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            kube_api_qps: 50.0,
            kube_api_burst: 100,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the pod network: every range not yet drained, and unmanaged podCIDRs (what
    /// `nodeipam ranges` prints).
    Ranges {
        /// table, wide, json, yaml, name; or a consumer's format: ip-masq-agent, kube-proxy,
        /// no-masquerade-cidrs.
        #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Print the leader, the configs and pools with their usage, the nodes waiting for a
    /// podCIDR and why, and whether the published outputs are current.
    Status {
        #[arg(short = 'o', long = "output", value_enum, default_value_t = View::Table)]
        output: View,
    },
    /// Check the nodes, configs, Service ranges and published outputs against each other;
    /// exit 1 with one line per inconsistency, 0 when there is none. Damage on the nodes
    /// (overlaps, a podCIDR in a Service range or in no config) is reported at once; what the
    /// controller's normal lag can cause (a status count, a condition, an output) only if a
    /// second look, --settle later, finds it still wrong: a check can take that long more.
    Check {
        #[arg(short = 'o', long = "output", value_enum, default_value_t = View::Table)]
        output: View,
        /// How long to wait before looking again at findings the controller's lag can cause
        /// (its status counts are written at most once a second); 0s reports them from one look.
        #[arg(long, value_name = "DURATION", default_value_t = GoDuration(nodeipam_alloc::check::SETTLE))]
        settle: GoDuration,
    },
    /// Convert another node IPAM's ranges into NodeIPAMConfigs: print them (or create them
    /// with --apply); exit 1, creating nothing, when one cannot be converted.
    Migrate {
        #[command(subcommand)]
        from: Migrate,
    },
    /// Print a shell completion script for the kubectl-nodeipam command (e.g. `source
    /// <(kubectl nodeipam completion bash)`); `kubectl nodeipam <TAB>` is completed by kubectl
    /// through kubectl_complete-nodeipam, a link to this binary.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the version, the git commit and the build date.
    Version,
}

/// What `migrate` converts.
#[derive(Debug, Subcommand)]
pub enum Migrate {
    /// kubernetes-sigs/node-ipam-controller's ClusterCIDRs (networking.x-k8s.io/v1 or
    /// v1alpha1; networking.k8s.io/v1alpha1 of kube-controller-manager 1.25 to 1.28), one
    /// NodeIPAMConfig each, of the same name. Checked against the cluster's NodeIPAMConfigs,
    /// pools and Service ranges as the webhook checks a create.
    #[command(name = "clustercidr", visible_alias = "clustercidrs")]
    ClusterCidr(MigrateArgs),
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Read the ClusterCIDRs from this YAML or JSON file (`-` for standard input) instead of
    /// the cluster; without --apply, the cluster is not read at all.
    #[arg(short = 'f', long)]
    pub filename: Option<PathBuf>,
    /// Create the NodeIPAMConfigs (those of the same name and ranges are left alone) instead
    /// of printing them.
    #[arg(long)]
    pub apply: bool,
    /// How to print the NodeIPAMConfigs without --apply.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = MigrateOutput::Yaml)]
    pub output: MigrateOutput,
}

/// `migrate`'s `-o`: manifests to apply.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum MigrateOutput {
    Yaml,
    Json,
}

/// kubectl's `-o` for a report.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum View {
    Table,
    /// The table with reasons and messages.
    Wide,
    Json,
    Yaml,
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
    fn connection_flags_go_before_or_after_the_subcommand() {
        for argv in [
            &["kubectl-nodeipam", "--context=prod", "check", "-ojson"][..],
            &[
                "kubectl-nodeipam",
                "check",
                "--context",
                "prod",
                "-o",
                "json",
            ][..],
        ] {
            let cli = Cli::try_parse_from(argv).expect("parses");
            assert_eq!(cli.global.context.as_deref(), Some("prod"), "{argv:?}");
            assert!(matches!(
                cli.command,
                Command::Check {
                    output: View::Json,
                    ..
                }
            ));
        }
        let cli =
            Cli::try_parse_from(["kubectl-nodeipam", "ranges", "-o", "wide"]).expect("ranges");
        assert!(matches!(
            cli.command,
            Command::Ranges {
                output: Format::Wide
            }
        ));
        assert_eq!(cli.global.namespace, "nodeipam-system");
        let cli = Cli::try_parse_from([
            "kubectl-nodeipam",
            "check",
            "--service-cidr=10.96.0.0/12,fd00::/108",
        ])
        .expect("service CIDRs");
        assert_eq!(cli.global.service_cidrs.len(), 2);
        assert_eq!(cli.global.lease_name, "nodeipam-controller");
    }

    #[test]
    fn migrate_takes_a_file_or_the_cluster() {
        let cli = Cli::try_parse_from([
            "kubectl-nodeipam",
            "migrate",
            "clustercidrs",
            "-f",
            "-",
            "-ojson",
        ])
        .expect("parses");
        let Command::Migrate {
            from: Migrate::ClusterCidr(args),
        } = cli.command
        else {
            panic!("migrate clustercidr: {cli:?}");
        };
        assert_eq!(args.filename.as_deref(), Some(std::path::Path::new("-")));
        assert_eq!(args.output, MigrateOutput::Json);
        assert!(!args.apply);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let e = Cli::try_parse_from(["kubectl-nodeipam", "status", "-o", "xml"]).expect_err("xml");
        assert!(e.to_string().contains("--output"), "{e}");
        let e = Cli::try_parse_from([
            "kubectl-nodeipam",
            "check",
            "--ip-masq-agent-configmap=just-a-name",
        ])
        .expect_err("not namespace/name");
        assert!(
            e.to_string().contains("--ip-masq-agent-configmap")
                && e.to_string().contains("namespace/name"),
            "{e}"
        );
    }

    #[test]
    fn kubectls_generic_flags_go_before_or_after_the_subcommand() {
        let cli = Cli::try_parse_from([
            "kubectl-nodeipam",
            "-s",
            "https://10.0.0.1:6443",
            "--as=alice",
            "status",
            "--as-group=g1",
            "--as-group",
            "g2",
            "--token=t",
            "--insecure-skip-tls-verify",
            "--request-timeout=30s",
            "--user=u",
            "--cluster=c",
            "--certificate-authority=/ca",
            "--client-certificate=/crt",
            "--client-key=/key",
        ])
        .expect("parses");
        let o = cli.global.overrides();
        assert_eq!(o.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(o.impersonate.as_deref(), Some("alice"));
        assert_eq!(o.impersonate_groups, ["g1", "g2"]);
        assert!(o.insecure_skip_tls_verify);
        assert_eq!(o.request_timeout, Some(std::time::Duration::from_secs(30)));
        assert_eq!(
            (o.user.as_deref(), o.cluster.as_deref()),
            (Some("u"), Some("c"))
        );
        assert!(matches!(cli.command, Command::Status { .. }));
        let cli = Cli::try_parse_from([
            "kubectl-nodeipam",
            "--insecure-skip-tls-verify=false",
            "ranges",
        ])
        .expect("parses");
        assert!(!cli.global.insecure_skip_tls_verify);
        let e = Cli::try_parse_from(["kubectl-nodeipam", "ranges", "--request-timeout=soon"])
            .expect_err("not a duration");
        assert!(e.to_string().contains("--request-timeout"), "{e}");
    }

    #[test]
    fn the_usage_is_kubectls() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("Usage: kubectl nodeipam"), "{help}");
        assert!(help.contains("Exit status: 0"), "{help}");
    }
}
