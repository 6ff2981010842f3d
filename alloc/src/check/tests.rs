use super::*;
use crate::fixtures::{config, node, selecting};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

fn n(s: &str) -> IpNet {
    s.parse().expect("test CIDR")
}

/// A consistent cluster: two configs, three nodes, one waiting, a Service range, and the
/// pod network published as the controller would.
struct World {
    configs: Vec<NodeIPAMConfig>,
    nodes: Vec<IpamNode>,
    services: Vec<(String, Vec<IpNet>)>,
    outputs: Vec<Output>,
}

impl World {
    fn new() -> World {
        let configs = vec![
            config(
                "general",
                "u-g",
                1,
                (Some(("10.100.0.0/16", 24)), None),
                None,
                true,
            ),
            config(
                "gpu",
                "u-p",
                2,
                (Some(("10.200.0.0/24", 24)), None),
                Some(selecting("pool", "gpu")),
                true,
            ),
        ];
        let nodes = vec![
            node("a", "u-a", &[], &["10.100.0.0/24"]),
            node("b", "u-b", &[], &["10.100.1.0/24"]),
            node("g1", "u-g1", &[("pool", "gpu")], &["10.200.0.0/24"]),
            node("g2", "u-g2", &[("pool", "gpu")], &[]),
        ];
        let mut w = World {
            configs,
            nodes,
            services: vec![("kubernetes".into(), vec![n("10.96.0.0/16")])],
            outputs: Vec::new(),
        };
        w.settle();
        w
    }

    fn cluster(&self) -> Cluster<'_> {
        Cluster {
            configs: &self.configs,
            nodes: &self.nodes,
            services: &self.services,
            outputs: &self.outputs,
            extra_non_masquerade: &[],
        }
    }

    /// Writes every status and the published ConfigMap as the controller would.
    fn settle(&mut self) {
        let r = recount(&self.cluster());
        for c in &mut self.configs {
            let facts = r.ipam.config_facts(&c.name_any()).expect("facts");
            let (status, _) = desired_status(
                &facts,
                c.metadata.generation,
                &[],
                &Time(Default::default()),
            );
            c.status = Some(status);
        }
        let target = "nodeipam-system/nodeipam-pod-network".parse().expect("ref");
        let data = r.ipam.network().configmap_data("t");
        self.outputs = vec![Output::configmap(
            &target,
            OutputKind::PodNetwork,
            Some(data),
        )];
    }

    fn check(&self) -> Vec<Finding> {
        check(&self.cluster())
    }

    /// The findings as `kubectl nodeipam check` prints them.
    fn lines(&self) -> Vec<String> {
        self.check().iter().map(ToString::to_string).collect()
    }

    fn status_mut(&mut self, config: &str) -> &mut NodeIPAMConfigStatus {
        self.configs
            .iter_mut()
            .find(|c| c.name_any() == config)
            .and_then(|c| c.status.as_mut())
            .expect("config with status")
    }
}

#[test]
fn a_cluster_the_controller_kept_is_clean() {
    let w = World::new();
    assert_eq!(w.check(), Vec::<Finding>::new());
}

#[test]
fn overlapping_nodes_are_one_finding_per_pair() {
    let mut w = World::new();
    w.nodes.push(node("x", "u-x", &[], &["10.100.0.0/23"]));
    let found = w.check();
    let overlaps: Vec<&Finding> = found
        .iter()
        .filter(|f| matches!(f, Finding::Overlap { .. }))
        .collect();
    assert_eq!(overlaps.len(), 2, "{found:#?}");
    assert_eq!(
        overlaps[0].to_string(),
        "overlap: node x podCIDR 10.100.0.0/23 overlaps 10.100.0.0/24 of node a"
    );
    // The overlapping node is also counted by the config: its status trails the recount.
    assert!(
        found
            .iter()
            .any(|f| matches!(f, Finding::Count { field, .. } if field == "nodes")),
        "{found:#?}"
    );
}

#[test]
fn service_ranges_and_unmanaged_podcidrs_are_reported() {
    let mut w = World::new();
    w.nodes.push(node("s", "u-s", &[], &["10.96.3.0/24"]));
    let found = w.check();
    assert!(
        found.contains(&Finding::ServiceRange {
            node: "s".into(),
            cidr: n("10.96.3.0/24"),
            service_cidr: "kubernetes".into(),
            range: n("10.96.0.0/16"),
        }),
        "{found:#?}"
    );
    assert!(found.contains(&Finding::OutsideConfigs {
        node: "s".into(),
        cidr: n("10.96.3.0/24"),
    }));
    // Unmanaged podCIDRs are part of the pod network: the ConfigMap lacks it.
    assert!(found.contains(&Finding::Unpublished {
        output: "ConfigMap nodeipam-system/nodeipam-pod-network".into(),
        cidr: n("10.96.3.0/24"),
        state: RangeState::Unmanaged,
    }));
    // Published, it is still outside every config and inside the Service range.
    w.settle();
    assert_eq!(w.check().len(), 2, "{:#?}", w.check());
}

