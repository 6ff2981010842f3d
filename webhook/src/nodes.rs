//! Counting, at review time, the nodes a NodeIPAMConfig can serve: the fact behind the "this
//! range alone would run out" warning, and nothing else. No cache: a paged metadata list per
//! review that needs it, narrowed on the server by what a label or field selector can say,
//! confirmed here with the shared matcher (`nodeipam_crd::selector`), stopped once the count is
//! enough for the warning and bounded by a deadline. A count that cannot finish is no count: the
//! warning is skipped, the admission is not held up.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use kube::api::{Api, ListParams};
use kube::core::ObjectMeta;
use nodeipam_crd::selector::{NodeView, requirement_count, selector_matches};
use tracing::debug;

/// How long one count may take; the webhook's own timeout (10 s by default) is larger.
pub(crate) const DEADLINE: Duration = Duration::from_secs(2);
/// Nodes per list page: one page answers a cluster of up to this many nodes exactly.
const PAGE: u32 = 500;

/// The only node field a nodeSelector can name (core/v1).
const NAME_FIELD: &str = "metadata.name";

/// One read of candidate nodes for a term. Candidates are a superset of the term's matches:
/// every one is confirmed with the shared matcher before it counts.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Query {
    /// List nodes, narrowed on the server by these selectors (`None`: not narrowed).
    List {
        labels: Option<String>,
        fields: Option<String>,
    },
    /// Get these nodes by name (a `metadata.name` `In` field).
    Names(BTreeSet<String>),
}

impl Query {
    const ALL: Query = Query::List {
        labels: None,
        fields: None,
    };
}

/// The reads that find every node `selector` can match (`None`: every node). Terms are ORed,
/// so each gets its own read; a term that can match nothing gets none, and when one read is
/// the whole unfiltered list it is the only one.
pub(crate) fn queries(selector: Option<&NodeSelector>) -> Vec<Query> {
    let Some(selector) = selector else {
        return vec![Query::ALL];
    };
    let queries: BTreeSet<Query> = selector
        .node_selector_terms
        .iter()
        .filter_map(term_query)
        .collect();
    if queries.contains(&Query::ALL) {
        return vec![Query::ALL];
    }
    queries.into_iter().collect()
}

/// The read for `term`, or `None` when it can match no node.
fn term_query(term: &NodeSelectorTerm) -> Option<Query> {
    if requirement_count(term) == 0 {
        return None;
    }
    let mut labels = Vec::new();
    for req in term.match_expressions.iter().flatten() {
        // Not expressible (Gt, Lt, odd characters): left to the matcher.
        if let Some(expr) = label_requirement(req) {
            labels.push(expr);
        }
    }
    let mut names: Option<BTreeSet<String>> = None;
    let mut fields = Vec::new();
    for req in term.match_fields.iter().flatten() {
        if req.key != NAME_FIELD {
            // core/v1 knows no other node field: the term matches nothing.
            return None;
        }
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" => {
                let these: BTreeSet<String> = values.iter().cloned().collect();
                names = Some(match names {
                    Some(before) => before.intersection(&these).cloned().collect(),
                    None => these,
                });
            }
            "NotIn" => {
                for v in values.iter().filter(|v| field_safe(v)) {
                    fields.push(format!("{NAME_FIELD}!={v}"));
                }
            }
            // Every node has a name; a name is never absent.
            "Exists" => {}
            "DoesNotExist" => return None,
            // Gt, Lt and anything else: left to the matcher.
            _ => {}
        }
    }
    if let Some(names) = names {
        // The labels and other fields are checked on what the gets return.
        return (!names.is_empty()).then_some(Query::Names(names));
    }
    let join = |v: Vec<String>| (!v.is_empty()).then(|| v.join(","));
    Some(Query::List {
        labels: join(labels),
        fields: join(fields),
    })
}

/// `req` as a label selector requirement, when the syntax can say it exactly.
fn label_requirement(req: &NodeSelectorRequirement) -> Option<String> {
    let key = &req.key;
    if key.is_empty() || !key.chars().all(label_char) {
        return None;
    }
    let values = req.values.as_deref().unwrap_or_default();
    let set = || {
        (!values.is_empty()
            && values
                .iter()
                .all(|v| !v.is_empty() && v.chars().all(label_char)))
        .then(|| values.join(","))
    };
    match req.operator.as_str() {
        "In" => Some(format!("{key} in ({})", set()?)),
        "NotIn" => Some(format!("{key} notin ({})", set()?)),
        "Exists" => Some(key.clone()),
        "DoesNotExist" => Some(format!("!{key}")),
        _ => None,
    }
}

