//! CRD installation: server-side apply every CustomResourceDefinition found in the YAML files
//! under a folder, then wait until each is Established and its resources are in discovery.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};

use crate::error::{HarnessError, Step};

pub(crate) const FIELD_MANAGER: &str = "nodeipam-testenv";

/// Every `*.yaml` / `*.yml` file under `dir`, recursively, in path order.
pub(crate) fn yaml_files(dir: &Path) -> Result<Vec<PathBuf>, HarnessError> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = std::fs::read_dir(&current).map_err(|e| {
            HarnessError::io(Step::InstallCrds, format!("read {}", current.display()), e)
        })?;
        for entry in entries {
            let path = entry
                .map_err(|e| {
                    HarnessError::io(Step::InstallCrds, format!("read {}", current.display()), e)
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The CRDs in one multi-document YAML text; any other kind of object is an error.
pub(crate) fn parse_crds(
    text: &str,
    origin: &Path,
) -> Result<Vec<CustomResourceDefinition>, HarnessError> {
    let bad = |msg: String| {
        HarnessError::other(Step::InstallCrds, format!("{}: {msg}", origin.display()))
    };
    let mut crds = Vec::new();
    for value in crate::yaml::documents(text).map_err(bad)? {
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        if kind != "CustomResourceDefinition" {
            return Err(bad(format!(
                "expected only CustomResourceDefinitions, found kind {kind:?}"
            )));
        }
        let crd: CustomResourceDefinition =
            serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
        if crd.metadata.name.as_deref().unwrap_or("").is_empty() {
            return Err(bad("a CustomResourceDefinition has no metadata.name".into()));
        }
        crds.push(crd);
    }
    Ok(crds)
}

/// Applies every CRD under `dir` and waits until all are served. Returns their names.
pub(crate) async fn install(
    client: &kube::Client,
    dir: &Path,
    timeout: Duration,
) -> Result<Vec<String>, HarnessError> {
    let mut crds = Vec::new();
    for file in yaml_files(dir)? {
        let text = std::fs::read_to_string(&file).map_err(|e| {
            HarnessError::io(Step::InstallCrds, format!("read {}", file.display()), e)
        })?;
        crds.extend(parse_crds(&text, &file)?);
    }
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let params = PatchParams::apply(FIELD_MANAGER).force();
    for crd in &crds {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &params, &Patch::Apply(crd))
            .await
            .map_err(|e| HarnessError::kube(Step::InstallCrds, format!("apply CRD {name}"), e))?;
    }
    let deadline = Instant::now() + timeout;
    for crd in &crds {
        wait_served(client, &api, crd, deadline).await?;
    }
    Ok(crds
        .iter()
        .filter_map(|c| c.metadata.name.clone())
        .collect())
}

/// Waits until the CRD is Established and discovery lists its plural for every served version:
/// only then do clients (and RESTMappers) see the new resource.
async fn wait_served(
    client: &kube::Client,
    api: &Api<CustomResourceDefinition>,
    crd: &CustomResourceDefinition,
    deadline: Instant,
) -> Result<(), HarnessError> {
    let name = crd.metadata.name.clone().unwrap_or_default();
    let group = &crd.spec.group;
    let plural = &crd.spec.names.plural;
    let versions: Vec<&str> = crd
        .spec
        .versions
        .iter()
        .filter(|v| v.served)
        .map(|v| v.name.as_str())
        .collect();
    loop {
        let why = match is_served(client, api, &name, group, plural, &versions).await {
            Ok(()) => return Ok(()),
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return Err(HarnessError::other(
                Step::InstallCrds,
                format!("CRD {name} not served in time: {why}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn is_served(
    client: &kube::Client,
    api: &Api<CustomResourceDefinition>,
    name: &str,
    group: &str,
    plural: &str,
    versions: &[&str],
) -> Result<(), String> {
    let current = api.get(name).await.map_err(|e| format!("get: {e}"))?;
    let established = current
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conds| {
            conds
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
    if !established {
        return Err("not Established".into());
    }
    for version in versions {
        let gv = format!("{group}/{version}");
        let list = client
            .list_api_group_resources(&gv)
            .await
            .map_err(|e| format!("discovery {gv}: {e}"))?;
        if !list.resources.iter().any(|r| r.name == plural) {
            return Err(format!("discovery {gv} does not list {plural}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CRD: &str = r#"
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.test
spec:
  group: example.test
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Cluster
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema: {type: object}
---
"#;

    #[test]
    fn parses_crds_and_skips_empty_documents() {
        let crds = parse_crds(CRD, Path::new("x.yaml")).unwrap();
        assert_eq!(crds.len(), 1);
        assert_eq!(crds[0].spec.names.plural, "widgets");
    }

    #[test]
    fn other_kinds_are_rejected_with_the_file_name() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n";
        let err = parse_crds(text, Path::new("/a/b.yaml")).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("/a/b.yaml") && msg.contains("ConfigMap"),
            "{msg}"
        );
        assert_eq!(err.step(), Step::InstallCrds);
    }

    #[test]
    fn finds_yaml_recursively_in_order() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("b.yaml"), "").unwrap();
        std::fs::write(dir.path().join("a.yml"), "").unwrap();
        std::fs::write(dir.path().join("sub/c.yaml"), "").unwrap();
        std::fs::write(dir.path().join("README.md"), "").unwrap();
        let files = yaml_files(dir.path()).unwrap();
        let names: Vec<String> = files
            .iter()
            .map(|f| f.strip_prefix(dir.path()).unwrap().display().to_string())
            .collect();
        assert_eq!(names, vec!["a.yml", "b.yaml", "sub/c.yaml"]);
    }
}
