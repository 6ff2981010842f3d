//! The bytes a start-up reads: a control plane filled with N Nodes that hold podCIDRs (the
//! start-up benchmark's loader), then `/api/v1/nodes` listed in protobuf pages of the size
//! nodeipam asks for, each body written to a file, for decoders to be timed on (benches/nodelist.rs).

use std::path::PathBuf;

use anyhow::{Context, bail};
use http::header::{ACCEPT, CONTENT_TYPE};
use nodeipam_alloc::node::protobuf;
use nodeipam_testenv::ControlPlane;

use crate::common;
use crate::nodes;

#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {
    /// Nodes to create (all holding podCIDRs of 10.0.0.0/8), then list.
    #[arg(long, default_value_t = 65_000)]
    pub nodes: usize,
    /// Nodes per page: nodeipam's own page size.
    #[arg(long, default_value_t = 2000)]
    pub page_size: usize,
    /// Per-node mask of the blocks the nodes hold.
    #[arg(long, default_value_t = common::MASK)]
    pub mask: u8,
    /// Folder of kube-apiserver and etcd (default: the harness's).
    #[arg(long)]
    pub assets: Option<PathBuf>,
    /// Folder the pages are written to (page-000.pb, page-001.pb, …); must not exist yet.
    #[arg(long)]
    pub out: PathBuf,
}

pub async fn run(args: CaptureArgs) -> anyhow::Result<()> {
    if args.out.exists() {
        bail!("--out {}: already exists", args.out.display());
    }
    let mut builder = ControlPlane::builder().service_cluster_ip_range(common::SERVICE_RANGE);
    if let Some(a) = &args.assets {
        builder = builder.assets_dir(a);
    }
    let cp = builder
        .start()
        .await
        .context("starting the control plane")?;
    let load = nodes::fill(cp.kubeconfig_path(), args.mask, args.nodes, 64).await?;
    eprintln!(
        "capture: {} nodes created in {:.1}s",
        load.created, load.seconds
    );
    std::fs::create_dir_all(&args.out)?;
    let client = crate::client(cp.kubeconfig_path()).await?;
    let (mut token, mut pages, mut items) = (None::<String>, 0usize, 0usize);
    loop {
        let mut uri = format!("/api/v1/nodes?limit={}", args.page_size);
        if let Some(t) = &token {
            uri.push_str(&format!("&continue={t}"));
        }
        let req = http::Request::get(&uri)
            .header(ACCEPT, "application/vnd.kubernetes.protobuf")
            .body(kube::client::Body::empty())?;
        let res = client
            .send(req)
            .await
            .with_context(|| format!("GET {uri}"))?;
        let protobuf_body = res.headers().get(CONTENT_TYPE).is_some_and(|v| {
            v.as_bytes()
                .starts_with(b"application/vnd.kubernetes.protobuf")
        });
        let status = res.status();
        let body = res.into_body().collect_bytes().await?;
        if !status.is_success() || !protobuf_body {
            bail!("GET {uri}: {status}, protobuf {protobuf_body}");
        }
        let page = protobuf::node_list(&body).with_context(|| format!("page {pages}"))?;
        std::fs::write(args.out.join(format!("page-{pages:03}.pb")), &body)?;
        pages += 1;
        items += page.items.len();
        // The token is opaque base64 (may hold '=' and '/'): escaped as a query value.
        token = page.continue_token.map(|t| form_escape(&t));
        if token.is_none() {
            break;
        }
    }
    if items != args.nodes {
        bail!("listed {items} nodes, created {}", args.nodes);
    }
    eprintln!(
        "capture: {items} nodes in {pages} pages written to {}",
        args.out.display()
    );
    Ok(())
}

/// `s` as a URL query value: unreserved characters kept, every other byte percent-encoded.
fn form_escape(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continue_token_is_escaped_as_a_query_value() {
        assert_eq!(form_escape("eyJ2Ijo=/+a_b"), "eyJ2Ijo%3D%2F%2Ba_b");
    }
}
