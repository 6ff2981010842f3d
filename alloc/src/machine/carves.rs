//! The carves in flight: the child configs a pool asked for and not yet seen in the config
//! watch (their creates sent, answered, failed and asked again), and the carved children not
//! yet accepting allocations (how long scaling up takes).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use ipnet::IpNet;
use tracing::{info, warn};

use super::Metric;
use super::configs::ConfigSeen;
use super::core::Core;
use crate::effects::{self, ChildConfig, CreateOutcome, Note};
use crate::ipam::nets_overlap;
use crate::pool::{Carve, PoolInput};

/// How long a created child may take to show in the config watch before its create is sent
/// again (the same range under the same name: AlreadyExists if it is there after all).
const CARVE_RECHECK: Duration = Duration::from_secs(30);

/// A carve asked for and not yet seen in the config watch.
#[derive(Clone, Debug)]
struct CarveInFlight {
    pool: String,
    pool_uid: Option<String>,
    carve: Carve,
    /// The step at which the create was answered (created, or already there): a config list
    /// started after it that lacks the child means the child is gone again.
    answered: Option<u64>,
    /// The time of that answer.
    answered_at: Duration,
    /// The create failed, perhaps after landing: it is asked again, the same range under the
    /// same name, so a landed one is found (AlreadyExists) rather than a second one made.
    failed: bool,
    /// Creates sent and not yet answered: until none is, one may still land (again, after a
    /// user deleted the child), so the carve still counts.
    sent: u32,
    /// The child has shown in the config watch.
    seen: bool,
    /// Creates that failed in a row, and when the next may go.
    failures: u32,
    retry_at: Duration,
}

#[derive(Clone, Debug, Default)]
pub(super) struct Carves {
    /// Carves in flight, by child name.
    carves: BTreeMap<String, CarveInFlight>,
    /// Carved children not yet accepting: their pool, and when the carve was decided.
    scale_started: HashMap<String, (String, Duration)>,
}

impl Carves {
    /// Carves asked for and not yet seen as configs.
    pub(super) fn len(&self) -> usize {
        self.carves.len()
    }

    /// A carve is decided and its create sent.
    pub(super) fn started(
        &mut self,
        pool: &str,
        pool_uid: Option<String>,
        carve: &Carve,
        now: Duration,
    ) {
        self.carves.insert(
            carve.name.clone(),
            CarveInFlight {
                pool: pool.to_string(),
                pool_uid,
                carve: carve.clone(),
                answered: None,
                answered_at: Duration::ZERO,
                failed: false,
                sent: 1,
                seen: false,
                failures: 0,
                retry_at: Duration::ZERO,
            },
        );
        self.scale_started
            .insert(carve.name.clone(), (pool.to_string(), now));
    }

    /// The carves of `pool` that count as a range beside its children: those whose child is
    /// not among `children`, and those whose child is `leaving` (being deleted) while a create
    /// of it is still on its way: it may land after the delete and bring the child back.
    pub(super) fn in_flight(
        &self,
        pool: &str,
        children: &[String],
        leaving: &[String],
    ) -> Vec<Carve> {
        self.carves
            .iter()
            .filter(|(n, c)| {
                c.pool == pool && (!children.contains(n) || (c.sent > 0 && leaving.contains(n)))
            })
            .map(|(_, c)| c.carve.clone())
            .collect()
    }

    /// The config watch shows the config `name`: the carve that made it is done (only if it
    /// is that carve's child: an object of another owner under the name, such as an old
    /// pool's child on its way out, is not).
    pub(super) fn config_seen(&mut self, name: &str, seen: &ConfigSeen) {
        if let Some(c) = self.carves.get_mut(name).filter(|c| {
            seen.input().pool.as_ref() == Some(&c.pool)
                && (c.pool_uid.is_none() || seen.owner_uid() == c.pool_uid.as_ref())
        }) {
            c.seen = true;
            if c.sent == 0 {
                self.carves.remove(name);
            }
        }
    }

    /// A config list that started at step `started` is done: a child created before it and
    /// not in it is gone again (its create and delete both fell between two lists).
    pub(super) fn configs_relisted(&mut self, started: u64, seen: &HashSet<String>) {
        self.carves.retain(|name, c| {
            c.sent > 0 || c.answered.is_none_or(|at| at >= started) || seen.contains(name)
        });
    }

    /// The carves of `pool` are moot (another object under its name).
    pub(super) fn forget_pool(&mut self, pool: &str) {
        self.carves.retain(|_, c| c.pool != pool);
    }

    /// `pool` is gone: its carves and its scale-ups with it.
    pub(super) fn pool_gone(&mut self, pool: &str) {
        self.carves.retain(|_, c| c.pool != pool);
        self.scale_started.retain(|_, (p, _)| p != pool);
    }

    pub(super) fn config_gone(&mut self, name: &str) {
        self.scale_started.remove(name);
    }