#[test]
fn a_count_above_the_nodes_is_a_leak_below_is_a_count() {
    let mut w = World::new();
    w.status_mut("general").ipv4 = Some(FamilyStatus {
        capacity: 256,
        allocated: 5,
    });
    assert_eq!(
        w.check(),
        vec![Finding::Leaked {
            config: "general".into(),
            family: "ipv4",
            counted: 5,
            held: 2
        }]
    );
    w.status_mut("general").ipv4 = Some(FamilyStatus {
        capacity: 255,
        allocated: 1,
    });
    w.status_mut("general").nodes = None;
    let found: Vec<String> = w.check().iter().map(ToString::to_string).collect();
    assert_eq!(
        found,
        vec![
            "count: NodeIPAMConfig general status.ipv4.allocated is 1 but a recount from the Nodes gives 2",
            "count: NodeIPAMConfig general status.ipv4.capacity is 255 but a recount from the Nodes gives 256",
            "count: NodeIPAMConfig general status.nodes is unset but a recount from the Nodes gives 2",
        ]
    );
}

#[test]
fn drained_that_the_nodes_contradict() {
    let mut w = World::new();
    let conditions = &mut w.status_mut("general").conditions;
    let drained = conditions
        .iter_mut()
        .find(|c| c.type_ == CONDITION_DRAINED)
        .expect("Drained");
    drained.status = "True".into();
    let found = w.check();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(
        found[0].to_string(),
        "drained: NodeIPAMConfig general says Drained=True but the config still accepts allocations"
    );
    // Disabled with nodes: the recount says which nodes hold blocks.
    w.configs[0].spec.allocation = nodeipam_crd::Allocation::Disabled;
    let found = w.check();
    assert!(
        found.iter().any(|f| f.to_string()
            == "drained: NodeIPAMConfig general says Drained=True but 2 node(s) still hold blocks: a, b"),
        "{found:#?}"
    );
    // Drained=False when nothing holds a block of a stopped config.
    let mut w = World::new();
    w.configs[1].spec.allocation = nodeipam_crd::Allocation::Disabled;
    w.nodes.retain(|x| x.name_any() != "g1");
    w.settle();
    assert_eq!(w.check(), Vec::<Finding>::new());
    let c: &mut Condition = w
        .status_mut("gpu")
        .conditions
        .iter_mut()
        .find(|c| c.type_ == CONDITION_DRAINED)
        .expect("Drained");
    c.status = "False".into();
    assert_eq!(
        w.check(),
        vec![Finding::Drained {
            config: "gpu".into(),
            status: "False".into(),
            why: "no node holds a block from this config".into()
        }]
    );
}

#[test]
fn outputs_that_miss_a_range_or_are_absent() {
    let mut w = World::new();
    let Some(Held::Data(data)) = w.outputs[0].held.as_mut() else {
        panic!("a ConfigMap's data")
    };
    data.insert("ipv4".into(), "10.200.0.0/24".into());
    let found = w.check();
    assert_eq!(
        found,
        vec![Finding::Unpublished {
            output: "ConfigMap nodeipam-system/nodeipam-pod-network".into(),
            cidr: n("10.100.0.0/16"),
            state: RangeState::Active
        }]
    );
    let network = recount(&w.cluster()).ipam.network();
    assert!(!outputs(&w.cluster(), &network)[0].current);
    w.outputs[0].held = None;
    assert_eq!(
        w.lines(),
        vec![
            "unpublished: ConfigMap nodeipam-system/nodeipam-pod-network does not exist: consumers know no pod network"
        ]
    );
}

#[test]
fn no_status_stale_status_and_bad_podcidrs() {
    let mut w = World::new();
    w.configs[1].status = None;
    w.configs[0].metadata.generation = Some(2);
    w.nodes.push(node("bad", "u-bad", &[], &["10.1.2.3/99"]));
    let found: Vec<String> = w.check().iter().map(ToString::to_string).collect();
    assert_eq!(found.len(), 3, "{found:#?}");
    assert!(found[0].starts_with("bad-pod-cidr: node bad: spec.podCIDRs"));
    assert_eq!(
        found[1],
        "stale-status: NodeIPAMConfig general status describes generation 1 of 2"
    );
    assert_eq!(
        found[2],
        "no-status: NodeIPAMConfig gpu has no status: the controller has not counted it"
    );
}

