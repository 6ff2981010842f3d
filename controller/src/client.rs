//! The Kubernetes client: which kubeconfig and context (as kubectl picks them), and the
//! client-side rate limit every request goes through, as client-go's `--kube-api-qps` and
//! `--kube-api-burst` in kube-controller-manager.

use std::sync::Arc;

use anyhow::Context as _;
use kube::Client;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::cli::ClientArgs;
use crate::ratelimit::{RateLimitLayer, RateLimiter};

/// Where the configuration comes from, decided from the flags and the environment alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `--kubeconfig`: that one file.
    File(std::path::PathBuf),
    /// `$KUBECONFIG` (every file of the list, merged) or `~/.kube/config`.
    Kubeconfig,
    /// Kubeconfig as above, then the in-cluster config.
    Infer,
}

/// `--kubeconfig` wins; a `--context` needs a kubeconfig, so it rules out in-cluster.
pub fn source(args: &ClientArgs) -> Source {
    match (&args.kubeconfig, &args.context) {
        (Some(path), _) => Source::File(path.clone()),
        (None, Some(_)) => Source::Kubeconfig,
        (None, None) => Source::Infer,
    }
}

/// The client configuration the flags name.
pub async fn config(args: &ClientArgs) -> anyhow::Result<kube::Config> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..KubeConfigOptions::default()
    };
    let context = args
        .context
        .as_deref()
        .map(|c| format!(" (context {c:?})"))
        .unwrap_or_default();
    match source(args) {
        Source::File(path) => {
            let kc = Kubeconfig::read_from(&path)
                .with_context(|| format!("--kubeconfig={}: cannot read it", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .with_context(|| format!("--kubeconfig={}{context}", path.display()))
        }
        Source::Kubeconfig => kube::Config::from_kubeconfig(&options)
            .await
            .with_context(|| format!("loading $KUBECONFIG or ~/.kube/config{context}")),
        Source::Infer => kube::Config::infer().await.context(
            "no --kubeconfig, no usable $KUBECONFIG or ~/.kube/config, and not in a cluster",
        ),
    }
}

/// A client whose every request waits for the rate limiter (`--kube-api-qps` 0: unlimited).
/// Each call builds a client with its own limiter, as client-go gives each client its own.
pub fn build(config: kube::Config, args: &ClientArgs) -> anyhow::Result<Client> {
    let limiter = Arc::new(RateLimiter::new(args.kube_api_qps, args.kube_api_burst));
    let builder = ClientBuilder::try_from(config).context("building the Kubernetes client")?;
    Ok(builder.with_layer(&RateLimitLayer::new(limiter)).build())
}

/// The client the flags name, rate limited.
pub async fn client(args: &ClientArgs) -> anyhow::Result<Client> {
    build(config(args).await?, args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(kubeconfig: Option<&str>, context: Option<&str>) -> ClientArgs {
        ClientArgs {
            kubeconfig: kubeconfig.map(Into::into),
            context: context.map(Into::into),
            kube_api_qps: 0.0,
            kube_api_burst: 1,
        }
    }

    #[test]
    fn the_flag_wins_and_a_context_needs_a_kubeconfig() {
        assert_eq!(source(&args(Some("/a"), None)), Source::File("/a".into()));
        assert_eq!(
            source(&args(Some("/a"), Some("c"))),
            Source::File("/a".into())
        );
        assert_eq!(source(&args(None, Some("c"))), Source::Kubeconfig);
        assert_eq!(source(&args(None, None)), Source::Infer);
    }
}