    /// A carved child accepts allocations for the first time: how long scaling up took.
    pub(super) fn scaled_up(&mut self, name: &str, core: &mut Core) {
        if let Some((pool, since)) = self.scale_started.remove(name) {
            let seconds = core.mono().saturating_sub(since).as_secs_f64();
            info!(pool = %pool, config = %name, seconds, "carved range accepts allocations");
            core.metric(Metric::ScaleUpSeconds { pool, seconds });
        }
    }

    pub(super) fn on_config_created(
        &mut self,
        config: &ChildConfig,
        outcome: CreateOutcome,
        core: &mut Core,
    ) {
        match outcome {
            CreateOutcome::Created | CreateOutcome::AlreadyExists => {
                if outcome == CreateOutcome::AlreadyExists {
                    info!(pool = %config.pool, config = %config.name, "child config already exists (a retry, or another leader's)");
                }
                let (step, now) = (core.step(), core.mono());
                // Only the carve the create was for: a late answer to an old pool's create
                // of the same name says nothing about this one.
                if let Some(c) = self
                    .carves
                    .get_mut(&config.name)
                    .filter(|c| c.pool_uid == config.pool_uid)
                {
                    c.answered = Some(step);
                    c.answered_at = now;
                    c.failed = false;
                    c.failures = 0;
                    c.sent = c.sent.saturating_sub(1);
                }
            }
            CreateOutcome::Failed(why) => {
                warn!(pool = %config.pool, config = %config.name, reason = %why, "creating a child config failed; asking again");
                core.metric(Metric::Error("config_create"));
                let now = core.mono();
                let mut tell = None;
                if let Some(c) = self
                    .carves
                    .get_mut(&config.name)
                    .filter(|c| c.pool_uid == config.pool_uid)
                {
                    c.failed = !c.seen;
                    c.sent = c.sent.saturating_sub(1);
                    c.failures += 1;
                    // 0.5 s, 1 s, 2 s ... at most a minute between attempts. Not jittered
                    // like the writers' retries (controller node_writer::backoff): the core is
                    // deterministic, the simulator replays a seed by it, and only the leader
                    // creates a pool's children, so there is no crowd of retries to spread.
                    let backoff = Duration::from_millis(250u64 << c.failures.min(8));
                    c.retry_at = now + backoff.min(Duration::from_secs(60));
                    if c.failures == 3 {
                        tell = Some(format!(
                            "creating NodeIPAMConfig {} keeps failing: {why}; retrying",
                            config.name
                        ));
                    }
                }
                if let Some(message) = tell {
                    let uid = config.pool_uid.as_deref();
                    let note = Note::pool(
                        &config.pool,
                        uid,
                        true,
                        effects::RANGE_CARVE_FAILED,
                        message,
                    );
                    core.note(note);
                }
            }
        }
        if self
            .carves
            .get(&config.name)
            .is_some_and(|c| c.seen && c.sent == 0)
        {
            self.carves.remove(&config.name);
        }
    }

    /// A child created a while ago and still not seen: its watch events may have fallen
    /// into a relist that answered before the create did. Ask again.
    pub(super) fn recheck(&mut self, now: Duration) {
        for c in self.carves.values_mut() {
            if c.answered.is_some()
                && !c.seen
                && c.sent == 0
                && now.saturating_sub(c.answered_at) >= CARVE_RECHECK
            {
                c.answered = None;
                c.failed = true;
            }
        }
    }