#[test]
fn json_names_the_kind_and_the_fields() {
    let f = Finding::Leaked {
        config: "a".into(),
        family: "ipv4",
        counted: 3,
        held: 1,
    };
    let v = serde_json::to_value(&f).expect("serializes");
    assert_eq!(
        v,
        serde_json::json!({"kind": "leaked", "config": "a", "family": "ipv4", "counted": 3, "held": 1})
    );
    let f = Finding::ServiceRange {
        node: "s".into(),
        cidr: n("10.96.0.0/24"),
        service_cidr: "kubernetes".into(),
        range: n("10.96.0.0/16"),
    };
    let v = serde_json::to_value(&f).expect("serializes");
    assert_eq!(v["kind"], "service-range");
    assert_eq!(v["serviceCidr"], "kubernetes");
}

#[test]
fn pending_nodes_say_why() {
    let mut w = World::new();
    w.nodes.push(node("new", "u-new", &[], &[]));
    w.nodes.push(node(
        "orphan",
        "u-o",
        &[("pool", "none")],
        &["10.100.9.0/24"],
    ));
    let c = w.cluster();
    let r = recount(&c);
    let p = pending(&c, &r);
    assert_eq!(
        p,
        vec![
            Pending {
                node: "g2".into(),
                selected_by: vec!["general".into(), "gpu".into()],
                // The gpu range is full; the catch-all is ranked after the selector match,
                // and has room.
                reason: "not written yet: the controller would give it 10.100.2.0/24 from general"
                    .into(),
            },
            Pending {
                node: "new".into(),
                selected_by: vec!["general".into()],
                reason: "not written yet: the controller would give it 10.100.3.0/24 from general"
                    .into(),
            },
        ]
    );
    // Nothing left: the reason is the controller's own.
    let mut w = World::new();
    w.configs.remove(0);
    w.nodes.retain(|x| x.name_any().starts_with('g'));
    let c = w.cluster();
    let p = pending(&c, &recount(&c));
    assert_eq!(p.len(), 1);
    assert!(
        p[0].reason
            .starts_with("no matching NodeIPAMConfig has a free block"),
        "{p:?}"
    );
}

/// The typed outputs are checked by what their objects hold, as the controller reads them.
#[test]
fn typed_outputs_are_read_as_the_controller_reads_them() {
    use crate::outputs::CalicoPools;
    let mut w = World::new();
    let network = recount(&w.cluster()).ipam.network();
    let pools = OutputRef::typed(
        OutputKind::CalicoIPPools(CalicoPools::default()),
        "projectcalico.org/v3",
        None,
    );
    let objects = |net: &PodNetwork| -> BTreeMap<String, DynamicObject> {
        pools
            .objects(net)
            .into_iter()
            .map(|(name, o)| (name, serde_json::from_value(o).expect("object")))
            .collect()
    };
    let mut held = objects(&network);
    w.outputs.push(Output {
        target: pools.clone(),
        held: Some(Held::Objects(held.clone())),
    });
    assert_eq!(w.check(), Vec::<Finding>::new());
    assert!(outputs(&w.cluster(), &network)[1].current);
    // A pool deleted by hand: its range is unpublished.
    held.remove("nodeipam-10-200-0-0-24");
    w.outputs[1].held = Some(Held::Objects(held));
    assert_eq!(
        w.lines(),
        vec![
            "unpublished: the IPPools labelled app.kubernetes.io/managed-by=nodeipam lacks 10.200.0.0/24 (Active range of the pod network)"
        ]
    );
    // A CIDR group whose kind is not served holds nothing.
    w.outputs[1] = Output {
        target: OutputRef::typed(OutputKind::CiliumCIDRGroup, "cilium.io/v2", Some("pods")),
        held: None,
    };
    assert_eq!(
        w.lines(),
        vec!["unpublished: CiliumCIDRGroup pods does not exist: consumers know no pod network"]
    );
}

