//! Multi-document YAML streams (manifests, rendered charts) as JSON values, the one reader the
//! harness and the tests share.

use serde_json::Value;

/// The objects of a multi-document YAML text, in order; empty documents (a trailing `---`)
/// are left out. The error says which document did not parse and why.
pub fn documents(text: &str) -> Result<Vec<Value>, String> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(docs.into_iter().filter(|v| !v.is_null()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_empty_documents_and_reports_garbage() {
        let docs = documents("---\na: 1\n---\n---\nb: [x]\n---\n").expect("parses");
        assert_eq!(
            docs,
            vec![serde_json::json!({"a": 1}), serde_json::json!({"b": ["x"]})]
        );
        assert!(documents("a: [unclosed\n").is_err());
    }
}
