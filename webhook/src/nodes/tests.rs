use nodeipam_crd::selector::{requirement as req, selector_of};

use super::*;

fn list(labels: Option<&str>, fields: Option<&str>) -> Query {
    Query::List {
        labels: labels.map(Into::into),
        fields: fields.map(Into::into),
    }
}

fn names(n: &[&str]) -> Query {
    Query::Names(n.iter().map(|s| s.to_string()).collect())
}

/// The reads for a selector of one term with these label expressions.
fn labels_only(exprs: Vec<NodeSelectorRequirement>) -> Vec<Query> {
    queries(Some(&selector_of(vec![(exprs, vec![])])))
}

#[test]
fn no_selector_lists_every_node() {
    assert_eq!(queries(None), vec![Query::ALL]);
}

#[test]
fn each_label_operator_becomes_a_label_selector() {
    let cases = [
        (req("zone", "In", &["a", "b"]), "zone in (a,b)"),
        (req("zone", "NotIn", &["a"]), "zone notin (a)"),
        (req("gpu", "Exists", &[]), "gpu"),
        (req("gpu", "DoesNotExist", &[]), "!gpu"),
        (
            req("topology.kubernetes.io/zone", "In", &["eu-1a"]),
            "topology.kubernetes.io/zone in (eu-1a)",
        ),
    ];
    for (r, want) in cases {
        assert_eq!(
            labels_only(vec![r.clone()]),
            vec![list(Some(want), None)],
            "{r:?}"
        );
    }
}

#[test]
fn the_requirements_of_a_term_are_anded() {
    assert_eq!(
        labels_only(vec![
            req("zone", "In", &["a"]),
            req("gpu", "Exists", &[]),
            req("spot", "DoesNotExist", &[]),
        ]),
        vec![list(Some("zone in (a),gpu,!spot"), None)]
    );
}

#[test]
fn an_untranslatable_operator_is_left_to_the_matcher() {
    // Gt alone: the whole list, filtered here.
    assert_eq!(
        labels_only(vec![req("rack", "Gt", &["5"])]),
        vec![Query::ALL]
    );
    // Gt next to a translatable requirement: narrowed by that one, Gt filtered here.
    assert_eq!(
        labels_only(vec![req("zone", "In", &["a"]), req("rack", "Lt", &["5"])]),
        vec![list(Some("zone in (a)"), None)]
    );
    // A value the selector syntax cannot carry is filtered here too.
    assert_eq!(
        labels_only(vec![req("zone", "In", &["a b"])]),
        vec![Query::ALL]
    );
}

#[test]
fn terms_are_ored_one_read_each() {
    let sel = selector_of(vec![
        (vec![req("zone", "In", &["b"])], vec![]),
        (vec![req("zone", "In", &["a"])], vec![]),
        // A duplicate term needs no second read.
        (vec![req("zone", "In", &["a"])], vec![]),
        // An empty term matches nothing.
        (vec![], vec![]),
    ]);
    assert_eq!(
        queries(Some(&sel)),
        vec![
            list(Some("zone in (a)"), None),
            list(Some("zone in (b)"), None)
        ]
    );
}

#[test]
fn one_unfiltered_term_makes_one_unfiltered_read() {
    let sel = selector_of(vec![
        (vec![req("zone", "In", &["a"])], vec![]),
        (vec![req("rack", "Gt", &["5"])], vec![]),
    ]);
    assert_eq!(queries(Some(&sel)), vec![Query::ALL]);
}

#[test]
fn match_fields_become_names_or_a_field_selector() {
    let field = |op, values: &[&str]| req("metadata.name", op, values);
    let one = |exprs, fields| queries(Some(&selector_of(vec![(exprs, fields)])));
    assert_eq!(
        one(vec![], vec![field("In", &["n1", "n2"])]),
        vec![names(&["n1", "n2"])]
    );
    // Two In fields: the names both allow; none left, nothing to read.
    assert_eq!(
        one(
            vec![],
            vec![field("In", &["n1", "n2"]), field("In", &["n2", "n3"])]
        ),
        vec![names(&["n2"])]
    );
    assert_eq!(
        one(vec![], vec![field("In", &["n1"]), field("In", &["n2"])]),
        vec![]
    );
    // Names with labels: got by name, the labels checked on what comes back.
    assert_eq!(
        one(vec![req("zone", "In", &["a"])], vec![field("In", &["n1"])]),
        vec![names(&["n1"])]
    );
    assert_eq!(
        one(
            vec![req("zone", "In", &["a"])],
            vec![field("NotIn", &["n1", "n2"])]
        ),
        vec![list(
            Some("zone in (a)"),
            Some("metadata.name!=n1,metadata.name!=n2")
        )]
    );
    // Every node has a name, and no other field exists.
    assert_eq!(one(vec![], vec![field("Exists", &[])]), vec![Query::ALL]);
    assert_eq!(one(vec![], vec![field("DoesNotExist", &[])]), vec![]);
    assert_eq!(one(vec![], vec![req("metadata.uid", "In", &["x"])]), vec![]);
}

#[test]
fn names_and_labels_in_different_terms_are_both_read() {
    let sel = selector_of(vec![
        (vec![], vec![req("metadata.name", "In", &["n9"])]),
        (vec![req("pool", "In", &["edge"])], vec![]),
    ]);
    assert_eq!(
        queries(Some(&sel)),
        vec![list(Some("pool in (edge)"), None), names(&["n9"])]
    );
}

fn node(name: &str, labels: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ObjectMeta::default()
    }
}

#[test]
fn the_tally_confirms_dedupes_and_stops_at_enough() {
    let sel = selector_of(vec![
        (vec![req("rack", "Gt", &["5"])], vec![]),
        (vec![req("pool", "In", &["edge"])], vec![]),
    ]);
    let mut tally = Tally::new(Some(&sel), 3, 2);
    // Not matched by the shared matcher: a list narrowed only partly returns such nodes.
    tally.add(&node("a", &[("rack", "2")]));
    tally.add(&node("b", &[("rack", "7")]));
    // Returned by both reads: counted once.
    tally.add(&node("c", &[("rack", "9"), ("pool", "edge")]));
    tally.add(&node("c", &[("rack", "9"), ("pool", "edge")]));
    assert_eq!(tally.count, 2);
    assert!(!tally.done());
    tally.add(&node("d", &[("pool", "edge")]));
    assert!(tally.done(), "3 is enough");

    // No selector: every node counts.
    let mut all = Tally::new(None, 2, 1);
    all.add(&node("a", &[]));
    assert!(!all.done());
    all.add(&node("b", &[]));
    assert!(all.done());
}
