//! Which NodeIPAMConfig serves a node: how well each config's selector matches it and the
//! precedence rules between the configs that match. Pure: no client. The core/v1 matching
//! itself lives in `nodeipam_crd::selector`, shared with the webhook.

use std::cmp::Ordering;

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
pub use nodeipam_crd::selector::{NodeView, selector_matches};
use nodeipam_crd::selector::{requirement_count, term_matches};

/// The facts about one config that selection needs, prepared by the caller.
#[derive(Clone, Debug)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub selector: Option<&'a NodeSelector>,
    /// Blocks still free, the smallest over the config's families: a dual-stack node needs one
    /// of each, so the scarcer family bounds what the config can still serve.
    pub free_blocks: u64,
    pub ipv4: Option<(IpNet, u8)>,
    pub ipv6: Option<(IpNet, u8)>,
    /// The NodeIPAMPool the config was carved from, if any.
    pub pool: Option<&'a str>,
}

/// How well a config matches a node; `None` from [`match_score`] means it does not match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum MatchScore {
    /// No selector: serves every node, after every selector match.
    CatchAll,
    /// The number of requirements in the best matching term.
    Selector(usize),
}

/// Scores `selector` against `node`. Terms are ORed and the requirements of a term ANDed, as
/// core/v1 defines it; an empty term, or a selector without terms, matches nothing.
pub fn match_score(selector: Option<&NodeSelector>, node: NodeView<'_>) -> Option<MatchScore> {
    let Some(selector) = selector else {
        return Some(MatchScore::CatchAll);
    };
    selector
        .node_selector_terms
        .iter()
        .filter(|term| term_matches(term, node))
        .map(requirement_count)
        .max()
        .map(MatchScore::Selector)
}

/// A stable text form of a selector, used only as the tie-break "lexically smaller selector".
pub fn selector_key(selector: Option<&NodeSelector>) -> String {
    let Some(selector) = selector else {
        return String::new();
    };
    let mut terms: Vec<String> = selector
        .node_selector_terms
        .iter()
        .map(|term| {
            let mut reqs: Vec<String> = term
                .match_expressions
                .iter()
                .flatten()
                .map(|r| requirement_key("", r))
                .chain(
                    term.match_fields
                        .iter()
                        .flatten()
                        .map(|r| requirement_key("field:", r)),
                )
                .collect();
            reqs.sort();
            reqs.join(",")
        })
        .collect();
    terms.sort();
    terms.join("|")
}

fn requirement_key(prefix: &str, req: &NodeSelectorRequirement) -> String {
    let mut values = req.values.clone().unwrap_or_default();
    values.sort();
    format!(
        "{prefix}{} {} ({})",
        req.key,
        req.operator,
        values.join(",")
    )
}

/// Orders matching configs best first by the precedence rules:
/// 1. more matching requirements (any selector match before a config without selector);
/// 2. fewer allocatable blocks, so small special-purpose ranges fill before big ones; the
///    children of one pool count as one config with the blocks of them all;
/// 3. larger per-node mask (smaller blocks);
/// 4. lexically smaller selector string;
/// 5. numerically lower CIDR (so a pool fills its lowest, oldest child first and its
///    youngest, highest one empties out and can be retired);
/// 6. name.
///
/// Every candidate gets its own sort key, so the order is total even when pool children and
/// other configs interleave.
///
/// Returns the indexes into `candidates` of the configs that match `node`.
pub fn rank(candidates: &[Candidate<'_>], node: NodeView<'_>) -> Vec<usize> {
    let mut matched: Vec<(usize, MatchScore, String)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            match_score(c.selector, node).map(|s| (i, s, selector_key(c.selector)))
        })
        .collect();
    let mut pool_free: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for (i, _, _) in &matched {
        if let Some(pool) = candidates[*i].pool {
            let total = pool_free.entry(pool).or_default();
            *total = total.saturating_add(candidates[*i].free_blocks);
        }
    }
    let free = |c: &Candidate<'_>| c.pool.map_or(c.free_blocks, |p| pool_free[p]);
    matched.sort_by(|(ia, sa, ka), (ib, sb, kb)| {
        let (a, b) = (&candidates[*ia], &candidates[*ib]);
        sb.cmp(sa)
            .then(free(a).cmp(&free(b)))
            .then_with(|| compare_masks(a, b))
            .then_with(|| ka.cmp(kb))
            .then_with(|| compare_cidrs(a, b))
            .then_with(|| a.name.cmp(b.name))
    });
    matched.into_iter().map(|(i, _, _)| i).collect()
}

