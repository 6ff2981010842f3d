//! `kubectl nodeipam migrate clustercidr`: reads node-ipam-controller's ClusterCIDRs (from the
//! cluster, or from manifests with `-f`), prints the NodeIPAMConfigs they become or creates
//! them (`--apply`). A shell only: what becomes of each ClusterCIDR is
//! [`crate::clustercidr::plan`]'s.

use std::io::Read as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use kube::api::{ApiResource, DynamicObject, ListParams, PostParams};
use kube::{Api, Client};
use nodeipam_crd::NodeIPAMConfig;
use nodeipam_webhook::ServiceRange;
use serde_json::{Value, json};

use crate::args::{Global, MigrateArgs, MigrateOutput};
use crate::clustercidr::{self, APIS, ClusterCidr, Plan, Step};

/// Exit status when some ClusterCIDR cannot become a NodeIPAMConfig (nothing was created);
/// 2 (as every command) when the command could not run.
use nodeipam_controller::ranges::EXIT_FOUND as REFUSED;
/// The field manager of what `--apply` creates.
const FIELD_MANAGER: &str = "kubectl-nodeipam";

pub async fn run(global: &Global, args: &MigrateArgs) -> ExitCode {
    let mut server = None;
    match migrate(global, args, &mut server).await {
        Ok(code) => code,
        Err(e) => crate::report::fail("kubectl nodeipam migrate", &e, server.as_ref()),
    }
}

/// Migrates; `server` is the API server once connected, for an error to name.
async fn migrate(
    global: &Global,
    args: &MigrateArgs,
    server: &mut Option<http::Uri>,
) -> anyhow::Result<ExitCode> {
    // A file converts without a cluster; reading the cluster, or creating in it, checks
    // against what it has, as the webhook would (it may not run yet during a migration).
    let client = if args.filename.is_none() || args.apply {
        let (client, url) = crate::report::connect(global).await?;
        *server = Some(url);
        Some(client)
    } else {
        None
    };
    let items = match (&args.filename, &client) {
        (Some(path), _) => from_file(path)?,
        (None, client) => {
            from_cluster(client.as_ref().context("no file given, and no cluster")?).await?
        }
    };
    let view = match &client {
        Some(client) => cluster_view(client, global).await?,
        None => clustercidr::view_of(vec![], vec![], flag_services(global)),
    };
    let plan = match clustercidr::plan(&items, &view) {
        Ok(plan) => plan,
        Err(refusals) => {
            for r in &refusals {
                eprintln!("error: {r}");
            }
            eprintln!(
                "kubectl nodeipam migrate: {} of {} ClusterCIDR(s) cannot become NodeIPAMConfigs; nothing was {}",
                distinct(&refusals),
                items.len(),
                if args.apply { "created" } else { "printed" }
            );
            return Ok(ExitCode::from(REFUSED));
        }
    };
    for note in &plan.notes {
        eprintln!("Warning: {note}");
    }
    if items.is_empty() {
        eprintln!("Warning: no ClusterCIDRs found");
    }
    match (&client, args.apply) {
        (Some(client), true) => apply(client, &plan).await?,
        _ => print!("{}", render(&plan, args.output)?),
    }
    Ok(ExitCode::SUCCESS)
}

/// How many ClusterCIDRs were refused (one may have several reasons).
fn distinct(refusals: &[clustercidr::Refusal]) -> usize {
    let mut names: Vec<&str> = refusals.iter().map(|r| r.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    names.len()
}

/// The ClusterCIDRs of a YAML or JSON file (`-` for standard input): objects, Lists of them,
/// several documents.
fn from_file(path: &Path) -> anyhow::Result<Vec<ClusterCidr>> {
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("reading standard input")?;
        text
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    parse_input(&text, &path.display().to_string())
}

/// The ClusterCIDRs of a migrate input file's `text` (YAML or JSON, one or more documents,
/// objects or Lists of them); errors name `source` and the object.
pub fn parse_input(text: &str, source: &str) -> anyhow::Result<Vec<ClusterCidr>> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .with_context(|| format!("{source} is not YAML or JSON"))?;
    let mut objects = Vec::new();
    for doc in docs.into_iter().filter(|d| !d.is_null()) {
        match doc.get("items").and_then(Value::as_array) {
            Some(items) if doc["kind"].as_str().is_some_and(|k| k.ends_with("List")) => {
                objects.extend(items.iter().cloned());
            }
            _ => objects.push(doc),
        }
    }
    objects
        .iter()
        .enumerate()
        .map(|(i, v)| {
            ClusterCidr::from_value(v)
                .map_err(|e| anyhow::anyhow!("{source}: object {}: {e}", i + 1))
        })
        .collect()
}