#[test]
fn damage_is_on_the_nodes_lag_is_on_what_the_controller_writes() {
    let mut w = World::new();
    w.nodes.push(node("x", "u-x", &[], &["10.100.0.0/24"]));
    w.nodes.push(node("s", "u-s", &[], &["10.96.3.0/24"]));
    w.status_mut("gpu").nodes = Some(7);
    let (damage, lag) = split(w.check());
    let kinds = |l: &[Finding]| -> Vec<String> {
        l.iter()
            .map(|f| {
                f.to_string()
                    .split(':')
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        kinds(&damage),
        ["overlap", "service-range", "outside-configs"],
        "{damage:#?}"
    );
    assert!(damage.iter().all(|f| f.cause() == Cause::Damage));
    // The new nodes are not counted yet, nor s's podCIDR published: all of it may be lag.
    assert_eq!(kinds(&lag), ["count", "count", "unpublished"], "{lag:#?}");
    assert!(lag.iter().all(|f| f.cause() == Cause::Lag));
}

/// The demo's case: a node deleted just before the first look; by the second the controller
/// has rewritten the counts.
#[test]
fn counts_the_controller_rewrote_between_the_looks_are_not_confirmed() {
    let mut w = World::new();
    w.nodes.retain(|n| n.name_any() != "b");
    let (damage, first) = split(w.check());
    assert!(damage.is_empty(), "{damage:#?}");
    assert_eq!(
        first.iter().map(ToString::to_string).collect::<Vec<_>>(),
        [
            "leaked: NodeIPAMConfig general status.ipv4.allocated counts 2 block(s) but nodes hold 1",
            "count: NodeIPAMConfig general status.nodes is 2 but a recount from the Nodes gives 1",
        ]
    );
    w.settle();
    assert_eq!(confirmed(&first, &w.check()), Vec::<Finding>::new());
}

/// Nothing rewrote the count: it is reported. Rewritten to another wrong value against the
/// same recount, it is still reported, as the second look found it.
#[test]
fn a_count_still_wrong_against_the_same_recount_is_confirmed() {
    let mut w = World::new();
    w.status_mut("general").ipv4 = Some(FamilyStatus {
        capacity: 256,
        allocated: 5,
    });
    w.status_mut("general").nodes = Some(9);
    let first = w.check();
    assert_eq!(confirmed(&first, &w.check()), first);
    w.status_mut("general").ipv4 = Some(FamilyStatus {
        capacity: 256,
        allocated: 6,
    });
    let second = w.check();
    let kept = confirmed(&first, &second);
    assert_eq!(kept, second, "{kept:#?}");
    assert!(
        kept.contains(&Finding::Leaked {
            config: "general".into(),
            family: "ipv4",
            counted: 6,
            held: 2
        }),
        "{kept:#?}"
    );
}

/// The nodes moved between the looks: the second finding may be lag again, and one that only
/// the second look found has had no time to settle.
#[test]
fn a_recount_that_moved_or_a_finding_new_in_the_second_look_is_not_confirmed() {
    let mut w = World::new();
    w.status_mut("general").nodes = Some(5);
    let first = w.check();
    w.nodes.retain(|n| n.name_any() != "b");
    let second = w.check();
    assert!(
        second
            .iter()
            .any(|f| matches!(f, Finding::Count { field, .. } if field == "nodes")),
        "{second:#?}"
    );
    assert_eq!(confirmed(&first, &second), Vec::<Finding>::new());
    // Damage is never confirmed: it is reported from the first look.
    w.nodes.push(node("x", "u-x", &[], &["10.100.0.0/24"]));
    let damaged = w.check();
    assert!(
        confirmed(&damaged, &damaged)
            .iter()
            .all(|f| f.cause() == Cause::Lag)
    );
}

#[test]
fn unsettled_conditions_statuses_and_outputs_are_confirmed_only_unchanged() {
    let mut w = World::new();
    w.configs[0].metadata.generation = Some(2);
    w.outputs.clear();
    w.outputs.push(Output::configmap(
        &"nodeipam-system/nodeipam-pod-network".parse().expect("ref"),
        OutputKind::PodNetwork,
        None,
    ));
    let first = w.check();
    assert_eq!(
        first.iter().map(Finding::cause).collect::<Vec<_>>(),
        [Cause::Lag, Cause::Lag],
        "{first:#?}"
    );
    assert_eq!(confirmed(&first, &first), first);
    // The spec moved on again: a status of generation 2 may be on its way.
    w.configs[0].metadata.generation = Some(3);
    let second = w.check();
    assert_eq!(
        confirmed(&first, &second)
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        [
            "unpublished: ConfigMap nodeipam-system/nodeipam-pod-network does not exist: consumers know no pod network"
        ]
    );
}