/// A character of a label key or value (qualified names: alphanumerics, `-`, `_`, `.`, and
/// `/` between a key's prefix and name).
fn label_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// A value that can follow `metadata.name!=` in a field selector as written.
fn field_safe(v: &str) -> bool {
    !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
}

/// Counts distinct nodes `selector` matches, up to `enough`.
#[derive(Debug)]
struct Tally<'a> {
    selector: Option<&'a NodeSelector>,
    enough: usize,
    /// Names seen, when several reads may return the same node.
    seen: Option<HashSet<String>>,
    count: usize,
}

impl<'a> Tally<'a> {
    fn new(selector: Option<&'a NodeSelector>, enough: usize, reads: usize) -> Self {
        Tally {
            selector,
            enough,
            seen: (reads > 1).then(HashSet::new),
            count: 0,
        }
    }

    fn done(&self) -> bool {
        self.count >= self.enough
    }

    /// Counts `node` if the selector matches it and it was not counted yet.
    fn add(&mut self, node: &ObjectMeta) {
        let no_labels = BTreeMap::new();
        let name = node.name.as_deref().unwrap_or_default();
        let view = NodeView {
            name,
            labels: node.labels.as_ref().unwrap_or(&no_labels),
        };
        if self.selector.is_none_or(|s| selector_matches(s, view))
            && self
                .seen
                .as_mut()
                .is_none_or(|s| s.insert(name.to_string()))
        {
            self.count += 1;
        }
    }
}

/// Counts the nodes a config can serve, for its warnings.
#[derive(Clone)]
pub(crate) struct NodeCounter {
    api: Api<Node>,
    deadline: Duration,
}

impl NodeCounter {
    pub fn new(client: kube::Client) -> NodeCounter {
        NodeCounter {
            api: Api::all(client),
            deadline: DEADLINE,
        }
    }

    /// How many nodes `selector` matches (every node without one), read until there are
    /// `enough` (no further page is asked for then): the exact count when it is smaller, a
    /// count of at least `enough` otherwise. `None` when
    /// the count cannot finish within the deadline or the API server refuses it.
    pub async fn count(&self, selector: Option<&NodeSelector>, enough: usize) -> Option<usize> {
        match tokio::time::timeout(self.deadline, self.read(selector, enough)).await {
            Ok(Ok(n)) => Some(n),
            Ok(Err(e)) => {
                debug!(error = %e, "cannot count the selected nodes; no exhaustion warning");
                None
            }
            Err(_) => {
                debug!(
                    deadline = ?self.deadline,
                    "counting the selected nodes took too long; no exhaustion warning"
                );
                None
            }
        }
    }

    async fn read(
        &self,
        selector: Option<&NodeSelector>,
        enough: usize,
    ) -> Result<usize, kube::Error> {
        let queries = queries(selector);
        let mut tally = Tally::new(selector, enough, queries.len());
        if tally.done() {
            return Ok(tally.count);
        }
        for query in queries {
            match query {
                Query::Names(names) => {
                    for name in names {
                        if let Some(node) = self.api.get_metadata_opt(&name).await? {
                            tally.add(&node.metadata);
                        }
                        if tally.done() {
                            return Ok(tally.count);
                        }
                    }
                }
                Query::List { labels, fields } => {
                    let mut params = ListParams::default().limit(PAGE);
                    if let Some(l) = &labels {
                        params = params.labels(l);
                    }
                    if let Some(f) = &fields {
                        params = params.fields(f);
                    }
                    loop {
                        let page = self.api.list_metadata(&params).await?;
                        // The page is read already: all of it counts, for a truer message.
                        for node in &page.items {
                            tally.add(&node.metadata);
                        }
                        if tally.done() {
                            return Ok(tally.count);
                        }
                        match page.metadata.continue_ {
                            Some(token) if !token.is_empty() => {
                                params = params.continue_token(&token);
                            }
                            _ => break,
                        }
                    }
                }
            }
        }
        Ok(tally.count)
    }
}

#[cfg(test)]
mod tests;