/// Larger mask first, IPv4 before IPv6; a family only one side has does not decide.
fn compare_masks(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let by = |x: Option<(IpNet, u8)>, y: Option<(IpNet, u8)>| match (x, y) {
        (Some((_, mx)), Some((_, my))) => my.cmp(&mx),
        _ => Ordering::Equal,
    };
    by(a.ipv4, b.ipv4).then_with(|| by(a.ipv6, b.ipv6))
}

/// Numerically lower network first (not as strings: 10.9.0.0 < 10.10.0.0), IPv4 before IPv6;
/// a config that has the family sorts before one that does not.
fn compare_cidrs(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let by = |x: Option<(IpNet, u8)>, y: Option<(IpNet, u8)>| match (x, y) {
        (Some((nx, _)), Some((ny, _))) => numeric(nx).cmp(&numeric(ny)),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    };
    by(a.ipv4, b.ipv4).then_with(|| by(a.ipv6, b.ipv6))
}

fn numeric(net: IpNet) -> (u128, u8) {
    let addr = match net.network() {
        std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
        std::net::IpAddr::V6(a) => u128::from(a),
    };
    (addr, net.prefix_len())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    use nodeipam_crd::selector::{requirement as req, selector_of as selector};

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn score_counts_the_best_matching_term() {
        let sel = selector(vec![
            (vec![req("zone", "In", &["a"])], vec![]),
            (
                vec![req("zone", "In", &["a"]), req("gpu", "Exists", &[])],
                vec![req("metadata.name", "In", &["n"])],
            ),
        ]);
        let l = labels(&[("zone", "a"), ("gpu", "1")]);
        assert_eq!(
            match_score(
                Some(&sel),
                NodeView {
                    name: "n",
                    labels: &l
                }
            ),
            Some(MatchScore::Selector(3))
        );
        assert_eq!(
            match_score(
                Some(&sel),
                NodeView {
                    name: "m",
                    labels: &l
                }
            ),
            Some(MatchScore::Selector(1))
        );
        assert_eq!(
            match_score(
                None,
                NodeView {
                    name: "m",
                    labels: &l
                }
            ),
            Some(MatchScore::CatchAll)
        );
        assert!(MatchScore::Selector(0) > MatchScore::CatchAll);
    }

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    #[test]
    fn precedence_table() {
        let zone_a = selector(vec![(vec![req("zone", "In", &["a"])], vec![])]);
        let zone_a_gpu = selector(vec![(
            vec![req("zone", "In", &["a"]), req("gpu", "Exists", &[])],
            vec![],
        )]);
        let zone_ab = selector(vec![(vec![req("zone", "In", &["a", "b"])], vec![])]);
        let l = labels(&[("zone", "a"), ("gpu", "1")]);
        let node = NodeView {
            name: "n",
            labels: &l,
        };
        let c = |name: &'static str,
                 sel: Option<&'static NodeSelector>,
                 free: u64,
                 v4: Option<(&str, u8)>| Candidate {
            name,
            selector: sel,
            free_blocks: free,
            ipv4: v4.map(|(n, m)| (net(n), m)),
            ipv6: None,
            pool: None,
        };
        // Leak the selectors so the table can borrow them for 'static; test-only.
        let zone_a: &'static NodeSelector = Box::leak(Box::new(zone_a));
        let zone_a_gpu: &'static NodeSelector = Box::leak(Box::new(zone_a_gpu));
        let zone_ab: &'static NodeSelector = Box::leak(Box::new(zone_ab));
        let table: Vec<(&str, Vec<Candidate<'_>>, &str)> = vec![
            (
                "more requirements win",
                vec![
                    c("one", Some(zone_a), 1, Some(("10.0.0.0/16", 24))),
                    c("two", Some(zone_a_gpu), 100, Some(("10.1.0.0/16", 24))),
                ],
                "two",
            ),
            (
                "any selector beats no selector",
                vec![
                    c("all", None, 1, Some(("10.0.0.0/16", 24))),
                    c("sel", Some(zone_a), 100, Some(("10.1.0.0/16", 24))),
                ],
                "sel",
            ),
            (
                "fewer free blocks win",
                vec![
                    c("big", Some(zone_a), 200, Some(("10.0.0.0/16", 24))),
                    c("small", Some(zone_ab), 3, Some(("10.1.0.0/16", 24))),
                ],
                "small",
            ),
            (
                "larger mask wins",
                vec![
                    c("m24", Some(zone_a), 5, Some(("10.0.0.0/16", 24))),
                    c("m26", Some(zone_ab), 5, Some(("10.1.0.0/16", 26))),
                ],
                "m26",
            ),
            (
                "lexically smaller selector wins",
                vec![
                    c("ab", Some(zone_ab), 5, Some(("10.0.0.0/16", 24))),
                    c("a", Some(zone_a), 5, Some(("10.1.0.0/16", 24))),
                ],
                "a",
            ),
            (
                "numerically lower CIDR wins, not as strings",
                vec![
                    c("x", Some(zone_a), 5, Some(("10.10.0.0/16", 24))),
                    c("y", Some(zone_a), 5, Some(("10.9.0.0/16", 24))),
                ],
                "y",
            ),
            (
                "name breaks the last tie",
                vec![
                    c("b", Some(zone_a), 5, Some(("10.0.0.0/16", 24))),
                    c("a", Some(zone_a), 5, Some(("10.0.0.0/16", 24))),
                ],
                "a",
            ),
        ];
        for (what, cands, want) in table {
            let order = rank(&cands, node);
            assert_eq!(cands[order[0]].name, want, "{what}");
            assert_eq!(order.len(), cands.len(), "{what}: all match");
        }
    }

    #[test]
    fn non_matching_configs_are_left_out() {
        let zone_b = selector(vec![(vec![req("zone", "In", &["b"])], vec![])]);
        let l = labels(&[("zone", "a")]);
        let cands = vec![Candidate {
            name: "b",
            selector: Some(&zone_b),
            free_blocks: 1,
            ipv4: None,
            ipv6: None,
            pool: None,
        }];
        assert!(
            rank(
                &cands,
                NodeView {
                    name: "n",
                    labels: &l
                }
            )
            .is_empty()
        );
    }

    #[test]
    fn a_pool_fills_its_lowest_child_first_whatever_the_free_blocks() {
        let pool = selector(vec![(vec![req("zone", "In", &["a"])], vec![])]);
        let other = selector(vec![(vec![req("zone", "In", &["a", "b"])], vec![])]);
        let l = labels(&[("zone", "a")]);
        let node = NodeView {
            name: "n",
            labels: &l,
        };
        let c = |name, sel, free, cidr: &str, pool| Candidate {
            name,
            selector: Some(sel),
            free_blocks: free,
            ipv4: Some((net(cidr), 26)),
            ipv6: None,
            pool,
        };
        let cands = vec![
            // The youngest, highest child has the fewest free blocks: it still comes last.
            c("pods-10-0-2-0-24", &pool, 1, "10.0.2.0/24", Some("pods")),
            c("pods-10-0-0-0-24", &pool, 3, "10.0.0.0/24", Some("pods")),
            c("pods-10-0-1-0-24", &pool, 2, "10.0.1.0/24", Some("pods")),
            // Another config ranks against the pool as a whole (6 free blocks).
            c("hand", &other, 5, "10.1.0.0/24", None),
            c("big", &other, 7, "10.2.0.0/24", None),
        ];
        let order: Vec<&str> = rank(&cands, node)
            .into_iter()
            .map(|i| cands[i].name)
            .collect();
        assert_eq!(
            order,
            [
                "hand",
                "pods-10-0-0-0-24",
                "pods-10-0-1-0-24",
                "pods-10-0-2-0-24",
                "big"
            ]
        );
    }

    #[test]
    fn selector_key_is_order_independent() {
        let a = selector(vec![(
            vec![req("x", "In", &["2", "1"]), req("a", "Exists", &[])],
            vec![],
        )]);
        let b = selector(vec![(
            vec![req("a", "Exists", &[]), req("x", "In", &["1", "2"])],
            vec![],
        )]);
        assert_eq!(selector_key(Some(&a)), selector_key(Some(&b)));
        assert_ne!(selector_key(Some(&a)), selector_key(None));
    }
}