    /// Creates that failed are asked again as they were, unless their range is taken by
    /// now (then the create cannot have landed: the webhook refuses an overlap), a config
    /// holds the name (`taken`) or the pool no longer has it in its budget.
    pub(super) fn retry_failed(
        &mut self,
        pool: &str,
        input: &PoolInput,
        occupied: &[IpNet],
        taken: impl Fn(&str) -> bool,
        core: &mut Core,
    ) {
        let failed: Vec<String> = self
            .carves
            .iter()
            .filter(|(_, c)| {
                c.pool == pool && c.failed && c.sent == 0 && !c.seen && c.retry_at <= core.mono()
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in failed {
            let Some(c) = self.carves.get(&name) else {
                continue;
            };
            let in_budget = c
                .carve
                .ranges()
                .all(|r| input.budget().any(|b| b.contains(&r)));
            let clear = c
                .carve
                .ranges()
                .all(|r| !occupied.iter().any(|o| nets_overlap(o, &r)));
            if !in_budget || !clear || taken(&name) {
                info!(pool, config = %name, "a failed carve is moot now; deciding again");
                self.carves.remove(&name);
                self.scale_started.remove(&name);
                continue;
            }
            let child = child_config(pool, input, &c.carve);
            if let Some(c) = self.carves.get_mut(&name) {
                c.failed = false;
                c.sent += 1;
            }
            core.push(super::Effect::CreateConfig(child));
        }
    }
}

/// The child config a carve of `pool` creates.
pub(super) fn child_config(pool: &str, input: &PoolInput, carve: &Carve) -> ChildConfig {
    ChildConfig {
        pool: pool.to_string(),
        pool_uid: input.uid.clone(),
        name: carve.name.clone(),
        ipv4: carve.ipv4.zip(input.ipv4.as_ref().map(|f| f.per_node_mask)),
        ipv6: carve.ipv6.zip(input.ipv6.as_ref().map(|f| f.per_node_mask)),
        selector: input.selector.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::pool;
    use crate::ipam::Ipam;
    use crate::machine::{Effect, Now};

    fn net(s: &str) -> IpNet {
        s.parse().expect("test CIDR")
    }

    fn at(seconds: u64) -> Now {
        Now {
            mono: Duration::from_secs(seconds),
            wall_seconds: 0,
        }
    }

    fn creates(core: &mut Core) -> usize {
        core.take()
            .iter()
            .filter(|e| matches!(e, Effect::CreateConfig(_)))
            .count()
    }

    fn one_carve() -> (PoolInput, Carve, Carves) {
        let input = pool(
            "p",
            "pu",
            (Some((&["10.0.0.0/16"], 24, 26)), None),
            (0, 4, 1),
            60,
            None,
        );
        let carve = Carve {
            name: "p-1".into(),
            ipv4: Some(net("10.0.0.0/24")),
            ipv6: None,
        };
        let mut carves = Carves::default();
        carves.started("p", input.uid.clone(), &carve, Duration::ZERO);
        (input, carve, carves)
    }

    #[test]
    fn a_failed_create_is_asked_again_after_its_backoff_unless_it_is_moot() {
        let (input, carve, mut carves) = one_carve();
        let mut core = Core::new(Ipam::new());
        let child = child_config("p", &input, &carve);
        carves.on_config_created(&child, CreateOutcome::Failed("500".into()), &mut core);
        core.take();
        carves.retry_failed("p", &input, &[], |_| false, &mut core);
        assert_eq!(creates(&mut core), 0, "not before its backoff");
        core.begin(at(1));
        carves.retry_failed("p", &input, &[], |_| false, &mut core);
        assert_eq!(creates(&mut core), 1);
        carves.on_config_created(&child, CreateOutcome::Failed("500".into()), &mut core);
        core.begin(at(5));
        let taken = [net("10.0.0.0/16")];
        carves.retry_failed("p", &input, &taken, |_| false, &mut core);
        assert_eq!(
            creates(&mut core),
            0,
            "its range is taken: it cannot have landed"
        );
        assert_eq!(carves.len(), 0);
    }

    #[test]
    fn a_created_child_the_watch_does_not_show_is_asked_for_again_after_a_while() {
        let (input, carve, mut carves) = one_carve();
        let mut core = Core::new(Ipam::new());
        let child = child_config("p", &input, &carve);
        carves.on_config_created(&child, CreateOutcome::Created, &mut core);
        carves.recheck(CARVE_RECHECK - Duration::from_secs(1));
        carves.retry_failed("p", &input, &[], |_| false, &mut core);
        assert_eq!(creates(&mut core), 0);
        carves.recheck(CARVE_RECHECK);
        carves.retry_failed("p", &input, &[], |_| false, &mut core);
        assert_eq!(creates(&mut core), 1, "the same range under the same name");
        assert_eq!(carves.in_flight("p", &[], &[]), vec![carve.clone()]);
        assert!(
            carves.in_flight("p", &["p-1".to_string()], &[]).is_empty(),
            "the child counts"
        );
    }

    /// Found by the simulator (a pool with 4 active children, max 3): a create answered with a
    /// timeout is sent again; the child shows, a user deletes it, and the pool carved three
    /// more as if it had none; then the create still on its way landed and brought it back.
    #[test]
    fn a_create_on_its_way_counts_while_its_child_is_being_deleted() {
        let (input, carve, mut carves) = one_carve();
        let mut core = Core::new(Ipam::new());
        let child = child_config("p", &input, &carve);
        carves.on_config_created(&child, CreateOutcome::Failed("no answer".into()), &mut core);
        core.begin(at(1));
        carves.retry_failed("p", &input, &[], |_| false, &mut core);
        assert_eq!(creates(&mut core), 1, "asked again");
        let children = ["p-1".to_string()];
        assert!(
            carves.in_flight("p", &children, &[]).is_empty(),
            "the child is there and counts itself"
        );
        assert_eq!(
            carves.in_flight("p", &children, &children),
            vec![carve.clone()],
            "being deleted, while a create of it may still land"
        );
        carves.on_config_created(&child, CreateOutcome::AlreadyExists, &mut core);
        assert!(
            carves.in_flight("p", &children, &children).is_empty(),
            "answered: nothing more can land"
        );
    }
}
