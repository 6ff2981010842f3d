//! core/v1 NodeSelector matching: whether a selector matches a node, given the node's name and
//! labels. Pure; shared by the controller (which config serves a node) and the webhook (how
//! many nodes a config can serve).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

/// A node as selector matching sees it.
#[derive(Clone, Copy, Debug)]
pub struct NodeView<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// True when some term of `selector` matches `node`. Terms are ORed and the requirements of a
/// term ANDed, as core/v1 defines it; an empty term, or a selector without terms, matches
/// nothing.
pub fn selector_matches(selector: &NodeSelector, node: NodeView<'_>) -> bool {
    selector
        .node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// How many requirements (label expressions and fields) `term` has.
pub fn requirement_count(term: &NodeSelectorTerm) -> usize {
    term.match_expressions.as_ref().map_or(0, Vec::len)
        + term.match_fields.as_ref().map_or(0, Vec::len)
}

/// True when every requirement of `term` holds for `node`; a term without requirements
/// matches nothing.
pub fn term_matches(term: &NodeSelectorTerm, node: NodeView<'_>) -> bool {
    if requirement_count(term) == 0 {
        return false;
    }
    let labels_ok = term
        .match_expressions
        .iter()
        .flatten()
        .all(|req| requirement_matches(req, node.labels.get(&req.key).map(String::as_str)));
    let fields_ok = term.match_fields.iter().flatten().all(|req| {
        // core/v1 supports only metadata.name here; any other field cannot match.
        req.key == "metadata.name" && requirement_matches(req, Some(node.name))
    });
    labels_ok && fields_ok
}

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or_default();
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            // Both sides must be integers, and Gt/Lt take exactly one value.
            let (Some(have), [want]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else {
                return false;
            };
            let Ok(want) = want.parse::<i64>() else {
                return false;
            };
            if req.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        // An unknown operator never matches: validation rejects it, and a config that got
        // past validation must not capture nodes by accident.
        _ => false,
    }
}

/// A requirement from string literals (no values: `None`, as for `Exists`).
pub fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// A selector whose terms are (matchExpressions, matchFields) pairs; empty lists are left out.
pub fn selector_of(
    terms: Vec<(Vec<NodeSelectorRequirement>, Vec<NodeSelectorRequirement>)>,
) -> NodeSelector {
    NodeSelector {
        node_selector_terms: terms
            .into_iter()
            .map(|(e, f)| NodeSelectorTerm {
                match_expressions: (!e.is_empty()).then_some(e),
                match_fields: (!f.is_empty()).then_some(f),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::{requirement as req, selector_of as selector};

    fn matches(sel: &NodeSelector, name: &str, l: &[(&str, &str)]) -> bool {
        let l: BTreeMap<String, String> = l
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        selector_matches(sel, NodeView { name, labels: &l })
    }

    #[test]
    fn operators_follow_core_v1() {
        type Case<'a> = (NodeSelectorRequirement, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case<'_>] = &[
            (req("zone", "In", &["a", "b"]), &[("zone", "b")], true),
            (req("zone", "In", &["a", "b"]), &[("zone", "c")], false),
            (req("zone", "In", &["a"]), &[], false),
            (req("zone", "NotIn", &["a"]), &[("zone", "b")], true),
            (req("zone", "NotIn", &["a"]), &[], true),
            (req("zone", "NotIn", &["a"]), &[("zone", "a")], false),
            (req("gpu", "Exists", &[]), &[("gpu", "")], true),
            (req("gpu", "Exists", &[]), &[], false),
            (req("gpu", "DoesNotExist", &[]), &[], true),
            (req("gpu", "DoesNotExist", &[]), &[("gpu", "x")], false),
            (req("rack", "Gt", &["5"]), &[("rack", "6")], true),
            (req("rack", "Gt", &["5"]), &[("rack", "5")], false),
            (req("rack", "Gt", &["5"]), &[("rack", "x")], false),
            (req("rack", "Gt", &["5"]), &[], false),
            (req("rack", "Lt", &["5"]), &[("rack", "-3")], true),
            (req("rack", "Lt", &["x"]), &[("rack", "1")], false),
            (req("rack", "Lt", &["1", "2"]), &[("rack", "0")], false),
            (req("zone", "Bogus", &["a"]), &[("zone", "a")], false),
        ];
        for (r, l, want) in cases {
            let sel = selector(vec![(vec![r.clone()], vec![])]);
            assert_eq!(matches(&sel, "n", l), *want, "{r:?} on {l:?}");
        }
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        // node-ipam-controller #36 ANDed the terms; core/v1 ORs them.
        let sel = selector(vec![
            (
                vec![req("zone", "In", &["a"]), req("gpu", "Exists", &[])],
                vec![],
            ),
            (vec![req("zone", "In", &["b"])], vec![]),
        ]);
        assert!(matches(&sel, "n", &[("zone", "b")]));
        assert!(matches(&sel, "n", &[("zone", "a"), ("gpu", "1")]));
        assert!(
            !matches(&sel, "n", &[("zone", "a")]),
            "second requirement of term 1 unmet"
        );
        assert!(!matches(&sel, "n", &[("zone", "c"), ("gpu", "1")]));
    }

    #[test]
    fn empty_terms_match_nothing() {
        assert!(!matches(&selector(vec![]), "n", &[("a", "b")]));
        assert!(!matches(
            &selector(vec![(vec![], vec![])]),
            "n",
            &[("a", "b")]
        ));
    }

    #[test]
    fn match_fields_apply_to_the_node_name() {
        let sel = selector(vec![(vec![], vec![req("metadata.name", "In", &["n1"])])]);
        assert!(matches(&sel, "n1", &[]));
        assert!(!matches(&sel, "n2", &[]));
        let not = selector(vec![(vec![], vec![req("metadata.name", "NotIn", &["n1"])])]);
        assert!(!matches(&not, "n1", &[]));
        assert!(matches(&not, "n2", &[]));
        let other = selector(vec![(vec![], vec![req("metadata.uid", "In", &["n1"])])]);
        assert!(
            !matches(&other, "n1", &[]),
            "only metadata.name is a node field"
        );
    }
}