/// Every ClusterCIDR the cluster serves, from each group once (its newest version served).
async fn from_cluster(client: &Client) -> anyhow::Result<Vec<ClusterCidr>> {
    let mut items = Vec::new();
    let mut groups_read: Vec<&str> = Vec::new();
    for (group, version) in APIS {
        if groups_read.contains(&group) {
            continue;
        }
        let api_version = format!("{group}/{version}");
        let resource = ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: api_version.clone(),
            kind: "ClusterCIDR".into(),
            plural: "clustercidrs".into(),
        };
        let list = match Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await
        {
            Ok(list) => list,
            Err(kube::Error::Api(s)) if s.code == 404 => continue,
            Err(e) => {
                return Err(
                    anyhow::Error::new(e).context(format!("listing {api_version} ClusterCIDRs"))
                );
            }
        };
        groups_read.push(group);
        for object in list.items {
            let mut value = serde_json::to_value(&object)?;
            // A list's items may come without their type.
            value["apiVersion"] = json!(api_version);
            value["kind"] = json!("ClusterCIDR");
            items.push(ClusterCidr::from_value(&value).map_err(|e| {
                anyhow::anyhow!("{api_version} ClusterCIDR {:?}: {e}", object.metadata.name)
            })?);
        }
    }
    if groups_read.is_empty() {
        anyhow::bail!(
            "this cluster serves no ClusterCIDR API ({}); to convert manifests, pass them with -f",
            clustercidr::api_list()
        );
    }
    Ok(items)
}

/// The cluster's NodeIPAMConfigs, pools and Service ranges (and `--service-cidr`).
async fn cluster_view(
    client: &Client,
    global: &Global,
) -> anyhow::Result<nodeipam_webhook::ClusterView> {
    let read = crate::read::read(client, global).await?;
    let services = read
        .services
        .iter()
        .flat_map(|(name, cidrs)| {
            cidrs.iter().map(move |&cidr| {
                if name == nodeipam_alloc::machine::SERVICE_FLAG_SOURCE {
                    ServiceRange::flag(cidr)
                } else {
                    ServiceRange::of_service_cidr(name, cidr)
                }
            })
        })
        .collect();
    Ok(clustercidr::view_of(
        read.configs,
        read.pools.unwrap_or_default(),
        services,
    ))
}

fn flag_services(global: &Global) -> Vec<ServiceRange> {
    global
        .service_cidrs
        .iter()
        .map(|&cidr| ServiceRange::flag(cidr))
        .collect()
}

/// The configs as manifests: YAML documents, or a JSON List as kubectl prints one.
fn render(plan: &Plan, output: MigrateOutput) -> anyhow::Result<String> {
    let configs: Vec<&NodeIPAMConfig> = plan.configs.iter().map(|(c, _)| c).collect();
    Ok(match output {
        MigrateOutput::Yaml => configs
            .iter()
            .map(|c| serde_saphyr::to_string(c).map(|y| format!("---\n{y}")))
            .collect::<Result<String, _>>()?,
        MigrateOutput::Json => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": configs});
            serde_json::to_string_pretty(&list)? + "\n"
        }
    })
}

/// Creates what the plan creates, one line per config as `kubectl apply` prints them. What was
/// created stays when a later create fails: a second run reports it unchanged.
async fn apply(client: &Client, plan: &Plan) -> anyhow::Result<()> {
    let api: Api<NodeIPAMConfig> = Api::all(client.clone());
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    for (config, step) in &plan.configs {
        let name = config.metadata.name.as_deref().unwrap_or_default();
        let done = match step {
            Step::Unchanged => "unchanged",
            Step::Create => {
                api.create(&params, config)
                    .await
                    .with_context(|| format!("creating NodeIPAMConfig {name:?}"))?;
                "created"
            }
        };
        println!("nodeipamconfig.nodeipam.io/{name} {done}");
    }
    Ok(())
}
