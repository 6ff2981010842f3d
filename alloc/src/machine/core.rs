//! What every part of the machine shares: the allocation state, the time of the input being
//! handled, whether every watch has listed once, and the effects asked for so far.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::{Effect, Metric, Now};
use crate::effects::Note;
use crate::ipam::Ipam;

#[derive(Clone)]
pub(super) struct Core {
    ipam: Ipam,
    now: Now,
    /// Inputs handled so far: orders create answers against config lists.
    step: u64,
    synced: bool,
    effects: Vec<Effect>,
}

impl Core {
    pub(super) fn new(ipam: Ipam) -> Self {
        Core {
            ipam,
            now: Now::default(),
            step: 0,
            synced: false,
            effects: Vec::new(),
        }
    }

    /// An input arrives at `now`.
    pub(super) fn begin(&mut self, now: Now) {
        self.now = now;
        self.step += 1;
    }

    /// The effects of the input, handed over.
    pub(super) fn take(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    pub(super) fn ipam(&self) -> &Ipam {
        &self.ipam
    }

    pub(super) fn ipam_mut(&mut self) -> &mut Ipam {
        &mut self.ipam
    }

    /// The monotonic time of the input.
    pub(super) fn mono(&self) -> Duration {
        self.now.mono
    }

    /// The wall clock of the input, as conditions carry it.
    pub(super) fn wall(&self) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(self.now.wall_seconds).unwrap_or_default())
    }

    pub(super) fn step(&self) -> u64 {
        self.step
    }

    /// Whether everything has been read once: only then is anything allocated.
    pub(super) fn synced(&self) -> bool {
        self.synced
    }

    pub(super) fn set_synced(&mut self) {
        self.synced = true;
    }

    pub(super) fn push(&mut self, effect: Effect) {
        self.effects.push(effect);
    }

    pub(super) fn note(&mut self, note: Note) {
        self.push(Effect::Note(note));
    }

    pub(super) fn metric(&mut self, metric: Metric) {
        self.push(Effect::Metric(metric));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_input_is_a_step_and_its_effects_are_handed_over_once() {
        let mut core = Core::new(Ipam::new());
        let now = Now {
            mono: Duration::from_secs(3),
            wall_seconds: 1_800_000_000,
        };
        core.begin(now);
        core.begin(now);
        assert_eq!((core.step(), core.mono()), (2, Duration::from_secs(3)));
        assert_eq!(core.wall().0.as_second(), 1_800_000_000);
        core.metric(Metric::Pending(1));
        assert_eq!(core.take().len(), 1);
        assert!(core.take().is_empty());
        assert!(!core.synced());
        core.set_synced();
        assert!(core.synced());
    }
}
