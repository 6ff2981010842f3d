//! What one event costs the allocation machine at 5,000 pending nodes and 200 configs that
//! select other pools (so every pending node stays pending): an event must cost work in
//! proportion to what it changes, not pending × configs.
//!
//! - `own_status_echo`: the watch shows back a status the controller wrote;
//! - `published_echo`: the watch shows back the pod network the controller published, and
//!   the publisher reports it written;
//! - `node_deleted`: a node holding a block is deleted (capacity appears in one config);
//! - `tick`: the periodic status/publication step with nothing to do.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use nodeipam_controller::alloc::fixtures::{config, configmap, node, selecting};
use nodeipam_controller::alloc::machine::{Effect, Input, Machine, Now, Options, Watch};
use nodeipam_controller::alloc::podnetwork::{ConfigMapRef, OutputKind, OutputRef};

const CONFIGS: u32 = 200;
const PENDING: u32 = 5_000;

fn at(seconds: u64) -> Now {
    Now {
        mono: Duration::from_secs(seconds),
        wall_seconds: 1_800_000_000 + i64::try_from(seconds).unwrap_or(0),
    }
}

/// A synced machine with every config published, one node holding a block from the first
/// config, and 5,000 nodes no config selects; returns it with the inputs that echo its own
/// last status and publication.
fn busy_machine() -> (Machine, Input, Vec<Input>) {
    let target = ConfigMapRef {
        namespace: "kube-system".into(),
        name: "nodeipam-pod-network".into(),
    };
    let mut m = Machine::new(Options {
        write_attempts: 8,
        outputs: vec![OutputRef::configmap(&target, OutputKind::PodNetwork)],
        ..Options::default()
    });
    let configs: Vec<_> = (0..CONFIGS)
        .map(|i| {
            let range = format!("10.{}.{}.0/24", i / 256, i % 256);
            let selector = Some(selecting("pool", &format!("p{i}")));
            let (name, uid) = (format!("pool-{i}"), format!("c{i}"));
            config(
                &name,
                &uid,
                i64::from(i),
                (Some((&range, 26)), None),
                selector,
                true,
            )
        })
        .collect();
    for c in &configs {
        m.handle(at(0), Input::Config(Watch::Listed(c.clone())));
    }
    m.handle(at(0), Input::Config(Watch::ListDone));
    m.handle(at(0), Input::Output(0, Watch::ListDone));
    m.handle(
        at(0),
        Input::Node(Watch::Listed(node(
            "held",
            "u-held",
            &[("pool", "p0")],
            &["10.0.0.0/26"],
        ))),
    );
    for n in 0..PENDING {
        let name = format!("node-{n}");
        let pending = node(&name, &format!("u{n}"), &[("pool", "elsewhere")], &[]);
        m.handle(at(0), Input::Node(Watch::Listed(pending)));
    }
    m.handle(at(0), Input::Node(Watch::ListDone));
    // Publish, let the watch and the publisher report it, write every status.
    let mut echoes = Vec::new();
    for e in m.handle(at(1), Input::Tick) {
        match e {
            Effect::Publish(network) => {
                let data = network.configmap_data("now");
                let cm = configmap("kube-system", "nodeipam-pod-network", data);
                echoes.push(Input::Output(0, Watch::Applied(cm)));
                echoes.push(Input::Published(network));
            }
            Effect::Config(job) => echoes.push(Input::ConfigWritten(job)),
            _ => {}
        }
    }
    for e in echoes.clone() {
        m.handle(at(1), e);
    }
    let mut status_echo = configs[0].clone();
    for e in m.handle(at(2), Input::Tick) {
        if let Effect::Config(nodeipam_controller::alloc::effects::ConfigJob::Status {
            status,
            ..
        }) = e
        {
            status_echo.status = Some(status);
        }
    }
    assert_eq!(m.pending(), PENDING as usize, "every node waits");
    let published = echoes
        .into_iter()
        .filter(|i| matches!(i, Input::Output(..) | Input::Published(_)))
        .collect();
    (m, Input::Config(Watch::Applied(status_echo)), published)
}

fn one_event(c: &mut Criterion) {
    let (machine, status_echo, published) = busy_machine();
    let mut group = c.benchmark_group("one_event_5000_pending_200_configs");
    group.sample_size(20);
    let run = |b: &mut criterion::Bencher, inputs: Vec<Input>| {
        b.iter_batched(
            || (machine.clone(), inputs.clone()),
            |(mut m, inputs)| {
                for i in inputs {
                    black_box(m.handle(at(3), i));
                }
                // Returned, so that dropping 5,000 nodes is not timed with the event.
                m
            },
            BatchSize::LargeInput,
        );
    };
    group.bench_function("own_status_echo", |b| run(b, vec![status_echo.clone()]));
    group.bench_function("published_echo", |b| run(b, published.clone()));
    let deleted = node("held", "u-held", &[("pool", "p0")], &["10.0.0.0/26"]);
    group.bench_function("node_deleted", |b| {
        run(b, vec![Input::Node(Watch::Deleted(deleted.clone()))]);
    });
    group.bench_function("tick", |b| run(b, vec![Input::Tick]));
    group.finish();
}

criterion_group!(benches, one_event);
criterion_main!(benches);
