//! Registering a validating admission webhook served at a URL (the webhook server a test runs on
//! loopback), as a ValidatingWebhookConfiguration with one webhook.

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};

use crate::crds::FIELD_MANAGER;
use crate::error::{HarnessError, Step};

/// The object `register` applies; split out so its shape can be checked without a server.
pub(crate) fn configuration(
    name: &str,
    url: &str,
    ca_bundle_pem: &[u8],
    rules: Vec<RuleWithOperations>,
    failure_policy: &str,
) -> Result<ValidatingWebhookConfiguration, HarnessError> {
    if !matches!(failure_policy, "Fail" | "Ignore") {
        return Err(HarnessError::other(
            Step::RegisterWebhook,
            format!("failure policy must be \"Fail\" or \"Ignore\", not {failure_policy:?}"),
        ));
    }
    if !url.starts_with("https://") {
        return Err(HarnessError::other(
            Step::RegisterWebhook,
            format!("webhook URL must be https://, got {url:?}"),
        ));
    }
    Ok(ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![ValidatingWebhook {
            // The API server wants a webhook name with at least three dot-separated segments.
            name: name.to_string(),
            admission_review_versions: vec!["v1".to_string()],
            client_config: WebhookClientConfig {
                url: Some(url.to_string()),
                ca_bundle: Some(ByteString(ca_bundle_pem.to_vec())),
                service: None,
            },
            rules: Some(rules),
            failure_policy: Some(failure_policy.to_string()),
            side_effects: "None".to_string(),
            timeout_seconds: Some(10),
            ..ValidatingWebhook::default()
        }]),
    })
}

/// Applies the configuration (so registering again updates it) and reads it back.
///
/// The API server's admission chain picks the configuration up through an informer, a few
/// milliseconds after this returns; a test that must see the webhook act on the very next request
/// should retry that request briefly.
pub(crate) async fn register(
    client: &kube::Client,
    config: ValidatingWebhookConfiguration,
) -> Result<(), HarnessError> {
    let name = config.metadata.name.clone().unwrap_or_default();
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&config),
    )
    .await
    .map_err(|e| {
        HarnessError::kube(
            Step::RegisterWebhook,
            format!("apply ValidatingWebhookConfiguration {name}"),
            e,
        )
    })?;
    api.get(&name).await.map_err(|e| {
        HarnessError::kube(
            Step::RegisterWebhook,
            format!("read back ValidatingWebhookConfiguration {name}"),
            e,
        )
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule() -> RuleWithOperations {
        RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["UPDATE".into()]),
            resources: Some(vec!["nodes".into()]),
            scope: Some("Cluster".into()),
        }
    }

    #[test]
    fn builds_one_webhook_with_url_and_ca() {
        let cfg = configuration(
            "nodes.nodeipam.test",
            "https://127.0.0.1:9443/validate",
            b"PEM",
            vec![rule()],
            "Fail",
        )
        .unwrap();
        let hooks = cfg.webhooks.unwrap();
        assert_eq!(hooks.len(), 1);
        assert_eq!(hooks[0].name, "nodes.nodeipam.test");
        assert_eq!(
            hooks[0].client_config.url.as_deref(),
            Some("https://127.0.0.1:9443/validate")
        );
        assert_eq!(hooks[0].client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
        assert_eq!(hooks[0].failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hooks[0].side_effects, "None");
    }

    #[test]
    fn rejects_unknown_failure_policy_and_plain_http() {
        let err = configuration("a.b.c", "https://x", b"", vec![], "Sometimes").unwrap_err();
        assert_eq!(err.step(), Step::RegisterWebhook);
        assert!(configuration("a.b.c", "http://x", b"", vec![], "Ignore").is_err());
    }
}
